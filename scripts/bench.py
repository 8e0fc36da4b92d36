#!/usr/bin/env python
"""Measure decoding speed: AR (and SD with the shipped draft) on the benchmark prompt sets, interleaved.

  python scripts/bench.py --modes ar,sd --datasets humaneval,gsm8k,alpaca,mtbench --num-prompts 4 --max-new-tokens 128

Each prompt is decoded once per mode, modes interleaved prompt by prompt (machine drift hits all modes alike);
compile time is excluded (a warm-up prompt per mode first). Reports per mode and dataset the median decode tokens/s
and tokens per target forward, the AR step time against the memory-bandwidth limit (weight bytes read per token /
measured streaming bandwidth), and the process's peak memory. --json-out keeps every per-prompt figure.
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time

from ssd_jax.cli_util import fail, run_main, split_cpu

split_cpu(2)  # SSD puts the draft on its own device



def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--modes", default="ar,sd,ssd")
  p.add_argument("--datasets", default="humaneval,gsm8k,alpaca,mtbench")
  p.add_argument("--num-prompts", type=int, default=4)
  p.add_argument("--max-new-tokens", type=int, default=128)
  p.add_argument("--k", type=int, default=4)
  p.add_argument("--fan-out", type=int, default=3)
  p.add_argument("--temperature", type=float, default=0.0)
  p.add_argument("--verify-cost", action="store_true",
                 help="only measure the target forward cost for T = 1..9 new tokens (verify of K = T-1) vs T = 1")
  p.add_argument("--json-out")
  return p.parse_args(argv)


def verify_cost_table(pipe, prefix: int = 300, repeats: int = 15):
  """Returns {T: median ms} of one target forward of T tokens after a `prefix`-token cache (AOT compiled)."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  from ssd_jax import model
  from ssd_jax.kv_cache import KVCache
  cfg, params = pipe.target.cfg, pipe.target.params
  fwd = jax.jit(model.forward_causal, static_argnames=("cfg",), donate_argnames=("cache",))
  out = {}
  for t in range(1, 10):
    cache = KVCache.init(cfg, 1, 512).replace(lengths=jnp.asarray([prefix], jnp.int32))
    toks = jnp.ones((1, t), jnp.int32)
    exe = fwd.lower(params, toks, cache, cfg=cfg).compile()
    for _ in range(3):
      logits, cache = exe(params, toks, cache)
    logits.block_until_ready()
    ts = []
    for _ in range(repeats):
      t0 = time.perf_counter()
      logits, cache = exe(params, toks, cache)
      logits.block_until_ready()
      ts.append(time.perf_counter() - t0)
    out[t] = float(np.median(ts) * 1e3)
  return out


