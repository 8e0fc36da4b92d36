"""Draft-model training: data packing, target-derived initialisation, a jitted train step, agreement evaluation.

The number that matters for speculation is **agreement with the target**: how often the draft's argmax equals the
target's argmax at the same position. Evaluation reports it on held-out text; `scripts/eval_draft.py` measures it on
the target's own answers.
"""
from __future__ import annotations

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax

from . import model
from .config import ModelConfig


@dataclasses.dataclass
class TrainConfig:
  seq_len: int = 256
  batch_size: int = 16
  steps: int = 20000
  lr: float = 1e-3
  min_lr: float = 1e-4
  warmup: int = 200
  weight_decay: float = 0.01
  clip: float = 1.0
  seed: int = 0
  eval_every: int = 200
  save_every: int = 200
  distill_weight: float = 0.0  # 0: hard labels only; >0: mix in KL to the target's distribution (costs a target forward)
  teacher_top_k: int = 0  # >0: distil toward the target's top-k, computed once per window (TeacherCache)
  eval_windows: int = 16


# ----------------------------------------------------------------------------------------------------------- data

def tokenize_conversations(tok, conversations, progress: bool = True):
  """Returns (ids uint16/int32 [N], loss mask uint8 [N]) of conversations concatenated in the chat template."""
  from tqdm.auto import tqdm

  from .datasets import chat_pieces

  ids, mask = [], []
  convs = list(conversations)
  batch = 256
  for i in tqdm(range(0, len(convs), batch), desc="tokenizing", disable=not progress, unit="batch"):
    pieces = [chat_pieces(c) for c in convs[i:i + batch]]
    flat = [p for ps in pieces for p in ps]
    enc = tok.encode_batch([t for t, _ in flat])
    for e, (_, m) in zip(enc, flat):
      ids.extend(e)
      mask.extend([int(m)] * len(e))
  dtype = np.uint16 if tok.vocab_size <= 65536 else np.int32
  return np.asarray(ids, dtype), np.asarray(mask, np.uint8)


def make_windows(ids: np.ndarray, mask: np.ndarray, seq_len: int):
  """Cuts the stream into non-overlapping windows of seq_len + 1 tokens: returns (tokens [W, T+1], mask [W, T+1])."""
  w = (len(ids) - 1) // seq_len
  if w < 1:
    raise ValueError(f"need more than {seq_len} tokens of training text, got {len(ids)}")
  idx = np.arange(w)[:, None] * seq_len + np.arange(seq_len + 1)[None, :]
  return ids[idx].astype(np.int32), mask[idx].astype(np.float32)


def example_starts(ids: np.ndarray, mask: np.ndarray, start_id: int) -> np.ndarray:
  """Returns where each prompt-and-answer example of a target-answer stream begins.

  An example is a prompt (mask 0) then its answer (mask 1); the next one begins at the first `start_id` (the chat
  template's `<|im_start|>`) after an answer. The stream's first token always begins one.
  """
  ids, mask = np.asarray(ids), np.asarray(mask)
  answered = np.concatenate([[0], np.cumsum(mask.astype(np.int64))])  # answer tokens before each index
  starts = [0]
  for i in np.flatnonzero(ids == start_id):
    if i > starts[-1] and answered[i] > answered[starts[-1]]:
      starts.append(int(i))
  return np.asarray(starts, np.int64)


def pack_examples(ids: np.ndarray, mask: np.ndarray, seq_len: int, start_id: int, pad_id: int = 0):
  """Packs whole examples into windows of seq_len + 1 tokens: returns (tokens [W, T+1], mask [W, T+1]).

  `make_windows` cuts the stream every seq_len tokens, so most answers are trained without the start of their prompt
  (62% of the answer tokens of the first synthetic corpus at 256), while the draft always reads the whole prompt
  when it drafts. Here every window begins at an example's start and holds whole examples; the rest is padding with
  mask 0. Examples go longest first into the first window with room (first-fit decreasing: about 95% of the tokens
  are real ones on the target-answer corpora at 512, where packing in corpus order keeps about 75%). An example
  longer than a window is cut into window-sized pieces.
  """
  starts = example_starts(ids, mask, start_id)
  bounds = np.append(starts, len(ids))
  w = seq_len + 1
  pieces = [(lo, min(b, lo + w)) for a, b in zip(bounds[:-1], bounds[1:]) for lo in range(a, b, w)]
  if not pieces:
    raise ValueError("no examples to pack")
  order = sorted(range(len(pieces)), key=lambda i: (-(pieces[i][1] - pieces[i][0]), i))
  room = np.zeros((0,), np.int64)
  bins: list[list[int]] = []
  for i in order:
    n = pieces[i][1] - pieces[i][0]
    fits = np.flatnonzero(room >= n)
    if len(fits):
      room[fits[0]] -= n
      bins[fits[0]].append(i)
    else:
      room = np.append(room, w - n)
      bins.append([i])
  tokens = np.full((len(bins), w), pad_id, np.int32)
  out_mask = np.zeros((len(bins), w), np.float32)
  for r, members in enumerate(bins):
    at = 0
    for i in sorted(members):  # corpus order inside a window
      lo, hi = pieces[i]
      tokens[r, at:at + hi - lo] = ids[lo:hi]
      out_mask[r, at:at + hi - lo] = mask[lo:hi]
      at += hi - lo
  return tokens, out_mask


