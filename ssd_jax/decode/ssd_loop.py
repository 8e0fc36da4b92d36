"""SSD's rounds: two strategies of the round loop (loop.run_rounds), a verify a call or many rounds in one program.

`SSDHostRounds` dispatches one verify a round from the host. On a CPU core of its own that call costs the target
1-4 ms a round (JAX's handling of the verify's ~750 argument leaves and the hand-over to XLA's thread), as much as
SSD saves by drafting ahead. `SSDProgramRounds`, for a draft side in its own process, runs the target's rounds
inside one XLA while loop (`ssd_rounds`): each iteration verifies the speculation in hand, then calls back to the
host (`jax.experimental.io_callback`, ~80 us) with the outcome. The host (`HostRounds`) does what `SSDHostRounds`
does between two verifies: commits the outcome, takes the speculation cache the draft process sent while the verify
ran, looks the outcome up in it and, on a hit, returns the cached speculation at once (the outcome goes to the draft
process before the callback returns; its HIT reply is read at the next callback); on a miss it sends the outcome and
returns the backup the draft process serves. The program ends when every row is done, or after `ROUNDS_PER_CALL`
rounds (so that Ctrl-C, which Python handles between calls, is seen within a second); the next call takes over the
loop's carry on the device.

Keys, inputs and the verify are the same round for round either way (round r's key is fold(verify_root, r)), so a
seed gives the same tokens (tests/test_ssd_loop.py). One program is used for the 'processes' placement with the
target on one device; the 'devices' placement keeps `SSDHostRounds` (its draft side runs JAX programs, which a
callback running inside the target's program must not wait on).
"""
from __future__ import annotations

import functools
import itertools
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

from ..models.config import ModelConfig
from .loop import LoopState, RoundTimes
from .speculator import HIT, DraftLost, Outcome, cached_tokens, find
from .steps import verify

ROUNDS_PER_CALL = 64  # ~1 s of rounds on a CPU: the longest a Ctrl-C waits


class SSDHostRounds:
  """SSD's rounds with one verify dispatched a round from the host (the 'devices' placement), a strategy of the
  round loop (loop.run_rounds): the draft side's speculation cache comes to the target (link.cache) while the target
  verifies; when the verify ends the target commits its outcome, looks it up there itself and, when every live row
  hits, dispatches the next verify at once, and only then sends the outcome to the draft side (which finds the same
  hits and drafts the next tree). A miss sends the outcome first and waits for the backup's speculation.

  Times: `idle` the target's time from a verify's result to the next dispatch, `parts` that time by part
  (ROUND_PARTS), `verify` dispatch to result, `wait` its waits on the draft side (cache and backup), hit_rounds."""

  name = "ssd_host"

  def __init__(self, target, link, for_draft):
    self.target, self.link, self.for_draft, self.times = target, link, for_draft, RoundTimes()

  def compile(self) -> None:
    pass  # TargetSide compiled the verify

  def close(self) -> None:
    pass

  def begin(self, s: LoopState) -> None:
    target, link, t = self.target, self.link, self.times
    link.send("first", s.first)
    spec = link.receive()
    if spec is None:
      s.go = False
      return
    t.bytes_in += _nbytes(spec)
    t.rounds = t.calls = 1
    self.served = spec.tokens
    nxt = target.stage(s.book, 1, s.last)
    tokens, q = target.to_target(spec)
    self.t_dispatch = time.perf_counter()
    self.dispatched = target.verify(tokens, q, *nxt)
    s.pending = (self.dispatched[0], self.dispatched[1], None, self.served)
    target.key_ahead(2)
    link.draft_ahead()

  def advance(self, s: LoopState) -> None:
    """Commits the verify in hand and, unless every row is done, dispatches the next one."""
    target, link, t, book = self.target, self.link, self.times, s.book
    acc, bonus, feats, _ = self.dispatched
    s.last, acc, bonus = bonus, target.fetch(acc), target.fetch(bonus)
    feats = self.for_draft(feats)
    t_verified = time.perf_counter()
    t.verify += t_verified - self.t_dispatch
    book.commit(acc, bonus, np.asarray(self.served), t_verified, s.stream)
    s.pending, s.committed = None, s.committed + 1
    t_commit = time.perf_counter()
    cache = link.cache()  # built while the verify ran: normally here already
    t_cache = time.perf_counter()
    t.bytes_in += cache.nbytes
    outcome = Outcome(acc, bonus, t_verified - self.t_dispatch, feats, ended=_ended(book))
    t.bytes_out += acc.nbytes + bonus.nbytes + (feats.nbytes if feats is not None else 0)
    if book.done.all():  # no next dispatch: the last round's commit is no idle time
      link.send("outcome", outcome)
      _expect(link.receive(), None)
      s.go = False
      return
    t.rounds = t.calls = rnd = t.rounds + 1
    hit, branch = find(cache, acc, bonus)
    nxt = target.stage(book, rnd, s.last)
    was_hit = bool(hit[~book.done].all())
    t.hit_rounds += was_hit
    tokens, q, self.served, t_found, t_sent, got = _next_speculation(target, link, cache, branch, outcome, was_hit)
    t.bytes_in += got
    self.t_dispatch = t_dispatch = time.perf_counter()
    self.dispatched = target.verify(tokens, q, *nxt)
    s.pending = (self.dispatched[0], self.dispatched[1], None, self.served)
    # The call's own time counts as the verify's, as in every mode: on a core of its own the program starts as
    # the call returns, so the call's wall time is part host work (its arguments), part the verify running.
    t.dispatch_call += time.perf_counter() - t_dispatch
    target.key_ahead(rnd + 1)
    t.add_parts((t_commit - t_verified, t_cache - t_commit, t_found - t_cache, t_sent - t_found,
                 t_dispatch - t_sent))
    if was_hit:  # the outcome goes to the draft side once the next verify runs
      link.send("outcome", outcome)
      _expect(link.receive(), HIT)
    link.draft_ahead()


