"""Speculative decoding (the SD baseline): the draft proposes K tokens, the target verifies them in one forward.

The round loop is rounds.py's; the draft side is speculator.ChainDraft, colocated on the target's devices as in the
paper's SD baseline: it proposes s_1..s_K with their distributions q once the previous outcome is known, `verify`
accepts k of them and draws a bonus token, and both sides commit the outcome.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..models.config import ModelConfig
from ..kernels.platform import device_platform
from ..models.kv_cache import cache_dtype
from ..sharding import Placement, make_placement
from . import rounds
from .base import DecodeResult, Programs, StreamFn
from .draft import make_draft_model
from .options import DecodeOptions, SpecOptions, check_context, check_pair
from .speculator import ChainDraft, InProcessDraft


class SDDecoder:
  """Speculative decoding with a colocated draft (the paper's SD baseline); reads only spec.k."""

  mode = "sd"
  head = dcfg = None  # the chain draft serves q over the full vocabulary

  def __init__(self, target_cfg: ModelConfig, target_params, draft_cfg: ModelConfig, draft_params,
               spec: SpecOptions, attn_impl: str = "auto", placement: Placement | None = None,
               kv_dtype: str | None = None):
    """kv_dtype: the target KV cache's dtype (None or 'auto': the target params', kv_cache.cache_dtype)."""
    spec = spec.fixed("SDDecoder")
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
    self.draft = InProcessDraft(ChainDraft(model, spec))

  def check(self, prompt_lens: Sequence[int], max_new_tokens: int) -> None:
    """Raises ValueError naming the first prompt that does not fit the context with max_new_tokens and K+1
    speculation slots."""
    check_context(self.context, prompt_lens, max_new_tokens, self.k)

  def generate(self, prompts: Sequence[Sequence[int]], opts: DecodeOptions, stream: StreamFn | None = None
               ) -> list[DecodeResult]:
    r = rounds.generate(self, self.draft, prompts, opts, stream)
    t = r.timing
    # The target is idle while the chain drafts and while it commits an outcome; in chunks of rounds (sd_chunk.py)
    # the chains run inside the calls, and their time is counted in verify_seconds.
    timing = {"draft_seconds": round(t["idle"] - t["commit"], 4), "verify_seconds": round(t["verify"], 4),
              "compile_seconds": round(t["compile"], 3), "draft_lost": t.get("draft_lost")}
    # a draft side that failed mid-run: each row's rounds the target ran alone after it
    alone = t.get("rounds_alone", np.zeros(len(prompts), np.int64))
    return r.book.results(self.mode, r.t_prefill, r.t_start,
                          lambda i: dict(timing, rounds_without_draft=int(alone[i])))
