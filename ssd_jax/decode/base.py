"""What every decoder shares: results, batching of ragged prompts, cache sizing, compiled programs, SpecBook."""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
import weakref
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ..models.kv_cache import round_slots
from .metrics import RequestStats
from .options import DecodeOptions


@dataclasses.dataclass
class DecodeResult:
  token_ids: list[int]          # new tokens (EOS included when it was produced)
  stats: RequestStats


PROMPT_BUCKET = 64


def pad_prompts(prompts: Sequence[Sequence[int]], bucket: int = PROMPT_BUCKET):
  """Returns (tokens [B, T_pad] int32, lengths [B] int32), right-padded, T_pad a multiple of `bucket`."""
  if not prompts:
    raise ValueError("no prompts given")
  lens = [len(p) for p in prompts]
  if min(lens) < 1:
    raise ValueError("empty prompt: every prompt needs at least one token")
  t = round_slots(max(lens), bucket)
  out = np.zeros((len(prompts), t), np.int32)
  for i, p in enumerate(prompts):
    out[i, : len(p)] = p
  return out, np.asarray(lens, np.int32)


def cache_slots(max_prompt: int, max_new: int, lookahead: int = 0) -> int:
  """Returns the cache size for a batch (check_context has checked it fits); lookahead = extra scratch slots."""
  need = max_prompt + max_new + lookahead
  return round_slots(max(need, max_prompt + PROMPT_BUCKET), 128)


def chunk_lookahead(k: int, n: int) -> int:
  """Returns the cache slots past a row's text that SD in chunks of n rounds (sd_chunk.py) may write: a row done in
  a chunk's first round (that round up to K tokens past max_new_tokens) takes n - 1 more, each writing K+1 entries."""
  return n * (k + 1) + k + 2


def run_lookaheads(k: int, fan_out=None, sd_chunk: int = 1, ar_chunk: int = 4) -> tuple[int, int]:
  """Returns the cache slots past a row's text that (the target, the draft) may write in a run of K draft tokens a
  round, the one place every decoder and the memory sizer (memory_check.run_slots) read them from: a verify writes
  K+1 entries past the text, and one more slot is kept (K+2); AR (K=0) in chunks of ar_chunk steps writes up to a
  chunk past a row's end (ar_chunk + 2); SD in chunks of sd_chunk rounds what a chunk may write (chunk_lookahead);
  SSD's tree draft (fan_out given) its tree's scratch slots (steps.tree_lookahead); any other draft as the target.
  These bound a live row's writes; a finished row keeps verifying at its frozen length (up to 2K past its text at
  K >= 3, measured in tests/cache_writes.py's runs), harmless: its cache is never read again."""
  from .steps import tree_lookahead

  target = chunk_lookahead(k, sd_chunk) if k and sd_chunk > 1 else max(k, 1 if k else ar_chunk) + 2
  return target, tree_lookahead(k, tuple(fan_out)) if fan_out else target


# (row, new token ids) for the first request of a batch; returning True ends the row (SpecBook.end): its listener
# needs no more of it
StreamFn = Callable[[int, list[int]], "bool | None"]


class EveryRow:
  """A stream callback that hears every row of a batch: (row, new token ids) as each row commits them, where a plain
  StreamFn hears the first row only (a server streams each of its requests from one batch)."""

  def __init__(self, fn: StreamFn):
    self.fn = fn

  def __call__(self, row: int, ids: list[int]) -> bool | None:
    return self.fn(row, ids)


def hears(stream, row: int) -> bool:
  """Returns whether `stream` (None, a StreamFn or an EveryRow) is told row `row`'s tokens."""
  return stream is not None and (row == 0 or isinstance(stream, EveryRow))


def _placement_key(x):
  """Returns a canonical description of where an array lives (equivalent shardings give equal keys)."""
  sh = getattr(x, "sharding", None)
  if sh is None:
    return None
  try:
    hlo = str(sh._to_xla_hlo_sharding(np.ndim(x)))  # canonical: P() and P(None, None) are both "{replicated}"
  except Exception:  # an API change: fall back to the repr (at worst a spurious recompile)
    hlo = str(sh)
  return (tuple(sorted(d.id for d in sh.device_set)), hlo)


def _mesh_of(leaves):
  """Returns a context that sets the mesh the arguments live on (the target's tensor-parallel mesh), so that kernels
  XLA cannot partition (Pallas) split themselves over it (kernels/masked_attention/pallas.py); else no context."""
  for x in leaves:
    sh = getattr(x, "sharding", None)
    if isinstance(sh, jax.sharding.NamedSharding) and sh.mesh.size > 1:
      return jax.set_mesh(sh.mesh)
  return contextlib.nullcontext()


