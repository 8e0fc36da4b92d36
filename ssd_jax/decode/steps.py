"""The decode steps: pure jitted functions over params, caches and small arrays, shared by the AR, SD and SSD loops.

Per row the committed text is x_1..x_L; its last token x_L (the previous round's bonus) is in neither cache yet: the
target cache holds L-1 tokens. A speculative round:
  draft:  `draft_propose` feeds [x_{L-1}, x_L] at slots L-2, L-1 (re-writing x_{L-1} is harmless and covers the case
          where the previous round accepted all K drafts, whose last one the draft never fed), then K-1 single steps:
          s_1..s_K and the exact processed distributions q_1..q_K they were drawn from;
  target: `verify` feeds [x_L, s_1..s_K] at slots L-1..L-1+K, giving p_1..p_{K+1}; sampling.rejection_sample gives
          k accepted drafts and a bonus token; committing x_L, s_1..s_k is a length update (the target length becomes
          L+k; rejected entries stay in the cache, invisible, and are overwritten later). With K = 0 (AR) a verify is
          one AR step: it feeds x_L and its bonus is the target's next token; `ar_chunk` runs n of them in one call.
SSD's draft, from the same inputs while the target verifies s_1..s_K (`draft_tree`):
  glue:  feeds [x_{L-1}, x_L, s_1..s_K] at slots L-2..L-1+K (linear, committed-style), giving draft logits g_j after
         x_L, s_1..s_j for j = 0..K;
  fork:  for each acceptance length j, the F most likely bonus tokens under g_j, excluding s_{j+1} for j < K (the
         residual max(0, p - q) is zero on a rejected draft token, so it can never be the bonus);
  tree:  K draft steps over all (K+1)*F branches at once. Branch (j, c) is the text x_1..x_L, s_1..s_j, c; its tokens
         live in a step-major scratch region after the glue (slot L+K + d*(K+1)*F + branch) with RoPE positions
         L+j+d, and attention sees the glue up to its fork point plus its own earlier scratch entries only.
The result is the speculation cache: for every key (j, c), K tokens and the exact distributions they were drawn from;
the round finds the verify outcome (k, t*) in it on the host (speculator.find), and `pick_branch` its q.
The draft's chain and tree are written once for every kind of draft model; a kind supplies only how it feeds the
committed text and one forward (`DraftKind`). The slots above are those of a draft that reads tokens (standalone or
off-the-shelf, `TOKENS`); an EAGLE draft (`EAGLE`, eagle_steps.py) reads the target's features and re-feeds the last
K+1 committed tokens instead of two. `prefill` and `verify` here also return the target's features of the positions
they ran (`feature_layers`), which go to an EAGLE draft with the outcome; without feature_layers they compile to
exactly the programs a standalone draft uses.

Random streams: each role draws from its own stream of the run's seed (`stream_key`), so the draft's proposals are
independent of the verifier's uniforms and never reuse the first token's key.
"""
from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..models import model
from . import sampling
from ..models.config import ModelConfig
from ..kernels import MaskInfo, causal_mask_info
from ..models.kv_cache import KVCache
from . import eagle_steps
from ..models.config import is_eagle

DRAFT_STREAM, VERIFY_STREAM = 0x5EED, 0xC0DE


def stream_key(seed: int, stream: int):
  """Returns the root key of one random stream of a run (DRAFT_STREAM, VERIFY_STREAM)."""
  return jax.random.fold_in(jax.random.key(seed), stream)


@jax.jit
def fold(key, *idx):
  """Returns `key` folded with each index in turn (e.g. round, then use within the round); one dispatch per call,
  where eager fold_ins would cost one each (they run every round)."""
  for i in idx:
    key = jax.random.fold_in(key, i)
  return key


@functools.partial(jax.jit, static_argnames=("n",))
def fold_steps(key, first, n: int):
  """Returns [n] keys, `key` folded with first, first+1, .., first+n-1 in one dispatch: fold(key, r) of n rounds."""
  return jax.vmap(lambda r: jax.random.fold_in(key, r))(first + jnp.arange(n))


@functools.partial(jax.jit, static_argnames=("cfg", "attn_impl", "platform", "feature_layers"),
                   donate_argnames=("cache",))
