#!/usr/bin/env python
"""Decode prompts with the embedded default models (SmolLM2-135M-Instruct target) or your own.

  python scripts/decode.py                                   # a built-in prompt, greedy, prints answer and stats
  python scripts/decode.py --prompt "Write a haiku" --temperature 0.7 --seed 1 --stream
  python scripts/decode.py --prompts prompts.jsonl --json-out out.jsonl --batch-size 4

--prompts takes one {"prompt": ...} object per line. --json-out writes one JSON object per prompt, in input order:
{"prompt", "token_ids", "text", "stats"}.
"""
from __future__ import annotations

import argparse
import json
import sys


from ssd_jax import distributed
from ssd_jax.cli_util import fail, run_main, split_cpu

DEFAULT_PROMPT = "What is the capital of France? Answer in one sentence, then name two famous sights there."


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  src = p.add_mutually_exclusive_group()
  src.add_argument("--prompt", action="append", help="a prompt (repeatable)")
  src.add_argument("--prompts", help="a JSONL file with one {\"prompt\": ...} object per line")
  p.add_argument("--mode", default=None, help="ar, sd or ssd (default: ssd, or ar when no draft is loaded)")
  p.add_argument("--k", type=int, default=1,
                 help="draft tokens per round (sd, ssd; default 1, the fastest for the shipped pair on a CPU: "
                      "stronger drafts and accelerators, where a wider verify costs little more, want more)")
  p.add_argument("--fan-out", default="3",
                 help="ssd: bonus-token guesses cached per acceptance length: F, or K+1 counts 'F0,F1,...,FK'")
  p.add_argument("--fan-out-miss", default=None, help="ssd: the same after a cache miss (same total)")
  p.add_argument("--fan-out-strategy", default="uniform", choices=["uniform", "geometric"],
                 help="ssd: geometric spreads a budget of F*(K+1) by Theorem 12, from the draft's calibration "
                      "(scripts/calibrate_fan_out.py)")
  p.add_argument("--backup", default="neural", choices=["neural", "fast", "ngram", "auto"],
                 help="ssd: speculator on a cache miss (auto: Theorem 17 from measured statistics)")
  p.add_argument("--saguaro-c", type=float, default=1.0,
                 help="ssd: Saguaro sampling, the draft's top tokens down-weighted by C in (0, 1] (1 = off)")
  p.add_argument("--target", default="smollm2-135m-instruct",
                 help="target: a name, an ssd-jax checkpoint dir, a GGUF file or a Hugging Face safetensors dir")
  p.add_argument("--draft", default="default", help="draft checkpoint ('default' = the shipped draft, 'none')")
  p.add_argument("--max-new-tokens", type=int, default=128)
  p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
  p.add_argument("--top-p", type=float, default=1.0)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--batch-size", type=int, default=8)
  p.add_argument("--ignore-eos", action="store_true", help="produce exactly --max-new-tokens tokens")
  p.add_argument("--raw", action="store_true", help="feed the prompt as is, without the chat template")
  p.add_argument("--stream", action="store_true", help="print the text of a single prompt as it is produced")
  p.add_argument("--json-out", help="write one JSON object per prompt to this file")
  p.add_argument("--attention", default="auto", choices=["auto", "ref", "cpu", "pallas"],
                 help="attention implementation: auto (the C++ kernel on a CPU, else ref), ref (jnp), cpu (the C++ "
                      "kernel) or pallas (kernels; interpret mode on CPU: slow)")
  p.add_argument("--ssd-placement", default="devices", choices=["devices", "processes"],
                 help="SSD: the draft on its own JAX device of this process, or in its own process pinned to its "
                      "own CPU cores (the target pinned to the others)")
  p.add_argument("--target-devices", type=int, default=1, help="devices of the target's tensor-parallel mesh")
  p.add_argument("--draft-devices", type=int, default=1, help="1: the draft on its own device (after the target's)")
  distributed.add_arguments(p)
  return p.parse_args(argv)


