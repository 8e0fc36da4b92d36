"""Timing one compiled forward step of a model: the cost figures of the bench and of the draft's evaluation.

A step is `model.forward_causal` over `tokens` new tokens a row for `batch` rows after a `prefix`-token KV cache
(or after each of several prefixes, one compiled program), compiled ahead of the clock. Several models are timed in
interleaved order (a, b, a, b, ...), so drift on a shared machine hits them alike; the figure is the median.
"""
from __future__ import annotations

import dataclasses
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from ..decode import auto_k
from ..models import model
from ..models.config import ModelConfig
from ..models.kv_cache import KVCache
from ..models.config import is_eagle


def compiled_step(cfg: ModelConfig, params, tokens: int = 1, prefix: int = 300, cache_len: int = 512, batch: int = 1,
                  kv_dtype=jnp.float32):
  """Returns run() -> seconds of one forward of `tokens` tokens a row for `batch` rows after `prefix` cached ones
  (warmed up)."""
  return compiled_steps(cfg, params, tokens, (prefix,), cache_len, batch, kv_dtype)[prefix]


def compiled_steps(cfg: ModelConfig, params, tokens: int, prefixes, cache_len: int = 512, batch: int = 1,
                   kv_dtype=jnp.float32) -> dict:
  """Returns {prefix: run} as compiled_step, one compiled program timed after each of `prefixes` cached tokens (the
  attention's cost follows the visible length)."""
  for prefix in prefixes:
    if prefix < 0 or prefix + tokens > cache_len:
      raise ValueError(f"prefix {prefix} + tokens {tokens} must fit the cache of {cache_len}")
  fwd = jax.jit(model.forward_causal, static_argnames=("cfg",), donate_argnames=("cache",))
  toks = jnp.ones((batch, tokens), jnp.int32)
  exe = fwd.lower(params, toks, KVCache.init(cfg, batch, cache_len, kv_dtype), cfg=cfg).compile()

  def runner(prefix):  # a cache of its own: each call donates the one before
    cache = KVCache.init(cfg, batch, cache_len, kv_dtype)
    return _warm_runner(lambda c: exe(params, toks, c), cache.replace(lengths=jnp.full((batch,), prefix, jnp.int32)))

  return {prefix: runner(prefix) for prefix in prefixes}


def _warm_runner(call, cache):
  """Returns run() -> seconds of `call(cache) -> (logits, cache)`, each call given the cache the one before returned
  (an executable that donates its cache spends the old one), after three warm-up calls. The cache keeps its length:
  every call times the same step (the output cache is only written, not grown)."""
  state = {"cache": cache}

  def run() -> float:
    t0 = time.perf_counter()
    logits, state["cache"] = call(state["cache"])
    logits.block_until_ready()
    return time.perf_counter() - t0

  for _ in range(3):
    run()
  return run


def interleaved_ms(steps: dict, repeats: int = 15) -> dict:
  """Returns {name: median ms} for {name: run} callables from compiled_step, timed in interleaved order."""
  times = {name: [] for name in steps}
  for _ in range(repeats):
    for name, run in steps.items():
      times[name].append(run())
  return {name: float(np.median(ts) * 1e3) for name, ts in times.items()}


def macs_per_token(cfg: ModelConfig) -> int:
  """Multiply-accumulates of one token's forward through the weight matrices (attention over the cache excluded)."""
  d, hd = cfg.d_model, cfg.head_dim
  attn = d * hd * (cfg.n_heads * 2 + cfg.n_kv_heads * 2)  # q, o, k, v
  ffn = 3 * d * cfg.ffn_dim
  head = d * (cfg.head_vocab or cfg.vocab_size)
  return cfg.n_layers * (attn + ffn) + head


def compiled_eagle_step(cfg, params, prefix: int = 300, cache_len: int = 512, batch: int = 1):
  """Returns run() -> seconds of one EAGLE draft step (one token a row reading its own last hidden state) for
  `batch` rows after `prefix` cached positions, warmed up: the draft's per-token cost when it drafts
  (ssd_jax/models/eagle.py)."""
  return compiled_eagle_steps(cfg, params, (prefix,), cache_len, batch)[prefix]


def compiled_eagle_steps(cfg, params, prefixes, cache_len: int = 512, batch: int = 1) -> dict:
  """Returns {prefix: run} as compiled_eagle_step, one compiled program timed after each of `prefixes`."""
  from ..models import eagle
  from ..kernels import causal_mask_info

  @jax.jit
  def step(params, cache, tok, h):
    s = cache.lengths[:, None]
    logits, h, cache = eagle.forward(params, tok, h, s, cache, s, causal_mask_info(s), cfg)
    return logits, h, cache

  tok, h = jnp.ones((batch, 1), jnp.int32), jnp.ones((batch, 1, cfg.d_model), jnp.float32)
  exe = step.lower(params, KVCache.init(cfg, batch, cache_len), tok, h).compile()

  def call(cache):
    logits, _, cache = exe(params, cache, tok, h)
    return logits, cache

  def runner(prefix):
    cache = KVCache.init(cfg, batch, cache_len)
    return _warm_runner(call, cache.replace(lengths=jnp.full((batch,), prefix, jnp.int32)))

  return {prefix: runner(prefix) for prefix in prefixes}


