"""The standalone draft's training text: ShareGPT in the chat template, the target's own answers, cut or packed into
windows of seq_len + 1 tokens with a loss mask (1 on the assistant's tokens)."""
from __future__ import annotations

import os

import numpy as np


def tokenize_conversations(tok, conversations, progress: bool = True):
  """Returns (ids uint16/int32 [N], loss mask uint8 [N]) of conversations concatenated in the chat template."""
  from tqdm.auto import tqdm

  from ..data.datasets import chat_pieces

  if hasattr(tok, "writes_chatml") and not tok.writes_chatml():
    # The pieces below are SmolLM2's ChatML; under another template they would train the draft on text the target
    # never sees (Llama 3 has no <|im_start|>: it would be spelled out byte by byte).
    raise ValueError("draft training writes conversations in SmolLM2's ChatML template; this target's chat template "
                     "differs (train on its own answers only, or use an off-the-shelf draft)")
  ids, mask = [], []
  convs = list(conversations)
  batch = 256
  for i in tqdm(range(0, len(convs), batch), desc="tokenizing", disable=not progress, unit="batch"):
    pieces = [chat_pieces(c) for c in convs[i:i + batch]]
    flat = [p for ps in pieces for p in ps]
    enc = tok.encode_batch([t for t, _ in flat])
    for e, (_, m) in zip(enc, flat):
      ids.extend(e)
      mask.extend([int(m)] * len(e))
  dtype = np.uint16 if tok.vocab_size <= 65536 else np.int32
  return np.asarray(ids, dtype), np.asarray(mask, np.uint8)


def make_windows(ids: np.ndarray, mask: np.ndarray, seq_len: int):
  """Cuts the stream into non-overlapping windows of seq_len + 1 tokens: returns (tokens [W, T+1], mask [W, T+1])."""
  w = (len(ids) - 1) // seq_len
  if w < 1:
    raise ValueError(f"need more than {seq_len} tokens of training text, got {len(ids)}")
  idx = np.arange(w)[:, None] * seq_len + np.arange(seq_len + 1)[None, :]
  return ids[idx].astype(np.int32), mask[idx].astype(np.float32)


def example_starts(ids: np.ndarray, mask: np.ndarray, start_id: int) -> np.ndarray:
  """Returns where each prompt-and-answer example of a target-answer stream begins.

  An example is a prompt (mask 0) then its answer (mask 1); the next one begins at the first `start_id` (the chat
  template's `<|im_start|>`) after an answer. The stream's first token always begins one.
  """
  ids, mask = np.asarray(ids), np.asarray(mask)
  answered = np.concatenate([[0], np.cumsum(mask.astype(np.int64))])  # answer tokens before each index
  starts = [0]
  for i in np.flatnonzero(ids == start_id):
    if i > starts[-1] and answered[i] > answered[starts[-1]]:
      starts.append(int(i))
  return np.asarray(starts, np.int64)


def pack_examples(ids: np.ndarray, mask: np.ndarray, seq_len: int, start_id: int, pad_id: int = 0):
  """Packs whole examples into windows of seq_len + 1 tokens: returns (tokens [W, T+1], mask [W, T+1]).

  `make_windows` cuts the stream every seq_len tokens, so most answers are trained without the start of their prompt
  (62% of the answer tokens of the first synthetic corpus at 256), while the draft always reads the whole prompt
  when it drafts. Here every window begins at an example's start and holds whole examples; the rest is padding with
  mask 0. Examples go longest first into the first window with room (first-fit decreasing: about 95% of the tokens
  are real ones on the target-answer corpora at 512, where packing in corpus order keeps about 75%). An example
  longer than a window is cut into window-sized pieces.
  """
  starts = example_starts(ids, mask, start_id)
  bounds = np.append(starts, len(ids))
  w = seq_len + 1
  pieces = [(lo, min(b, lo + w)) for a, b in zip(bounds[:-1], bounds[1:]) for lo in range(a, b, w)]
  if not pieces:
    raise ValueError("no examples to pack")
  order = sorted(range(len(pieces)), key=lambda i: (-(pieces[i][1] - pieces[i][0]), i))
  room = np.zeros((0,), np.int64)
  bins: list[list[int]] = []
  for i in order:
    n = pieces[i][1] - pieces[i][0]
    fits = np.flatnonzero(room >= n)
    if len(fits):
      room[fits[0]] -= n
      bins[fits[0]].append(i)
    else:
      room = np.append(room, w - n)
      bins.append([i])
  tokens = np.full((len(bins), w), pad_id, np.int32)
  out_mask = np.zeros((len(bins), w), np.float32)
  for r, members in enumerate(bins):
    at = 0
    for i in sorted(members):  # corpus order inside a window
      lo, hi = pieces[i]
      tokens[r, at:at + hi - lo] = ids[lo:hi]
      out_mask[r, at:at + hi - lo] = mask[lo:hi]
      at += hi - lo
  return tokens, out_mask


def load_answer_shards(directory: str, heldout_every: int = 25, heldout_offset: int = 7):
  """Returns (train_ids, train_mask, heldout_ids, heldout_mask) from `scripts/make_target_corpus.py` shards.

  Shard b is held out when b % heldout_every == heldout_offset: a fixed rule, so the held-out text stays the same
  while the corpus grows (shards are numbered by their place in the corpus's plan, not by when they were written).
  """
  import glob
  import re

  parts = {True: ([], []), False: ([], [])}
  for f in sorted(glob.glob(os.path.join(directory, "shard_*.npz"))):
    m = re.fullmatch(r"shard_(\d{5})\.npz", os.path.basename(f))
    if not m:
      continue  # a shard being written
    z = np.load(f)
    held = int(m.group(1)) % heldout_every == heldout_offset
    parts[held][0].append(z["ids"])
    parts[held][1].append(z["mask"])
  cat = lambda xs, dt: np.concatenate(xs) if xs else np.zeros((0,), dt)  # noqa: E731
  return (cat(parts[False][0], np.uint16), cat(parts[False][1], np.uint8), cat(parts[True][0], np.uint16),
          cat(parts[True][1], np.uint8))
