"""Bytes per device of a placement for scripts/plan.py: memory_check.py's sizer (the one decode.py's check uses)
applied to the paper's pairs in a weight dtype over a target mesh.

Parameters: memory_check.param_bytes (split as `sharding.param_specs` splits them, so an axis the mesh does not
divide stays whole on every device); int8 is quant.py's weight-only int8 of a bfloat16 checkpoint. KV caches: split
by KV heads where they divide the mesh, the draft's whole on its device in `draft.CACHE_DTYPE`, slots from
memory_check.run_slots; here with their lengths [B] int32 too, as the arrays a run holds. tests/test_plan.py checks
these numbers against a real run's arrays on forced CPU devices.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from ..models import model
from ..models.config import ModelConfig
from ..decode.draft import CACHE_DTYPE as DRAFT_CACHE_DTYPE
from .. import memory_check

WEIGHT_DTYPES = ("float32", "bfloat16", "float16", "int8")


@functools.lru_cache(maxsize=32)
def abstract_params(cfg: ModelConfig, dtype: str = "bfloat16") -> dict:
  """Returns the params' ShapeDtypeStructs in a weight dtype. int8 is quant.py's weight-only int8 of a bfloat16
  checkpoint: the layer matrices int8 (their float32 scales are counted by param_bytes), everything else bfloat16;
  it is sized here, not compiled."""
  if dtype not in WEIGHT_DTYPES:
    raise ValueError(f"unknown weight dtype {dtype!r}; choose one of {', '.join(WEIGHT_DTYPES)}")
  f32 = jax.eval_shape(lambda: model.init_params(jax.random.key(0), cfg))

  def cast(path, x):
    if not jnp.issubdtype(x.dtype, jnp.floating):
      return x  # token tables (int32)
    if dtype == "int8":
      return jax.ShapeDtypeStruct(x.shape, jnp.int8 if _is_layer_matrix(path) else jnp.bfloat16)
    return jax.ShapeDtypeStruct(x.shape, jnp.dtype(dtype))
  return jax.tree_util.tree_map_with_path(cast, f32)


def _is_layer_matrix(path) -> bool:
  """Whether a params path names one of the layer matrices weight-only int8 quantizes (quant.LAYER_MATRICES)."""
  from ..models.quant import LAYER_MATRICES
  return getattr(path[-1], "key", None) in LAYER_MATRICES and getattr(path[0], "key", None) == "layers"


def param_bytes(cfg: ModelConfig, tp: int, dtype: str = "bfloat16") -> int:
  """Returns the parameter bytes on each device of a tensor-parallel mesh of `tp` (int8: bfloat16 params with the
  layer matrices in int8, plus quant.py's float32 scale per output column)."""
  if dtype not in WEIGHT_DTYPES:
    raise ValueError(f"unknown weight dtype {dtype!r}; choose one of {', '.join(WEIGHT_DTYPES)}")
  int8 = dtype == "int8"
  return memory_check.param_bytes(cfg, np.dtype(jnp.bfloat16 if int8 else dtype), "int8" if int8 else "full", tp)


def kv_bytes(cfg: ModelConfig, tp: int, batch: int, slots: int, dtype) -> int:
  """Returns the KV cache bytes on each device (memory_check.kv_cache_bytes) plus its replicated lengths [B] int32."""
  return memory_check.kv_cache_bytes(cfg, batch, slots, dtype, tp) + 4 * batch


spec_cache_bytes = memory_check.spec_cache_bytes


@dataclasses.dataclass(frozen=True)
class Sizing:
  """What a run allocates per device for one placement (bytes), and the cache slots it sizes for."""
  target_params: int
  target_kv: int
  draft_params: int
  draft_kv: int
  spec_cache: int
  target_slots: int
  draft_slots: int


def sizing(tcfg: ModelConfig, dcfg: ModelConfig, tp: int, batch: int, prompt: int, new_tokens: int, k: int,
           fan_out: tuple, dtype: str = "bfloat16") -> Sizing:
  """Returns the bytes an SSD run of `batch` rows, `prompt` prompt tokens and `new_tokens` new ones allocates: the
  target's over a mesh of `tp` devices (cache in the weights' dtype, as the decoders make it), the draft's on its
  own device (cache in draft.CACHE_DTYPE)."""
  t_slots, d_slots = memory_check.run_slots(prompt, new_tokens, k, fan_out)
  t_cache_dtype = jnp.bfloat16 if dtype == "int8" else jnp.dtype(dtype)
  return Sizing(target_params=param_bytes(tcfg, tp, dtype), target_kv=kv_bytes(tcfg, tp, batch, t_slots, t_cache_dtype),
                draft_params=param_bytes(dcfg, 1, dtype), draft_kv=kv_bytes(dcfg, 1, batch, d_slots, DRAFT_CACHE_DTYPE),
                spec_cache=spec_cache_bytes(dcfg, batch, k, fan_out), target_slots=t_slots, draft_slots=d_slots)


def kv_bytes_per_token(cfg: ModelConfig, tp: int, dtype) -> float:
  """Returns the KV cache bytes one token takes on each device (per row)."""
  return memory_check.kv_cache_bytes(cfg, 1, 1, dtype, tp)


def largest_batch(free_bytes: float, per_row_bytes: float) -> int:
  """Returns how many rows of `per_row_bytes` fit in `free_bytes` (0 when none does)."""
  return max(0, math.floor(free_bytes / per_row_bytes)) if per_row_bytes > 0 else 0
