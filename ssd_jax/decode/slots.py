"""Continuous batching of autoregressive rows: rows join and leave a running batch between calls (insert / step).

A server's requests arrive at any time and end at different lengths. `SlotBatch` keeps one target KV cache whose rows
are slots: `insert` prefills new prompts on their own (one prefill for all of them) and copies their cache rows into
free slots while the other rows keep their text; `step` runs `ar_chunk` (n AR steps in one program) over every slot,
the free ones inactive; `remove` frees a row at once. The batch's shape follows its rows: it grows to the next power
of two rows (up to `max_rows`) when a request joins a full one, shrinks to half when half of it is free, and widens
its cache's slots (in powers of two of 128) when a row's text would pass them, so a lone request steps at batch 1
and a few shapes serve every mix (each shape compiles once; `warm` compiles them before the first request).

Exactness: a row's greedy tokens are those of the same prompt decoded alone (AR, or Pipeline.generate), whatever
joins or leaves around it: a row's prefill, its cache and its steps read only its own row, and the kernels compute
a row the same bit for bit in any batch on a CPU (README "What exact means"). Sampled rows draw from keys per call
and row (`sampling.row_keys`), fresh for each SlotBatch's seed: a sample of the target's law, not the one a seed
gives in decode.py (a row's draws depend on the batch it is in).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from ..kernels.platform import device_platform
from ..models.kv_cache import KVCache, round_slots
from .base import PROMPT_BUCKET, pad_prompts, run_lookaheads
from .steps import VERIFY_STREAM, ar_chunk, first_tokens, fold, fold_steps, prefill, stream_key

INSERT_STREAM = 0x1A5E  # the first tokens of inserted rows draw from their own stream


def slots_for(tokens: int) -> int:
  """Returns the cache slots of a SlotBatch holding `tokens` per row: a power of two times 128, so that a few cache
  shapes (and compiled programs) serve every length."""
  s = 128
  while s < tokens:
    s *= 2
  return s


def rows_for(n: int, max_rows: int) -> int:
  """Returns the batch rows for n live rows: the next power of two, at most max_rows."""
  r = 1
  while r < n:
    r *= 2
  return min(r, max_rows)


@functools.partial(jax.jit, static_argnames=("rows", "slots"))  # a new shape: nothing to donate to
def reshape_cache(cache: KVCache, keep, rows: int, slots: int) -> KVCache:
  """Returns a cache of `rows` rows and `slots` slots whose row i is `cache`'s row keep[i] (keep [rows] int32; a
  free row may take any: it is inactive until a prompt is inserted there), each row's entries at the same slots."""
  def move(a):
    a = a[keep]
    pad = slots - a.shape[1]
    return jnp.pad(a, ((0, 0), (0, pad), (0, 0), (0, 0))) if pad > 0 else a[:, :slots]

  return KVCache(k=[move(a) for a in cache.k], v=[move(a) for a in cache.v], lengths=cache.lengths[keep])


@functools.partial(jax.jit, donate_argnames=("cache",))
def put_rows(cache: KVCache, fresh: KVCache, rows) -> KVCache:
  """Returns `cache` with rows `rows` [n] replaced by `fresh`'s n rows (its slots, fewer or as many, from slot 0)."""
  s = fresh.num_slots

  def put(a, b):
    return a.at[rows, :s].set(b.astype(a.dtype))

  return KVCache(k=[put(a, b) for a, b in zip(cache.k, fresh.k)], v=[put(a, b) for a, b in zip(cache.v, fresh.v)],
                 lengths=cache.lengths.at[rows].set(fresh.lengths))


