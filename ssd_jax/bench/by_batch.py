"""The batch sweep's table (issue 45): whole-batch tokens a second per series (AR, SD, SSD with each backup) by batch
size, each over AR's (and SSD's over SD's) at the same batch, and SD's K (k='auto''s choice, or the K given)
with the cost model's expected SD speedup beside the measured one, and the cost table's AR step and verify beside
the runs' own. Pure Python over the bench's JSON result, as plan.py."""
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


def _mean(xs):
  xs = [x for x in xs if x is not None]
  return statistics.mean(xs) if xs else None


def costs_by_batch(result: dict) -> dict:
  """Returns {batch: (AR step ms: table, run; verify ms: table, run)}: the cost table read at each run's batch and
  prefix (the bench's notes) beside what the runs took, an AR step (decode seconds over steps) and an SD verify
  (its verify seconds over rounds); None where a figure is missing."""
  out = {}
  for v in result["variants"]:
    series, b = v.get("series", v["mode"]), v["options"]["batch_size"]
    notes = result.get("auto_k", {}).get(v["label"], [])
    runs = [r for r in result.get("runs", []) if r["variant"] == v["label"]]
    if series == "ar":
      key, table = 0, _mean(n.get("table_ar_ms") for n in notes)
      run = _mean(1e3 * r["decode_seconds"] * r["batch_size"] / r["decode_tokens"] for r in runs if r["decode_tokens"])
    elif series == "sd":
      key, table = 2, _mean(n.get("table_verify_ms") for n in notes)
      run = _mean(1e3 * r["rows"][0]["stats"]["verify_seconds"] / r["rows"][0]["stats"]["rounds"] for r in runs
                  if r["rows"][0]["stats"].get("rounds") and "verify_seconds" in r["rows"][0]["stats"])
    else:
      continue
    cell = out.setdefault(b, [None] * 4)
    cell[key], cell[key + 1] = table, run
  return {b: tuple(c) for b, c in out.items() if any(x is not None for x in c)}


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
  costs = costs_by_batch(result)
  if costs:
    head += ["AR step ms: table / run", "SD verify ms: table / run"]
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
    if costs:
      c = costs.get(b, (None,) * 4)
      cells += [f"{_fmt(c[0], '.1f')} / {_fmt(c[1], '.1f')}", f"{_fmt(c[2], '.1f')} / {_fmt(c[3], '.1f')}"]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)
