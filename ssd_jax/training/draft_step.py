"""The standalone draft's training step: the loss (hard labels, optionally mixed with KL to the target), the optimizer
and the jitted update. Token-id tables in the params (head_ids, vocab_map) ride along untrained."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax

from ..models import model
from ..models.config import ModelConfig


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


def teacher_probs(target_params, target_cfg: ModelConfig, head_ids, tokens):
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
      tp = teacher_probs(target_params, target_cfg, params["head_ids"] if cfg.head_vocab is not None else None,
                          batch["tokens"])
    weights, tables = split_tables(params)
    (loss, met), grads = jax.value_and_grad(
        lambda w: loss_fn({**w, **tables}, batch, cfg, tp, distill_weight), has_aux=True)(weights)
    updates, opt_state = opt.update(grads, opt_state, weights)
    weights = optax.apply_updates(weights, updates)
    return {**weights, **tables}, opt_state, dict(met, loss=loss)

  return jax.jit(step, donate_argnums=(0, 1))
