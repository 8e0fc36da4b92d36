"""The benchmark's plan and arithmetic: variants and sweeps, summaries, ratios, timing-model predictions, tables.

scripts/bench.py runs the plan (it owns the models and the clock); everything here is pure Python over the JSON it
writes, so the figures in a result file can be recomputed from its own runs (tests/test_bench.py does).

Throughput is a ratio of sums: decode tokens / decode seconds over all runs of a (variant, dataset), where a run is
one generate() call (a batch), its decode tokens are the tokens produced after each row's first one (the first comes
from prefill; the peer's assisted generation may commit several in its first round, all counted with prefill) and its
decode seconds run from the end of prefill until the batch's last row finished. Compile time never falls inside
decode seconds: programs are compiled ahead of the clock and reported separately.
"""
from __future__ import annotations

import dataclasses
import math
import statistics

from ..theory.timing_model import expected_tokens, sd_speedup, ssd_speedup

SCHEMA = "ssd-jax-bench/1"
OUR_MODES = ("ar", "sd", "ssd")

# Sweep name -> (the option it sweeps, the modes it changes, default values).
SWEEPS = {
    "fan-out": ("fan_out", ("ssd",), ("1", "2", "3", "4", "6", "8")),
    "temperature": ("temperature", ("ar", "sd", "ssd", "hf-ar", "hf-sd"), ("0", "0.5", "1")),
    "saguaro-c": ("saguaro_c", ("ssd",), ("0.25", "0.5", "0.75", "1")),
    "batch": ("batch_size", ("ar", "sd", "ssd"), ("1", "2", "4", "8", "16")),
    "k": ("k", ("sd", "ssd", "hf-sd"), ("1", "2", "3", "4", "6")),
    "backup": ("backup", ("ssd",), ("neural", "fast", "ngram")),
    "ssd-placement": ("ssd_placement", ("ssd",), ("devices", "processes")),
    "ar-chunk": ("ar_chunk", ("ar",), ("1", "2", "4", "8")),
    "sd-chunk": ("sd_chunk", ("sd",), ("1", "2", "4", "8")),
    # AR and SD on the first N usable cores (the process pinned while the variant runs) and on all of them.
    "cores": ("cores", ("ar", "sd"), ("1", "all")),
}
def _cores(v: str) -> str:
  """A --sweep cores value: 'all' or a positive count of cores."""
  if v != "all" and not (v.isdigit() and int(v) > 0):
    raise ValueError(f"a cores value is 'all' or a positive integer, not {v!r}")
  return v


PARSE = {"fan_out": str, "temperature": float, "saguaro_c": float, "batch_size": int, "k": int, "backup": str,
         "ssd_placement": str, "ar_chunk": int, "sd_chunk": int, "cores": _cores}


@dataclasses.dataclass(frozen=True)
class Variant:
  """One configuration the bench times: a mode and its options (those a sweep changes differ between variants)."""

  mode: str
  options: tuple  # sorted (name, value) pairs: k, fan_out, fan_out_miss, backup, saguaro_c, temperature, batch_size,
  #                 ssd_placement, ar_chunk, sd_chunk, cores
  sweep_value: str | None = None  # the swept option's value, when the sweep changes this mode
  tag: str | None = None  # the backup of one of several SSD series (make_variants' `backups`)

  @property
  def series(self) -> str:
    """The line this variant belongs to in a sweep's plots and tables: its mode, or mode-tag ('ssd-fast')."""
    return self.mode if self.tag is None else f"{self.mode}-{self.tag}"

  @property
  def label(self) -> str:
    return self.series if self.sweep_value is None else f"{self.series}@{self.sweep_value}"

  @property
  def opts(self) -> dict:
    return dict(self.options)


def make_variants(modes, base: dict, sweep: str | None = None, values=None, backups=None) -> list[Variant]:
  """Returns the variants to time: each mode once, or once per sweep value for the modes the sweep changes; with
  `backups` (a list), SSD once per backup as well, each its own series (tag), e.g. ssd-fast@batch=4."""
  if sweep is not None and sweep not in SWEEPS:
    raise ValueError(f"unknown sweep {sweep!r}; choose from {', '.join(SWEEPS)}")
  if backups and sweep == "backup":
    raise ValueError("a backup sweep and a list of backups both set the backup: give one")
  name, changed, defaults = SWEEPS[sweep] if sweep else (None, (), ())
  values = list(values or defaults)
  out = []
  for m in modes:
    tags = list(backups) if backups and m == "ssd" else [None]
    for tag in tags:
      mode_base = base if tag is None else dict(base, backup=tag)
      if m not in changed:
        out.append(Variant(m, tuple(sorted(mode_base.items())), tag=tag))
        continue
      for v in values:
        opts = dict(mode_base, **{name: PARSE[name](v)})
        out.append(Variant(m, tuple(sorted(opts.items())), f"{sweep}={v}", tag))
  return out


