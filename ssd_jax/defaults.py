"""What a run gets without options: SSD's placement ('auto') and the default mode, chosen by where it runs.

Both are small functions of what they look at (the backend, the devices, the usable cores, whether a draft is
loaded), so that a better draft or new measurements change a line here. The measurements behind them are in the
README ("What runs by default").
"""
from __future__ import annotations

import os

from .settings import MODES, SSD_PLACEMENTS

__all__ = ["MODES", "SSD_PLACEMENTS", "auto_ssd_placement", "cores_to_use", "default_mode", "resolve", "usable_cores"]


def usable_cores() -> int:
  """Returns how many CPU cores this process may run on."""
  return len(os.sched_getaffinity(0))


def auto_ssd_placement(backend: str, target_devices: int, multi_process: bool, cores: int) -> str:
  """Returns the placement 'auto' stands for: 'processes' on a CPU with at least two usable cores, else 'devices'.

  On a CPU the JAX devices of one process share one thread pool, so only a process of its own, pinned to its own
  cores, gives the draft hardware of its own. That split runs a one-device target in one process; a tensor-parallel
  target (target_devices > 1) or a jax.distributed run keeps 'devices'. On an accelerator 'devices' puts the draft on
  the device after the target's (its own, when the host has one more). On a one-core CPU there is nothing to split:
  'devices', where the draft shares the core with the target (SSD then gains nothing over SD).
  """
  if backend == "cpu" and target_devices == 1 and not multi_process and cores >= 2:
    return "processes"
  return "devices"


# The fastest mode measured on each backend with the shipped draft (scripts/bench.py; README, "Results"). A default
# must never be slower than AR, so a backend nobody has measured runs AR. 2-core Intel Xeon, nothing else running,
# after the few-row kernel and the greedy shortcut (2026-12-05, dbe3fe8): AR 26.70 tok/s, SD K=2 35.66 (1.34x; K=2 was
# the API's default), SSD K=2 with its draft in its own process 31.55 (1.18x). SD needs no hardware of its own, so it
# is the CPU default at any core count.
FASTEST_MEASURED = {"cpu": "sd"}


def default_mode(has_draft: bool, backend: str, draft_has_own_hardware: bool, measured: dict | None = None) -> str:
  """Returns the mode a run without --mode gets: 'ar' without a draft; else the fastest this machine measured
  (`measured`: tokens a second by mode, `bench.py --calibrate`'s real decodes at batch 1, AR among them), SSD only
  where the draft has hardware of its own (SSD's overlap would have nothing else to run on); without such a
  measurement the fastest measured on this backend (`FASTEST_MEASURED`; 'ar' where none is), 'sd' for 'ssd' without
  hardware of the draft's own."""
  if not has_draft:
    return "ar"
  if measured and "ar" in measured:
    allowed = [m for m in ("ar", "sd", "ssd") if m in measured and (m != "ssd" or draft_has_own_hardware)]
    return max(allowed, key=lambda m: measured[m])
  mode = FASTEST_MEASURED.get(backend, "ar")
  return "sd" if mode == "ssd" and not draft_has_own_hardware else mode


def resolve(has_draft: bool, placement, ssd_placement: str = "auto", measured: dict | None = None) -> tuple[str, str]:
  """Returns (default mode, SSD placement) for a target/draft `placement` (sharding.Placement), 'auto' resolved;
  `ssd_placement` is one of SSD_PLACEMENTS (checked where it was given: settings.LoadSettings); `measured`: this
  machine's tokens a second by mode, if calibrated (default_mode).

  The draft has hardware of its own in the 'processes' placement, or on an accelerator when its device is not one of
  the target's; in-process CPU devices share one thread pool, so they never count.
  """
  import jax

  backend = jax.default_backend()
  where = ssd_placement
  if where == "auto":
    where = auto_ssd_placement(backend, placement.tp, jax.process_count() > 1, usable_cores())
  return default_mode(has_draft, backend, draft_has_own_hardware(placement, where), measured), where


def cores_to_use(measured: dict | None = None, cores: list[int] | None = None) -> list[int] | None:
  """Returns the one core a run should keep when `bench.py --calibrate` measured AR faster on one core than on all of
  `cores` (default: the usable ones) on this machine (`measured`: {"1": tok/s, "all": tok/s}, default: what it
  saved, auto_k.cores_path; a VM whose threads wake slowly, issue 56), else None: keep them all. decode.py and
  serve.py pin themselves to it (cli_util.follow_measured_cores)."""
  cores = sorted(os.sched_getaffinity(0)) if cores is None else sorted(cores)
  if measured is None and len(cores) >= 2:
    from .decode import auto_k
    measured = auto_k.load_modes(auto_k.cores_path())
  if not measured or len(cores) < 2 or "1" not in measured or "all" not in measured:
    return None
  return cores[:1] if measured["1"] > measured["all"] else None


def draft_has_own_hardware(placement, where: str) -> bool:
  """Whether SSD's draft runs on hardware of its own with the SSD placement `where` ('devices' or 'processes')."""
  import jax

  return where == "processes" or (jax.default_backend() != "cpu"
                                  and placement.draft_device not in list(placement.target_mesh.devices.flat))
