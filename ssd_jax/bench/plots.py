"""PNG figures of a benchmark result (the JSON of scripts/bench.py); matplotlib is the optional `bench` extra.

write_plots raises ImportError when matplotlib is missing; the bench then says in one line that plots were skipped.
"""
from __future__ import annotations

import os

from .plan import SWEEPS, fan_out_fit, sweep_series


def _pyplot():
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  return plt


def _save(plt, fig, path: str) -> None:
  """Writes a finished figure to `path` and frees it."""
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def speed_by_dataset(result: dict, path: str) -> None:
  """Grouped bars: decode tokens/s per dataset (and all pooled), one bar per variant."""
  plt = _pyplot()
  datasets = result["datasets"] + ["all"]
  labels = [v["label"] for v in result["variants"]]
  table = result["summary"]["by_variant"]
  width = 0.8 / max(len(labels), 1)
  fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(datasets) * max(1, len(labels) / 3)), 4))
  for i, lab in enumerate(labels):
    ys = [table[lab].get(d, {}).get("tokens_per_second", 0.0) for d in datasets]
    ax.bar([j + (i - (len(labels) - 1) / 2) * width for j in range(len(datasets))], ys, width, label=lab)
  ax.set_xticks(range(len(datasets)), datasets)
  ax.set_ylabel("decode tokens / s")
  ax.set_title(f"Speed per dataset and mode ({result['args']['max_new_tokens']} new tokens, "
               f"T={result['args']['temperature']:g})")
  ax.legend(fontsize="small", ncol=2)
  _save(plt, fig, path)


def predicted_vs_measured(result: dict, path: str) -> bool:
  """Scatter of the timing model's tokens/s against the measured, per variant and dataset; False if none."""
  pts = []
  for lab, per in result["summary"]["by_variant"].items():
    for d, f in per.items():
      if "predicted" in f:
        pts.append((lab, d, f["tokens_per_second"], f["predicted"]["tokens_per_second"]))
  if not pts:
    return False
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(5.5, 5))
  for lab in sorted({p[0] for p in pts}):
    sel = [p for p in pts if p[0] == lab]
    ax.scatter([p[2] for p in sel], [p[3] for p in sel], label=lab)
    for p in sel:
      ax.annotate(p[1], (p[2], p[3]), fontsize=6)
  hi = max(max(p[2], p[3]) for p in pts) * 1.1
  ax.plot([0, hi], [0, hi], "k--", lw=0.8, label="predicted = measured")
  ax.set_xlim(0, hi)
  ax.set_ylim(0, hi)
  ax.set_xlabel("measured decode tokens / s")
  ax.set_ylabel("timing model tokens / s (measured a, p_hit, costs)")
  ax.set_title("Timing model against measurement")
  ax.legend(fontsize="small")
  _save(plt, fig, path)
  return True


def hit_rate_vs_fan_out(result: dict, path: str) -> bool:
  """Log-log: SSD cache hit rate and miss rate against fan-out, with the fitted power law; False if no sweep."""
  pts = [p for p in (sweep_series(result) or {}).get("ssd", []) if p[2] is not None]
  fit = fan_out_fit(result)
  if result["args"].get("sweep") != "fan-out" or not pts:
    return False
  import numpy as np
  plt = _pyplot()
  fig, (ax_h, ax_m) = plt.subplots(1, 2, figsize=(10, 4))
  fs = np.asarray([p[0] for p in pts])
  hit = np.asarray([p[2] for p in pts])
  ax_h.loglog(fs, np.maximum(hit, 1e-4), "o", label="measured")
  ax_m.loglog(fs, np.maximum(1 - hit, 1e-4), "o", label="measured")
  if fit:
    grid = np.geomspace(fs.min(), fs.max(), 50)
    miss = fit["c"] * grid ** -fit["r"]
    law = f"{fit['c']:.2f} F^-{fit['r']:.2f}"
    ax_h.loglog(grid, np.clip(1 - miss, 1e-4, 1), "-", label=f"1 - {law}")
    ax_m.loglog(grid, miss, "-", label=law)
  from matplotlib.ticker import ScalarFormatter
  for ax in (ax_h, ax_m):  # plain numbers on the log axes
    for axis in (ax.xaxis, ax.yaxis):
      axis.set_major_formatter(ScalarFormatter())
      axis.set_minor_formatter(ScalarFormatter())
  ax_h.set_title("SSD cache hit rate against fan-out")
  ax_m.set_title("miss rate (1 - hit) against fan-out")
  for ax in (ax_h, ax_m):
    ax.set_xlabel("fan-out F (guesses per acceptance length)")
    ax.legend(fontsize="small")
  ax_h.set_ylabel("hit rate")
  ax_m.set_ylabel("miss rate")
  _save(plt, fig, path)
  return True


