"""ssd-jax: Speculative Speculative Decoding (SSD / Saguaro) in JAX."""
from .config import ModelConfig, SMOLLM2_135M, tiny_config

__version__ = "0.1.0"

from .api import Generation, Pipeline, load

__all__ = ["Generation", "ModelConfig", "Pipeline", "SMOLLM2_135M", "load", "tiny_config"]
