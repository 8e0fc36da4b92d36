"""The target's loop: prefill, then rounds of speculate / verify / commit, one loop for every mode.

AR, SD and SSD differ in the draft side plugged in (speculator.py, tree_draft.py), which the loop talks to in the
same messages: `NoDraft` (AR) serves empty speculations, and a verify of no drafts is one AR step (its bonus is the
target's next token); `ChainDraft` (SD) drafts K tokens once the outcome is known; `TreeDraft` (SSD) drafts ahead for
the likely outcomes while the target verifies, in this process or in its own (draft_process.py), and hands the target
that cache. How a call's rounds are run is the loop's strategy (`Rounds`), picked once per run (`pick_rounds`):
`StepRounds` (a verify a call; AR in chunks of steps), `sd_chunk.SDChunks` (SD's verify and next chain n rounds a
call), `ssd_loop.SSDHostRounds` (SSD, a verify a call, looked up on the target's side) and
`ssd_loop.SSDProgramRounds` (SSD with a draft process: many rounds in one program). `run_rounds` is the loop itself:
it starts the strategy, advances it until no row is left, and on a lost draft side commits the verify in hand so the
target can finish alone. Its state (`LoopState`) and the target's times (`RoundTimes`) are the same types in every
mode. The target's side (`TargetSide`: cache, sampling settings, compiled programs) is set up once here, and the
verifier draws its keys from its own stream (VERIFY_STREAM) in every mode, as each draft side draws from its own.
"""
from __future__ import annotations

import dataclasses
import time
import warnings
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ..kernels.platform import device_platform
from . import sd_chunk, ssd_loop
from .loop import LoopState, Rounds, RoundTimes, no_rounds, run_rounds
from .base import SpecBook, StreamFn, cache_slots, hears, pad_prompts, run_lookaheads
from .options import DecodeOptions
from .speculator import DraftJob, DraftLost, DraftLostWarning, Outcome
from .steps import (VERIFY_STREAM, ar_chunk, first_tokens, fold, fold_steps, pick_branch, prefill, serve_q, stream_key,
                    verify)


@dataclasses.dataclass
class RunResult:
  """One run of the loop: the committed text and statistics (book), its times and the draft side's statistics."""
  book: SpecBook
  t_prefill: float    # seconds from the clock's start to the first tokens
  t_start: float      # perf_counter when decoding (after prefill) started
  timing: dict        # the target's times and traffic (_rounds)
  draft_stats: dict   # the draft side's reply to `stats`


