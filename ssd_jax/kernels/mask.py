"""Compact per-query mask metadata for attention over a KV cache (what every attention implementation reads).

One descriptor serves every use in the project:
  * prefill / AR decode / verify: query t of row b sees cache slots `< visible_end[b, t]` (causal with an offset);
  * tree drafting: additionally, each query belongs to branch `tree_branch[b, t]` at depth `tree_depth[b, t]` and sees
    its own branch's scratch slots `tree_start[b] + d * tree_width + branch` for `d <= depth` (step-major layout).
A dense `[T, S]` mask is only ever built by the reference implementation and tests (`visible_mask`).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct
from jax.sharding import PartitionSpec as P


@struct.dataclass
class MaskInfo:
  visible_end: jax.Array   # [B, T] int32: slots s < visible_end are visible to query t
  tree_start: jax.Array    # [B] int32: first scratch slot of the branch region (unused when tree_width == 0)
  tree_branch: jax.Array   # [B, T] int32: branch index of query t in [0, tree_width)
  tree_depth: jax.Array    # [B, T] int32: depth of query t; -1 means the query sees no scratch slots
  tree_width: int = struct.field(pytree_node=False, default=0)  # branches per row (static)


def causal_mask_info(write_slots: jax.Array) -> MaskInfo:
  """Returns the causal descriptor for tokens written at `write_slots` [B, T]: each sees every slot up to its own."""
  b, t = write_slots.shape
  neg = jnp.full((b, t), -1, jnp.int32)
  return MaskInfo(visible_end=(write_slots + 1).astype(jnp.int32), tree_start=jnp.zeros((b,), jnp.int32),
                  tree_branch=jnp.zeros((b, t), jnp.int32), tree_depth=neg, tree_width=0)


def _sees(mask: MaskInfo, s: jax.Array) -> jax.Array:
  """Returns [B, T, U]: whether query t of row b sees a key at slot s[b, 0, u] (s: [B or 1, 1, U])."""
  vis = s < mask.visible_end[:, :, None]
  if mask.tree_width > 0:
    rel = s - mask.tree_start[:, None, None]
    in_tree = rel >= 0
    own = (rel % mask.tree_width) == mask.tree_branch[:, :, None]
    shallow = (rel // mask.tree_width) <= mask.tree_depth[:, :, None]
    vis = vis | (in_tree & own & shallow)
  return vis


def visible_mask(mask: MaskInfo, num_slots: int) -> jax.Array:
  """Returns the dense boolean mask [B, T, S] that `mask` describes (reference and tests only)."""
  return _sees(mask, jnp.arange(num_slots, dtype=jnp.int32)[None, None, :])


def kernel_specs(q_sharding, k_sharding):
  """Returns the PartitionSpecs (q and output, k and v, per-query metadata, per-row metadata) an attention kernel
  (C++ or Pallas; XLA cannot partition either) runs under on a mesh: batch and heads may be split (rows and KV
  groups are independent), the cache's slots and head dimension must be whole. Query heads follow the KV heads'
  split only where both are split the same way (GQA groups then stay on one device); otherwise heads are gathered."""
  qs = (tuple(q_sharding.spec) + (None,) * 4)[:4]
  ks = (tuple(k_sharding.spec) + (None,) * 4)[:4]
  b_ax = qs[0] if qs[0] == ks[0] else None
  h_ax = qs[2] if qs[2] == ks[2] else None
  return P(b_ax, None, h_ax, None), P(b_ax, None, h_ax, None), P(b_ax, None), P(b_ax)
