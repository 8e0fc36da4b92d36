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


# Random values for `write_random_hf`: windows of one standard-normal block of prime length (1,000,003 values).
_BLOCK = 1_000_003


def write_random_hf(directory: str, cfg: ModelConfig, seed: int = 0, scale: float = 0.02) -> int:
  """Writes `cfg` (a Llama-family config) as a Hugging Face directory, config.json and one model.safetensors of
  random bfloat16 weights, tensor by tensor (the host never holds the model); returns the number of weights.

  Values follow param_decls' initialisers: norm weights 1, the embedding N(0, 1), matrices N(0, scale^2). To write
  10^10 bytes without drawing 10^9 numbers, each tensor is one standard-normal block of prime length repeated from a
  per-tensor offset: a row of a tensor starts at (its index x its width) mod the block, and with fewer rows than
  the block and no width a multiple of it, no two rows are equal (tied logits would make greedy checks vacuous)."""
  import json
  import os

  import jax
  import ml_dtypes
  import numpy as np

  from .model_files import hf_layout, is_layout_entry
  from .param_decls import is_decl, param_decls

  if cfg.attn_bias or cfg.qk_norm or cfg.head_vocab is not None:
    raise ValueError("write_random_hf writes Llama-family configs (no biases, q/k norms or head vocabulary)")
  block = np.random.default_rng(seed).standard_normal(_BLOCK).astype(np.float32)
  entries = jax.tree.leaves(hf_layout(cfg), is_leaf=is_layout_entry)
  decls = jax.tree.leaves(param_decls(cfg), is_leaf=is_decl)
  header, off = {}, 0
  for (name, transposed), dc in zip(entries, decls):
    shape = list(reversed(dc.shape)) if transposed else list(dc.shape)
    n = int(np.prod(shape)) * 2
    header[name if name.startswith("lm_head") else "model." + name] = {"dtype": "BF16", "shape": shape,
                                                                       "data_offsets": [off, off + n]}
    off += n
  raw = json.dumps(header).encode()
  raw += b" " * (-len(raw) % 8)
  with open(os.path.join(directory, "model.safetensors"), "wb") as f:
    f.write(len(raw).to_bytes(8, "little") + raw)
    for i, (info, dc) in enumerate(zip(header.values(), decls)):
      s = {"ones": 0.0, "normal1": 1.0}.get(dc.init, scale)
      vals = (np.roll(block, -(i * 104729) % _BLOCK) * s + (dc.init == "ones")).astype(ml_dtypes.bfloat16).tobytes()
      left = info["data_offsets"][1] - info["data_offsets"][0]
      while left:
        f.write(vals[:min(left, len(vals))])
        left -= min(left, len(vals))
  r = cfg.rope_scaling
  hf = {"model_type": "llama", "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim,
        "intermediate_size": cfg.ffn_dim, "vocab_size": cfg.vocab_size, "rms_norm_eps": cfg.rms_eps,
        "rope_theta": cfg.rope_theta, "tie_word_embeddings": cfg.tie_embeddings, "torch_dtype": "bfloat16",
        "max_position_embeddings": cfg.max_seq_len, "hidden_act": "silu"}
  if r is not None:
    hf["rope_scaling"] = {"rope_type": r.kind, "factor": r.factor, "low_freq_factor": r.low_freq_factor,
                          "high_freq_factor": r.high_freq_factor, "original_max_position_embeddings":
                          r.original_max_position}
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(hf, f)
  return off // 2