def prefill(params, tokens, lengths, cache: KVCache, cfg: ModelConfig, attn_impl: str = "auto",
            platform: str | None = None, feature_layers: tuple = ()):
  """Returns (logits at each row's last prompt token [B, V_out], cache holding the prompts, lengths set), plus the
  target features of every prompt position [B, T_pad, n_feat * d] when `feature_layers` is given (an EAGLE draft).

  Static: cfg, attn_impl, platform (what the program is compiled for; it picks the kernels), feature_layers and the
  shapes (tokens are padded to a bucket, so a few programs serve all prompts).
  """
  cache = cache.replace(lengths=jnp.zeros_like(lengths))
  out = model.forward_causal(params, tokens, cache, cfg, logit_index=(lengths - 1)[:, None], attn_impl=attn_impl,
                             feature_layers=feature_layers, platform=platform)
  logits, cache = out[0], out[1].replace(lengths=lengths)
  return (logits[:, 0], cache) + tuple(out[2:])


@functools.partial(jax.jit, static_argnames=("cfg",))
def first_tokens(params, logits, key, temperature, top_p, cfg: ModelConfig):
  """Samples the token that follows each prompt from prefill logits [B, V_out] (step 0 of the key schedule)."""
  keys = sampling.row_keys(key, 0, logits.shape[0])
  probs = sampling.processed_probs(logits, temperature, top_p)
  return model.to_token_ids(params, jax.vmap(sampling.sample)(keys, probs), cfg)


@functools.partial(jax.jit, static_argnames=("cfg", "attn_impl", "platform", "feature_layers"),
                   donate_argnames=("cache",))
def verify(params, cache: KVCache, bonus_prev, drafts, q, active, key, temperature, top_p, cfg: ModelConfig,
           attn_impl: str = "auto", platform: str | None = None, feature_layers: tuple = ()):
  """Returns (accept_len [B], bonus [B], cache) for one verification of [x_L, s_1..s_K] per row, plus the target
  features of those K+1 positions [B, K+1, n_feat * d] when `feature_layers` is given (an EAGLE draft reads them).

  cache.lengths is L-1 on entry; on exit it is L+k for active rows (unchanged for inactive ones). Static: cfg,
  feature_layers and shapes; temperature and top_p are dynamic.
  """
  tokens = jnp.concatenate([bonus_prev[:, None], drafts], axis=1)
  out = model.forward_causal(params, tokens, cache, cfg, attn_impl=attn_impl, feature_layers=feature_layers,
                             platform=platform)
  logits, cache = out[0], out[1]

  def sampled(lg):
    p = sampling.processed_probs(lg, temperature, top_p)
    return sampling.rejection_sample(key, p, q, drafts)

  # Greedy takes the same outcome from argmaxes, skipping the softmax and the Gumbel draw over the vocabulary.
  accept_len, bonus = jax.lax.cond(temperature > 0, sampled, lambda lg: sampling.greedy_outcome(lg, drafts), logits)
  accept_len = jnp.where(active, accept_len, 0)
  new_len = cache.lengths + jnp.where(active, 1 + accept_len, 0)
  return (accept_len, bonus, cache.replace(lengths=new_len.astype(jnp.int32))) + tuple(out[2:])


@functools.partial(jax.jit, static_argnames=("n", "cfg", "attn_impl", "platform", "feature_layers"),
                   donate_argnames=("cache",))
def ar_chunk(params, cache: KVCache, bonus_prev, active, keys, temperature, top_p, n: int, cfg: ModelConfig,
             attn_impl: str = "auto", platform: str | None = None, feature_layers: tuple = ()):
  """Returns (accept_len [B]: n-1 on active rows, 0 on the others; bonus [B]: the last step's token; made [B, n-1]:
  the tokens of the steps before it; cache): n AR steps in one program, paying the host's work per call once.

  Step i is `verify` of no drafts with keys[i] (`fold_steps`: the key the unfused loop gives that round), its input
  the token step i-1 drew (bonus_prev for step 0), so the n tokens are those of n unfused rounds. Every active row
  takes all n steps: a row its book ends mid-chunk (a stop id, max_new_tokens) writes past its text into its own
  cache, which a done row never reads again. Static: n, cfg, feature_layers (features a verify would return are
  dropped: AR has no draft to read them) and shapes.
  """
  b = bonus_prev.shape[0]
  none, q0 = jnp.zeros((b, 0), jnp.int32), jnp.zeros((b, 0, cfg.vocab_size), jnp.float32)
  st = dict(cfg=cfg, attn_impl=attn_impl, platform=platform, feature_layers=feature_layers)

  def step(i, carry):
    cache, prev, made = carry
    _, tok, cache = verify(params, cache, prev, none, q0, active, keys[i], temperature, top_p, **st)[:3]
    return cache, tok, made.at[:, i].set(tok)

  cache, last, made = jax.lax.fori_loop(0, n, step, (cache, bonus_prev, jnp.zeros((b, n), jnp.int32)))
  return jnp.where(active, n - 1, 0).astype(jnp.int32), last, made[:, :-1], cache


