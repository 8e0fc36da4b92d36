"""A plan for a target/draft pair on a device: memory per device, what fits, step times and AR / SD / SSD tokens a
second beside the paper's measured figures, as a dict (JSON) and as text.
"""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from ..decode.base import cache_slots
from ..decode.draft import CACHE_DTYPE as DRAFT_CACHE_DTYPE
from .devices import GIB, Device, assumptions
from .estimate import Setting, acceptance_for_sd, step_times, tokens_per_second
from .memory import kv_bytes_per_token, largest_batch, param_bytes, sizing

# The paper's measured decode tok/s at batch 1, greedy, 512 output tokens (docs/ssd_algorithm.md §7): Llama on
# 4 H100s (TP) + 1 for the draft, averages over four datasets; Qwen3 from a reproduction quoting the paper.
PAPER = {
    ("llama-3.1-70b", "llama-3.2-1b"): dict(ar=54.7, sd=161.8, ssd=255.8, where="4+1 H100", sd_k=6, k=7, f=3),
    ("qwen3-32b", "qwen3-0.6b"): dict(ar=88.8, sd=136.8, ssd=203.8, where="4+1 H100", sd_k=5, k=4, f=2),
}
CONTEXTS = (2048, 8192, 32768, 131072)


def workspace_bytes(cfg, tp: int, batch: int, rows: int, slots: int, attn_impl: str) -> int:
  """Returns an estimate of a program's temporaries on a device (analytic devices; a TPU plan has the compiler's):
  float32 logits and probabilities, float32 activations of one layer, and with the reference attention its float32
  scores over the whole cache."""
  heads = cfg.n_heads // tp if cfg.n_heads % tp == 0 else cfg.n_heads
  ffn = cfg.ffn_dim // tp if cfg.ffn_dim % tp == 0 else cfg.ffn_dim
  act = batch * rows * 4 * (2 * cfg.out_vocab + 4 * cfg.d_model + 3 * ffn)
  scores = batch * heads * rows * slots * 4 * 2 if attn_impl == "ref" else 0
  return act + scores


def memory_plan(tcfg, dcfg, tp: int, dev: Device, dtype: str, s: Setting, prompt: int, new: int,
                attn_impl: str) -> dict:
  """Returns bytes per device (target device, draft device), the fit and the largest batch per context."""
  z = sizing(tcfg, dcfg, tp, s.batch, prompt, new, s.k, s.fan_out, dtype)
  n = sum(s.fan_out)
  t_ws = max(workspace_bytes(tcfg, tp, s.batch, r, z.target_slots, attn_impl) for r in (s.k + 1, prompt))
  d_ws = workspace_bytes(dcfg, 1, s.batch, max(n, prompt), z.draft_slots, attn_impl)
  target = dict(params=z.target_params, kv=z.target_kv, workspace=t_ws)
  draft = dict(params=z.draft_params, kv=z.draft_kv, spec_cache=z.spec_cache, workspace=d_ws)
  for side in (target, draft):
    side["total"] = sum(side.values())
    side["fits"] = side["total"] <= dev.memory
  tcache = jnp.bfloat16 if dtype == "int8" else jnp.dtype(dtype)
  fit = {}
  for c in CONTEXTS:
    if c > min(tcfg.max_seq_len, dcfg.max_seq_len):
      continue
    t_row = (kv_bytes_per_token(tcfg, tp, tcache) * cache_slots(c, 0, s.k + 2)
             + t_ws / s.batch)
    d_row = (kv_bytes_per_token(dcfg, 1, DRAFT_CACHE_DTYPE) * cache_slots(c, 0, 2 * n * s.k)
             + (z.spec_cache + d_ws) / s.batch)
    fit[c] = min(largest_batch(dev.memory - z.target_params, t_row), largest_batch(dev.memory - z.draft_params, d_row))
  return dict(target=target, draft=draft, largest_batch=fit, target_slots=z.target_slots, draft_slots=z.draft_slots)


def smallest_fitting_mesh(tcfg, dev: Device, dtype: str, kv_and_ws: int) -> int | None:
  """Returns the smallest power-of-two tensor-parallel degree (up to 64) whose parameter shard plus `kv_and_ws`
  fits one device, None if none does."""
  tp = 1
  while tp <= 64:
    if param_bytes(tcfg, tp, dtype) + kv_and_ws <= dev.memory:
      return tp
    tp *= 2
  return None


