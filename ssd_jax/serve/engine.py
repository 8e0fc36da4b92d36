"""The worker that owns the Pipeline: requests wait in a queue and run in batches on one thread.

Two ways a batch runs. **Continuous** (AR): a request that may run AR (mode 'ar', or the default mode with
k='auto'; greedy, or sampled without a seed) joins a running batch of AR rows between
its calls (decode.slots.SlotBatch: its prompt prefilled on its own and put into a free row while the others keep
their text), and its row is freed as soon as it ends (its own max_tokens, a stop, its client gone), so a short
request never waits for a long one and a new one never waits for a batch to drain. Requests of the running batch's
sampling settings join it; once a request that cannot join is the oldest waiting, nothing more joins, the batch
drains and that request runs next. A batch that starts with several such requests runs AR; one request alone runs
what k='auto' picks for one row. **Static** (everything else: SD and SSD, a fixed K, a seeded sample, or a lone
request the default mode speculates for): the engine takes the oldest waiting request and those that can share its
batch (the same `Settings`, fitting the context together), up to `max_batch`, and runs them to the largest of their
max_tokens; a request that ends early ends its row at its next commit (decode.SpecBook.end), and the batch stops once
every row has ended.

Either way each row streams as it commits, and its request's `Reply` cuts it at the request's own max_tokens, stop
ids and stop strings: a prefix of a sample is a sample of the prefix, and a greedy row's tokens do not depend on the
batch, so each answer is the one its request gets alone.
"""
from __future__ import annotations

import collections
import logging
import math
import secrets
import threading
import time
from typing import Callable

from ..decode import DecodeOptions, EveryRow
from ..decode.options import check_context, slots_past_text
from ..decode.base import PROMPT_BUCKET
from ..decode.slots import SlotBatch
from .job import Event, Job, Settings
from .protocol import APIError, Parsed, invalid
from .reply import Reply

log = logging.getLogger("ssd_jax.serve")


