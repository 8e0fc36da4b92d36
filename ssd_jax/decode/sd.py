"""Speculative decoding (the SD baseline): the draft proposes K tokens, the target verifies them in one forward.

The round (steps.py): the draft side (speculator.ChainDraft, colocated on the target's devices as in the paper's SD
baseline) proposes s_1..s_K with their distributions q; `verify` accepts k of them and draws a bonus token; both
sides commit the outcome and the next round starts from it.
"""
from __future__ import annotations

import time
from typing import Sequence

import jax
import jax.numpy as jnp

from ..config import ModelConfig
from ..kernels.platform import device_platform
from ..kv_cache import cache_dtype
from ..sharding import Placement, make_placement
from .base import DecodeResult, Programs, SpecBook, StreamFn, cache_slots, pad_prompts
from .draft import make_draft_model
from .options import DecodeOptions, SpecOptions, check_context, check_pair
from .speculator import ChainDraft, DraftJob, Outcome
from .steps import DRAFT_STREAM, first_tokens, prefill, sd_round_keys, stream_key, verify


class SDDecoder:
  """Speculative decoding with a colocated draft (the paper's SD baseline); reads only spec.k."""

  mode = "sd"

  def __init__(self, target_cfg: ModelConfig, target_params, draft_cfg: ModelConfig, draft_params,
               spec: SpecOptions = SpecOptions(), attn_impl: str = "auto", placement: Placement | None = None,
               kv_dtype: str | None = None):
    """kv_dtype: the target KV cache's dtype (None or 'auto': the target params', kv_cache.cache_dtype)."""
    check_pair(target_cfg, draft_cfg, spec, tree=False)
    self.kv_dtype = cache_dtype(target_params, kv_dtype)
    self.placement = pl = placement or make_placement(1, 0)
    self.tcfg, self.k, self.attn_impl = target_cfg, spec.k, attn_impl
    self.context = min(target_cfg.max_seq_len, draft_cfg.max_seq_len)
    self.tparams = pl.shard_target(target_params, target_cfg)
    self.programs = Programs()
    # Colocated, as the paper's SD baseline: the draft is replicated on the target's devices.
    self.platform = device_platform(pl.target_mesh)  # picks the kernels of every program (kernels/platform.py)
    model = make_draft_model(draft_cfg, draft_params, attn_impl, pl.to_target, self.programs, pl.fetch, self.platform)
    self.dparams = model.params
    self.feature_layers = model.feature_layers  # the target's features an EAGLE draft reads (none otherwise)
    self.draft = ChainDraft(model, spec)

  def check(self, prompt_lens: Sequence[int], max_new_tokens: int) -> None:
    """Raises ValueError naming the first prompt that does not fit the context with max_new_tokens and K+1
    speculation slots."""
    check_context(self.context, prompt_lens, max_new_tokens, self.k)

  def generate(self, prompts: Sequence[Sequence[int]], opts: DecodeOptions, stream: StreamFn | None = None
               ) -> list[DecodeResult]:
    self.check([len(p) for p in prompts], opts.max_new_tokens)
    cfg, k, run, pl, rep = self.tcfg, self.k, self.programs, self.placement, self.placement.to_target
    tokens, lengths = pad_prompts(prompts)
    b = len(prompts)
    # K+1 lookahead slots: a round may write K+1 entries past the committed text before rolling back.
    cache = pl.target_cache(cfg, b, cache_slots(int(lengths.max()), opts.max_new_tokens, lookahead=k + 2),
                            self.kv_dtype)
    key, temp, top_p = (rep(x) for x in (jax.random.key(opts.seed), jnp.float32(opts.temperature),
                                         jnp.float32(opts.top_p)))
    st = dict(cfg=cfg, attn_impl=self.attn_impl, feature_layers=self.feature_layers, platform=self.platform)
    tokens, lengths = rep(tokens), rep(lengths)
    z = rep(jnp.zeros((b,), jnp.int32))
    self.draft.prepare(DraftJob(prompts, opts))
    for fn, args, kw in ((prefill, (self.tparams, tokens, lengths, cache), st),
                         (first_tokens, (self.tparams, rep(jnp.zeros((b, cfg.out_vocab))), key, temp, top_p),
                          dict(cfg=cfg)),
                         (verify, (self.tparams, cache, z, rep(jnp.zeros((b, k), jnp.int32)),
                                   rep(jnp.zeros((b, k, cfg.vocab_size))), rep(z > 0), key, temp, top_p), st)):
      run.compile_only(fn, *args, **kw)

    t0 = time.perf_counter()
    logits, cache, *feats = run(prefill, self.tparams, tokens, lengths, cache, **st)
    self.draft.prefill(*feats)
    first = pl.fetch(run(first_tokens, self.tparams, logits, key, temp, top_p, cfg=cfg))
    t_prefill = time.perf_counter() - t0
    book = SpecBook(prompts, first, opts, k, time.perf_counter())
    if stream is not None:
      stream(0, book.out[0][:])
    root = stream_key(opts.seed, DRAFT_STREAM)
    t_draft = t_verify = 0.0
    rnd = 0
    ta = time.perf_counter()
    spec = self.draft.first(first)
    while spec is not None:
      rnd += 1
      spec.tokens.block_until_ready()
      tb = time.perf_counter()
      acc, bonus, cache, *feats = run(verify, self.tparams, cache, rep(book.state()[0][:, 1]), spec.tokens, spec.q,
                                      rep(~book.done), rep(sd_round_keys(root, rnd)[1]), temp, top_p, **st)
      acc, bonus, drafts = (pl.fetch(x) for x in (acc, bonus, spec.tokens))
      tc = time.perf_counter()
      t_draft += tb - ta
      t_verify += tc - tb
      book.commit(acc, bonus, drafts, tc, stream)
      ta = time.perf_counter()
      spec = self.draft.outcome(Outcome(acc, bonus, features=feats[0] if feats else None))
    timing = {"draft_seconds": round(t_draft, 4), "verify_seconds": round(t_verify, 4),
              "compile_seconds": round(run.compile_seconds, 3)}
    return book.results(self.mode, t_prefill, t0 + t_prefill, lambda i: timing)