def run_record(dataset: str, variant: Variant, prompt_indices, rows: list[dict], compile_seconds: float = 0.0) -> dict:
  """Returns the JSON record of one generate() call; rows hold each prompt's {token_ids, stats}."""
  stats = [r["stats"] for r in rows]
  decode_tokens = sum(s.get("decode_tokens", max(s["new_tokens"] - 1, 0)) for s in stats)
  return {"dataset": dataset, "variant": variant.label, "mode": variant.mode, "options": variant.opts,
          "sweep_value": variant.sweep_value, "prompt_indices": list(prompt_indices), "batch_size": len(rows),
          "decode_tokens": decode_tokens, "decode_seconds": max(s["decode_seconds"] for s in stats),
          "new_tokens": sum(s["new_tokens"] for s in stats),
          "target_forwards": sum(s["target_forwards"] for s in stats),
          "prefill_seconds": max(s["prefill_seconds"] for s in stats), "compile_seconds": round(compile_seconds, 4),
          "rows": rows}


def _weighted(pairs) -> float | None:
  """Returns sum(v w) / sum(w) over (value, weight) pairs with a value, or None."""
  pairs = [(v, w) for v, w in pairs if v is not None]
  total = sum(w for _, w in pairs)
  return sum(v * w for v, w in pairs) / total if total else None


def summarize_runs(runs: list[dict]) -> dict:
  """Returns the figures of a set of runs (one variant, one dataset or all)."""
  tokens = sum(r["decode_tokens"] for r in runs)
  seconds = sum(r["decode_seconds"] for r in runs)
  out = {"runs": len(runs), "decode_tokens": tokens, "decode_seconds": round(seconds, 6),
         "tokens_per_second": tokens / seconds if seconds > 0 else 0.0,
         "median_run_tokens_per_second": statistics.median(
             r["decode_tokens"] / r["decode_seconds"] if r["decode_seconds"] > 0 else 0.0 for r in runs),
         "new_tokens": sum(r["new_tokens"] for r in runs), "target_forwards": sum(r["target_forwards"] for r in runs),
         "compile_seconds": round(sum(r["compile_seconds"] for r in runs), 4)}
  out["tokens_per_target_forward"] = out["new_tokens"] / out["target_forwards"] if out["target_forwards"] else 0.0
  rows = [row["stats"] for r in runs for row in r["rows"]]
  if all("acceptance_rate" in s for s in rows):
    out["acceptance_rate"] = _weighted((s["acceptance_rate"], s["rounds"]) for s in rows)
  a_tok = _per_token_acceptance(rows)
  if a_tok is not None:
    out["per_token_acceptance"] = a_tok
  if all("cache_hit_rate" in s for s in rows):
    out["cache_hit_rate"] = _weighted((s["cache_hit_rate"], max(s["rounds"] - 1, 0)) for s in rows)
    # Idle time is measured once per batch: take it from each run's first row.
    idle = sum(r["rows"][0]["stats"]["target_idle_seconds"] for r in runs)
    out["target_idle_fraction"] = idle / seconds if seconds > 0 else 0.0
    # The speed with the target never idle (every round a verify and nothing else), and the round by part.
    out["zero_idle_tokens_per_second"] = tokens / (seconds - idle) if seconds > idle else 0.0
    first = [r["rows"][0]["stats"] for r in runs]
    if all("round_parts_seconds" in s for s in first):
      n = max(sum(s["loop_rounds"] for s in first), 1)
      out["round_ms"] = {"verify": 1e3 * sum(s["verify_seconds"] for s in first) / n,
                         "verify_call": 1e3 * sum(s.get("verify_call_seconds", 0.0) for s in first) / n,
                         **{p: 1e3 * sum(s["round_parts_seconds"][p] for s in first) / n
                            for p in first[0]["round_parts_seconds"]},
                         "draft_tree": 1e3 * sum(s["draft_tree_seconds"] for s in first) / n}
      out["hit_round_fraction"] = sum(s["hit_rounds"] for s in first) / n
  return out


