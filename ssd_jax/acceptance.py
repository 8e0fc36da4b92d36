"""Greedy SD and SSD rounds replayed on teacher-forced draft ranks (what `scripts/eval_draft.py` reports).

At temperature 0 a speculative round is fully determined by one number per answer position: the rank, under the
draft's distribution given the true prefix, of the token the target emits there (0 = the draft's argmax). Drafted
tokens that are accepted equal the target's, so the draft's state at every position a round reaches is the
teacher-forced one, and the rounds can be replayed exactly from the ranks:

- a round starting at position i accepts j = the number of consecutive rank-0 positions from i, at most K, and emits
  j + 1 tokens (the last one the target's correction or bonus token);
- SSD's cache holds the next speculation for that outcome when the bonus token at position i + j is among the
  draft's top F_j candidates there: ranks 1..F_j for j < K (the fork leaves out the drafted token, which was just
  rejected), ranks 0..F_K - 1 for j = K.

This measures what the i.i.d. model (1 - a^(K+1)) / (1 - a) only approximates: disagreements cluster, and the
per-position rate varies along an answer.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


def replay_greedy_rounds(ranks: Sequence[int], k: int, fan_out: Sequence[int] | None = None) -> dict:
  """Replays greedy rounds of K drafted tokens over one answer's ranks; returns summable counts.

  Returns {"tokens", "rounds", "accepted", "hits", "hit_chances"}: tokens emitted (= len(ranks)), target forwards,
  drafted tokens accepted, and (with `fan_out`, F_0..F_K) the rounds whose outcome the SSD cache covered among the
  rounds that have a next round.
  """
  if k < 1:
    raise ValueError(f"K must be >= 1, got {k}")
  if fan_out is not None and len(fan_out) != k + 1:
    raise ValueError(f"fan_out needs K+1 = {k + 1} entries, got {len(fan_out)}")
  ranks = np.asarray(ranks)
  n = int(ranks.size)
  pos = rounds = accepted = hits = chances = 0
  while pos < n:
    j = 0
    while j < k and pos + j < n and ranks[pos + j] == 0:
      j += 1
    rounds += 1
    accepted += j
    if pos + j >= n:  # the answer ended inside this round's accepted run
      break
    nxt = pos + j + 1
    if fan_out is not None and nxt < n:
      chances += 1
      r = int(ranks[pos + j])
      hits += int(1 <= r <= fan_out[j] if j < k else r < fan_out[k])
    pos = nxt
  return {"tokens": n, "rounds": rounds, "accepted": accepted, "hits": hits, "hit_chances": chances}


def summarize(counts: Sequence[dict], k: int) -> dict:
  """Adds up replay_greedy_rounds over answers: tokens per target forward, acceptance per drafted token, hit rate."""
  tot = {key: sum(c[key] for c in counts) for key in ("tokens", "rounds", "accepted", "hits", "hit_chances")}
  return {"tokens_per_forward": tot["tokens"] / tot["rounds"] if tot["rounds"] else 0.0,
          "acceptance": tot["accepted"] / (k * tot["rounds"]) if tot["rounds"] else 0.0,
          "cache_hit_rate": tot["hits"] / tot["hit_chances"] if tot["hit_chances"] else None,
          "rounds": tot["rounds"]}