def load_answer_shards(directory: str, heldout_every: int = 25, heldout_offset: int = 7):
  """Returns (train_ids, train_mask, heldout_ids, heldout_mask) from `scripts/make_target_corpus.py` shards.

  Shard b is held out when b % heldout_every == heldout_offset: a fixed rule, so the held-out text stays the same
  while the corpus grows (shards are numbered by their place in the corpus's plan, not by when they were written).
  """
  import glob
  import re

  parts = {True: ([], []), False: ([], [])}
  for f in sorted(glob.glob(os.path.join(directory, "shard_*.npz"))):
    m = re.fullmatch(r"shard_(\d{5})\.npz", os.path.basename(f))
    if not m:
      continue  # a shard being written
    z = np.load(f)
    held = int(m.group(1)) % heldout_every == heldout_offset
    parts[held][0].append(z["ids"])
    parts[held][1].append(z["mask"])
  cat = lambda xs, dt: np.concatenate(xs) if xs else np.zeros((0,), dt)  # noqa: E731
  return (cat(parts[False][0], np.uint16), cat(parts[False][1], np.uint8), cat(parts[True][0], np.uint16),
          cat(parts[True][1], np.uint8))


def _token_counts(ids: np.ndarray, mask: np.ndarray, vocab_size: int) -> np.ndarray:
  """How often each token id is a loss-masked target, ties broken by its overall frequency."""
  counts = np.bincount(ids[mask.astype(bool)].astype(np.int64), minlength=vocab_size).astype(np.float64)
  return counts + 1e-3 * np.bincount(ids.astype(np.int64), minlength=vocab_size)


def choose_head_vocab(ids: np.ndarray, mask: np.ndarray, vocab_size: int, size: int, always=(0, 1, 2)) -> np.ndarray:
  """Returns the `size` token ids most frequent among loss-masked targets (plus `always`), sorted."""
  counts = _token_counts(ids, mask, vocab_size)
  counts[list(always)] = np.inf
  return np.sort(np.argsort(-counts, kind="stable")[:size]).astype(np.int32)


def more_head_vocab(ids: np.ndarray, mask: np.ndarray, vocab_size: int, head_ids: np.ndarray, n: int) -> np.ndarray:
  """Returns the `n` token ids outside `head_ids` most frequent among loss-masked targets (those seen first), sorted.

  Fewer when fewer tokens outside the head occur at all: a row for a token the data never shows would not train.
  """
  counts = _token_counts(ids, mask, vocab_size)
  counts[np.asarray(head_ids, np.int64)] = -1.0
  order = np.argsort(-counts, kind="stable")[:n]
  return np.sort(order[counts[order] > 0]).astype(np.int32)


# ------------------------------------------------------------------------------------------------------------ init

