"""ssd-jax: Speculative Speculative Decoding (SSD / Saguaro) in JAX.

`ssd_jax.load()` returns a Pipeline (see ssd_jax/api.py). JAX is imported lazily, on first use of the API, so that
scripts can still choose the number of CPU devices (XLA_FLAGS) after importing this package.
"""
from .models.config import SMOLLM2_135M, ModelConfig, tiny_config

__version__ = "0.1.0"
__all__ = ["Generation", "ModelConfig", "Pipeline", "SMOLLM2_135M", "load", "tiny_config"]


def __getattr__(name):
  if name in ("Generation", "Pipeline", "load"):
    from . import api
    return getattr(api, name)
  raise AttributeError(f"module 'ssd_jax' has no attribute {name!r}")