def streaming_bandwidth_gbs(n_bytes: int = 1 << 30, repeats: int = 7) -> float:
  """Returns the median read bandwidth (GB/s) of a jitted reduction over a large float32 array."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  x = jnp.ones((n_bytes // 4,), jnp.float32)
  f = jax.jit(lambda a: jnp.sum(a))
  f(x).block_until_ready()
  ts = []
  for _ in range(repeats):
    t = time.perf_counter()
    f(x).block_until_ready()
    ts.append(time.perf_counter() - t)
  del x
  return n_bytes / float(np.median(ts)) / 1e9


def main(argv=None):
  args = parse_args(argv)
  import jax

  from ssd_jax import api, datasets

  modes = [m for m in args.modes.split(",") if m]
  for m in modes:
    if m not in api.MODES:
      fail(f"unknown mode {m!r}; available: {', '.join(api.MODES)}")
  if args.verify_cost:
    pipe = api.load(draft=None)
    table = verify_cost_table(pipe)
    print("| new tokens T (verify K = T-1) | ms | cost / AR step |\n|---|---|---|")
    for t, ms in table.items():
      print(f"| {t} | {ms:.1f} | {ms / table[1]:.2f}x |")
    if args.json_out:
      with open(args.json_out, "w") as f:
        json.dump({"verify_cost_ms": table}, f, indent=1)
    return 0
  names = [d for d in args.datasets.split(",") if d]
  prompts = {d: datasets.load_prompts(d, args.num_prompts) for d in names}
  spec = any(m in ("sd", "ssd") for m in modes)
  pipe = api.load(draft="default" if spec else None)
  if spec and pipe.draft is None:
    fail("modes sd/ssd need the shipped draft (checkpoints/draft-smollm2)")
  kw = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, ignore_eos=True, k=args.k,
            fan_out=args.fan_out)
  for m in modes:  # warm-up: compile every program the timed runs use
    pipe.generate([prompts[names[0]][0]], mode=m, **kw)
  rows = []
  for d in names:
    for i, p in enumerate(prompts[d]):
      for m in modes:
        g = pipe.generate([p], mode=m, **kw)[0]
        rows.append({"dataset": d, "prompt_index": i, "mode": m, **g.stats})
        extra = (f", hits {g.stats['cache_hit_rate']:.2f}, target idle {g.stats['target_idle_seconds']:.2f} s"
                 if m == "ssd" else "")
        print(f"[bench] {d}[{i}] {m}: {g.stats['tokens_per_second']:.2f} tok/s, "
              f"{g.stats['tokens_per_target_forward']:.2f} tok/forward{extra}", file=sys.stderr, flush=True)
  bw = streaming_bandwidth_gbs()
  weight_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(pipe.target.params))
  summary = {}
  print("\n| dataset | " + " | ".join(f"{m} tok/s | {m} tok/fwd" for m in modes) + " |")
  print("|---|" + "---|---|" * len(modes))
  for d in names + ["all"]:
    cells = []
    for m in modes:
      rs = [r for r in rows if r["mode"] == m and (d == "all" or r["dataset"] == d)]
      tps = statistics.median(r["tokens_per_second"] for r in rs)
      tpf = statistics.median(r["tokens_per_target_forward"] for r in rs)
      summary[f"{d}/{m}"] = {"tokens_per_second": tps, "tokens_per_target_forward": tpf}
      cells += [f"{tps:.2f}", f"{tpf:.2f}"]
    print(f"| {d} | " + " | ".join(cells) + " |")
  if "ar" in modes:
    ar_tps = summary["all/ar"]["tokens_per_second"]
    limit_ms = weight_bytes / (bw * 1e9) * 1e3
    print(f"\nAR: {1e3 / ar_tps:.1f} ms/token; weights {weight_bytes / 1e6:.0f} MB at measured {bw:.1f} GB/s "
          f"=> bandwidth limit {limit_ms:.1f} ms/token; AR reaches {limit_ms * ar_tps / 1e3:.0%} of it")
    summary["ar_bandwidth"] = {"stream_gbs": bw, "weight_bytes": weight_bytes, "limit_ms": limit_ms,
                               "fraction_of_limit": limit_ms * ar_tps / 1e3}
  for a, b in (("sd", "ar"), ("ssd", "ar"), ("ssd", "sd")):
    if a in modes and b in modes:
      ratios = {d: summary[f"{d}/{a}"]["tokens_per_second"] / summary[f"{d}/{b}"]["tokens_per_second"]
                for d in names + ["all"]}
      summary[f"{a}/{b}"] = ratios
      print(f"{a.upper()}/{b.upper()}: " + ", ".join(f"{d} {r:.2f}x" for d, r in ratios.items()))
  if "ssd" in modes:
    rs = [r for r in rows if r["mode"] == "ssd"]
    summary["ssd_cache_hit_rate"] = statistics.median(r["cache_hit_rate"] for r in rs)
    summary["ssd_target_idle_fraction"] = statistics.median(r["target_idle_seconds"] / r["decode_seconds"]
                                                            for r in rs if r["decode_seconds"] > 0)
    print(f"SSD cache hit rate (median) {summary['ssd_cache_hit_rate']:.2f}; target idle fraction "
          f"{summary['ssd_target_idle_fraction']:.2f}")
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  print(f"peak resident memory: {peak:.0f} MB")
  summary["peak_rss_mb"] = peak
  if args.json_out:
    with open(args.json_out, "w") as f:
      json.dump({"args": vars(args), "rows": rows, "summary": summary}, f, indent=1)
  return 0


if __name__ == "__main__":
  run_main(main)
