#!/usr/bin/env python
"""Will it fit, and how fast: memory per device, step times and AR / SD / SSD tok/s for a target/draft pair.

  python scripts/plan.py --target llama-3.1-70b --draft llama-3.2-1b --target-devices 4 --draft-devices 1 \\
      --dtype bfloat16 --device h100-80gb
  python scripts/plan.py --target qwen3-32b --draft qwen3-0.6b --target-devices 8 --device tpu-v6e

GPUs (h100-80gb, h200) are sized and estimated analytically, with the assumptions printed. TPUs (tpu-v5e, tpu-v5p,
tpu-v6e) are also compiled for, every program of an SSD round on abstract bfloat16 arrays with the decoders'
shardings, through a libtpu topology on this host (pip install -e '.[tpu]'; nothing runs): at two depths and
extrapolated (--depths), or --full-depth. --calibration takes the JSON scripts/gpu_plan_check.sh writes and fits the
device's achieved bandwidth and per-kernel latency to it.
"""
from __future__ import annotations

import argparse
import json
import sys

from ssd_jax.cli_util import fail, run_main


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--target", required=True, help="a named model (llama-3.1-70b, qwen3-32b, ...) or a checkpoint dir")
  p.add_argument("--draft", required=True, help="a named model (llama-3.2-1b, qwen3-0.6b, ...) or a checkpoint dir")
  p.add_argument("--target-devices", type=int, default=4, help="tensor-parallel degree of the target")
  p.add_argument("--draft-devices", type=int, default=1, help="devices of the draft (one: its own)")
  p.add_argument("--dtype", default="bfloat16", help="weights: bfloat16, float16, float32, int8 (sized only)")
  p.add_argument("--device", default="h100-80gb", help="h100-80gb, h200, tpu-v5e, tpu-v5p, tpu-v6e")
  p.add_argument("--batch", type=int, default=1)
  p.add_argument("--prompt", type=int, default=128, help="prompt tokens (the paper: 128)")
  p.add_argument("--new-tokens", type=int, default=512, help="new tokens (the paper: 512)")
  p.add_argument("--k", type=int, default=None, help="SSD's K (default: the paper's for its pairs, else 7)")
  p.add_argument("--sd-k", type=int, default=None, help="SD's K (default: the paper's for its pairs, else 6)")
  p.add_argument("--fan-out", type=int, default=None, help="uniform fan-out F (default: the paper's, else 3)")
  p.add_argument("--p-hit", type=float, default=0.9, help="SSD's speculation cache hit rate (assumption)")
  p.add_argument("--acceptance", type=float, default=0.8, help="per-token acceptance for the estimate")
  p.add_argument("--attn", default="pallas", choices=("pallas", "ref"), help="attention in the TPU programs")
  p.add_argument("--no-compile", action="store_true", help="TPU: size and estimate only")
  p.add_argument("--depths", default="2,4", help="TPU: the two depths compiled and extrapolated from")
  p.add_argument("--full-depth", action="store_true", help="TPU: compile at every layer (slow for 70B)")
  p.add_argument("--slice", default=None, help="TPU slice shape, e.g. 4x4 (default: the smallest that holds all)")
  p.add_argument("--calibration", default=None, help="JSON from scripts/gpu_plan_check.sh")
  p.add_argument("--json-out", default=None)
  return p.parse_args(argv)


def _check(args) -> tuple | None:
  if args.draft_devices != 1:
    fail("--draft-devices must be 1: the draft runs on one device of its own (draft data parallelism is not built)")
  if not 0 <= args.acceptance < 1 or not 0 <= args.p_hit <= 1:
    fail("--acceptance must be in [0, 1) and --p-hit in [0, 1]")
  if any(x is not None and x < 1 for x in (args.k, args.sd_k, args.fan_out)):
    fail("--k, --sd-k and --fan-out must be >= 1")
  if args.full_depth:
    return None
  try:
    depths = tuple(int(x) for x in args.depths.split(","))
  except ValueError:
    depths = ()
  if len(depths) != 2 or min(depths) < 1 or depths[0] == depths[1]:
    fail(f"--depths takes two different layer counts like 2,4 (got {args.depths!r})")
  return depths


def _log(rec: dict) -> None:
  what = rec["error"] if "error" in rec else f"{rec['seconds']:.1f} s, peak {rec['peak'] / 2**30:.2f} GiB"
  print(f"  compiled {rec['name']} at {rec['depth']} layers: {what}", file=sys.stderr, flush=True)


def main(argv=None):
  args = parse_args(argv)
  depths = _check(args)
  from ssd_jax.plan import format_plan, make_plan

  calibration = None
  if args.calibration:
    try:
      with open(args.calibration) as f:
        calibration = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
      fail(f"cannot read --calibration {args.calibration}: {e}")
  try:
    plan = make_plan(args.target, args.draft, args.target_devices, args.device, args.dtype, args.batch, args.prompt,
                     args.new_tokens, args.k, args.sd_k, args.fan_out, args.p_hit, args.acceptance, args.attn,
                     not args.no_compile, depths, args.slice, calibration, log=_log)
  except RuntimeError as e:  # no libtpu
    fail(str(e))
  print(format_plan(plan))
  if args.json_out:
    with open(args.json_out, "w") as f:
      json.dump(plan, f, indent=1, default=lambda o: getattr(o, "__dict__", str(o)))
  return 0


if __name__ == "__main__":
  run_main(main)