def _forget(cache: dict, i: int, ref) -> None:
  """Drops a dead array's entry from Programs' key cache (unless the id is already another array's)."""
  hit = cache.get(i)
  if hit is not None and hit[0] is ref:
    del cache[i]


class Programs:
  """Ahead-of-time compiled programs, keyed by the shapes and static arguments of each call.

  Compilation happens outside the timed decode loop, its time is reported separately (`compile_seconds`), and a
  decode loop that would need a new program shows up as a new key (tests count them).
  """

  def __init__(self):
    self._compiled = {}
    self._shardings = {}  # (id(sharding), ndim) -> (sharding, canonical key)
    self._leaves = {}  # id(array) -> (weak reference to it, its key): dropped when the array dies
    self._stable = {}  # (fn, static, the other arguments' shapes) -> program, for calls with stable leading arguments
    self.compile_seconds = 0.0
    self.compiles = 0

  def __call__(self, fn, *args, stable: int = 0, **static):
    """Runs fn's program on args. stable > 0: the first `stable` arguments (params, a cache) come back with the same
    shapes and places call after call, so once a program ran they are not keyed again (the target's ~760 leaves
    cost ~0.3 ms a step), only the others' shapes are; an input that does not match that program after all is
    refused by it before it runs (TypeError, ValueError), and then the call is looked up in full."""
    if not stable:
      return self.compile_only(fn, *args, **static)(*args)
    leaves, treedef = jax.tree.flatten(args[stable:])
    key = (fn, treedef, tuple((np.shape(x), getattr(x, "dtype", None)) for x in leaves), tuple(sorted(static.items())))
    exe = self._stable.get(key)
    if exe is not None:
      try:
        return exe(*args)
      except (TypeError, ValueError):
        pass
    exe = self._stable[key] = self.compile_only(fn, *args, **static)
    return exe(*args)

  def _sharding_key(self, x):
    sh = x.sharding
    k = (id(sh), x.ndim)
    hit = self._shardings.get(k)
    if hit is None or hit[0] is not sh:
      hit = (sh, _placement_key(x))
      self._shardings[k] = hit
    return hit[1]

  def _leaf_key(self, x):
    """Returns (shape, dtype, placement) of one argument. An array's is kept while the array lives, found by its
    identity (checked through a weak reference): the params are the same arrays every call (the SmolLM2 target in
    its blocks has 693 leaves; their keys cost ~0.35 ms a call on the 2-core Xeon, a lookup ~0.1)."""
    hit = self._leaves.get(id(x))
    if hit is not None and hit[0]() is x:
      return hit[1]
    if not isinstance(x, jax.Array):
      return (np.shape(x), str(jnp.result_type(x)), None)
    k = (x.shape, x.dtype, self._sharding_key(x))
    try:
      self._leaves[id(x)] = (weakref.ref(x, functools.partial(_forget, self._leaves, id(x))), k)
    except TypeError:  # an array type without weak references: not cached
      pass
    return k

  def compile_only(self, fn, *args, **static):
    """Returns the compiled program for these argument shapes, compiling it on first use."""
    leaves, treedef = jax.tree.flatten(args)
    # Placement is part of the key: the same function compiled for the target's and the draft's device differs.
    # This runs every decode step over all parameter leaves, so it must be cheap: shardings are canonicalised once
    # per sharding object (kept alive here, so their ids stay valid), and each array's key once while it lives.
    key = (fn, treedef, tuple(map(self._leaf_key, leaves)), tuple(sorted(static.items())))
    exe = self._compiled.get(key)
    if exe is None:
      import time
      t = time.perf_counter()
      with _mesh_of(leaves):
        exe = fn.lower(*args, **static).compile()
      self.compile_seconds += time.perf_counter() - t
      self.compiles += 1
      self._compiled[key] = exe
    return exe


