"""K chosen per batch size (`k="auto"`, the default): from measured step costs and the draft's acceptance.

A round of SD at K makes E(a, K) = (1 - a^(K+1)) / (1 - a) tokens a row for one verify of K+1 tokens a row, K draft
steps and the round's host work; AR makes one token a row per step. At batch B a verify is B x (K+1) rows, so what
pays at batch 1 stops paying as the batch grows (the products turn compute-bound). With a table of step costs
measured on this machine (`measure`; cached per machine, backend and model pair; `bench.py --calibrate` redoes it)
`choose_k` returns the K with the most expected tokens a second, and 0 (plain AR) where no K beats AR by MARGIN.
Without a table it returns the conservative BUILTIN_K.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os

AUTO = "auto"
K_MAX = 4
BATCHES = (1, 2, 4, 8, 16)
# Speculation must beat AR by this much to be chosen: the model is an estimate, and a wrong choice for
# speculation costs more than a wrong choice for AR (which is never slower than AR).
MARGIN = 1.05
# A round's host work (rejection sampling, transfers, dispatch) in AR steps at batch 1: at batch 1 on the 2-core Xeon
# the costs alone predict SD K=2 at 1.50x AR (a = 0.553, verify of 3 = 1.07 AR steps, a draft step 0.085) where the
# bench measured 1.34x (README, Results), which leaves 0.15 AR steps a round.
ROUND_OVERHEAD = 0.15
# Without measurements: K=2 where it measured 1.34x AR (batch 1), K=1 up to 4 rows, AR above (SD K=2 measured 0.77x
# AR at batch 4 and 0.56x at batch 8 before rows past 16 had the few-row kernel; issue 45).
BUILTIN_K = {1: 2, 2: 2, 3: 1, 4: 1}
# A GGUF target in its blocks (weights='gguf', the CPU's default for one): a 3-token verify costs 1.40x a step, and
# SD at K=2 measured 0.94-1.01x AR at batch 1 (docs/benchmarks.md): without measurements, AR.
BUILTIN_K_BLOCKS: dict = {}


@dataclasses.dataclass(frozen=True)
class StepCosts:
  """Medians in ms of the compiled steps, by batch size (rows)."""

  ar_ms: dict          # {batch: one target step of 1 token a row}
  verify_ms: dict      # {batch: {T: one target forward of T tokens a row}}, T = 2..K_MAX+1
  draft_ms: dict       # {batch: one draft step of 1 token a row}
  about: str = ""      # the machine and models measured

  def to_json(self) -> str:
    return json.dumps(dataclasses.asdict(self), indent=1, sort_keys=True)

  @classmethod
  def from_json(cls, text: str) -> "StepCosts":
    d = json.loads(text)
    ints = lambda m: {int(b): v for b, v in m.items()}  # noqa: E731  (JSON keys are strings)
    return cls(ar_ms=ints(d["ar_ms"]), verify_ms={int(b): ints(v) for b, v in d["verify_ms"].items()},
               draft_ms=ints(d["draft_ms"]), about=d.get("about", ""))

  def at(self, batch: int) -> tuple[float, dict, float]:
    """Returns (AR ms, {T: verify ms}, draft ms) at `batch`, interpolated linearly between measured batch sizes
    (past the largest measured, scaled by rows: compute-bound)."""
    bs = sorted(self.ar_ms)
    if batch in self.ar_ms:
      return self.ar_ms[batch], self.verify_ms[batch], self.draft_ms[batch]
    if batch > bs[-1]:
      s, b = batch / bs[-1], bs[-1]
      return self.ar_ms[b] * s, {t: v * s for t, v in self.verify_ms[b].items()}, self.draft_ms[b] * s
    lo = max(b for b in bs if b < batch) if batch > bs[0] else bs[0]
    hi = min(b for b in bs if b > batch)
    w = (batch - lo) / (hi - lo) if hi != lo else 0.0
    mix = lambda a, b: a + w * (b - a)  # noqa: E731
    return (mix(self.ar_ms[lo], self.ar_ms[hi]), {t: mix(self.verify_ms[lo][t], self.verify_ms[hi][t])
                                                  for t in self.verify_ms[lo]}, mix(self.draft_ms[lo], self.draft_ms[hi]))


def expected_tokens(a: float, k: int) -> float:
  """Returns E[tokens per round a row] with per-token acceptance a and K drafts (accepted + bonus)."""
  return float(k + 1) if a >= 1 else (1 - a ** (k + 1)) / (1 - a)


def sd_speedup(costs: StepCosts, batch: int, k: int, a: float) -> float:
  """Returns SD's expected tokens a second over AR's at `batch` with K drafts a round (1.0 for K=0)."""
  if k == 0:
    return 1.0
  ar, verify, draft = costs.at(batch)
  if k + 1 not in verify:
    return 0.0
  round_ms = verify[k + 1] + k * draft + ROUND_OVERHEAD * costs.ar_ms[min(costs.ar_ms)]
  return expected_tokens(a, k) * ar / round_ms


def choose_k(costs: StepCosts | None, batch: int, a: float, k_max: int = K_MAX, builtin: dict = BUILTIN_K) -> int:
  """Returns the K (0 = AR) with the most expected tokens a second at `batch` rows; `builtin` without costs."""
  if batch < 1:
    raise ValueError(f"batch must be >= 1, got {batch}")
  if costs is None:
    return min(builtin.get(batch, 0), k_max)
  best, best_speedup = 0, MARGIN
  for k in range(1, k_max + 1):
    s = sd_speedup(costs, batch, k, a)
    if s > best_speedup:
      best, best_speedup = k, s
  return best


def acceptance(calibration: dict | None, temperature: float, default: float = 0.5) -> float:
  """Returns the draft's per-token acceptance a at the temperature nearest `temperature` in its fan-out calibration
  ({temperature: (a_p, r)}, fan_out.read_calibration), else `default`."""
  if not calibration:
    return default
  return float(calibration[min(calibration, key=lambda t: abs(t - temperature))][0])


def costs_path(*names: str) -> str:
  """Returns the cache file of the step costs for this machine, backend and models (`names`: what identifies them,
  e.g. their configs as JSON)."""
  import jax

  from ..kernels.cpu_ffi import _cache_dir, _cpu_signature

  key = "\n".join([_cpu_signature(), jax.default_backend(), str(len(os.sched_getaffinity(0))), *names])
  digest = hashlib.sha256(key.encode()).hexdigest()[:16]
  return os.path.join(os.path.dirname(_cache_dir()), "step_costs", f"{digest}.json")


def load_costs(path: str) -> StepCosts | None:
  """Returns the step costs cached at `path`, or None (none measured yet, or unreadable: then the built-in K)."""
  try:
    with open(path, encoding="utf-8") as f:
      return StepCosts.from_json(f.read())
  except (OSError, ValueError, KeyError, TypeError):
    return None


def measure(target, draft, batches=BATCHES, k_max: int = K_MAX, repeats: int = 7, log=print) -> StepCosts:
  """Returns step costs measured here for `target` and `draft` (objects with .cfg and .params; an EAGLE draft is
  timed as its own step): per batch the AR step, the verify of T = 2..k_max+1 tokens and the draft step,
  interleaved, medians of `repeats`."""
  from ..bench.step_cost import compiled_eagle_step, compiled_step, interleaved_ms

  ar, verify, drafted = {}, {}, {}
  eagle = getattr(draft.cfg, "kind", None) == "eagle"
  for b in batches:
    steps = {t: compiled_step(target.cfg, target.params, tokens=t, batch=b) for t in range(1, k_max + 2)}
    steps["draft"] = (compiled_eagle_step(draft.cfg, draft.params, batch=b) if eagle
                      else compiled_step(draft.cfg, draft.params, tokens=1, batch=b))
    ms = interleaved_ms(steps, repeats)
    ar[b], drafted[b] = ms[1], ms["draft"]
    verify[b] = {t: ms[t] for t in range(2, k_max + 2)}
    log(f"[calibrate] batch {b}: AR {ar[b]:.1f} ms, verify " +
        ", ".join(f"T={t} {v:.1f}" for t, v in verify[b].items()) + f", draft {drafted[b]:.1f} ms")
  return StepCosts(ar, verify, drafted)
