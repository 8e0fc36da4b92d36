"""Times the Pallas masked-attention kernel against the jnp reference; reports achieved bandwidth on the prefix read.

Shapes (issue #6): the draft's tree step (K=7, 24 branches = 8 acceptance lengths x fan-out 3, at a middle depth) and
the target's verify (K+1 = 8 causal queries), over prefixes of 1k-8k slots, GQA 9/3 (D=64, SmolLM2-135M) and 64/8
(D=128, a 70B-class model), bfloat16 cache. Each timed program chains `--chain` calls (each call's output is the next
call's query) so one dispatch covers many kernels; the figure is the median over `--iters` runs divided by the chain.
Bandwidth counts the K and V bytes of the prefix (B x prefix x G x D x 2 x itemsize), the read a decode step cannot
avoid; the reference additionally reads the whole cache and builds a dense mask.

    python scripts/dev/bench_kernels.py --out results/        # on a GPU (or TPU): writes kernel_bench.{json,md}
    python scripts/dev/bench_kernels.py --cpu-smoke --out /tmp  # tiny shapes, interpret mode: checks the script runs

CPU timings (interpret mode) say nothing about accelerator speed and are marked as such.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from ssd_jax.kernels import masked_attention as attn

# Spec-sheet HBM bandwidth (GB/s) by device-kind substring, most specific first; --peak-gbps overrides.
PEAK_GBPS = [("H200", 4800.0), ("H100 PCIe", 2000.0), ("H100", 3350.0), ("A100-SXM4-80GB", 2039.0),
             ("A100", 1555.0), ("L40S", 864.0), ("L4", 300.0), ("TPU v5 lite", 819.0), ("TPU v5p", 2765.0),
             ("TPU v6 lite", 1640.0), ("TPU v4", 1200.0)]
# Pallas block settings tried on an accelerator (keys per step, cache slots per program); the best is reported.
GPU_CONFIGS = [dict(), dict(block_k=64, split_k=256), dict(block_k=64, split_k=1024),
               dict(block_k=32, split_k=256, block_q=128)]
TPU_CONFIGS = [dict(), dict(block_k=256), dict(block_k=512)]


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--out", default=os.environ.get("OUT", "bench_out"), help="directory for kernel_bench.{json,md}")
  p.add_argument("--prefixes", default="1024,2048,4096,8192", help="prefix lengths (slots), comma-separated")
  p.add_argument("--heads", default="9/3/64,64/8/128", help="H/G/D triples, comma-separated")
  p.add_argument("--batch", default="1,8", help="batch sizes (sequences), comma-separated")
  p.add_argument("--ops", default="tree,verify", help="tree (24-branch draft step) and/or verify (K+1 causal)")
  p.add_argument("--chain", type=int, default=10, help="kernel calls chained in one timed program")
  p.add_argument("--iters", type=int, default=7, help="timed runs per program (median reported)")
  p.add_argument("--peak-gbps", type=float, default=None, help="the device's memory bandwidth, when not known")
  p.add_argument("--budget-s", type=float, default=240.0, help="stop starting new cases after this many seconds")
  p.add_argument("--cpu-smoke", action="store_true", help="tiny shapes, one config, interpret mode on CPU")
  return p.parse_args(argv)


def peak_gbps(kind: str, override: float | None) -> float | None:
  """Returns the device's spec-sheet memory bandwidth in GB/s (None when unknown and not given)."""
  if override:
    return override
  for key, gbps in PEAK_GBPS:
    if key in kind:
      return gbps
  return None