def init_draft_from_target(key, cfg: ModelConfig, target_cfg: ModelConfig, target_params, head_ids: np.ndarray):
  """Returns draft params whose embedding is the target's, restricted to `head_ids` and projected by PCA to d_model.

  The target's embedding already places tokens meaningfully; a projection onto its top principal directions keeps
  most of that in the draft's narrower space, and beats a random start by a wide margin early in training.
  """
  params = model.init_params(key, cfg)
  e = np.asarray(target_params["embed"], np.float32)[head_ids]  # [Vh, d_t]
  mu = e.mean(0, keepdims=True)
  _, _, vt = np.linalg.svd(e - mu, full_matrices=False)
  proj = vt[: cfg.d_model].T  # [d_t, d]
  e_d = (e - mu) @ proj
  # Rows of norm ~1: with the tied head and a unit-RMS final norm this keeps the initial logits O(1).
  e_d = e_d / np.sqrt((e_d ** 2).sum(1).mean())
  params["embed"] = jnp.asarray(e_d, jnp.float32)
  if cfg.head_vocab is not None:
    vocab_map = np.zeros((cfg.vocab_size,), np.int32)
    vocab_map[head_ids] = np.arange(len(head_ids), dtype=np.int32)
    params["head_ids"] = jnp.asarray(head_ids, jnp.int32)
    params["vocab_map"] = jnp.asarray(vocab_map)
  # Scale residual-branch outputs down so the randomly initialised blocks start near the identity.
  for lp in params["layers"]:
    lp["wo"] = lp["wo"] / np.sqrt(2 * cfg.n_layers)
    lp["w_down"] = lp["w_down"] / np.sqrt(2 * cfg.n_layers)
  return params


def deepen(params: dict, cfg: ModelConfig, n_new: int) -> tuple[dict, ModelConfig]:
  """Returns a draft with `n_new` more layers that computes exactly what `params` computes, and its config.

  Each new layer is a copy of the layer it follows with its two residual outputs (`wo`, `w_down`) zeroed, so it adds
  nothing until training moves them; its input projections start where a trained layer's are rather than at random.
  The copies follow evenly spread layers (every layer when `n_new` equals the depth). Growing a trained draft this way
  keeps what it learned and buys capacity for the cost of the added layers only.
  """
  layers = list(params["layers"])
  if not 1 <= n_new <= len(layers):
    raise ValueError(f"can add 1 to {len(layers)} layers (one after each existing one at most), got {n_new}")
  after = set(np.linspace(0, len(layers) - 1, n_new).round().astype(int).tolist())  # distinct: step >= 1
  grown = []
  for i, lp in enumerate(layers):
    grown.append(lp)
    if i in after:
      copy = {k: jnp.array(v, copy=True) for k, v in lp.items()}
      copy["wo"] = jnp.zeros_like(lp["wo"])
      copy["w_down"] = jnp.zeros_like(lp["w_down"])
      grown.append(copy)
  return dict(params, layers=grown), dataclasses.replace(cfg, n_layers=len(grown))


def widen(params: dict, cfg: ModelConfig, d_model: int, key, scale: float = 0.02) -> tuple[dict, ModelConfig]:
  """Returns a draft `d_model` wide that computes what `params` computes (to float rounding), and its config.

  The head dimension and the ratios n_heads : n_kv_heads : d_model : ffn_dim are kept, so the new width brings new
  attention heads (appended after the old ones, whose query-to-KV grouping is unchanged), new KV heads and new FFN
  units. Everything that writes to the residual stream (the embedding's new columns, `wo` and `w_down`'s new rows
  and columns) starts at zero, so the new residual dimensions stay zero; everything that only reads them (new input
  rows of `wq`/`wk`/`wv`/`w_gate`/`w_up`, the new heads' and units' columns) starts small and random, so gradients
  reach the new parts at once. Zero dimensions lower a norm's mean square by d / d_model: the norms' old weights are
  scaled by sqrt(d / d_model) and their epsilon by d / d_model, which undoes it exactly.
  """
  d, H, G, D, F = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn_dim
  rep = H // G
  if d_model <= d or (H * d_model) % (d * rep) or (F * d_model) % d:
    raise ValueError(f"the new width must exceed {d} and give whole numbers of query heads ({H} x d_model / {d}, a "
                     f"multiple of the {rep} per KV head) and FFN units ({F} x d_model / {d}); got {d_model}")
  if cfg.attn_bias or not cfg.tie_embeddings:
    raise ValueError("widen handles tied drafts without attention biases")
  H2 = H * d_model // d
  G2 = H2 // rep
  F2 = F * d_model // d
  s = float(np.sqrt(d / d_model))
  keys = iter(jax.random.split(key, 8 * len(params["layers"]) + 1))

  def grow(w, shape, rand_rows: bool, rand_cols: bool):
    """w placed top-left in `shape`; the new rows / columns random (reading new inputs / making new outputs) or 0."""
    w = np.asarray(w, np.float32)
    out = np.zeros(shape, np.float32)
    r = np.asarray(jax.random.normal(next(keys), shape, jnp.float32)) * scale
    if rand_rows:
      out[w.shape[0]:, :] = r[w.shape[0]:, :]
    if rand_cols:
      out[:, w.shape[1]:] = r[:, w.shape[1]:]
    out[: w.shape[0], : w.shape[1]] = w
    return jnp.asarray(out)

  def norm(w):
    w = np.asarray(w, np.float32) * s
    return jnp.asarray(np.concatenate([w, np.full((d_model - d,), w.mean(), np.float32)]))

  layers = []
  for lp in params["layers"]:
    layers.append({
        "attn_norm": norm(lp["attn_norm"]), "mlp_norm": norm(lp["mlp_norm"]),
        "wq": grow(lp["wq"], (d_model, H2 * D), True, True),
        "wk": grow(lp["wk"], (d_model, G2 * D), True, True),
        "wv": grow(lp["wv"], (d_model, G2 * D), True, True),
        "wo": grow(lp["wo"], (H2 * D, d_model), False, False),
        "w_gate": grow(lp["w_gate"], (d_model, F2), True, True),
        "w_up": grow(lp["w_up"], (d_model, F2), True, True),
        "w_down": grow(lp["w_down"], (F2, d_model), False, False)})
  embed = np.asarray(params["embed"], np.float32)
  embed = np.concatenate([embed, np.zeros((embed.shape[0], d_model - d), np.float32)], 1)
  out = dict(params, layers=layers, embed=jnp.asarray(embed), final_norm=norm(params["final_norm"]))
  return out, dataclasses.replace(cfg, d_model=d_model, n_heads=H2, n_kv_heads=G2, ffn_dim=F2,
                                 rms_eps=cfg.rms_eps * d / d_model)