def _next_speculation(target, link, cache, branch, outcome, hit: bool):
  """Returns the next verify's (tokens, q) on the target, the tokens served (host), when the lookup ended and when
  the speculation was in hand, and the bytes that came for it: the cache's branch on a hit; on a miss the backup the
  draft side serves after the outcome (rows that hit keep their cached speculation)."""
  t_found = time.perf_counter()
  if hit:
    served = cached_tokens(cache, branch)
    return (*target.from_cache(cache, branch, served), served, t_found, t_found, 0)
  link.send("outcome", outcome)
  spec = link.receive()
  t_sent = time.perf_counter()
  return (*target.to_target(spec), spec.tokens, t_found, t_sent, _nbytes(spec))


def _ended(book):
  """Returns the rows `book` has ended from outside (SpecBook.end), for the draft side's book; None when none."""
  return book.ended.copy() if book.ended.any() else None


def _nbytes(spec) -> int:
  return spec.tokens.nbytes + (spec.q.nbytes if spec.q is not None else 0)


def _expect(reply, want) -> None:
  """Checks the draft side's reply to an outcome against what the target found (the same lookup on both sides)."""
  if reply is not want and reply != want:
    raise RuntimeError(f"the draft side replied {type(reply).__name__} to an outcome where the target expected "
                       f"{want!r}: the two sides' books or caches disagree")


_RUNS: dict = {}  # run id -> its HostRounds, for the callback
_IDS = itertools.count(1)
_LOCK = threading.Lock()


ONE_PROGRAM = True  # False: every placement runs SSDHostRounds (to compare the two; tests)


def usable(dec, link) -> bool:
  """Whether a run's SSD rounds can run in one program: a draft side in another process (the callback then only
  talks over a pipe) and the target on one device (an ordered callback needs one)."""
  return (ONE_PROGRAM and bool(getattr(link, "remote", False)) and not link.sync
          and dec.placement.target_mesh.size == 1)


def _host_round(run_id, accept_len, bonus, *features):
  return _RUNS[int(run_id)].round(accept_len, bonus, features[0] if features else None)


@functools.partial(jax.jit, static_argnames=("n", "greedy", "cfg", "attn_impl", "platform", "feature_layers"),
                   donate_argnames=("cache",))