class TargetSide:
  """The target's side of one run: its cache, sampling settings and compiled programs on the target mesh.

  `dec` is the decoder: placement, tcfg, tparams (placed), kv_dtype, attn_impl, feature_layers, programs, k, head
  (the draft's head ids on the target, to widen a q served over the draft's head vocabulary; None when q comes full)
  and dcfg. AR (k = 0) verifies in chunks of opts.ar_chunk steps, each chunk one call (`steps.ar_chunk`).
  """

  def __init__(self, dec, tokens, lengths, opts: DecodeOptions, sd_rounds: int = 1):
    pl, cfg, k, b = dec.placement, dec.tcfg, dec.k, tokens.shape[0]
    self.dec, self.programs, self.fetch, self.rep = dec, dec.programs, pl.fetch, pl.to_target
    rep, self.st = pl.to_target, dict(cfg=cfg, attn_impl=dec.attn_impl, feature_layers=dec.feature_layers,
                                      platform=device_platform(pl.target_mesh))
    self.chunk = opts.ar_chunk if k == 0 else 1
    # A verify writes K+1 entries past the committed text before rolling back; AR's and SD's chunks more.
    ahead = run_lookaheads(k, None, sd_rounds, opts.ar_chunk)[0]
    slots = cache_slots(int(lengths.max()), opts.max_new_tokens, lookahead=ahead)
    self.cache = pl.target_cache(cfg, b, slots, dec.kv_dtype)
    self.key, self.temp, self.top_p = (rep(x) for x in (jax.random.key(opts.seed), jnp.float32(opts.temperature),
                                                         jnp.float32(opts.top_p)))
    self.tokens, self.lengths = rep(tokens), rep(lengths)
    self.verify_root = rep(stream_key(opts.seed, VERIFY_STREAM))  # placed: each round's fold stays there
    self._active = None  # stage's placed active rows, with the book's done flags they were placed for
    self._zero_q = None  # the q a verify gets at temperature 0 (it reads tokens only)
    self._keys = {}  # round -> its verify key, folded ahead (key_ahead)
    z = rep(jnp.zeros((b,), jnp.int32))
    run, p = self.programs, dec.tparams
    # Everything the loop needs compiles before the clock starts.
    run.compile_only(prefill, p, self.tokens, self.lengths, self.cache, **self.st)
    run.compile_only(first_tokens, p, rep(jnp.zeros((b, cfg.out_vocab))), self.key, self.temp, self.top_p, cfg=cfg)
    if self.chunk > 1:
      run.compile_only(ar_chunk, p, self.cache, z, rep(z > 0), fold_steps(self.verify_root, 1, self.chunk),
                       self.temp, self.top_p, n=self.chunk, **self.st)
    elif sd_rounds <= 1:  # SD in chunks of rounds runs sd_chunk's programs instead (compiled by sd_chunk.SDChunks)
      run.compile_only(verify, p, self.cache, z, rep(jnp.zeros((b, k), jnp.int32)),
                       rep(jnp.zeros((b, k, cfg.vocab_size))), rep(z > 0), self.key, self.temp, self.top_p, **self.st)
    if dec.head is not None:
      run.compile_only(serve_q, dec.head, rep(jnp.zeros((b, k, dec.dcfg.out_vocab))), cfg=dec.dcfg)

  def prefill(self):
    """Returns (the first token of every row [B], the prompts' target features or None) after writing the prompts
    into the target cache."""
    run, p, cfg = self.programs, self.dec.tparams, self.dec.tcfg
    logits, self.cache, *feats = run(prefill, p, self.tokens, self.lengths, self.cache, **self.st)
    self.first = run(first_tokens, p, logits, self.key, self.temp, self.top_p, cfg=cfg)
    return self.fetch(self.first), (feats or [None])[0]

  def stage(self, book: SpecBook, rnd: int, last):
    """Returns round rnd's small verify inputs (previous bonus, active rows, key), known once the book is committed.

    `last` is the target's array of the tokens the previous round drew (its bonus; the first tokens before round 1):
    every row still active ends its committed text with it (a row whose text was cut at a stop or at max_new_tokens
    is done, and a done row's verify is ignored: its length stays, its outcome is not committed), so it serves as
    x_L without a round trip through the host.
    The active rows are placed again only when a row has finished. A chunk of AR steps gets the keys the unfused
    loop gives its rounds, (rnd - 1) * chunk + 1 onwards.
    """
    if self._active is None or not np.array_equal(self._active[0], book.done):
      self._active = (book.done.copy(), self.rep(~book.done))
    key = self._keys.pop(rnd, None)
    if key is None:
      key = self.round_key(rnd)
    return self.rep(last), self._active[1], key

  def round_key(self, rnd: int):
    """Returns round rnd's verify key (a chunk of AR steps: its steps' keys)."""
    return (fold_steps(self.verify_root, (rnd - 1) * self.chunk + 1, self.chunk) if self.chunk > 1
            else fold(self.verify_root, rnd))

  def key_ahead(self, rnd: int) -> None:
    """Folds round rnd's key now (while a verify runs), so that `stage` finds it ready: one call less between a
    verify's result and the next dispatch."""
    self._keys = {rnd: self.round_key(rnd)}

  def to_target(self, spec):
    """Returns a served speculation's (tokens [B, K], q [B, K, V]) on the target's devices (q None: temperature 0,
    where the verify reads tokens only; it gets zeros placed once)."""
    return self.rep(spec.tokens), self.place_q(spec.q)

  def from_cache(self, cache, branch, tokens):
    """Returns (tokens [B, K], q [B, K, V]) on the target's devices for the speculation cache's rows `branch` [B]
    (speculator.find), `tokens` [B, K] their tokens: q picked from the cache where it lies (a host array from a draft
    process; on the draft's device in this process) and widened from the draft's head vocabulary here."""
    q = cache.q
    if q is not None:
      q = q[np.arange(len(branch)), branch] if isinstance(q, np.ndarray) else self.programs(pick_branch, q, branch)
    return self.rep(tokens), self.place_q(q)

  def place_q(self, q):
    """Returns a served q [B, K, V_out or V] on the target's devices over the full vocabulary (widened from the
    draft's head vocabulary here); None (temperature 0, where the verify reads tokens only) gives zeros placed once."""
    if q is None:
      if self._zero_q is None:
        self._zero_q = self.rep(jnp.zeros((self.tokens.shape[0], self.dec.k, self.dec.tcfg.vocab_size)))
      return self._zero_q
    q = self.rep(q)
    if q.shape[-1] != self.dec.tcfg.vocab_size:
      q = self.programs(serve_q, self.dec.head, q, cfg=self.dec.dcfg)
    return q

  def verify(self, tokens, q, bonus_prev, active, key):
    """Dispatches the verify of `tokens` (a chunk of AR steps: `key` holds its steps' keys, stage); returns
    (accept_len [B], bonus [B], the verified positions' target features [B, K+1, n_feat * d] or None, the tokens
    the target made before the bonus [B, chunk-1] or None: the drafts were `tokens`) as target arrays."""
    # The params and the cache keep their shapes and places all run (stable=2): their ~760 leaves are not keyed.
    if self.chunk > 1:
      acc, bonus, made, self.cache = self.programs(ar_chunk, self.dec.tparams, self.cache, bonus_prev, active, key,
                                                   self.temp, self.top_p, stable=2, n=self.chunk, **self.st)
      return acc, bonus, None, made
    acc, bonus, self.cache, *feats = self.programs(verify, self.dec.tparams, self.cache, bonus_prev, tokens, q,
                                                   active, key, self.temp, self.top_p, stable=2, **self.st)
    return acc, bonus, (feats or [None])[0], None


