#!/usr/bin/env python
"""Measure what geometric fan-out (paper Theorem 12) needs: the acceptance rate a_p and the miss-rate exponent r.

  python scripts/calibrate_fan_out.py --num-prompts 16 --max-new-tokens 96 --temperature 0

Runs SSD on ShareGPT prompts that draft training leaves out (datasets.sharegpt_calibration_prompts; never the
benchmark or held-out sets), records for every round the acceptance length and the rank of the realised bonus token
under the draft, fits miss(F) = c F^-r over F = 1..32, and writes
{temperature: {a_p, r, c, rounds}} into the draft's directory (fan_out_calibration.json), where
`scripts/decode.py --fan-out-strategy geometric` (and the API's fan_out_strategy='geometric') reads it.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from ssd_jax.cli_util import fail, run_main, split_cpu

split_cpu(2)  # SSD puts the draft on its own device



def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--draft", default="default-draft")
  p.add_argument("--num-prompts", type=int, default=16)
  p.add_argument("--max-new-tokens", type=int, default=96)
  p.add_argument("--temperature", type=float, default=0.0)
  p.add_argument("--k", type=int, default=4)
  p.add_argument("--out", default=None, help="calibration file (default: in the draft's directory)")
  return p.parse_args(argv)


def main(argv=None):
  args = parse_args(argv)
  if args.num_prompts < 1 or args.max_new_tokens < 2:
    fail("--num-prompts must be >= 1 and --max-new-tokens >= 2")
  from ssd_jax import api
  from ssd_jax.data import datasets
  from ssd_jax.decode import DecodeOptions, SpecOptions, SSDDecoder
  from ssd_jax.models import checkpoints
  from ssd_jax.theory.fan_out import CALIBRATION_FILE, fit_power_law

  pipe = api.load(draft=args.draft)
  if pipe.draft is None:
    fail(f"no draft found for {args.draft!r}")
  try:  # ShareGPT prompts the draft was not trained on (make_target_corpus.py leaves them out)
    prompts = [p[:2000] for p in datasets.sharegpt_calibration_prompts(args.num_prompts)]
  except ValueError as e:
    fail(str(e))
  dec = SSDDecoder(pipe.target.cfg, pipe.target.params, pipe.draft.cfg, pipe.draft.params,
                   SpecOptions(k=args.k, fan_out=1), record_ranks=True)
  ids = [pipe.encode_prompt(p) for p in prompts]
  opts = DecodeOptions(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                       eos_id=pipe.tokenizer.eos_ids)
  pairs, accepted, tried = [], 0, 0
  for i in range(0, len(ids), 4):
    for r in dec.generate(ids[i:i + 4], opts):
      pairs += r.stats.extra["bonus_ranks"]
      accepted += r.stats.extra["drafts_accepted"]
      tried += r.stats.extra["drafts_tried"]
    print(f"[calibrate] {min(i + 4, len(ids))}/{len(ids)} prompts, {len(pairs)} rounds", file=sys.stderr)
  ranks = [rk for _, rk in pairs]
  r, c, miss = fit_power_law(ranks)
  a_p = accepted / max(tried, 1)  # Theorem 12's per-token acceptance, not the per-round acceptance_rate
  out = args.out or os.path.join(checkpoints.resolve_model_dir(args.draft), CALIBRATION_FILE)
  data = {}
  if os.path.exists(out):
    with open(out) as f:
      data = json.load(f)
  data[f"{args.temperature:g}"] = {"a_p": a_p, "r": r, "c": c, "rounds": len(ranks), "k": args.k,
                                   "miss_rate_at_F": {str(f): float(m) for f, m in zip(range(1, 33), miss)}}
  with open(out, "w") as f:
    json.dump(data, f, indent=1, sort_keys=True)
  print(f"a_p = {a_p:.3f}, r = {r:.3f} (miss(F) = {c:.3f} F^-{r:.3f}) from {len(ranks)} rounds; written to {out}")
  return 0


if __name__ == "__main__":
  run_main(main)