def read_prompts(args) -> list[str]:
  if args.prompts:
    from ssd_jax.datasets import load_prompt_file
    return load_prompt_file(args.prompts)  # bad files raise DataError: one line, exit code 2
  prompts = args.prompt or [DEFAULT_PROMPT]
  if any(not p.strip() for p in prompts):
    fail("empty --prompt")
  return prompts


def main(argv=None):
  args = parse_args(argv)
  if args.target_devices < 1 or args.draft_devices not in (0, 1):
    fail("--target-devices must be >= 1 and --draft-devices 0 or 1")
  _, nproc, _ = distributed.settings(args.coordinator, args.num_processes, args.process_id)
  split_cpu(max(2, distributed.local_devices_needed(args.target_devices, args.draft_devices, nproc)))
  distributed.initialize(args.coordinator, args.num_processes, args.process_id)  # before any device is touched
  from ssd_jax import api

  if args.mode is not None and args.mode not in api.MODES:
    if args.mode in api.PLANNED_MODES:
      fail(f"--mode {args.mode} is not implemented yet; available: {', '.join(api.MODES)}")
    fail(f"unknown --mode {args.mode!r}; choose from {', '.join(api.MODES)}")
  if args.max_new_tokens < 1:
    fail(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
  if args.k < 1:
    fail(f"--k must be >= 1, got {args.k}")
  if args.batch_size < 1:
    fail(f"--batch-size must be >= 1, got {args.batch_size}")
  if args.temperature < 0 or not 0 < args.top_p <= 1:
    fail("--temperature must be >= 0 and --top-p in (0, 1]")
  if not 0 < args.saguaro_c <= 1:
    fail(f"--saguaro-c must be in (0, 1], got {args.saguaro_c}")
  from ssd_jax.decode import SpecOptions
  spec = SpecOptions(k=args.k, fan_out=args.fan_out, fan_out_miss=args.fan_out_miss,
                     fan_out_strategy=args.fan_out_strategy, backup=args.backup, saguaro_c=args.saguaro_c,
                     placement=args.ssd_placement)  # bad settings: ValueError, one line
  prompts = read_prompts(args)
  if args.stream and len(prompts) != 1:
    fail("--stream needs exactly one prompt")

  pipe = api.load(args.target, draft=None if args.draft == "none" else args.draft, attn_impl=args.attention,
                  target_devices=args.target_devices, draft_devices=args.draft_devices,
                  ssd_placement=args.ssd_placement)
  if args.mode is None:
    args.mode = pipe.default_mode
  if args.mode in ("sd", "ssd") and pipe.draft is None:
    fail(f"--mode {args.mode} needs a draft: none found (train one with scripts/train_draft.py or pass --draft PATH)")
  stream = (lambda s: print(s, end="", flush=True)) if args.stream else None
  gens = pipe.generate(prompts, mode=args.mode, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                       top_p=args.top_p, seed=args.seed, batch_size=args.batch_size, ignore_eos=args.ignore_eos,
                       chat=not args.raw, stream=stream, spec=spec)
  if args.stream:
    print()
  if args.json_out and distributed.is_main():
    with open(args.json_out, "w", encoding="utf-8") as f:
      for g in gens:
        f.write(json.dumps(g.to_dict(), ensure_ascii=False) + "\n")
  for i, g in enumerate(gens if distributed.is_main() else []):
    if not args.stream:
      if len(gens) > 1:
        print(f"=== [{i + 1}] {g.prompt[:70]!r}")
      print(g.text)
    s = g.stats
    print(f"--- {s['mode']}: {s['new_tokens']} tokens, {s['tokens_per_second']:.1f} tok/s decode, "
          f"{s['tokens_per_target_forward']:.2f} tokens/target forward, prefill {s['prefill_seconds']:.2f} s"
          + (f", acceptance {s['acceptance_rate']:.2f}" if "acceptance_rate" in s else "")
          + (f", cache hits {s['cache_hit_rate']:.2f}, target idle {s['target_idle_seconds']:.2f} s"
             if "cache_hit_rate" in s else ""), file=sys.stderr)
  return 0


if __name__ == "__main__":
  run_main(main)
