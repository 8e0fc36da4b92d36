#!/usr/bin/env python
"""Build a training corpus of the target's own greedy answers to ShareGPT prompts (for draft training).

  python scripts/make_target_corpus.py --num-prompts 4000 --max-new-tokens 256
  python scripts/make_target_corpus.py --tiny --out DIR  # seconds: a smoke run, for the tests

What a draft must predict is what the *target* says, and the target's answers are lower-entropy than ShareGPT's
human-written ones, so training on them (sequence-level distillation: the target's greedy token is its argmax, the
quantity greedy acceptance measures) buys more agreement per training token than ShareGPT text does.

The first user turn of each ShareGPT conversation (or, with --user-turns later, each later one as a stand-alone
prompt; in the chat template, with the default system prompt) is answered greedily, in batches. The last 256 first
turns are never answered: they are the fan-out calibration prompts (datasets.sharegpt_calibration_prompts). Each
batch is written as a shard `shard_NNNNN.npz` (ids uint16 = prompt + answer + end-of-turn, mask uint8 = 1 on the
answer) under --out, so a stopped run resumes where it left off and training can start on the shards already
written (`ssd_jax.training.draft_data.load_answer_shards`; `scripts/train_draft.py --target-corpus DIR`). Only
ShareGPT is used (or, with --prompts-file, the given prompts: e.g. scripts/make_synthetic_prompts.py's); no benchmark
or held-out prompt set.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time

from ssd_jax.cli_util import fail, run_main


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--target", default="smollm2-135m-instruct", help="target model name or checkpoint directory")
  p.add_argument("--out", default=None, help="shard directory (default checkpoints/draft-train/target_answers)")
  p.add_argument("--num-prompts", type=int, default=4000, help="ShareGPT prompts to answer in total")
  p.add_argument("--skip-prompts", type=int, default=0, help="skip the first N usable ShareGPT prompts")
  p.add_argument("--user-turns", choices=("first", "later"), default="first",
                 help="answer each conversation's first user message, or its later ones as stand-alone prompts "
                      "(~37,500 more once the ~15,300 first ones are used)")
  p.add_argument("--prompts-file", default=None,
                 help="answer the prompts of this JSONL file ({\"prompt\": ...} per line, e.g. from "
                      "scripts/make_synthetic_prompts.py) instead of ShareGPT's; --num-prompts and --skip-prompts "
                      "then select from it")
  p.add_argument("--max-new-tokens", type=int, default=256)
  p.add_argument("--max-prompt-tokens", type=int, default=256, help="skip longer prompts")
  p.add_argument("--batch-size", type=int, default=32, help="prompts decoded together (one shard each)")
  p.add_argument("--tiny", action="store_true",
                 help="four tokens an answer, two a batch, three fixed prompts unless --prompts-file: a smoke run")
  return p.parse_args(argv)


def main(argv=None):
  args = parse_args(argv)
  if min(args.num_prompts, args.max_new_tokens, args.max_prompt_tokens, args.batch_size) < 1:
    fail("--num-prompts, --max-new-tokens, --max-prompt-tokens and --batch-size must be >= 1")
  import numpy as np
  from tqdm.auto import tqdm

  from ssd_jax import api
  from ssd_jax.data import datasets
  from ssd_jax.models import checkpoints

  # The prompts first: a bad --prompts-file or an exhausted ShareGPT range fails before the target is loaded.
  if args.tiny:
    args.max_new_tokens, args.batch_size = min(args.max_new_tokens, 4), min(args.batch_size, 2)
  if args.prompts_file:
    prompts = datasets.load_prompt_file(args.prompts_file)[args.skip_prompts:args.skip_prompts + args.num_prompts]
    if not prompts:
      fail(f"no prompts left in {args.prompts_file} after skipping {args.skip_prompts}")
  elif args.tiny:
    prompts = ["Hello there!", "What is two plus two?", "Name three colours."]
  else:
    prompts = datasets.sharegpt_training_prompts(args.num_prompts, args.skip_prompts, args.user_turns)
    if not prompts:
      fail(f"no ShareGPT {args.user_turns} user turns left after skipping {args.skip_prompts}")
  pipe = api.load(args.target, draft=None)
  out = args.out or os.path.join(checkpoints.CHECKPOINT_DIR, "draft-train", "target_answers")
  os.makedirs(out, exist_ok=True)
  enc = [pipe.encode_prompt(p) for p in prompts]
  keep = [i for i, e in enumerate(enc) if len(e) <= args.max_prompt_tokens]
  # Similar lengths in one batch waste less padding; the order is fixed, so a resumed run continues the same plan.
  keep.sort(key=lambda i: len(enc[i]))
  batches = [keep[i:i + args.batch_size] for i in range(0, len(keep), args.batch_size)]
  done = {int(os.path.basename(f)[6:11]) for f in glob.glob(os.path.join(out, "shard_*.npz"))}
  with open(os.path.join(out, "manifest.json"), "w") as f:
    source = f"prompt file {args.prompts_file}" if args.prompts_file else f"ShareGPT {args.user_turns} user turns"
    json.dump({"source": source, "skip_prompts": args.skip_prompts,
               "num_prompts": len(prompts), "kept": len(keep), "batch_size": args.batch_size,
               "max_new_tokens": args.max_new_tokens, "target": args.target, "decoding": "greedy"}, f, indent=1)
  eot = pipe.tokenizer.eos_id
  todo = [b for b in range(len(batches)) if b not in done]
  print(f"[corpus] {len(keep)} prompts in {len(batches)} batches; {len(todo)} to do -> {out}", file=sys.stderr)
  t0, n_tok = time.perf_counter(), 0
  bar = tqdm(todo, desc="target answers", unit="batch", disable=args.tiny, mininterval=10)
  for b in bar:
    res = pipe.generate_ids([enc[i] for i in batches[b]], mode="ar", batch_size=args.batch_size,
                            max_new_tokens=args.max_new_tokens)
    ids, mask = [], []
    for i, r in zip(batches[b], res):
      ans = list(r.token_ids)
      if not ans or ans[-1] not in pipe.tokenizer.eos_ids:
        ans.append(eot)  # cut at the budget: close the turn so windows never run into the next prompt mid-answer
      ids += enc[i] + ans + pipe.tokenizer.encode("\n")
      mask += [0] * len(enc[i]) + [1] * len(ans) + [0]
      n_tok += len(r.token_ids)
    tmp = os.path.join(out, f"shard_{b:05d}.tmp.npz")
    np.savez(tmp, ids=np.asarray(ids, np.uint16 if pipe.target.cfg.vocab_size <= 65536 else np.int32),
             mask=np.asarray(mask, np.uint8))
    os.replace(tmp, os.path.join(out, f"shard_{b:05d}.npz"))
    bar.set_postfix(tok_s=f"{n_tok / (time.perf_counter() - t0):.0f}")
  print(f"[corpus] wrote {n_tok:,} answer tokens in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
  return 0


if __name__ == "__main__":
  run_main(main)
