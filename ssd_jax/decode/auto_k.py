"""K chosen per batch size (`k="auto"`, the default): from measured step costs and the draft's acceptance.

A round of SD at K makes E(a, K) = (1 - a^(K+1)) / (1 - a) tokens a row for one verify of K+1 tokens a row, K draft
steps and the round's host work; AR makes one token a row per step. At batch B a verify is B x (K+1) rows, so what
pays at batch 1 stops paying as the batch grows (the products turn compute-bound). With a table of step costs
measured on this machine (`bench/step_cost.measure`, which `bench.py --calibrate` runs; cached per machine,
backend, model pair and weight formats) `choose_k` returns the K with the most expected tokens a second, and 0 (plain AR) where no K
beats AR by MARGIN. The attention's cost follows the cached length, so the costs are measured after PREFIXES cached
tokens and read at the run's own (`run_prefix`: the batch's mean prompt length plus half the new tokens), linearly
between (and past the longer). Without a table it returns the conservative BUILTIN_K.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os

AUTO = "auto"
K_MAX = 4
BATCHES = (1, 2, 4, 8, 16)
# Cached tokens the costs are measured after: a short and a long context (the cache of 512 holds 448 + K_MAX + 1).
PREFIXES = (64, 448)
DEFAULT_PREFIX = 300  # where a run's prefix is not given (and what a one-prefix table of the first format had)
# Speculation must beat AR by this much to be chosen: the model is an estimate, and a wrong choice for
# speculation costs more than a wrong choice for AR (which is never slower than AR). 1.10: on the 2-core Xeon with the
# GGUF target the model expected SD K=1 at 1.06-1.08x AR where it measured 0.96-1.04x (docs/benchmarks.md, "Quiet
# re-measure, afternoon"): its error, mostly the draft's calibrated acceptance against the prompts', exceeds 5%.
MARGIN = 1.10
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
  prefix: int = DEFAULT_PREFIX  # the cached tokens every step was timed after

  def to_json(self) -> str:
    return json.dumps(dataclasses.asdict(self), indent=1, sort_keys=True)

  @classmethod
  def from_json(cls, text: str) -> "StepCosts":
    d = json.loads(text)
    ints = lambda m: {int(b): v for b, v in m.items()}  # noqa: E731  (JSON keys are strings)
    return cls(ar_ms=ints(d["ar_ms"]), verify_ms={int(b): ints(v) for b, v in d["verify_ms"].items()},
               draft_ms=ints(d["draft_ms"]), about=d.get("about", ""), prefix=int(d.get("prefix", DEFAULT_PREFIX)))

  def at(self, batch: int, prefix: float | None = None) -> tuple[float, dict, float]:
    """Returns (AR ms, {T: verify ms}, draft ms) at `batch` (any `prefix`: this table has one), interpolated
    linearly between measured batch sizes (past the largest measured, scaled by rows: compute-bound)."""
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


@dataclasses.dataclass(frozen=True)
class CostTable:
  """Step costs measured after several prefix lengths (StepCosts each); `at` reads them at a run's prefix."""

  tables: tuple        # StepCosts, by increasing prefix
  about: str = ""
  # The decode loop's time beyond the compiled steps, measured in real decodes at batch 1 (bench/step_cost.measure_host): {"ar": ms a
  # token beyond an AR step, "round": ms an SD round beyond its verify and draft steps}; None: ROUND_OVERHEAD instead.
  host_ms: dict | None = None
  # Tokens a second each mode measured in the same real decodes at batch 1, K=1 ({"ar", "sd"[, "ssd"]}: SSD where the
  # draft has hardware of its own): the default mode on this machine is the fastest of them (defaults.default_mode).
  modes_tok_s: dict | None = None

  def __post_init__(self):
    if not self.tables:
      raise ValueError("a cost table needs at least one prefix's costs")
    object.__setattr__(self, "tables", tuple(sorted(self.tables, key=lambda t: t.prefix)))

  def to_json(self) -> str:
    return json.dumps({"about": self.about, "tables": [dataclasses.asdict(t) for t in self.tables],
                       "host_ms": self.host_ms, "modes_tok_s": self.modes_tok_s}, indent=1, sort_keys=True)

  @classmethod
  def from_json(cls, text: str) -> "CostTable":
    """Reads a table (or one StepCosts' JSON: a table of its one prefix)."""
    d = json.loads(text)
    if "tables" not in d:
      one = StepCosts.from_json(text)
      return cls((one,), one.about)
    host = d.get("host_ms")
    host = {name: float(host[name]) for name in ("ar", "round")} if host else None
    modes = d.get("modes_tok_s")
    modes = {str(m): float(v) for m, v in modes.items()} if modes else None
    return cls(tuple(StepCosts.from_json(json.dumps(t)) for t in d["tables"]), d.get("about", ""), host, modes)

  def at(self, batch: int, prefix: float | None = None) -> tuple[float, dict, float]:
    """Returns (AR ms, {T: verify ms}, draft ms) at `batch` after `prefix` cached tokens (None: DEFAULT_PREFIX):
    linear in the prefix between the two measured prefixes around it, through the last two past the longest, and
    the shortest's below it."""
    prefix = DEFAULT_PREFIX if prefix is None else prefix
    ts = self.tables
    if len(ts) == 1 or prefix <= ts[0].prefix:
      return ts[0].at(batch)
    hi = next((i for i, t in enumerate(ts) if t.prefix >= prefix), len(ts) - 1)
    lo_t, hi_t = ts[hi - 1], ts[hi]
    w = (prefix - lo_t.prefix) / (hi_t.prefix - lo_t.prefix)
    (a0, v0, d0), (a1, v1, d1) = lo_t.at(batch), hi_t.at(batch)
    mix = lambda x, y: x + w * (y - x)  # noqa: E731
    return mix(a0, a1), {t: mix(v0[t], v1[t]) for t in v0 if t in v1}, mix(d0, d1)