# k='auto''s calibration (bench.py --calibrate): what decode/auto_k.py chooses K from, measured here.
def measure(target, draft, batches=auto_k.BATCHES, k_max: int = auto_k.K_MAX, repeats: int = 7,
            prefixes=auto_k.PREFIXES, kv_dtype="float32", log=print) -> auto_k.CostTable:
  """Returns step costs measured here for `target` and `draft` (objects with .cfg and .params; an EAGLE draft is
  timed as its own step): per batch and prefix the AR step, the verify of T = 2..k_max+1 tokens and the draft step
  (the target's KV cache in `kv_dtype`), all of a batch interleaved, medians of `repeats`."""
  ar, verify, drafted = ({p: {} for p in prefixes} for _ in range(3))
  eagle = is_eagle(draft.cfg)
  for b in batches:
    steps = {}
    for t in range(1, k_max + 2):
      for p, run in compiled_steps(target.cfg, target.params, t, prefixes, batch=b, kv_dtype=kv_dtype).items():
        steps[(t, p)] = run
    runs = (compiled_eagle_steps(draft.cfg, draft.params, prefixes, batch=b) if eagle
            else compiled_steps(draft.cfg, draft.params, 1, prefixes, batch=b))
    steps.update({("draft", p): run for p, run in runs.items()})
    ms = interleaved_ms(steps, repeats)
    for p in prefixes:
      ar[p][b], drafted[p][b] = ms[(1, p)], ms[("draft", p)]
      verify[p][b] = {t: ms[(t, p)] for t in range(2, k_max + 2)}
      log(f"[calibrate] batch {b}, prefix {p}: AR {ar[p][b]:.1f} ms, verify " +
          ", ".join(f"T={t} {v:.1f}" for t, v in verify[p][b].items()) + f", draft {drafted[p][b]:.1f} ms")
  return auto_k.CostTable(tuple(auto_k.StepCosts(ar[p], verify[p], drafted[p], prefix=p)
                               for p in prefixes))


def measure_host(costs: auto_k.CostTable, decode, prefix: float, repeats: int = 3, log=print,
                 modes: tuple = ("ar", "sd")) -> auto_k.CostTable:
  """Returns `costs` with host_ms, the decode loop's own time at batch 1, from real decodes beside the compiled
  steps, and modes_tok_s, each mode's tokens a second in those decodes.

  `decode(mode)` runs one greedy batch-1 decode (`modes`: "ar", "sd" at K=1 and, where the draft has hardware of its
  own, "ssd" at K=1) and returns (its decode seconds, new tokens, target forwards with the prefill); `prefix`: the
  cached tokens its steps see on average. An AR token costs the decode's seconds over its tokens after the first,
  less the AR step; an SD round the seconds over its verifies, less a 2-token verify and a draft step (all read at
  `prefix`). Each mode is decoded once to warm up, then `repeats` times, interleaved; medians."""
  ar, verify, draft = costs.at(1, prefix)
  per = {m: [] for m in modes}
  speed = {m: [] for m in modes}
  for i in range(repeats + 1):
    for mode in per:
      seconds, new, forwards = decode(mode)
      steps = new - 1 if mode == "ar" else forwards - 1  # AR's first token comes from the prefill
      if i and steps > 0:
        per[mode].append(seconds * 1e3 / steps)
        speed[mode].append(new / seconds)
  if not per["ar"] or not per["sd"]:
    raise ValueError("the host-time decodes made no steps: give them more new tokens")
  host = {"ar": float(np.median(per["ar"])) - ar, "round": float(np.median(per["sd"])) - verify[2] - draft}
  tok_s = {m: round(float(np.median(v)), 2) for m, v in speed.items() if v}
  log(f"[calibrate] loop time beyond the compiled steps (batch 1, prefix {prefix:g}): AR {host['ar']:.2f} ms a "
      f"token, SD {host['round']:.2f} ms a round; tokens a second: "
      + ", ".join(f"{m.upper()} {v:.1f}" for m, v in tok_s.items()))
  return dataclasses.replace(costs, host_ms=host, modes_tok_s=tok_s)


def measure_cores(decode, repeats: int = 3, log=print) -> dict | None:
  """Returns AR's tokens a second at batch 1 on the first usable core and on all of them ({"1": .., "all": ..}),
  interleaved, medians of `repeats` after a warm-up each; None on fewer than two cores. `decode(mode)` as
  measure_host's. The process is pinned to one core for the one-core runs (every thread: XLA's pool, whose kernels
  then split their work in one part) and given its cores back after each."""
  from ..decode.draft_process import set_process_affinity

  cores = sorted(os.sched_getaffinity(0))
  if len(cores) < 2:
    return None
  speed = {"1": [], "all": []}
  for i in range(repeats + 1):
    for n in speed:
      set_process_affinity(cores[:1] if n == "1" else cores)
      try:
        seconds, new, _ = decode("ar")
      finally:
        set_process_affinity(cores)
      if i:
        speed[n].append(new / seconds)
  out = {n: round(float(np.median(v)), 2) for n, v in speed.items()}
  log(f"[calibrate] AR at batch 1: {out['1']:.1f} tok/s on one core, {out['all']:.1f} on all {len(cores)}")
  return out
