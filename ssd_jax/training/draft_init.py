"""Where a standalone draft starts: from the target's embedding, or from a trained draft grown deeper, wider or with a
larger head so that it computes what it computed before (training then moves the new parts)."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from ..models import model
from ..models.config import ModelConfig


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
