"""Masked attention over a KV cache, described by compact per-query metadata.

One descriptor serves every use in the project:
  * prefill / AR decode / verify: query t of row b sees cache slots `< visible_end[b, t]` (causal with an offset);
  * tree drafting: additionally, each query belongs to branch `tree_branch[b, t]` at depth `tree_depth[b, t]` and sees
    its own branch's scratch slots `tree_start[b] + d * tree_width + branch` for `d <= depth` (step-major layout).
A dense `[T, S]` mask is only ever built by the reference implementation.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct


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


def visible_mask(mask: MaskInfo, num_slots: int) -> jax.Array:
  """Returns the dense boolean mask [B, T, S] that `mask` describes (reference and tests only)."""
  s = jnp.arange(num_slots, dtype=jnp.int32)[None, None, :]
  vis = s < mask.visible_end[:, :, None]
  if mask.tree_width > 0:
    rel = s - mask.tree_start[:, None, None]
    in_tree = rel >= 0
    own = (rel % mask.tree_width) == mask.tree_branch[:, :, None]
    shallow = (rel // mask.tree_width) <= mask.tree_depth[:, :, None]
    vis = vis | (in_tree & own & shallow)
  return vis


def ref_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: MaskInfo, k_new: jax.Array | None = None,
                  v_new: jax.Array | None = None, new_slots: jax.Array | None = None) -> jax.Array:
  """Returns softmax(q k^T / sqrt(D)) v under `mask`, shape [B, T, H, D].

  q: [B, T, H, D]; k, v: [B, S, G, D], the cache before this call, with H a multiple of G (grouped-query attention).
  k_new, v_new: [B, T, G, D], the keys/values of this call's tokens, which belong at cache slots `new_slots` [B, T]
  but have not been written yet (so the cache is only read here, and written once per forward by the caller). Cache
  slots that this call overwrites are hidden. Computed in float32.
  """
  b, t, h, d = q.shape
  g = k.shape[2]
  qg = q.reshape(b, t, g, h // g, d).astype(jnp.float32) * (d ** -0.5)
  scores = jnp.einsum("btgrd,bsgd->bgrts", qg, k.astype(jnp.float32))
  vis = visible_mask(mask, k.shape[1])
  if k_new is not None:
    stale = (jnp.arange(k.shape[1])[None, None, :] == new_slots[:, :, None]).any(1)  # [B, S]
    vis = vis & ~stale[:, None, :]
    vis_new = _visible_at(mask, new_slots)  # [B, T, T]
    scores = jnp.concatenate([scores, jnp.einsum("btgrd,bsgd->bgrts", qg, k_new.astype(jnp.float32))], -1)
    vis = jnp.concatenate([vis, vis_new], -1)
    v = jnp.concatenate([v, v_new.astype(v.dtype)], 1)
  vis = vis[:, None, None, :, :]
  scores = jnp.where(vis, scores, -1e30)
  probs = jax.nn.softmax(scores, axis=-1)
  # A query with no visible key (padding) gets uniform weights over garbage; zero it so it stays finite and inert.
  probs = jnp.where(vis.any(-1, keepdims=True), probs, 0.0)
  out = jnp.einsum("bgrts,bsgd->btgrd", probs, v.astype(jnp.float32))
  return out.reshape(b, t, h, d).astype(q.dtype)


def _visible_at(mask: MaskInfo, slots: jax.Array) -> jax.Array:
  """Returns [B, T, U]: whether query t sees a key stored at slot `slots[b, u]`."""
  s = slots[:, None, :]
  vis = s < mask.visible_end[:, :, None]
  if mask.tree_width > 0:
    rel = s - mask.tree_start[:, None, None]
    vis = vis | ((rel >= 0) & ((rel % mask.tree_width) == mask.tree_branch[:, :, None])
                 & ((rel // mask.tree_width) <= mask.tree_depth[:, :, None]))
  return vis


def attention(q, k, v, mask: MaskInfo, k_new=None, v_new=None, new_slots=None, impl: str = "ref"):
  """Dispatches to the chosen implementation ('ref' everywhere; accelerator kernels where available)."""
  if impl == "ref":
    return ref_attention(q, k, v, mask, k_new, v_new, new_slots)
  raise ValueError(f"unknown attention implementation {impl!r}; choose 'ref'")
