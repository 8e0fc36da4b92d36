"""Exactness in 16 bits, teacher-forced (ssd_jax/exactness.py): every token greedy AR, SD and SSD emit with bfloat16
params is the target's argmax given the same prefix, or within the stated near-tie margin of it."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ssd_jax import checkpoints, exactness, model
from ssd_jax.config import tiny_config
from ssd_jax.decode import ARDecoder, DecodeOptions, SDDecoder, SpecOptions, SSDDecoder

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11], [12, 13, 14, 15, 16]]


@pytest.fixture(scope="module")
def bf16_pair():
  """A bfloat16 target over 259 tokens and a perturbed draft (partial acceptance: rollback runs)."""
  cfg = tiny_config(vocab_size=259)
  tp = checkpoints.cast_params(model.init_params(jax.random.key(7), cfg, scale=0.3), "bfloat16")
  noise = lambda x, k: (x + 0.05 * jax.random.normal(k, x.shape, jnp.float32)).astype(x.dtype)  # noqa: E731
  leaves, tree = jax.tree.flatten(tp)
  dp = jax.tree.unflatten(tree, [noise(x, k) if x.dtype == jnp.bfloat16 else x
                                 for x, k in zip(leaves, jax.random.split(jax.random.key(1), len(leaves)))])
  return cfg, tp, dp


def test_params_and_caches_stay_bfloat16(bf16_pair):
  cfg, tp, _ = bf16_pair
  assert {x.dtype for x in jax.tree.leaves(tp)} == {jnp.dtype(jnp.bfloat16)}
  logits = model.forward_full(tp, jnp.asarray([PROMPTS[1]]), cfg)
  assert logits.dtype == jnp.float32  # the LM head keeps its float32 accumulator


@pytest.mark.parametrize("mode", ["ar", "sd", "ssd"])
def test_bf16_greedy_tokens_are_teacher_forced_argmax(bf16_pair, mode):
  cfg, tp, dp = bf16_pair
  opts = DecodeOptions(max_new_tokens=40, ignore_eos=True)
  dec = {"ar": lambda: ARDecoder(cfg, tp), "sd": lambda: SDDecoder(cfg, tp, cfg, dp, SpecOptions(k=4)),
         "ssd": lambda: SSDDecoder(cfg, tp, cfg, dp, SpecOptions(k=3, fan_out=2))}[mode]()
  res = dec.generate(PROMPTS, opts)
  for p, r in zip(PROMPTS, res):
    exactness.check_teacher_forced(tp, cfg, p, r.token_ids)
  if mode != "ar":
    assert 0 < np.mean([r.stats.extra["acceptance_rate"] for r in res]) < 1  # rejections happened


def test_teacher_forced_check_rejects_a_non_argmax_token(bf16_pair):
  cfg, tp, _ = bf16_pair
  ar = ARDecoder(cfg, tp).generate(PROMPTS[:1], DecodeOptions(max_new_tokens=8, ignore_eos=True))[0].token_ids
  logits = np.asarray(model.forward_full(tp, jnp.asarray([PROMPTS[0] + ar]), cfg)[0, len(PROMPTS[0]) - 1 + 3])
  wrong = list(ar[:3]) + [int(np.argsort(logits)[len(logits) // 2])]  # a median token at step 3
  with pytest.raises(AssertionError, match="token 3"):
    exactness.check_teacher_forced(tp, cfg, PROMPTS[0], wrong)


def test_margin_scales_with_precision():
  row = np.asarray([10.0, -3.0])
  assert exactness.tie_margin(row, jnp.bfloat16) == 10.0 * 2.0 ** -7
  assert exactness.tie_margin(row, jnp.float32) < exactness.tie_margin(row, jnp.float16) < 10.0 * 2.0 ** -7
