"""Bytes per device of a placement, from the same shapes and sharding rules a run allocates with.

Parameters: every leaf of `model.init_params`'s pytree in the weight dtype, split by `sharding.param_specs` (so an
axis the mesh does not divide stays whole on every device, as in a run). KV caches: `sharding.cache_spec` for the
target (by KV heads where they divide the mesh), the draft's whole on its device in `draft.CACHE_DTYPE`; slots from
`decode.base.cache_slots` with the lookahead each decoder asks for. tests/test_plan.py checks these numbers against
a real run's arrays on forced CPU devices.
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
from ..decode.base import cache_slots
from ..decode.draft import CACHE_DTYPE as DRAFT_CACHE_DTYPE
from ..decode.steps import tree_lookahead
from ..sharding import TP, cache_spec, param_specs

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


def _shard_bytes(shape, dtype, spec, tp: int) -> int:
  dims = [n // tp if i < len(spec) and spec[i] == TP else n for i, n in enumerate(shape)]
  return int(np.prod(dims, dtype=np.int64)) * jnp.dtype(dtype).itemsize


def param_bytes(cfg: ModelConfig, tp: int, dtype: str = "bfloat16") -> int:
  """Returns the parameter bytes on each device of a tensor-parallel mesh of `tp` (int8: plus quant.py's float32
  scale per output column of every layer matrix)."""
  params, specs = abstract_params(cfg, dtype), param_specs(cfg, tp)
  leaves = jax.tree.leaves(params)
  spec_leaves = jax.tree.leaves(specs, is_leaf=lambda s: isinstance(s, jax.sharding.PartitionSpec))
  total = sum(_shard_bytes(x.shape, x.dtype, s, tp) for x, s in zip(leaves, spec_leaves))
  if dtype == "int8":
    total += sum(_shard_bytes(x.shape[1:], jnp.float32, tuple(s)[1:], tp) for x, s in zip(leaves, spec_leaves)
                 if x.dtype == jnp.int8)
  return int(total)


def kv_bytes(cfg: ModelConfig, tp: int, batch: int, slots: int, dtype) -> int:
  """Returns the KV cache bytes on each device: 2 x layers x [B, S, G, D] split by KV heads where they divide `tp`,
  plus the replicated lengths [B] int32."""
  per_layer = _shard_bytes((batch, slots, cfg.n_kv_heads, cfg.head_dim), dtype, tuple(cache_spec(cfg, tp)), tp)
  return 2 * cfg.n_layers * per_layer + 4 * batch


def spec_cache_bytes(cfg: ModelConfig, batch: int, k: int, fan_out: tuple) -> int:
  """Returns the speculation cache one draft_tree call returns (candidates, branch labels, K tokens and their float32
  distributions over the head rows per branch, the glue distributions): what lives on the draft between rounds."""
  n, v = sum(fan_out), cfg.out_vocab
  return 4 * (batch * n + n + batch * n * k + batch * n * k * v + batch * (k + 1) * v)


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
  t_slots = cache_slots(prompt, new_tokens, lookahead=k + 2)
  d_slots = cache_slots(prompt, new_tokens, lookahead=tree_lookahead(k, fan_out))
  t_cache_dtype = jnp.bfloat16 if dtype == "int8" else jnp.dtype(dtype)
  return Sizing(target_params=param_bytes(tcfg, tp, dtype), target_kv=kv_bytes(tcfg, tp, batch, t_slots, t_cache_dtype),
                draft_params=param_bytes(dcfg, 1, dtype), draft_kv=kv_bytes(dcfg, 1, batch, d_slots, DRAFT_CACHE_DTYPE),
                spec_cache=spec_cache_bytes(dcfg, batch, k, fan_out), target_slots=t_slots, draft_slots=d_slots)


def kv_bytes_per_token(cfg: ModelConfig, tp: int, dtype) -> float:
  """Returns the KV cache bytes one token takes on each device (per row)."""
  g = cfg.n_kv_heads // tp if cfg.n_kv_heads % tp == 0 else cfg.n_kv_heads
  return 2 * cfg.n_layers * g * cfg.head_dim * jnp.dtype(dtype).itemsize


def largest_batch(free_bytes: float, per_row_bytes: float) -> int:
  """Returns how many rows of `per_row_bytes` fit in `free_bytes` (0 when none does)."""
  return max(0, math.floor(free_bytes / per_row_bytes)) if per_row_bytes > 0 else 0
