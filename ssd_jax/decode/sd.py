"""Speculative decoding (the SD baseline): the draft proposes K tokens, the target verifies them in one forward.

Per row the committed text is x_1..x_L; its last token x_L (the previous round's bonus) is in neither cache yet:
the target cache holds L-1 tokens. A round:
  draft:  feed [x_{L-1}, x_L] at slots L-2, L-1 (re-writing x_{L-1} is harmless and covers the case where the previous
          round accepted all K drafts, whose last one the draft never fed), then K-1 single steps: s_1..s_K and the
          exact processed distributions q_1..q_K they were drawn from;
  target: feed [x_L, s_1..s_K] at slots L-1..L-1+K, giving p_1..p_{K+1};
  accept: sampling.rejection_sample -> k accepted drafts and a bonus token; commit x_L, s_1..s_k: the target length
          becomes L+k (a length update: rejected entries stay in the cache, invisible, and are overwritten later).
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
from ..kernels import causal_mask_info
from ..kv_cache import KVCache
from ..sharding import Placement, make_placement
from .ar import first_tokens
from .base import DecodeOptions, DecodeResult, Programs, SpecBook, StreamFn, cache_slots, pad_prompts, prefill


def check_pair(target_cfg: ModelConfig, draft_cfg: ModelConfig, k: int) -> None:
  """Raises ValueError for a draft that cannot speculate for this target or a bad K."""
  if draft_cfg.vocab_size != target_cfg.vocab_size:
    raise ValueError(f"draft vocabulary ({draft_cfg.vocab_size}) differs from the target's ({target_cfg.vocab_size})")
  if not isinstance(k, (int, np.integer)) or k < 1:
    raise ValueError(f"K (draft tokens per round) must be an integer >= 1, got {k!r}")


@functools.partial(jax.jit, static_argnames=("cfg", "k", "attn_impl", "saguaro_top"), donate_argnames=("cache",))
def draft_propose(params, cache: KVCache, last2, lengths, key, temperature, top_p, saguaro_c, cfg: ModelConfig,
                  k: int, attn_impl: str = "auto", saguaro_top: int = 0):
  """Returns (draft tokens [B, K], their processed distributions over the full vocabulary [B, K, V], cache).

  last2: [B, 2] the last two committed tokens; lengths: [B] committed length L (the bonus included). Static: cfg, k,
  saguaro_top (SSD's Saguaro sampling: the top tokens down-weighted by saguaro_c; 0 = plain sampling).
  """
  b = last2.shape[0]
  slots = lengths[:, None] - 2 + jnp.arange(2)[None, :]
  slots = jnp.maximum(slots, 0)
  logits, cache = model.forward(params, last2, slots, cache, slots, causal_mask_info(slots), cfg,
                                logit_index=jnp.ones((b, 1), jnp.int32), attn_impl=attn_impl)
  keys = jax.random.split(key, k)

  def draw(logits_row, kk):
    probs = sampling.processed_probs(logits_row, temperature, top_p)  # over the draft's head vocabulary
    probs = sampling.saguaro_rescale(probs, saguaro_c, saguaro_top)
    tok = jax.vmap(sampling.sample)(jax.random.split(kk, b), probs)
    return model.to_token_ids(params, tok, cfg), model.scatter_to_vocab(params, probs, cfg)

  tok, q = draw(logits[:, 0], keys[0])

  def body(i, carry):
    cache, toks, qs = carry
    pos = lengths + i - 1  # slot of draft token i-1 (0-based): x_L sits at L-1
    s = (pos)[:, None]
    lg, cache = model.forward(params, toks[:, i - 1][:, None], s, cache, s, causal_mask_info(s), cfg,
                              attn_impl=attn_impl)
    t, qq = draw(lg[:, 0], keys[i])
    return cache, toks.at[:, i].set(t), qs.at[:, i].set(qq)

  toks = jnp.zeros((b, k), jnp.int32).at[:, 0].set(tok)
  qs = jnp.zeros((b, k, q.shape[-1]), jnp.float32).at[:, 0].set(q)
  cache, toks, qs = jax.lax.fori_loop(1, k, body, (cache, toks, qs))
  return toks, qs, cache


@functools.partial(jax.jit, static_argnames=("cfg", "attn_impl"), donate_argnames=("cache",))
def verify(params, cache: KVCache, bonus_prev, drafts, q, active, key, temperature, top_p, cfg: ModelConfig,
           attn_impl: str = "auto"):
  """Returns (accept_len [B], bonus [B], cache) for one verification of [x_L, s_1..s_K] per row.

  cache.lengths is L-1 on entry; on exit it is L+k for active rows (unchanged for inactive ones). Static: cfg and
  shapes; temperature and top_p are dynamic.
  """
  tokens = jnp.concatenate([bonus_prev[:, None], drafts], axis=1)
  logits, cache = model.forward_causal(params, tokens, cache, cfg, attn_impl=attn_impl)
  p = sampling.processed_probs(logits, temperature, top_p)
  accept_len, bonus = sampling.rejection_sample(key, p, q, drafts)
  accept_len = jnp.where(active, accept_len, 0)
  new_len = cache.lengths + jnp.where(active, 1 + accept_len, 0)
  return accept_len, bonus, cache.replace(lengths=new_len.astype(jnp.int32))


class SDDecoder:
  """Speculative decoding with a colocated draft (the paper's SD baseline)."""

  mode = "sd"

  def __init__(self, target_cfg: ModelConfig, target_params, draft_cfg: ModelConfig, draft_params, k: int = 1,
               attn_impl: str = "auto", placement: Placement | None = None):
    check_pair(target_cfg, draft_cfg, k)
    self.placement = placement or make_placement(1, 0)
    self.tcfg, self.dcfg, self.k = target_cfg, draft_cfg, k
    self.tparams = self.placement.shard_target(target_params, target_cfg)
    # Colocated, as the paper's SD baseline: the draft is replicated on the target's devices.
    self.dparams = self.placement.to_target(draft_params)
    self.attn_impl = attn_impl
    self.programs = Programs()

  def generate(self, prompts: Sequence[Sequence[int]], opts: DecodeOptions, stream: StreamFn | None = None
               ) -> list[DecodeResult]:
    opts.validate()
    tcfg, dcfg, k, run = self.tcfg, self.dcfg, self.k, self.programs
    tokens, lengths = pad_prompts(prompts)
    b = len(prompts)
    max_prompt = int(lengths.max())
    if max_prompt + opts.max_new_tokens + k + 1 > tcfg.max_seq_len:
      raise ValueError(f"K={k} needs {k + 1} cache slots past the text, but prompt ({max_prompt}) + max_new_tokens "
                       f"({opts.max_new_tokens}) leave only {tcfg.max_seq_len - max_prompt - opts.max_new_tokens} "
                       f"of the {tcfg.max_seq_len}-token context; lower K or max_new_tokens")
    # K+1 lookahead slots: a round may write K+1 entries past the committed text before rolling back.
    slots = cache_slots(tcfg, max_prompt, opts.max_new_tokens, lookahead=k + 2)
    rep = self.placement.to_target  # small inputs: every device (of every process)
    tcache = self.placement.target_cache(tcfg, b, slots, self.tparams["embed"].dtype)
    dcache = rep(KVCache.init(dcfg, b, slots, self.dparams["embed"].dtype))
    key = rep(jax.random.key(opts.seed))
    temp, top_p = rep(jnp.float32(opts.temperature)), rep(jnp.float32(opts.top_p))
    one = rep(jnp.float32(1.0))  # Saguaro C: plain sampling in SD
    st_t = dict(cfg=tcfg, attn_impl=self.attn_impl)
    st_d = dict(cfg=dcfg, attn_impl=self.attn_impl)
    tokens_j, lengths_j = rep(tokens), rep(lengths)
    zeros = rep(jnp.zeros((b,), jnp.int32))
    for fn, args, kw in ((prefill, (self.tparams, tokens_j, lengths_j, tcache), st_t),
                         (prefill, (self.dparams, tokens_j, lengths_j, dcache), st_d),
                         (first_tokens, (self.tparams, rep(jnp.zeros((b, tcfg.out_vocab))), key, temp, top_p),
                          dict(cfg=tcfg)),
                         (draft_propose, (self.dparams, dcache, rep(jnp.zeros((b, 2), jnp.int32)), zeros, key,
                                          temp, top_p, one), dict(st_d, k=k)),
                         (verify, (self.tparams, tcache, zeros, rep(jnp.zeros((b, k), jnp.int32)),
                                   rep(jnp.zeros((b, k, tcfg.vocab_size))), rep(zeros > 0), key, temp, top_p), st_t)):
      run.compile_only(fn, *args, **kw)

    t0 = time.perf_counter()
    logits, tcache = run(prefill, self.tparams, tokens_j, lengths_j, tcache, **st_t)
    _, dcache = run(prefill, self.dparams, tokens_j, lengths_j, dcache, **st_d)
    cur = self.placement.fetch(run(first_tokens, self.tparams, logits, key, temp, top_p, cfg=tcfg))
    t_prefill = time.perf_counter() - t0
    book = SpecBook(prompts, cur, opts, k, time.perf_counter())
    stream_root = jax.random.fold_in(key, 0x5EED)
    t_draft = t_verify = 0.0
    if stream is not None:
      stream(0, book.out[0][:])
    rnd = 0
    while not book.done.all():
      rnd += 1
      # Draft proposals and verifier uniforms come from separate streams (and never from the prefill's key).
      kd, kv = (rep(x) for x in jax.random.split(jax.random.fold_in(stream_root, rnd)))
      last2, lens = book.state()
      ta = time.perf_counter()
      drafts, q, dcache = run(draft_propose, self.dparams, dcache, rep(last2), rep(lens), kd, temp,
                              top_p, one, **st_d, k=k)
      drafts.block_until_ready()
      tb = time.perf_counter()
      acc, bonus, tcache = run(verify, self.tparams, tcache, rep(last2[:, 1]), drafts, q,
                               rep(~book.done), kv, temp, top_p, **st_t)
      acc, bonus, drafts_np = (self.placement.fetch(x) for x in (acc, bonus, drafts))
      tc = time.perf_counter()
      t_draft += tb - ta
      t_verify += tc - tb
      book.commit(acc, bonus, drafts_np, tc, stream)
    timing = {"draft_seconds": round(t_draft, 4), "verify_seconds": round(t_verify, 4),
              "compile_seconds": round(run.compile_seconds, 3)}
    return book.results(self.mode, t_prefill, t0 + t_prefill, lambda i: timing)
