"""Autoregressive decoding: the paper's AR baseline (one target forward per token).

The round loop is rounds.py's, with a draft side that serves nothing (speculator.NoDraft): each verify of no drafts
is one AR step, the target's next token drawn as the bonus.
"""
from __future__ import annotations

from typing import Sequence

from ..models.config import ModelConfig
from ..models.kv_cache import cache_dtype
from ..sharding import Placement, make_placement
from . import rounds
from .base import DecodeResult, Programs, StreamFn
from .options import DecodeOptions, check_context
from .speculator import InProcessDraft, NoDraft


class ARDecoder:
  """Greedy or sampled autoregressive decoding of a batch of ragged prompts."""

  mode = "ar"
  k, head, dcfg, feature_layers = 0, None, None, ()  # no drafts, so no draft head or features

  def __init__(self, cfg: ModelConfig, params, attn_impl: str = "auto", placement: Placement | None = None,
               kv_dtype: str | None = None):
    """kv_dtype: the KV cache's dtype (None or 'auto': the params', kv_cache.cache_dtype)."""
    self.placement = placement or make_placement(1, 0)
    self.tcfg, self.attn_impl = cfg, attn_impl
    self.kv_dtype = cache_dtype(params, kv_dtype)
    self.tparams = self.placement.shard_target(params, cfg)
    self.context = cfg.max_seq_len
    self.programs = Programs()
    self.draft = InProcessDraft(NoDraft(cfg.vocab_size, self.placement.to_target))

  @property
  def cfg(self) -> ModelConfig:
    return self.tcfg

  @property
  def params(self):
    return self.tparams

  def check(self, prompt_lens: Sequence[int], max_new_tokens: int) -> None:
    """Raises ValueError naming the first prompt that does not fit the context with max_new_tokens."""
    check_context(self.context, prompt_lens, max_new_tokens)

  def generate(self, prompts: Sequence[Sequence[int]], opts: DecodeOptions, stream: StreamFn | None = None
               ) -> list[DecodeResult]:
    r = rounds.generate(self, self.draft, prompts, opts, stream)
    extra = {"compile_seconds": round(r.timing["compile"], 3)}
    return r.book.results(self.mode, r.t_prefill, r.t_start, lambda i: extra)