def baseline_of(variant: Variant, base_mode: str, variants: list[Variant]) -> Variant | None:
  """Returns the variant of `base_mode` to compare `variant` with: the same sweep value where both are swept."""
  same = [v for v in variants if v.mode == base_mode]
  for v in same:
    if v.sweep_value is not None and v.sweep_value == variant.sweep_value:
      return v
  plain = [v for v in same if v.sweep_value is None]
  return plain[0] if plain else None


RATIO_PAIRS = (("ssd", "sd"), ("ssd", "ar"), ("sd", "ar"), ("ssd", "hf-sd"), ("ssd", "hf-ar"), ("hf-sd", "hf-ar"),
               ("sd", "hf-sd"), ("ar", "hf-ar"))


def _run_tokens(r: dict) -> tuple:
  return tuple(tuple(row["token_ids"]) for row in r["rows"])


def greedy_agreement(runs: list[dict], variants: list[Variant]) -> dict:
  """Returns, for each greedy variant, how its outputs compare with a greedy reference on the same prompts.

  The reference is our greedy AR for every other greedy variant, and transformers' greedy AR for transformers'
  assisted generation too. Greedy SD and SSD reproduce AR by construction; differences between the frameworks come
  from float rounding on near ties.
  """
  greedy = [v for v in variants if v.opts.get("temperature", 0.0) == 0]
  outs = {}
  for r in runs:
    for i, row in zip(r["prompt_indices"], r["rows"]):
      outs.setdefault((r["dataset"], i), {})[r["variant"]] = row["token_ids"]
  pairs = []
  for ref_mode, modes in (("ar", None), ("hf-ar", ("hf-sd",))):
    ref = next((v for v in greedy if v.mode == ref_mode), None)
    if ref is not None:
      pairs += [(v, ref) for v in greedy if v is not ref and (modes is None or v.mode in modes)]
  report = {}
  for v, ref in pairs:
    rep = {"reference": ref.label, "prompts": 0, "identical": 0, "divergences": []}
    for (d, i), got in sorted(outs.items()):
      if ref.label not in got or v.label not in got:
        continue
      a, b = got[ref.label], got[v.label]
      rep["prompts"] += 1
      first = next((j for j in range(min(len(a), len(b))) if a[j] != b[j]), None)
      if first is None and len(a) != len(b):
        first = min(len(a), len(b))
      if first is None:
        rep["identical"] += 1
      else:
        rep["divergences"].append({"dataset": d, "prompt_index": i, "first_differing_token": first})
    report[f"{v.label} vs {ref.label}"] = rep
  return report


def _per_token_acceptance(rows: list[dict]) -> float | None:
  """Returns drafts accepted / drafts tried pooled over decoder rows, or None where rows do not record them."""
  if not rows or not all("drafts_tried" in s for s in rows):
    return None
  tried = sum(s["drafts_tried"] for s in rows)
  return sum(s["drafts_accepted"] for s in rows) / tried if tried else None


def predict(runs: list[dict], mode: str) -> dict | None:
  """Returns the timing model's tokens/s for SD or SSD runs from their own measured statistics and costs, or None.

  SD (paper §1.5): E(a, K) tokens per round of one verify (t_v) plus K draft steps (t_d each), with a the measured
  per-token acceptance. SSD (Theorem 7): p_hit the measured cache hit rate; a round costs max(1, t_primary) verifies
  on a hit (t_primary = (verify + waiting for the tree after it) / verify) and 1 + t_backup on a miss (the neural
  backup's measured time; 0 for the random and n-gram backups, whose misses yield about one token). Costs come from
  the same runs (host-measured, in the decode loop); a batch of b rows produces b times the tokens of one row.
  """
  if not runs or mode not in ("sd", "ssd"):
    return None
  first = [r["rows"][0]["stats"] for r in runs]
  rows = [row["stats"] for r in runs for row in r["rows"]]
  need = ("k", "rounds", "acceptance_rate", "verify_seconds") + (
      ("draft_seconds",) if mode == "sd" else ("cache_hit_rate", "draft_wait_seconds", "backups_used"))
  if any(key not in s for s in rows for key in need):
    return None  # not a decoder of this project (or an older result file)
  k = first[0]["k"]
  b = statistics.mean(r["batch_size"] for r in runs)
  rounds = sum(s["rounds"] for s in first)
  a = _weighted((s["acceptance_rate"], s["rounds"]) for s in rows)
  if not rounds or a is None:
    return None
  # The model's a is the per-token acceptance (accepted over tried drafts); result files from before
  # drafts_tried was recorded only have the per-round rate, which understates it (E[tokens] then runs low).
  a_tok = _per_token_acceptance(rows)
  a_tok = a if a_tok is None else a_tok
  e = expected_tokens(a_tok, k)
  t_v = sum(s["verify_seconds"] for s in first) / rounds
  if t_v <= 0:
    return None
  if mode == "sd":
    t_d = sum(s["draft_seconds"] for s in first) / rounds / k
    per_verify = sd_speedup(a_tok, k, t_d / t_v)
    parts = {"acceptance": a, "per_token_acceptance": a_tok, "k": k, "expected_tokens_per_round": e,
             "verify_seconds": t_v, "draft_step_seconds": t_d}
  else:
    p_hit = _weighted((s["cache_hit_rate"], max(s["rounds"] - 1, 0)) for s in rows) or 0.0
    t_primary = 1 + sum(s["draft_wait_seconds"] for s in first) / rounds / t_v
    neural = sum(s["backups_used"].get("neural", 0) for s in first)
    t_backup = (sum(s.get("neural_backup_seconds", 0.0) for s in first) / neural / t_v) if neural else 0.0
    e_miss = e if first[0].get("backup") in ("neural", "auto") else 1.0
    per_verify = ssd_speedup(p_hit, e, e_miss, t_primary, t_backup, max(int(round(b)), 1))
    parts = {"acceptance": a, "per_token_acceptance": a_tok, "k": k, "cache_hit_rate": p_hit,
             "expected_tokens_per_round": e, "verify_seconds": t_v, "t_primary": t_primary, "t_backup": t_backup}
  return {"tokens_per_second": b * per_verify / t_v, **parts}