def draw(params, logits, key, temperature, top_p, saguaro_c, saguaro_top: int, cfg):
  """Returns (token ids [B, ...], the exact law they were drawn from over the draft's head rows [B, ..., V_out]) from
  draft logits [B, ..., V_out]: the proposal step of every draft kind (standalone and EAGLE, chain and tree), so each
  hands the verifier the law it drew from (temperature, top-p, Saguaro's q' with saguaro_top > 0; argmax at T = 0).
  `key` is one key for the whole call, or one per row [B]."""
  def sampled(lg):
    probs = sampling.saguaro_rescale(sampling.processed_probs(lg, temperature, top_p), saguaro_c, saguaro_top)
    return (jax.vmap(sampling.sample)(key, probs) if key.ndim else sampling.sample(key, probs)), probs

  tok, probs = sampling.greedy_or(sampled, logits, temperature)
  return model.to_token_ids(params, tok, cfg), probs


def fork(params, scores, spec, cfg, k: int, fan_out: tuple):
  """Returns (cand [B, N] bonus guesses, branch_j [N] their acceptance lengths), N = sum(fan_out): SSD's fork for
  every draft kind. The top F_j tokens by the draft's scores after x_L, s_1..s_j (scores [B, K+1, V_out]: logits or
  probabilities, any order-preserving form), the drafted token s_{j+1} left out for j < K (the residual
  max(0, p - q) is zero on a rejected draft token, so it is never the bonus)."""
  b, _, v = scores.shape
  branch_j = np.repeat(np.arange(k + 1), fan_out).astype(np.int32)
  rank = np.concatenate([np.arange(f) for f in fan_out]).astype(np.int32)
  if cfg.head_vocab is None:
    spec_rows, spec_known = spec, jnp.ones(spec.shape, bool)
  else:
    spec_rows = params["vocab_map"][spec]
    spec_known = params["head_ids"][spec_rows] == spec
  excl = jax.nn.one_hot(spec_rows, v, dtype=bool) & spec_known[..., None]  # [B, K, V_out]
  excl = jnp.concatenate([excl, jnp.zeros((b, 1, v), bool)], axis=1)
  _, top_rows = jax.lax.top_k(jnp.where(excl, -jnp.inf, scores.astype(jnp.float32)), max(fan_out))
  return model.to_token_ids(params, top_rows[:, branch_j, rank], cfg), jnp.asarray(branch_j)


class DraftKind(NamedTuple):
  """What one kind of draft model supplies to the draft side's chain and tree (draft_propose, draft_tree), which are
  written once for every kind: two pure functions, called inside their jit, and how their loops are laid out.
  `carried` is what a draft reads at a position besides its token (an EAGLE draft: the hidden state of the position
  before, [B, T, d]; None for a draft that reads tokens only); `hist` is a kind's read-only context (an EAGLE draft's
  fused target features by position, eagle_steps.py; None otherwise).

  linear(params, cache, hist, window, spec, lengths, cfg, attn_impl, platform) -> (g, carried, cache): feeds the last
    committed tokens `window` (x_L last, at slot L-1) and then spec [B, J] at slots L..L-1+J, linearly; returns the
    logits after x_L, s_1..s_j, g [B, J+1, V_out], and what a step after each of them carries [B, J+1, ...].
  step(params, cache, tokens, carried, positions, slots, mask, cfg, attn_impl, platform) -> (logits, carried, cache):
    one draft forward of tokens [B, T] at RoPE positions and cache slots [B, T] that see what `mask` says;
    logits [B, T, V_out].
  unroll: whether the chain's and the tree's loops over K are unrolled (a cheap step: faster, and cheap to compile)
    or one loop body (a deep model: one copy of its layers to compile whatever K).
  """
  linear: Callable
  step: Callable
  unroll: bool = False


