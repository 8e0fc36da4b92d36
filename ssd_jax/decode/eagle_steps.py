"""An EAGLE draft's decode steps (ssd_jax/models/eagle.py is the model): its prefill and feature history, jitted, and
the two functions of its steps.DraftKind (`linear`, `step`), through which the shared chain and tree
(steps.draft_propose, steps.draft_tree) draft with it.

Positions are 0-based: a row's committed text is x_0..x_{L-1}, its last token x_{L-1} the latest bonus. The draft at
position p reads x_p and a feature of position p-1: `hist[p-1]`, the fused target features of p-1, when the target
has verified p-1, else its own output hidden state at p-1. State kept on the draft's device:

  cache  the draft's KV cache (one layer), slots = positions, tree scratch after them as for the standalone draft
  hist   [B, S, d] fused target features by position (`observe` writes them as verifies return them)

Catch-up: every proposal first re-feeds the last K+1 committed positions (L-K-1..L-1) reading target features, so
positions a previous round wrote from the draft's own features (drafted tokens since accepted, SSD's glue) are
rewritten from the target's: at most K accepted tokens and the bonus, so K+1 positions cover them.

SD: after a verify the target's features reach L-2, the catch-up ends at the bonus, and the K tokens are drafted at
depths 0..K-1 (depth = positions read from the draft's own features). SSD's tree runs while the target verifies a
speculation s_1..s_K: features reach only L-2, the glue feeds s_1..s_K one by one from the draft's own features, and
each branch (j accepted, bonus guess c) drafts K tokens from the glue's hidden state at j.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from ..models import eagle
from ..models.eagle import EagleConfig
from ..kernels import causal_mask_info
from ..models.kv_cache import KVCache


def init_hist(cfg: EagleConfig, batch: int, slots: int) -> jax.Array:
  """Returns an empty feature history [B, S, d]."""
  return jnp.zeros((batch, slots, cfg.d_model), jnp.float32)


def _prev_features(hist, positions):
  """Returns hist[position - 1] per row [B, T, d] (zeros at position 0: nothing precedes the text)."""
  prev = jnp.take_along_axis(hist, jnp.maximum(positions - 1, 0)[..., None], axis=1)
  return jnp.where((positions > 0)[..., None], prev, 0.0)


@functools.partial(jax.jit, static_argnames=("cfg", "attn_impl", "platform"), donate_argnames=("cache", "hist"))
def eagle_prefill(params, tokens, feats, cache: KVCache, hist, cfg: EagleConfig, attn_impl: str = "auto",
                  platform: str | None = None):
  """Returns (cache, hist) after the prompts [B, T] and their target features [B, T, n_feat * d] (target prefill).

  Positions past a row's prompt hold padding; they are never visible and are rewritten as the row advances.
  """
  b, t = tokens.shape
  pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
  hist = hist.at[:, :t].set(eagle.fuse(params, feats, platform=platform))
  _, _, cache = eagle.forward(params, tokens, _prev_features(hist, pos), pos, cache, pos, causal_mask_info(pos), cfg,
                              logit_index=jnp.zeros((b, 1), jnp.int32), attn_impl=attn_impl, platform=platform)
  return cache, hist


@functools.partial(jax.jit, static_argnames=("platform",), donate_argnames=("hist",))
def eagle_observe(params, hist, feats, start, platform: str | None = None):
  """Returns hist with the target features feats [B, T, n_feat * d] of positions start..start+T-1 ([B]) fused in."""
  b, t = feats.shape[:2]
  slots = start[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]
  return hist.at[jnp.arange(b)[:, None], slots].set(eagle.fuse(params, feats, platform=platform), mode="drop")


def _catch_up(params, cache, hist, window, lengths, cfg, attn_impl, platform):
  """Feeds the last W committed tokens window [B, W] (positions L-W..L-1) reading target features; returns
  (logits after x_{L-1} [B, V_out], hidden state at L-1 [B, d], cache). Positions before 0 are not written."""
  b, w = window.shape
  pos = lengths[:, None] - w + jnp.arange(w, dtype=jnp.int32)[None, :]
  slots = jnp.where(pos >= 0, pos, cache.num_slots)  # out of range: dropped
  pos = jnp.maximum(pos, 0)
  logits, h, cache = eagle.forward(params, window, _prev_features(hist, pos), pos, cache, slots,
                                   causal_mask_info(pos), cfg, attn_impl=attn_impl, platform=platform)
  return logits[:, -1], h[:, -1], cache


def linear(params, cache: KVCache, hist, window, spec, lengths, cfg: EagleConfig, attn_impl: str = "auto",
           platform: str | None = None):
  """Returns (g [B, J+1, V_out], h [B, J+1, d], cache): an EAGLE draft's linear feed (steps.DraftKind). The catch-up
  re-feeds window [B, K+1] (positions L-K-1..L-1) from target features; then s_1..s_J (spec [B, J]) are fed one by
  one at positions L..L-1+J, each reading the hidden state before it. g[:, j] are the logits after x_{L-1}, s_1..s_j
  and h[:, j] the hidden state a step after them reads."""
  logits, h, cache = _catch_up(params, cache, hist, window, lengths, cfg, attn_impl, platform)
  gs, hs = [logits], [h]
  for i in range(spec.shape[1]):
    s = (lengths + i)[:, None]
    lg, hh, cache = step(params, cache, spec[:, i:i + 1], hs[-1][:, None], s, s, causal_mask_info(s), cfg, attn_impl,
                         platform)
    gs.append(lg[:, 0])
    hs.append(hh[:, 0])
  return jnp.stack(gs, 1), jnp.stack(hs, 1), cache


def step(params, cache: KVCache, tokens, h_prev, positions, slots, mask, cfg: EagleConfig, attn_impl: str = "auto",
         platform: str | None = None):
  """Returns (logits [B, T, V_out], h [B, T, d], cache): one EAGLE draft forward of tokens [B, T] reading the hidden
  states h_prev [B, T, d] of the positions before them (steps.DraftKind)."""
  return eagle.forward(params, tokens, h_prev, positions, cache, slots, mask, cfg, attn_impl=attn_impl,
                       platform=platform)
