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