def _tokens_linear(params, cache, hist, window, spec, lengths, cfg, attn_impl, platform):
  """A draft that reads tokens: [x_{L-1}, x_L] (window [B, 2]) and spec at slots L-2..L-1+J in one forward."""
  b, j = spec.shape
  slots = jnp.maximum(lengths[:, None] - 2 + jnp.arange(j + 2)[None, :], 0)
  after = jnp.broadcast_to(1 + jnp.arange(j + 1), (b, j + 1))  # logits after x_L, s_1..s_J
  g, cache = model.forward(params, jnp.concatenate([window, spec], axis=1), slots, cache, slots,
                           causal_mask_info(slots), cfg, logit_index=after, attn_impl=attn_impl, platform=platform)
  return g, None, cache


def _tokens_step(params, cache, tokens, carried, positions, slots, mask, cfg, attn_impl, platform):
  """A draft that reads tokens: one model forward; it carries nothing from one position to the next."""
  logits, cache = model.forward(params, tokens, positions, cache, slots, mask, cfg, attn_impl=attn_impl,
                                platform=platform)
  return logits, None, cache


TOKENS = DraftKind(_tokens_linear, _tokens_step)  # standalone and off-the-shelf drafts (model.py)
EAGLE = DraftKind(eagle_steps.linear, eagle_steps.step, unroll=True)  # drafts reading the target's features


def draft_kind(cfg) -> DraftKind:
  """Returns the DraftKind of a draft config: EAGLE for an EagleConfig, else TOKENS."""
  return EAGLE if is_eagle(cfg) else TOKENS


def _at(carried, idx):
  """Returns the carried state (None, or arrays [B, T, ...]) indexed along its position axis."""
  return jax.tree.map(lambda c: c[:, idx], carried)


@functools.partial(jax.jit, static_argnames=("cfg", "k", "attn_impl", "platform", "saguaro_top"),
                   donate_argnames=("cache",))
def draft_propose(params, cache: KVCache, hist, window, lengths, key, temperature, top_p, saguaro_c, cfg, k: int,
                  attn_impl: str = "auto", platform: str | None = None, saguaro_top: int = 0):
  """Returns (draft tokens [B, K], their processed distributions over the full vocabulary [B, K, V], cache): the
  chain of every draft kind (SD's proposal, SSD's neural backup).

  hist: the kind's context (None for a draft that reads tokens); window: the last committed tokens the kind feeds
  ([B, 2] reading tokens, [B, K+1] for EAGLE); lengths: [B] committed length L (the bonus included). Draft token i
  (0-based) is fed at slot and position L-1+i. Static: cfg (its kind: draft_kind), k, saguaro_top (SSD's Saguaro
  sampling: the top tokens down-weighted by saguaro_c; 0 = plain sampling).
  """
  kind, run = draft_kind(cfg), dict(cfg=cfg, attn_impl=attn_impl, platform=platform)
  b = window.shape[0]
  g, carried, cache = kind.linear(params, cache, hist, window, jnp.zeros((b, 0), jnp.int32), lengths, **run)
  keys = jax.random.split(key, k)

  def draw_row(logits_row, kk):  # one key per row; the law over the full vocabulary, as the verifier reads it
    tok, probs = draw(params, logits_row, jax.random.split(kk, b), temperature, top_p, saguaro_c, saguaro_top, cfg)
    return tok, model.scatter_to_vocab(params, probs, cfg)

  tok, q = draw_row(g[:, 0], keys[0])

  def body(i, carry):
    cache, carried, toks, qs = carry
    s = (lengths + i - 1)[:, None]  # slot of draft token i-1 (0-based): x_L sits at L-1
    lg, carried, cache = kind.step(params, cache, toks[:, i - 1][:, None], _at(carried, None), s, s,
                                   causal_mask_info(s), **run)
    t, qq = draw_row(lg[:, 0], keys[i])
    return cache, _at(carried, 0), toks.at[:, i].set(t), qs.at[:, i].set(qq)

  toks = jnp.zeros((b, k), jnp.int32).at[:, 0].set(tok)
  qs = jnp.zeros((b, k, q.shape[-1]), jnp.float32).at[:, 0].set(q)
  cache, _, toks, qs = jax.lax.fori_loop(1, k, body, (cache, _at(carried, 0), toks, qs),
                                          unroll=kind.unroll)
  return toks, qs, cache


