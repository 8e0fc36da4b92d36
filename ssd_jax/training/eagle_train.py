"""Training the EAGLE draft with self-conditioned rollouts (EAGLE-3's training-time test), on cached target features.

Data (ssd_jax/training/features.py): per token x_p the target's features f_p; the label y_p is the next token
x_{p+1}, counted where that is an answer token (the target's own greedy choice there). The draft
at position p reads x_p and a feature of position p-1 and predicts y_p. A rollout of depth J trains, at every
position at once, the J situations a draft meets when it drafts j = 0..J-1 tokens past the last position whose target
features it has:

  step 0:  input feature at p = fuse(f_{p-1})                      (the target saw everything up to p-1)
  step j:  input feature at p = the draft's own output h^{j-1}_{p-1}  (positions p-j+1..p are self-conditioned)

Step j's query at p belongs to the chain anchored at a = p-j: it attends to step-0 keys at positions <= a (computed
from target features) and to the keys that steps 1..j computed at a+1..p (the chain's own self-conditioned
positions), exactly the cache the draft holds at inference. Positions count from each example's start (RoPE), examples
never attend to each other, and a step-j loss counts only where the anchor lies in the same example (p - j >= start).
SD drafts at depths 0..K-1 (target features up to the bonus token's predecessor); SSD pre-drafts before the verify
it follows has produced features, so its first token is at depth k+1 >= 1 and its last at up to 2K.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ..models import eagle
from ..models.config import is_eagle
from ..models.eagle import EagleConfig
from .eagle_data import Shard, choose_head, load_shards, make_batch, pack, split_in_memory, window_order


# ------------------------------------------------------------------------------------------------------------- loss

def _shift(x: jax.Array, n: int) -> jax.Array:
  """Returns x moved n places later along axis 1 (zeros in front): out[:, t] = x[:, t - n]."""
  if n == 0:
    return x
  pad = [(0, 0)] * x.ndim
  pad[1] = (n, 0)
  return jnp.pad(x, pad)[:, : x.shape[1]]


def rollout_attention(q, ks, vs, seg, j: int):
  """Returns attention outputs [B, T, H, D] of rollout step j.

  q [B, T, H, D]; ks / vs: the keys / values of steps 0..j, each [B, T, G, D]. Query t sees step-0 entries at
  s <= t - j of its own example, and step i's entry at t - j + i for i = 1..j (its chain's own positions).
  """
  b, t, h, d = q.shape
  g = ks[0].shape[2]
  qg = q.reshape(b, t, g, h // g, d).astype(jnp.float32) / np.sqrt(d)
  s0 = jnp.einsum("btgrd,bsgd->bgrts", qg, ks[0])
  idx = jnp.arange(t)
  vis = (idx[None, :] <= idx[:, None] - j)[None] & (seg[:, :, None] == seg[:, None, :])  # [B, T, S]
  s0 = jnp.where(vis[:, None, None], s0, -1e30)
  diag_k = [_shift(ks[i], j - i) for i in range(1, j + 1)]
  diag_v = [_shift(vs[i], j - i) for i in range(1, j + 1)]
  sd = [jnp.einsum("btgrd,btgd->bgrt", qg, k)[..., None] for k in diag_k]
  w = jax.nn.softmax(jnp.concatenate([s0] + sd, axis=-1), axis=-1)
  o = jnp.einsum("bgrts,bsgd->btgrd", w[..., :t], vs[0])
  for i, v in enumerate(diag_v):
    o = o + w[..., t + i].transpose(0, 3, 1, 2)[..., None] * v[:, :, :, None, :]
  return o.reshape(b, t, h, d)


def rollout_logits(params: dict, batch: dict, cfg: EagleConfig, depth: int):
  """Yields (j, logits [B, T, V_out]) for rollout steps j = 0..depth-1 (step j's logits at t: the draft's prediction
  of labels[t] with target features up to t-j-1 and its own outputs at t-j..t-1)."""
  seg, pos = batch["seg"], batch["pos"]
  fused = eagle.fuse(params, batch["feats"])
  same_prev = jnp.concatenate([jnp.zeros_like(seg[:, :1], bool), seg[:, 1:] == seg[:, :-1]], axis=1)
  h_in = jnp.where(same_prev[..., None], _shift(fused, 1), 0.0)
  ks, vs = [], []
  for j in range(depth):
    q, k, v = eagle.layer_inputs(params, batch["tokens"], h_in, pos, cfg)
    ks.append(k)
    vs.append(v)
    o = rollout_attention(q, ks, vs, seg, j)
    h_out, x = eagle.layer_outputs(params, h_in, o, cfg)
    yield j, eagle.head_logits(params, x)
    h_in = jnp.where(same_prev[..., None], _shift(h_out, 1), 0.0)  # the next step reads this step's outputs


def rollout_loss(params: dict, batch: dict, cfg: EagleConfig, depth: int, weights: tuple):
  """Returns (weighted mean cross-entropy over rollout steps, {"acc_j": agreement at step j, "ce_j": ...})."""
  total, wsum, metrics = 0.0, 0.0, {}
  for j, logits in rollout_logits(params, batch, cfg, depth):
    m = batch["loss"] * (batch["pos"] >= j)  # the chain's anchor t-j must lie in the same example
    logp = jax.nn.log_softmax(logits, -1)
    nll = -jnp.take_along_axis(logp, batch["labels"][..., None], -1)[..., 0]
    denom = jnp.maximum(m.sum(), 1.0)
    ce = (nll * m).sum() / denom
    metrics[f"ce_{j}"] = ce
    metrics[f"acc_{j}"] = ((jnp.argmax(logits, -1) == batch["labels"]) * m).sum() / denom
    total, wsum = total + weights[j] * ce, wsum + weights[j]
  return total / wsum, metrics


def make_optimizer(lr: float, min_lr: float, warmup: int, steps: int):
  sched = optax.warmup_cosine_decay_schedule(0.0, lr, warmup, max(steps, warmup + 1), min_lr)
  return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(sched, weight_decay=0.01))


def make_timed_optimizer():
  """AdamW at learning rate 1, for a run whose rate the host sets each step (timed_lr): updates scaled by the rate
  are exactly AdamW's at that rate, weight decay included."""
  return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1.0, weight_decay=0.01))