class Engine:
  """Runs requests on `pipe` in a thread of its own, up to `max_batch` a batch, with at most `max_queue` waiting.

  spec_settings: SpecOptions fields every request gets (draft_timeout); default_max_tokens: a request's max_tokens
  when it gives none (within the context); gather: seconds a batch waits, once the engine is free, for more requests
  of a burst to arrive; batching: 'continuous' (AR requests join a running batch between calls) or 'static' (every
  batch runs to its end before the next starts)."""

  BATCHING = ("continuous", "static")

  def __init__(self, pipe, max_batch: int = 8, max_queue: int = 64, default_max_tokens: int = 256,
               spec_settings: dict | None = None, gather: float = 0.01, batching: str = "continuous"):
    if max_batch < 1 or max_queue < 1 or default_max_tokens < 1:
      raise ValueError("max_batch, max_queue and default_max_tokens must be >= 1")
    if batching not in self.BATCHING:
      raise ValueError(f"batching must be one of {', '.join(self.BATCHING)}, got {batching!r}")
    self.batching = batching
    # A continuous batch's rows hold at least two prompt buckets and the default max_tokens: one cache shape for most
    # requests (its step costs the same as a smaller one's).
    self.row_tokens = 2 * PROMPT_BUCKET + default_max_tokens
    self._slots: SlotBatch | None = None  # the running continuous batch (its rows' handles are Jobs)
    self._slots_key = None  # its requests' Settings.ar_key()
    self.pipe, self.max_batch, self.max_queue, self.gather = pipe, max_batch, max_queue, gather
    self.default_max_tokens, self.spec_settings = default_max_tokens, dict(spec_settings or {})
    self.context = pipe.target.cfg.max_seq_len
    self._waiting: collections.deque[Job] = collections.deque()
    self._cond = threading.Condition()
    self._stopping = False
    self._batch_seconds = 1.0  # the last batch's time: Retry-After on a full queue
    self._thread = threading.Thread(target=self._loop, name="ssd-jax-engine", daemon=True)

  def start(self) -> None:
    self._thread.start()

  def warm(self) -> float:
    """Compiles, before the first request, the programs most requests run, so that none compiles while clients
    wait: a continuous batch's shapes (every row count up to max_batch; prompts of up to two buckets) and, where
    k='auto' speculates for a request alone, that request's static batch (prompts of up to two buckets whose text
    and default_max_tokens fit one cache shape). Returns the seconds it took."""
    t = time.perf_counter()
    if self.batching == "continuous":
      SlotBatch(self.pipe.decoder("ar"), self.max_batch, min_tokens=self.row_tokens).warm((1, PROMPT_BUCKET + 1))
    if self.pipe.default_mode != "ar":
      spec = self.pipe.spec_options(None, **self.spec_settings)
      for n in (1, PROMPT_BUCKET + 1):
        job = Job([0] * n, Settings(self.pipe.default_mode, False, spec, 0.0, 1.0, None), 1, (), lambda e: None)
        opts = self._options([job])
        dec = self.pipe.batch_decoder([n], job.settings.mode, spec, opts, asked=False)
        if dec.mode != "ar":  # one commit, then its row ends: the batch stops
          dec.generate([job.ids], opts, stream=EveryRow(lambda row, ids: True))
    return time.perf_counter() - t

  def stop(self, timeout: float = 30.0) -> None:
    """Refuses new requests and the waiting ones (503), and waits up to `timeout` s for the running batch."""
    with self._cond:
      self._stopping = True
      left, self._waiting = list(self._waiting), collections.deque()
      self._cond.notify_all()
    for job in left:
      job.send(Event(error=APIError(503, "the server is shutting down", "server_error", code="shutting_down")))
    if self._thread.is_alive():
      self._thread.join(timeout)
      if self._thread.is_alive():
        log.warning("shutting down with a batch still running (past %.0f s)", timeout)

  def settings(self, p: Parsed) -> Settings:
    """Returns a request's Settings, its mode and speculation settings checked against what is loaded."""
    mode = p.mode or self.pipe.default_mode
    if mode != "ar" and self.pipe.draft is None:
      raise invalid(f"mode {mode!r} needs a draft, and this server loaded none (serve.py --draft)", "mode")
    try:
      spec = self.pipe.spec_options(None, k=p.k, fan_out=p.fan_out, **self.spec_settings)
    except ValueError as e:
      raise invalid(str(e), "fan_out" if "fan-out" in str(e) else "k") from None
    return Settings(mode, p.mode is not None, spec, p.temperature, p.top_p, p.seed)

  def job(self, p: Parsed, ids: list[int], deliver: Callable[[Event], None]) -> Job:
    """Returns a Job for a parsed request with these prompt ids, its max_tokens checked against the context (a
    speculative batch needs K+1 slots past the text: up to K_MAX+1 with k='auto')."""
    if max(ids) >= self.pipe.target.cfg.vocab_size or min(ids) < 0:
      raise invalid(f"prompt has token ids outside the vocabulary [0, {self.pipe.target.cfg.vocab_size})", "prompt")
    settings = self.settings(p)
    ahead = slots_past_text(settings.lookahead())
    room = self.context - len(ids) - ahead
    where = "prompt" if p.kind == "completion" else "messages"
    if room < 1:
      raise invalid(f"the prompt has {len(ids)} tokens; this model's context is {self.context} tokens"
                    + (f" ({ahead} kept for speculation)" if ahead else ""), where, "context_length_exceeded")
    max_tokens = min(self.default_max_tokens, room) if p.max_tokens is None else p.max_tokens
    if max_tokens > room:
      raise invalid(f"max_tokens {max_tokens} with the prompt's {len(ids)} tokens exceeds this model's context of "
                    f"{self.context} tokens" + (f" ({ahead} kept for speculation)" if ahead else "")
                    + f"; at most {room}", "max_tokens", "context_length_exceeded")
    return Job(ids, settings, max_tokens, p.stop, deliver)

  def submit(self, job: Job) -> None:
    """Queues `job`; raises APIError 429 (with Retry-After) when max_queue requests wait, 503 when stopping."""
    with self._cond:
      if self._stopping:
        raise APIError(503, "the server is shutting down", "server_error", code="shutting_down")
      if len(self._waiting) >= self.max_queue:
        retry = str(max(1, math.ceil(self._batch_seconds)))
        raise APIError(429, f"the server's queue is full ({self.max_queue} requests waiting); retry later",
                       "rate_limit_error", code="queue_full", headers={"Retry-After": retry})
      self._waiting.append(job)
      self._cond.notify_all()

  def cancel(self, job: Job) -> None:
    """Drops a request whose client went away: out of the queue if it waits; if it runs, its output, and its row
    ends at its next commit (Job.take)."""
    with self._cond:
      job.cancelled = True
      if job in self._waiting:
        self._waiting.remove(job)

  @property
  def waiting(self) -> int:
    return len(self._waiting)

  def _fits(self, jobs: list[Job]) -> bool:
    """Returns whether these requests fit the context as one batch (every prompt with the largest max_tokens)."""
    try:
      check_context(self.context, [len(j.ids) for j in jobs], max(j.max_tokens for j in jobs),
                    jobs[0].settings.lookahead())
    except ValueError:
      return False
    return True

  def _next_batch(self) -> list[Job] | None:
    """Returns the next batch (the oldest waiting request and those that can join it), waiting for one; None when
    stopping."""
    with self._cond:
      while not self._waiting and not self._stopping:
        self._cond.wait()
      deadline = time.monotonic() + self.gather  # a burst's other requests arrive within this
      while len(self._waiting) < self.max_batch and not self._stopping and time.monotonic() < deadline:
        self._cond.wait(deadline - time.monotonic())
      if self._stopping:
        return None
      batch = [self._waiting.popleft()]
      for job in list(self._waiting):
        if len(batch) < self.max_batch and job.key == batch[0].key and self._fits(batch + [job]):
          batch.append(job)
          self._waiting.remove(job)
      return batch

  def _loop(self) -> None:
    while True:
      if self._slots is not None:
        self._continue()
        continue
      batch = self._next_batch()
      if batch is None:
        return
      t = time.perf_counter()
      try:
        self._start(batch)
      except Exception as e:  # a failed batch fails its requests, not the server
        self._slots = None
        self._fail(batch, e)
      self._batch_seconds = time.perf_counter() - t

  def _fail(self, jobs: list[Job], e: Exception) -> None:
    """Answers every request of a failed batch that has not ended with a 500 (a stream: an error event)."""
    log.exception("a batch of %d failed", len(jobs))
    err = APIError(500, f"the batch failed: {type(e).__name__}: {e}", "server_error")
    for job in jobs:
      if job.reply is None or job.reply.finish is None:
        job.send(Event(error=err))

  def _options(self, jobs: list[Job]) -> DecodeOptions:
    """Returns the DecodeOptions of a batch of these requests (their settings agree)."""
    s, n = jobs[0].settings, max(j.max_tokens for j in jobs)
    if s.temperature == 0 or s.seed is None:
      # The batch runs to default_max_tokens at least (within the context): each row still ends at its own
      # max_tokens (Job.take), and most batches then share one cache shape, whose programs warm() compiles. A seeded
      # sample keeps its own, so that its K (k='auto' reads the run's length) and draws are decode.py's.
      room = self.context - max(len(j.ids) for j in jobs) - slots_past_text(s.lookahead())
      n = max(n, min(self.default_max_tokens, room))
    return DecodeOptions(max_new_tokens=n, temperature=s.temperature, top_p=s.top_p,
                         seed=secrets.randbits(63) if s.seed is None else s.seed, eos_id=self.pipe.tokenizer.eos_ids)

  def _start(self, batch: list[Job]) -> None:
    """Runs a new batch: as a continuous AR batch where its requests may join one and it runs AR, else static."""
    s, opts = batch[0].settings, self._options(batch)
    if self.batching == "continuous" and s.joins() and len(batch) > 1:
      # Several requests at once: AR, whose batch the next ones join (k='auto' may pick SD for a batch of two, but a
      # static SD batch makes every later request wait for its end; serve_bench on the 2-core EPYC VM: continuous AR
      # 1.2x its throughput at 4 clients).
      dec = self.pipe.decoder("ar")
      dec.check([len(j.ids) for j in batch], opts.max_new_tokens)
    else:
      dec = self.pipe.batch_decoder([len(j.ids) for j in batch], s.mode, s.spec, opts, s.asked)
    if self.batching == "continuous" and dec.mode == "ar" and s.joins():
      self._slots = SlotBatch(dec, self.max_batch, s.temperature, s.top_p, opts.seed, min_tokens=self.row_tokens)
      self._slots_key = s.ar_key()
      self._t_slots = time.perf_counter()
      self._insert(batch, opts)
    else:
      self._run(batch, dec, opts)

  def _insert(self, jobs: list[Job], opts: DecodeOptions) -> None:
    """Puts requests into free rows of the running continuous batch and sends each its first token."""
    slots = self._slots
    for job in jobs:
      job.reply = Reply(self.pipe.tokenizer, job.max_tokens, job.stop, opts.stop_ids)
      job.info = {"mode": "ar", "k": 0, "fan_out": None, "batch_rows": slots.live + len(jobs),
                  "batching": "continuous", "requested": _requested(job.settings)}
    first = slots.insert(jobs, [j.ids for j in jobs], [j.max_tokens for j in jobs])
    for job in jobs:
      if job.take([first[job]]):
        self._end(job)

  def _end(self, job: Job) -> None:
    """Frees a continuous row whose request ended (sending its end if the reply has not)."""
    self._slots.remove(job)
    if not job.cancelled and job.reply.finish is None:
      job.send(job.ending(job.reply.end()))

  def _admit(self) -> list[Job]:
    """Takes the waiting requests that may join the running continuous batch, oldest first, into its free rows; the
    first that may not stops the taking (the batch then drains and that request runs next)."""
    with self._cond:
      out = []
      while (self._waiting and not self._stopping and len(out) < self._slots.free
             and self._waiting[0].settings.joins() and self._waiting[0].settings.ar_key() == self._slots_key):
        out.append(self._waiting.popleft())
      return out

  def _continue(self) -> None:
    """One call of the running continuous batch: new requests join, every row steps, ended rows leave."""
    slots, rows = self._slots, [h for h in self._slots.handles if h is not None]
    try:
      joining = self._admit()
      if joining:
        rows += joining
        self._insert(joining, self._options(joining))
      for job, ids in slots.step().items():
        job.info["batch_rows"] = max(job.info["batch_rows"], slots.live)
        if job.take(ids):
          self._end(job)
    except Exception as e:  # the batch is lost: its requests fail, the server goes on
      self._fail(rows, e)
      self._slots = None
      return
    if not slots.live:
      self._slots = None
      self._batch_seconds = time.perf_counter() - self._t_slots

  def _run(self, batch: list[Job], dec, opts: DecodeOptions) -> None:
    """Runs one static batch on `dec` and ends each of its requests."""
    s, tok = batch[0].settings, self.pipe.tokenizer
    info = {"mode": dec.mode, "k": dec.k, "fan_out": _plain(dec.spec.fan_out) if dec.mode == "ssd" else None,
            "batch_rows": len(batch), "batching": "static", "requested": _requested(s)}
    for job in batch:
      job.reply, job.info = Reply(tok, job.max_tokens, job.stop, opts.stop_ids), info
    results = dec.generate([j.ids for j in batch], opts, stream=EveryRow(lambda row, ids: batch[row].take(ids)))
    lost = results[0].stats.extra.get("draft_lost")
    if lost:
      log.warning("the draft side was lost in a batch of %d (%s): the target finished it alone (AR); the next "
                  "batch starts it again", len(batch), lost)
    for job in batch:
      if job.reply.finish is None:
        job.send(job.ending(job.reply.end()))


def _requested(s: Settings) -> dict:
  """Returns what a request asked for, as its answer reports it (None: the server's default mode)."""
  return {"mode": s.mode if s.asked else None, "k": s.spec.k, "fan_out": _plain(s.spec.fan_out)}


def _plain(fan_out):
  """Returns a fan-out as JSON writes it: an int, or a list of K+1 counts."""
  return list(fan_out) if isinstance(fan_out, tuple) else fan_out
