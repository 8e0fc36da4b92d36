"""Timing one compiled forward step of a model: the cost figures of the bench and of the draft's evaluation.

A step is `model.forward_causal` over `tokens` new tokens a row for `batch` rows after a `prefix`-token KV cache
(or after each of several prefixes, one compiled program), compiled ahead of the clock. Several models are timed in
interleaved order (a, b, a, b, ...), so drift on a shared machine hits them alike; the figure is the median.
"""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from ..models import model
from ..models.config import ModelConfig
from ..models.kv_cache import KVCache


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
