"""EAGLE training data: the cached (or in-memory) feature shards, windows of whole examples packed from them, the
batches the rollout reads, the draft's head and the order windows are drawn in."""
from __future__ import annotations

import dataclasses
import glob
import os
import re

import numpy as np

from .head_vocab import choose_head_vocab

# Shard n is held out when n % 25 == 7 (draft_data.load_answer_shards' rule).
HELD_OUT_EVERY, HELD_OUT_OFFSET = 25, 7


@dataclasses.dataclass
class Shard:
  feats: np.ndarray   # float16 [N, n_feat * d] (memory-mapped)
  ids: np.ndarray     # [N] token ids
  mask: np.ndarray    # [N] 1 where the token is an answer token
  starts: np.ndarray  # [E] where each example (or piece of a long one) begins


def split_in_memory(items, held_out: bool) -> list[Shard]:
  """Returns features.in_memory's shards on one side of the held-out rule, as Shards."""
  return [Shard(f, i, m, s) for n, f, i, m, s in items if (n % HELD_OUT_EVERY == HELD_OUT_OFFSET) == held_out]


def load_shards(root: str, corpora, held_out: bool) -> list[Shard]:
  """Returns the cached shards of `corpora` (directory names or paths) on one side of the held-out rule."""
  out = []
  for c in corpora:
    d = os.path.join(root, os.path.basename(os.path.normpath(c)))
    for meta in sorted(glob.glob(os.path.join(d, "shard_*.meta.npz"))):
      n = int(re.search(r"shard_(\d{5})\.meta\.npz$", meta).group(1))
      if (n % HELD_OUT_EVERY == HELD_OUT_OFFSET) != held_out:
        continue
      z = np.load(meta)
      feats = np.load(meta.replace(".meta.npz", ".feats.npy"), mmap_mode="r")
      out.append(Shard(feats, z["ids"], z["mask"], z["starts"]))
  return out


def pack(shards: list[Shard], seq_len: int) -> list[list[tuple[int, int, int]]]:
  """Returns windows of whole examples: each a list of (shard, start, end), first-fit decreasing into seq_len."""
  pieces = []
  for s, sh in enumerate(shards):
    bounds = np.append(sh.starts, len(sh.ids))
    for a, b in zip(bounds[:-1], bounds[1:]):
      for lo in range(int(a), int(b), seq_len):
        pieces.append((s, lo, min(int(b), lo + seq_len)))
  pieces.sort(key=lambda p: -(p[2] - p[1]))
  room: list[int] = []
  bins: list[list] = []
  for p in pieces:
    n = p[2] - p[1]
    for i, r in enumerate(room):
      if r >= n:
        room[i] -= n
        bins[i].append(p)
        break
    else:
      room.append(seq_len - n)
      bins.append([p])
  return bins


def make_batch(shards: list[Shard], windows, seq_len: int, head_map: np.ndarray) -> dict:
  """Returns numpy arrays for windows: tokens, feats, labels (head rows), loss (weights), seg, pos, all [B, T(, F)].

  loss is 1 where the label is an answer token the head can express: drafting only ever predicts answer tokens.
  seg numbers the examples of a window from 1 (0 = padding); pos counts from each example's start.
  """
  b, f = len(windows), shards[0].feats.shape[1]
  out = {"tokens": np.zeros((b, seq_len), np.int32), "feats": np.zeros((b, seq_len, f), np.float16),
         "labels": np.zeros((b, seq_len), np.int32), "loss": np.zeros((b, seq_len), np.float32),
         "seg": np.zeros((b, seq_len), np.int32), "pos": np.zeros((b, seq_len), np.int32)}
  for r, win in enumerate(windows):
    at = 0
    for e, (s, lo, hi) in enumerate(win):
      sh, n = shards[s], hi - lo
      sl = slice(at, at + n)
      out["tokens"][r, sl] = sh.ids[lo:hi]
      out["feats"][r, sl] = sh.feats[lo:hi]
      # The label at p is the token after it: at answer positions, the target's own greedy choice.
      lab = np.zeros((n,), np.int64)
      nxt = sh.ids[lo + 1:hi + 1]
      lab[: len(nxt)] = nxt
      out["labels"][r, sl] = head_map[lab]
      nxt_answer = np.zeros((n,), np.uint8)
      nxt_answer[: len(nxt)] = sh.mask[lo + 1:hi + 1]
      known = head_map[lab] >= 0
      out["loss"][r, sl] = (nxt_answer > 0) & known
      out["seg"][r, sl] = e + 1
      out["pos"][r, sl] = np.arange(n)
      at += n
  out["labels"] = np.maximum(out["labels"], 0)
  return out


def choose_head(shards: list[Shard], vocab_size: int, size: int) -> np.ndarray:
  """Returns the `size` token ids most often predicted at answer positions (plus ids 0-2), sorted."""
  ids = np.concatenate([sh.ids for sh in shards]).astype(np.int64)
  mask = np.concatenate([sh.mask for sh in shards])
  return choose_head_vocab(ids, mask, vocab_size, size)


def window_order(n_windows: int, seed: int, step: int, batch: int) -> np.ndarray:
  """Returns the windows of a step: epochs are seeded permutations, so a resumed run draws the same batches."""
  per_epoch = n_windows // batch
  epoch, at = divmod(step, per_epoch)
  perm = np.random.default_rng([seed, epoch]).permutation(n_windows)
  return perm[at * batch:(at + 1) * batch]
