"""Weight-only int8: per-output-channel int8 matrices with float32 scales, dequantized inside the product.

What it is for: Llama-3.1-70B is ~141 GB in bfloat16 and ~72 GB with its layer matrices in int8, which is what fits
a 128 GB TPU slice with a KV cache. Only the per-layer matrices are quantized: the embedding and the LM head are
1.5% of a 70B model's bytes, the head's rounding would land directly on the logits (and on near-ties), and an EAGLE
draft reads the target's head rows; they stay in their own dtype.

The product is portable jnp on every backend: `x @ q.astype(x.dtype)` accumulated in float32, then times the
column scales (exact algebra: scaling a column after the sum equals scaling each weight before it). XLA fuses the
int8 -> compute-dtype conversion into the product on GPU and TPU, so the weights stream from memory as int8.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from .. import settings

WEIGHT_FORMATS = settings.WEIGHT_FORMATS

# Matrices of a layer that int8 replaces (norms, biases and q/k norms stay: they are tiny and scale activations).
LAYER_MATRICES = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Int8Weight:
  q: jax.Array      # [K, N] int8: round(w / scale), in [-127, 127]
  scale: jax.Array  # [N] float32: max |w[:, n]| / 127 (1 for an all-zero column)

  @property
  def shape(self):
    return self.q.shape

  @property
  def dtype(self):
    return self.q.dtype


def quantize_int8(w) -> Int8Weight:
  """Returns the per-output-channel int8 form of a [K, N] matrix (numpy or jax, any float dtype), on w's device."""
  xp = np if isinstance(w, np.ndarray) else jnp
  w32 = w.astype(xp.float32)
  amax = xp.max(xp.abs(w32), axis=0)
  scale = xp.where(amax > 0, amax / 127.0, 1.0).astype(xp.float32)
  q = xp.clip(xp.round(w32 / scale), -127, 127).astype(xp.int8)
  return Int8Weight(q=q, scale=scale)


def dequantize(w: Int8Weight, dtype=jnp.float32) -> jax.Array:
  """Returns the [K, N] matrix an Int8Weight stands for, in `dtype`."""
  return (w.q.astype(jnp.float32) * w.scale).astype(dtype)


def int8_dense(x: jax.Array, w: Int8Weight, out_dtype=None) -> jax.Array:
  """Returns x @ dequantize(w) for x [..., K], in `out_dtype` (default x's dtype); accumulates in float32."""
  y = jnp.matmul(x, w.q.astype(x.dtype), preferred_element_type=jnp.float32) * w.scale
  return y.astype(out_dtype or x.dtype)


def quantize_params(params: dict, weights: str = "int8") -> dict:
  """Returns params with every layer matrix replaced by its Int8Weight ('int8'), or params unchanged ('full').
  Quantizing int8 params again is refused."""
  settings.check_choice("weight format", weights, WEIGHT_FORMATS)
  if weights == "full":
    return params
  if is_quantized(params):
    raise ValueError("params are already int8")
  return dict(params, layers=[dict(lp, **{k: quantize_int8(lp[k]) for k in LAYER_MATRICES}) for lp in params["layers"]])


def is_quantized(params: dict) -> bool:
  """Returns True when `params` hold int8 matrices."""
  return any(isinstance(v, Int8Weight) for v in jax.tree.leaves(params, is_leaf=lambda v: isinstance(v, Int8Weight)))
