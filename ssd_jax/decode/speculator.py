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
from .steps import DRAFT_STREAM, bonus_rank, compact_q, fold, lookup, merge_rows, serve_q, stream_key, tree_lookahead


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
    return Speculation(np.asarray(self.tokens), np.asarray(self.q))


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
  (the speculation cache); an outcome found there is served at once (a hit), otherwise the backup speculator drafts
  (a miss). Every served token comes with the exact distribution it was drawn from, so verification stays exact."""

  drafts_ahead = True

  def __init__(self, model: DraftModel, spec: SpecOptions, calibration: dict | None = None,
               record_ranks: bool = False):
    self.model, self.spec, self.k = model, spec, spec.k
    self.calibration = calibration    # the draft's fan-out calibration (geometric fan-out)
    self.record_ranks = record_ranks  # calibration: keep (accept_len, bonus rank) of every round
    self.pending = None

  # ------------------------------------------------------------------------------------------------ a run's start

  def prepare(self, job: DraftJob) -> float:
    """Compiles the run's programs and sets up the cache; returns the compile seconds so far."""
    k, cfg, put, run = self.k, self.model.cfg, self.model.put, self.model.run
    self.prompts, self.opts, b = job.prompts, job.opts, len(job.prompts)
    self.pending = None
    self.f, self.f_miss = self.spec.fan_outs(self.calibration, job.opts.temperature)
    # Saguaro sampling's rescaled set: the cached candidates plus the drafted token (which the fork excludes).
    saguaro_top = 0 if self.spec.saguaro_c == 1 else max(max(self.f), max(self.f_miss)) + 1
    tokens, lengths = pad_prompts(job.prompts)
    slots = cache_slots(int(lengths.max()), job.opts.max_new_tokens, lookahead=tree_lookahead(k, self.f))
    self.model.start(tokens, lengths, slots, job.opts, k, (self.f, self.f_miss), self.spec.saguaro_c, saguaro_top)
    self.root = put(stream_key(job.opts.seed, DRAFT_STREAM))  # placed: each round's fold stays there
    n, v, v_out = sum(self.f), cfg.vocab_size, cfg.out_vocab
    z = np.zeros(b, np.int32)
    zk, zq = put(jnp.zeros((b, k), jnp.int32)), put(jnp.zeros((b, k, v)))
    run.compile_only(random_speculation, put(self.root), batch=b, k=k, vocab=v)
    run.compile_only(point_mass, zk, vocab=v)
    run.compile_only(lookup, put(jnp.zeros((b, n), jnp.int32)), put(jnp.zeros((n,), jnp.int32)),
                     put(jnp.zeros((b, n, k), jnp.int32)), put(jnp.zeros((b, n, k, v_out))), z, z)
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
    # Host time per phase of the reply to an outcome (what the target waits through), summed over rounds.
    self.phase_s = {p: 0.0 for p in ("commit", "tree_wait", "lookup", "backup", "serve")}
    if self.book.done.all():
      return None
    self.served = self.backup_kind = choose_backup(self.spec.backup, self.tally, b)
    tok, q = self._backup(self.served)
    return self._serve(tok, q)

  def _key(self, *idx):
    """Returns the draft's key for (round, use): use 1 = tree, 2 = neural backup, 3 = fast backup."""
    return fold(self.root, *idx)

  # ------------------------------------------------------------------------------------------------- each round

  def draft_ahead(self) -> None:
    """Dispatches the tree for the speculation just served (the target is verifying it meanwhile), if any."""
    if self.pending is None:
      return
    tok, self.pending = self.pending, None
    window, lens = self.book.state(self.model.window)
    self.tree_dispatch = time.perf_counter()
    self.tree = self.model.tree(window, tok, lens, self._key(self.rnd + 1, 1),
                                self.f if self.served == "hit" else self.f_miss)

  def outcome(self, o: Outcome) -> Speculation | None:
    """Returns the speculation for the next round: the cached one on a hit, else the backup's; None when done."""
    t_recv = time.perf_counter()
    self.rnd += 1
    self.tally["verify_s"] += o.verify_seconds
    self.tally["verify_n"] += 1
    live = ~self.book.done
    lens_before = observe(self.model, self.book, o)
    self.book.commit(o.accept_len, o.bonus, self.model.fetch(self.served_tokens), t_recv)
    record_round(self.tally, self.backup_kind, live, self.book.seqs, lens_before, self.row_hit)
    t_in = time.perf_counter()
    tree = self.tree
    tree.tokens.block_until_ready()
    t_tree = time.perf_counter()
    self.phase_s["commit"] += t_in - t_recv
    self.phase_s["tree_wait"] += t_tree - t_in
    self.tree_s += t_tree - self.tree_dispatch
    self.cache_bytes = max(self.cache_bytes, sum(x.nbytes for x in (tree.cand, tree.tokens, tree.q)))
    if self.book.done.all():
      return None
    # The outcome goes in as host arrays: the compiled call copies them in, one dispatch instead of three.
    acc, bonus = np.asarray(o.accept_len, np.int32), np.asarray(o.bonus, np.int32)
    hit, c_tok, c_q = self.model.run(lookup, tree.cand, tree.branch_j, tree.tokens, tree.q, acc, bonus)
    if self.record_ranks:
      self._record_ranks(tree, acc, bonus, live)
    hit_np = np.asarray(hit)
    self.phase_s["lookup"] += time.perf_counter() - t_tree
    for i in np.flatnonzero(live & ~self.book.done):
      self.hits[i] += hit_np[i]
      self.rounds_by_len[i, acc[i]] += 1
      self.hits_by_len[i, acc[i]] += hit_np[i]
    self.row_hit = hit_np.astype(bool)
    if hit_np[~self.book.done].all():  # the cache holds q over the head vocabulary: it is served as it is
      self.served = "hit"
      return self._serve(c_tok, c_q, compact=True)
    # A backup for every row; rows that hit keep their cached speculation. A miss stalls the live rows only.
    self.served = self.backup_kind = choose_backup(self.spec.backup, self.tally, int((~self.book.done).sum()))
    c_q = self.model.run(serve_q, self.model.params, c_q, cfg=self.model.cfg)
    tok, q = self._backup(self.served)
    tok, q = self.model.run(merge_rows, hit, c_tok, c_q, tok, q)
    return self._serve(tok, q)

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
      tok = m.put(jnp.asarray([ngram_propose(s, k) for s in self.book.seqs], jnp.int32))
      q = run(point_mass, tok, vocab=v)
    self.backups_used[kind] += 1
    self.phase_s["backup"] += time.perf_counter() - t
    return tok, q

  def _serve(self, tok, q, compact: bool = False) -> Speculation:
    """Returns the speculation to serve, and keeps its tokens for the tree `draft_ahead` dispatches next.

    q goes over the draft's head vocabulary (`compact`: it already is) unless a fast backup served some row: its q
    (uniform, or a point mass on an n-gram token) may put mass outside it.
    """
    t = time.perf_counter()
    full = self.served in ("fast", "ngram") or self.model.cfg.head_vocab is None
    if not compact and not full:
      q = self.model.run(compact_q, q, self.model.params["head_ids"])
    self.pending = self.served_tokens = tok
    self.phase_s["serve"] += time.perf_counter() - t
    return Speculation(tok, q)

  def _record_ranks(self, tree, acc, bonus, live) -> None:
    m = self.model
    rk = np.asarray(bonus_rank(m.params, tree.glue_g, self.served_tokens, m.put(acc), m.put(bonus), cfg=m.cfg))
    for i in np.flatnonzero(live):
      self.ranks[i].append((int(acc[i]), int(rk[i])))

  def stats(self, _=None) -> dict:
    """Returns the draft side's statistics of the run (hits, backups, times, the fan-out it used)."""
    return {"hits": self.hits, "hits_by_len": self.hits_by_len, "rounds_by_len": self.rounds_by_len,
            "backups_used": dict(self.backups_used), "neural_s": self.tally["neural_s"], "tree_s": self.tree_s,
            "cache_bytes": self.cache_bytes, "phase_s": dict(self.phase_s), "ranks": self.ranks,
            "fan_out": self.f, "fan_out_miss": self.f_miss, "compile_seconds": self.model.run.compile_seconds}
