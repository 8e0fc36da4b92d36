"""A request in the engine: its settings (what decides its tokens besides its prompt), its Job (prompt ids, Reply,
how it is told), and the Events its client is sent."""
from __future__ import annotations

import dataclasses
import itertools
import logging
from typing import Callable

from ..decode import SpecOptions
from ..decode.auto_k import K_MAX
from .protocol import APIError, usage

log = logging.getLogger("ssd_jax.serve")


@dataclasses.dataclass(frozen=True)
class Settings:
  """What decides a request's tokens besides its prompt; requests with the same `batch_key` share batches."""
  mode: str             # the request's, or the pipeline's default mode
  asked: bool           # the request named its mode (with k='auto' it then runs its best K >= 1, never AR)
  spec: SpecOptions     # K ('auto': chosen per batch) and SSD's fan-out
  temperature: float
  top_p: float
  seed: int | None      # None: a seed drawn for each batch

  def batch_key(self, job_id: int):
    """Returns what a batch's requests share. Greedy tokens ignore top_p and the seed; a sampled request with a seed
    runs alone, so that its seed gives it the answer it gets alone (decode.py's): a row's draws depend on the
    batch it is in."""
    spec = None if self.mode == "ar" else self.spec
    if self.temperature == 0:
      return (self.mode, self.asked, spec, 0.0)
    return (self.mode, self.asked, spec, self.temperature, self.top_p, None if self.seed is None else ("own", job_id))

  def joins(self) -> bool:
    """Returns whether a request of these settings may join a running AR batch (continuous batching): it may run AR
    (mode 'ar', or the default mode with k='auto', which the engine runs as AR beside other requests), and its answer
    does not depend on its row's draws (greedy, or sampled without a seed)."""
    runs_ar = self.mode == "ar" or (not self.asked and self.spec.auto)
    return runs_ar and (self.temperature == 0 or self.seed is None)

  def ar_key(self):
    """Returns what the requests of one continuous AR batch share: how they sample."""
    return ("ar", 0.0) if self.temperature == 0 else ("ar", self.temperature, self.top_p)

  def lookahead(self) -> int:
    """Returns the most draft tokens K a batch of these settings may run (k='auto': up to auto_k.K_MAX); 0 for AR."""
    return 0 if self.mode == "ar" else K_MAX if self.spec.auto else self.spec.k


class Job:
  """One request in the engine: its prompt ids and settings, its Reply once it runs, and `deliver`, which the
  engine's thread calls with each Event (the HTTP layer passes them to its own loop)."""

  _ids = itertools.count(1)

  def __init__(self, ids: list[int], settings: Settings, max_tokens: int, stop: tuple[str, ...],
               deliver: Callable[["Event"], None]):
    self.id, self.ids, self.settings, self.max_tokens, self.stop = next(Job._ids), ids, settings, max_tokens, stop
    self.deliver, self.reply, self.info = deliver, None, None
    self.cancelled = False
    self.key = settings.batch_key(self.id)

  def send(self, event: "Event") -> None:
    """Passes `event` on unless the request was cancelled (its client went away)."""
    if not self.cancelled:
      try:
        self.deliver(event)
      except RuntimeError:  # the server's loop closed under it (shutting down): nobody is listening
        self.cancelled = True

  def take(self, ids: list[int]) -> bool:
    """Adds its row's newly committed tokens; sends the new text, and the end when the request ends here. Returns
    True once the request needs no more tokens (it ended here, at its own max_tokens or stop, or was cancelled):
    the decoder then ends its row (decode.SpecBook.end), and a batch whose rows have all ended stops."""
    if self.cancelled or self.reply.finish is not None:
      return True
    try:
      text = self.reply.add(ids)
    except Exception as e:  # called from inside the decoder's loop: a bug here must not stop the batch
      log.exception("request %d: its reply failed", self.id)
      self.send(Event(error=APIError(500, f"the reply failed: {type(e).__name__}: {e}", "server_error")))
      self.cancelled = True
      return True
    if self.reply.finish is not None:
      self.send(self.ending(text))
      return True
    if text:
      self.send(Event(text))
    return self.cancelled  # a client that went away while this row ran

  def ending(self, text: str) -> "Event":
    """Returns the request's last event: its last text, why it ended, its usage and the batch's report."""
    info = dict(self.info, token_ids=list(self.reply.ids))
    return Event(text, self.reply.finish, usage(len(self.ids), len(self.reply.ids)), info)


@dataclasses.dataclass
class Event:
  """What a request's client is told: new text; at the end also finish ("stop", "length"), usage and info (the
  "ssd_jax" report); or an error (APIError) instead."""
  text: str = ""
  finish: str | None = None
  usage: dict | None = None
  info: dict | None = None
  error: APIError | None = None
