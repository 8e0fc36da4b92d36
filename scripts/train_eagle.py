#!/usr/bin/env python
"""Train an EAGLE-3 draft (ssd_jax/models/eagle.py) on the target's own features, with self-conditioned rollouts.

  python scripts/train_eagle.py --out checkpoints/eagle-smollm2          # features (once), then training

Two phases, both resumable (run the same command again after an interruption):
  1. features: the target runs over every shard of the target-answer corpora (--target-corpus) and its features
     (residual stream after three layers) and greedy next tokens are cached under --features-dir (float16, ~3.5 KB
     a token, not committed; ssd_jax/training/features.py). --features-only stops after this phase.
  2. training: windows of whole examples; each step unrolls the draft --depth times (EAGLE-3's training-time test):
     rollout step j predicts the token j+1 places past the last position with target features, reading the draft's
     own hidden states for the j positions in between, as SSD's pre-drafting does (ssd_jax/training/eagle_train.py).
     Train state is saved under --work-dir every --save-every steps; held-out agreement per rollout depth is
     printed every --eval-every steps; the best (mean agreement over depths) is exported to --out.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from ssd_jax.cli_util import fail, run_main

CORPUS_ROOT = "checkpoints/draft-train-tc"
DEFAULT_CORPORA = ("target_answers_syn", "target_answers_1r", "target_answers_math1", "target_answers_code1",
                   "target_answers_inst1", "target_answers_qw1", "target_answers_qw2")


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--target-corpus", default=",".join(os.path.join(CORPUS_ROOT, c) for c in DEFAULT_CORPORA),
                 help="comma-separated target-answer corpus directories (scripts/make_target_corpus.py)")
  p.add_argument("--features-dir", default="checkpoints/eagle-features", help="the feature cache (not committed)")
  p.add_argument("--features-only", action="store_true", help="compute the feature cache and stop")
  p.add_argument("--features-in-memory", action="store_true",
                 help="compute the features at the start and keep them in memory, no cache (for an accelerator: "
                      "~7 GB of host memory for 2M tokens, seconds of target time)")
  p.add_argument("--time-budget", type=float, default=None,
                 help="seconds for the whole run, from loading the target to the export: training stops early "
                      "enough (--budget-margin) to evaluate and export, and its learning rate decays over the time "
                      "it has (for a lease of fixed length)")
  p.add_argument("--budget-margin", type=float, default=30.0,
                 help="seconds the run keeps, out of --time-budget, for its last evaluation and export")
  p.add_argument("--feature-rows", type=int, default=64,
                 help="with --features-in-memory: examples per target pass (each padded to 1,024 tokens)")
  p.add_argument("--target", default="smollm2-135m-instruct")
  p.add_argument("--work-dir", default="checkpoints/eagle-train", help="train state (resumable)")
  p.add_argument("--out", default="checkpoints/eagle-smollm2", help="where the best draft is exported")
  p.add_argument("--init-from", default=None, help="continue from an exported EAGLE draft (fresh optimizer)")
  p.add_argument("--head-vocab", type=int, default=16384, help="reduced head vocabulary (most frequent labels)")
  p.add_argument("--ffn-dim", type=int, default=None, help="the layer's FFN width (default: the target's)")
  p.add_argument("--depth", type=int, default=5, help="rollout steps per position (training-time test)")
  p.add_argument("--depth-weights", default=None, help="comma-separated loss weight per rollout step (default 1)")
  p.add_argument("--seq-len", type=int, default=512)
  p.add_argument("--batch-size", type=int, default=4)
  p.add_argument("--steps", type=int, default=2000)
  p.add_argument("--lr", type=float, default=1e-3)
  p.add_argument("--min-lr", type=float, default=1e-4)
  p.add_argument("--warmup", type=int, default=50)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--eval-every", type=int, default=100)
  p.add_argument("--eval-windows", type=int, default=16)
  p.add_argument("--save-every", type=int, default=50)
  return p.parse_args(argv)


def main(argv=None):
  t0 = time.monotonic()
  args = parse_args(argv)
  corpora = [c for c in args.target_corpus.split(",") if c]
  for c in corpora:
    if not os.path.isdir(c):
      fail(f"--target-corpus: no such directory {c}")
  for name, v in (("--depth", args.depth), ("--seq-len", args.seq_len), ("--batch-size", args.batch_size),
                  ("--steps", args.steps), ("--feature-rows", args.feature_rows), ("--head-vocab", args.head_vocab), ("--eval-windows", args.eval_windows)):
    if v < 1:
      fail(f"{name} must be >= 1, got {v}")
  from ssd_jax.models import checkpoints
  from ssd_jax.models.eagle import default_feature_layers
  from ssd_jax.training import features

  tcfg, tparams, _ = checkpoints.load_model(args.target)
  layers = default_feature_layers(tcfg.n_layers)
  log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
  from ssd_jax.training import eagle_train

  def training_budget():
    """Turns --time-budget (the whole run's) into the training loop's, once features and the target are ready."""
    if args.time_budget is not None:
      args.time_budget = args.time_budget - (time.monotonic() - t0) - args.budget_margin
      if args.time_budget <= 0:
        fail("--time-budget is spent before training starts (features, loading): give more time")
      log(f"training budget: {args.time_budget:.0f} s")

  if args.features_in_memory:
    import jax
    if args.features_only:
      fail("--features-only and --features-in-memory exclude each other")
    with jax.default_matmul_precision("highest"):  # features as exact as the cache's (no TF32 on GPUs)
      items = features.in_memory(corpora, tparams, tcfg, layers, log=log, bucket=1024,
                                 tokens_per_batch=args.feature_rows * 1024, fixed_rows=True)
    training_budget()
    return eagle_train.main_from_args(args, corpora, tcfg, tparams, layers, log, in_memory=items)
  n = features.build(args.features_dir, corpora, tparams, tcfg, layers, args.target, log=log)
  log(f"features: {n} shards computed, cache complete under {args.features_dir}")
  if args.features_only:
    return 0
  training_budget()
  return eagle_train.main_from_args(args, corpora, tcfg, tparams, layers, log)


if __name__ == "__main__":
  run_main(main)
