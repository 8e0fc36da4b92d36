"""Speculative speculative decoding (SSD): the draft, on its own device, pre-drafts for likely verify outcomes.

State per row as in SD (sd.py): committed text x_1..x_L, the bonus x_L in neither cache, the target cache at L-1.
While the target verifies speculation s_1..s_K (device T), the draft (device D), from the same inputs:
  glue:  feeds [x_{L-1}, x_L, s_1..s_K] at slots L-2..L-1+K (linear, committed-style), giving draft logits g_j after
         x_L, s_1..s_j for j = 0..K;
  fork:  for each acceptance length j, the F most likely bonus tokens under g_j, excluding s_{j+1} for j < K (the
         residual max(0, p - q) is zero on a rejected draft token, so it can never be the bonus);
  tree:  K draft steps over all (K+1)*F branches at once. Branch (j, c) is the text x_1..x_L, s_1..s_j, c; its tokens
         live in a step-major scratch region after the glue (slot L+K + d*(K+1)*F + branch) with RoPE positions
         L+j+d, and attention sees the glue up to its fork point plus its own earlier scratch entries only.
The result is the speculation cache: for every key (j, c), K tokens and the exact distributions they were drawn from.
When verification returns (k, t*), a hit serves the cached speculation at once; a miss falls back to the backup
speculator (the draft, just in time, exactly as in SD). Either way the verifier's ratio test sees the exact
distribution each served token was sampled from, so the output is the target's distribution.
"""
from __future__ import annotations

import functools
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from .. import model, sampling
from ..config import ModelConfig
from ..kernels import MaskInfo, causal_mask_info
from ..kv_cache import KVCache
from .ar import first_tokens
from .base import DecodeOptions, DecodeResult, Programs, SpecBook, StreamFn, cache_slots, pad_prompts, prefill
from ..backup import BACKUPS, ngram_propose, point_mass, random_speculation
from ..fan_out import parse_fan_out, uniform_fan_out
from ..timing_model import neural_backup_better
from ..sharding import Placement, make_placement
from .sd import check_pair, draft_propose, verify


def tree_lookahead(k: int, fan_out: tuple) -> int:
  """Returns the draft cache slots one round needs past the committed text: glue K+2 plus K depths of branches."""
  return k + 2 + k * sum(fan_out)


@functools.partial(jax.jit, static_argnames=("cfg", "k", "fan_out", "attn_impl", "saguaro_top"),
                   donate_argnames=("cache",))