def timed_lr(lr: float, min_lr: float, warmup: int, steps: int, budget: float, step: int, elapsed: float) -> float:
  """The learning rate of a run with a time budget: linear warmup over `warmup` steps, then a cosine from lr to
  min_lr over whichever runs out first, the steps or the seconds, so a run cut short by its budget still decays."""
  frac = min(1.0, max(step / max(steps, 1), elapsed / budget))
  cos = min_lr + (lr - min_lr) * 0.5 * (1.0 + np.cos(np.pi * frac))
  return float(cos * min(1.0, (step + 1) / max(warmup, 1)))


def make_train_step(cfg: EagleConfig, opt, depth: int, weights: tuple):
  """Returns a jitted step(trained, opt_state, fixed, batch, scale) -> (trained, opt_state, metrics); `scale`
  multiplies the updates (1 with a scheduled optimizer; the learning rate with make_timed_optimizer)."""

  def step(trained, opt_state, fixed, batch, scale):
    (loss, met), grads = jax.value_and_grad(
        lambda w: rollout_loss({**w, **fixed}, batch, cfg, depth, weights), has_aux=True)(trained)
    updates, opt_state = opt.update(grads, opt_state, trained)
    updates = jax.tree.map(lambda u: u * scale, updates)
    return optax.apply_updates(trained, updates), opt_state, dict(met, loss=loss)

  return jax.jit(step, donate_argnums=(0, 1))


