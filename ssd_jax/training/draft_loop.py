"""Training the standalone draft: `train(DraftRun(...), Target(...))` is scripts/train_draft.py's run (seeded,
resumable, evaluated on held-out windows, the best draft exported).

Every `save_every` steps the train state (params + optimizer) goes to the work dir (Orbax, two kept) and a later run
resumes from it. Every `eval_every` steps the draft's agreement with the target is measured on held-out ShareGPT
windows and, with a target-answer corpus, on held-out target answers (then the one that picks the export: what
acceptance measures); when it is the best so far the draft is exported to `out` (config.json, params/,
tokenizer.json, extra.json with the recipe and the measured agreement).
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..models.config import ModelConfig
from .draft_eval import agreement
from .draft_setup import Start, Windows, cached_teacher, held_out_argmax, load_windows, log, start_draft, write_json
from .draft_step import TrainConfig, make_optimizer, make_train_step

DRAFT_RECIPE = dict(d_model=256, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=64, ffn_dim=768, head_vocab=16384)
TINY_RECIPE = dict(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, ffn_dim=64, head_vocab=512)


class Target(NamedTuple):
  """The model the draft learns to agree with."""
  cfg: ModelConfig
  params: dict
  tokenizer: object  # TextTokenizer: encodes the training text, saved with every export
  name: str          # keys the teacher cache (the target's directory name)


@dataclasses.dataclass
class DraftRun:
  """One training run of the standalone draft (scripts/train_draft.py's flags, checked when built)."""
  work_dir: str                   # train state, token and teacher caches; made absolute
  out: str                        # where the best draft is exported
  tc: TrainConfig = dataclasses.field(default_factory=TrainConfig)
  recipe: dict = dataclasses.field(default_factory=lambda: dict(DRAFT_RECIPE))  # the draft's shape (new drafts)
  until: int | None = None        # stop at this step (default tc.steps, the schedule's length); resume later
  target_corpus: str | None = None  # target-answer shard dirs, comma-separated; None: <work_dir>/target_answers if
  # present; "none": ShareGPT only
  corpus_mix: float = 0.75        # share of every batch from the target-answer corpus when there is one
  whole_examples: bool = False    # target-answer windows of whole examples (pack_examples) instead of a cut stream
  teacher_cache_dir: str | None = None  # default <work_dir>/teacher_cache
  max_conversations: int | None = None  # the first N ShareGPT conversations (None: all)
  tiny: bool = False              # a smoke run: no progress bars, the held-out argmax recomputed every run
  fresh: bool = False             # ignore a train state in work_dir
  init_from: str | None = None    # start from this draft checkpoint (its config replaces the recipe)
  grow_layers: int = 0            # with init_from: layers to add (draft_init.deepen)
  grow_head: int = 0              # with init_from: tokens to add to the head (draft_init.widen_head)
  grow_width: int = 0             # with init_from: the wider d_model (draft_init.widen)

  def __post_init__(self):
    self.work_dir = os.path.abspath(self.work_dir)
    tc = self.tc
    if tc.steps < 1 or tc.batch_size < 1 or tc.seq_len < 2:
      raise ValueError("--steps and --batch-size must be >= 1 and --seq-len >= 2")
    if not 1 <= self.last_step <= tc.steps:
      raise ValueError(f"--until must be in [1, --steps = {tc.steps}], got {self.last_step}")
    for n, usage in ((self.grow_layers, "--grow-layers N (N >= 1) deepens the draft"),
                     (self.grow_head, "--grow-head N (N >= 1) widens the head of the draft"),
                     (self.grow_width, "--grow-width D_MODEL widens the draft")):
      if n < 0 or (n and not self.init_from):
        raise ValueError(f"{usage} given by --init-from; got {n}" + ("" if self.init_from else " without --init-from"))
    if not 0 <= self.corpus_mix <= 1:
      raise ValueError(f"--corpus-mix must be in [0, 1], got {self.corpus_mix}")
    if tc.teacher_top_k < 0:
      raise ValueError(f"--teacher-top-k must be >= 0, got {tc.teacher_top_k}")
    if tc.teacher_top_k and (tc.distill_weight <= 0 or self.corpus_mix != 1):
      raise ValueError("--teacher-top-k caches the distillation teacher on the target-answer corpus: it needs "
                       "--distill-weight > 0 and --corpus-mix 1")

  @property
  def last_step(self) -> int:
    return self.tc.steps if self.until is None else self.until


@dataclasses.dataclass
class DraftResult:
  cfg: ModelConfig
  params: dict            # the draft after the run's last step (not necessarily the exported one)
  best_agreement: float   # the best held-out agreement so far, over this run and the ones it resumed
  step: int               # the step the run stopped at


def train(run: DraftRun, target: Target, conversations=None) -> DraftResult:
  """Trains the draft of `run` toward `target` from where its work dir left off; returns where it stopped.

  conversations: [(role, text)] lists to train on instead of ShareGPT's (tokenized once and cached in the work dir,
  like ShareGPT's). Progress goes to stderr.
  """
  import orbax.checkpoint as ocp

  tc = run.tc
  os.makedirs(run.work_dir, exist_ok=True)
  data = load_windows(run, target.tokenizer, conversations)
  opt = make_optimizer(tc)
  mngr = ocp.CheckpointManager(run.work_dir, options=ocp.CheckpointManagerOptions(max_to_keep=2, create=True))
  start = start_draft(run, target, data, opt, mngr)
  ev_top, tev_top = held_out_argmax(run, target, data)
  metric = "target_answers" if tev_top is not None else "sharegpt"
  teacher = cached_teacher(run, target, start.cfg, start.head_ids, data)
  step_fn = make_train_step(start.cfg, opt, target.cfg, tc.distill_weight)
  best_file = os.path.join(run.work_dir, "best.json")
  best = None
  if os.path.exists(best_file) and not run.fresh:
    with open(best_file) as f:
      rec = json.load(f)
    best = rec["agreement"] if rec.get("metric", "sharegpt") == metric else None  # a new metric starts afresh
  nbytes = int(sum(np.asarray(x).nbytes for x in jax.tree.leaves(start.params)))
  log(f"[train] draft {start.cfg.name}: {nbytes / 1e6:.1f} MB params, {len(data.train_idx)} train windows x "
      f"{tc.seq_len}, {len(data.eval_tokens)} held-out windows, steps {start.step}->{tc.steps}")

  def evaluate(params, done: int, loss: float) -> tuple[float, dict]:
    """Returns (the agreement that picks the export, extra.json's figures) after step `done`."""
    agree_sg = agreement(params, start.cfg, data.eval_tokens, data.eval_mask, ev_top)
    agree_t = (agreement(params, start.cfg, data.answers_eval, data.answers_eval_mask, tev_top)
               if tev_top is not None else None)
    on_t = f", on held-out target answers {agree_t:.4f}" if agree_t is not None else ""
    log(f"\n[train] step {done}: held-out agreement with target on ShareGPT {agree_sg:.4f}{on_t} "
        f"(loss {loss:.3f}, tokens seen {done * tc.batch_size * tc.seq_len:,})")
    figures = {"heldout_agreement": agree_sg}
    if agree_t is not None:
      figures.update(heldout_target_answer_agreement=agree_t,
                     heldout_target_answers=f"{len(data.answers_eval)} windows of held-out target-answer shards")
    return (agree_t if metric == "target_answers" else agree_sg), figures

  def export(params, done: int, agree: float, figures: dict) -> None:
    extra = export_record(run, start, data, done, figures)
    _export(run.out, start.cfg, params, target.tokenizer, extra)
    write_json(best_file, {"agreement": agree, "step": done, "metric": metric})

  params, best = _loop(run, data, start, step_fn, teacher, target.params, best, evaluate, export, mngr)
  return DraftResult(start.cfg, params, best, run.last_step)


def draw_batch(step: int, data: Windows, tc: TrainConfig, teacher=None) -> dict:
  """Returns step `step`'s batch; the same step always draws the same windows, so a resumed run draws what an
  uninterrupted one would have."""
  if data.n_target == 0:  # ShareGPT only: epochs of a seeded permutation
    per_epoch = max(1, len(data.train_idx) // tc.batch_size)
    perm = np.random.default_rng(tc.seed + 1 + step // per_epoch).permutation(len(data.train_idx))
    j = (step % per_epoch) * tc.batch_size
    sel = data.train_idx[perm[j:j + tc.batch_size]]
    toks, msk = data.text[sel], data.text_mask[sel]
  else:  # a mix, drawn by a generator seeded with the step
    rs = np.random.default_rng([tc.seed, step])
    sel = data.train_idx[rs.integers(0, len(data.train_idx), tc.batch_size - data.n_target)]
    tsel = rs.integers(0, len(data.answers), data.n_target)
    toks = np.concatenate([data.text[sel], data.answers[tsel]])
    msk = np.concatenate([data.text_mask[sel], data.answers_mask[tsel]])
  batch = {"tokens": jnp.asarray(toks), "mask": jnp.asarray(msk)}
  if teacher is not None:  # every row is a target-answer window (--corpus-mix 1)
    t_rows, t_probs = teacher
    batch.update(t_rows=jnp.asarray(t_rows[tsel].astype(np.int32)), t_probs=jnp.asarray(t_probs[tsel], jnp.float32))
  return batch


def _loop(run: DraftRun, data: Windows, start: Start, step_fn, teacher, target_params, best, evaluate, export, mngr):
  """Runs steps start.step..run.last_step, saving, evaluating and exporting on schedule; returns (params, best)."""
  import orbax.checkpoint as ocp
  from tqdm.auto import tqdm

  tc, until, first = run.tc, run.last_step, start.step
  params, opt_state = start.params, start.opt_state
  bar = tqdm(range(first, until), initial=first, total=until, desc="train draft", unit="step", disable=run.tiny,
             mininterval=5)
  step_seconds, t0 = 0.0, time.perf_counter()  # training steps only: evaluation and saving are left out
  for step in bar:
    batch = draw_batch(step, data, tc, teacher)
    params, opt_state, met = step_fn(params, opt_state, batch, None if teacher is not None else target_params)
    done = step + 1
    if done % 20 == 0 or run.tiny:
      bar.set_postfix(loss=f"{float(met['loss']):.3f}", acc=f"{float(met['acc']):.3f}")
    pause = done % tc.save_every == 0 or done % tc.eval_every == 0 or done == until
    if pause or step == first:
      jax.block_until_ready(params)
      if step > first:  # the first step of a run compiles: not timed
        step_seconds += time.perf_counter() - t0
    if done % tc.save_every == 0 or done == until:
      mngr.save(done, args=ocp.args.StandardSave({"params": params, "opt": jax.tree.leaves(opt_state)}))
      mngr.wait_until_finished()
    if done % tc.eval_every == 0 or done == until:
      agree, figures = evaluate(params, done, float(met["loss"]))
      if best is None or agree >= best:
        best = agree
        export(params, done, agree, figures)
    if pause or step == first:
      t0 = time.perf_counter()
  bar.close()
  n = until - first - 1
  rate = f"; {n} steps in {step_seconds:.0f} s ({step_seconds / n:.2f} s a step)" if n > 0 else ""
  log(f"[train] stopped at step {until}; best held-out agreement {best:.4f}; draft at {run.out}{rate}")
  return params, best


def export_record(run: DraftRun, start: Start, data: Windows, done: int, figures: dict) -> dict:
  """Returns the extra.json of the draft exported after step `done`: its recipe, data and measured agreement."""
  tc = run.tc
  tokens_per_step = tc.batch_size * tc.seq_len
  extra = {"recipe": "scripts/train_draft.py", "train_config": dataclasses.asdict(tc), "step": done,
           "train_tokens": start.prior_tokens + done * tokens_per_step,
           "heldout_agreement": figures["heldout_agreement"],
           "heldout": f"{len(data.eval_tokens)} ShareGPT windows of {tc.seq_len} tokens (not trained on)",
           "corpus_mix": run.corpus_mix if data.n_target else 0.0}
  if data.n_target:
    extra["target_windows"] = ("whole prompt-and-answer examples (--whole-examples)" if run.whole_examples
                               else f"every {tc.seq_len} tokens of the stream")
  if run.init_from:
    extra.update(init_from=os.path.basename(os.path.abspath(run.init_from)), init_train_tokens=start.prior_tokens)
    extra.update(start.grown)
    if start.init_extra is not None:  # the starting draft's own record, so a chain of runs describes itself
      extra["init_extra"] = start.init_extra
  extra.update({k: v for k, v in figures.items() if k != "heldout_agreement"})
  return extra


def _export(out: str, cfg: ModelConfig, params, tokenizer, extra: dict) -> None:
  """Writes the draft to `out`, replacing what was there only once the new one is complete."""
  from ..models.checkpoints import save_checkpoint

  save_checkpoint(out + ".tmp", cfg, jax.device_get(params), tokenizer=tokenizer, extra=extra)
  shutil.rmtree(out, ignore_errors=True)
  os.replace(out + ".tmp", out)
