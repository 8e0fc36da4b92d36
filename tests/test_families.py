"""The paper's families against transformers' own numbers (issue 41, item 4), without torch at test time.

tests/fixtures/families/ is written by scripts/dev/make_family_fixtures.py (which can also check that it reproduces
them): tiny random Llama-3.1-, Llama-3.2-, Qwen2-, Qwen3- and Mistral-style models as Hugging Face directories, transformers'
float32 logits and greedy continuations for them, and its RoPE numbers at real sizes.
"""
import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ssd_jax.models import checkpoints, model, model_files
from ssd_jax.models.config import RopeScaling
from ssd_jax.decode.ar import ARDecoder
from ssd_jax.decode.options import DecodeOptions
from ssd_jax.kernels import causal_mask_info
from ssd_jax.models.kv_cache import KVCache
from model_writers import write_gguf

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "families")
FAMILIES = ["llama3_1", "llama3_2", "qwen2", "qwen3", "mistral"]
# float32 logits of the same weights through two implementations (different summation orders, sin/cos, and RoPE
# frequencies that differ from torch's pow in their last bits): observed up to 2.5e-6 (logits of size ~2-4).
ATOL = 2e-5
ARCH = {"llama3_1": "llama", "llama3_2": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "mistral": "llama"}


def _reference(family):
  return np.load(os.path.join(FIXTURES, family, "reference.npz"))


def _load(family, fmt, tmp_path):
  """Returns (cfg, params) of a fixture read from its HF directory or from a GGUF written from it."""
  cfg, params = model_files.read_hf_safetensors(os.path.join(FIXTURES, family), progress=False)
  # Readers keep the stored dtype (some fixtures are bfloat16); transformers' reference computed in float32.
  params = checkpoints.cast_params(params, "float32")
  if fmt == "hf":
    return cfg, params
  path = str(tmp_path / f"{family}.gguf")
  write_gguf(path, cfg, params, arch=ARCH[family])
  gcfg, gparams, _ = model_files.read_gguf(path, progress=False)
  return gcfg, gparams


def _logits_at(params, cfg, tokens, positions):
  """Returns logits [T, V] for one sequence whose tokens sit at RoPE `positions` (cache slots 0..T-1)."""
  t = len(tokens)
  cache = KVCache.init(cfg, 1, t)
  slots = jnp.arange(t, dtype=jnp.int32)[None]
  logits, _ = model.forward(jax.device_put(params), jnp.asarray(tokens, jnp.int32)[None],
                            jnp.asarray(positions, jnp.int32)[None], cache, slots, causal_mask_info(slots), cfg)
  return np.asarray(logits[0])


@pytest.mark.parametrize("fmt", ["hf", "gguf"])
@pytest.mark.parametrize("family", FAMILIES)
def test_logits_equal_transformers(tmp_path, family, fmt):
  ref = _reference(family)
  cfg, params = _load(family, fmt, tmp_path)
  near = _logits_at(params, cfg, ref["prompt"], np.arange(len(ref["prompt"])))
  far = _logits_at(params, cfg, ref["prompt"], ref["far_positions"])
  np.testing.assert_allclose(near, ref["logits"], rtol=0, atol=ATOL)
  np.testing.assert_allclose(far, ref["far_logits"], rtol=0, atol=ATOL)


@pytest.mark.parametrize("family", ["llama3_1", "llama3_2"])
def test_the_scaling_is_what_makes_llama3_match(tmp_path, family):
  """Without its rope_scaling, the same weights miss transformers' spread-position logits by far more than ATOL
  (the silent error of issue 41), so the test above has the power to catch it."""
  ref = _reference(family)
  cfg, params = _load(family, "hf", tmp_path)
  assert cfg.rope_scaling.kind == "llama3"
  plain = cfg.__class__(**{**cfg.__dict__, "rope_scaling": None})
  far = _logits_at(params, plain, ref["prompt"], ref["far_positions"])
  assert np.abs(far - ref["far_logits"]).max() > 100 * ATOL


@pytest.mark.parametrize("fmt", ["hf", "gguf"])
@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_continuation_equals_transformers(tmp_path, family, fmt):
  ref = _reference(family)
  cfg, params = _load(family, fmt, tmp_path)
  opts = DecodeOptions(max_new_tokens=len(ref["greedy"]), temperature=0.0, ignore_eos=True)
  out = ARDecoder(cfg, params).generate([ref["prompt"].tolist()], opts)[0]
  assert out.token_ids == ref["greedy"].tolist()


