"""What a standalone-draft run trains on and where it starts, in the order draft_loop.train runs them: the windows
(ShareGPT and the target's own answers), the draft's first or resumed state, the target's argmax on the held-out
windows and the cached distillation teacher."""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from ..models.config import ModelConfig
from .draft_data import load_answer_shards, make_windows, pack_examples, tokenize_conversations
from .draft_eval import target_argmax
from .draft_init import deepen, init_draft_from_target, widen, widen_head
from .draft_step import init_opt_state
from .head_vocab import choose_head_vocab, more_head_vocab
from .teacher import TeacherCache


def log(msg: str) -> None:
  print(msg, file=sys.stderr, flush=True)


def write_json(path: str, obj) -> None:
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=1, sort_keys=True)
  os.replace(tmp, path)


@dataclasses.dataclass
class Windows:
  """A run's windows, each [W, T+1] tokens with its loss mask [W, T+1]."""
  text: np.ndarray                # ShareGPT windows
  text_mask: np.ndarray
  train_idx: np.ndarray           # [W_train] the ShareGPT windows trained on (the rest are held out)
  eval_tokens: np.ndarray         # held-out ShareGPT windows
  eval_mask: np.ndarray
  answers: np.ndarray | None = None  # target-answer windows trained on (None: no corpus)
  answers_mask: np.ndarray | None = None
  answers_eval: np.ndarray | None = None  # held-out target-answer windows (None: no held-out shards)
  answers_eval_mask: np.ndarray | None = None
  n_target: int = 0               # rows of every batch drawn from `answers`

  def vocab_stream(self, with_answers: bool) -> tuple[np.ndarray, np.ndarray]:
    """Returns (ids, mask) of the ShareGPT training windows, followed by the target-answer ones when asked."""
    ids, mask = self.text[self.train_idx].reshape(-1), self.text_mask[self.train_idx].reshape(-1)
    if with_answers and self.answers is not None:
      ids, mask = np.concatenate([ids, self.answers.reshape(-1)]), np.concatenate([mask, self.answers_mask.reshape(-1)])
    return ids, mask


