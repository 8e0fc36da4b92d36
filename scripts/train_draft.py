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
import json
import os
import shutil
import sys
import time

from ssd_jax.cli_util import fail, run_main

DRAFT_RECIPE = dict(d_model=256, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=64, ffn_dim=768, head_vocab=16384)
TINY_RECIPE = dict(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, ffn_dim=64, head_vocab=512)


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
                      "(copies of evenly spread layers with zeroed residual outputs; ssd_jax.train.deepen), then train")
  p.add_argument("--grow-head", type=int, default=0,
                 help="with --init-from: add to the starting draft's reduced vocabulary the N tokens outside it most "
                      "frequent in this run's training targets (rows placed by a least-squares map from the target's "
                      "embedding; ssd_jax.train.widen_head), then train")
  p.add_argument("--grow-width", type=int, default=0, metavar="D_MODEL",
                 help="with --init-from: widen the starting draft to D_MODEL (more heads, KV heads and FFN units in "
                      "the same ratios) so that its output is unchanged at first (new parts write zeros to the "
                      "residual stream; ssd_jax.train.widen), then train")
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
  from ssd_jax.tokenizer import IM_START

  recipe = TINY_RECIPE if args.tiny else DRAFT_RECIPE
  tc = train.TrainConfig(seed=args.seed)
  if args.tiny:
    tc = dataclasses.replace(tc, seq_len=32, batch_size=2, steps=3, eval_every=2, save_every=2, eval_windows=2,
                             warmup=1)
  for name in ("steps", "batch_size", "seq_len", "lr", "warmup", "distill_weight", "teacher_top_k", "eval_every",
               "save_every"):
    v = getattr(args, name)
    if v is not None:
      tc = dataclasses.replace(tc, **{name: v})
  if tc.steps < 1 or tc.batch_size < 1 or tc.seq_len < 2:
    fail("--steps and --batch-size must be >= 1 and --seq-len >= 2")
  until = tc.steps if args.until is None else args.until
  if not 1 <= until <= tc.steps:
    fail(f"--until must be in [1, --steps = {tc.steps}], got {until}")
  if args.grow_layers < 0 or (args.grow_layers and not args.init_from):
    fail(f"--grow-layers N (N >= 1) deepens the draft given by --init-from; got {args.grow_layers}"
         + ("" if args.init_from else " without --init-from"))
  if args.grow_head < 0 or (args.grow_head and not args.init_from):
    fail(f"--grow-head N (N >= 1) widens the head of the draft given by --init-from; got {args.grow_head}"
         + ("" if args.init_from else " without --init-from"))
  if args.grow_width < 0 or (args.grow_width and not args.init_from):
    fail(f"--grow-width D_MODEL widens the draft given by --init-from; got {args.grow_width}"
         + ("" if args.init_from else " without --init-from"))
  if not 0 <= args.corpus_mix <= 1:
    fail(f"--corpus-mix must be in [0, 1], got {args.corpus_mix}")
  if tc.teacher_top_k < 0:
    fail(f"--teacher-top-k must be >= 0, got {tc.teacher_top_k}")
  if tc.teacher_top_k and (tc.distill_weight <= 0 or args.corpus_mix != 1):
    fail("--teacher-top-k caches the distillation teacher on the target-answer corpus: it needs --distill-weight > 0 "
         "and --corpus-mix 1")
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

  # The target's own answers (scripts/make_target_corpus.py), when present.
  corpora = [c for c in (args.target_corpus or os.path.join(work, "target_answers")).split(",") if c]
  if not corpora:
    fail(f"--target-corpus {args.target_corpus!r} names no directory")
  t_win = t_wmask = tev_tokens = tev_mask = None
  if args.target_corpus != "none" and all(os.path.isdir(c) for c in corpora):
    parts = [train.load_answer_shards(c) for c in corpora]
    t_ids, t_m, h_ids, h_m = (np.concatenate([p[i] for p in parts]) for i in range(4))
    if args.whole_examples:
      im_start = tok.tok.token_to_id(IM_START)
      if t_m.any():
        t_win, t_wmask = train.pack_examples(t_ids, t_m, tc.seq_len, im_start)
      # Held out: an equal share of windows from every directory that has held-out shards, so the set that
      # picks the exported step samples every kind of prompt the corpus holds.
      held = [train.pack_examples(p[2], p[3], tc.seq_len, im_start) for p in parts if p[3].any()]
      if held:
        share = -(-tc.eval_windows * 2 // len(held))
        tev_tokens = np.concatenate([h[0][:share] for h in held])[:tc.eval_windows * 2]
        tev_mask = np.concatenate([h[1][:share] for h in held])[:tc.eval_windows * 2]
    else:
      if len(t_ids) > tc.seq_len:
        t_win, t_wmask = train.make_windows(t_ids, t_m, tc.seq_len)
      if len(h_ids) > tc.seq_len:
        # The first directory's held-out shards come first, so adding a directory leaves this set as it was.
        tev_tokens, tev_mask = train.make_windows(h_ids, h_m, tc.seq_len)
        tev_tokens, tev_mask = tev_tokens[:tc.eval_windows * 2], tev_mask[:tc.eval_windows * 2]
    print(f"[train] target-answer corpus {', '.join(corpora)}: {int(t_m.sum()):,} answer tokens for training, "
          f"{int(h_m.sum()):,} held out", file=sys.stderr)
  elif args.target_corpus not in (None, "none"):
    missing = [c for c in corpora if not os.path.isdir(c)]  # not empty: the branch above takes all-present
    fail(f"no target-answer corpus at {', '.join(missing)} (make one with scripts/make_target_corpus.py)")
  if args.whole_examples and t_win is None:
    fail("--whole-examples packs the target-answer corpus into windows, and there is none (--target-corpus)")
  n_target = int(round(args.corpus_mix * tc.batch_size)) if t_win is not None else 0
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
  resuming = not args.fresh and mngr.latest_step() is not None
  init_record = os.path.join(work, "init.json")  # an --init-from run's starting point, kept for its resumes
  prior_tokens = 0  # tokens the --init-from draft was already trained on
  init_extra = None  # the --init-from draft's extra.json: its own recipe, carried into this run's exports
  if os.path.exists(init_record):
    if resuming:  # as recorded when the run began (--out may hold this run's own exports since)
      with open(init_record) as f:
        rec = json.load(f)
      prior_tokens, init_extra = int(rec["prior_tokens"]), rec.get("init_extra")
    else:
      os.remove(init_record)
  init = None
  if args.init_from:
    init_dir = os.path.abspath(args.init_from)
    try:
      icfg, iparams = checkpoints.load_checkpoint(init_dir)
    except checkpoints.CheckpointError as e:
      fail(str(e))
    if icfg.vocab_size != tcfg.vocab_size or icfg.head_vocab is None:
      fail(f"--init-from {init_dir}: needs a draft with the target's {tcfg.vocab_size}-token vocabulary and a "
           f"reduced head (head_vocab), got vocab {icfg.vocab_size}, head_vocab {icfg.head_vocab}")
    cfg = icfg
    if args.grow_layers:
      if not 1 <= args.grow_layers <= icfg.n_layers:
        fail(f"--grow-layers must be in [1, {icfg.n_layers}] (the starting draft's depth), got {args.grow_layers}")
      iparams, cfg = train.deepen(dict(iparams), icfg, args.grow_layers)
      print(f"[train] grown from {icfg.n_layers} to {cfg.n_layers} layers (output unchanged at the start)",
            file=sys.stderr)
    if args.grow_width:
      width_before = cfg.d_model
      try:
        iparams, cfg = train.widen(dict(iparams), cfg, args.grow_width, jax.random.key(tc.seed + 1))
      except ValueError as e:
        fail(f"--grow-width: {e}")
      print(f"[train] widened from d_model {width_before} to {cfg.d_model} ({cfg.n_heads} heads, {cfg.n_kv_heads} "
            f"KV heads, FFN {cfg.ffn_dim}; output unchanged at the start)", file=sys.stderr)
    if args.grow_head:
      # The tokens to add: by frequency in what this run trains on (ShareGPT windows and target answers alike).
      v_ids, v_mask = train_ids_for_vocab, train_mask_for_vocab
      if t_win is not None:
        v_ids, v_mask = np.concatenate([v_ids, t_win.reshape(-1)]), np.concatenate([v_mask, t_wmask.reshape(-1)])
      new_ids = train.more_head_vocab(v_ids, v_mask, tcfg.vocab_size, np.asarray(iparams["head_ids"]),
                                      args.grow_head)
      if len(new_ids) == 0:
        fail("--grow-head: every token of the training data is already in the draft's head")
      head_before = cfg.head_vocab
      iparams, cfg = train.widen_head(dict(iparams), cfg, tparams, new_ids)
      print(f"[train] head grown from {head_before} to {cfg.head_vocab} tokens", file=sys.stderr)
    if not resuming:
      extra_path = os.path.join(init_dir, "extra.json")
      if os.path.exists(extra_path):
        with open(extra_path) as f:
          init_extra = json.load(f)
        prior_tokens = int(init_extra.get("train_tokens", 0))
      # The loaded arrays are copied: the jitted step donates its inputs.
      init = jax.tree.map(lambda x: jnp.array(x, copy=True), dict(iparams))
      print(f"[train] starting from {init_dir} (trained on {prior_tokens:,} tokens before)", file=sys.stderr)
  if resuming:
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
  elif init is not None:
    params = init
    head_ids = np.asarray(params["head_ids"])
    np.save(os.path.join(work, "head_ids.npy"), head_ids)
    train.write_json(init_record, {"init_from": os.path.abspath(args.init_from), "prior_tokens": prior_tokens,
                                   "init_extra": init_extra})
    opt_state = train.init_opt_state(opt, params)
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
  tev_top = train.target_argmax(tparams, tcfg, tev_tokens) if tev_tokens is not None else None
  metric = "target_answers" if tev_top is not None else "sharegpt"

  # The teacher: the target's top-k on the target-answer windows, computed once (or the target on every batch).
  t_rows = t_probs = None
  if tc.teacher_top_k:
    head_size = cfg.head_vocab or cfg.vocab_size
    if t_win is None:
      fail("--teacher-top-k caches the target on the target-answer corpus, and there is none (--target-corpus)")
    if not 1 <= tc.teacher_top_k <= head_size:
      fail(f"--teacher-top-k must be in [1, {head_size}] (the draft's head), got {tc.teacher_top_k}")
    cache = train.TeacherCache(os.path.abspath(args.teacher_cache_dir or os.path.join(work, "teacher_cache")), t_win,
                               head_ids if cfg.head_vocab is not None else None, os.path.basename(target_dir),
                               tc.teacher_top_k)
    todo = cache.missing()
    if todo:
      print(f"[train] teacher cache: the target's top-{tc.teacher_top_k} on {len(t_win)} windows "
            f"({len(todo)} of {cache.n_chunks} chunks to compute) -> {cache.dir}", file=sys.stderr)
      n_todo, t_build = cache.missing_windows(), time.perf_counter()
      cbar = tqdm(total=len(t_win), initial=len(t_win) - n_todo, desc="teacher cache", unit="window",
                  disable=args.tiny, mininterval=5)
      cache.build(tparams, tcfg, progress=cbar.update)
      cbar.close()
      t_build = time.perf_counter() - t_build
      print(f"[train] teacher cache: {n_todo} windows in {t_build:.0f} s ({t_build / n_todo:.3f} s a window)",
            file=sys.stderr)
    t_rows, t_probs = cache.load()
    kept = float((t_probs.astype(np.float32).sum(-1) * t_wmask[:, 1:]).sum() / max(t_wmask[:, 1:].sum(), 1))
    print(f"[train] teacher: the target's top-{tc.teacher_top_k} from {cache.dir}, {kept:.3f} of its probability "
          f"on answer tokens", file=sys.stderr)

  step_fn = train.make_train_step(cfg, opt, tcfg, tc.distill_weight)
  best_file = os.path.join(work, "best.json")
  best = None
  if os.path.exists(best_file) and not args.fresh:
    with open(best_file) as f:
      rec = json.load(f)
    best = rec["agreement"] if rec.get("metric", "sharegpt") == metric else None  # a new metric starts afresh
  tokens_per_step = tc.batch_size * tc.seq_len
  print(f"[train] draft {cfg.name}: {train.params_nbytes(params) / 1e6:.1f} MB params, "
        f"{len(train_idx)} train windows x {tc.seq_len}, {n_eval} held-out windows, steps {start}->{tc.steps}",
        file=sys.stderr)
  bar = tqdm(range(start, until), initial=start, total=until, desc="train draft", unit="step",
             disable=args.tiny, mininterval=5)
  met = {}
  step_seconds, t0 = 0.0, time.perf_counter()  # training steps only: evaluation and saving are left out
  for step in bar:
    if n_target == 0:  # ShareGPT only: epochs of a seeded permutation
      perm = np.random.default_rng(tc.seed + 1 + step // max(1, len(train_idx) // tc.batch_size)).permutation(
          len(train_idx))
      j = (step % max(1, len(train_idx) // tc.batch_size)) * tc.batch_size
      sel = train_idx[perm[j:j + tc.batch_size]]
      toks, msk = windows[sel], wmask[sel]
    else:  # a mix, drawn by a generator seeded with the step, so a resumed run draws the same batches
      rs = np.random.default_rng([tc.seed, step])
      sel = train_idx[rs.integers(0, len(train_idx), tc.batch_size - n_target)]
      tsel = rs.integers(0, len(t_win), n_target)
      toks = np.concatenate([windows[sel], t_win[tsel]])
      msk = np.concatenate([wmask[sel], t_wmask[tsel]])
    batch = {"tokens": jnp.asarray(toks), "mask": jnp.asarray(msk)}
    if t_rows is not None:  # every row is a target-answer window (--corpus-mix 1)
      batch.update(t_rows=jnp.asarray(t_rows[tsel].astype(np.int32)), t_probs=jnp.asarray(t_probs[tsel], jnp.float32))
    params, opt_state, met = step_fn(params, opt_state, batch, None if t_rows is not None else tparams)
    done = step + 1
    if done % 20 == 0 or args.tiny:
      bar.set_postfix(loss=f"{float(met['loss']):.3f}", acc=f"{float(met['acc']):.3f}")
    pause = done % tc.save_every == 0 or done % tc.eval_every == 0 or done == until
    if pause or step == start:
      jax.block_until_ready(params)
      if step > start:  # the first step of a run compiles: not timed
        step_seconds += time.perf_counter() - t0
    if done % tc.save_every == 0 or done == until:
      mngr.save(done, args=ocp.args.StandardSave({"params": params, "opt": jax.tree.leaves(opt_state)}))
      mngr.wait_until_finished()
    if done % tc.eval_every == 0 or done == until:
      agree_sg = train.agreement(params, cfg, ev_tokens, ev_mask, ev_top)
      agree_t = train.agreement(params, cfg, tev_tokens, tev_mask, tev_top) if tev_top is not None else None
      agree = agree_t if metric == "target_answers" else agree_sg
      on_t = f", on held-out target answers {agree_t:.4f}" if agree_t is not None else ""
      print(f"\n[train] step {done}: held-out agreement with target on ShareGPT {agree_sg:.4f}{on_t} "
            f"(loss {float(met['loss']):.3f}, tokens seen {done * tokens_per_step:,})", file=sys.stderr, flush=True)
      if best is None or agree >= best:
        best = agree
        extra = {"recipe": "scripts/train_draft.py", "train_config": dataclasses.asdict(tc), "step": done,
                 "train_tokens": prior_tokens + done * tokens_per_step, "heldout_agreement": agree_sg,
                 "heldout": f"{n_eval} ShareGPT windows of {tc.seq_len} tokens (not trained on)",
                 "corpus_mix": args.corpus_mix if n_target else 0.0}
        if n_target:
          extra["target_windows"] = ("whole prompt-and-answer examples (--whole-examples)" if args.whole_examples
                                     else f"every {tc.seq_len} tokens of the stream")
        if args.init_from:
          extra.update(init_from=os.path.basename(os.path.abspath(args.init_from)), init_train_tokens=prior_tokens)
          if args.grow_layers:
            extra["grown"] = f"from {cfg.n_layers - args.grow_layers} to {cfg.n_layers} layers (--grow-layers)"
          if args.grow_width:
            extra["grown_width"] = f"from d_model {width_before} to {cfg.d_model} (--grow-width)"
          if args.grow_head:
            extra["grown_head"] = f"from {head_before} to {cfg.head_vocab} tokens (--grow-head)"
          if init_extra is not None:  # the starting draft's own record, so a chain of runs describes itself
            extra["init_extra"] = init_extra
        if agree_t is not None:
          extra.update(heldout_target_answer_agreement=agree_t,
                       heldout_target_answers=f"{len(tev_tokens)} windows of held-out target-answer shards")
        checkpoints.save_checkpoint(out + ".tmp", cfg, jax.device_get(params), tokenizer=tok, extra=extra)
        shutil.rmtree(out, ignore_errors=True)
        os.replace(out + ".tmp", out)
        train.write_json(best_file, {"agreement": agree, "step": done, "metric": metric})
    if pause or step == start:
      t0 = time.perf_counter()
  bar.close()
  n = until - start - 1
  rate = f"; {n} steps in {step_seconds:.0f} s ({step_seconds / n:.2f} s a step)" if n > 0 else ""
  print(f"[train] stopped at step {until}; best held-out agreement {best:.4f}; draft at {out}{rate}", file=sys.stderr)
  return 0


if __name__ == "__main__":
  run_main(main)