def test_fixture_configs_are_the_families_they_claim():
  cfgs = {f: model_files.read_hf_safetensors(os.path.join(FIXTURES, f), progress=False)[0] for f in FAMILIES}
  assert cfgs["llama3_1"].rope_scaling == RopeScaling("llama3", 8.0, 1.0, 4.0, 8192)
  assert not cfgs["llama3_1"].tie_embeddings and cfgs["llama3_2"].tie_embeddings
  assert cfgs["llama3_2"].rope_scaling.factor == 32.0
  assert cfgs["qwen2"].attn_bias and cfgs["qwen2"].n_kv_heads == 1
  q3 = cfgs["qwen3"]
  assert q3.qk_norm and q3.head_dim * q3.n_heads != q3.d_model and q3.n_kv_heads < q3.n_heads
  m = cfgs["mistral"]  # its window of 4096 caps the context we serve (full attention is exact up to there)
  assert m.max_seq_len == 4096 and m.head_dim * m.n_heads != m.d_model and m.rope_scaling is None


ROPE_CASES = ["llama3_1_8b", "llama3_2_1b", "head128_factor32", "qwen3"]


@pytest.fixture(scope="module")
def rope():
  return np.load(os.path.join(FIXTURES, "rope.npz"))


@pytest.mark.parametrize("case", ROPE_CASES)
def test_real_size_inverse_frequencies(rope, case):
  """At real head dims: our scaling of transformers' base frequencies is transformers' scaled frequencies bit for
  bit; our own base (float32 numpy pow, kept for SmolLM2) is within 2 ulps of torch's."""
  head_dim, theta, factor = rope[f"{case}/meta"]
  scaling = RopeScaling("llama3", factor=float(factor)) if factor else None
  if scaling is not None:
    np.testing.assert_array_equal(model.scale_inv_freq(rope[f"{case}/base_inv_freq"], scaling), rope[f"{case}/inv_freq"])
  ours = model.rope_inv_freq(int(head_dim), float(theta), scaling)
  np.testing.assert_array_max_ulp(ours, rope[f"{case}/inv_freq"], maxulp=2)


@pytest.mark.parametrize("case", ROPE_CASES)
def test_real_size_angles_past_8192_and_near_100k(rope, case):
  """Angles are one float32 product each, as transformers computes them: equal bit for bit from the same frequencies
  at positions up to 131071; cos of them within float32 evaluation error."""
  pos = jnp.asarray(rope["positions"], jnp.int32)[None]
  angles = np.asarray(model.rope_angles(pos, rope[f"{case}/inv_freq"]))[0]
  np.testing.assert_array_equal(angles, rope[f"{case}/angles"])
  np.testing.assert_allclose(np.cos(angles.astype(np.float64)), rope[f"{case}/cos"], rtol=0, atol=2e-6)
  np.testing.assert_allclose(np.asarray(jnp.cos(angles)), rope[f"{case}/cos"], rtol=0, atol=2e-6)


def test_a_gguf_with_rope_freqs_and_linear_scaling_applies_both(tmp_path):
  """A GGUF may carry per-frequency divisors (rope_freqs.weight) and linear scaling metadata; llama.cpp divides
  each frequency by both. The config read holds the divisors times the factor, and the logits are those of that
  scaling: not of the divisors alone, nor of the factor alone."""
  from ssd_jax.models.config import tiny_config
  cfg = tiny_config(vocab_size=64)
  params = jax.device_get(model.init_params(jax.random.key(5), cfg, scale=0.3))
  half = cfg.head_dim // 2
  div = np.linspace(1.0, 8.0, half).astype(np.float32)
  path = str(tmp_path / "both.gguf")
  write_gguf(path, cfg, params, extra_kv={"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 4},
             extra_tensors={"rope_freqs.weight": div})
  gcfg, gparams, _ = model_files.read_gguf(path, progress=False)
  assert gcfg.rope_scaling.kind == "divisors"
  np.testing.assert_allclose(gcfg.rope_scaling.divisors, 4 * div, rtol=1e-6)
  tokens, pos = list(range(1, 9)), list(range(100, 108))  # far positions: the frequencies show
  got = _logits_at(gparams, gcfg, tokens, pos)
  want = _logits_at(params, dataclasses.replace(cfg, rope_scaling=RopeScaling("divisors", divisors=tuple(4 * div))),
                    tokens, pos)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  for other in (RopeScaling("divisors", divisors=tuple(div)), RopeScaling("linear", factor=4.0)):
    assert np.abs(_logits_at(params, dataclasses.replace(cfg, rope_scaling=other), tokens, pos) - got).max() > 1e-3
