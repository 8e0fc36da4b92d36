"""An EAGLE draft's decode steps as pure jitted functions (ssd_jax/eagle.py is the model).

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

from .. import eagle, model, sampling
from ..eagle import EagleConfig
from ..kernels import MaskInfo, causal_mask_info
from ..kv_cache import KVCache
from .steps import draw, fork


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


@functools.partial(jax.jit, static_argnames=("cfg", "k", "attn_impl", "platform", "saguaro_top"),
                   donate_argnames=("cache",))
def eagle_propose(params, cache: KVCache, hist, window, lengths, key, temperature, top_p, saguaro_c, cfg: EagleConfig,
                  k: int, attn_impl: str = "auto", platform: str | None = None, saguaro_top: int = 0):
  """Returns (draft tokens [B, K], their distributions over the full vocabulary [B, K, V], cache).

  window [B, K+1]: the last K+1 committed tokens; lengths [B]: L. Token i (0-based) is drafted at position L-1+i
  reading the draft's own hidden state of the position before (depth i).
  """
  b = window.shape[0]
  logits, h, cache = _catch_up(params, cache, hist, window, lengths, cfg, attn_impl, platform)
  keys = jax.random.split(key, k)
  toks, qs = [], []
  for i in range(k):
    if i:
      s = (lengths + i - 1)[:, None]
      lg, hh, cache = eagle.forward(params, toks[-1][:, None], h[:, None], s, cache, s, causal_mask_info(s), cfg,
                                    attn_impl=attn_impl, platform=platform)
      logits, h = lg[:, 0], hh[:, 0]
    tok, probs = draw(params, logits, jax.random.split(keys[i], b), temperature, top_p, saguaro_c, saguaro_top, cfg)
    toks.append(tok)
    qs.append(model.scatter_to_vocab(params, probs, cfg))
  return jnp.stack(toks, 1), jnp.stack(qs, 1), cache


@functools.partial(jax.jit, static_argnames=("cfg", "k", "fan_out", "attn_impl", "platform", "saguaro_top"),
                   donate_argnames=("cache",))
def eagle_tree(params, cache: KVCache, hist, window, spec, lengths, key, temperature, top_p, saguaro_c,
               cfg: EagleConfig, k: int, fan_out: tuple, attn_impl: str = "auto", platform: str | None = None,
               saguaro_top: int = 0):
  """Returns (cand [B, N], branch_j [N], tree_tokens [B, N, K], tree_q [B, N, K, V_out], glue probs [B, K+1, V_out],
  cache): steps.draft_tree's speculation cache, drafted by an EAGLE draft while the target verifies `spec` [B, K].

  window [B, K+1]: the last K+1 committed tokens (x_{L-1}, the bonus, last); lengths [B]: L. Glue: catch-up, then
  s_1..s_K at positions L..L+K-1, each reading the hidden state before it. Branch (j, c) feeds c at position L+j
  reading the glue's hidden state at L-1+j, then its own tokens; its scratch slots follow the glue's as in
  draft_tree, and it sees the glue up to its fork point and its own scratch entries.
  """
  b, n = spec.shape[0], sum(fan_out)
  logits, h, cache = _catch_up(params, cache, hist, window, lengths, cfg, attn_impl, platform)
  gs, hs = [logits], [h]
  for i in range(k):
    s = (lengths + i)[:, None]
    lg, hh, cache = eagle.forward(params, spec[:, i:i + 1], hs[-1][:, None], s, cache, s, causal_mask_info(s), cfg,
                                  attn_impl=attn_impl, platform=platform)
    gs.append(lg[:, 0])
    hs.append(hh[:, 0])
  g, hg = jnp.stack(gs, 1), jnp.stack(hs, 1)  # [B, K+1, V_out], [B, K+1, d]
  cand, branch_j = fork(params, g, spec, cfg, k, fan_out)
  tree_start = lengths + k
  vis_end = jnp.broadcast_to(lengths[:, None] + branch_j[None, :], (b, n)).astype(jnp.int32)
  branch = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (b, n))
  keys = jax.random.split(key, k)
  inp, h_in = cand, hg[:, branch_j]
  out_t, out_q = [], []
  for d in range(k):
    mask = MaskInfo(visible_end=vis_end, tree_start=tree_start.astype(jnp.int32), tree_branch=branch,
                    tree_depth=jnp.full((b, n), d, jnp.int32), tree_width=n)
    lg, h_in, cache = eagle.forward(params, inp, h_in, vis_end + d, cache, tree_start[:, None] + d * n + branch,
                                    mask, cfg, attn_impl=attn_impl, platform=platform)
    inp, probs = draw(params, lg, jax.random.fold_in(keys[0], d), temperature, top_p, saguaro_c, saguaro_top, cfg)
    out_t.append(inp)
    out_q.append(probs)
  return (cand, branch_j, jnp.stack(out_t, 2), jnp.stack(out_q, 2),
          sampling.processed_probs(g, 1.0, 1.0), cache)
