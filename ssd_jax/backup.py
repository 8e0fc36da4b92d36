"""Backup speculators for SSD cache misses, each with the exact proposal distribution the verifier needs.

- neural: the draft run just in time (decode/sd.draft_propose); q = the draft's processed distribution.
- fast:   uniformly random tokens; q = uniform over the vocabulary, so the ratio test stays exact.
- ngram:  prompt lookup: the K tokens that followed the latest earlier occurrence of the text's last n-gram;
          a deterministic proposal, so q = a point mass on each proposed token (accepted with probability p(s),
          residual p without s): exact as well.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

BACKUPS = ("auto", "neural", "fast", "ngram")


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
