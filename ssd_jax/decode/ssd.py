"""Speculative speculative decoding (SSD): rounds.py's loop with a draft side that drafts ahead (tree_draft.TreeDraft).

While the target verifies speculation s_1..s_K on its mesh, the draft side (tree_draft.TreeDraft) pre-drafts the next
speculation for every likely verify outcome (steps.draft_tree: glue, fork, tree). When verification returns
(k, t*), a hit serves the cached speculation at once; a miss falls back to the backup speculator (by default the
draft, just in time, exactly as in SD). Either way the verifier's ratio test sees the exact distribution each served
token was sampled from, so the output is the target's distribution.

Where the draft side runs is the only difference between the placements (SpecOptions.placement): 'devices' calls the
TreeDraft directly, on its own JAX device of this process; 'processes' sends the same calls to a TreeDraft in a child
process on its own CPU cores (draft_process.py).
"""
from __future__ import annotations

from typing import Sequence

import jax
import numpy as np

from ..models.config import ModelConfig
from ..kernels.platform import device_platform
from ..models.kv_cache import cache_dtype
from ..sharding import Placement, make_placement
from . import rounds
from .base import DecodeResult, Programs, StreamFn
from .draft import make_draft_model
from .draft_process import DraftProcess
from .options import DecodeOptions, SpecOptions, check_context, check_pair
from .speculator import InProcessDraft
from .tree_draft import TreeDraft, hit_stats


