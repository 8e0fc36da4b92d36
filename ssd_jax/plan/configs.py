"""The paper's models as plain ModelConfig values: the one place the plan takes named shapes from.

Numbers from the published config.json files (docs/model_families.md). What ModelConfig cannot say yet changes no
byte count that matters here: Llama 3's rope_scaling only changes RoPE's frequencies, and Qwen3's per-head q/k norms
are 2 * head_dim floats a layer (1 KiB of 70 GB). When the named configs with those fields land in ssd_jax.config,
`named` should return them instead.
"""
from __future__ import annotations

from ..config import SMOLLM2_135M, ModelConfig


def _llama3(name, d, ffn, layers, heads, head_dim, tied):
  return ModelConfig(vocab_size=128256, d_model=d, n_layers=layers, n_heads=heads, n_kv_heads=8, head_dim=head_dim,
                     ffn_dim=ffn, rms_eps=1e-5, rope_theta=500000.0, tie_embeddings=tied, max_seq_len=131072,
                     name=name)


def _qwen3(name, d, ffn, layers, heads, tied):
  return ModelConfig(vocab_size=151936, d_model=d, n_layers=layers, n_heads=heads, n_kv_heads=8, head_dim=128,
                     ffn_dim=ffn, rms_eps=1e-6, rope_theta=1000000.0, tie_embeddings=tied, max_seq_len=40960,
                     name=name)


CONFIGS = {c.name: c for c in (
    _llama3("llama-3.1-8b", 4096, 14336, 32, 32, 128, False),
    _llama3("llama-3.1-70b", 8192, 28672, 80, 64, 128, False),
    _llama3("llama-3.2-1b", 2048, 8192, 16, 32, 64, True),
    _qwen3("qwen3-0.6b", 1024, 3072, 28, 16, True),
    _qwen3("qwen3-32b", 5120, 25600, 64, 64, False),
    SMOLLM2_135M,
)}
ALIASES = {"smollm2-135m": SMOLLM2_135M.name}


def named(name: str) -> ModelConfig:
  """Returns the config called `name` (case-insensitive), or that of an ssd-jax checkpoint directory."""
  key = ALIASES.get(name.lower(), name.lower())
  if key in CONFIGS:
    return CONFIGS[key]
  import os
  if os.path.isfile(os.path.join(name, "config.json")):
    from ..checkpoints import read_config
    return read_config(name)
  raise ValueError(f"unknown model {name!r}: choose one of {', '.join(CONFIGS)} or an ssd-jax checkpoint directory")
