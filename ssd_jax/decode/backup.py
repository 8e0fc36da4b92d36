"""Backup speculators for SSD cache misses, each with the exact proposal distribution the verifier needs.

- neural: the draft run just in time (decode/steps.draft_propose); q = the draft's processed distribution.
- fast:   uniformly random tokens; q = uniform over the vocabulary, so the ratio test stays exact.
- ngram:  prompt lookup: the K tokens that followed the latest earlier occurrence of the text's last n-gram;
          a deterministic proposal, so q = a point mass on each proposed token (accepted with probability p(s),
          residual p without s): exact as well.
- auto:   neural or fast, chosen before each miss by Theorem 17 from the run's measured statistics (`choose_backup`).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from ..theory.timing_model import neural_backup_better


@functools.partial(jax.jit, static_argnames=("batch", "k", "vocab"))
def random_speculation(key, batch: int, k: int, vocab: int):
  """Returns (tokens [B, K] uniform over the vocabulary, q [B, K, V] = 1/V)."""
  toks = jax.random.randint(key, (batch, k), 0, vocab, dtype=jnp.int32)
  return toks, jnp.full((batch, k, vocab), 1.0 / vocab, jnp.float32)


@functools.partial(jax.jit, static_argnames=("vocab",))
def point_mass(tokens, vocab: int):
  """Returns q [B, K, V]: a one-hot on each proposed token (a deterministic proposal)."""
  return jax.nn.one_hot(tokens, vocab, dtype=jnp.float32)


def ngram_propose(seq, k: int, n_max: int = 3) -> list[int]:
  """Returns K tokens continuing the latest earlier match of the longest suffix n-gram (n_max..1) of `seq`.

  Without any match it repeats the last token (still a deterministic, hence exact, proposal).
  """
  s = np.asarray(seq)
  for n in range(min(n_max, len(s) - 1), 0, -1):
    tail = s[-n:]
    # Latest start i < len - n with s[i:i+n] == tail.
    win = np.lib.stride_tricks.sliding_window_view(s[:-1], n)
    idx = np.flatnonzero((win == tail).all(1))
    idx = idx[idx + n < len(s)]
    if len(idx):
      start = int(idx[-1]) + n
      cont = s[start:start + k].tolist()
      while len(cont) < k:
        cont.append(cont[-1] if cont else int(s[-1]))
      return cont
  return [int(s[-1])] * k


def new_tally() -> dict:
  """Running statistics for the automatic backup choice (Theorem 17), per row of each verified round: rows served
  from the cache (hit), rows that missed it (miss: any backup) and, of those, rows the neural backup served; the
  neural backup's calls and seconds (one call drafts for the whole batch) and the verifies' seconds."""
  return {"hit_rows": 0, "hit_tokens": 0, "miss_rows": 0, "neural_rows": 0, "neural_tokens": 0, "neural_calls": 0,
          "neural_s": 0.0, "verify_s": 0.0, "verify_n": 0}


def record_round(tally: dict, backup_kind: str, live, seqs, lens_before, row_hit=None) -> None:
  """Counts a verified round's live rows and the tokens each committed: a row with `row_hit` as a hit, another as a
  miss served by `backup_kind` ('neural', 'fast', 'ngram'); `row_hit` None: the first round, which no cache lookup
  served (its rows count only toward the backup's tokens)."""
  for i in np.flatnonzero(live):
    tokens = len(seqs[i]) - int(lens_before[i])
    if row_hit is not None and row_hit[i]:
      tally["hit_rows"] += 1
      tally["hit_tokens"] += tokens
      continue
    tally["miss_rows"] += row_hit is not None
    if backup_kind == "neural":
      tally["neural_rows"] += 1
      tally["neural_tokens"] += tokens


def choose_backup(setting: str, tally: dict, batch: int) -> str:
  """Returns the backup for the next miss: `setting` itself, or for 'auto' the Theorem 17 choice for `batch` live
  rows from `tally` (p_hit and tokens per row, the neural call's time in units of one verify), neural until hits,
  neural rows and verifies have each been seen twice."""
  if setting != "auto":
    return setting
  t = tally
  if t["neural_rows"] < 2 or t["hit_rows"] < 2 or t["verify_n"] < 2 or t["neural_calls"] < 1:
    return "neural"  # gather statistics first
  t_verify = t["verify_s"] / t["verify_n"]
  better = neural_backup_better(batch, t["hit_rows"] / (t["hit_rows"] + t["miss_rows"]),
                                t["hit_tokens"] / t["hit_rows"], t["neural_tokens"] / t["neural_rows"],
                                t["neural_s"] / t["neural_calls"] / t_verify)
  return "neural" if better else "fast"