def make_eval_step(cfg: EagleConfig, depth: int):
  """Returns a jitted eval(params, batch) -> {acc_j, ce_j}: per-step agreement and cross-entropy on a batch."""
  weights = (1.0,) * depth
  return jax.jit(lambda params, batch: rollout_loss(params, batch, cfg, depth, weights)[1])


def evaluate(eval_step, params, batches, depth: int) -> dict:
  """Returns agreement and cross-entropy per rollout step over `batches`, weighted by the positions each counts."""
  sums = {f"{m}_{j}": [0.0, 0.0] for m in ("acc", "ce") for j in range(depth)}
  for batch in batches:
    met = jax.device_get(eval_step(params, batch))
    for j in range(depth):
      n = float((batch["loss"] * (batch["pos"] >= j)).sum())
      for m in ("acc", "ce"):
        sums[f"{m}_{j}"][0] += float(met[f"{m}_{j}"]) * n
        sums[f"{m}_{j}"][1] += n
  return {k: s / max(c, 1.0) for k, (s, c) in sums.items()}


# ------------------------------------------------------------------------------------------------------------- loop

@dataclasses.dataclass(frozen=True)
class EagleTrainConfig:
  seq_len: int = 512
  batch_size: int = 4
  steps: int = 2000
  depth: int = 5
  depth_weights: tuple = ()   # per rollout step; empty = 1 each
  lr: float = 1e-3
  min_lr: float = 1e-4
  warmup: int = 50
  seed: int = 0
  eval_every: int = 100
  eval_windows: int = 16
  save_every: int = 50
  log_every: int = 10
  time_budget: float | None = None  # seconds of training (the learning rate decays over them, timed_lr); past
  # them the run evaluates, exports and stops. A run with a budget resumes only with a budget (another optimizer).

  @property
  def weights(self) -> tuple:
    w = tuple(self.depth_weights) or (1.0,) * self.depth
    if len(w) != self.depth or min(w) < 0 or sum(w) <= 0:
      raise ValueError(f"depth weights {w} must be {self.depth} non-negative numbers with a positive sum")
    return w


def export(out: str, cfg: EagleConfig, params: dict, extra: dict) -> None:
  """Writes an EAGLE draft checkpoint (16-bit weights, without the target's parts) to `out`."""
  from ..models.checkpoints import save_checkpoint
  tmp = out.rstrip("/") + ".tmp"
  save_checkpoint(tmp, cfg, eagle.detach_target(params), extra=extra, storage_dtype="bfloat16")
  if os.path.exists(out):
    import shutil
    shutil.rmtree(out)
  os.replace(tmp, out)