class SpecBook:
  """Per-row bookkeeping shared by the speculative decoders: committed text, stopping, acceptance statistics."""

  def __init__(self, prompts, first, opts: DecodeOptions, k: int, now: float):
    b = len(prompts)
    self.opts, self.k = opts, k
    self.out = [[int(first[i])] for i in range(b)]
    self.seqs = [list(p) + [int(first[i])] for i, p in enumerate(prompts)]
    self.done = np.array([opts.cut_at_stop(self.out[i])[1] or opts.max_new_tokens <= 1 for i in range(b)])
    self.ended = np.zeros(b, bool)  # rows ended from outside (end): done, though no stop or length ended them
    self.forwards = np.ones(b, np.int64)    # target forwards, prefill included
    self.finish = np.full(b, now)
    self.accepted = np.zeros((b, k), np.int64)  # rounds in which draft position j was accepted
    self.reached = np.zeros((b, k), np.int64)   # rounds in which draft position j was tried

  def state(self, n: int = 2):
    """Returns (last n committed tokens [B, n], left-padded with 0 where a text is shorter, committed lengths L [B])
    as int32 arrays."""
    last = np.zeros((len(self.seqs), n), np.int32)
    for i, s in enumerate(self.seqs):
      tail = s[-n:]
      last[i, n - len(tail):] = tail
    return last, np.asarray([len(s) for s in self.seqs], np.int32)

  def commit(self, accept_len, bonus, drafts, now: float, stream=None):
    """Commits a verified round: accepted drafts plus the bonus, cut at EOS and max_new_tokens. Without drafts
    (AR, K = 0) each committed token took one target forward, also in a chunk of steps (`drafts` then holds the
    tokens the target made before the bonus); a speculative round is one forward."""
    drafted = np.shape(drafts)[-1] > 0  # a round with drafts (the target alone, rounds.finish_alone, has none)
    for i in np.flatnonzero(~self.done):
      a = int(accept_len[i])
      if drafted:
        self.reached[i, : min(a + 1, self.k)] += 1
        self.accepted[i, :a] += 1
      new = drafts[i, :a].tolist() + [int(bonus[i])]
      new, stopped = self.opts.cut_at_stop(new[: self.opts.max_new_tokens - len(self.out[i])])
      self.forwards[i] += len(new) if self.k == 0 else 1
      self.out[i] += new
      self.seqs[i] += new
      if stopped or len(self.out[i]) >= self.opts.max_new_tokens:
        self.done[i] = True
        self.finish[i] = now
      if hears(stream, i) and stream(int(i), new) is True:  # the listener needs no more of this row
        self.end([i], now)

  def end(self, rows, now: float | None = None) -> None:
    """Ends `rows` from outside (a request that a server finished at its own stop string, or whose client went
    away): each stays in the batch, inactive (its verify ignored, as a done row's), and the run ends once every row
    is done. A draft side that keeps its own book is told with the outcome (speculator.Outcome.ended)."""
    now = time.perf_counter() if now is None else now
    rows = np.asarray(rows)
    for i in (np.flatnonzero(rows) if rows.dtype == bool else rows.astype(np.int64).ravel()):
      if not self.done[i]:
        self.done[i], self.ended[i], self.finish[i] = True, True, now

  def results(self, mode: str, t_prefill: float, t_start: float, extra_of) -> list[DecodeResult]:
    """Returns one DecodeResult per row; extra_of(i) adds mode-specific statistics."""
    res = []
    for i in range(len(self.out)):
      extra = self._acceptance(i) if self.k else {}  # AR (K = 0) has no drafts to count
      extra.update(extra_of(i))
      res.append(DecodeResult(self.out[i], RequestStats(
          mode=mode, new_tokens=len(self.out[i]), target_forwards=int(self.forwards[i]), prefill_seconds=t_prefill,
          decode_seconds=float(self.finish[i] - t_start), extra=extra)))
    return res

  def _acceptance(self, i: int) -> dict:
    """Returns row i's rounds and acceptance statistics."""
    rounds = int(self.forwards[i] - 1)
    return {"k": self.k, "rounds": rounds,
            "acceptance_rate": round(float(self.accepted[i].sum() / max(rounds * self.k, 1)), 4),
            "per_position_acceptance": (self.accepted[i] / np.maximum(self.reached[i], 1)).round(4).tolist(),
            "mean_accepted_per_round": round(float(self.accepted[i].sum() / max(rounds, 1)), 4),
            # The per-token acceptance a of the paper's i.i.d. model: drafts accepted over drafts the verifier
            # reached (a draft after a rejection is never tried). acceptance_rate (over all K drafts of each
            # round) is not a: for K=2 it is (a + a^2) / 2.
            "drafts_tried": int(self.reached[i].sum()), "drafts_accepted": int(self.accepted[i].sum()),
            "per_token_acceptance": round(float(self.accepted[i].sum() / max(self.reached[i].sum(), 1)), 4)}
