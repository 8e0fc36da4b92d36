"""The draft side behind one interface: SD's chain draft and AR's none here, SSD's tree draft in tree_draft.py.

The target loop talks to a draft side in messages: `prepare` (a run's prompts and options; compile), `prefill`,
`first` (the first tokens; returns the first Speculation), then per round `outcome` (an Outcome; returns the next
Speculation, or None once every row is done) and finally `stats`. SSD's draft side also drafts ahead (`draft_ahead`:
the tree for the speculation it just served) while the target verifies, and hands it to the target (`cache`); its
reply to an outcome is then HIT or, on a miss, the backup's Speculation. Each side keeps its own copy of the committed
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

from .base import SpecBook, cache_slots, pad_prompts, run_lookaheads
from .draft import DraftModel
from .options import DecodeOptions, SpecOptions
from .steps import DRAFT_STREAM, fold, stream_key


@dataclasses.dataclass
class DraftJob:
  """What a draft side needs to know of a run before it starts."""
  prompts: list           # B lists of token ids
  opts: DecodeOptions
  sd_rounds: int = 1      # SD's rounds a call (sd_chunk.SDChunks; 1: a call a round), decided once by the loop


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
  ended: Any = None       # [B] bool: rows the target's book has ended from outside (SpecBook.end) once this outcome
  #                         was committed; a draft side that looks outcomes up (SSD) ends them too, so that both
  #                         sides find the same live rows; None: none


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
  (accept_len, bonus) [B] in `cache`, on the host (microseconds): the round's lookup on both sides."""
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


class DraftLost(RuntimeError):
  """The draft side is gone: its process exited, was killed or stopped answering, or (in this process) it failed.
  The loops catch it, and the target finishes the run alone (rounds.finish_alone)."""


class DraftLostWarning(UserWarning):
  """Said once when a run goes on without its draft side (decode.py shows it as one line)."""


class InProcessDraft:
  """Calls a draft side in this process: `send` runs the call at once, `receive` returns its reply. An error the
  draft side raises reaches the loop as DraftLost (chained to it)."""

  remote = False

  def __init__(self, side: DraftSide):
    self.side, self._reply = side, None
    self.sync = not side.drafts_ahead  # the target waits for each speculation to be drafted (SD, AR)

  def session(self):
    return contextlib.nullcontext()

  def send(self, call: str, arg=None) -> None:
    self._reply = self._guarded(getattr(self.side, call), arg)

  @staticmethod
  def _guarded(fn, *args):
    try:
      return fn(*args)
    except Exception as e:
      raise DraftLost(f"the draft side failed ({type(e).__name__}: {e})") from e

  def receive(self):
    reply, self._reply = self._reply, None
    return reply

  def draft_ahead(self) -> None:
    """Lets the draft start on the next round now that the target has dispatched its verify."""
    self._guarded(self.side.draft_ahead)

  def cache(self) -> "SpecCache":
    """Returns the speculation cache the draft side built while the target verified (it waits for the tree)."""
    return self._guarded(self.side.cache)

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
    ahead = run_lookaheads(self.k, None, job.sd_rounds)[1]  # a chain's round, or SD's chunk of rounds
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

  # SD in chunks of rounds (sd_chunk.SDChunks) drafts the chains inside the target's program: what it reads of the
  # chain, and what it hands back.

  def fused_inputs(self, blank: int = 0):
    """Returns what a chunk of rounds reads of the chain: (params, cache, window [B, W], lengths [B]: the committed
    tail the next chain starts from), its sampling settings (temperature, top_p, saguaro_c) and its key root.
    blank: B, to get zeros for the tail (compiling before a run has one)."""
    m = self.model
    tail = m.tail if not blank else (m.put(jnp.zeros((blank, m.window), jnp.int32)),
                                     m.put(jnp.zeros((blank,), jnp.int32)))
    return (m.params, m.cache, *tail), m.sampling, self.root

  def fused_statics(self) -> dict:
    """The chain's static settings of a chunk of rounds (sd_chunk.sd_chunk's dcfg, k, dplatform, saguaro_top)."""
    m = self.model
    return dict(dcfg=m.cfg, k=self.k, dplatform=m.platform, saguaro_top=m.saguaro_top)

  def took_rounds(self, cache, window, lengths, rnd: int) -> None:
    """Takes the chain's state after a chunk ran rounds up to `rnd`: its cache and committed tail. The speculation
    the chunk returned was drafted with key rnd + 1, as the loop of a call a round would have drafted it."""
    self.model.cache, self.model.tail, self.rnd = cache, (window, lengths), rnd + 1
