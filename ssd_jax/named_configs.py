"""The paper's models by name (issue 41, item 6), with the numbers of their published config.json files.

Pairs: Llama-3.1-70B(-Instruct) with a Llama-3.2-1B(-Instruct) draft, Qwen3-32B with Qwen3-0.6B; Llama-3.1-8B is
the smaller Llama 3.1 target. Instruct and base models share these numbers. No weights come with them: `random_model`
builds any of them with random weights at a chosen depth (and, for memory, a narrower width or smaller vocabulary)
for tests, placement plans and users; tests/test_named_configs.py checks their parameter counts against the
published ones.
"""
from __future__ import annotations

import dataclasses

from .config import ModelConfig, RopeScaling

_LLAMA3_ROPE = dict(rope_theta=500000.0, rms_eps=1e-5, vocab_size=128256, max_seq_len=131072)
_QWEN3 = dict(rope_theta=1000000.0, rms_eps=1e-6, vocab_size=151936, max_seq_len=40960, qk_norm=True)


def _llama3_scaling(factor: float) -> RopeScaling:
  return RopeScaling("llama3", factor=factor, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position=8192)


NAMED_CONFIGS = {
    "llama-3.1-8b": ModelConfig(d_model=4096, ffn_dim=14336, n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128,
                                tie_embeddings=False, rope_scaling=_llama3_scaling(8.0), name="llama-3.1-8b",
                                **_LLAMA3_ROPE),
    "llama-3.1-70b": ModelConfig(d_model=8192, ffn_dim=28672, n_layers=80, n_heads=64, n_kv_heads=8, head_dim=128,
                                 tie_embeddings=False, rope_scaling=_llama3_scaling(8.0), name="llama-3.1-70b",
                                 **_LLAMA3_ROPE),
    "llama-3.2-1b": ModelConfig(d_model=2048, ffn_dim=8192, n_layers=16, n_heads=32, n_kv_heads=8, head_dim=64,
                                tie_embeddings=True, rope_scaling=_llama3_scaling(32.0), name="llama-3.2-1b",
                                **_LLAMA3_ROPE),
    "qwen3-0.6b": ModelConfig(d_model=1024, ffn_dim=3072, n_layers=28, n_heads=16, n_kv_heads=8, head_dim=128,
                              tie_embeddings=True, name="qwen3-0.6b", **_QWEN3),
    "qwen3-32b": ModelConfig(d_model=5120, ffn_dim=25600, n_layers=64, n_heads=64, n_kv_heads=8, head_dim=128,
                             tie_embeddings=False, name="qwen3-32b", **_QWEN3),
}
# The paper's target/draft pairs (same tokenizer within a pair).
PAPER_PAIRS = (("llama-3.1-70b", "llama-3.2-1b"), ("qwen3-32b", "qwen3-0.6b"))


def named_config(name: str, n_layers: int | None = None, **overrides) -> ModelConfig:
  """Returns the config of a paper model by name (case-insensitive, '-Instruct' optional), at `n_layers` depth if
  given; `overrides` (e.g. vocab_size, d_model, ffn_dim) shrink it for memory. Raises ValueError for unknown names."""
  key = name.lower().removesuffix("-instruct")
  if key not in NAMED_CONFIGS:
    raise ValueError(f"no model named {name!r}; known: {', '.join(NAMED_CONFIGS)}")
  if n_layers is not None:
    if n_layers < 1:
      raise ValueError(f"n_layers must be >= 1, got {n_layers}")
    overrides["n_layers"] = n_layers
  cfg = NAMED_CONFIGS[key]
  if overrides:
    suffix = ",".join(f"{k}={v}" for k, v in sorted(overrides.items()))
    cfg = dataclasses.replace(cfg, name=f"{cfg.name}[{suffix}]", **overrides)
  return cfg


def random_model(name: str, seed: int = 0, n_layers: int | None = None, dtype=None, **overrides):
  """Returns (cfg, params) of a paper model with random weights (model.init_params), as `named_config` shapes it."""
  import jax
  import jax.numpy as jnp

  from .model import init_params

  cfg = named_config(name, n_layers=n_layers, **overrides)
  return cfg, init_params(jax.random.key(seed), cfg, dtype=dtype or jnp.float32)


def param_count(cfg: ModelConfig) -> int:
  """Returns the number of weights of `cfg` (from shapes only; nothing is allocated)."""
  import jax
  import numpy as np

  from .model import init_params

  shapes = jax.eval_shape(lambda: init_params(jax.random.key(0), cfg))
  return int(sum(np.prod(s.shape) for s in jax.tree.leaves(shapes)))
