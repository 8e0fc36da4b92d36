"""The round loop of every mode (rounds.generate runs it): its state, the target's times, and the strategy protocol.

A strategy (`Rounds`) says how one call runs its rounds: rounds.StepRounds (AR, SD a verify a call),
sd_chunk.SDChunks (SD, n rounds a call), ssd_loop.SSDHostRounds and ssd_loop.SSDProgramRounds (SSD). The loop
(`run_rounds`) begins it, advances it until no row is left, and on a lost draft side commits the verify in hand
(`settle`) so that the target can finish alone. Every strategy keeps the same state (`LoopState`) and times
(`RoundTimes`), so the decoders read one set of keys whatever ran.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Protocol

import numpy as np

from .base import SpecBook, StreamFn
from .speculator import DraftLost

# The parts of SSD's round on the target's critical path, between a verify's result and the next dispatch.
ROUND_PARTS = ("commit", "cache_wait", "lookup", "backup_wait", "to_target")


@dataclasses.dataclass
class LoopState:
  """What the loop knows between two calls of its strategy, the same in every mode."""
  book: SpecBook            # the committed text (the target's copy)
  first: np.ndarray         # [B] the prefill's tokens, on the host
  stream: StreamFn | None   # told each row's tokens as they are committed
  last: object              # the target's array of the token every live row's text ends with: x_L of the next verify
  committed: int = 0        # rounds committed to the book
  pending: tuple | None = None  # a verify dispatched and not committed: (accept_len, bonus, made or None, drafts)
  go: bool = True           # whether rounds remain


@dataclasses.dataclass
class RoundTimes:
  """The target's times (seconds) and traffic over a run's rounds, kept alike by every strategy. `idle` is its time
  from a verify's result to the next dispatch (SD: the chain's drafting and the commit; SSD: `parts`), `wait` the part
  of it spent waiting on the draft side, `dispatch_call` the dispatch calls' share of `verify` (SSD)."""
  verify: float = 0.0
  dispatch_call: float = 0.0
  idle: float = 0.0
  wait: float = 0.0
  commit: float = 0.0
  parts: dict = dataclasses.field(default_factory=lambda: dict.fromkeys(ROUND_PARTS, 0.0))  # SSD's idle, by part
  rounds: int = 0
  hit_rounds: int = 0
  calls: int = 0            # target programs run: a round each, or a chunk of rounds each
  bytes_in: int = 0         # draft side to target
  bytes_out: int = 0        # target to draft side

  def add_parts(self, spans) -> None:
    """Adds one SSD round's idle time by part (ROUND_PARTS order)."""
    for part, span in zip(ROUND_PARTS, spans):
      self.parts[part] += span
    self.idle = sum(self.parts.values())
    self.wait = self.parts["cache_wait"] + self.parts["backup_wait"]
    self.commit = self.parts["commit"]

  def as_dict(self, target) -> dict:
    return dict(dataclasses.asdict(self), compile=target.programs.compile_seconds)


class Rounds(Protocol):
  """A strategy of the round loop: how one call runs its rounds (StepRounds, sd_chunk.SDChunks,
  ssd_loop.SSDHostRounds, ssd_loop.SSDProgramRounds). It talks to the draft side only through the link's messages
  and the draft side's public methods."""

  name: str
  target: object  # rounds.TargetSide
  times: RoundTimes

  def compile(self) -> None:
    """Compiles the programs its calls run (beyond TargetSide's), before the clock starts."""

  def begin(self, s: LoopState) -> None:
    """Takes the first speculation (sets s.go False when there is none)."""

  def advance(self, s: LoopState) -> None:
    """Runs one call's rounds and commits them to s.book (s.committed, s.last, s.go follow)."""

  def close(self) -> None:
    """Releases what the run held (also after an error)."""


def run_rounds(strategy: Rounds, s: LoopState) -> dict:
  """The round loop of every mode: begins the strategy and advances it until no row is left; returns the target's
  timings (RoundTimes' keys, `compile`). A lost draft side (DraftLost) ends the rounds once the verify in hand is
  committed: the timings then carry `lost` (the error, the target's array of the last committed token, the rounds
  committed) and generate goes on alone."""
  try:
    strategy.begin(s)
    while s.go:
      strategy.advance(s)
  except DraftLost as e:
    settle(strategy.target, s)
    strategy.times.rounds = s.committed  # a round dispatched is counted once it is committed
    return dict(strategy.times.as_dict(strategy.target), lost=(e, s.last, s.committed))
  finally:
    strategy.close()
  return strategy.times.as_dict(strategy.target)


def settle(target, s: LoopState) -> None:
  """Commits s.pending (accept_len, bonus, made or None, drafts: a verify dispatched but not yet committed when the
  draft side was lost), if any: s.last becomes its bonus and s.committed counts it."""
  if s.pending is None:
    return
  acc, bonus, made, drafts = s.pending
  drafts = drafts if made is None else target.fetch(made)
  s.book.commit(target.fetch(acc), target.fetch(bonus), np.asarray(drafts), time.perf_counter(), s.stream)
  s.pending, s.last, s.committed = None, bonus, s.committed + 1


def no_rounds(target) -> dict:
  """The timings of a run that ran no round with its draft side (every mode's keys)."""
  return RoundTimes().as_dict(target)