def speed_vs_sweep(result: dict, path: str) -> bool:
  """Decode tokens/s (all datasets pooled) against the swept option, one line per mode; unswept modes as levels."""
  sweep = result["args"].get("sweep")
  series = sweep_series(result)
  if not series:
    return False
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(6, 4))
  for mode, pts in sorted(series.items()):
    ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=mode)
  xs = [p[0] for pts in series.values() for p in pts]
  for v in result["variants"]:
    if v["sweep_value"] is None and all(isinstance(x, (int, float)) for x in xs):  # unchanged modes: a level
      tps = result["summary"]["by_variant"][v["label"]].get("all", {}).get("tokens_per_second")
      if tps:
        ax.hlines(tps, min(xs), max(xs), linestyles="dotted", label=f"{v['label']} (unchanged)")
  if sweep in ("batch", "fan-out"):
    ax.set_xscale("log", base=2)
  ax.set_xlabel({"batch": "batch size", "fan-out": "fan-out F", "k": "K (draft tokens per round)",
                 "temperature": "temperature", "saguaro-c": "Saguaro C", "backup": "backup on a miss",
                 "ssd-placement": "SSD placement", "ar-chunk": "AR steps a call",
                 "sd-chunk": "SD rounds a call"}.get(sweep, sweep))
  ax.set_ylabel("decode tokens / s" + (" (all rows of a batch)" if sweep == "batch" else ""))
  ax.set_title(f"Speed against {sweep}")
  ax.legend(fontsize="small")
  _save(plt, fig, path)
  return True


def batch_frontier(result: dict, path: str) -> bool:
  """The throughput-latency frontier of a batch sweep (the paper's Figure 7, right): tokens a second per row (what
  one user sees) against tokens a second of the whole batch, a point per batch size, one line per mode."""
  series = sweep_series(result) if result["args"].get("sweep") == "batch" else None
  if not series:
    return False
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(6, 4))
  for i, (mode, pts) in enumerate(sorted(series.items())):  # color C{i}: a mode's color in speedup_vs_batch too
    ax.plot([p[1] for p in pts], [p[1] / p[0] for p in pts], "o-", label=mode, color=f"C{i}")
    for b, tps, _ in pts:
      ax.annotate(f"{b}", (tps, tps / b), textcoords="offset points", xytext=(4, 4), fontsize="x-small")
  ax.set_xlabel("decode tokens / s, whole batch")
  ax.set_ylabel("decode tokens / s per row")
  ax.set_title("Throughput against per-row speed (labels: batch size)")
  ax.legend(fontsize="small")
  _save(plt, fig, path)
  return True


def speedup_vs_batch(result: dict, path: str) -> bool:
  """Speedup over AR at the same batch size against the batch size (the paper's Figure 13), one line per mode."""
  series = sweep_series(result) if result["args"].get("sweep") == "batch" else None
  if not series or "ar" not in series or len(series) < 2:
    return False
  ar = {b: tps for b, tps, _ in series["ar"]}
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(6, 4))
  for i, (mode, pts) in enumerate(sorted(series.items())):  # color C{i}: the mode's color in batch_frontier
    if mode != "ar":
      pts = [(b, tps / ar[b]) for b, tps, _ in pts if ar.get(b)]
      ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=f"{mode} / ar", color=f"C{i}")
  ax.axhline(1.0, color="grey", linestyle="dotted")
  ax.set_xscale("log", base=2)
  ax.set_xlabel("batch size")
  ax.set_ylabel("tokens / s over AR's at the same batch")
  ax.set_title("Speedup against batch size")
  ax.legend(fontsize="small")
  _save(plt, fig, path)
  return True


def write_plots(result: dict, out_dir: str) -> list[str]:
  """Writes every figure that the result has data for into out_dir; returns their paths (ImportError: no matplotlib)."""
  _pyplot()
  os.makedirs(out_dir, exist_ok=True)
  paths = []
  p = os.path.join(out_dir, "speed_by_dataset.png")
  speed_by_dataset(result, p)
  paths.append(p)
  sweep = result["args"].get("sweep")
  for name, fn in (("predicted_vs_measured.png", predicted_vs_measured),
                   ("hit_rate_vs_fan_out.png", hit_rate_vs_fan_out), ("batch_frontier.png", batch_frontier),
                   ("speedup_vs_batch.png", speedup_vs_batch)):
    p = os.path.join(out_dir, name)
    if fn(result, p):
      paths.append(p)
  if sweep in SWEEPS:
    p = os.path.join(out_dir, "speed_vs_batch.png" if sweep == "batch" else f"speed_vs_{sweep}.png")
    if speed_vs_sweep(result, p):
      paths.append(p)
  return paths