def draft_tree(params, cache: KVCache, last2, spec, lengths, key, temperature, top_p, saguaro_c, cfg: ModelConfig,
               k: int, fan_out: tuple, attn_impl: str = "auto", saguaro_top: int = 0):
  """Returns (cand [B, N], branch_j [N], tree_tokens [B, N, K], tree_q [B, N, K, V_out], g, cache), N = sum(fan_out).

  tree_q holds each tree token's exact distribution over the draft's output rows (its head vocabulary, where all of
  a draft distribution's mass lies): the speculation cache stores V_out, not V, floats per token, and `serve_q`
  expands only the one speculation a round serves.

  last2: [B, 2] the last two committed tokens (x_{L-1}, x_L); spec: [B, K] the speculation being verified;
  lengths: [B] L; fan_out: (F_0..F_K) guesses per acceptance length. Static: cfg, k, fan_out (the tree's shape),
  saguaro_top (Saguaro sampling of the tree tokens: top tokens down-weighted by saguaro_c; 0 = plain sampling).
  The glue distributions g are also returned, [B, K+1, V_out], for calibration (bonus-token ranks).
  """
  b = last2.shape[0]
  n = sum(fan_out)
  branch_j_np = np.repeat(np.arange(k + 1), fan_out).astype(np.int32)  # [N]
  rank_np = np.concatenate([np.arange(f) for f in fan_out]).astype(np.int32)  # [N]
  # Glue: linear writes of x_{L-1}, x_L, s_1..s_K.
  toks = jnp.concatenate([last2, spec], axis=1)
  slots = jnp.maximum(lengths[:, None] - 2 + jnp.arange(k + 2)[None, :], 0)
  g, cache = model.forward(params, toks, slots, cache, slots, causal_mask_info(slots), cfg,
                           logit_index=jnp.broadcast_to(1 + jnp.arange(k + 1), (b, k + 1)), attn_impl=attn_impl)
  # Fork: top-F bonus candidates per acceptance length j, the drafted token s_{j+1} excluded for j < K.
  probs_g = sampling.processed_probs(g, 1.0, 1.0)  # ranking only; temperature does not change the order
  if cfg.head_vocab is None:
    spec_rows, spec_known = spec, jnp.ones(spec.shape, bool)
  else:
    spec_rows = params["vocab_map"][spec]
    spec_known = params["head_ids"][spec_rows] == spec
  excl = jax.nn.one_hot(spec_rows, g.shape[-1], dtype=bool) & spec_known[..., None]  # [B, K, V_out]
  excl = jnp.concatenate([excl, jnp.zeros((b, 1, g.shape[-1]), bool)], axis=1)
  _, top_rows = jax.lax.top_k(jnp.where(excl, -1.0, probs_g), max(fan_out))  # [B, K+1, F_max]
  cand = model.to_token_ids(params, top_rows[:, branch_j_np, rank_np], cfg)  # [B, N]
  branch_j = jnp.asarray(branch_j_np)
  # Tree: K steps over all N branches.
  tree_start = lengths + k
  vis_end = jnp.broadcast_to(lengths[:, None] + branch_j[None, :], (b, n)).astype(jnp.int32)
  branch = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (b, n))
  keys = jax.random.split(key, k)

  def step(d, carry):
    cache, inp, out_t, out_q = carry
    pos = vis_end + d  # RoPE position of the token fed at depth d: L + j + d
    wslots = tree_start[:, None] + d * n + branch
    mask = MaskInfo(visible_end=vis_end, tree_start=tree_start.astype(jnp.int32), tree_branch=branch,
                    tree_depth=jnp.full((b, n), d, jnp.int32), tree_width=n)
    lg, cache = model.forward(params, inp, pos, cache, wslots, mask, cfg, attn_impl=attn_impl)
    probs = sampling.processed_probs(lg, temperature, top_p)  # [B, N, V_out]
    probs = sampling.saguaro_rescale(probs, saguaro_c, saguaro_top)
    tok = sampling.sample(jax.random.fold_in(keys[0], d), probs)
    tok = model.to_token_ids(params, tok, cfg)
    out_t = out_t.at[:, :, d].set(tok)
    out_q = out_q.at[:, :, d].set(probs)
    return cache, tok, out_t, out_q

  out_t = jnp.zeros((b, n, k), jnp.int32)
  out_q = jnp.zeros((b, n, k, cfg.out_vocab), jnp.float32)
  cache, _, out_t, out_q = jax.lax.fori_loop(0, k, step, (cache, cand, out_t, out_q))
  return cand, branch_j, out_t, out_q, probs_g, cache


def fan_out_tuple(fan_out, k: int, draft_cfg: ModelConfig) -> tuple:
  """Returns the K+1 per-acceptance-length fan-outs from an int (uniform), a string or a sequence, checked."""
  if isinstance(fan_out, (int, np.integer)):
    fan_out = uniform_fan_out(k, int(fan_out))
  elif isinstance(fan_out, str):
    fan_out = parse_fan_out(fan_out, k)
  fan_out = tuple(int(x) for x in fan_out)
  if len(fan_out) != k + 1 or min(fan_out) < 0 or sum(fan_out) < 1:
    raise ValueError(f"fan-out must be >= 1, or K+1 = {k + 1} non-negative counts with a positive sum; "
                     f"got {fan_out}")
  if max(fan_out) > draft_cfg.out_vocab - 1:
    raise ValueError(f"fan-out {max(fan_out)} exceeds the draft's vocabulary")
  return fan_out


