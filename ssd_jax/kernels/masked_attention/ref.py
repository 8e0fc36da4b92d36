"""The reference masked attention: pure jnp, float32 scores over the whole cache (the oracle for every kernel, and
the portable path)."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ..mask import MaskInfo, visible_mask


def ref_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: MaskInfo) -> jax.Array:
  """Returns softmax(q k^T / sqrt(D)) v under `mask`, shape [B, T, H, D].

  q: [B, T, H, D]; k, v: [B, S, G, D], the cache with this call's keys and values written, with H a multiple of G
  (grouped-query attention). Computed in float32.
  """
  b, t, h, d = q.shape
  g = k.shape[2]
  qg = q.reshape(b, t, g, h // g, d).astype(jnp.float32) * (d ** -0.5)
  scores = jnp.einsum("btgrd,bsgd->bgrts", qg, k.astype(jnp.float32))
  vis = visible_mask(mask, k.shape[1])
  vis = vis[:, None, None, :, :]
  scores = jnp.where(vis, scores, -1e30)
  probs = jax.nn.softmax(scores, axis=-1)
  # A query with no visible key (padding) gets uniform weights over garbage; zero it so it stays finite and inert.
  probs = jnp.where(vis.any(-1, keepdims=True), probs, 0.0)
  out = jnp.einsum("bgrts,bsgd->btgrd", probs, v.astype(jnp.float32))
  return out.reshape(b, t, h, d).astype(q.dtype)

