import os

import pytest

# Fake CPU devices for the placement/mesh tests; must be set before JAX is imported anywhere.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")


@pytest.fixture(scope="session")
def smollm2():
  """The real SmolLM2-135M-Instruct pipeline in float32 (converted from the GGUF on first use), without a draft; its
  GGUF blocks (the CPU's default, weights='auto') have their own tests (test_blocks.py)."""
  import ssd_jax
  return ssd_jax.load(draft=None, weights="full")


# Mappings a process may hold before the programs of finished test modules are dropped (Linux's default limit is
# 65,530; the largest test module adds about 18,000).
MAX_MAPPINGS = 20_000


def _mappings() -> int:
  try:
    with open("/proc/self/maps", "rb") as f:
      return sum(1 for _ in f)
  except OSError:  # not Linux: no such limit to watch
    return 0


@pytest.fixture(scope="module", autouse=True)
def _free_compiled_programs():
  """Drops JAX's compiled programs after a test module once the process holds many memory mappings. Each compiled
  XLA:CPU program keeps a few mappings of its code while it lives, and the suite compiles thousands (a program per
  shape of every tiny model): in one process they reached Linux's limit of 65,530 mappings a process
  (vm.max_map_count), and the next compile crashed with a segmentation fault. A module's decoders (and their
  Programs) go with its fixtures; JAX's own jit caches are cleared here, only when needed, since clearing them
  costs the next modules their recompiles."""
  yield
  if _mappings() < MAX_MAPPINGS:
    return
  import gc

  import jax
  jax.clear_caches()
  gc.collect()
