"""Fan-out: how many bonus-token guesses to cache for each acceptance length (paper §2, Theorem 12).

With per-token acceptance a_p (i.i.d.), P(k accepted) = a_p^k (1 - a_p) for k < K and a_p^K for k = K. If the miss
rate at fan-out F follows a power law c * F^-r, maximising the hit probability under a budget sum_k F_k = B gives
F_k proportional to P(k)^(1/(1+r)):

  F_k = F_0 a_p^(k/(1+r))                        k < K
  F_K = F_0 a_p^(K/(1+r)) (1 - a_p)^(-1/(1+r))   (all accepted: the bonus comes from the target's next token)

rounded to non-negative integers that sum exactly to B (largest remainders).
"""
from __future__ import annotations

import numpy as np


def uniform_fan_out(k: int, f: int) -> tuple[int, ...]:
  """Returns (F,) * (K+1)."""
  if f < 1:
    raise ValueError(f"fan-out must be >= 1, got {f}")
  return (int(f),) * (k + 1)


def geometric_weights(k: int, a_p: float, r: float) -> np.ndarray:
  """Returns the real-valued Theorem 12 allocation shape (unnormalised) over acceptance lengths 0..K."""
  if not 0 < a_p < 1:
    raise ValueError(f"acceptance rate a_p must be in (0, 1), got {a_p}")
  if r <= 0:
    raise ValueError(f"power-law exponent r must be > 0, got {r}")
  e = 1.0 / (1.0 + r)
  w = a_p ** (np.arange(k + 1) * e)
  w[k] *= (1 - a_p) ** (-e)
  return w


def geometric_fan_out(k: int, budget: int, a_p: float, r: float) -> tuple[int, ...]:
  """Returns integer F_0..F_K (each >= 0) summing to `budget`, closest to the Theorem 12 allocation."""
  if budget < 1:
    raise ValueError(f"fan-out budget must be >= 1, got {budget}")
  w = geometric_weights(k, a_p, r)
  real = budget * w / w.sum()
  base = np.floor(real).astype(int)
  short = budget - int(base.sum())
  order = np.argsort(-(real - base), kind="stable")
  base[order[:short]] += 1
  return tuple(int(x) for x in base)


def parse_fan_out(spec: str, k: int) -> tuple[int, ...]:
  """Parses '3' (uniform) or '4,3,2,2,3' (one per acceptance length 0..K)."""
  try:
    vals = [int(x) for x in str(spec).split(",") if x.strip()]
  except ValueError:
    raise ValueError(f"fan-out {spec!r} must be an integer or a comma-separated list of integers") from None
  if len(vals) == 1:
    return uniform_fan_out(k, vals[0])
  if len(vals) != k + 1 or min(vals) < 0 or sum(vals) < 1:
    raise ValueError(f"a fan-out list needs K+1 = {k + 1} non-negative integers with a positive sum, got {spec!r}")
  return tuple(vals)


def fit_power_law(ranks, f_max: int = 32):
  """Returns (r, c, miss) fitted to miss(F) = c F^-r, miss(F) = fraction of bonus ranks > F, over F = 1..f_max.

  `ranks` are the ranks (1 = the draft's top candidate) of the realised bonus tokens; see SSDDecoder(record_ranks).
  """
  ranks = np.asarray(ranks)
  if ranks.size < 10:
    raise ValueError(f"need at least 10 recorded rounds to fit the miss-rate curve, got {ranks.size}")
  fs = np.arange(1, f_max + 1)
  miss = np.asarray([(ranks > f).mean() for f in fs])
  ok = miss > 0
  if ok.sum() < 2:
    return float("inf"), 0.0, miss  # (almost) never misses: any fan-out works
  r, c = fit_log_log(fs[ok], miss[ok])
  return r, c, miss


def fit_log_log(fs, miss) -> tuple[float, float]:
  """Returns (r, c) of the least-squares line log miss = log c - r log F (r at least 1e-3); all miss > 0."""
  slope, intercept = np.polyfit(np.log(np.asarray(fs, float)), np.log(np.asarray(miss, float)), 1)
  return float(max(-slope, 1e-3)), float(np.exp(intercept))


CALIBRATION_FILE = "fan_out_calibration.json"  # beside the draft checkpoint (scripts/calibrate_fan_out.py)


def read_calibration(calibration_file: str) -> dict[float, tuple[float, float]]:
  """Returns {temperature: (a_p, r)} from a calibration file (scripts/calibrate_fan_out.py); a missing file or one of
  another shape raises ValueError with one line that names it."""
  import json
  import math
  import os

  if not os.path.exists(calibration_file):
    raise ValueError(f"no fan-out calibration at {calibration_file}; run scripts/calibrate_fan_out.py first")
  redo = "rerun scripts/calibrate_fan_out.py"
  try:
    with open(calibration_file, encoding="utf-8") as f:
      data = json.load(f)
  except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
    raise ValueError(f"cannot read the fan-out calibration {calibration_file} ({e}); {redo}") from None
  if not isinstance(data, dict) or not data:
    raise ValueError(f"{calibration_file} holds no calibration (expected {{temperature: {{a_p, r, ...}}}}); {redo}")
  out = {}
  for t, entry in data.items():
    try:
      temp = float(t)
      a_p, r = float(entry["a_p"]), float(entry["r"])
    except (TypeError, ValueError, KeyError):
      raise ValueError(f"{calibration_file}: entry {t!r} is not {{temperature: {{a_p, r, ...}}}} with numbers; "
                       f"{redo}") from None
    if not (math.isfinite(temp) and 0 <= a_p <= 1 and r > 0):  # r may be inf: (almost) never a miss
      raise ValueError(f"{calibration_file}: entry {t!r} has a_p {a_p} (needs [0, 1]) and r {r} (needs > 0); {redo}")
    out[temp] = (a_p, r)
  return out


def geometric_from(calibration: dict[float, tuple[float, float]], k: int, budget: int,
                   temperature: float) -> tuple[int, ...]:
  """Returns the Theorem 12 fan-out from a calibration (`read_calibration`) at the temperature nearest `temperature`."""
  a_p, r = calibration[min(calibration, key=lambda t: abs(t - temperature))]
  a_p = min(max(a_p, 1e-3), 1 - 1e-3)
  return geometric_fan_out(k, budget, a_p, min(r, 1e3))


def calibrated_geometric(calibration_file: str, k: int, budget: int, temperature: float) -> tuple[int, ...]:
  """Returns the Theorem 12 fan-out from a calibration file (scripts/calibrate_fan_out.py), nearest temperature."""
  return geometric_from(read_calibration(calibration_file), k, budget, temperature)