def ssd_settings(k: int, fan_out, fan_out_miss, backup: str, saguaro_c: float, draft_cfg: ModelConfig):
  """Returns (fan_out, fan_out_miss, saguaro_top) after checking SSD's options; raises ValueError on bad ones.

  After a miss the served speculation came from the backup (with a fast backup, k = 0 is then likely): the tree may
  spread its budget differently, but over the same number of branches (the same compiled shapes). Saguaro
  sampling's rescaled set is the cached candidates plus the drafted token (which the fork excludes).
  """
  f = fan_out_tuple(fan_out, k, draft_cfg)
  f_miss = fan_out_tuple(fan_out_miss, k, draft_cfg) if fan_out_miss is not None else f
  if sum(f_miss) != sum(f):
    raise ValueError(f"fan-out after a miss {f_miss} must have the same total as after a hit {f}")
  if backup not in BACKUPS:
    raise ValueError(f"unknown backup {backup!r}; choose from {', '.join(BACKUPS)}")
  if not 0 < saguaro_c <= 1:
    raise ValueError(f"Saguaro C must be in (0, 1], got {saguaro_c}")
  return f, f_miss, (0 if saguaro_c == 1 else max(max(f), max(f_miss)) + 1)


def hit_stats(hits, hits_by_len, rounds_by_len, i: int) -> dict:
  """Returns row i's cache hit rate overall and per acceptance length (None where no round had that length)."""
  return {"cache_hit_rate": round(float(hits[i] / max(rounds_by_len[i].sum(), 1)), 4),
          "hit_rate_by_accept_len": [round(float(h / r), 4) if r else None
                                     for h, r in zip(hits_by_len[i], rounds_by_len[i])]}


def new_tally() -> dict:
  """Running statistics for the automatic backup choice (Theorem 17)."""
  return {"hit_rounds": 0, "hit_tokens": 0, "neural_rounds": 0, "neural_tokens": 0, "neural_s": 0.0,
          "verify_s": 0.0, "verify_n": 0}


def record_round(tally: dict, served_kind: str, live, seqs, lens_before) -> None:
  """Counts a verified round's rows and tokens under the kind of speculation it served ('hit' or 'neural')."""
  if served_kind not in ("hit", "neural"):
    return
  for i in np.flatnonzero(live):
    tally[f"{served_kind}_rounds"] += 1
    tally[f"{served_kind}_tokens"] += len(seqs[i]) - int(lens_before[i])


def choose_backup(setting: str, tally: dict, batch: int) -> str:
  """Returns the backup for the next miss: `setting` itself, or for 'auto' the Theorem 17 choice from `tally`
  (times in units of one verify), neural until both kinds of round have been seen twice."""
  if setting != "auto":
    return setting
  if tally["neural_rounds"] < 2 or tally["hit_rounds"] < 2 or tally["verify_n"] < 2:
    return "neural"  # gather statistics first
  lookups = tally["hit_rounds"] + tally["neural_rounds"]
  t_verify = tally["verify_s"] / tally["verify_n"]
  better = neural_backup_better(batch, tally["hit_rounds"] / lookups, tally["hit_tokens"] / tally["hit_rounds"],
                                tally["neural_tokens"] / tally["neural_rounds"],
                                tally["neural_s"] / tally["neural_rounds"] / t_verify)
  return "neural" if better else "fast"


@functools.partial(jax.jit, static_argnames=("cfg",))
def serve_q(params, q_out, cfg: ModelConfig):
  """Returns a served speculation's distributions over the full vocabulary [B, K, V] from [B, K, V_out]."""
  return model.scatter_to_vocab(params, q_out, cfg)


@jax.jit
def lookup(cand, branch_j, tree_tokens, tree_q, accept_len, bonus):
  """Returns (hit [B], tokens [B, K], q [B, K, V]) for verify outcomes (accept_len, bonus) [B] in the cache."""
  match = (branch_j[None, :] == accept_len[:, None]) & (cand == bonus[:, None])  # [B, N]
  hit = match.any(-1)
  idx = jnp.argmax(match, -1)
  toks = jnp.take_along_axis(tree_tokens, idx[:, None, None], 1)[:, 0]
  q = jnp.take_along_axis(tree_q, idx[:, None, None, None], 1)[:, 0]
  return hit, toks, q


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