def summarize(runs: list[dict], variants: list[Variant], datasets: list[str]) -> dict:
  """Returns the summary: figures per variant and dataset ('all' pools every dataset), ratios, predictions."""
  table = {}
  for v in variants:
    table[v.label] = {}
    for d in datasets + ["all"]:
      rs = [r for r in runs if r["variant"] == v.label and (d == "all" or r["dataset"] == d)]
      if rs:
        table[v.label][d] = summarize_runs(rs)
        pred = predict(rs, v.mode)
        if pred is not None:
          table[v.label][d]["predicted"] = pred
  ratios = {}
  for v in variants:
    for num, den in RATIO_PAIRS:
      if v.mode != num:
        continue
      base = baseline_of(v, den, variants)
      if base is None:
        continue
      ratios[f"{v.label}/{base.label}"] = {
          d: table[v.label][d]["tokens_per_second"] / table[base.label][d]["tokens_per_second"]
          for d in table[v.label] if d in table[base.label] and table[base.label][d]["tokens_per_second"] > 0}
  return {"by_variant": table, "ratios": ratios, "greedy_agreement": greedy_agreement(runs, variants)}


def power_law_fit(xs, miss) -> dict | None:
  """Returns {r, c} of miss(F) = c F^-r fitted in log-log space to points with a positive miss rate, or None."""
  import numpy as np

  from ..theory.fan_out import fit_log_log

  pts = [(float(x), float(m)) for x, m in zip(xs, miss) if m is not None and m > 0]
  if len(pts) < 2:
    return None
  r, c = fit_log_log([p[0] for p in pts], [p[1] for p in pts])
  return {"r": r, "c": c, "points": len(pts), "max_abs_log_error": float(max(
      abs(np.log(m) - np.log(c * x ** -r)) for x, m in pts))}


def sweep_series(result: dict) -> dict | None:
  """Returns {series: [(value, tokens/s, hit rate or None)]} over the sweep values (all datasets pooled), or None;
  a series is a mode, or mode-backup with several backups (Variant.series)."""
  sweep = result["args"].get("sweep")
  if not sweep:
    return None
  name = SWEEPS[sweep][0]
  series = {}
  for v in result["variants"]:
    if v["sweep_value"] is None:
      continue
    fig = result["summary"]["by_variant"][v["label"]].get("all")
    if fig:
      series.setdefault(v.get("series", v["mode"]), []).append((PARSE[name](v["options"][name]) if name != "fan_out"
                                               else _fan_out_size(v["options"][name]),
                                               fig["tokens_per_second"], fig.get("cache_hit_rate")))
  for m in series:
    series[m].sort()
  return series


def _fan_out_size(spec: str) -> float:
  """Returns the mean fan-out per acceptance length of a fan-out option ('3' or '4,3,2,2,3')."""
  vals = [int(x) for x in str(spec).split(",") if x.strip()]
  return float(vals[0]) if len(vals) == 1 else sum(vals) / len(vals)


