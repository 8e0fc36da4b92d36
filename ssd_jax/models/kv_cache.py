"""The KV cache: a pytree with per-row lengths.

Rows of a batch advance by different amounts under speculation. Rolling back rejected tokens is a change of
`lengths` only: slots at or beyond a row's length are never visible to later queries and are overwritten when the
row advances.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from .. import settings
from .config import ModelConfig


@struct.dataclass
class KVCache:
  k: list            # L arrays [B, S, G, D]: keys (RoPE applied) per row, slot, kv head (one buffer per layer,
                     # so that writing a layer's new entries is an in-place update of that buffer)
  v: list            # L arrays [B, S, G, D]: values
  lengths: jax.Array  # [B] int32: committed tokens per row; slots >= lengths[b] hold scratch or garbage

  @property
  def batch(self) -> int:
    return self.k[0].shape[0]

  @property
  def num_slots(self) -> int:
    return self.k[0].shape[1]

  @classmethod
  def init(cls, cfg: ModelConfig, batch: int, num_slots: int, dtype=jnp.float32) -> "KVCache":
    shape = (batch, num_slots, cfg.n_kv_heads, cfg.head_dim)
    return cls(k=[jnp.zeros(shape, dtype) for _ in range(cfg.n_layers)],
               v=[jnp.zeros(shape, dtype) for _ in range(cfg.n_layers)], lengths=jnp.zeros((batch,), jnp.int32))

  def nbytes(self) -> int:
    return int(sum(a.size * a.dtype.itemsize for a in self.k + self.v))


# The target KV cache's dtype: 'auto' follows the params (the embedding's dtype, which int8 weights keep).
KV_DTYPES = settings.KV_DTYPES


def cache_dtype(params, kv_dtype: str | None = None):
  """Returns the dtype of a target KV cache for `params` under `kv_dtype` (None or 'auto': the params' dtype)."""
  import numpy as np

  if kv_dtype is not None:
    settings.check_choice("KV cache dtype", kv_dtype, KV_DTYPES)
  if kv_dtype in (None, "auto"):
    return np.dtype(params["embed"].dtype)
  return np.dtype(jnp.dtype(kv_dtype))


def round_slots(n: int, multiple: int = 128) -> int:
  """Returns n rounded up to a multiple, so that cache sizes (and compiled programs) come from a small set."""
  return max(multiple, -(-n // multiple) * multiple)
