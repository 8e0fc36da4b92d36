#!/usr/bin/env python
"""Train the draft model for the SmolLM2 target (seeded, resumable, with held-out agreement evaluation).

  python scripts/train_draft.py                      # the shipped draft's recipe; resumes from --work-dir
  python scripts/train_draft.py --tiny --steps 3     # a seconds-long smoke run (used by the tests)

Data: ShareGPT conversations in the chat template, mixed (--corpus-mix) with the target's own greedy answers when a
corpus from scripts/make_target_corpus.py exists (--target-corpus, default <work-dir>/target_answers; several
directories, comma-separated, are read as one corpus). With that
corpus, the draft exported is the one with the best agreement on held-out *target answers* (what acceptance
measures); without it, on held-out ShareGPT text.

Distillation (--distill-weight) runs the target on every batch, which is most of a CPU train step. With
--teacher-top-k K (and --corpus-mix 1) the target's top-K over the draft's head is computed once per target-answer
window, cached under <work-dir>/teacher_cache/ or --teacher-cache-dir (resumable; chunks keyed by their windows, the
head and K, so later stages share it and a grown corpus computes only its new windows), and every later step and
pass reads it instead.

Progress goes to stderr; the train state (params + optimizer) is saved every --save-every steps under --work-dir and
training resumes from it. At each evaluation the draft is exported to --out (config.json, params/, tokenizer.json,
extra.json with the recipe and measured agreement) when its agreement is the best so far.
"""
from __future__ import annotations

import argparse
import dataclasses
import os

from ssd_jax.cli_util import fail, run_main


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--target", default="smollm2-135m-instruct", help="target model name or checkpoint directory")
  p.add_argument("--out", default=None, help="where the trained draft is exported (default checkpoints/draft-smollm2)")
  p.add_argument("--work-dir", default=None, help="train-state checkpoints (default checkpoints/draft-train)")
  p.add_argument("--steps", type=int, default=None, help="length of the learning-rate schedule")
  p.add_argument("--until", type=int, default=None, help="stop at this step (default --steps); resume later")
  p.add_argument("--target-corpus", default=None,
                 help="target-answer shard directories, comma-separated (default <work-dir>/target_answers if present; "
                      "'none': ShareGPT only)")
  p.add_argument("--corpus-mix", type=float, default=0.75,
                 help="fraction of each batch taken from the target-answer corpus when there is one")
  p.add_argument("--whole-examples", action="store_true",
                 help="cut the target-answer corpus into windows that each begin at a prompt and hold whole "
                      "prompt-and-answer examples (padded), instead of every --seq-len tokens of the stream, so "
                      "every answer is trained reading its whole prompt, as the draft reads it when drafting")
  p.add_argument("--batch-size", type=int, default=None)
  p.add_argument("--seq-len", type=int, default=None)
  p.add_argument("--lr", type=float, default=None)
  p.add_argument("--warmup", type=int, default=None, help="learning-rate warm-up steps")
  p.add_argument("--distill-weight", type=float, default=None, help="weight of KL to the target (0 = hard labels)")
  p.add_argument("--teacher-top-k", type=int, default=None,
                 help="distil toward the target's top-K (over the draft's head) on the target-answer windows, "
                      "computed once and cached under --work-dir, instead of a target forward every step "
                      "(needs --corpus-mix 1 and --distill-weight > 0; default 0: the full distribution, live)")
  p.add_argument("--teacher-cache-dir", default=None,
                 help="where --teacher-top-k keeps its cache (default <work-dir>/teacher_cache); chunks are keyed by "
                      "their windows, head and K, so later stages, also on a grown corpus, can share one")
  p.add_argument("--eval-every", type=int, default=None)
  p.add_argument("--save-every", type=int, default=None)
  p.add_argument("--max-conversations", type=int, default=None, help="use only the first N ShareGPT conversations")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--tiny", action="store_true", help="tiny model and data: a smoke run for tests")
  p.add_argument("--fresh", action="store_true", help="ignore an existing train state in --work-dir")
  p.add_argument("--init-from", default=None,
                 help="start from this draft checkpoint (e.g. the shipped one) with a fresh optimizer and schedule, "
                      "instead of the target-derived initialisation; its config replaces the recipe")
  p.add_argument("--grow-layers", type=int, default=0,
                 help="with --init-from: add N layers to the starting draft that leave its output unchanged at first "
                      "(copies of evenly spread layers with zeroed residual outputs; "
                      "ssd_jax.training.draft_init.deepen), then train")
  p.add_argument("--grow-head", type=int, default=0,
                 help="with --init-from: add to the starting draft's reduced vocabulary the N tokens outside it most "
                      "frequent in this run's training targets (rows placed by a least-squares map from the target's "
                      "embedding; ssd_jax.training.draft_init.widen_head), then train")
  p.add_argument("--grow-width", type=int, default=0, metavar="D_MODEL",
                 help="with --init-from: widen the starting draft to D_MODEL (more heads, KV heads and FFN units in "
                      "the same ratios) so that its output is unchanged at first (new parts write zeros to the "
                      "residual stream; ssd_jax.training.draft_init.widen), then train")
  return p.parse_args(argv)


def draft_run(args):
  """Returns the DraftRun the flags describe (checked: bad flags raise ValueError with one line)."""
  from ssd_jax.models import checkpoints
  from ssd_jax.training.draft_loop import DRAFT_RECIPE, TINY_RECIPE, DraftRun
  from ssd_jax.training.draft_step import TrainConfig

  tc = TrainConfig(seed=args.seed)
  if args.tiny:
    tc = dataclasses.replace(tc, seq_len=32, batch_size=2, steps=3, eval_every=2, save_every=2, eval_windows=2,
                             warmup=1)
  for name in ("steps", "batch_size", "seq_len", "lr", "warmup", "distill_weight", "teacher_top_k", "eval_every",
               "save_every"):
    v = getattr(args, name)
    if v is not None:
      tc = dataclasses.replace(tc, **{name: v})
  return DraftRun(
      work_dir=args.work_dir or os.path.join(checkpoints.CHECKPOINT_DIR, "draft-train"),
      out=args.out or os.path.join(checkpoints.CHECKPOINT_DIR, checkpoints.DEFAULT_DRAFT_NAME),
      tc=tc, recipe=dict(TINY_RECIPE if args.tiny else DRAFT_RECIPE), until=args.until,
      target_corpus=args.target_corpus, corpus_mix=args.corpus_mix, whole_examples=args.whole_examples,
      teacher_cache_dir=args.teacher_cache_dir, max_conversations=args.max_conversations or (40 if args.tiny else None),
      tiny=args.tiny, fresh=args.fresh, init_from=args.init_from, grow_layers=args.grow_layers,
      grow_head=args.grow_head, grow_width=args.grow_width)


def main(argv=None):
  args = parse_args(argv)
  run = draft_run(args)
  from ssd_jax.models import checkpoints
  from ssd_jax.training.draft_loop import Target, train

  target_dir = checkpoints.resolve_model_dir(args.target)
  tcfg, tparams, tok = checkpoints.load_model(target_dir)
  if tok is None:
    fail(f"target {target_dir} has no tokenizer.json")
  train(run, Target(tcfg, tparams, tok, os.path.basename(target_dir)))
  return 0


if __name__ == "__main__":
  run_main(main)
