"""Speculative speculative decoding (SSD): the target's round, written once for both placements of the draft side.

While the target verifies speculation s_1..s_K on its mesh, the draft side (speculator.TreeDraft) pre-drafts the next
speculation for every likely verify outcome (steps.draft_tree: glue, fork, tree). When verification returns
(k, t*), a hit serves the cached speculation at once; a miss falls back to the backup speculator (by default the
draft, just in time, exactly as in SD). Either way the verifier's ratio test sees the exact distribution each served
token was sampled from, so the output is the target's distribution.

Where the draft side runs is the only difference between the placements (SpecOptions.placement): 'devices' calls the
TreeDraft directly, on its own JAX device of this process; 'processes' sends the same calls to a TreeDraft in a child
process on its own CPU cores (draft_process.py).
"""
from __future__ import annotations

import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ..config import ModelConfig
from ..kernels.platform import device_platform
from ..kv_cache import cache_dtype
from ..sharding import Placement, make_placement
from .base import DecodeResult, Programs, SpecBook, StreamFn, cache_slots, pad_prompts
from .draft import make_draft_model
from .draft_process import DraftProcess
from .options import DecodeOptions, SpecOptions, check_context, check_pair
from .speculator import DraftJob, InProcessDraft, Outcome, TreeDraft, hit_stats
from .steps import VERIFY_STREAM, first_tokens, fold, prefill, serve_q, stream_key, verify


class SSDDecoder:
  """SSD with the draft side on its own device ('devices') or in its own process ('processes')."""

  mode = "ssd"

  def __init__(self, target_cfg: ModelConfig, target_params, draft_cfg: ModelConfig, draft_params,
               spec: SpecOptions = SpecOptions(), attn_impl: str = "auto", placement: Placement | None = None,
               calibration: dict | None = None, record_ranks: bool = False, target_cores=None, draft_cores=None,
               kv_dtype: str | None = None):
    """calibration: the draft's fan-out calibration (geometric fan-out); record_ranks: keep every round's bonus rank
    (scripts/calibrate_fan_out.py); target_cores, draft_cores: the 'processes' placement's split of the CPU cores
    (default: halves); kv_dtype: the target KV cache's dtype (None or 'auto': the target params',
    kv_cache.cache_dtype; the draft's cache is draft.CACHE_DTYPE)."""
    check_pair(target_cfg, draft_cfg, spec)
    self.kv_dtype = cache_dtype(target_params, kv_dtype)
    self.spec, self.tcfg, self.dcfg, self.attn_impl = spec, target_cfg, draft_cfg, attn_impl
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
                                target_cores, draft_cores)

  def close(self):
    """Stops the draft process, if the draft side runs in one."""
    self.draft.close()

  def check(self, prompt_lens: Sequence[int], max_new_tokens: int) -> None:
    """Raises ValueError naming the first prompt that does not fit the context with max_new_tokens and K+1
    speculation slots."""
    check_context(self.context, prompt_lens, max_new_tokens, self.spec.k)

  def generate(self, prompts: Sequence[Sequence[int]], opts: DecodeOptions, stream: StreamFn | None = None
               ) -> list[DecodeResult]:
    self.check([len(p) for p in prompts], opts.max_new_tokens)
    tokens, lengths = pad_prompts(prompts)
    with self.draft.session():
      # The draft compiles its programs and sets up its cache while the target compiles its own.
      self.draft.send("prepare", DraftJob([list(map(int, p)) for p in prompts], opts))
      run = _TargetRun(self, tokens, lengths, opts)
      self.draft.receive()
      t0 = time.perf_counter()
      if self.feature_layers:  # the draft's prefill reads the target's
        first, feats = run.prefill()
        self.draft.send("prefill", self._for_draft(feats))
      else:  # both prefill at once
        self.draft.send("prefill")
        first, _ = run.prefill()
      self.draft.receive()
      t_prefill = time.perf_counter() - t0
      book = SpecBook(prompts, first, opts, self.spec.k, time.perf_counter())
      if stream is not None:
        stream(0, book.out[0][:])
      timing = self._rounds(run, book, first, stream)
      self.draft.send("stats")
      s = self.draft.receive()
    return book.results(self.mode, t_prefill, t0 + t_prefill, lambda i: self._extra(s, timing, i))

  def _rounds(self, run: "_TargetRun", book: SpecBook, first, stream) -> dict:
    """Runs SSD rounds until every row is done; returns the target's timings and traffic."""
    t = dict.fromkeys(("idle", "wait", "verify", "commit"), 0.0)
    bytes_in = bytes_out = rnd = 0
    self.draft.send("first", first)
    t_verified = time.perf_counter()
    nxt = run.stage(book, 1)
    spec = self.draft.receive()
    while spec is not None:
      rnd += 1
      bytes_in += spec.tokens.nbytes + spec.q.nbytes
      tokens, q = run.to_target(spec)
      t_dispatch = time.perf_counter()
      t["idle"] += t_dispatch - t_verified
      acc, bonus, feats = run.verify(tokens, q, *nxt)
      self.draft.draft_ahead()  # after the verify's dispatch: the target starts first
      acc, bonus = run.fetch(acc), run.fetch(bonus)
      feats = self._for_draft(feats)
      t_verified = time.perf_counter()
      t["verify"] += t_verified - t_dispatch
      # The outcome leaves first: the target's own bookkeeping and the next round's small inputs are prepared
      # while the draft looks the outcome up, instead of before it can start.
      self.draft.send("outcome", Outcome(acc, bonus, t_verified - t_dispatch, feats))
      bytes_out += acc.nbytes + bonus.nbytes + (feats.nbytes if feats is not None else 0)
      t_sent = time.perf_counter()
      book.commit(acc, bonus, np.asarray(spec.tokens), t_verified, stream)
      nxt = run.stage(book, rnd + 1)
      t["commit"] += time.perf_counter() - t_sent
      spec = self.draft.receive()
      t["wait"] += time.perf_counter() - t_verified
    return dict(t, rounds=rnd, bytes_in=bytes_in, bytes_out=bytes_out, compile=run.programs.compile_seconds)

  def _for_draft(self, feats):
    """Returns target features in the form the draft side takes them: host arrays for a draft process, else as
    they are (the draft model moves them to its device)."""
    if feats is None or not self.draft.remote:
      return feats
    return np.asarray(self.placement.fetch(feats))

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
            "draft_reply_seconds": {p: round(v, 4) for p, v in s["phase_s"].items()},
            "compile_seconds": round(compile_s, 3),
            "bytes_per_round": {"target_to_draft": round(t["bytes_out"] / rounds),
                                "draft_to_target": round(t["bytes_in"] / rounds)},
            **self._where()}

  def _where(self) -> dict:
    if self.spec.placement == "devices":
      return {"placement": {"kind": "devices"}, "devices": {"target": self.tdevs, "draft": self.ddev.id}}
    return {"placement": {"kind": "processes", "target_cores": self.draft.target_cores,
                          "draft_cores": self.draft.draft_cores}}