def generate(dec, link, prompts: Sequence[Sequence[int]], opts: DecodeOptions, stream: StreamFn | None = None
             ) -> RunResult:
  """Runs the loop for `prompts` with the draft side behind `link` (speculator.InProcessDraft or
  draft_process.DraftProcess: send / receive / draft_ahead); returns what the decoder reports from.

  A draft side that is lost (DraftLost: its process exited, was killed or stopped answering, or it failed) costs the
  run its speed, not its answer: the loop stops where the book is committed, one DraftLostWarning says so, and the
  target finishes alone (`finish_alone`: AR steps, the same tokens at temperature 0); timing's `rounds_alone` (per
  row) and `draft_lost` say so, and the draft side's statistics are None."""
  dec.check([len(p) for p in prompts], opts.max_new_tokens)
  tokens, lengths = pad_prompts(prompts)
  for_draft = _for_draft(dec, link)
  lost = []  # the DraftLost that ended the draft side, if one did

  def draft(fn, *args):  # a call to the draft side before the rounds
    if not lost:
      try:
        return fn(*args)
      except DraftLost as e:
        lost.append(e)

  with link.session():
    # SD's rounds a call, decided once: the target's and the chain's caches are sized for it alike.
    n = opts.sd_chunk if sd_chunk.fusable(dec, link) else 1
    # The draft side compiles its programs and sets up its cache while the target compiles its own.
    draft(link.send, "prepare", DraftJob([list(map(int, p)) for p in prompts], opts, sd_rounds=n))
    target = TargetSide(dec, tokens, lengths, opts, n)
    draft(link.receive)
    strategy = pick_rounds(dec, link, target, n, for_draft)
    strategy.compile()
    t0 = time.perf_counter()
    if dec.feature_layers:  # the draft's prefill reads the target's
      first, feats = target.prefill()
      draft(link.send, "prefill", for_draft(feats))
    else:  # both prefill at once
      draft(link.send, "prefill")
      first, _ = target.prefill()
    draft(link.receive)
    t_prefill = time.perf_counter() - t0
    book = SpecBook(prompts, first, opts, dec.k, time.perf_counter())
    for i in range(len(book.out)):  # the prefill's token
      if hears(stream, i):
        stream(i, book.out[i][:])
    state = LoopState(book, first, stream, target.first)
    if lost:
      timing = dict(no_rounds(target), lost=(lost[0], target.first, 0))
    else:
      timing = run_rounds(strategy, state)
    stop = timing.pop("lost", None)
    if stop is None:
      stats = draft(_stats, link)
      if lost:  # lost after the last round: every row is done, only the draft side's statistics went with it
        _abort(link)
        timing["draft_lost"] = str(lost[0]).splitlines()[0]
    else:
      timing = _go_on_alone(target, link, book, stop, stream, timing)
      stats = None
  return RunResult(book, t_prefill, t0 + t_prefill, timing, stats)


def pick_rounds(dec, link, target: TargetSide, sd_rounds: int, for_draft) -> Rounds:
  """Returns the run's strategy: SD's rounds in chunks where they fuse (sd_rounds > 1), SSD's in one program for a
  draft process on a one-device target, SSD's a verify a call otherwise, and a verify a call for AR and SD."""
  if sd_rounds > 1:
    return sd_chunk.SDChunks(target, link, sd_rounds)
  if not link.sync:  # a draft side that drafts ahead (SSD)
    if ssd_loop.usable(dec, link):
      return ssd_loop.SSDProgramRounds(target, link)
    return ssd_loop.SSDHostRounds(target, link, for_draft)
  return StepRounds(target, link, for_draft)


def _stats(link) -> dict:
  """Returns the draft side's statistics of the run (its reply to `stats`)."""
  link.send("stats")
  return link.receive()


def _abort(link) -> None:
  """Drops a lost draft process (exited, killed or silent: its state is void either way); the next run starts a
  fresh one."""
  if getattr(link, "remote", False):
    link.abort()