def speed_plan(tcfg, dcfg, tp: int, dev: Device, dtype: str, s: Setting, acceptance: float) -> dict:
  """Returns step times (seconds), the estimate at `acceptance`, and against the paper's figures when the pair is
  one of the paper's: ratios, the estimate scaled to the paper's AR, and the acceptance that meets its SD."""
  times = step_times(tcfg, dcfg, tp, dev, dtype, s)
  est = tokens_per_second(times, acceptance, s)
  out = dict(times=times, acceptance=acceptance, estimate=est)
  paper = PAPER.get((tcfg.name, dcfg.name))
  if paper is not None and s.batch == 1:
    out.update(paper=paper, ratio={m: est[m] / paper[m] for m in ("ar", "sd", "ssd")})
    if dev.name != "h100-80gb":  # the paper measured on H100s: calibrating another device to it means nothing
      return out
    scale = paper["ar"] / est["ar"]
    a_sd = acceptance_for_sd(times, s, paper["sd"], scale)
    out.update(ar_scale=scale, calibrated={m: est[m] * scale for m in ("ar", "sd", "ssd")}, acceptance_meeting_sd=a_sd)
    if a_sd is not None:
      out["ssd_at_that_acceptance"] = tokens_per_second(times, a_sd, s)["ssd"] * scale
  return out


def format_memory(m: dict, dev: Device, tp: int) -> list[str]:
  t, d = m["target"], m["draft"]
  row = lambda label, a, b: f"  {label:<36}{a:>12}{b:>12}"  # noqa: E731
  gib = lambda x: f"{x / GIB:.2f}"  # noqa: E731
  fit = lambda side: f"{'' if side['fits'] else 'NOT '}fits"  # noqa: E731
  lines = [row("Memory per device (GiB)", f"target x{tp}", "draft"),
           row("parameters", gib(t["params"]), gib(d["params"])),
           row(f"KV cache ({m['target_slots']} / {m['draft_slots']} slots)", gib(t["kv"]), gib(d["kv"])),
           row("speculation cache", "-", gib(d["spec_cache"])),
           row("workspace (estimate)", gib(t["workspace"]), gib(d["workspace"])),
           row(f"total, of {dev.memory / GIB:.1f}", gib(t["total"]), gib(d["total"])),
           row("", fit(t), fit(d))]
  lb = ", ".join(f"{c // 1024}k: {b}" for c, b in m["largest_batch"].items())
  lines.append(f"  largest batch by context (prompt + new tokens): {lb}")
  return lines


def format_speed(sp: dict, s: Setting, dev: Device) -> list[str]:
  t = {k: v * 1e3 for k, v in sp["times"].items()}
  lines = [f"Step times (ms; {assumptions(dev)})",
           f"  AR step {t['ar']:.2f} | verify K={s.k} {t['verify']:.2f} | draft step {t['draft_step']:.2f} | "
           f"glue {t['glue']:.2f} | tree step ({sum(s.fan_out)} branches) {t['tree_step']:.2f} | "
           f"chain K={s.k} {t['chain']:.2f} | transfers {t['transfer']:.3f}",
           f"  SSD's draft work over the verify: {sp['estimate']['ssd_primary_over_verify']:.2f} "
           f"({'hidden' if sp['estimate']['ssd_primary_over_verify'] <= 1 else 'the target waits'})",
           f"Tokens a second (batch {s.batch}; SD K={s.sd_k}; SSD K={s.k}, fan-out {s.fan_out[0]}"
           f"{'' if len(set(s.fan_out)) == 1 else '...'}, p_hit {s.p_hit}, neural backup)",
           f"  {'':<40}{'AR':>9}{'SD':>9}{'SSD':>9}",
           _row(f"estimate at acceptance {sp['acceptance']:.2f}", sp["estimate"])]
  if "paper" in sp:
    p = sp["paper"]
    lines += [_row(f"paper ({p['where']})", p), _row("estimate / paper", sp["ratio"], "{:8.2f}x")]
    if "calibrated" not in sp:
      return lines + ["  (the paper measured on H100s: no calibration to it on another device)"]
    lines.append(_row(f"calibrated to the paper's AR (x{sp['ar_scale']:.3f})", sp["calibrated"]))
    a = sp["acceptance_meeting_sd"]
    lines.append("  acceptance at which the calibrated SD meets the paper's: "
                 + (f"{a:.3f}; SSD there: {sp['ssd_at_that_acceptance']:.1f} tok/s (paper {p['ssd']})"
                    if a is not None else "none in [0, 1)"))
  return lines


def _row(label: str, v: dict, fmt: str = "{:9.1f}") -> str:
  return f"  {label:<40}" + "".join(fmt.format(v[m]) for m in ("ar", "sd", "ssd"))


def setting_for(tcfg, dcfg, **overrides) -> Setting:
  """Returns the paper's setting for a paper pair (its K, SD's K, uniform fan-out), else the defaults; overrides
  that are None are ignored."""
  paper = PAPER.get((tcfg.name, dcfg.name), {})
  base = dict(sd_k=paper.get("sd_k", 6), k=paper.get("k", 7))
  f = overrides.pop("fan_out", None) or paper.get("f", 3)
  base.update({k: v for k, v in overrides.items() if v is not None})
  return dataclasses.replace(Setting(), **base, fan_out=(f,) * (base["k"] + 1) if isinstance(f, int) else tuple(f))