def load_windows(run, tok, conversations=None) -> Windows:
  """Returns the run's windows: ShareGPT (or `conversations`) tokenized once and cached in the work dir, split into
  training and held-out windows by a seeded permutation, then the target-answer corpus when there is one."""
  tc = run.tc
  cache_file = os.path.join(run.work_dir, f"sharegpt_tokens_{run.max_conversations or 'all'}.npz")
  if os.path.exists(cache_file):
    z = np.load(cache_file)
    ids, mask = z["ids"], z["mask"]
  else:
    if conversations is None:
      from ..data.datasets import iter_sharegpt
      conversations = iter_sharegpt(limit=run.max_conversations)
    ids, mask = tokenize_conversations(tok, conversations, progress=not run.tiny)
    np.savez(cache_file, ids=ids, mask=mask)
  windows, wmask = make_windows(ids, mask, tc.seq_len)
  order = np.random.default_rng(tc.seed).permutation(len(windows))
  n_eval = min(tc.eval_windows, max(1, len(windows) // 10))
  eval_idx, train_idx = order[:n_eval], order[n_eval:]
  if len(train_idx) == 0:
    raise ValueError("not enough training text for one training window")
  data = Windows(windows, wmask, train_idx, windows[eval_idx], wmask[eval_idx])
  _add_answer_windows(data, run, tok)
  if run.whole_examples and data.answers is None:
    raise ValueError("--whole-examples packs the target-answer corpus into windows, and there is none "
                     "(--target-corpus)")
  data.n_target = int(round(run.corpus_mix * tc.batch_size)) if data.answers is not None else 0
  return data


def _add_answer_windows(data: Windows, run, tok) -> None:
  """Adds the target's own answers (scripts/make_target_corpus.py shards) to `data`, when the corpus is present."""
  tc = run.tc
  corpora = [c for c in (run.target_corpus or os.path.join(run.work_dir, "target_answers")).split(",") if c]
  if not corpora:
    raise ValueError(f"--target-corpus {run.target_corpus!r} names no directory")
  if run.target_corpus == "none" or not all(os.path.isdir(c) for c in corpora):
    if run.target_corpus not in (None, "none"):
      missing = [c for c in corpora if not os.path.isdir(c)]  # not empty: all present was taken above
      raise ValueError(f"no target-answer corpus at {', '.join(missing)} (make one with "
                       f"scripts/make_target_corpus.py)")
    return
  parts = [load_answer_shards(c) for c in corpora]
  t_ids, t_m, h_ids, h_m = (np.concatenate([p[i] for p in parts]) for i in range(4))
  n_held = tc.eval_windows * 2
  if run.whole_examples:
    from ..models.tokenizer import IM_START
    im_start = tok.tok.token_to_id(IM_START)
    if t_m.any():
      data.answers, data.answers_mask = pack_examples(t_ids, t_m, tc.seq_len, im_start)
    # Held out: an equal share of windows from every directory that has held-out shards, so the set that picks the
    # exported step samples every kind of prompt the corpus holds.
    held = [pack_examples(p[2], p[3], tc.seq_len, im_start) for p in parts if p[3].any()]
    if held:
      share = -(-n_held // len(held))
      data.answers_eval = np.concatenate([h[0][:share] for h in held])[:n_held]
      data.answers_eval_mask = np.concatenate([h[1][:share] for h in held])[:n_held]
  else:
    if len(t_ids) > tc.seq_len:
      data.answers, data.answers_mask = make_windows(t_ids, t_m, tc.seq_len)
    if len(h_ids) > tc.seq_len:
      # The first directory's held-out shards come first, so adding a directory leaves this set as it was.
      tev_tokens, tev_mask = make_windows(h_ids, h_m, tc.seq_len)
      data.answers_eval, data.answers_eval_mask = tev_tokens[:n_held], tev_mask[:n_held]
  log(f"[train] target-answer corpus {', '.join(corpora)}: {int(t_m.sum()):,} answer tokens for training, "
      f"{int(h_m.sum()):,} held out")


@dataclasses.dataclass
class Start:
  """Where a run's training begins: the draft, its optimizer state and step, and what it was trained on before."""
  cfg: ModelConfig
  params: dict
  opt_state: object
  head_ids: np.ndarray  # [V_head] the token ids of the draft's head (saved in the work dir)
  step: int = 0         # steps already done (a resumed run)
  prior_tokens: int = 0  # tokens the --init-from draft was trained on before this run
  init_extra: dict | None = None  # the --init-from draft's extra.json, carried into this run's exports
  grown: dict = dataclasses.field(default_factory=dict)  # extra.json entries saying how the draft was grown


def start_draft(run, target, data: Windows, opt, mngr) -> Start:
  """Returns the run's starting point: resumed from the work dir's train state, or the --init-from draft (grown as
  asked), or a new draft initialised from the target's embedding over the most frequent training targets."""
  import orbax.checkpoint as ocp

  tc, recipe, tcfg = run.tc, run.recipe, target.cfg
  head_vocab = min(recipe["head_vocab"], tcfg.vocab_size)
  cfg = ModelConfig(vocab_size=tcfg.vocab_size, tie_embeddings=True, rms_eps=tcfg.rms_eps, rope_theta=tcfg.rope_theta,
                    max_seq_len=tcfg.max_seq_len, name="draft-" + ("tiny" if run.tiny else "smollm2"),
                    **{**recipe, "head_vocab": head_vocab})
  resuming = not run.fresh and mngr.latest_step() is not None
  init_record = os.path.join(run.work_dir, "init.json")  # an --init-from run's starting point, kept for its resumes
  prior_tokens, init_extra = _recorded_init(init_record, resuming)
  grown, init = {}, None
  if run.init_from:
    cfg, iparams, grown = _grown_draft(run, target, data)
    if not resuming:
      extra_path = os.path.join(os.path.abspath(run.init_from), "extra.json")
      if os.path.exists(extra_path):
        with open(extra_path) as f:
          init_extra = json.load(f)
        prior_tokens = int(init_extra.get("train_tokens", 0))
      # The loaded arrays are copied: the jitted step donates its inputs.
      init = jax.tree.map(lambda x: jnp.array(x, copy=True), dict(iparams))
      log(f"[train] starting from {os.path.abspath(run.init_from)} (trained on {prior_tokens:,} tokens before)")
  head_path = os.path.join(run.work_dir, "head_ids.npy")
  start = 0
  if resuming:
    head_ids = np.load(head_path)
    params = init_draft_from_target(jax.random.key(tc.seed), cfg, tcfg, target.params, head_ids)
    opt_state = init_opt_state(opt, params)
    abstract = {"params": params, "opt": jax.tree.leaves(opt_state)}
    start = mngr.latest_step()
    restored = mngr.restore(start, args=ocp.args.StandardRestore(jax.tree.map(ocp.utils.to_shape_dtype_struct,
                                                                              abstract)))
    params = jax.device_put(restored["params"])
    opt_state = jax.tree.unflatten(jax.tree.structure(opt_state), [jnp.asarray(x) for x in restored["opt"]])
    log(f"[train] resumed from step {start} in {run.work_dir}")
  elif init is not None:
    params = init
    head_ids = np.asarray(params["head_ids"])
    np.save(head_path, head_ids)
    write_json(init_record, {"init_from": os.path.abspath(run.init_from), "prior_tokens": prior_tokens,
                             "init_extra": init_extra})
    opt_state = init_opt_state(opt, params)
  else:
    head_ids = choose_head_vocab(*data.vocab_stream(with_answers=False), tcfg.vocab_size, head_vocab)
    np.save(head_path, head_ids)
    params = init_draft_from_target(jax.random.key(tc.seed), cfg, tcfg, target.params, head_ids)
    opt_state = init_opt_state(opt, params)
  return Start(cfg, params, opt_state, head_ids, start, prior_tokens, init_extra, grown)


def _recorded_init(init_record: str, resuming: bool) -> tuple[int, dict | None]:
  """Returns (prior tokens, the starting draft's extra.json) as an --init-from run recorded them when it began (its
  --out may hold its own exports since); a fresh run drops the record."""
  if not os.path.exists(init_record):
    return 0, None
  if not resuming:
    os.remove(init_record)
    return 0, None
  with open(init_record) as f:
    rec = json.load(f)
  return int(rec["prior_tokens"]), rec.get("init_extra")


def _grown_draft(run, target, data: Windows) -> tuple[ModelConfig, dict, dict]:
  """Returns (config, params, extra.json entries) of the --init-from draft, grown by --grow-layers, --grow-width and
  --grow-head (each leaves its output unchanged at first)."""
  from ..models.checkpoints import load_checkpoint

  tcfg = target.cfg
  init_dir = os.path.abspath(run.init_from)
  icfg, iparams = load_checkpoint(init_dir, dtype="float32")  # training keeps float32 master weights
  if icfg.vocab_size != tcfg.vocab_size or icfg.head_vocab is None:
    raise ValueError(f"--init-from {init_dir}: needs a draft with the target's {tcfg.vocab_size}-token vocabulary "
                     f"and a reduced head (head_vocab), got vocab {icfg.vocab_size}, head_vocab {icfg.head_vocab}")
  cfg, grown = icfg, {}
  if run.grow_layers:
    if not 1 <= run.grow_layers <= icfg.n_layers:
      raise ValueError(f"--grow-layers must be in [1, {icfg.n_layers}] (the starting draft's depth), got "
                       f"{run.grow_layers}")
    iparams, cfg = deepen(dict(iparams), icfg, run.grow_layers)
    log(f"[train] grown from {icfg.n_layers} to {cfg.n_layers} layers (output unchanged at the start)")
    grown["grown"] = f"from {icfg.n_layers} to {cfg.n_layers} layers (--grow-layers)"
  if run.grow_width:
    width_before = cfg.d_model
    try:
      iparams, cfg = widen(dict(iparams), cfg, run.grow_width, jax.random.key(run.tc.seed + 1))
    except ValueError as e:
      raise ValueError(f"--grow-width: {e}") from None
    log(f"[train] widened from d_model {width_before} to {cfg.d_model} ({cfg.n_heads} heads, {cfg.n_kv_heads} "
        f"KV heads, FFN {cfg.ffn_dim}; output unchanged at the start)")
    grown["grown_width"] = f"from d_model {width_before} to {cfg.d_model} (--grow-width)"
  if run.grow_head:
    # The tokens to add: by frequency in what this run trains on (ShareGPT windows and target answers alike).
    new_ids = more_head_vocab(*data.vocab_stream(with_answers=True), tcfg.vocab_size, np.asarray(iparams["head_ids"]),
                              run.grow_head)
    if len(new_ids) == 0:
      raise ValueError("--grow-head: every token of the training data is already in the draft's head")
    head_before = cfg.head_vocab
    iparams, cfg = widen_head(dict(iparams), cfg, target.params, new_ids)
    log(f"[train] head grown from {head_before} to {cfg.head_vocab} tokens")
    grown["grown_head"] = f"from {head_before} to {cfg.head_vocab} tokens (--grow-head)"
  return cfg, iparams, grown


def held_out_argmax(run, target, data: Windows) -> tuple[np.ndarray, np.ndarray | None]:
  """Returns the target's argmax on the held-out ShareGPT windows (cached in the work dir) and on the held-out
  target-answer windows (None without them)."""
  top_file = os.path.join(run.work_dir, f"eval_target_top_{len(data.eval_tokens)}x{run.tc.seq_len}.npy")
  if os.path.exists(top_file) and not run.tiny:
    ev_top = np.load(top_file)
  else:
    ev_top = target_argmax(target.params, target.cfg, data.eval_tokens)
    np.save(top_file, ev_top)
  tev_top = target_argmax(target.params, target.cfg, data.answers_eval) if data.answers_eval is not None else None
  return ev_top, tev_top


def cached_teacher(run, target, cfg: ModelConfig, head_ids: np.ndarray, data: Windows):
  """Returns (rows, probs) of the target's top-k over the draft's head on every target-answer window, computed once
  under the teacher cache directory; None without --teacher-top-k (the target then runs on every batch)."""
  from tqdm.auto import tqdm

  tc = run.tc
  if not tc.teacher_top_k:
    return None
  head_size = cfg.head_vocab or cfg.vocab_size
  t_win = data.answers
  if t_win is None:
    raise ValueError("--teacher-top-k caches the target on the target-answer corpus, and there is none "
                     "(--target-corpus)")
  if not 1 <= tc.teacher_top_k <= head_size:
    raise ValueError(f"--teacher-top-k must be in [1, {head_size}] (the draft's head), got {tc.teacher_top_k}")
  cache = TeacherCache(os.path.abspath(run.teacher_cache_dir or os.path.join(run.work_dir, "teacher_cache")), t_win,
                       head_ids if cfg.head_vocab is not None else None, target.name, tc.teacher_top_k)
  todo = cache.missing()
  if todo:
    log(f"[train] teacher cache: the target's top-{tc.teacher_top_k} on {len(t_win)} windows "
        f"({len(todo)} of {cache.n_chunks} chunks to compute) -> {cache.dir}")
    n_todo, t_build = cache.missing_windows(), time.perf_counter()
    cbar = tqdm(total=len(t_win), initial=len(t_win) - n_todo, desc="teacher cache", unit="window",
                disable=run.tiny, mininterval=5)
    cache.build(target.params, target.cfg, progress=cbar.update)
    cbar.close()
    t_build = time.perf_counter() - t_build
    log(f"[train] teacher cache: {n_todo} windows in {t_build:.0f} s ({t_build / n_todo:.3f} s a window)")
  t_rows, t_probs = cache.load()
  mask = data.answers_mask[:, 1:]
  kept = float((t_probs.astype(np.float32).sum(-1) * mask).sum() / max(mask.sum(), 1))
  log(f"[train] teacher: the target's top-{tc.teacher_top_k} from {cache.dir}, {kept:.3f} of its probability on "
      f"answer tokens")
  return t_rows, t_probs