def widen_head(params: dict, cfg: ModelConfig, target_params, new_ids: np.ndarray) -> tuple[dict, ModelConfig]:
  """Returns a draft whose reduced vocabulary also holds `new_ids`, and its config.

  The draft's embedding is tied to its head, so a token outside the head can be neither proposed nor read (it shares
  row 0 on input). Each new row starts where a least-squares map from the target's embedding to the draft's, fitted
  on the rows the draft has, puts it: the draft's own geometry, extended to the new tokens by the target's. Logits
  of the existing rows at positions that read only known tokens are unchanged; the new rows then take some
  probability, as the tokens they resemble do, until training places them.
  """
  if cfg.head_vocab is None or not cfg.tie_embeddings:
    raise ValueError("widen_head needs a draft with a reduced, tied head (head_vocab)")
  old_ids = np.asarray(params["head_ids"], np.int64)
  new_ids = np.asarray(new_ids, np.int64)
  if len(new_ids) == 0 or len(np.unique(new_ids)) != len(new_ids) or np.isin(new_ids, old_ids).any() or \
      new_ids.min() < 0 or new_ids.max() >= cfg.vocab_size:
    raise ValueError(f"new head tokens must be distinct ids in [0, {cfg.vocab_size}) outside the head, "
                     f"got {len(new_ids)} ids")
  e_t = np.asarray(target_params["embed"], np.float64)
  e_d = np.asarray(params["embed"], np.float64)
  x = np.concatenate([e_t[old_ids], np.ones((len(old_ids), 1))], 1)  # [Vh, d_t + 1]: an affine map
  w, *_ = np.linalg.lstsq(x, e_d, rcond=None)
  rows = np.concatenate([e_t[new_ids], np.ones((len(new_ids), 1))], 1) @ w
  ids = np.concatenate([old_ids, new_ids])
  order = np.argsort(ids, kind="stable")  # head_ids stay sorted, as choose_head_vocab makes them
  embed = np.concatenate([e_d, rows])[order]
  vocab_map = np.zeros((cfg.vocab_size,), np.int32)
  vocab_map[ids[order]] = np.arange(len(ids), dtype=np.int32)
  out = dict(params, embed=jnp.asarray(embed, params["embed"].dtype), head_ids=jnp.asarray(ids[order], jnp.int32),
             vocab_map=jnp.asarray(vocab_map))
  return out, dataclasses.replace(cfg, head_vocab=len(ids))


# ----------------------------------------------------------------------------------------------------------- steps

def make_optimizer(tc: TrainConfig):
  sched = optax.warmup_cosine_decay_schedule(0.0, tc.lr, tc.warmup, max(tc.steps, tc.warmup + 1), tc.min_lr)
  return optax.chain(optax.clip_by_global_norm(tc.clip), optax.adamw(sched, weight_decay=tc.weight_decay))


def _label_rows(params, labels, cfg: ModelConfig):
  """Returns (head row of each label, whether the label is in the draft's vocabulary)."""
  if cfg.head_vocab is None:
    return labels, jnp.ones(labels.shape, bool)
  rows = params["vocab_map"][labels]
  return rows, params["head_ids"][rows] == labels


