"""SSD's draft side (`TreeDraft`): the speculation cache drafted while the target verifies, the backups on a miss.

It answers the calls of speculator.DraftSide in this process (speculator.InProcessDraft, the `devices` placement) or
in a draft process of its own (draft_process.py); per round the target reads its `cache` and sends the `outcome`.
"""
from __future__ import annotations

import time

import jax.numpy as jnp
import numpy as np

from .backup import choose_backup, new_tally, ngram_propose, point_mass, random_speculation, record_round
from .base import SpecBook, cache_slots, pad_prompts, run_lookaheads
from .draft import DraftModel
from .options import SpecOptions
from .speculator import HIT, DraftJob, Outcome, SpecCache, Speculation, cached_tokens, find, observe
from .steps import DRAFT_STREAM, bonus_rank, compact_q, fold, merge_rows, pick_branch, serve_q, stream_key


def hit_stats(hits, hits_by_len, rounds_by_len, i: int) -> dict:
  """Returns row i's cache hit rate overall and per acceptance length (None where no round had that length)."""
  return {"cache_hit_rate": round(float(hits[i] / max(rounds_by_len[i].sum(), 1)), 4),
          "hit_rate_by_accept_len": [round(float(h / r), 4) if r else None
                                     for h, r in zip(hits_by_len[i], rounds_by_len[i])]}


