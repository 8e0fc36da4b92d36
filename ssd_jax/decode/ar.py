"""Autoregressive decoding: the paper's AR baseline (one target forward per token)."""
from __future__ import annotations

import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ..config import ModelConfig
from ..kernels.platform import device_platform
from ..kv_cache import cache_dtype
from ..metrics import RequestStats
from ..sharding import Placement, make_placement
from .base import DecodeResult, Programs, StreamFn, cache_slots, pad_prompts
from .options import DecodeOptions, check_context
from .steps import ar_step, first_tokens, prefill


class ARDecoder:
  """Greedy or sampled autoregressive decoding of a batch of ragged prompts."""

  mode = "ar"

  def __init__(self, cfg: ModelConfig, params, attn_impl: str = "auto", placement: Placement | None = None,
               kv_dtype: str | None = None):
    """kv_dtype: the KV cache's dtype (None or 'auto': the params', kv_cache.cache_dtype)."""
    self.placement = placement or make_placement(1, 0)
    self.cfg, self.attn_impl = cfg, attn_impl
    self.kv_dtype = cache_dtype(params, kv_dtype)
    self.params = self.placement.shard_target(params, cfg)
    self.context = cfg.max_seq_len
    self.programs = Programs()

  def check(self, prompt_lens: Sequence[int], max_new_tokens: int) -> None:
    """Raises ValueError naming the first prompt that does not fit the context with max_new_tokens."""
    check_context(self.context, prompt_lens, max_new_tokens)

  def generate(self, prompts: Sequence[Sequence[int]], opts: DecodeOptions, stream: StreamFn | None = None
               ) -> list[DecodeResult]:
    cfg, params = self.cfg, self.params
    self.check([len(p) for p in prompts], opts.max_new_tokens)
    tokens, lengths = pad_prompts(prompts)
    b = len(prompts)
    slots = cache_slots(int(lengths.max()), opts.max_new_tokens)
    cache = self.placement.target_cache(cfg, b, slots, self.kv_dtype)
    rep = self.placement.to_target  # small inputs: every device (of every process)
    key = rep(jax.random.key(opts.seed))
    temp, top_p = rep(jnp.float32(opts.temperature)), rep(jnp.float32(opts.top_p))
    run = self.programs
    st = dict(cfg=cfg, attn_impl=self.attn_impl, platform=device_platform(self.placement.target_mesh))
    tokens, lengths = rep(jnp.asarray(tokens)), rep(jnp.asarray(lengths))
    zeros = rep(jnp.zeros((b,), jnp.int32))
    # Compile everything the loop needs before the clock starts.
    for fn, args, kw in ((prefill, (params, tokens, lengths, cache), st),
                         (first_tokens, (params, rep(jnp.zeros((b, cfg.out_vocab))), key, temp, top_p), dict(cfg=cfg)),
                         (ar_step, (params, cache, zeros, rep(zeros > 0), key, rep(jnp.int32(0)), temp, top_p), st)):
      run.compile_only(fn, *args, **kw)
    stops = opts.stop_ids

    t0 = time.perf_counter()
    logits, cache = run(prefill, params, tokens, lengths, cache, **st)
    cur = run(first_tokens, params, logits, key, temp, top_p, cfg=cfg)
    cur_np = self.placement.fetch(cur)
    t_prefill = time.perf_counter() - t0

    out = [[int(cur_np[i])] for i in range(b)]
    done = np.array([int(cur_np[i]) in stops or opts.max_new_tokens <= 1 for i in range(b)])
    forwards = np.ones(b, np.int64)
    finish = np.full(b, time.perf_counter())
    if stream is not None:
      stream(0, out[0][:])
    step = 1
    while not done.all():
      cur, cache = run(ar_step, params, cache, cur, rep(jnp.asarray(done)), key, rep(jnp.int32(step)), temp, top_p,
                       **st)
      cur_np = self.placement.fetch(cur)
      now = time.perf_counter()
      for i in np.flatnonzero(~done):
        out[i].append(int(cur_np[i]))
        forwards[i] += 1
        if int(cur_np[i]) in stops or len(out[i]) >= opts.max_new_tokens:
          done[i] = True
          finish[i] = now
        if i == 0 and stream is not None:
          stream(0, [int(cur_np[0])])
      step += 1
    t_start = t0 + t_prefill
    return [DecodeResult(out[i], RequestStats(mode=self.mode, new_tokens=len(out[i]), target_forwards=int(forwards[i]),
                                              prefill_seconds=t_prefill, decode_seconds=float(finish[i] - t_start),
                                              extra={"compile_seconds": round(run.compile_seconds, 3)}))
            for i in range(b)]
