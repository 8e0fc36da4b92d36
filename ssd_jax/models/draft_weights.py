"""The draft's weight format (load's `draft_weights`, decode.py / bench.py `--draft-weights`).

'full' keeps the draft as loaded. 'q8_0' puts its matrices and its head in GGUF Q8_0 blocks (blocks.py), quantized by
us at load from its own weights, so on a CPU the few-row block kernel reads about a quarter of the float32 bytes a
draft step reads (docs/benchmarks.md, "The draft's cost per token"). A quantized draft is another draft, not the same
one: speculation stays exact (only the target's law decides what is committed; the draft hands the verifier the law
it drew from), and only its acceptance can change, which is measured. 'auto': 'q8_0' on a CPU, where the block
kernel runs, else 'full' (elsewhere the blocks would be dequantized every product).

What is quantized: every layer matrix (a standalone draft's `layers`, an EAGLE draft's `layer` and `fc`) and the
head (a tied embedding, which the lookup then reads from the same blocks, an untied `lm_head`, an EAGLE draft's
`head` rows); norms, biases, an untied embedding and the token tables stay. A matrix whose summed axis is not a
multiple of 32 stays as it is.
"""
from __future__ import annotations

import jax
import numpy as np

from .. import settings
from . import blocks
from .config import is_eagle
from .quant import LAYER_MATRICES


def resolve(draft_weights: str) -> str:
  """Returns the format `draft_weights` names, 'auto' resolved by where the draft runs (the default backend)."""
  settings.check_choice("draft weights", draft_weights, settings.DRAFT_WEIGHTS)
  if draft_weights != "auto":
    return draft_weights
  from ..kernels import rows_matmul
  return "q8_0" if jax.default_backend() == "cpu" and rows_matmul.available() else "full"


def _place(bw: blocks.BlockWeight, like):
  """Puts a BlockWeight where the array it replaces lives (host arrays stay on the host)."""
  sharding = getattr(like, "sharding", None)
  return jax.device_put(bw, sharding) if sharding is not None else bw


def _q8(w, rows_are_out: bool):
  """Returns the Q8_0 form of matrix w (or w itself when its summed axis is not a multiple of 32): rows_are_out,
  a matrix [in, out] (a layer's, read as x @ w); else rows [N, d] read as x @ w.T (a tied embedding, a head)."""
  if blocks.is_block(w) or getattr(w, "ndim", 0) != 2:
    return w
  rows = np.asarray(jax.device_get(w), np.float32)
  rows = rows.T if rows_are_out else rows
  if rows.shape[1] % blocks.QK:
    return w
  return _place(blocks.quantize_q8_0(rows, transposed=rows_are_out), w)


def _layer(lp: dict) -> dict:
  return dict(lp, **{k: _q8(lp[k], True) for k in LAYER_MATRICES if k in lp})


def q8_0_axis(cfg, name: str) -> int | None:
  """Returns the summed axis of the standalone draft's param `name` (a key of its params or of a layer's) that
  'q8_0' puts in blocks: 0 for a layer matrix [in, out] and an untied lm_head [d, V], 1 for a tied embedding [V, d];
  None for what stays (norms, biases, an untied embedding, the token tables). A matrix whose summed axis is not a
  multiple of 32 stays all the same. quantize_draft and the memory check (memory_check.param_bytes) both follow it."""
  if name in LAYER_MATRICES or (name == "lm_head" and not cfg.tie_embeddings):
    return 0
  return 1 if name == "embed" and cfg.tie_embeddings else None


def _standalone(cfg, params: dict) -> dict:
  """Returns a standalone draft's params (a dict, or a layer's) with what q8_0_axis names in Q8_0 blocks."""
  axes = {k: q8_0_axis(cfg, k) for k in params}
  return {k: v if axes[k] is None else _q8(v, axes[k] == 0) for k, v in params.items()}


def quantize_draft(cfg, params: dict, draft_weights: str) -> dict:
  """Returns a draft's params in the format `draft_weights` ('full': unchanged; 'q8_0': as the module says;
  'auto' resolved first)."""
  if resolve(draft_weights) == "full":
    return params
  out = dict(params)
  if is_eagle(cfg):
    out["layer"] = _layer(params["layer"])
    out["fc"] = _q8(params["fc"], True)
    out["head"] = _q8(params["head"], False)
    return out
  out = _standalone(cfg, {k: v for k, v in params.items() if k != "layers"})
  out["layers"] = [_standalone(cfg, lp) for lp in params["layers"]]
  return out


def is_quantized(params: dict) -> bool:
  """Returns True when a draft's params hold block weights."""
  return any(blocks.is_block(v) for v in jax.tree.leaves(params, is_leaf=blocks.is_block))