def ssd_rounds(params, cache, bonus_prev, tokens, q, active, root, first_round, run_id, temperature, top_p, n: int,
               greedy: bool, cfg: ModelConfig, attn_impl: str = "auto", platform: str | None = None,
               feature_layers: tuple = ()):
  """Runs up to n SSD rounds from round `first_round` (its speculation `tokens` [B, K], `q` [B, K, V]); returns
  (cache, the last round's bonus [B], the next round's tokens, q and active rows, whether rounds remain, the rounds
  run). After each verify the host callback of run `run_id` (HostRounds.round) gives the next round's speculation,
  active rows and whether to go on. At temperature 0 (greedy) only tokens cross; q stays the zeros it came as."""
  b, k = tokens.shape
  shapes = [jax.ShapeDtypeStruct((b, k), jnp.int32), jax.ShapeDtypeStruct((b,), jnp.bool_),
            jax.ShapeDtypeStruct((), jnp.bool_)]
  if not greedy:
    shapes.append(jax.ShapeDtypeStruct(q.shape, jnp.float32))
  st = dict(cfg=cfg, attn_impl=attn_impl, platform=platform, feature_layers=feature_layers)

  def body(c):
    i, cache, prev, tokens, q, active, _ = c
    key = jax.random.fold_in(root, first_round + i)
    acc, bonus, cache, *feats = verify(params, cache, prev, tokens, q, active, key, temperature, top_p, **st)
    out = io_callback(_host_round, tuple(shapes), run_id, acc, bonus, *feats, ordered=True)
    return (i + 1, cache, bonus, out[0], q if greedy else out[3], out[1], out[2])

  init = (jnp.int32(0), cache, bonus_prev, tokens, q, active, jnp.bool_(True))
  i, cache, bonus, tokens, q, active, go = jax.lax.while_loop(lambda c: c[6] & (c[0] < n), body, init)
  return cache, bonus, tokens, q, active, go, i


class HostRounds:
  """The host's part of each round of one run, called back from inside `ssd_rounds` after every verify; it keeps the
  run's RoundTimes (SSDProgramRounds reports them)."""

  def __init__(self, target, link, book, served, greedy: bool, head_ids=None):
    self.target, self.link, self.book = target, link, book
    self.served, self.greedy, self.head_ids = served, greedy, head_ids
    self.times = RoundTimes()
    self.rnd, self.pending_hit, self.error, self.lost = 1, False, None, None
    self.stream = None
    self.t_dispatch = time.perf_counter()
    with _LOCK:
      self.id = next(_IDS)
      _RUNS[self.id] = self

  def close(self) -> None:
    _RUNS.pop(self.id, None)

  def round(self, accept_len, bonus, feats):
    """Returns (tokens [B, K], active [B], go[, q [B, K, V]]) for the round after the verify whose outcome this is.
    An error is kept for the caller (raised once the program returns) and ends the loop."""
    try:
      return self._round(np.asarray(accept_len), np.asarray(bonus), feats)
    except DraftLost as e:  # the outcome is committed: the run goes on without the draft side (rounds.generate)
      self.lost = e
    except BaseException as e:  # noqa: BLE001 - raised again on the caller's thread
      self.error = self.error or e
    return self._stop()

  def _stop(self):
    b, k = self.served.shape
    out = (np.zeros((b, k), np.int32), np.zeros((b,), bool), np.bool_(False))
    return out if self.greedy else out + (np.zeros((b, k, self.target.dec.tcfg.vocab_size), np.float32),)

  def widen_q(self, q):
    """Returns a served q over the full vocabulary (host arrays; a cut head's q widened here)."""
    q = np.asarray(q, np.float32)
    if q.shape[-1] == self.target.dec.tcfg.vocab_size:
      return q
    full = np.zeros(q.shape[:-1] + (self.target.dec.tcfg.vocab_size,), np.float32)
    full[..., self.head_ids] = q
    return full

  def _round(self, acc, bonus, feats):
    t_verified = time.perf_counter()
    t = self.times
    t.verify += t_verified - self.t_dispatch
    link, book = self.link, self.book
    book.commit(acc, bonus, self.served, t_verified, self.stream)
    t.rounds += 1  # rounds verified and committed
    t_commit = time.perf_counter()
    if self.pending_hit:  # the draft process's reply to the last outcome: it found the same hits
      self.pending_hit = False
      _expect(link.receive(), HIT)
    cache = link.cache()  # built while the verify ran: normally here already
    t_cache = time.perf_counter()
    feats = None if feats is None else np.asarray(feats)
    t.bytes_in += cache.nbytes
    outcome = Outcome(acc, bonus, t_verified - self.t_dispatch, feats, ended=_ended(book))
    t.bytes_out += acc.nbytes + bonus.nbytes + (feats.nbytes if feats is not None else 0)
    if book.done.all():  # no next round: the last commit is no idle time
      link.send("outcome", outcome)
      _expect(link.receive(), None)
      return self._stop()
    self.rnd += 1
    hit, branch = find(cache, acc, bonus)
    if hit[~book.done].all():
      t.hit_rounds += 1
      self.served = cached_tokens(cache, branch)
      q = None if self.greedy else cache.q[np.arange(len(branch)), branch]
      t_found = time.perf_counter()
      link.send("outcome", outcome)  # before the next verify starts, its reply read after it
      self.pending_hit = True
      t_sent = time.perf_counter()
    else:  # a miss: the draft side serves the backup (rows that hit keep their cached speculation)
      t_found = time.perf_counter()
      link.send("outcome", outcome)
      spec = link.receive()
      t_sent = time.perf_counter()
      t.bytes_in += _nbytes(spec)
      self.served, q = np.asarray(spec.tokens), spec.q
    out = (np.asarray(self.served, np.int32), ~book.done, np.bool_(True))
    if not self.greedy:
      out += (self.widen_q(q),)
    self.t_dispatch = time.perf_counter()
    t.add_parts((t_commit - t_verified, t_cache - t_commit, t_found - t_cache, t_sent - t_found,
                 self.t_dispatch - t_sent))
    return out



