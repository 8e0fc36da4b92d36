"""A verify row equals the AR row bit for bit at every batch size (float32, CPU): teacher-forced logits of AR steps
against one verify forward of the same tokens, identical and ragged prompts, batch 1 to 3.

Batch 1 was always exact; from batch 2 (8 or more rows of width 576) XLA:CPU's reduce in RMSNorm changed its
summation order with the row count (a YNNPACK fusion), and logits differed in the last bits. RMSNorm's sum of squares
now goes through the C++ kernel (rows_matmul.row_sum_squares), one fixed order per row.
"""
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ssd_jax.kernels import rows_matmul
from ssd_jax.models import checkpoints, model
from ssd_jax.models.config import tiny_config
from ssd_jax.models.families import CheckpointError
from ssd_jax.models.kv_cache import KVCache

pytestmark = pytest.mark.skipif(not rows_matmul.available(), reason="no C++ compiler for the CPU kernels")


def _ar_and_verify_logits(params, cfg, tokens, lengths, n):
  """Returns (AR logits, verify logits) [B, n, V] of the n tokens after each row's prompt (tokens [B, P + n], row b's
  prompt its first lengths[b] tokens, padded): after one prefill, n one-token steps against one n-token forward."""
  b, p = tokens.shape[0], tokens.shape[1] - n
  fwd = jax.jit(lambda params, t, c: model.forward_causal(params, t, c, cfg))
  lengths = np.asarray(lengths, np.int32)
  nxt = np.stack([tokens[i, lengths[i]:lengths[i] + n] for i in range(b)])
  cache = KVCache.init(cfg, b, 64)
  _, cache = fwd(params, jnp.asarray(tokens[:, :p]), cache)
  cache = cache.replace(lengths=jnp.asarray(lengths))  # slots past a row's length: padding, overwritten
  verify, _ = fwd(params, jnp.asarray(nxt), cache)
  ar = []
  for j in range(n):
    lg, cache = fwd(params, jnp.asarray(nxt[:, j:j + 1]), cache)
    cache = cache.replace(lengths=cache.lengths + 1)
    ar.append(np.asarray(lg))
  return np.concatenate(ar, axis=1), np.asarray(verify)


def _check(params, cfg, batch, ragged, n=4, seed=0):
  rng = np.random.default_rng(seed + batch)
  p = 9
  if ragged:
    tokens = rng.integers(0, cfg.vocab_size, (batch, p + n))
    lengths = [p - 3 * (i % 3) for i in range(batch)]
  else:
    tokens = np.repeat(rng.integers(0, cfg.vocab_size, (1, p + n)), batch, 0)
    lengths = [p] * batch
  ar, verify = _ar_and_verify_logits(params, cfg, tokens.astype(np.int32), lengths, n)
  diff = np.abs(ar - verify).max()
  assert np.array_equal(ar, verify), f"batch {batch}, ragged={ragged}: logits differ by up to {diff:.3g}"


@pytest.mark.parametrize("batch", [1, 2, 3])
@pytest.mark.parametrize("ragged", [False, True])
def test_verify_logits_equal_ar_logits_bit_for_bit(batch, ragged):
  """A tiny model as wide as SmolLM2 (d_model 576: the width at which XLA's reduce changed order by row count)."""
  cfg = tiny_config(vocab_size=256, d_model=576, ffn_dim=1152, n_heads=4, n_kv_heads=2, head_dim=16)
  params = model.init_params(jax.random.key(3), cfg, scale=0.05)
  _check(params, cfg, batch, ragged)


def test_real_target_verify_logits_equal_ar_logits_bit_for_bit():
  path = checkpoints.target_dir()
  if not os.path.isdir(path):
    pytest.skip("the SmolLM2 target checkpoint is not here")
  cfg, params = checkpoints.load_checkpoint(path, "float32")[:2]
  _check(params, cfg, 2, True)
  _check(params, cfg, 3, False)


def test_real_target_in_gguf_blocks_verify_logits_equal_ar_logits_bit_for_bit():
  """The same with the target's Q8_0/Q4_1 matrices kept in their blocks (the block kernel's path)."""
  try:
    checkpoints.locate_smollm2_gguf(fetch=False)
  except CheckpointError:
    pytest.skip("the SmolLM2 GGUF is not here")
  cfg, params, _ = checkpoints.load_model("smollm2-135m-instruct", keep_blocks=True)
  _check(params, cfg, 2, True)