class SSDDecoder:
  """SSD with the draft on its own device, uniform fan-out F and the neural (just-in-time draft) backup."""

  mode = "ssd"

  def __init__(self, target_cfg: ModelConfig, target_params, draft_cfg: ModelConfig, draft_params, k: int = 1,
               fan_out=3, attn_impl: str = "auto", placement: Placement | None = None, fan_out_miss=None,
               backup: str = "neural",
               saguaro_c: float = 1.0, record_ranks: bool = False):
    check_pair(target_cfg, draft_cfg, k)
    self.fan_out, self.fan_out_miss, self.saguaro_top = ssd_settings(k, fan_out, fan_out_miss, backup, saguaro_c,
                                                                     draft_cfg)
    self.backup, self.saguaro_c = backup, float(saguaro_c)
    self.record_ranks = record_ranks  # calibration: keep (accept_len, bonus rank) of every round
    # Default: the target on the first device, the draft on the next one (when the platform has two).
    self.placement = placement or make_placement(1, 1)
    self.ddev = self.placement.draft_device
    self.tdevs = sorted(d.id for d in self.placement.target_mesh.devices.flat)
    self.tcfg, self.dcfg, self.k, self.attn_impl = target_cfg, draft_cfg, k, attn_impl
    self.tparams = self.placement.shard_target(target_params, target_cfg)
    self.dparams = jax.device_put(draft_params, self.ddev)
    self.programs = Programs()

  def generate(self, prompts: Sequence[Sequence[int]], opts: DecodeOptions, stream: StreamFn | None = None
               ) -> list[DecodeResult]:
    opts.validate()
    tcfg, dcfg, k, f, run = self.tcfg, self.dcfg, self.k, self.fan_out, self.programs
    tokens, lengths = pad_prompts(prompts)
    b = len(prompts)
    max_prompt = int(lengths.max())
    look = tree_lookahead(k, f)
    if max_prompt + opts.max_new_tokens + k + 1 > tcfg.max_seq_len:
      raise ValueError(f"K={k} needs {k + 1} cache slots past the text; prompt ({max_prompt}) + max_new_tokens "
                       f"({opts.max_new_tokens}) leave too little of the {tcfg.max_seq_len}-token context")
    tslots = cache_slots(tcfg, max_prompt, opts.max_new_tokens, lookahead=k + 2)
    dslots = cache_slots(dcfg, max_prompt, opts.max_new_tokens, lookahead=look)
    tcache = self.placement.target_cache(tcfg, b, tslots, jnp.float32)
    dcache = jax.device_put(KVCache.init(dcfg, b, dslots), self.ddev)
    on_t = self.placement.to_target  # small target inputs: every target device (of every process)
    on_d = lambda x: jax.device_put(x, self.ddev)
    key = jax.random.key(opts.seed)
    temp_t, top_p_t = on_t(jnp.float32(opts.temperature)), on_t(jnp.float32(opts.top_p))
    temp, top_p = on_d(jnp.float32(opts.temperature)), on_d(jnp.float32(opts.top_p))  # the draft's copies
    sag_c = on_d(jnp.float32(self.saguaro_c))
    st_sag = dict(saguaro_top=self.saguaro_top)
    st_t = dict(cfg=tcfg, attn_impl=self.attn_impl)
    st_d = dict(cfg=dcfg, attn_impl=self.attn_impl)

    # Separate random streams per role: the draft's proposals must be independent of the verifier's uniforms.
    draft_root, verify_root = jax.random.fold_in(key, 0x5EED), jax.random.fold_in(key, 0xC0DE)

    def dkey(*idx):
      kk = draft_root
      for i in idx:
        kk = jax.random.fold_in(kk, i)
      return on_d(kk)

    z_d, z_t = on_d(jnp.zeros((b,), jnp.int32)), on_t(jnp.zeros((b,), jnp.int32))
    n = sum(f)
    tok_t, len_t = on_t(jnp.asarray(tokens)), on_t(jnp.asarray(lengths))
    tok_d, len_d = on_d(jnp.asarray(tokens)), on_d(jnp.asarray(lengths))
    for fn, args, kw in (
        (prefill, (self.tparams, tok_t, len_t, tcache), st_t),
        (prefill, (self.dparams, tok_d, len_d, dcache), st_d),
        (first_tokens, (self.tparams, on_t(jnp.zeros((b, tcfg.out_vocab))), on_t(key), temp_t, top_p_t),
         dict(cfg=tcfg)),
        (draft_propose, (self.dparams, dcache, on_d(jnp.zeros((b, 2), jnp.int32)), z_d, dkey(0), temp, top_p,
                         sag_c), dict(st_d, k=k, **st_sag)),
        (random_speculation, (dkey(0),), dict(batch=b, k=k, vocab=dcfg.vocab_size)),
        (point_mass, (on_d(jnp.zeros((b, k), jnp.int32)),), dict(vocab=dcfg.vocab_size)),
        (draft_tree, (self.dparams, dcache, on_d(jnp.zeros((b, 2), jnp.int32)), on_d(jnp.zeros((b, k), jnp.int32)),
                      z_d, dkey(0), temp, top_p, sag_c), dict(st_d, k=k, fan_out=f, **st_sag)),
        (draft_tree, (self.dparams, dcache, on_d(jnp.zeros((b, 2), jnp.int32)), on_d(jnp.zeros((b, k), jnp.int32)),
                      z_d, dkey(0), temp, top_p, sag_c), dict(st_d, k=k, fan_out=self.fan_out_miss, **st_sag)),
        (verify, (self.tparams, tcache, z_t, on_t(jnp.zeros((b, k), jnp.int32)),
                  on_t(jnp.zeros((b, k, tcfg.vocab_size))), on_t(z_t > 0), on_t(key), temp_t, top_p_t), st_t),
        (lookup, (on_d(jnp.zeros((b, n), jnp.int32)), on_d(jnp.zeros((n,), jnp.int32)),
                  on_d(jnp.zeros((b, n, k), jnp.int32)), on_d(jnp.zeros((b, n, k, dcfg.out_vocab))), z_d, z_d), {}),
        (serve_q, (self.dparams, on_d(jnp.zeros((b, k, dcfg.out_vocab)))), dict(cfg=dcfg)),
        (merge_rows, (z_d > 0, on_d(jnp.zeros((b, k), jnp.int32)), on_d(jnp.zeros((b, k, dcfg.vocab_size))),
                      on_d(jnp.zeros((b, k), jnp.int32)), on_d(jnp.zeros((b, k, dcfg.vocab_size)))), {})):
      run.compile_only(fn, *args, **kw)

    t0 = time.perf_counter()
    logits, tcache = run(prefill, self.tparams, tok_t, len_t, tcache, **st_t)
    _, dcache = run(prefill, self.dparams, tok_d, len_d, dcache, **st_d)
    cur = self.placement.fetch(run(first_tokens, self.tparams, logits, on_t(key), temp_t, top_p_t, cfg=tcfg))
    t_prefill = time.perf_counter() - t0
    book = SpecBook(prompts, cur, opts, k, time.perf_counter())
    hits = np.zeros(b, np.int64)
    hits_by_len = np.zeros((b, k + 1), np.int64)
    rounds_by_len = np.zeros((b, k + 1), np.int64)
    t_idle = t_draft_wait = 0.0
    cache_bytes = 0  # the speculation cache: candidates, tree tokens and their distributions
    if stream is not None:
      stream(0, book.out[0][:])

    backups_used = {"neural": 0, "fast": 0, "ngram": 0}
    ranks = [[] for _ in range(b)]
    tally = new_tally()

    def backup_kind():
      return choose_backup(self.backup, tally, b)

    def run_backup(kind, last2, lens, rnd, hit):
      nonlocal dcache
      t = time.perf_counter()
      if kind == "neural":
        j_tok, j_q, dcache = run(draft_propose, self.dparams, dcache, on_d(last2), on_d(lens), dkey(rnd, 2), temp,
                                 top_p, sag_c, **st_d, k=k, **st_sag)
        j_tok.block_until_ready()
      elif kind == "fast":
        j_tok, j_q = run(random_speculation, dkey(rnd, 3), batch=b, k=k, vocab=dcfg.vocab_size)
      else:
        j_tok = on_d(jnp.asarray([ngram_propose(s, k) for s in book.seqs], jnp.int32))
        j_q = run(point_mass, j_tok, vocab=dcfg.vocab_size)
      if kind == "neural":
        tally["neural_s"] += time.perf_counter() - t
      backups_used[kind] += 1
      return run(merge_rows, hit, c_tok, c_q, j_tok, j_q) if hit is not None else (j_tok, j_q)

    # First round: nothing cached, so the backup drafts.
    last2, lens = book.state()
    kind = backup_kind()
    spec, q = run_backup(kind, last2, lens, 0, None)
    served_kind = kind  # where this round's speculation came from: 'hit' or a backup kind
    rnd = 0
    t_verified = time.perf_counter()
    while not book.done.all():
      rnd += 1
      # Dispatch verify on the target device and the speculation cache on the draft device; neither blocks.
      spec_t, q_t = on_t(spec), on_t(q)
      t_dispatch = time.perf_counter()
      t_idle += t_dispatch - t_verified
      acc, bonus, tcache = run(verify, self.tparams, tcache, on_t(last2[:, 1]), spec_t, q_t, on_t(~book.done),
                               on_t(jax.random.fold_in(verify_root, rnd)), temp_t, top_p_t, **st_t)
      tree_fan = f if served_kind == "hit" else self.fan_out_miss
      cand, branch_j, tree_t, tree_q, glue_g, dcache = run(
          draft_tree, self.dparams, dcache, on_d(last2), spec, on_d(lens), dkey(rnd, 1), temp, top_p, sag_c, **st_d,
          k=k, fan_out=tree_fan, **st_sag)
      acc_np, bonus_np = self.placement.fetch(acc), self.placement.fetch(bonus)  # blocks on verify only
      spec_np = np.asarray(spec)
      t_verified = time.perf_counter()
      tally["verify_s"] += t_verified - t_dispatch
      tally["verify_n"] += 1
      live = ~book.done
      lens_before = lens
      book.commit(acc_np, bonus_np, spec_np, t_verified, stream)
      record_round(tally, served_kind, live, book.seqs, lens_before)
      if book.done.all():
        break
      last2, lens = book.state()
      hit, c_tok, c_q = run(lookup, cand, branch_j, tree_t, tree_q, on_d(jnp.asarray(acc_np)),
                            on_d(jnp.asarray(bonus_np)))
      c_q = run(serve_q, self.dparams, c_q, cfg=dcfg)
      cache_bytes = max(cache_bytes, sum(x.nbytes for x in (cand, tree_t, tree_q)))
      if self.record_ranks:
        rk = np.asarray(bonus_rank(self.dparams, glue_g, spec, on_d(jnp.asarray(acc_np)), on_d(jnp.asarray(bonus_np)),
                                   cfg=dcfg))
        for i in np.flatnonzero(live):
          ranks[i].append((int(acc_np[i]), int(rk[i])))
      hit_np = np.asarray(hit)
      t_draft_wait += time.perf_counter() - t_verified
      for i in np.flatnonzero(live & ~book.done):
        hits[i] += hit_np[i]
        rounds_by_len[i, acc_np[i]] += 1
        hits_by_len[i, acc_np[i]] += hit_np[i]
      if hit_np[~book.done].all():
        spec, q, served_kind = c_tok, c_q, "hit"
      else:  # a backup for every row; rows that hit keep their cached speculation
        served_kind = backup_kind()
        spec, q = run_backup(served_kind, last2, lens, rnd, hit)

    def extra_of(i):
      return {"fan_out": list(f), "fan_out_miss": list(self.fan_out_miss), "backup": self.backup,
              "backups_used": dict(backups_used), **({"bonus_ranks": ranks[i]} if self.record_ranks else {}),
              **hit_stats(hits, hits_by_len, rounds_by_len, i),
              "target_idle_seconds": round(t_idle, 4), "draft_wait_seconds": round(t_draft_wait, 4),
              # dispatch of verify to its result, and the neural backup's time (the timing model's t_backup)
              "verify_seconds": round(tally["verify_s"], 4), "neural_backup_seconds": round(tally["neural_s"], 4),
              "speculation_cache_bytes": int(cache_bytes),
              "compile_seconds": round(run.compile_seconds, 3), "devices": {"target": self.tdevs, "draft": self.ddev.id}}

    return book.results(self.mode, t_prefill, t0 + t_prefill, extra_of)