class SSDProgramRounds:
  """SSD's rounds for a draft process in programs of up to ROUNDS_PER_CALL rounds (ssd_rounds), a strategy of the
  round loop (loop.run_rounds): each call runs rounds until every row is done or the call's rounds are spent, the
  host's part of each round done by HostRounds inside it. Times as SSDHostRounds' (`calls`: the programs run,
  `dispatch_call`: their time outside their rounds' verifies and host parts)."""

  name = "ssd_program"

  def __init__(self, target, link):
    self.target, self.link, self.host, self._times = target, link, None, RoundTimes()

  @property
  def times(self) -> RoundTimes:
    return self._times if self.host is None else self.host.times

  def compile(self) -> None:
    """Compiles `ssd_rounds` for this run's shapes before the clock starts."""
    target = self.target
    dec, b, k = target.dec, target.tokens.shape[0], target.dec.k
    z, greedy = jnp.zeros((b,), jnp.int32), float(target.temp) == 0.0
    target.programs.compile_only(
        ssd_rounds, dec.tparams, target.cache, target.rep(z), target.rep(jnp.zeros((b, k), jnp.int32)),
        target.rep(jnp.zeros((b, k, dec.tcfg.vocab_size))), target.rep(z > 0), target.verify_root, jnp.int32(1),
        jnp.int32(0), target.temp, target.top_p, n=ROUNDS_PER_CALL, greedy=greedy, **target.st)

  def close(self) -> None:
    if self.host is not None:
      self.host.close()

  def begin(self, s: LoopState) -> None:
    target, link = self.target, self.link
    dec, self.greedy = target.dec, float(target.temp) == 0.0
    link.send("first", s.first)
    spec = link.receive()
    if spec is None:
      s.go = False
      return
    head = None if dec.head is None else np.asarray(dec.placement.fetch(dec.head["head_ids"]))
    host = self.host = HostRounds(target, link, s.book, np.asarray(spec.tokens), self.greedy, head)
    host.stream, host.times.bytes_in = s.stream, _nbytes(spec)
    self.tokens = target.rep(np.asarray(spec.tokens, np.int32))
    self.q = target.place_q(None if self.greedy else host.widen_q(spec.q))
    self.active, self.rnd = target.rep(~s.book.done), 1

  def advance(self, s: LoopState) -> None:
    """Runs one program of rounds; their outcomes were committed by the host's part of each round."""
    target, host, t = self.target, self.host, self.host.times
    host.t_dispatch = t0 = time.perf_counter()
    inside = t.verify + t.idle
    target.cache, s.last, self.tokens, self.q, self.active, go, n = target.programs(
        ssd_rounds, target.dec.tparams, target.cache, s.last, self.tokens, self.q, self.active, target.verify_root,
        jnp.int32(self.rnd), jnp.int32(host.id), target.temp, target.top_p, stable=2, n=ROUNDS_PER_CALL,
        greedy=self.greedy, **target.st)
    go, n = bool(target.fetch(go)), int(target.fetch(n))
    # The program's time outside its rounds' verifies and host parts: what the calls themselves cost.
    t.dispatch_call += time.perf_counter() - t0 - (t.verify + t.idle - inside)
    t.calls += 1
    s.committed = t.rounds  # `s.last` holds the bonus of the last round committed
    if host.error is not None:
      raise host.error
    if host.lost is not None:  # the run goes on without the draft side from here
      raise host.lost
    s.go, self.rnd = go, self.rnd + n
