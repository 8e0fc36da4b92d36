"""The batch sweep's table (issue 45): whole-batch tokens a second per series (AR, SD, SSD with each backup) by batch
size, each over AR's (and SSD's over SD's) at the same batch, and SD's K (k='auto''s choice, or the K given)
with the cost model's expected SD speedup beside the measured one. Pure Python over the bench's JSON result, as plan.py."""
from __future__ import annotations

import statistics

from .plan import _fmt, sweep_series


def auto_k_by_batch(result: dict, series: str = "sd") -> dict:
  """Returns {batch: (Ks run, mean expected SD over AR or None)} from the bench's notes of `series`'s variants
  (result['auto_k']: label -> [{batch, k, predicted_sd_over_ar, ...}], one per batch run)."""
  out = {}
  for v in result["variants"]:
    notes = result.get("auto_k", {}).get(v["label"])
    if v.get("series", v["mode"]) != series or not notes:
      continue
    preds = [n["predicted_sd_over_ar"] for n in notes if n["predicted_sd_over_ar"] is not None]
    out[v["options"]["batch_size"]] = (sorted({n["k"] for n in notes}), statistics.mean(preds) if preds else None)
  return out


def markdown(result: dict) -> str | None:
  """Returns the table of a batch sweep (None for other runs): a row per batch size."""
  if result["args"].get("sweep") != "batch":
    return None
  series = sweep_series(result) or {}
  if not series:
    return None
  tps = {name: {b: t for b, t, _ in pts} for name, pts in series.items()}
  names = sorted(series, key=lambda n: (n.split("-")[0] != "ar", n.split("-")[0] != "sd", n))
  auto = auto_k_by_batch(result)
  head = ["batch"]
  for n in names:
    head += [f"{n} tok/s"] + ([f"{n}/ar"] if n != "ar" and "ar" in tps else []) + (
        [f"{n}/sd"] if n.startswith("ssd") and "sd" in tps else [])
  if auto:
    head += ["sd's K", "model sd/ar"]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for b in sorted({b for pts in tps.values() for b in pts}):
    cells = [str(b)]
    for n in names:
      t = tps[n].get(b)
      cells.append(_fmt(t))
      for base in ("ar", "sd"):
        if (base == "ar" and n != "ar" and "ar" in tps) or (base == "sd" and n.startswith("ssd") and "sd" in tps):
          den = tps[base].get(b)
          cells.append(_fmt(t / den) + "x" if t is not None and den else "-")
    if auto:
      ks, pred = auto.get(b, ([], None))
      cells += [",".join(map(str, ks)) or "-", _fmt(pred) + ("x" if pred is not None else "")]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)