def run_prefix(prompt_lens, max_new_tokens: int) -> float:
  """Returns the cached tokens a batch's steps see on average: its mean prompt length plus half the new tokens."""
  return sum(prompt_lens) / len(prompt_lens) + max_new_tokens / 2


def expected_tokens(a: float, k: int) -> float:
  """Returns E[tokens per round a row] with per-token acceptance a and K drafts (accepted + bonus)."""
  return float(k + 1) if a >= 1 else (1 - a ** (k + 1)) / (1 - a)


def sd_speedup(costs, batch: int, k: int, a: float, prefix: float | None = None) -> float:
  """Returns SD's expected tokens a second over AR's at `batch` with K drafts a round (1.0 for K=0), from `costs`
  (StepCosts or CostTable) read after `prefix` cached tokens. The loop's own time: a table's measured host_ms (an AR
  token's and an SD round's beyond their compiled steps, at every batch), else ROUND_OVERHEAD AR steps of one row a
  round (at the same prefix) and none for AR."""
  return _speedup(costs, batch, k, a, prefix, draft_steps=k)


def ssd_speedup(costs, batch: int, k: int, a: float, prefix: float | None = None) -> float:
  """Returns SSD's expected tokens a second over AR's when every round hits its speculation cache: SD's round with
  the draft's K steps hidden behind the verify (a miss adds its backup's). An upper bound: below 1.0 here, SSD is
  slower than AR whatever its hit rate."""
  return _speedup(costs, batch, k, a, prefix, draft_steps=0)


def _speedup(costs, batch: int, k: int, a: float, prefix: float | None, draft_steps: int) -> float:
  if k == 0:
    return 1.0
  ar, verify, draft = costs.at(batch, prefix)
  if k + 1 not in verify:
    return 0.0
  host = getattr(costs, "host_ms", None)
  if host:
    ar_ms, round_ms = ar + host["ar"], verify[k + 1] + draft_steps * draft + host["round"]
  else:
    ar_ms, round_ms = ar, verify[k + 1] + draft_steps * draft + ROUND_OVERHEAD * costs.at(1, prefix)[0]
  return expected_tokens(a, k) * max(ar_ms, 1e-6) / max(round_ms, 1e-6)


