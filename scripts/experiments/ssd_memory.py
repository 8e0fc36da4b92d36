#!/usr/bin/env python
"""Memory of SSD on the real pair: the speculation cache's bytes and the process's peak resident memory.

  python scripts/experiments/ssd_memory.py --batch 1 --k 7 --fan-out 3
  python scripts/experiments/ssd_memory.py --batch 16 --k 7 --fan-out 3

Run one configuration per process: peak RSS is a high-water mark for the whole process (the target's and draft's
weights, compiled programs, KV caches, the speculation cache and the JAX runtime together).
"""
from __future__ import annotations

import argparse
import json
import resource
import sys

from ssd_jax.cli_util import fail, run_main, split_cpu


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--batch", type=int, default=1)
  p.add_argument("--k", type=int, default=7)
  p.add_argument("--fan-out", type=int, default=3)
  p.add_argument("--max-new-tokens", type=int, default=32)
  p.add_argument("--json-out")
  args = p.parse_args(argv)
  if min(args.batch, args.k, args.fan_out, args.max_new_tokens) < 1:
    fail("--batch, --k, --fan-out and --max-new-tokens must be >= 1")
  split_cpu(2)
  from ssd_jax import api
  from ssd_jax.data import datasets

  pipe = api.load(ssd_placement="devices")  # the tree in this process, where its peak RSS is measured
  if pipe.draft is None:
    fail("no draft found (checkpoints/draft-smollm2)")
  prompts = (datasets.load_prompts("alpaca", args.batch) * args.batch)[:args.batch]
  gens = pipe.generate(prompts, mode="ssd", k=args.k, fan_out=args.fan_out, max_new_tokens=args.max_new_tokens,
                       batch_size=args.batch, ignore_eos=True)
  cache = gens[0].stats["speculation_cache_bytes"]
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
  n = args.fan_out * (args.k + 1)
  full = args.batch * n * args.k * pipe.draft.cfg.vocab_size * 4
  out = {"batch": args.batch, "k": args.k, "fan_out": args.fan_out, "branches_per_row": n,
         "speculation_cache_bytes": cache, "same_cache_over_full_vocab_bytes": full, "peak_rss_bytes": peak}
  print(json.dumps(out))
  print(f"B={args.batch} K={args.k} F={args.fan_out}: speculation cache {cache / 2**20:.1f} MiB "
        f"(over the full vocabulary it would be {full / 2**20:.1f} MiB); peak RSS {peak / 2**30:.2f} GiB",
        file=sys.stderr)
  if args.json_out:
    with open(args.json_out, "w") as f:
      json.dump(out, f, indent=1)
  return 0


if __name__ == "__main__":
  run_main(main)
