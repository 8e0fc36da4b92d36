#!/usr/bin/env python
"""Write benchmark-shaped synthetic training prompts (code stubs, word problems, instructions, questions,
writing tasks) as JSONL.

  python scripts/make_synthetic_prompts.py --out checkpoints/draft-train-tc/synthetic_prompts.jsonl
  python scripts/make_target_corpus.py --prompts-file checkpoints/draft-train-tc/synthetic_prompts.jsonl --out DIR

The sources are the standard library's documented functions and templates written in `ssd_jax/data/synthetic.py`; no
benchmark or held-out prompt set is read. One {"prompt", "kind"} object per line, the kinds interleaved.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys

from ssd_jax.cli_util import fail, run_main


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--out", required=True, help="JSONL file to write")
  p.add_argument("--code", type=int, default=400, help="function stubs to complete (at most ~900 exist)")
  p.add_argument("--math", type=int, default=300, help="word problems")
  p.add_argument("--instructions", type=int, default=400, help="instructions")
  p.add_argument("--questions", type=int, default=0, help="direct questions (\"What is ...?\")")
  p.add_argument("--writing", type=int, default=0, help="writing and role-play tasks (letters, stories, posts)")
  p.add_argument("--seed", type=int, default=0)
  return p.parse_args(argv)


def main(argv=None):
  args = parse_args(argv)
  counts = (args.code, args.math, args.instructions, args.questions, args.writing)
  if min(counts) < 0 or sum(counts) == 0:
    fail("--code, --math, --instructions, --questions and --writing must be >= 0, and not all 0")
  from ssd_jax.data import synthetic

  recs = synthetic.synthetic_prompts(args.code, args.math, args.instructions, args.seed, args.questions,
                                     args.writing)
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, "w", encoding="utf-8") as f:
    for r in recs:
      f.write(json.dumps(r) + "\n")
  counts = collections.Counter(r["kind"] for r in recs)
  print(f"[synthetic] wrote {len(recs)} prompts ({dict(counts)}) -> {args.out}", file=sys.stderr)
  return 0


if __name__ == "__main__":
  run_main(main)
