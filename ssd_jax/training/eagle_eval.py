"""Teacher-forced statistics of an EAGLE draft on the target's own answers (what scripts/eval_draft.py reports).

For one prompt-and-answer text the target runs once (its features, and its distribution p at every position); the
draft then runs the training rollout over the whole text (eagle_train.rollout_logits), so that for every answer
token and every depth j the draft's prediction with target features up to j+1 positions before it is known. Greedy
rounds of SD and SSD are replayed from those predictions exactly (ssd_jax.theory.acceptance.replay_eagle_rounds).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from ..models import model
from ..models.eagle import EagleConfig
from ..models.kv_cache import KVCache
from .eagle_train import rollout_logits


@functools.partial(jax.jit, static_argnames=("tcfg", "dcfg", "depth", "top"))
def _text_stats(tparams, dparams, tokens, n_real, tcfg, dcfg: EagleConfig, depth: int, top: int):
  t = tokens.shape[1]
  logits, _, feats = model.forward_causal(tparams, tokens, KVCache.init(tcfg, 1, t), tcfg,
                                          feature_layers=dcfg.feature_layers)
  p = jax.nn.softmax(logits, -1)
  pos = jnp.arange(t, dtype=jnp.int32)[None]
  batch = {"tokens": tokens, "feats": feats.astype(jnp.float16), "pos": pos,
           "seg": (pos < n_real).astype(jnp.int32)}
  tops, overlap = [], []
  for _, lg in rollout_logits(dparams, batch, dcfg, depth):
    rows = jax.lax.top_k(lg, top)[1]
    tops.append(dparams["head_ids"][rows])
    q = model.scatter_to_vocab(dparams, jax.nn.softmax(lg, -1), dcfg)
    overlap.append(jnp.minimum(p, q).sum(-1))
  return jnp.stack(tops)[:, 0], jnp.stack(overlap)[:, 0], jnp.argmax(logits, -1)[0]


def answer_stats(tparams, tcfg, dparams, dcfg: EagleConfig, prompt_ids, answer, depth: int, top: int):
  """Returns (top [J, n, R] token ids, T=1 acceptance [J, n], target argmax [n]) for the n answer tokens."""
  ids = list(prompt_ids) + list(answer)
  pad = -(-len(ids) // 64) * 64
  toks = np.zeros((1, pad), np.int32)
  toks[0, : len(ids)] = ids
  tp, ov, am = (np.asarray(x) for x in _text_stats(tparams, dparams, jnp.asarray(toks), len(ids), tcfg, dcfg,
                                                    depth, top))
  sl = slice(len(prompt_ids) - 1, len(ids) - 1)  # positions that predict the answer tokens
  return tp[:, sl], ov[:, sl], am[sl]
