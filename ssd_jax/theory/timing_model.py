"""The paper's timing model (§1.5, Theorem 7 and its batch form) and the backup choice (Theorem 17).

Times are in units of one target verify forward. E(a, K) = (1 - a^(K+1)) / (1 - a) tokens per round.
"""
from __future__ import annotations

import math


def expected_tokens(a: float, k: int) -> float:
  """Returns E[tokens per round] with i.i.d. per-token acceptance a and K drafts (accepted + bonus)."""
  return float(k + 1) if a >= 1 else (1 - a ** (k + 1)) / (1 - a)


def sd_speedup(a: float, k: int, t_draft_step: float) -> float:
  """Returns SD tokens per unit time relative to AR: E / (1 + K c)."""
  return expected_tokens(a, k) / (1 + k * t_draft_step)


def ssd_speedup(p_hit: float, e_hit: float, e_miss: float, t_primary: float, t_backup: float, batch: int = 1) -> float:
  """Returns SSD tokens per unit time relative to AR (Theorem 7; a batch stalls if any row misses)."""
  ph_b = p_hit ** batch
  tokens = p_hit * e_hit + (1 - p_hit) * e_miss
  return tokens / (ph_b * max(1.0, t_primary) + (1 - ph_b) * (1 + t_backup))


def neural_backup_better(batch: int, p_hit: float, e_hit: float, e_neural: float, t_neural: float) -> bool:
  """Returns whether the neural (just-in-time draft) backup beats a fast one at this batch size (Theorem 17).

  Fast backup: about one token on a miss, no extra time. Neural: E_n tokens on a miss but the whole batch waits
  t_neural whenever any row misses (probability 1 - p_hit^b). Neural wins iff 1 - p_hit^b < rho with
  rho = (1 - p_hit)(E_n - 1) / (t_neural (p_hit E_hit + 1 - p_hit)).
  """
  if t_neural <= 0:
    return True
  rho = (1 - p_hit) * (e_neural - 1) / (t_neural * (p_hit * e_hit + 1 - p_hit))
  return 1 - p_hit ** batch < rho


def critical_batch(p_hit: float, e_hit: float, e_neural: float, t_neural: float) -> float:
  """Returns b* above which the fast backup is better (inf if the neural backup always wins)."""
  if t_neural <= 0 or p_hit >= 1:
    return math.inf
  rho = (1 - p_hit) * (e_neural - 1) / (t_neural * (p_hit * e_hit + 1 - p_hit))
  if rho >= 1:
    return math.inf
  if rho <= 0 or p_hit <= 0:
    return 0.0
  return math.log(1 - rho) / math.log(p_hit)