def case(op: str, b: int, prefix: int, h: int, g: int, d: int, dtype, seed: int = 0):
  """Returns (q, k, v, mask) for one call: a 24-branch tree step at depth 3 or a K+1 = 8 query verify."""
  k_spec, fan_out, depth = 7, (3,) * 8, 3
  n = sum(fan_out)
  num_slots = -(-(prefix + k_spec + 2 + k_spec * n) // 128) * 128  # the cache a round needs, no spare
  rng = np.random.default_rng(seed)
  t = n if op == "tree" else k_spec + 1
  q = jnp.asarray(rng.standard_normal((b, t, h, d), dtype=np.float32)).astype(dtype)
  kc = jnp.asarray(rng.standard_normal((b, num_slots, g, d), dtype=np.float32)).astype(dtype)
  vc = jnp.asarray(rng.standard_normal((b, num_slots, g, d), dtype=np.float32)).astype(dtype)
  lengths = np.full((b,), prefix, np.int32)
  if op == "tree":
    branch_j = np.repeat(np.arange(k_spec + 1), fan_out)
    mask = attn.MaskInfo(visible_end=jnp.asarray(lengths[:, None] + branch_j[None, :], jnp.int32),
                         tree_start=jnp.asarray(lengths + k_spec, jnp.int32),
                         tree_branch=jnp.asarray(np.broadcast_to(np.arange(n), (b, n)), jnp.int32),
                         tree_depth=jnp.full((b, n), depth, jnp.int32), tree_width=n)
  else:
    mask = attn.causal_mask_info(jnp.asarray(lengths[:, None] + np.arange(t)[None, :], jnp.int32))
  return q, kc, vc, mask


def chained(fn, n: int):
  """Returns a jitted program that applies fn n times, each output feeding the next query (nothing is elided)."""
  def run(q, k, v, mask):
    for _ in range(n):
      q = fn(q, k, v, mask)
    return q
  return jax.jit(run)


def time_program(prog, args, iters: int) -> float:
  """Returns the median wall time (s) of prog(*args) after one compile-and-warm-up run."""
  jax.block_until_ready(prog(*args))
  times = []
  for _ in range(iters):
    t0 = time.perf_counter()
    jax.block_until_ready(prog(*args))
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def copy_bandwidth(nbytes: int, iters: int) -> float:
  """Returns the measured GB/s of an elementwise pass over nbytes (read once, written once): what HBM gives XLA."""
  x = jnp.ones((nbytes // 2,), jnp.bfloat16)
  prog = jax.jit(lambda a: a * 2)
  return 2 * nbytes / time_program(prog, (x,), iters) / 1e9


def main(argv=None) -> int:
  args = parse_args(argv)
  backend = jax.default_backend()
  dev = jax.devices()[0]
  kind = getattr(dev, "device_kind", str(dev))
  if args.cpu_smoke:
    prefixes, heads, batches, dtype = [64], [(4, 2, 16)], [1], jnp.float32
    configs, chain, iters = [dict(block_k=16, split_k=32)], 2, 1
  else:
    prefixes = [int(x) for x in args.prefixes.split(",")]
    heads = [tuple(int(y) for y in x.split("/")) for x in args.heads.split(",")]
    batches = [int(x) for x in args.batch.split(",")]
    dtype = jnp.bfloat16
    configs = TPU_CONFIGS if backend == "tpu" else GPU_CONFIGS
    chain, iters = args.chain, args.iters
  peak = peak_gbps(kind, args.peak_gbps)
  copy_gbps = copy_bandwidth(1 << (24 if args.cpu_smoke else 30), iters)
  print(f"device: {kind} ({backend}); spec bandwidth {peak} GB/s; measured copy {copy_gbps:.0f} GB/s", flush=True)
  ref = chained(attn.ref_attention, chain)
  pallas = [(cfg, chained(lambda q_, k_, v_, m_, c=cfg: attn.pallas_attention(q_, k_, v_, m_, **c), chain))
            for cfg in configs]
  # The target case (tree step at prefix 4096) first, so a spent time budget drops the least important.
  cases = [(op, hgd, b, prefix) for op in args.ops.split(",") for hgd in heads for b in batches for prefix in prefixes]
  cases.sort(key=lambda c: (c[0] != "tree", c[3] != 4096, c[2] != 1))
  rows, start = [], time.time()
  result = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), device=kind,
                backend=backend, jax=jax.__version__, spec_gbps=peak, copy_gbps=copy_gbps, chain=chain,
                iters=iters, cpu_smoke=args.cpu_smoke, rows=rows, skipped=[])
  os.makedirs(args.out, exist_ok=True)
  for op, (h, g, d), b, prefix in cases:
    if time.time() - start > args.budget_s:
      result["skipped"].append(dict(op=op, heads=f"{h}/{g}", batch=b, prefix=prefix))
      print(f"time budget spent: skipping {op} H/G={h}/{g} B={b} prefix={prefix}", flush=True)
      continue
    q, kc, vc, mask = case(op, b, prefix, h, g, d, dtype)
    prefix_bytes = 2 * b * prefix * g * d * jnp.dtype(dtype).itemsize
    want = np.asarray(jax.jit(attn.ref_attention)(q, kc, vc, mask), np.float32)
    base = dict(op=op, heads=f"{h}/{g}", head_dim=d, batch=b, prefix=prefix, cache_slots=kc.shape[1],
                queries=q.shape[1], prefix_bytes=prefix_bytes)
    for cfg, prog in [(None, ref)] + pallas:
      row = dict(base, impl="ref" if cfg is None else f"pallas {cfg or 'defaults'}")
      try:
        if cfg is not None:
          got = np.asarray(attn.pallas_attention(q, kc, vc, mask, **cfg), np.float32)
          row["max_abs_err"] = float(np.abs(got - want).max())
        sec = time_program(prog, (q, kc, vc, mask), iters) / chain
        row.update(us=sec * 1e6, prefix_gbps=prefix_bytes / sec / 1e9)
        if peak:
          row["pct_of_peak"] = 100 * row["prefix_gbps"] / peak
      except Exception as e:  # a config the lowering rejects is a finding, not the end of the run
        row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
      rows.append(row)
      print(json.dumps(row), flush=True)
    write(result, peak, args.out)  # after every case, so a run cut short still leaves its figures
  write(result, peak, args.out)
  print(markdown(result))
  return 0


def write(result: dict, peak: float | None, out_dir: str):
  """Writes kernel_bench.json and kernel_bench.md (with the summary of the rows so far) into out_dir."""
  result["summary"] = summarise(result["rows"], peak)
  with open(os.path.join(out_dir, "kernel_bench.json"), "w") as f:
    json.dump(result, f, indent=1)
  with open(os.path.join(out_dir, "kernel_bench.md"), "w") as f:
    f.write(markdown(result))


def summarise(rows: list, peak: float | None) -> list:
  """Returns per case the best Pallas config, its speedup over the reference and, for the tree step at prefix 4096,
  whether it meets the issue's targets (>= 3x the reference, >= 50% of spec bandwidth)."""
  out = []
  keys = sorted({(r["op"], r["heads"], r["batch"], r["prefix"]) for r in rows})
  for key in keys:
    group = [r for r in rows if (r["op"], r["heads"], r["batch"], r["prefix"]) == key and "us" in r]
    ref = next((r for r in group if r["impl"] == "ref"), None)
    pallas = [r for r in group if r["impl"] != "ref"]
    if not ref or not pallas:
      continue
    best = min(pallas, key=lambda r: r["us"])
    item = dict(op=key[0], heads=key[1], batch=key[2], prefix=key[3], ref_us=ref["us"], best=best["impl"],
                best_us=best["us"], speedup=ref["us"] / best["us"], prefix_gbps=best["prefix_gbps"],
                pct_of_peak=best.get("pct_of_peak"))
    if key[0] == "tree" and key[3] == 4096:
      item["meets_3x"] = item["speedup"] >= 3
      item["meets_50pct_bw"] = None if peak is None else item["pct_of_peak"] >= 50
    out.append(item)
  return out


def markdown(result: dict) -> str:
  """Returns the results as a markdown report."""
  lines = [f"# Masked attention kernels: {result['device']} ({result['backend']}), {result['date']}", "",
           f"jax {result['jax']}; spec bandwidth {result['spec_gbps']} GB/s; measured copy bandwidth "
           f"{result['copy_gbps']:.0f} GB/s; {result['chain']} chained calls per program, median of "
           f"{result['iters']} runs."]
  if result["cpu_smoke"] or result["backend"] == "cpu":
    lines += ["", "**CPU run: interpret mode, tiny shapes. These times say nothing about accelerator speed.**"]
  lines += ["", "| op | H/G | B | prefix | ref us | best Pallas | us | speedup | prefix GB/s | % of spec | targets |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
  for s in result["summary"]:
    pct = "" if s["pct_of_peak"] is None else f"{s['pct_of_peak']:.0f}"
    targets = ""
    if "meets_3x" in s:
      targets = f"3x: {'yes' if s['meets_3x'] else 'no'}; 50% bw: {s['meets_50pct_bw']}"
    lines.append(f"| {s['op']} | {s['heads']} | {s['batch']} | {s['prefix']} | {s['ref_us']:.1f} | {s['best']} | "
                 f"{s['best_us']:.1f} | {s['speedup']:.2f}x | {s['prefix_gbps']:.0f} | {pct} | {targets} |")
  errors = [r for r in result["rows"] if "error" in r]
  if errors:
    lines += ["", "Failed variants:"] + [f"- {r['op']} {r['heads']} B={r['batch']} prefix={r['prefix']} "
                                         f"{r['impl']}: {r['error']}" for r in errors]
  if result["skipped"]:
    lines += ["", f"Not run (time budget): {len(result['skipped'])} cases."]
  worst = max((r.get("max_abs_err", 0.0) for r in result["rows"]), default=0.0)
  lines += ["", f"Largest |Pallas - reference| over all cases: {worst:.3g}", ""]
  return "\n".join(lines)


if __name__ == "__main__":
  sys.exit(main())