def train(cfg: EagleConfig, params: dict, train_shards: list[Shard], eval_shards: list[Shard], tc: EagleTrainConfig,
          work_dir: str, out: str | None, extra: dict, log=print) -> dict:
  """Trains `params` (target parts attached) and returns the final held-out figures; resumes from `work_dir`.

  Every `save_every` steps the train state goes to work_dir (Orbax, two kept); every `eval_every` steps held-out
  agreement per rollout step is logged and, when its mean over steps is the best so far, the draft is exported to
  `out` with `extra` (plus the figures) as extra.json.
  """
  import orbax.checkpoint as ocp

  head_map = np.full((cfg.vocab_size,), -1, np.int64)
  head_map[np.asarray(params["head_ids"])] = np.arange(cfg.out_vocab)
  windows = pack(train_shards, tc.seq_len)
  if len(windows) < tc.batch_size:
    raise ValueError(f"{len(windows)} training windows are fewer than a batch of {tc.batch_size}")
  n_eval, eval_batches = _eval_batches(eval_shards, tc, head_map)
  trained, fixed = eagle.split_trainable(params)
  timed = tc.time_budget is not None
  opt = make_timed_optimizer() if timed else make_optimizer(tc.lr, tc.min_lr, tc.warmup, tc.steps)
  opt_state = opt.init(trained)
  step_fn = make_train_step(cfg, opt, tc.depth, tc.weights)
  eval_fn = make_eval_step(cfg, tc.depth)
  os.makedirs(work_dir, exist_ok=True)
  mngr = ocp.CheckpointManager(os.path.abspath(work_dir),
                               options=ocp.CheckpointManagerOptions(max_to_keep=2, create=True))
  start, trained, opt_state, best = _resume(mngr, work_dir, trained, opt_state, log)
  tokens_per_step = tc.batch_size * tc.seq_len
  log(f"training: {len(windows)} windows of {tc.seq_len} ({sum(e - s for w in windows for _, s, e in w):,} tokens), "
      f"{n_eval} held-out windows, depth {tc.depth}, {tc.steps} steps")
  t_last, recent = time.perf_counter(), []
  t_start = t_last
  for step in range(start, tc.steps):
    batch = make_batch(train_shards, [windows[i] for i in window_order(len(windows), tc.seed, step, tc.batch_size)],
                       tc.seq_len, head_map)
    scale = (timed_lr(tc.lr, tc.min_lr, tc.warmup, tc.steps, tc.time_budget, step, time.perf_counter() - t_start)
             if timed else 1.0)
    trained, opt_state, met = step_fn(trained, opt_state, fixed, batch, jnp.float32(scale))
    recent.append(met)
    done = step + 1
    last = done == tc.steps or (tc.time_budget is not None and time.perf_counter() - t_start > tc.time_budget)
    if last and done < tc.steps:
      log(f"time budget of {tc.time_budget:.0f} s spent: stopping at step {done}")
    if done % tc.log_every == 0 or last:
      _log_steps(log, recent, done, tc, time.perf_counter() - t_last)
      t_last, recent = time.perf_counter(), []
    if eval_batches and (done % tc.eval_every == 0 or last):
      res = evaluate(eval_fn, {**trained, **fixed}, eval_batches, tc.depth)
      accs = [res[f"acc_{j}"] for j in range(tc.depth)]
      mean = float(np.mean(accs))
      log(f"step {done}: held-out agreement by depth [{' '.join(f'{a:.3f}' for a in accs)}], mean {mean:.4f}"
          + (" (best)" if mean > best["mean_acc"] else ""))
      if mean > best["mean_acc"]:
        best = {"mean_acc": mean, "step": done, "held_out_agreement_by_depth": [round(a, 4) for a in accs]}
        if out:
          export(out, cfg, {**trained, **fixed}, dict(extra, **best, train_tokens=done * tokens_per_step))
        with open(os.path.join(work_dir, "best.json"), "w") as f:
          json.dump(best, f)
      t_last = time.perf_counter()
    if done % tc.save_every == 0 or last:
      mngr.save(done, args=ocp.args.StandardSave({"trained": trained, "opt": jax.tree.leaves(opt_state)}))
    if last:
      break
  mngr.wait_until_finished()
  return best


def _eval_batches(eval_shards: list[Shard], tc: EagleTrainConfig, head_map: np.ndarray) -> tuple[int, list[dict]]:
  """Returns (number of held-out windows, their batches): up to tc.eval_windows windows spread over the held-out
  shards' packing."""
  ev = pack(eval_shards, tc.seq_len) if eval_shards else []
  ev = [ev[i] for i in np.linspace(0, len(ev) - 1, min(tc.eval_windows, len(ev))).astype(int)] if ev else []
  return len(ev), [make_batch(eval_shards, ev[i:i + tc.batch_size], tc.seq_len, head_map)
                   for i in range(0, len(ev), tc.batch_size)]


