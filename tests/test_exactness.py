"""Exactness in 16 bits, teacher-forced (ssd_jax/theory/exactness.py): every token greedy AR, SD and SSD emit with
bfloat16 params is the target's argmax given the same prefix, or within the stated near-tie margin of it."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ssd_jax.models import checkpoints, model
from ssd_jax.theory import exactness
from ssd_jax.models.config import tiny_config
from ssd_jax.decode import ARDecoder, DecodeOptions, SDDecoder, SpecOptions, SSDDecoder

from pairs import PROMPTS, perturbed


@pytest.fixture(scope="module")
def bf16_pair():
  """A bfloat16 target over 259 tokens and a perturbed draft (partial acceptance: rollback runs)."""
  cfg = tiny_config(vocab_size=259)
  tp = checkpoints.cast_params(model.init_params(jax.random.key(7), cfg, scale=0.3), "bfloat16")
  return cfg, tp, perturbed(tp, 0.05, 1)


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


@pytest.fixture
def cache_dtypes(monkeypatch):
  """Records the dtype of every target KV cache the decoders build."""
  from ssd_jax.sharding import Placement
  seen, orig = [], Placement.target_cache

  def spy(self, *args):
    cache = orig(self, *args)
    seen.append({str(a.dtype) for a in cache.k + cache.v})
    return cache
  monkeypatch.setattr(Placement, "target_cache", spy)
  return seen


def test_bf16_kv_cache_under_f32_params_is_what_was_asked_and_greedy_sd_ssd_equal_ar(cache_dtypes):
  """(bfloat16 params with their own bfloat16 cache: test_bf16_greedy_tokens_are_teacher_forced_argmax.)"""
  from ssd_jax import api
  pipe = api.load_tiny(kv_dtype="bfloat16")
  pipe.ssd_placement = "devices"  # the draft on its own device of this process (no child process to start)
  ids = [pipe.encode_prompt(p, chat=False) for p in ("The cat sat on the", "Once upon a time")]
  out = {m: [r.token_ids for r in pipe.generate_ids(ids, mode=m, k=3, max_new_tokens=16, ignore_eos=True)]
         for m in ("ar", "sd", "ssd")}
  assert cache_dtypes and all(s == {"bfloat16"} for s in cache_dtypes)
  assert out["sd"] == out["ar"] and out["ssd"] == out["ar"]
  for p, t in zip(ids, out["ar"]):
    exactness.check_teacher_forced(pipe.target.params, pipe.target.cfg, p, t)


def test_kv_cache_follows_the_params_unless_set(cache_dtypes):
  from ssd_jax import api
  from ssd_jax.models.kv_cache import cache_dtype
  pipe = api.load_tiny(dtype="bfloat16")
  pipe.generate_ids([[1, 2, 3]], mode="ar", max_new_tokens=2)
  assert cache_dtypes == [{"bfloat16"}]
  assert cache_dtype(pipe.target.params, "float32") == np.float32
  with pytest.raises(ValueError, match="KV cache dtype"):
    api.load_tiny(kv_dtype="int4")