def fan_out_fit(result: dict) -> dict | None:
  """Returns the power-law fit of the SSD miss rate against fan-out from a fan-out sweep, or None."""
  if result["args"].get("sweep") != "fan-out":
    return None
  pts = (sweep_series(result) or {}).get("ssd", [])
  return power_law_fit([p[0] for p in pts], [None if p[2] is None else 1 - p[2] for p in pts])


def _fmt(x, spec=".2f") -> str:
  return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def round_table(result: dict) -> list[str]:
  """Returns the lines of SSD's round by part (ms per round, on the target's critical path between a verify's result
  and the next dispatch; the draft's tree time beside the verify's), with the zero-idle speed beside the measured."""
  by = result["summary"]["by_variant"]
  ssd = [(v["label"], by[v["label"]].get("all", {})) for v in result["variants"]]
  ssd = [(x, f) for x, f in ssd if "round_ms" in f]
  if not ssd:
    return []
  parts = [p for p in ssd[0][1]["round_ms"] if p not in ("verify", "verify_call", "draft_tree")]
  lines = ["", "SSD's round, ms per round (target idle = " + " + ".join(parts) + "; verify: its dispatch call, or "
           "the loop's previous callback, to its result; (call): what the program calls cost beside it, a call a "
           "round or, in one program, the calls' time outside their rounds):", "",
           "| variant | verify | (call) | " + " | ".join(parts) + " | draft tree | hit rounds | tok/s | zero-idle tok/s |",
           "|---|" + "---|" * (len(parts) + 6)]
  for x, f in ssd:
    r = f["round_ms"]
    lines.append(f"| {x} | {r['verify']:.2f} | {r['verify_call']:.2f} | " + " | ".join(f"{r[p]:.2f}" for p in parts)
                 + f" | {r['draft_tree']:.2f} | {_fmt(f.get('hit_round_fraction'))} | "
                 f"{_fmt(f.get('tokens_per_second'))} | {_fmt(f.get('zero_idle_tokens_per_second'))} |")
  return lines


def markdown(result: dict) -> str:
  """Returns the paper-style table: tokens/s per variant and dataset, ratios, tokens/forward, hits, idle."""
  summ, datasets = result["summary"], result["datasets"] + ["all"]
  labels = [v["label"] for v in result["variants"]]
  lines = ["| dataset | " + " | ".join(f"{x} tok/s" for x in labels) + " | "
           + " | ".join(summ["ratios"]) + " |",
           "|---|" + "---|" * (len(labels) + len(summ["ratios"]))]
  for d in datasets:
    cells = [_fmt(summ["by_variant"][x].get(d, {}).get("tokens_per_second")) for x in labels]
    cells += [_fmt(r.get(d)) + "x" for r in summ["ratios"].values()]
    lines.append(f"| {d} | " + " | ".join(cells) + " |")
  lines += ["", "| variant | tok/s (all) | median run tok/s | tok/target fwd | acceptance | cache hit rate | "
            "target idle | predicted tok/s | compile s | warm-up s |", "|---|---|---|---|---|---|---|---|---|---|"]
  for x in labels:
    f = summ["by_variant"][x].get("all", {})
    pred = f.get("predicted", {}).get("tokens_per_second")
    warm = result.get("warmup", {}).get(x, {}).get("wall_seconds")
    lines.append(f"| {x} | {_fmt(f.get('tokens_per_second'))} | {_fmt(f.get('median_run_tokens_per_second'))} | "
                 f"{_fmt(f.get('tokens_per_target_forward'))} | {_fmt(f.get('acceptance_rate'))} | "
                 f"{_fmt(f.get('cache_hit_rate'))} | {_fmt(f.get('target_idle_fraction'))} | {_fmt(pred)} | "
                 f"{_fmt(f.get('compile_seconds'), '.1f')} | {_fmt(warm, '.1f')} |")
  lines += round_table(result)
  agree = summ.get("greedy_agreement") or {}
  if agree:
    lines.append("")
    for name, rep in agree.items():
      where = ", ".join(f"{e['dataset']}[{e['prompt_index']}] at token {e['first_differing_token']}"
                        for e in rep["divergences"][:8])
      lines.append(f"greedy {name}: {rep['identical']}/{rep['prompts']} prompts identical"
                   + (f"; first differences: {where}" if where else ""))
  fit = result.get("fan_out_fit")
  if fit:
    lines.append(f"\nSSD miss rate against fan-out: miss(F) = {fit['c']:.3f} F^-{fit['r']:.3f} "
                 f"({fit['points']} points, max |log error| {fit['max_abs_log_error']:.2f})")
  return "\n".join(lines)