def _go_on_alone(target, link, book, stop, stream, timing) -> dict:
  """Finishes a run whose draft side was lost (stop: the DraftLost, the target's array of the last committed token,
  the rounds committed); returns `timing` with rounds_alone ([B]: each row's steps without it) and draft_lost."""
  error, last, rnd = stop
  _abort(link)
  what = str(error).splitlines()[0]
  if not book.done.all():
    warnings.warn(f"{what}; the target finishes the run alone (AR) from round {rnd + 1}", DraftLostWarning,
                  stacklevel=4)
  return dict(timing, rounds_alone=finish_alone(target, book, last, rnd, stream), draft_lost=what)


def finish_alone(target: TargetSide, book: SpecBook, last, rnd: int, stream=None) -> np.ndarray:
  """Runs the target alone from round rnd + 1 until every row is done: AR steps (a verify of no drafts), x_L the
  target's array `last` of the last committed token; returns [B] the steps each row took. At temperature 0 its
  tokens are AR's."""
  b, v = len(book.out), target.dec.tcfg.vocab_size
  none, q = target.rep(np.zeros((b, 0), np.int32)), target.rep(np.zeros((b, 0, v), np.float32))
  steps = np.zeros(b, np.int64)
  while not book.done.all():
    steps += ~book.done
    acc, last, _, _ = target.verify(none, q, *target.stage(book, rnd + int(steps.max()), last))
    book.commit(target.fetch(acc), target.fetch(last), np.zeros((b, 0), np.int32), time.perf_counter(), stream)
  return steps


class StepRounds:
  """AR's and SD's rounds, a verify a call: the draft side proposes once the outcome is known (a sync link; AR's
  `NoDraft` serves nothing, and a chunk of AR steps is one call). `idle` is the target's time between a verify's
  result and the next dispatch: the chain's drafting plus the commit."""

  name = "rounds"

  def __init__(self, target: TargetSide, link, for_draft):
    self.target, self.link, self.for_draft, self.times = target, link, for_draft, RoundTimes()

  def compile(self) -> None:
    pass  # TargetSide compiled the verify (or AR's chunk)

  def close(self) -> None:
    pass

  def begin(self, s: LoopState) -> None:
    self.link.send("first", s.first)
    self.t_verified = time.perf_counter()
    self.nxt = self.target.stage(s.book, 1, s.last)
    self.spec = self.link.receive()
    s.go = self.spec is not None

  def advance(self, s: LoopState) -> None:
    t, target, link, spec = self.times, self.target, self.link, self.spec
    rnd = t.rounds = t.calls = s.committed + 1
    t.bytes_in += spec.tokens.nbytes + spec.q.nbytes
    tokens, q = target.to_target(spec)
    if link.sync:
      tokens.block_until_ready()  # a draft that drafts after the outcome (SD): its time ends here, not the verify's
    t_dispatch = time.perf_counter()
    t.idle += t_dispatch - self.t_verified
    acc, bonus, feats, made = target.verify(tokens, q, *self.nxt)
    s.pending = (acc, bonus, made, spec.tokens)
    link.draft_ahead()  # after the verify's dispatch: the target starts first
    # A draft side in this process may read the outcome from the verify's own arrays (SD's chain: on the device).
    on_target = None if link.remote else (acc, bonus, self.nxt[1])
    s.last, acc, bonus = bonus, target.fetch(acc), target.fetch(bonus)
    made = None if made is None else target.fetch(made)  # AR's chunk: the steps before the bonus
    drafts = spec.tokens if made is None else made
    feats = self.for_draft(feats)
    t_verified = self.t_verified = time.perf_counter()
    t.verify += t_verified - t_dispatch
    # The outcome leaves first: the target's own bookkeeping and the next round's small inputs are prepared
    # while the draft looks the outcome up, instead of before it can start.
    link.send("outcome", Outcome(acc, bonus, t_verified - t_dispatch, feats, on_target=on_target, made=made))
    t.bytes_out += acc.nbytes + bonus.nbytes + (feats.nbytes if feats is not None else 0)
    t_sent = time.perf_counter()
    s.book.commit(acc, bonus, np.asarray(drafts), t_verified, s.stream)
    s.pending, s.committed = None, rnd
    self.nxt = target.stage(s.book, rnd + 1, s.last)
    t.commit += time.perf_counter() - t_sent
    self.spec = link.receive()
    # The target's book decides too: a row ended from outside (SpecBook.end) the draft side's book has not heard of.
    s.go = self.spec is not None and not s.book.done.all()
    t.wait += time.perf_counter() - t_verified


def _for_draft(dec, link):
  """Returns a function giving target features in the form the draft side takes them: host arrays for a draft
  process, else as they are (the draft model moves them to its device)."""
  def convert(feats):
    if feats is None or not link.remote:
      return feats
    return np.asarray(dec.placement.fetch(feats))
  return convert
