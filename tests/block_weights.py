"""Models in GGUF blocks for the tests (ssd_jax/models/blocks.py): a float matrix written in blocks by gguf's own
quantizer, a model's layer matrices (and untied head) in blocks, and the float32 model such blocks hold."""
import jax
import jax.numpy as jnp
import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import quantize as gguf_quantize

from ssd_jax.models import blocks


def block_weight(w: np.ndarray, kind: str) -> blocks.BlockWeight:
  """The test writer: a float [K, N] layer matrix in GGUF blocks (gguf's own quantizer, rows [N, K] as a file)."""
  raw = gguf_quantize(np.ascontiguousarray(np.asarray(w, np.float32).T), getattr(GGMLQuantizationType, kind))
  return blocks.from_gguf(raw, kind, transposed=True)


def block_params(params: dict, layer_kind: str = "Q4_1", head_kind: str = "Q8_0") -> dict:
  """Returns params with every layer matrix (and an untied lm_head) in GGUF blocks; jax arrays."""
  mats = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")
  layers = [dict(lp, **{k: block_weight(lp[k], layer_kind) for k in mats}) for lp in params["layers"]]
  out = dict(params, layers=layers)
  if "lm_head" in params:
    out["lm_head"] = block_weight(params["lm_head"], head_kind)
  return jax.tree.map(jnp.asarray, out)


def dequantized(params: dict) -> dict:
  """Returns params with every BlockWeight replaced by its float32 matrix (numpy): the float32 model a model in blocks
  computes, and what the numpy reference reads."""
  return jax.tree.map(lambda x: np.asarray(blocks.dequantize(x)) if blocks.is_block(x) else np.asarray(x), params,
                      is_leaf=blocks.is_block)