def advance_tail(window, lengths, drafts, accept_len, bonus, active):
  """Returns (window, lengths) after a verify's outcome: the last W committed tokens [B, W] and L [B] of each active
  row once s_1..s_k and the bonus are appended (a row not verified keeps its own). A row the commit cuts at a stop
  or at max_new_tokens is done, so what this gives it (uncut) is never verified."""
  w, k = window.shape[1], drafts.shape[1]
  text = jnp.concatenate([window, drafts, bonus[:, None]], axis=1)  # the text is window, s_1..s_k, bonus
  at = accept_len[:, None] + 1 + jnp.arange(w)[None, :]  # the new tail's places in it; the last one is the bonus
  at = jnp.where(at == w + accept_len[:, None], w + k, at)
  tail = jnp.take_along_axis(text, at, 1)
  return jnp.where(active[:, None], tail, window), lengths + jnp.where(active, 1 + accept_len, 0).astype(lengths.dtype)


@functools.partial(jax.jit, static_argnames=("cfg", "k", "attn_impl", "platform", "saguaro_top"),
                   donate_argnames=("cache",))
def chain_after(params, cache: KVCache, hist, window, lengths, drafts, accept_len, bonus, active, key, temperature,
                top_p, saguaro_c, cfg, k: int, attn_impl: str = "auto", platform: str | None = None,
                saguaro_top: int = 0):
  """Returns (draft tokens [B, K], q [B, K, V], cache, window, lengths): SD's chain after a verify's outcome, read
  on the device (advance_tail of the committed tail the previous call returned; `active` all False: that tail as
  it is), then draft_propose. No host round trip between the verify and the next proposal."""
  window, lengths = advance_tail(window, lengths, drafts, accept_len, bonus, active)
  toks, qs, cache = draft_propose(params, cache, hist, window, lengths, key, temperature, top_p, saguaro_c, cfg=cfg,
                                  k=k, attn_impl=attn_impl, platform=platform, saguaro_top=saguaro_top)
  return toks, qs, cache, window, lengths


def tree_lookahead(k: int, fan_out: tuple) -> int:
  """Returns the draft cache slots one round needs past the committed text: glue K+2 plus K depths of branches."""
  return k + 2 + k * sum(fan_out)


@functools.partial(jax.jit, static_argnames=("cfg", "k", "fan_out", "attn_impl", "platform", "saguaro_top"),
                   donate_argnames=("cache",))
