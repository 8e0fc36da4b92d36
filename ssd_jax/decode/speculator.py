"""The draft side behind one interface: SSD's tree draft, SD's chain draft and AR's none.

The target loop talks to a draft side in messages: `prepare` (a run's prompts and options; compile), `prefill`,
`first` (the first tokens; returns the first Speculation), then per round `outcome` (an Outcome; returns the next
Speculation, or None once every row is done) and finally `stats`. SSD's draft side also drafts ahead (`draft_ahead`:
the tree for the speculation it just served) while the target verifies. Each side keeps its own copy of the committed
text (a SpecBook fed the same outcomes as the target's), its own keys and its own KV cache, so the same calls work
on an object in this process (`InProcessDraft`) and in a child process (draft_process.DraftProcess); a seed draws
the same samples either way.
"""
from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any, Protocol

import jax.numpy as jnp
import numpy as np

from .backup import choose_backup, new_tally, ngram_propose, point_mass, random_speculation, record_round
from .base import SpecBook, cache_slots, chunk_lookahead, pad_prompts
from .draft import DraftModel
from .options import DecodeOptions, SpecOptions
from .steps import (DRAFT_STREAM, bonus_rank, compact_q, fold, merge_rows, pick_branch, serve_q, stream_key,
                    tree_lookahead)


@dataclasses.dataclass
class DraftJob:
  """What a draft side needs to know of a run before it starts."""
  prompts: list           # B lists of token ids
  opts: DecodeOptions


@dataclasses.dataclass
class Outcome:
  """What the target sends the draft after a verify."""
  accept_len: np.ndarray  # [B] int32: drafts accepted per row (0 for rows already done)
  bonus: np.ndarray       # [B] int32: the token the target drew after them
  verify_seconds: float = 0.0  # dispatch of the verify to its result (the automatic backup choice weighs it)
  features: Any = None    # [B, K+1, n_feat * d]: the target's features of the verified positions, for a draft that
  #                         reads them (EAGLE); positions L-1..L-1+K of the text before this outcome
  on_target: Any = None   # (accept_len, bonus, active [B]) as the verify's own arrays, for a draft side in this
  #                         process (SD's chain reads them on the device); None from a draft process
  made: Any = None        # [B, n-1]: the tokens before the bonus when the target made them itself (AR's chunk of n
  #                         steps, rounds.TargetSide); None: they are the speculation served


@dataclasses.dataclass
class Speculation:
  """What the draft serves for one verify."""
  tokens: Any   # [B, K] int32
  q: Any        # [B, K, V] the exact distributions the tokens were drawn from, or [B, K, V_out] over the draft's head
  #               vocabulary when all their mass lies there (steps.serve_q expands it on the target's side)

  def to_host(self) -> "Speculation":
    return Speculation(np.asarray(self.tokens), None if self.q is None else np.asarray(self.q))


HIT = "hit"  # a TreeDraft's reply to an outcome every live row found in its speculation cache


@dataclasses.dataclass
class SpecCache:
  """The speculation cache a TreeDraft built while the target verified, as it crosses to the target's side
  (N = sum of the fan-out; V_out: the draft's head vocabulary): the target looks its verify's outcome up itself."""
  cand: np.ndarray      # [B, N] the bonus token each branch guesses
  branch_j: np.ndarray  # [N] the acceptance length each branch guesses
  tokens: np.ndarray    # [B, N, K] the speculation drafted after each guess
  q: Any = None         # [B, N, K, V_out] their exact distributions (a host array from a draft process, the draft
  #                       device's array in this process); None at temperature 0, where the verify reads tokens only

  @property
  def nbytes(self) -> int:
    return sum(int(x.nbytes) for x in (self.cand, self.branch_j, self.tokens, self.q) if x is not None)


def find(cache: SpecCache, accept_len, bonus):
  """Returns (hit [B] bool, branch [B]: the branch of each row's outcome, 0 where it missed) for verify outcomes
  (accept_len, bonus) [B] in `cache`: what steps.lookup does on the device, here on the host in microseconds."""
  match = (cache.branch_j[None, :] == np.asarray(accept_len)[:, None]) & (cache.cand == np.asarray(bonus)[:, None])
  return match.any(-1), match.argmax(-1)


def cached_tokens(cache: SpecCache, branch) -> np.ndarray:
  """Returns [B, K]: each row's speculation at its branch (find)."""
  return cache.tokens[np.arange(len(branch)), branch]


class DraftSide(Protocol):
  """The calls a draft side answers, in the order a run makes them (ChainDraft, TreeDraft)."""

  def prepare(self, job: DraftJob) -> float:
    """Compiles the run's programs and sets up its cache; returns its compile seconds so far."""

  def prefill(self, features=None) -> None:
    """Writes the prompts (and, for a draft that reads them, the target's prompt features) into its cache."""

  def first(self, first: np.ndarray) -> Speculation | None:
    """Takes the first token of every row [B]; returns the first speculation (None: every row is done)."""

  def outcome(self, o: Outcome) -> Speculation | None:
    """Commits a verify's outcome; returns the next speculation (None: every row is done)."""

  def draft_ahead(self) -> None:
    """Starts drafting for the speculation just served while the target verifies it (SSD; nothing for SD)."""

  def stats(self, _=None) -> dict:
    """Returns the draft side's statistics of the run."""

  drafts_ahead: bool  # whether it drafts while the target verifies (SSD), or only once the outcome is known