def loss_fn(params, batch, cfg: ModelConfig, teacher_probs=None, distill_weight: float = 0.0):
  """Returns (mean loss over masked in-vocabulary targets, metrics)."""
  tokens, mask = batch["tokens"], batch["mask"]
  inp, labels, m = tokens[:, :-1], tokens[:, 1:], mask[:, 1:]
  logits = model.forward_full(params, inp, cfg)
  logp = jax.nn.log_softmax(logits, -1)
  rows, known = _label_rows(params, labels, cfg)
  m = m * known
  nll = -jnp.take_along_axis(logp, rows[..., None], -1)[..., 0]
  denom = jnp.maximum(m.sum(), 1.0)
  ce = (nll * m).sum() / denom
  loss = ce
  if teacher_probs is not None and distill_weight > 0:
    if isinstance(teacher_probs, tuple):  # the target's top-k: (head rows, probabilities), renormalised
      t_rows, t_p = teacher_probs
      t_p = t_p / jnp.maximum(t_p.sum(-1, keepdims=True), 1e-9)
      kl = -(t_p * jnp.take_along_axis(logp, t_rows, -1)).sum(-1)
    else:
      kl = -(teacher_probs * logp).sum(-1)
    loss = (1 - distill_weight) * ce + distill_weight * (kl * m).sum() / denom
  acc = ((jnp.argmax(logits, -1) == rows) * m).sum() / denom
  return loss, {"ce": ce, "acc": acc}


TABLES = ("head_ids", "vocab_map")


def split_tables(params):
  """Returns (trainable weights, integer token-id tables): the tables are data, not weights."""
  return ({k: v for k, v in params.items() if k not in TABLES}, {k: v for k, v in params.items() if k in TABLES})


def init_opt_state(opt, params):
  return opt.init(split_tables(params)[0])


def _teacher_probs(target_params, target_cfg: ModelConfig, head_ids, tokens):
  """Returns the target's next-token distribution over the draft's head ([N, T, V_head]) at tokens[:, :-1]."""
  logits = model.forward_full(target_params, tokens[:, :-1], target_cfg)
  if head_ids is not None:
    logits = logits[..., head_ids]
  return jax.lax.stop_gradient(jax.nn.softmax(logits, -1))


def make_train_step(cfg: ModelConfig, opt, target_cfg: ModelConfig | None = None, distill_weight: float = 0.0):
  """Returns a jitted step(params, opt_state, batch, target_params) -> (params, opt_state, metrics).

  With distillation, the teacher is the target run on the batch (target_params), or, when the batch carries
  "t_rows" and "t_probs" (the target's top-k from a TeacherCache), those: then target_params may be None.
  """

  def step(params, opt_state, batch, target_params):
    if distill_weight <= 0:
      tp = None
    elif "t_rows" in batch:
      tp = (batch["t_rows"], batch["t_probs"])
    else:
      tp = _teacher_probs(target_params, target_cfg, params["head_ids"] if cfg.head_vocab is not None else None,
                          batch["tokens"])
    weights, tables = split_tables(params)
    (loss, met), grads = jax.value_and_grad(
        lambda w: loss_fn({**w, **tables}, batch, cfg, tp, distill_weight), has_aux=True)(weights)
    updates, opt_state = opt.update(grads, opt_state, weights)
    weights = optax.apply_updates(weights, updates)
    return {**weights, **tables}, opt_state, dict(met, loss=loss)

  return jax.jit(step, donate_argnums=(0, 1))


