"""The number that matters for speculation: **agreement with the target**, how often the draft's argmax equals the
target's argmax at the same position, on held-out windows. `scripts/eval_draft.py` measures it on the target's own
answers."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ..models import model
from ..models.config import ModelConfig


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
