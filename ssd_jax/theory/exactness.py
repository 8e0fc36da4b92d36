"""What "greedy speculative decoding is exact" means, and the check of it, by precision and backend.

- float32 params on a CPU (the default there): bit for bit. Every product of up to ROWS_KERNEL_MAX rows goes through
  the few-row C++ kernel, whose row results do not depend on how many rows share the call, and so does RMSNorm's sum
  of squares (XLA's reduce changes order with the row count), so a verify row equals the AR row at every batch size
  and greedy SD/SSD emit AR's tokens exactly (tests/test_batch_exact.py, test_sd.py, test_ssd.py).
- 16-bit params, or any accelerator: teacher-forced, as the field defines it. XLA's products promise no batch
  invariance (a row's rounding depends on the tiling the row count picks) and 16-bit activations round at every
  layer, so a verify of K+1 rows and an AR step may round a near-tie either way. Exact then means: every emitted
  token is the argmax of the target's logits given the same prefix (one teacher-forced full forward over prompt plus
  emitted tokens), or within `tie_margin` of it. Sampled decoding keeps its statistical tests: the laws do not
  depend on rounding.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ..models import model
from ..models.config import ModelConfig

# Logit gap (max logit minus the emitted token's) below which two tokens count as tied, relative to the row's
# largest |logit|: bfloat16 keeps 8 significant bits (relative rounding 2^-9 per value) and a few roundings along
# the residual stream (norm outputs, attention, MLP, each layer) move a logit by a few such steps: 2^-7. float16 has
# 11 bits: 2^-9. On the tiny test models the largest gap seen was 0.06 of the bfloat16 margin (tests/test_exactness.py).
TIE_MARGIN_REL = {"float32": 2.0 ** -16, "bfloat16": 2.0 ** -7, "float16": 2.0 ** -9}


def tie_margin(logits_row: np.ndarray, dtype) -> float:
  """Returns the logit gap counted as a near-tie for a row of target logits computed with params of `dtype`."""
  return TIE_MARGIN_REL[np.dtype(dtype).name] * max(1.0, float(np.max(np.abs(logits_row))))


def teacher_forced_gaps(params, cfg: ModelConfig, prompt, emitted) -> tuple[np.ndarray, np.ndarray]:
  """Returns (gap, margin) [len(emitted)] each: the target's max logit minus the emitted token's logit given the same
  prefix, from one full forward over prompt + emitted, and the near-tie margin of that row."""
  if cfg.head_vocab is not None:
    raise ValueError("teacher-forced checks take a target with its full vocabulary (no head_vocab)")
  n = len(prompt)
  seq = jnp.asarray([list(prompt) + list(emitted)], jnp.int32)
  logits = np.asarray(model.forward_full(params, seq, cfg)[0], np.float32)[n - 1:n - 1 + len(emitted)]
  gap = logits.max(-1) - logits[np.arange(len(emitted)), np.asarray(emitted)]
  dtype = params["embed"].dtype
  return gap, np.asarray([tie_margin(row, dtype) for row in logits])


def check_teacher_forced(params, cfg: ModelConfig, prompt, emitted) -> None:
  """Raises AssertionError naming the first emitted token that is neither the target's argmax given its prefix nor
  within the near-tie margin of it."""
  gap, margin = teacher_forced_gaps(params, cfg, prompt, emitted)
  bad = np.flatnonzero(gap > margin)
  if bad.size:
    i = int(bad[0])
    raise AssertionError(f"token {i} ({emitted[i]}) is {gap[i]:.4g} below the target's argmax given its prefix "
                         f"(near-tie margin {margin[i]:.4g})")