class _TargetRun:
  """The target's side of one SSD run: its cache, sampling settings and compiled programs on the target mesh."""

  def __init__(self, dec: SSDDecoder, tokens, lengths, opts: DecodeOptions):
    pl, cfg, k, b = dec.placement, dec.tcfg, dec.spec.k, tokens.shape[0]
    self.dec, self.programs, self.fetch, self.rep = dec, dec.programs, pl.fetch, pl.to_target
    rep, self.st = pl.to_target, dict(cfg=cfg, attn_impl=dec.attn_impl, feature_layers=dec.feature_layers,
                                      platform=device_platform(pl.target_mesh))
    # K+1 lookahead slots: a verify writes K+1 entries past the committed text before rolling back.
    slots = cache_slots(int(lengths.max()), opts.max_new_tokens, lookahead=k + 2)
    self.cache = pl.target_cache(cfg, b, slots, dec.kv_dtype)
    self.key, self.temp, self.top_p = (rep(x) for x in (jax.random.key(opts.seed), jnp.float32(opts.temperature),
                                                         jnp.float32(opts.top_p)))
    self.tokens, self.lengths = rep(tokens), rep(lengths)
    self.verify_root = stream_key(opts.seed, VERIFY_STREAM)
    z = rep(jnp.zeros((b,), jnp.int32))
    run, p = self.programs, dec.tparams
    run.compile_only(prefill, p, self.tokens, self.lengths, self.cache, **self.st)
    run.compile_only(first_tokens, p, rep(jnp.zeros((b, cfg.out_vocab))), self.key, self.temp, self.top_p, cfg=cfg)
    run.compile_only(verify, p, self.cache, z, rep(jnp.zeros((b, k), jnp.int32)),
                     rep(jnp.zeros((b, k, cfg.vocab_size))), rep(z > 0), self.key, self.temp, self.top_p, **self.st)
    if dec.head is not None:
      run.compile_only(serve_q, dec.head, rep(jnp.zeros((b, k, dec.dcfg.out_vocab))), cfg=dec.dcfg)

  def prefill(self):
    """Returns (the first token of every row [B], the prompts' target features or None) after writing the prompts
    into the target cache."""
    run, p, cfg = self.programs, self.dec.tparams, self.dec.tcfg
    logits, self.cache, *feats = run(prefill, p, self.tokens, self.lengths, self.cache, **self.st)
    return self.fetch(run(first_tokens, p, logits, self.key, self.temp, self.top_p, cfg=cfg)), (feats or [None])[0]

  def stage(self, book: SpecBook, rnd: int):
    """Returns round rnd's small verify inputs (previous bonus, active rows, key), known once the book is committed."""
    return self.rep(book.state()[0][:, 1]), self.rep(~book.done), self.rep(fold(self.verify_root, rnd))

  def to_target(self, spec):
    """Returns a served speculation's (tokens [B, K], q [B, K, V]) on the target's devices."""
    tokens, q = self.rep(spec.tokens), self.rep(spec.q)
    if q.shape[-1] != self.dec.tcfg.vocab_size:
      q = self.programs(serve_q, self.dec.head, q, cfg=self.dec.dcfg)
    return tokens, q

  def verify(self, tokens, q, bonus_prev, active, key):
    """Dispatches the verify of `tokens`; returns (accept_len [B], bonus [B], the verified positions' target
    features [B, K+1, n_feat * d] or None) as target arrays."""
    acc, bonus, self.cache, *feats = self.programs(verify, self.dec.tparams, self.cache, bonus_prev, tokens, q,
                                                   active, key, self.temp, self.top_p, **self.st)
    return acc, bonus, (feats or [None])[0]