class TeacherCache:
  """The target's top-k next-token distribution over the draft's head, per position of a fixed set of windows.

  Distillation otherwise runs the 135M-parameter target on every batch (most of a CPU train step), again for every
  pass over the same windows. The cache computes it once, in resumable chunks of `chunk` windows, each written
  atomically under `root/<key of head, target and k>/chunk_<key of its windows>.npz`. Chunks are addressed by their
  content: a changed corpus never reads a stale chunk, and a grown one (make_windows over more shards appends
  windows) reuses every chunk it shares and computes only the new ones. Rows are head indices (uint16 up to 65,536
  of them), probabilities float16.
  """

  def __init__(self, root: str, windows: np.ndarray, head_ids: np.ndarray | None, target_name: str, k: int,
               chunk: int = 64):
    import hashlib

    if k < 1:
      raise ValueError(f"teacher top-k must be >= 1, got {k}")

    def key(*parts) -> str:
      h = hashlib.sha1()
      for part in parts:
        if isinstance(part, str):
          h.update(part.encode())
        else:
          h.update(str(part.shape).encode())
          h.update(part.tobytes())
      return h.hexdigest()[:16]

    self.dir = os.path.join(root, key(np.asarray([] if head_ids is None else head_ids, np.int64),
                                      f"{target_name}|{k}"))
    self.windows, self.head_ids, self.k, self.chunk = windows, head_ids, k, chunk
    self.n_chunks = -(-len(windows) // chunk)
    self._keys = [key(np.ascontiguousarray(self._chunk_windows(c), np.int32)) for c in range(self.n_chunks)]

  def _chunk_windows(self, c: int) -> np.ndarray:
    return self.windows[c * self.chunk:(c + 1) * self.chunk]

  def _path(self, c: int) -> str:
    return os.path.join(self.dir, f"chunk_{self._keys[c]}.npz")

  def missing(self) -> list[int]:
    return [c for c in range(self.n_chunks) if not os.path.exists(self._path(c))]

  def missing_windows(self) -> int:
    return sum(len(self._chunk_windows(c)) for c in self.missing())

  def build(self, target_params, target_cfg: ModelConfig, progress=None, sub_batch: int = 4) -> None:
    """Computes the chunks not yet on disk; `progress(n_windows_done)` is called after each chunk."""
    os.makedirs(self.dir, exist_ok=True)
    head = None if self.head_ids is None else jnp.asarray(self.head_ids)
    k = self.k

    @jax.jit
    def top(tp, toks):
      p = _teacher_probs(tp, target_cfg, head, toks)
      vals, rows = jax.lax.top_k(p, k)
      return rows.astype(jnp.uint16 if p.shape[-1] <= 65536 else jnp.int32), vals.astype(jnp.float16)

    for c in self.missing():
      w = self._chunk_windows(c)
      outs = [top(target_params, jnp.asarray(w[i:i + sub_batch])) for i in range(0, len(w), sub_batch)]
      rows = np.concatenate([np.asarray(o[0]) for o in outs])
      probs = np.concatenate([np.asarray(o[1]) for o in outs])
      tmp = self._path(c)[:-4] + ".tmp.npz"
      np.savez(tmp, rows=rows, probs=probs)
      os.replace(tmp, self._path(c))
      if progress is not None:
        progress(len(w))

  def load(self) -> tuple[np.ndarray, np.ndarray]:
    """Returns (rows [W, T, k] uint16 (int32 above 65,536 head rows), probs [W, T, k] float16) for all windows;
    every chunk must be built."""
    if self.missing():
      raise RuntimeError(f"teacher cache {self.dir} is incomplete: build() it first")
    zs = [np.load(self._path(c)) for c in range(self.n_chunks)]
    return np.concatenate([z["rows"] for z in zs]), np.concatenate([z["probs"] for z in zs])


def target_argmax(target_params, target_cfg: ModelConfig, tokens: np.ndarray, chunk: int = 4) -> np.ndarray:
  """Returns the target's argmax token at every position of tokens[:, :-1] ([W, T] int32)."""
  f = jax.jit(lambda p, t: jnp.argmax(model.forward_full(p, t, target_cfg), -1))
  outs = [np.asarray(f(target_params, jnp.asarray(tokens[i:i + chunk, :-1]))) for i in range(0, len(tokens), chunk)]
  return np.concatenate(outs).astype(np.int32)


def agreement(params, cfg: ModelConfig, tokens: np.ndarray, mask: np.ndarray, target_top: np.ndarray) -> float:
  """Returns the fraction of masked positions where the draft's argmax token equals the target's argmax token."""
  f = jax.jit(lambda p, t: model.to_token_ids(p, jnp.argmax(model.forward_full(p, t, cfg), -1), cfg))
  hits, total = 0.0, 0.0
  for i in range(0, len(tokens), 4):
    d = np.asarray(f(params, jnp.asarray(tokens[i:i + 4, :-1])))
    m = mask[i:i + 4, 1:]
    hits += float(((d == target_top[i:i + 4]) * m).sum())
    total += float(m.sum())
  return hits / max(total, 1.0)


def params_nbytes(params) -> int:
  return int(sum(np.asarray(x).nbytes for x in jax.tree.leaves(params)))


def write_json(path: str, obj) -> None:
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=1, sort_keys=True)
  os.replace(tmp, path)