def facts(tcfg, dcfg, tp: int, dev: Device, dtype: str, s: Setting, prompt: int, mem: dict) -> list[str]:
  """Returns what a user needs to know before paying for the devices, from this plan's numbers."""
  t = mem["target"]
  rest = t["kv"] + t["workspace"]
  out = []
  for dt in dict.fromkeys((dtype, "bfloat16", "int8")):
    need = smallest_fitting_mesh(tcfg, dev, dt, rest)
    out.append(f"{tcfg.name} weights in {dt}: {param_bytes(tcfg, tp, dt) / GIB:.1f} GiB on each of {tp} devices; "
               f"the smallest power-of-two mesh of {dev.name} that holds them with this cache: "
               + (f"{need}" if need else "none up to 64"))
  heads = tcfg.n_heads // tp if tcfg.n_heads % tp == 0 else tcfg.n_heads
  for t_pre in dict.fromkeys((prompt, 8192)):
    slots = cache_slots(t_pre, 0, s.k + 2)
    out.append(f"reference attention ('ref') over a {t_pre}-token prefill holds {heads} x {t_pre} x {slots} float32 "
               f"scores a layer on each target device: {heads * t_pre * slots * 4 / GIB:.2f} GiB (twice that with the "
               f"probabilities); the Pallas kernels hold one block")
  fan_shapes = 1  # SSD compiles the tree for its hit and miss fan-outs; equal here (uniform)
  out.append(f"one run compiles {12 + (s.sd_k != s.k) + fan_shapes} programs (target: prefill, first token, "
             f"verify, AR step; draft: prefill, chain, tree, a hit's q, serve, merge, two fast backups; SD's chain) for "
             f"one (batch, prompt bucket of 64, cache size rounded to 128, K, fan-out); any new value of those is a "
             f"new set. They compile before the clock (Programs.compile_only) and scripts keep them in JAX's "
             f"persistent compilation cache")
  out.append(f"the draft's KV cache is {jnp.dtype(DRAFT_CACHE_DTYPE).name} whatever the weights' dtype "
             f"({mem['draft']['kv'] / GIB:.2f} GiB here); weights stay in the checkpoint's dtype "
             f"(`load(dtype=...)`); widened to float32 they would take {param_bytes(tcfg, tp, 'float32') / GIB:.1f} "
             f"GiB per target device")
  if dev.platform == "gpu":
    out.append("JAX preallocates 75% of a GPU's memory: a total above that needs XLA_PYTHON_CLIENT_MEM_FRACTION "
               f"(up to ~0.95; {0.75 * dev.memory / GIB:.1f} GiB at the default)")
  return out


def format_compiled(recs: list, topology: str, dev: Device) -> list[str]:
  """Returns the compiler's view: per program the depth, compile seconds and bytes per device; per side the peak."""
  lines = [f"Compiled for {topology} (GiB per device; 'a,b->L': compiled at a and b layers, bytes "
           f"extrapolated linearly to L, compile seconds the two compiles' sum)",
           f"  {'program':<44}{'depth':>9}{'compile s':>10}{'args':>8}{'temp':>8}{'peak':>8}  shardings"]
  for r in recs:
    if "error" in r:
      lines.append(f"  {r['name']:<44} FAILED: {r['error']}")
      continue
    depth = ("{},{}->{}".format(*r['extrapolated_from'], r['depth']) if "extrapolated_from" in r else str(r['depth']))
    lines.append(f"  {r['name']:<44}{depth:>9}{r['seconds']:>10.1f}{r['argument'] / GIB:>8.2f}"
                 f"{r['temp'] / GIB:>8.2f}{r['peak'] / GIB:>8.2f}  {'as intended' if r['sharding_ok'] else 'RESHARDS'}")
  for side in ("target", "draft"):
    ok = [r for r in recs if r["side"] == side and "error" not in r]
    if ok:
      worst = max(ok, key=lambda r: r["peak"])
      lines.append(f"  {side} device peak: {worst['peak'] / GIB:.2f} of {dev.memory / GIB:.1f} GiB ({worst['name']})"
                   f" -> {'fits' if worst['peak'] <= dev.memory else 'DOES NOT FIT'}")
  failed = [r["name"] for r in recs if "error" in r]
  bad = [r["name"] for r in recs if not r.get("sharding_ok", True)]
  lines.append(f"  {len(recs) - len(failed)}/{len(recs)} programs compiled"
               + (f"; failed: {', '.join(failed)}" if failed else "")
               + (f"; cache resharded by: {', '.join(bad)}" if bad else ""))
  return lines