class SlotBatch:
  """A running batch of AR rows on `dec`'s target (an ARDecoder, e.g. Pipeline.decoder('ar')): `insert` new prompts
  into free rows, `step` every live row n tokens, `remove` a row. Rows are named by the caller's handles (any
  hashable); `step` returns each live handle's new tokens.

  temperature and top_p are the batch's (every row samples the same way); seed fixes its draws; chunk: AR steps a
  call (a row that ends mid-call has written past its text into its own slots, which nobody reads again);
  min_tokens: the slots a row gets at least (slots_for), so that requests of different lengths share one cache
  shape (a step's cost hardly depends on its slots past the rows' lengths: 9.2 / 8.8 / 9.3 ms a token at batch 1
  with 128 / 512 / 1024 slots, SmolLM2-135M on the 2-core EPYC VM)."""

  def __init__(self, dec, max_rows: int, temperature: float = 0.0, top_p: float = 1.0, seed: int = 0,
               chunk: int = 4, min_tokens: int = 0):
    if max_rows < 1 or chunk < 1:
      raise ValueError("max_rows and chunk must be >= 1")
    pl, cfg = dec.placement, dec.tcfg
    self.dec, self.max_rows, self.chunk, self.programs = dec, max_rows, chunk, dec.programs
    self.min_slots = slots_for(min_tokens)
    self.fetch, self.rep = pl.fetch, pl.to_target
    self.st = dict(cfg=cfg, attn_impl=dec.attn_impl, feature_layers=dec.feature_layers,
                   platform=device_platform(pl.target_mesh))
    self.ahead = run_lookaheads(0, ar_chunk=chunk)[0]  # what a chunk may write past a row's text
    self.temp, self.top_p = self.rep(jnp.float32(temperature)), self.rep(jnp.float32(top_p))
    self.root, self.insert_root = (self.rep(stream_key(seed, s)) for s in (VERIFY_STREAM, INSERT_STREAM))
    self.rows, self.slots, self.cache = 0, 0, None
    self.handles: list = []            # a handle per row, None where the row is free
    self.last = np.zeros(0, np.int32)  # the token each row's text ends with (the next step's input)
    self.length = np.zeros(0, np.int64)  # each row's text so far: prompt and tokens made
    self.bound = np.zeros(0, np.int64)   # the slots each row was inserted for (its prompt and max_new_tokens)
    self.calls = self.inserts = 0

  @property
  def live(self) -> int:
    return sum(h is not None for h in self.handles)

  @property
  def free(self) -> int:
    """Rows a caller may still insert (up to max_rows)."""
    return self.max_rows - self.live

  def need(self, prompt_len: int, max_new_tokens: int) -> int:
    """Returns the slots a row of this prompt and max_new_tokens needs (its text and what a chunk writes past it)."""
    return prompt_len + max_new_tokens + self.ahead

  def insert(self, handles: list, prompts: list, max_new_tokens: list) -> dict:
    """Prefills `prompts` (token-id lists) together and puts each in a free row under its handle; returns each
    handle's first token. The batch grows (rows; slots for each prompt and its max_new_tokens) as needed;
    ValueError past max_rows. The prefill's batch is padded to a power of two (a copy of the last prompt), so that
    a few programs serve every burst."""
    if len(handles) > self.free:
      raise ValueError(f"{len(handles)} rows asked for, {self.free} free")
    n = len(prompts)
    tokens, lengths = pad_prompts(list(prompts) + [prompts[-1]] * (rows_for(n, 1 << 30) - n))
    need = max([self.need(len(p), m) for p, m in zip(prompts, max_new_tokens)] + [tokens.shape[1]])
    self._reshape(rows_for(self.live + n, self.max_rows), max(self.slots, self.min_slots, slots_for(need)))
    run, p, cfg = self.programs, self.dec.tparams, self.dec.tcfg
    fresh = self.dec.placement.target_cache(cfg, len(tokens), round_slots(tokens.shape[1], 128), self.dec.kv_dtype)
    logits, fresh, *_ = run(prefill, p, self.rep(tokens), self.rep(lengths), fresh, **self.st)
    first = self.fetch(run(first_tokens, p, logits, fold(self.insert_root, self.inserts), self.temp, self.top_p,
                           cfg=cfg))
    self.inserts += 1
    where = [i for i, h in enumerate(self.handles) if h is None][:n]
    where += [where[-1]] * (len(tokens) - n)  # the padding's rows land where the last prompt's does, the same
    self.cache = run(put_rows, self.cache, fresh, self.rep(np.asarray(where, np.int32)))
    out = {}
    for i, h, prompt, tok, m in zip(where, handles, prompts, first, max_new_tokens):
      self.handles[i], self.last[i], self.length[i], self.bound[i] = h, tok, len(prompt) + 1, self.need(len(prompt), m)
      out[h] = int(tok)
    return out

  def step(self) -> dict:
    """Runs `chunk` AR steps over every live row; returns each live handle's new tokens (a list of chunk ids)."""
    if not self.live:
      return {}
    need = int(self.length.max()) + self.ahead  # a row kept past the max_new_tokens it came with: room for it
    if need > self.slots:
      self._reshape(self.rows, slots_for(need))
    run = self.programs
    active = self.rep(np.asarray([h is not None for h in self.handles]))
    keys = fold_steps(self.root, self.calls * self.chunk + 1, self.chunk)
    _, bonus, made, self.cache = run(ar_chunk, self.dec.tparams, self.cache, self.rep(self.last), active, keys,
                                     self.temp, self.top_p, n=self.chunk, **self.st)
    self.calls += 1
    toks = np.concatenate([self.fetch(made), self.fetch(bonus)[:, None]], axis=1)
    out = {}
    for i, h in enumerate(self.handles):
      if h is not None:
        self.last[i], self.length[i] = toks[i, -1], self.length[i] + self.chunk
        out[h] = [int(t) for t in toks[i]]
    return out

  def remove(self, handle) -> None:
    """Frees the row of `handle` at once. The batch shrinks to half its rows once half of them are free, and to the
    slots its live rows were inserted for once the longest has left."""
    i = self.handles.index(handle)
    self.handles[i], self.length[i], self.bound[i] = None, 0, 0
    if self.live == 0:
      self.rows, self.slots, self.cache, self.handles = 0, 0, None, []
      self.last, self.length, self.bound = np.zeros(0, np.int32), np.zeros(0, np.int64), np.zeros(0, np.int64)
      return
    rows = rows_for(self.live, self.max_rows) if self.live <= self.rows // 2 else self.rows
    slots = slots_for(int(max(self.bound.max(), self.length.max() + self.ahead)))
    self._reshape(rows, max(self.min_slots, min(slots, self.slots)))

  def _reshape(self, rows: int, slots: int) -> None:
    """Moves the live rows into a cache of `rows` rows and `slots` slots (the first rows, in their order)."""
    if (rows, slots) == (self.rows, self.slots):
      return
    live = [i for i, h in enumerate(self.handles) if h is not None]
    if self.cache is None:
      self.cache = self.dec.placement.target_cache(self.dec.tcfg, rows, slots, self.dec.kv_dtype)
    else:
      keep = np.asarray(live + [0] * (rows - len(live)), np.int32)
      self.cache = self.programs(reshape_cache, self.cache, self.rep(keep), rows=rows, slots=slots)
    pad = rows - len(live)
    self.handles = [self.handles[i] for i in live] + [None] * pad
    self.last = np.concatenate([self.last[live], np.zeros(pad, np.int32)]).astype(np.int32)
    self.length = np.concatenate([self.length[live], np.zeros(pad, np.int64)])
    self.bound = np.concatenate([self.bound[live], np.zeros(pad, np.int64)])
    self.rows, self.slots = rows, slots

  def warm(self, prompt_lens=(1,)) -> float:
    """Compiles, before the first request, the programs of every batch shape up to max_rows at min_tokens' slots
    (rows that fit them) and of prefills of prompts in these lengths' buckets; returns the seconds it took."""
    run, p, cfg, dt = self.programs, self.dec.tparams, self.dec.tcfg, self.dec.kv_dtype
    before, slots = run.compile_seconds, self.min_slots
    widths = sorted({round_slots(max(1, n), PROMPT_BUCKET) for n in prompt_lens})
    shapes = sorted({rows_for(n, self.max_rows) for n in range(1, self.max_rows + 1)})
    for rows in shapes:
      cache = self.dec.placement.target_cache(cfg, rows, slots, dt)
      run.compile_only(ar_chunk, p, cache, self.rep(np.zeros(rows, np.int32)), self.rep(np.ones(rows, bool)),
                       fold_steps(self.root, 1, self.chunk), self.temp, self.top_p, n=self.chunk, **self.st)
      for to in shapes:  # growing and shrinking between any two shapes
        if to != rows:
          run.compile_only(reshape_cache, cache, self.rep(np.zeros(to, np.int32)), rows=to, slots=slots)
      for n in (r for r in shapes if r <= rows):  # a prefill of n (padded) prompts put into this batch
        for t in widths:
          fresh = self.dec.placement.target_cache(cfg, n, round_slots(t, 128), dt)
          run.compile_only(prefill, p, self.rep(np.zeros((n, t), np.int32)), self.rep(np.ones(n, np.int32)), fresh,
                           **self.st)
          run.compile_only(put_rows, cache, fresh, self.rep(np.zeros(n, np.int32)))
      run.compile_only(first_tokens, p, self.rep(jnp.zeros((rows, cfg.out_vocab))), fold(self.insert_root, 0),
                       self.temp, self.top_p, cfg=cfg)
    return run.compile_seconds - before