def choose_k(costs, batch: int, a: float, k_max: int = K_MAX, builtin: dict = BUILTIN_K,
             prefix: float | None = None, at_least: int = 0) -> int:
  """Returns the K (0 = AR) with the most expected tokens a second at `batch` rows after `prefix` cached tokens
  (StepCosts or CostTable `costs`); `builtin` without costs. at_least=1: a speculative mode asked for explicitly,
  whose K is the best K >= 1 even where none beats AR (AR is chosen only for the default mode)."""
  if batch < 1:
    raise ValueError(f"batch must be >= 1, got {batch}")
  if at_least > k_max:
    raise ValueError(f"at_least {at_least} is above k_max {k_max}")
  if costs is None:
    return min(max(builtin.get(batch, 0), at_least), k_max)
  best, best_speedup = 0, MARGIN
  for k in range(1, k_max + 1):
    s = sd_speedup(costs, batch, k, a, prefix)
    if s > best_speedup or best < at_least:
      best, best_speedup = k, s
  return best


def acceptance(calibration: dict | None, temperature: float, default: float = 0.5) -> float:
  """Returns the draft's per-token acceptance a at the temperature nearest `temperature` in its fan-out calibration
  ({temperature: (a_p, r)}, fan_out.read_calibration), else `default`."""
  if not calibration:
    return default
  return float(calibration[min(calibration, key=lambda t: abs(t - temperature))][0])


def params_format(params) -> str:
  """Returns what a model's step cost depends on in its parameters, whatever their format (float32, int8, GGUF
  blocks, a draft's own choice): each leaf's path, shape and dtype, and the bytes in all, as one short digest."""
  import jax

  leaves = jax.tree_util.tree_leaves_with_path(params)
  desc = [f"{jax.tree_util.keystr(path)}:{tuple(getattr(x, 'shape', ()))}:{getattr(x, 'dtype', type(x).__name__)}"
          for path, x in leaves]
  nbytes = sum(int(getattr(x, "nbytes", 0)) for _, x in leaves)
  return hashlib.sha256("\n".join(desc + [str(nbytes)]).encode()).hexdigest()[:16]


def costs_path(*names: str) -> str:
  """Returns the cache file of the step costs for this machine, backend and models (`names`: what identifies them,
  e.g. their configs and params_format): under SSD_JAX_STEP_COSTS if set, else the cache's step_costs/."""
  import jax

  from ..kernels.cpu_ffi import _cache_dir, _cpu_signature

  key = "\n".join([_cpu_signature(), jax.default_backend(), str(len(os.sched_getaffinity(0))), *names])
  digest = hashlib.sha256(key.encode()).hexdigest()[:16]
  folder = os.environ.get("SSD_JAX_STEP_COSTS") or os.path.join(os.path.dirname(_cache_dir()), "step_costs")
  return os.path.join(folder, f"{digest}.json")


def save_modes(path: str, modes_tok_s: dict, about: str = "") -> None:
  """Writes tokens a second by mode (`bench.py --calibrate`) to `path`: preflight.LoadPlan's key (each mode's for a
  load), or cores_path() (AR's on one core and on all, {"1", "all"})."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  tmp = f"{path}.{os.getpid()}.tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump({"modes_tok_s": modes_tok_s, "about": about}, f)
  os.replace(tmp, path)


def load_modes(path: str) -> dict | None:
  """Returns the tokens a second by mode saved at `path` (save_modes), or None (none measured, or unreadable)."""
  try:
    with open(path, encoding="utf-8") as f:
      modes = json.load(f)["modes_tok_s"]
  except (OSError, ValueError, KeyError, TypeError):
    return None
  ok = isinstance(modes, dict) and all(isinstance(v, (int, float)) and v > 0 for v in modes.values())
  return modes if ok and modes else None


def cores_path() -> str:
  """Returns where `bench.py --calibrate` keeps AR's speed on one core and on all for this machine (its CPU, backend
  and usable cores, whatever the models: how the machine's threads wake is the machine's)."""
  return costs_path("AR on one core and on all")


def load_costs(path: str) -> CostTable | None:
  """Returns the step costs cached at `path`, or None (none measured yet, or unreadable: then the built-in K)."""
  try:
    with open(path, encoding="utf-8") as f:
      return CostTable.from_json(f.read())
  except (OSError, ValueError, KeyError, TypeError):
    return None