class InProcessDraft:
  """Calls a draft side in this process: `send` runs the call at once, `receive` returns its reply."""

  remote = False

  def __init__(self, side: DraftSide):
    self.side, self._reply = side, None
    self.sync = not side.drafts_ahead  # the target waits for each speculation to be drafted (SD, AR)

  def session(self):
    return contextlib.nullcontext()

  def send(self, call: str, arg=None) -> None:
    self._reply = getattr(self.side, call)(arg)

  def receive(self):
    reply, self._reply = self._reply, None
    return reply

  def draft_ahead(self) -> None:
    """Lets the draft start on the next round now that the target has dispatched its verify."""
    self.side.draft_ahead()

  def cache(self) -> "SpecCache":
    """Returns the speculation cache the draft side built while the target verified (it waits for the tree)."""
    return self.side.cache()

  def close(self) -> None:
    pass


def observe(model: DraftModel, book: SpecBook, o: Outcome) -> np.ndarray:
  """Hands the verify's target features (if any) to the draft model before the outcome is committed; returns the
  committed lengths L before it (the verify read positions L-1..L-1+K)."""
  lens = book.state(1)[1]
  if o.features is not None:
    model.observe(o.features, lens - 1)
  return lens


class NoDraft:
  """AR's draft side: it serves empty speculations, and a verify of no drafts is one AR step (the bonus token is the
  target's next token, drawn from its own law)."""

  drafts_ahead = False

  def __init__(self, vocab: int, put):
    self.vocab, self.put = vocab, put

  def prepare(self, job: DraftJob) -> float:
    self.prompts, self.opts = job.prompts, job.opts
    b = len(job.prompts)
    self.empty = Speculation(self.put(jnp.zeros((b, 0), jnp.int32)), self.put(jnp.zeros((b, 0, self.vocab))))
    return 0.0

  def prefill(self, features=None) -> None:
    pass

  def first(self, first) -> Speculation | None:
    self.book = SpecBook(self.prompts, first, self.opts, 0, time.perf_counter())
    return None if self.book.done.all() else self.empty

  def outcome(self, o: Outcome) -> Speculation | None:
    made = np.zeros((len(self.prompts), 0), np.int32) if o.made is None else o.made  # a chunk's steps (ar_chunk)
    self.book.commit(o.accept_len, o.bonus, made, time.perf_counter())
    return None if self.book.done.all() else self.empty

  def draft_ahead(self) -> None:
    pass

  def stats(self, _=None) -> dict:
    return {}


class ChainDraft:
  """SD's draft side: after each outcome, K tokens drafted one after another from the committed text."""

  drafts_ahead = False

  def __init__(self, model: DraftModel, spec: SpecOptions):
    self.model, self.k = model, spec.k

  def prepare(self, job: DraftJob) -> float:
    """Compiles the run's programs and sets up the cache; returns the compile seconds so far."""
    self.prompts, self.opts = job.prompts, job.opts
    tokens, lengths = pad_prompts(job.prompts)
    # K+1 lookahead slots: a round writes up to K+1 entries past the committed text; more for chunks of rounds.
    ahead = self.k + 2 if job.opts.sd_chunk == 1 else chunk_lookahead(self.k, job.opts.sd_chunk)
    slots = cache_slots(int(lengths.max()), job.opts.max_new_tokens, lookahead=ahead)
    self.model.start(tokens, lengths, slots, job.opts, self.k, chain=True)
    self.root = self.model.put(stream_key(job.opts.seed, DRAFT_STREAM))  # placed: each round's fold stays there
    return self.model.run.compile_seconds

  def prefill(self, features=None) -> None:
    self.model.prefill(features)

  def first(self, first) -> Speculation | None:
    self.book, self.rnd = SpecBook(self.prompts, first, self.opts, self.k, time.perf_counter()), 0
    if self.book.done.all():
      return None
    return self._propose(tail=self.book.state(self.model.window))

  def outcome(self, o: Outcome) -> Speculation | None:
    """Commits the outcome and returns the next speculation. With the verify's own arrays (o.on_target) the next
    chain is dispatched first, from them on the device, and the host's commit runs while it drafts; a row that the
    commit finds done gets a speculation that is never verified, and once all are, the last chain is dropped."""
    served, live = self.served, ~self.book.done
    if o.on_target is None:
      observe(self.model, self.book, o)
      self.book.commit(o.accept_len, o.bonus, self.model.fetch(served), time.perf_counter())
      # The same chain, its outcome placed from the host (the tail as committed: only a done row's differs).
      return None if self.book.done.all() else self._propose((served, o.accept_len, o.bonus, live))
    if o.features is not None:
      self.model.observe(o.features, self.model.tail[1] - 1)
    spec = self._propose((served,) + tuple(o.on_target))
    self.book.commit(o.accept_len, o.bonus, self.model.fetch(served), time.perf_counter())
    return None if self.book.done.all() else spec

  def _propose(self, outcome=None, tail=None) -> Speculation:
    self.rnd += 1
    tok, q = self.model.chain(fold(self.root, self.rnd), outcome, tail)
    self.served = tok
    return Speculation(tok, q)

  def draft_ahead(self) -> None:
    pass  # SD drafts once the outcome is known

  def stats(self, _=None) -> dict:
    return {}


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
    slots = cache_slots(int(lengths.max()), job.opts.max_new_tokens, lookahead=tree_lookahead(k, self.f))
    self.model.start(tokens, lengths, slots, job.opts, k, (self.f, self.f_miss), self.spec.saguaro_c, saguaro_top)
    self.root = put(stream_key(job.opts.seed, DRAFT_STREAM))  # placed: each round's fold stays there
    n, v, v_out = sum(self.f), cfg.vocab_size, cfg.out_vocab
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
      q = m.run(merge_rows, m.put(hit), m.put(cached), c_q, m.put(np.asarray(tok)), q)[1]
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
