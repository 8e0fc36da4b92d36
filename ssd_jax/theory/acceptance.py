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
  out = {}
  if all("tried" in c for c in counts):  # per drafted token the verifier reached: the i.i.d. model's alpha
    tried = sum(c["tried"] for c in counts)
    out["per_token_acceptance"] = tot["accepted"] / tried if tried else 0.0
  return {**out, "tokens_per_forward": tot["tokens"] / tot["rounds"] if tot["rounds"] else 0.0,
          "acceptance": tot["accepted"] / (k * tot["rounds"]) if tot["rounds"] else 0.0,
          "cache_hit_rate": tot["hits"] / tot["hit_chances"] if tot["hit_chances"] else None,
          "rounds": tot["rounds"]}


def replay_eagle_rounds(top, target, k: int, fan_out: Sequence[int] | None = None) -> dict:
  """Replays greedy rounds of an EAGLE draft over one answer; returns replay_greedy_rounds' counts plus "tried".

  top [J, n, R]: the draft's R most likely tokens (best first) for answer token i at rollout depth j (predicting it
  with target features up to j+1 positions before it: ssd_jax/training/eagle_train.rollout_logits); target [n]: the
  target's tokens. A round's first drafted token is predicted at depth d0 and its m-th at d0 + m:
  - SD (`fan_out` None): d0 = 0: the verify that ended the last round gave features up to the bonus token's
    predecessor, and the draft catches up on them before it drafts;
  - SSD: the speculation served after a cache hit was pre-drafted while the last round was verified, from its
    outcome (j accepted, bonus) with features only up to that round's first position: d0 = j + 1. The cache held
    it when the bonus is among the fork's candidates: the top F_j of the glue at depth j (the draft's pass over the
    verified speculation), without the drafted token when j < K. After a miss the neural backup drafts just in time,
    once the verify's features are in: d0 = 0. J must exceed 2K (the deepest first-token depth K+1, plus K-1).
  """
  top, target = np.asarray(top), np.asarray(target)
  n = int(target.size)
  if fan_out is not None and top.shape[0] < 2 * k + 1:
    raise ValueError(f"an SSD replay at K={k} needs depths 0..{2 * k}, got {top.shape[0]}")
  i = d0 = rounds = accepted = tried = hits = chances = 0
  while i < n:
    j = 0
    while j < k and i + j < n and top[d0 + j, i + j, 0] == target[i + j]:
      j += 1
    rounds += 1
    accepted += j
    tried += min(j + 1, k, n - i)
    if i + j >= n:
      break
    nxt = i + j + 1
    if fan_out is not None:
      drafted = top[d0 + j, i + j, 0] if j < k else -1
      cands = [t for t in top[j, i + j] if t != drafted][: fan_out[j]]
      hit = target[i + j] in cands
      if nxt < n:
        chances += 1
        hits += int(hit)
      d0 = j + 1 if hit else 0
    i = nxt
  return {"tokens": n, "rounds": rounds, "accepted": accepted, "tried": tried, "hits": hits, "hit_chances": chances}
