#!/usr/bin/env python
"""Time the steps the plan estimates on this device: random-weight models of the paper's shapes, one device.

  python scripts/dev/plan_calibrate.py --out calibration.json                 # on a GPU (scripts/gpu_plan_check.sh)
  python scripts/dev/plan_calibrate.py --tiny --out /tmp/calibration.json     # CPU dry run of the same logic

For each model (default Llama-3.1-8B, the largest target one 80 GB device holds, and the Llama-3.2-1B draft), in
bfloat16 with a bfloat16 KV cache holding --context tokens: the forward of T = 1..--verify-max new tokens (T = 1 is
the AR step and the draft's step, T = K+1 a verify), each the median of --reps runs after warm-up, compiled ahead of
the clock with the kernels a run on this device picks. Writes the JSON `scripts/plan.py --calibration` reads, after
every model, and stops starting models after --budget-s.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time

from ssd_jax.cli_util import fail, run_main


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--models", default="llama-3.1-8b,llama-3.2-1b")
  p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
  p.add_argument("--context", type=int, default=640, help="cached tokens before the step (the paper's 128 + 512)")
  p.add_argument("--verify-max", type=int, default=9, help="largest T timed (K+1 for K up to 8)")
  p.add_argument("--reps", type=int, default=20)
  p.add_argument("--attn", default="auto", choices=("auto", "ref", "pallas"))
  p.add_argument("--budget-s", type=float, default=360.0, help="start no model after this many seconds")
  p.add_argument("--tiny", action="store_true", help="2-layer, narrow versions of the models (a CPU dry run)")
  p.add_argument("--out", required=True)
  return p.parse_args(argv)


def tiny(cfg):
  """Returns a 2-layer, narrow model of the same family (the CPU dry run's shapes)."""
  return dataclasses.replace(cfg, n_layers=2, d_model=128, ffn_dim=256, n_heads=4, n_kv_heads=2, head_dim=32,
                             vocab_size=1024, name=cfg.name + "-tiny")


def time_steps(cfg, dtype, context: int, t_max: int, reps: int, attn: str) -> dict:
  """Returns {T: median seconds} of one forward of T new tokens after `context` cached ones, T = 1..t_max."""
  import jax
  import jax.numpy as jnp
  from ssd_jax.models import model
  from ssd_jax.kernels.platform import device_platform
  from ssd_jax.models.kv_cache import KVCache, round_slots

  platform = device_platform(jax.devices()[0])
  params = jax.jit(model.init_params, static_argnums=(1, 2))(jax.random.key(0), cfg, jnp.dtype(dtype))
  cache = KVCache.init(cfg, 1, round_slots(context + t_max), jnp.dtype(dtype))
  cache = cache.replace(lengths=jnp.asarray([context], jnp.int32))
  fwd = jax.jit(model.forward_causal, static_argnames=("cfg", "attn_impl", "platform"))
  out = {}
  for t in range(1, t_max + 1):
    toks = jnp.ones((1, t), jnp.int32)
    exe = fwd.lower(params, toks, cache, cfg=cfg, attn_impl=attn, platform=platform).compile()
    times = []
    for i in range(reps + 3):
      t0 = time.perf_counter()
      jax.block_until_ready(exe(params, toks, cache))  # the cache is not donated: every call is the same step
      if i >= 3:
        times.append(time.perf_counter() - t0)
    out[t] = statistics.median(times)
  del params, cache
  return out


def main(argv=None):
  args = parse_args(argv)
  if args.context < 1 or args.verify_max < 1 or args.reps < 1:
    fail("--context, --verify-max and --reps must be >= 1")
  import jax
  from ssd_jax.plan.configs import named

  try:
    cfgs = [named(m) for m in args.models.split(",")]
  except ValueError as e:
    fail(str(e))
  if args.tiny:
    cfgs = [tiny(c) for c in cfgs]
  dev = jax.devices()[0]
  out = {"schema": "ssd-jax-calibration/1", "device": getattr(dev, "device_kind", str(dev)),
         "platform": dev.platform, "jax": jax.__version__, "dtype": args.dtype, "attn": args.attn, "models": {}}
  start = time.perf_counter()
  for cfg in cfgs:
    if time.perf_counter() - start > args.budget_s:
      print(f"budget spent: {cfg.name} not timed", file=sys.stderr)
      break
    steps = time_steps(cfg, args.dtype, args.context, args.verify_max, args.reps, args.attn)
    out["models"][cfg.name] = {"config": json.loads(cfg.to_json()), "batch": 1, "context": args.context,
                               "ar_step_s": steps[1], "verify_s": {str(t): s for t, s in steps.items()}}
    print(f"{cfg.name}: step {steps[1] * 1e3:.2f} ms; T={args.verify_max} {steps[args.verify_max] * 1e3:.2f} ms",
          file=sys.stderr, flush=True)
    with open(args.out, "w") as f:
      json.dump(out, f, indent=1)
  return 0


if __name__ == "__main__":
  run_main(main)