class TreeDraft:
  """SSD's draft side: while the target verifies a speculation, it drafts the next one for every likely outcome
  (the speculation cache) and hands that cache to the target's side (`cache`), which looks its outcome up itself and
  dispatches the next verify at once on a hit. The outcome then reaches this side (`outcome`), which finds it in the
  same cache (the same hits as the target's), commits it and drafts the next tree; on a miss it serves the backup
  speculator's speculation instead (rows that hit keep their cached one). Every served token comes with the exact
  distribution it was drawn from, so verification stays exact; at temperature 0 the verify reads tokens only, and no
  distribution crosses."""

  drafts_ahead = True

  def __init__(self, model: DraftModel, spec: SpecOptions, calibration: dict | None = None,
               record_ranks: bool = False, host_cache: bool = False):
    """host_cache: the cache's distributions go to the target as host arrays (a draft process), else they stay on
    the draft's device until the target picks the served rows."""
    self.model, self.spec, self.k = model, spec, spec.k
    self.calibration = calibration    # the draft's fan-out calibration (geometric fan-out)
    self.record_ranks = record_ranks  # calibration: keep (accept_len, bonus rank) of every round
    self.host_cache = host_cache
    self.pending = self.tree = None

  # ------------------------------------------------------------------------------------------------ a run's start

  def prepare(self, job: DraftJob) -> float:
    """Compiles the run's programs and sets up the cache; returns the compile seconds so far."""
    k, cfg, put, run = self.k, self.model.cfg, self.model.put, self.model.run
    self.prompts, self.opts, b = job.prompts, job.opts, len(job.prompts)
    self.pending = self.tree = None
    self.greedy = job.opts.temperature == 0  # the verify reads no q: none is picked, compacted or sent
    self.f, self.f_miss = self.spec.fan_outs(self.calibration, job.opts.temperature)
    # Saguaro sampling's rescaled set: the cached candidates plus the drafted token (which the fork excludes).
    saguaro_top = 0 if self.spec.saguaro_c == 1 else max(max(self.f), max(self.f_miss)) + 1
    tokens, lengths = pad_prompts(job.prompts)
    slots = cache_slots(int(lengths.max()), job.opts.max_new_tokens, lookahead=run_lookaheads(k, self.f)[1])
    self.model.start(tokens, lengths, slots, job.opts, k, (self.f, self.f_miss), self.spec.saguaro_c, saguaro_top)
    self.root = put(stream_key(job.opts.seed, DRAFT_STREAM))  # placed: each round's fold stays there
    v, v_out = cfg.vocab_size, cfg.out_vocab
    zk, zq = put(jnp.zeros((b, k), jnp.int32)), put(jnp.zeros((b, k, v)))
    run.compile_only(random_speculation, put(self.root), batch=b, k=k, vocab=v)
    run.compile_only(point_mass, zk, vocab=v)
    if not self.greedy:
      for f in dict.fromkeys((self.f, self.f_miss)):
        run.compile_only(pick_branch, put(jnp.zeros((b, sum(f), k, v_out))), np.zeros(b, np.int32))
      run.compile_only(serve_q, self.model.params, put(jnp.zeros((b, k, v_out))), cfg=cfg)
      run.compile_only(merge_rows, put(jnp.zeros(b, bool)), zk, zq, zk, zq)
      if cfg.head_vocab is not None:
        run.compile_only(compact_q, zq, self.model.params["head_ids"])
    return run.compile_seconds

  def prefill(self, features=None) -> None:
    self.model.prefill(features)

  def first(self, first) -> Speculation | None:
    """Returns the first speculation (nothing is cached yet: the backup drafts it), None if every row is done."""
    b, k = len(self.prompts), self.k
    self.book = SpecBook(self.prompts, first, self.opts, k, time.perf_counter())
    self.hits, self.hits_by_len, self.rounds_by_len = (np.zeros(b, np.int64), np.zeros((b, k + 1), np.int64),
                                                       np.zeros((b, k + 1), np.int64))
    self.backups_used = {"neural": 0, "fast": 0, "ngram": 0}
    self.tally, self.row_hit = new_tally(), None  # row_hit: rows the last round served from the cache
    self.ranks = [[] for _ in range(b)]
    self.tree_s, self.cache_bytes, self.rnd = 0.0, 0, 0
    # Host time per phase of this side's round (the target waits through them only on a miss).
    self.phase_s = {p: 0.0 for p in ("commit", "tree_wait", "send", "lookup", "backup", "serve")}
    if self.book.done.all():
      return None
    self.served = self.backup_kind = choose_backup(self.spec.backup, self.tally, b)
    tok, q = self._backup(self.served)
    return self._serve(np.asarray(tok), q)

  def _key(self, *idx):
    """Returns the draft's key for (round, use): use 1 = tree, 2 = neural backup, 3 = fast backup."""
    return fold(self.root, *idx)

  # ------------------------------------------------------------------------------------------------- each round

  def draft_ahead(self) -> bool:
    """Dispatches the tree for the speculation just served (the target is verifying it meanwhile), if any; returns
    whether it did."""
    if self.pending is None:
      return False
    tok, self.pending = self.pending, None
    window, lens = self.book.state(self.model.window)
    self.tree_dispatch = time.perf_counter()
    self.tree = self.model.tree(window, tok, lens, self._key(self.rnd + 1, 1),
                                self.f if self.served == "hit" else self.f_miss)
    return True

  def cache(self, _=None) -> SpecCache:
    """Waits for the tree `draft_ahead` dispatched; returns it as the speculation cache the target looks its
    outcome up in (kept here too: `outcome` finds the same hits in it)."""
    t = time.perf_counter()
    tree = self.tree
    cand, branch_j, tokens = (np.asarray(x) for x in (tree.cand, tree.branch_j, tree.tokens))
    t_tree = time.perf_counter()
    self.tree_s += t_tree - self.tree_dispatch
    self.phase_s["tree_wait"] += t_tree - t
    q = None if self.greedy else (np.asarray(tree.q) if self.host_cache else tree.q)
    self.sent = SpecCache(cand, branch_j, tokens, q)
    self.cache_bytes = max(self.cache_bytes, int(cand.nbytes + tokens.nbytes + tree.q.nbytes))
    self.phase_s["send"] += time.perf_counter() - t_tree
    return self.sent

  def outcome(self, o: Outcome) -> Speculation | str | None:
    """Commits the outcome; returns HIT when every live row found it in the cache (the target, which found the
    same, is already verifying the cached speculation), else the speculation to verify next (backups for the rows
    that missed); None when every row is done."""
    t_recv = time.perf_counter()
    self.rnd += 1
    self.tally["verify_s"] += o.verify_seconds
    self.tally["verify_n"] += 1
    live = ~self.book.done
    lens_before = observe(self.model, self.book, o)
    self.book.commit(o.accept_len, o.bonus, self.served_host, t_recv)
    if o.ended is not None:  # rows the target's book ended from outside after this outcome: the same live rows
      self.book.end(o.ended, t_recv)
    record_round(self.tally, self.backup_kind, live, self.book.seqs, lens_before, self.row_hit)
    t_in = time.perf_counter()
    self.phase_s["commit"] += t_in - t_recv
    if self.book.done.all():
      return None
    acc, bonus = np.asarray(o.accept_len, np.int32), np.asarray(o.bonus, np.int32)
    hit, branch = find(self.sent, acc, bonus)
    if self.record_ranks:
      self._record_ranks(self.tree, acc, bonus, live)
    for i in np.flatnonzero(live & ~self.book.done):
      self.hits[i] += hit[i]
      self.rounds_by_len[i, acc[i]] += 1
      self.hits_by_len[i, acc[i]] += hit[i]
    self.row_hit = hit
    cached = cached_tokens(self.sent, branch)
    self.phase_s["lookup"] += time.perf_counter() - t_in
    if hit[~self.book.done].all():
      self.served = "hit"
      self._serve(cached, None)
      return HIT
    # A backup for every row; rows that hit keep their cached speculation. A miss stalls the live rows only.
    self.served = self.backup_kind = choose_backup(self.spec.backup, self.tally, int((~self.book.done).sum()))
    tok, q = self._backup(self.served)
    if not self.greedy:  # the rows that hit keep their cached law, widened to the full vocabulary as the backup's
      m = self.model
      c_q = m.run(serve_q, m.params, m.run(pick_branch, self.tree.q, branch), cfg=m.cfg)
      q = m.run(merge_rows, m.put(hit), m.put(cached), c_q, m.put(tok), q)[1]
    return self._serve(np.where(hit[:, None], cached, np.asarray(tok)), q)

  def _backup(self, kind: str):
    """Returns (tokens [B, K], q [B, K, V]) from the backup speculator `kind` for this round's outcome."""
    t = time.perf_counter()
    m, run, k, v = self.model, self.model.run, self.k, self.model.cfg.vocab_size
    if kind == "neural":
      tok, q = m.propose(*self.book.state(m.window), self._key(self.rnd, 2))
      tok.block_until_ready()
      self.tally["neural_s"] += time.perf_counter() - t
      self.tally["neural_calls"] += 1
    elif kind == "fast":
      tok, q = run(random_speculation, m.put(self._key(self.rnd, 3)), batch=len(self.prompts), k=k, vocab=v)
    else:
      tok = np.asarray([ngram_propose(s, k) for s in self.book.seqs], np.int32)
      q = None if self.greedy else run(point_mass, m.put(tok), vocab=v)
    self.backups_used[kind] += 1
    self.phase_s["backup"] += time.perf_counter() - t
    return tok, q

  def _serve(self, tok: np.ndarray, q) -> Speculation:
    """Returns the speculation to serve (tokens [B, K] on the host; q None at temperature 0, else [B, K, V] or, when
    all its mass lies there, [B, K, V_out] over the draft's head vocabulary), and keeps its tokens for the tree
    `draft_ahead` dispatches next. A fast backup's q (uniform, or a point mass on an n-gram token) may put mass
    outside the head vocabulary: a round that served one sends q over the full vocabulary."""
    t = time.perf_counter()
    self.served_host = tok
    self.pending = self.model.put(tok)
    full = self.served in ("fast", "ngram") or self.model.cfg.head_vocab is None
    if q is not None and not full:
      q = self.model.run(compact_q, q, self.model.params["head_ids"])
    self.phase_s["serve"] += time.perf_counter() - t
    return Speculation(tok, None if self.greedy else q)

  def _record_ranks(self, tree, acc, bonus, live) -> None:
    m = self.model
    rk = np.asarray(bonus_rank(m.params, tree.glue_g, m.put(self.served_host), m.put(acc), m.put(bonus), cfg=m.cfg))
    for i in np.flatnonzero(live):
      self.ranks[i].append((int(acc[i]), int(rk[i])))

  def stats(self, _=None) -> dict:
    """Returns the draft side's statistics of the run (hits, backups, times, the fan-out it used)."""
    return {"hits": self.hits, "hits_by_len": self.hits_by_len, "rounds_by_len": self.rounds_by_len,
            "backups_used": dict(self.backups_used), "neural_s": self.tally["neural_s"], "tree_s": self.tree_s,
            "cache_bytes": self.cache_bytes, "phase_s": dict(self.phase_s), "ranks": self.ranks,
            "fan_out": self.f, "fan_out_miss": self.f_miss, "compile_seconds": self.model.run.compile_seconds}