def draft_tree(params, cache: KVCache, hist, window, spec, lengths, key, temperature, top_p, saguaro_c, cfg, k: int,
               fan_out: tuple, attn_impl: str = "auto", platform: str | None = None, saguaro_top: int = 0):
  """Returns (cand [B, N], branch_j [N], tree_tokens [B, N, K], tree_q [B, N, K, V_out], g, cache), N = sum(fan_out):
  the speculation cache of every draft kind, drafted while the target verifies spec [B, K].

  tree_q holds each tree token's exact distribution over the draft's output rows (its head vocabulary, where all of
  a draft distribution's mass lies): the speculation cache stores V_out, not V, floats per token, and `serve_q`
  expands only the one speculation a round serves.

  hist, window, lengths: as in draft_propose; fan_out: (F_0..F_K) guesses per acceptance length. Glue: the kind's
  linear feed of the window and spec. Branch (j, c) feeds c at position L+j carrying the glue's state after s_j, then
  its own tokens. Static: cfg (its kind), k, fan_out (the tree's shape), saguaro_top (Saguaro sampling of the tree
  tokens: top tokens down-weighted by saguaro_c; 0 = plain sampling). The glue distributions g are also returned,
  [B, K+1, V_out], for calibration (bonus-token ranks).
  """
  kind, run = draft_kind(cfg), dict(cfg=cfg, attn_impl=attn_impl, platform=platform)
  b, n = spec.shape[0], sum(fan_out)
  g, carried, cache = kind.linear(params, cache, hist, window, spec, lengths, **run)
  # Fork: top-F bonus candidates per acceptance length j, the drafted token s_{j+1} excluded for j < K.
  probs_g = sampling.processed_probs(g, 1.0, 1.0)  # ranking only; temperature does not change the order
  cand, branch_j = fork(params, probs_g, spec, cfg, k, fan_out)  # [B, N], [N]
  # Tree: K steps over all N branches.
  tree_start = lengths + k
  vis_end = jnp.broadcast_to(lengths[:, None] + branch_j[None, :], (b, n)).astype(jnp.int32)
  branch = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (b, n))
  keys = jax.random.split(key, k)

  def step(d, carry):
    cache, inp, carried, out_t, out_q = carry
    pos = vis_end + d  # RoPE position of the token fed at depth d: L + j + d
    wslots = tree_start[:, None] + d * n + branch
    mask = MaskInfo(visible_end=vis_end, tree_start=tree_start.astype(jnp.int32), tree_branch=branch,
                    tree_depth=jnp.full((b, n), d, jnp.int32), tree_width=n)
    lg, carried, cache = kind.step(params, cache, inp, carried, pos, wslots, mask, **run)
    tok, probs = draw(params, lg, jax.random.fold_in(keys[0], d), temperature, top_p, saguaro_c, saguaro_top, cfg)
    out_t = out_t.at[:, :, d].set(tok)
    out_q = out_q.at[:, :, d].set(probs)
    return cache, tok, carried, out_t, out_q

  out_t = jnp.zeros((b, n, k), jnp.int32)
  out_q = jnp.zeros((b, n, k, cfg.out_vocab), jnp.float32)
  cache, _, _, out_t, out_q = jax.lax.fori_loop(0, k, step, (cache, cand, _at(carried, branch_j), out_t, out_q),
                                                unroll=kind.unroll)
  return cand, branch_j, out_t, out_q, probs_g, cache


@functools.partial(jax.jit, static_argnames=("cfg",))
def serve_q(params, q_out, cfg: ModelConfig):
  """Returns a served speculation's distributions over the full vocabulary [B, K, V] from [B, K, V_out]."""
  return model.scatter_to_vocab(params, q_out, cfg)


@jax.jit
def pick_branch(tree_q, branch):
  """Returns [B, K, V] the distributions of each row's own branch ([B]) of a speculation cache's tree_q: a hit's q,
  on the device the cache lies on (the round finds the branch on the host: speculator.find)."""
  return jnp.take_along_axis(tree_q, branch[:, None, None, None], 1)[:, 0]


@functools.partial(jax.jit, static_argnames=("cfg",))
def bonus_rank(params, glue_g, spec, accept_len, bonus, cfg: ModelConfig):
  """Returns [B] the rank (1 = most likely) of each bonus token under the draft's glue distribution at its
  acceptance length, the drafted token excluded below K: the fan-out a cache needs to have held it. Tokens outside
  the draft's vocabulary get rank V_out + 1."""
  b, k1, v = glue_g.shape
  g = jnp.take_along_axis(glue_g, accept_len[:, None, None], 1)[:, 0]  # [B, V_out]
  if cfg.head_vocab is None:
    rows, known = bonus, jnp.ones_like(bonus, bool)
    srows = spec
  else:
    rows = params["vocab_map"][bonus]
    known = params["head_ids"][rows] == bonus
    srows = params["vocab_map"][spec]
  drafted = jnp.take_along_axis(jnp.concatenate([srows, jnp.full((b, 1), -1, srows.dtype)], 1),
                                accept_len[:, None], 1)[:, 0]
  g = jnp.where(jnp.arange(v)[None, :] == drafted[:, None], -1.0, g)
  pb = jnp.take_along_axis(g, rows[:, None], 1)[:, 0]
  rank = 1 + (g > pb[:, None]).sum(-1)
  return jnp.where(known, rank, v + 1).astype(jnp.int32)


@jax.jit
def merge_rows(hit, a_tokens, a_q, b_tokens, b_q):
  """Returns per row (a if hit else b) for tokens [B, K] and distributions [B, K, V]."""
  return jnp.where(hit[:, None], a_tokens, b_tokens), jnp.where(hit[:, None, None], a_q, b_q)


@jax.jit
def compact_q(q, head_ids):
  """Returns q restricted to the draft's head vocabulary (where all of a draft distribution's mass lies)."""
  return q[..., head_ids]
