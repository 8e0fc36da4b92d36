"""A draft model's calls on its own device(s), with its KV cache: what a kind of draft model implements.

The speculators (speculator.py) decide what to draft and with which keys; these objects run the model: `prefill` the
prompts, `observe` the target features a verify returns (drafts that read them), `propose` K tokens in one chain
(SSD's neural backup), `chain` the same from a committed tail kept on the device (SD's proposal) and `tree` (SSD's
glue + fork + tree over every likely verify outcome). Two kinds: `DraftModel`, a standalone small Llama that reads
tokens, and `EagleDraftModel`, an EAGLE draft that reads the target's features (ssd_jax/models/eagle.py).
`make_draft_model` picks the kind from the config. Both run the same chain and tree (steps.draft_propose,
chain_after, draft_tree), which take the kind's forward from the config (steps.DraftKind).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..models.config import ModelConfig
from ..kernels.platform import kernel_platform
from ..models.kv_cache import KVCache
from .base import Programs
from .eagle_steps import eagle_observe, eagle_prefill, init_hist
from .options import DecodeOptions
from .steps import chain_after, draft_propose, draft_tree, prefill
from ..models.config import is_eagle


# The draft's KV cache is float32 whatever its weights' dtype; the plan (ssd_jax/plan) sizes it from this constant,
# so a change here changes the plan too.
CACHE_DTYPE = jnp.float32


class SpecTree(NamedTuple):
  """The speculation cache one `tree` call builds (N = sum of the fan-out; V_out: the draft's head vocabulary)."""
  cand: jax.Array       # [B, N] the bonus token each branch guesses
  branch_j: jax.Array   # [N] the acceptance length each branch guesses
  tokens: jax.Array     # [B, N, K] the speculation drafted after each guess
  q: jax.Array          # [B, N, K, V_out] the exact distributions those tokens were drawn from
  glue_g: jax.Array     # [B, K+1, V_out] the draft's distributions after x_L, s_1..s_j (calibration: bonus ranks)


def reads_features(cfg) -> bool:
  """Whether a draft of this config reads the target's features (an EAGLE draft)."""
  return is_eagle(cfg)


def make_draft_model(cfg, params, attn_impl: str, put: Callable, programs: Programs, fetch: Callable = np.asarray,
                     platform: str | None = None):
  """Returns the draft model object for `cfg`'s kind (params of an EAGLE draft with the target's parts attached);
  platform: that of the device(s) `put` places it on, which picks its kernels (None: the default backend)."""
  kind = EagleDraftModel if reads_features(cfg) else DraftModel
  return kind(cfg, params, attn_impl, put, programs, fetch, platform)


class DraftModel:
  """A standalone draft (a small Llama reading tokens) placed by `put`, compiled through `programs`; `fetch` reads
  one of its results to the host."""

  feature_layers = ()  # it reads no target features

  def __init__(self, cfg: ModelConfig, params, attn_impl: str, put: Callable, programs: Programs,
               fetch: Callable = np.asarray, platform: str | None = None):
    self.cfg, self.attn_impl, self.put, self.run, self.fetch = cfg, attn_impl, put, programs, fetch
    self.params = put(params)
    self.platform = kernel_platform(platform)
    self.st = dict(cfg=cfg, attn_impl=attn_impl, platform=self.platform)
    self.window = 2  # committed tokens each proposal reads: x_{L-1}, x_L
    self.hist = None  # the context its chain and tree read besides the cache (steps.DraftKind): none

  def start(self, tokens, lengths, slots: int, opts: DecodeOptions, k: int, fan_outs=(), saguaro_c: float = 1.0,
            saguaro_top: int = 0, chain: bool = False) -> None:
    """Sets up a run: an empty cache of `slots`, the sampling settings, and every program the run needs compiled.

    tokens [B, T_pad], lengths [B]: the padded prompts; fan_outs: the tree shapes SSD will draft (none for SD);
    saguaro_top: Saguaro sampling's rescaled set size (0 = plain sampling); chain: SD's chain (`chain`) is compiled
    instead of the plain proposal (`propose`: SSD's neural backup).
    """
    put, b = self.put, tokens.shape[0]
    self._settings(opts, k, saguaro_c, saguaro_top)
    self.cache = put(KVCache.init(self.cfg, b, slots, CACHE_DTYPE))
    self.tokens, self.lengths = put(jnp.asarray(tokens)), put(jnp.asarray(lengths))
    self.run.compile_only(prefill, self.params, self.tokens, self.lengths, self.cache, **self.st)
    self._compile_drafting(b, fan_outs, chain)

  @property
  def sampling(self) -> tuple:
    """The run's (temperature, top_p, saguaro_c), placed on the draft's device."""
    return self._sampling

  def _settings(self, opts: DecodeOptions, k: int, saguaro_c: float, saguaro_top: int) -> None:
    put = self.put
    self._sampling = (put(jnp.float32(opts.temperature)), put(jnp.float32(opts.top_p)), put(jnp.float32(saguaro_c)))
    self.saguaro_top, self.k = saguaro_top, k

  def _compile_drafting(self, b: int, fan_outs, chain: bool = False) -> None:
    """Compiles the chain (steps.chain_after for SD, else draft_propose) and every tree shape (draft_tree): one code
    for every kind."""
    put = self.put
    z, zw, zk = (put(jnp.zeros(s, jnp.int32)) for s in ((b,), (b, self.window), (b, self.k)))
    key = put(jax.random.key(0))
    self.tail = None
    if chain:
      self._no_outcome = (zk, z, z, put(jnp.zeros((b,), bool)))  # drafts, accept_len, bonus, active: none verified
      self.run.compile_only(chain_after, self.params, self.cache, self.hist, zw, z, *self._no_outcome, key,
                            *self._sampling, **self.st, k=self.k, saguaro_top=self.saguaro_top)
    else:
      self.run.compile_only(draft_propose, self.params, self.cache, self.hist, zw, z, key, *self._sampling,
                            **self.st, k=self.k, saguaro_top=self.saguaro_top)
    for f in dict.fromkeys(fan_outs):
      self.run.compile_only(draft_tree, self.params, self.cache, self.hist, zw, zk, z, key, *self._sampling,
                            **self.st, k=self.k, fan_out=f, saguaro_top=self.saguaro_top)

  def prefill(self, features=None) -> None:
    """Writes the prompts into the cache (dispatched; not waited for)."""
    _, self.cache = self.run(prefill, self.params, self.tokens, self.lengths, self.cache, **self.st)

  def observe(self, features, start) -> None:
    """Takes the target features of a verify's positions (nothing to do for a draft that reads tokens only)."""

  def propose(self, window, lengths, key):
    """Returns (tokens [B, K], q [B, K, V]) drawn one after another after the committed text.

    window [B, self.window]: the last committed tokens; lengths [B]: committed lengths L (host arrays).
    """
    tok, q, self.cache = self.run(draft_propose, self.params, self.cache, self.hist, self.put(window),
                                  self.put(lengths), self.put(key), *self._sampling, **self.st, k=self.k,
                                  saguaro_top=self.saguaro_top)
    return tok, q

  def chain(self, key, outcome=None, tail=None):
    """Returns (tokens [B, K], q [B, K, V]) as `propose` does, for SD: its committed tail (the last tokens and L)
    stays on the device between calls, advanced there by the verify's outcome (drafts [B, K], accept_len, bonus,
    active [B]: arrays on any device), so nothing goes through the host; `tail` (window, lengths as host arrays)
    sets it afresh (the first proposal), as if no row had been verified."""
    if tail is not None:
      self.tail, outcome = tuple(self.put(tail)), self._no_outcome
    tok, q, self.cache, *self.tail = self.run(chain_after, self.params, self.cache, self.hist, *self.tail,
                                              *self.put(tuple(outcome)), key, *self._sampling, stable=2, **self.st,
                                              k=self.k, saguaro_top=self.saguaro_top)
    return tok, q

  def tree(self, window, spec, lengths, key, fan_out: tuple) -> SpecTree:
    """Returns the speculation cache for every likely outcome of verifying `spec` [B, K] (dispatched, not waited
    for): glue, fork into fan_out[j] bonus guesses per acceptance length j, K tree steps."""
    *out, self.cache = self.run(draft_tree, self.params, self.cache, self.hist, self.put(window), spec,
                                self.put(lengths), self.put(key), *self._sampling, **self.st, k=self.k,
                                fan_out=fan_out, saguaro_top=self.saguaro_top)
    return SpecTree(*out)


class EagleDraftModel(DraftModel):
  """An EAGLE draft (ssd_jax/models/eagle.py): reads the target's features of every verified position. Besides its KV
  cache it keeps their fused form by position (eagle_steps: `hist`); a proposal first re-reads the last K+1 committed
  positions from target features, so what it wrote from its own features there is replaced."""

  def __init__(self, cfg, params, attn_impl: str, put: Callable, programs: Programs, fetch: Callable = np.asarray,
               platform: str | None = None):
    super().__init__(cfg, params, attn_impl, put, programs, fetch, platform)
    self.feature_layers = cfg.feature_layers

  def start(self, tokens, lengths, slots: int, opts: DecodeOptions, k: int, fan_outs=(), saguaro_c: float = 1.0,
            saguaro_top: int = 0, chain: bool = False) -> None:
    put, b = self.put, tokens.shape[0]
    self._settings(opts, k, saguaro_c, saguaro_top)
    self.window = k + 1
    self.cache = put(KVCache.init(self.cfg, b, slots, CACHE_DTYPE))
    self.hist = put(init_hist(self.cfg, b, slots))
    self.tokens = put(jnp.asarray(tokens))
    f = self.cfg.feature_dim
    self.run.compile_only(eagle_prefill, self.params, self.tokens, put(jnp.zeros(tokens.shape + (f,))), self.cache,
                          self.hist, **self.st)
    self.run.compile_only(eagle_observe, self.params, self.hist, put(jnp.zeros((b, k + 1, f))),
                          put(jnp.zeros((b,), jnp.int32)), platform=self.platform)
    self._compile_drafting(b, fan_outs, chain)

  def prefill(self, features=None) -> None:
    """Writes the prompts and their target features [B, T_pad, n_feat * d] (the target's prefill) into the caches."""
    if features is None:
      raise ValueError("an EAGLE draft's prefill needs the target's prompt features")
    self.cache, self.hist = self.run(eagle_prefill, self.params, self.tokens, self.put(features), self.cache,
                                     self.hist, **self.st)

  def observe(self, features, start) -> None:
    """Takes a verify's target features [B, K+1, n_feat * d] of positions start..start+K ([B], host)."""
    self.hist = self.run(eagle_observe, self.params, self.hist, self.put(features), self.put(start),
                         platform=self.platform)