def _resume(mngr, work_dir: str, trained, opt_state, log):
  """Returns (step, trained, opt_state, best figures) from work_dir's latest train state, or the given state at
  step 0 when there is none."""
  import orbax.checkpoint as ocp

  if mngr.latest_step() is None:
    return 0, trained, opt_state, {"mean_acc": -1.0}
  start, best = mngr.latest_step(), {"mean_acc": -1.0}
  abstract = {"trained": trained, "opt": jax.tree.leaves(opt_state)}
  got = mngr.restore(start, args=ocp.args.StandardRestore(jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract)))
  trained = jax.tree.map(jnp.asarray, got["trained"])
  opt_state = jax.tree.unflatten(jax.tree.structure(opt_state), [jnp.asarray(x) for x in got["opt"]])
  best_path = os.path.join(work_dir, "best.json")
  if os.path.exists(best_path):
    with open(best_path) as f:
      best = json.load(f)
  log(f"resumed at step {start}")
  return start, trained, opt_state, best


def _log_steps(log, recent: list, done: int, tc: EagleTrainConfig, seconds: float) -> None:
  """Logs the mean loss and train agreement by depth of the `recent` steps' metrics, and their speed."""
  met = jax.device_get(recent)
  dt = seconds / len(recent)
  accs = " ".join(f"{np.mean([m[f'acc_{j}'] for m in met]):.3f}" for j in range(tc.depth))
  log(f"step {done}/{tc.steps}: loss {np.mean([m['loss'] for m in met]):.3f}, train agreement by depth "
      f"[{accs}], {dt:.2f} s/step, {tc.batch_size * tc.seq_len / dt:.0f} tokens/s")


def main_from_args(args, corpora, tcfg, tparams, layers, log, in_memory=None) -> int:
  """scripts/train_eagle.py's training phase (on features.in_memory's shards when given, else on the cache)."""
  from ..models import checkpoints
  from ..models.eagle import config_for_target
  if in_memory is not None:
    train_shards, eval_shards = split_in_memory(in_memory, False), split_in_memory(in_memory, True)
  else:
    root = args.features_dir
    train_shards, eval_shards = load_shards(root, corpora, False), load_shards(root, corpora, True)
  if not train_shards:
    raise ValueError("no training shards: every shard of the corpora is held out, or no features are cached")
  tc = EagleTrainConfig(seq_len=args.seq_len, batch_size=args.batch_size, steps=args.steps, depth=args.depth,
                        depth_weights=tuple(float(x) for x in args.depth_weights.split(",")) if args.depth_weights
                        else (), lr=args.lr, min_lr=args.min_lr, warmup=args.warmup, seed=args.seed,
                        eval_every=args.eval_every, eval_windows=args.eval_windows, save_every=args.save_every,
                        time_budget=args.time_budget)
  tc.weights  # noqa: B018  (validates)
  os.makedirs(args.work_dir, exist_ok=True)
  head_path = os.path.join(args.work_dir, "head_ids.npy")
  if args.init_from:
    cfg, own = checkpoints.load_checkpoint(args.init_from, dtype="float32")  # float32 master weights
    if not is_eagle(cfg):
      raise ValueError(f"--init-from {args.init_from} is not an EAGLE draft")
    params = eagle.attach_target(own, tparams)
  else:
    if os.path.exists(head_path):
      head_ids = np.load(head_path)
    else:
      head_ids = choose_head(train_shards, tcfg.vocab_size, args.head_vocab)
      np.save(head_path, head_ids)
    cfg = config_for_target(tcfg, len(head_ids), name="eagle-smollm2", ffn_dim=args.ffn_dim)
    params = eagle.init_params(jax.random.key(args.seed), cfg, tparams, head_ids)
  extra = {"kind": "eagle", "target": args.target, "feature_layers": list(layers),
           "corpora": [os.path.basename(os.path.normpath(c)) for c in corpora],
           "train_config": dataclasses.asdict(tc), "init_from": args.init_from}
  best = train(cfg, params, train_shards, eval_shards, tc, args.work_dir, args.out, extra, log)
  log(f"done: best held-out mean agreement {best['mean_acc']:.4f} at step {best.get('step')}; exported to {args.out}")
  return 0
