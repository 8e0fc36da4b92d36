"""The draft's reduced vocabulary: which token ids its head (tied to its embedding) can propose and read."""
from __future__ import annotations

import numpy as np


def _token_counts(ids: np.ndarray, mask: np.ndarray, vocab_size: int) -> np.ndarray:
  """How often each token id is a loss-masked target, ties broken by its overall frequency."""
  counts = np.bincount(ids[mask.astype(bool)].astype(np.int64), minlength=vocab_size).astype(np.float64)
  return counts + 1e-3 * np.bincount(ids.astype(np.int64), minlength=vocab_size)


def choose_head_vocab(ids: np.ndarray, mask: np.ndarray, vocab_size: int, size: int, always=(0, 1, 2)) -> np.ndarray:
  """Returns the `size` token ids most frequent among loss-masked targets (plus `always`), sorted."""
  counts = _token_counts(ids, mask, vocab_size)
  counts[list(always)] = np.inf
  return np.sort(np.argsort(-counts, kind="stable")[:size]).astype(np.int32)


def more_head_vocab(ids: np.ndarray, mask: np.ndarray, vocab_size: int, head_ids: np.ndarray, n: int) -> np.ndarray:
  """Returns the `n` token ids outside `head_ids` most frequent among loss-masked targets (those seen first), sorted.

  Fewer when fewer tokens outside the head occur at all: a row for a token the data never shows would not train.
  """
  counts = _token_counts(ids, mask, vocab_size)
  counts[np.asarray(head_ids, np.int64)] = -1.0
  order = np.argsort(-counts, kind="stable")[:n]
  return np.sort(order[counts[order] > 0]).astype(np.int32)
