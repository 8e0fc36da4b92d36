#!/usr/bin/env python
"""Train the draft model for the SmolLM2 target (seeded, resumable, with held-out agreement evaluation).

  python scripts/train_draft.py                      # the shipped draft's recipe; resumes from --work-dir
  python scripts/train_draft.py --tiny --steps 3     # a seconds-long smoke run (used by the tests)

Progress goes to stderr; the train state (params + optimizer) is saved every --save-every steps under --work-dir and
training resumes from it. At each evaluation the draft is exported to --out (config.json, params/, tokenizer.json,
extra.json with the recipe and measured agreement) when its agreement is the best so far.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ssd_jax.cli_util import fail, run_main  # noqa: E402

DRAFT_RECIPE = dict(d_model=256, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=64, ffn_dim=768, head_vocab=16384)
TINY_RECIPE = dict(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, ffn_dim=64, head_vocab=512)


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--target", default="smollm2-135m-instruct", help="target model name or checkpoint directory")
  p.add_argument("--out", default=None, help="where the trained draft is exported (default checkpoints/draft-smollm2)")
  p.add_argument("--work-dir", default=None, help="train-state checkpoints (default checkpoints/draft-train)")
  p.add_argument("--steps", type=int, default=None)
  p.add_argument("--batch-size", type=int, default=None)
  p.add_argument("--seq-len", type=int, default=None)
  p.add_argument("--lr", type=float, default=None)
  p.add_argument("--distill-weight", type=float, default=None, help="weight of KL to the target (0 = hard labels)")
  p.add_argument("--eval-every", type=int, default=None)
  p.add_argument("--save-every", type=int, default=None)
  p.add_argument("--max-conversations", type=int, default=None, help="use only the first N ShareGPT conversations")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--tiny", action="store_true", help="tiny model and data: a smoke run for tests")
  p.add_argument("--fresh", action="store_true", help="ignore an existing train state in --work-dir")
  return p.parse_args(argv)


def main(argv=None):
  args = parse_args(argv)
  import jax
  import jax.numpy as jnp
  import numpy as np
  import orbax.checkpoint as ocp
  from tqdm.auto import tqdm

  from ssd_jax import checkpoints, datasets, train
  from ssd_jax.config import ModelConfig

  recipe = TINY_RECIPE if args.tiny else DRAFT_RECIPE
  tc = train.TrainConfig(seed=args.seed)
  if args.tiny:
    tc = dataclasses.replace(tc, seq_len=32, batch_size=2, steps=3, eval_every=2, save_every=2, eval_windows=2,
                             warmup=1)
  for name in ("steps", "batch_size", "seq_len", "lr", "distill_weight", "eval_every", "save_every"):
    v = getattr(args, name)
    if v is not None:
      tc = dataclasses.replace(tc, **{name: v})
  if tc.steps < 1 or tc.batch_size < 1 or tc.seq_len < 2:
    fail("--steps and --batch-size must be >= 1 and --seq-len >= 2")
  out = args.out or os.path.join(checkpoints.CHECKPOINT_DIR, checkpoints.DEFAULT_DRAFT_NAME)
  work = os.path.abspath(args.work_dir or os.path.join(checkpoints.CHECKPOINT_DIR, "draft-train"))
  os.makedirs(work, exist_ok=True)

  target_dir = checkpoints.resolve_model_dir(args.target)
  tcfg, tparams, tok = checkpoints.load_model(target_dir)
  if tok is None:
    fail(f"target {target_dir} has no tokenizer.json")

  # Data: ShareGPT in the chat template, tokenized once and cached as uint16.
  max_conv = args.max_conversations or (40 if args.tiny else None)
  cache_file = os.path.join(work, f"sharegpt_tokens_{max_conv or 'all'}.npz")
  if os.path.exists(cache_file):
    z = np.load(cache_file)
    ids, mask = z["ids"], z["mask"]
  else:
    ids, mask = train.tokenize_conversations(tok, datasets.iter_sharegpt(limit=max_conv), progress=not args.tiny)
    np.savez(cache_file, ids=ids, mask=mask)
  windows, wmask = train.make_windows(ids, mask, tc.seq_len)
  rng = np.random.default_rng(tc.seed)
  order = rng.permutation(len(windows))
  n_eval = min(tc.eval_windows, max(1, len(windows) // 10))
  eval_idx, train_idx = order[:n_eval], order[n_eval:]
  if len(train_idx) == 0:
    fail("not enough training text for one training window")
  ev_tokens, ev_mask = windows[eval_idx], wmask[eval_idx]
  train_ids_for_vocab = windows[train_idx].reshape(-1)
  train_mask_for_vocab = wmask[train_idx].reshape(-1)

  head_vocab = min(recipe["head_vocab"], tcfg.vocab_size)
  cfg = ModelConfig(vocab_size=tcfg.vocab_size, tie_embeddings=True, rms_eps=tcfg.rms_eps, rope_theta=tcfg.rope_theta,
                    max_seq_len=tcfg.max_seq_len, name="draft-" + ("tiny" if args.tiny else "smollm2"),
                    **{**recipe, "head_vocab": head_vocab})
  opt = train.make_optimizer(tc)
  state_abstract = None
  mngr = ocp.CheckpointManager(work, options=ocp.CheckpointManagerOptions(max_to_keep=2, create=True))
  start = 0
  if not args.fresh and mngr.latest_step() is not None:
    head_ids = np.load(os.path.join(work, "head_ids.npy"))
    params = train.init_draft_from_target(jax.random.key(tc.seed), cfg, tcfg, tparams, head_ids)
    opt_state = train.init_opt_state(opt, params)
    state_abstract = {"params": params, "opt": jax.tree.leaves(opt_state)}
    start = mngr.latest_step()
    restored = mngr.restore(start, args=ocp.args.StandardRestore(jax.tree.map(ocp.utils.to_shape_dtype_struct,
                                                                              state_abstract)))
    params = jax.device_put(restored["params"])
    opt_state = jax.tree.unflatten(jax.tree.structure(opt_state), [jnp.asarray(x) for x in restored["opt"]])
    print(f"[train] resumed from step {start} in {work}", file=sys.stderr)
  else:
    head_ids = train.choose_head_vocab(train_ids_for_vocab, train_mask_for_vocab, tcfg.vocab_size, head_vocab)
    np.save(os.path.join(work, "head_ids.npy"), head_ids)
    params = train.init_draft_from_target(jax.random.key(tc.seed), cfg, tcfg, tparams, head_ids)
    opt_state = train.init_opt_state(opt, params)

  # The target's argmax on the held-out windows, computed once.
  top_file = os.path.join(work, f"eval_target_top_{len(ev_tokens)}x{tc.seq_len}.npy")
  if os.path.exists(top_file) and not args.tiny:
    ev_top = np.load(top_file)
  else:
    ev_top = train.target_argmax(tparams, tcfg, ev_tokens)
    np.save(top_file, ev_top)

  step_fn = train.make_train_step(cfg, opt, tcfg, tc.distill_weight)
  best_file = os.path.join(work, "best.json")
  best = None
  if os.path.exists(best_file) and not args.fresh:
    import json
    with open(best_file) as f:
      best = json.load(f)["agreement"]
  tokens_per_step = tc.batch_size * tc.seq_len
  print(f"[train] draft {cfg.name}: {train.params_nbytes(params) / 1e6:.1f} MB params, "
        f"{len(train_idx)} train windows x {tc.seq_len}, {n_eval} held-out windows, steps {start}->{tc.steps}",
        file=sys.stderr)
  bar = tqdm(range(start, tc.steps), initial=start, total=tc.steps, desc="train draft", unit="step",
             disable=args.tiny, mininterval=5)
  met = {}
  for step in bar:
    perm = np.random.default_rng(tc.seed + 1 + step // max(1, len(train_idx) // tc.batch_size)).permutation(
        len(train_idx))
    j = (step % max(1, len(train_idx) // tc.batch_size)) * tc.batch_size
    sel = train_idx[perm[j:j + tc.batch_size]]
    batch = {"tokens": jnp.asarray(windows[sel]), "mask": jnp.asarray(wmask[sel])}
    params, opt_state, met = step_fn(params, opt_state, batch, tparams)
    done = step + 1
    if done % 20 == 0 or args.tiny:
      bar.set_postfix(loss=f"{float(met['loss']):.3f}", acc=f"{float(met['acc']):.3f}")
    if done % tc.save_every == 0 or done == tc.steps:
      mngr.save(done, args=ocp.args.StandardSave({"params": params, "opt": jax.tree.leaves(opt_state)}))
      mngr.wait_until_finished()
    if done % tc.eval_every == 0 or done == tc.steps:
      agree = train.agreement(params, cfg, ev_tokens, ev_mask, ev_top)
      print(f"\n[train] step {done}: held-out agreement with target {agree:.4f} "
            f"(loss {float(met['loss']):.3f}, tokens seen {done * tokens_per_step:,})", file=sys.stderr, flush=True)
      if best is None or agree >= best:
        best = agree
        extra = {"recipe": "scripts/train_draft.py", "train_config": dataclasses.asdict(tc), "step": done,
                 "train_tokens": done * tokens_per_step, "heldout_agreement": agree,
                 "heldout": f"{n_eval} ShareGPT windows of {tc.seq_len} tokens (not trained on)"}
        checkpoints.save_checkpoint(out + ".tmp", cfg, jax.device_get(params), tokenizer=tok, extra=extra)
        shutil.rmtree(out, ignore_errors=True)
        os.replace(out + ".tmp", out)
        train.write_json(best_file, {"agreement": agree, "step": done})
  bar.close()
  print(f"[train] finished at step {tc.steps}; best held-out agreement {best:.4f}; draft at {out}", file=sys.stderr)
  return 0


if __name__ == "__main__":
  run_main(main)
