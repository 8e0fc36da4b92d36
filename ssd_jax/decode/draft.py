"""A draft model's calls on its own device(s), with its KV cache: what a kind of draft model implements.

The speculators (speculator.py) decide what to draft and with which keys; this object runs the model: `prefill` the
prompts, `propose` K tokens in one chain (SD's proposal, SSD's neural backup) and `tree` (SSD's glue + fork + tree
over every likely verify outcome). A draft of another kind (e.g. one that reads the target's features) implements
the same calls with its own steps.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..config import ModelConfig
from ..kv_cache import KVCache
from .base import Programs
from .options import DecodeOptions
from .steps import draft_propose, draft_tree, prefill


class SpecTree(NamedTuple):
  """The speculation cache one `tree` call builds (N = sum of the fan-out; V_out: the draft's head vocabulary)."""
  cand: jax.Array       # [B, N] the bonus token each branch guesses
  branch_j: jax.Array   # [N] the acceptance length each branch guesses
  tokens: jax.Array     # [B, N, K] the speculation drafted after each guess
  q: jax.Array          # [B, N, K, V_out] the exact distributions those tokens were drawn from
  glue_g: jax.Array     # [B, K+1, V_out] the draft's distributions after x_L, s_1..s_j (calibration: bonus ranks)


class DraftModel:
  """A standalone draft (a small Llama reading tokens) placed by `put`, compiled through `programs`; `fetch` reads
  one of its results to the host."""

  def __init__(self, cfg: ModelConfig, params, attn_impl: str, put: Callable, programs: Programs,
               fetch: Callable = np.asarray):
    self.cfg, self.attn_impl, self.put, self.run, self.fetch = cfg, attn_impl, put, programs, fetch
    self.params = put(params)
    self.st = dict(cfg=cfg, attn_impl=attn_impl)

  def start(self, tokens, lengths, slots: int, opts: DecodeOptions, k: int, fan_outs=(), saguaro_c: float = 1.0,
            saguaro_top: int = 0) -> None:
    """Sets up a run: an empty cache of `slots`, the sampling settings, and every program the run needs compiled.

    tokens [B, T_pad], lengths [B]: the padded prompts; fan_outs: the tree shapes SSD will draft (none for SD);
    saguaro_top: Saguaro sampling's rescaled set size (0 = plain sampling).
    """
    put, b = self.put, tokens.shape[0]
    self.cache = put(KVCache.init(self.cfg, b, slots, self.params["embed"].dtype))
    self.temp, self.top_p = put(jnp.float32(opts.temperature)), put(jnp.float32(opts.top_p))
    self.sag_c, self.saguaro_top, self.k = put(jnp.float32(saguaro_c)), saguaro_top, k
    self.tokens, self.lengths = put(jnp.asarray(tokens)), put(jnp.asarray(lengths))
    z, z2, zk = (put(jnp.zeros(s, jnp.int32)) for s in ((b,), (b, 2), (b, k)))
    key = put(jax.random.key(0))
    self.run.compile_only(prefill, self.params, self.tokens, self.lengths, self.cache, **self.st)
    self.run.compile_only(draft_propose, self.params, self.cache, z2, z, key, self.temp, self.top_p, self.sag_c,
                          **self.st, k=k, saguaro_top=saguaro_top)
    for f in dict.fromkeys(fan_outs):
      self.run.compile_only(draft_tree, self.params, self.cache, z2, zk, z, key, self.temp, self.top_p, self.sag_c,
                            **self.st, k=k, fan_out=f, saguaro_top=saguaro_top)

  def prefill(self) -> None:
    """Writes the prompts into the cache (dispatched; not waited for)."""
    _, self.cache = self.run(prefill, self.params, self.tokens, self.lengths, self.cache, **self.st)

  def propose(self, last2, lengths, key):
    """Returns (tokens [B, K], q [B, K, V]) drawn one after another after the committed text.

    last2 [B, 2]: the last two committed tokens; lengths [B]: committed lengths L (host arrays).
    """
    tok, q, self.cache = self.run(draft_propose, self.params, self.cache, self.put(last2), self.put(lengths),
                                  self.put(key), self.temp, self.top_p, self.sag_c, **self.st, k=self.k,
                                  saguaro_top=self.saguaro_top)
    return tok, q

  def tree(self, last2, spec, lengths, key, fan_out: tuple) -> SpecTree:
    """Returns the speculation cache for every likely outcome of verifying `spec` [B, K] (dispatched, not waited
    for): glue, fork into fan_out[j] bonus guesses per acceptance length j, K tree steps."""
    *out, self.cache = self.run(draft_tree, self.params, self.cache, self.put(last2), spec, self.put(lengths),
                                self.put(key), self.temp, self.top_p, self.sag_c, **self.st, k=self.k,
                                fan_out=fan_out, saguaro_top=self.saguaro_top)
    return SpecTree(*out)