class SSDDecoder:
  """SSD with the draft side on its own device ('devices') or in its own process ('processes')."""

  mode = "ssd"

  def __init__(self, target_cfg: ModelConfig, target_params, draft_cfg: ModelConfig, draft_params,
               spec: SpecOptions, attn_impl: str = "auto", placement: Placement | None = None,
               calibration: dict | None = None, record_ranks: bool = False, target_cores=None, draft_cores=None,
               kv_dtype: str | None = None):
    """calibration: the draft's fan-out calibration (geometric fan-out); record_ranks: keep every round's bonus rank
    (scripts/calibrate_fan_out.py); target_cores, draft_cores: the 'processes' placement's split of the CPU cores
    (default: halves); kv_dtype: the target KV cache's dtype (None or 'auto': the target params',
    kv_cache.cache_dtype; the draft's cache is draft.CACHE_DTYPE)."""
    spec = spec.fixed("SSDDecoder")
    check_pair(target_cfg, draft_cfg, spec)
    self.kv_dtype = cache_dtype(target_params, kv_dtype)
    self.spec, self.tcfg, self.dcfg, self.attn_impl, self.k = spec, target_cfg, draft_cfg, attn_impl, spec.k
    self.record_ranks = record_ranks
    # Default: the target on the first device, the draft on the next one (when the platform has two).
    self.placement = placement or make_placement(1, 1)
    self.tdevs = sorted(d.id for d in self.placement.target_mesh.devices.flat)
    self.tparams = self.placement.shard_target(target_params, target_cfg)
    # All the target needs of the draft to expand a q served over the draft's head vocabulary (steps.serve_q).
    self.head = (None if draft_cfg.head_vocab is None
                 else self.placement.to_target({"head_ids": np.asarray(draft_params["head_ids"])}))
    self.context = min(target_cfg.max_seq_len, draft_cfg.max_seq_len)
    self.programs = Programs()
    # The target's features an EAGLE draft reads (none for a draft that reads tokens only): they go with the outcome.
    self.feature_layers = tuple(getattr(draft_cfg, "feature_layers", ()))
    if spec.placement == "devices":
      self.ddev = self.placement.draft_device
      model = make_draft_model(draft_cfg, draft_params, attn_impl, lambda x: jax.device_put(x, self.ddev),
                               self.programs, platform=device_platform(self.ddev))
      self.dparams = model.params
      self.draft = InProcessDraft(TreeDraft(model, spec, calibration, record_ranks))
    else:
      self.ddev = self.dparams = None  # in the child process
      self.draft = DraftProcess(dict(cfg=draft_cfg, params=jax.device_get(draft_params), spec=spec,
                                     attn_impl=attn_impl, calibration=calibration, record_ranks=record_ranks),
                                target_cores, draft_cores, timeout=spec.draft_timeout)

  def close(self):
    """Stops the draft process, if the draft side runs in one."""
    self.draft.close()

  def check(self, prompt_lens: Sequence[int], max_new_tokens: int) -> None:
    """Raises ValueError naming the first prompt that does not fit the context with max_new_tokens and K+1
    speculation slots."""
    check_context(self.context, prompt_lens, max_new_tokens, self.spec.k)

  def generate(self, prompts: Sequence[Sequence[int]], opts: DecodeOptions, stream: StreamFn | None = None
               ) -> list[DecodeResult]:
    r = rounds.generate(self, self.draft, prompts, opts, stream)
    s = r.draft_stats or self._no_stats(len(prompts))  # None: the draft side was lost mid-run
    return r.book.results(self.mode, r.t_prefill, r.t_start, lambda i: self._extra(s, r.timing, i))

  def _no_stats(self, b: int) -> dict:
    """The draft side's statistics when it was lost (what it counted went with it): none."""
    k1 = self.k + 1
    return {"hits": np.zeros(b), "hits_by_len": np.zeros((b, k1)), "rounds_by_len": np.zeros((b, k1)),
            "backups_used": {}, "neural_s": 0.0, "tree_s": 0.0, "cache_bytes": 0, "phase_s": {},
            "ranks": [[] for _ in range(b)], "fan_out": self.spec.fan_out, "fan_out_miss": self.spec.fan_out_miss,
            "compile_seconds": 0.0}

  def _extra(self, s: dict, t: dict, i: int) -> dict:
    """Returns row i's SSD statistics from the draft side's (s) and the target's (t)."""
    rounds = max(t["rounds"], 1)
    compile_s = t["compile"] + (s["compile_seconds"] if self.draft.remote else 0.0)
    return {"fan_out": list(s["fan_out"]), "fan_out_miss": list(s["fan_out_miss"]),
            "fan_out_strategy": self.spec.fan_out_strategy, "backup": self.spec.backup,
            "backups_used": dict(s["backups_used"]), **({"bonus_ranks": s["ranks"][i]} if self.record_ranks else {}),
            **hit_stats(s["hits"], s["hits_by_len"], s["rounds_by_len"], i),
            "target_idle_seconds": round(t["idle"], 4), "draft_wait_seconds": round(t["wait"], 4),
            # dispatch of verify to its result, and the neural backup's time (the timing model's t_backup)
            "verify_seconds": round(t["verify"], 4), "neural_backup_seconds": round(s["neural_s"], 4),
            "draft_tree_seconds": round(s["tree_s"], 4), "speculation_cache_bytes": int(s["cache_bytes"]),
            "target_commit_seconds": round(t["commit"], 4),
            # the target's idle time by part (rounds.ROUND_PARTS), and the draft side's own time by phase
            "round_parts_seconds": {p: round(v, 5) for p, v in t["parts"].items()},
            "loop_rounds": t["rounds"], "hit_rounds": t["hit_rounds"],
            "verify_call_seconds": round(t["dispatch_call"], 4),  # the dispatch calls' part of verify_seconds
            "target_program_calls": t["calls"],  # a verify a round, or many rounds a program (ssd_loop.py)
            # a draft side lost mid-run (its process exited, was killed or went silent): the rounds after it
            "rounds_without_draft": int(t["rounds_alone"][i]) if "rounds_alone" in t else 0,
            "draft_lost": t.get("draft_lost"),
            "draft_phase_seconds": {p: round(v, 4) for p, v in s["phase_s"].items()},
            "compile_seconds": round(compile_s, 3),
            "bytes_per_round": {"target_to_draft": round(t["bytes_out"] / rounds),
                                "draft_to_target": round(t["bytes_in"] / rounds)},
            **self._where()}

  def _where(self) -> dict:
    if self.spec.placement == "devices":
      return {"placement": {"kind": "devices"}, "devices": {"target": self.tdevs, "draft": self.ddev.id}}
    return {"placement": {"kind": "processes", "target_cores": self.draft.target_cores,
                          "draft_cores": self.draft.draft_cores}}
