"""The decoder against an independent numpy reference; the KV cache against full forwards."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ssd_jax.models import model
from ssd_jax.models.config import RopeScaling, tiny_config
from ssd_jax.models.kv_cache import KVCache

import numpy_reference


def _params(cfg, seed=0):
  p = model.init_params(jax.random.key(seed), cfg, scale=0.2)
  # Non-trivial norms so a norm-weight bug shows up.
  p["final_norm"] = p["final_norm"] * 1.3
  for i, lp in enumerate(p["layers"]):
    lp["attn_norm"] = lp["attn_norm"] * 0.7
    if cfg.qk_norm:
      lp["q_norm"] = 1 + 0.3 * jax.random.normal(jax.random.key(100 + i), lp["q_norm"].shape)
      lp["k_norm"] = 1 - 0.3 * jax.random.normal(jax.random.key(200 + i), lp["k_norm"].shape)
  return p


@pytest.mark.parametrize("overrides", [
    {},
    {"tie_embeddings": False, "n_kv_heads": 1},
    {"attn_bias": True, "n_kv_heads": 4},
    {"head_vocab": 40, "vocab_size": 64},
    # Qwen3: per-head q/k norms, head_dim (16) not d_model / heads (8)
    {"qk_norm": True, "head_dim": 16, "tie_embeddings": False},
    # Llama 3: an original context of 64 puts head_dim 8's four wavelengths (6.3 .. 6283) in all three bands
    {"rope_scaling": RopeScaling("llama3", factor=8.0, original_max_position=64)},
    {"rope_scaling": RopeScaling("linear", factor=4.0)},
    {"rope_scaling": RopeScaling("divisors", divisors=(1.0, 2.0, 5.0, 40.0))},
])
def test_forward_matches_numpy_reference(overrides):
  cfg = tiny_config(**overrides)
  params = _params(cfg)
  if cfg.head_vocab is not None:  # a scrambled reduced vocabulary
    ids = np.sort(np.random.default_rng(0).choice(cfg.vocab_size, cfg.head_vocab, replace=False)).astype(np.int32)
    vm = np.zeros(cfg.vocab_size, np.int32)
    vm[ids] = np.arange(cfg.head_vocab)
    params["head_ids"], params["vocab_map"] = jnp.asarray(ids), jnp.asarray(vm)
  tokens = np.random.default_rng(1).integers(0, cfg.vocab_size, size=(2, 11))
  got = np.asarray(model.forward_full(params, jnp.asarray(tokens), cfg))
  for b in range(2):
    want = numpy_reference.forward(jax.device_get(params), tokens[b], cfg)
    np.testing.assert_allclose(got[b], want, rtol=2e-4, atol=2e-4)


def test_rope_positions_matter():
  """Changing relative positions changes the outputs (RoPE is relative: a uniform shift must not)."""
  cfg = tiny_config()
  params = _params(cfg)
  tok = jnp.asarray([[3, 5, 7]])
  cache = KVCache.init(cfg, 1, 16)
  slots = jnp.asarray([[0, 1, 2]])
  from ssd_jax.kernels import causal_mask_info
  a, _ = model.forward(params, tok, slots, cache, slots, causal_mask_info(slots), cfg)
  b, _ = model.forward(params, tok, slots * 3, cache, slots, causal_mask_info(slots), cfg)
  c, _ = model.forward(params, tok, slots + 5, cache, slots, causal_mask_info(slots), cfg)
  assert not np.allclose(np.asarray(a)[0, 1:], np.asarray(b)[0, 1:], atol=1e-5)
  np.testing.assert_allclose(np.asarray(a), np.asarray(c), rtol=1e-4, atol=1e-4)


def test_kv_cache_decode_equals_full_forward_ragged_batch():
  """Prefill ragged prompts, then feed tokens one at a time (and in a chunk of 3): logits equal a full forward."""
  from ssd_jax.decode.base import pad_prompts
  from ssd_jax.decode.steps import prefill
  cfg = tiny_config()
  params = _params(cfg, seed=3)
  rng = np.random.default_rng(0)
  seqs = [rng.integers(0, cfg.vocab_size, size=n).tolist() for n in (5, 9, 2)]
  conts = rng.integers(0, cfg.vocab_size, size=(3, 6))
  tokens, lengths = pad_prompts(seqs, bucket=16)
  cache = KVCache.init(cfg, 3, 64)
  last, cache = prefill(params, jnp.asarray(tokens), jnp.asarray(lengths), cache, cfg)
  step_logits = [np.asarray(last)]
  for t in range(3):  # one token at a time
    lg, cache = model.forward_causal(params, jnp.asarray(conts[:, t:t + 1]), cache, cfg)
    cache = cache.replace(lengths=cache.lengths + 1)
    step_logits.append(np.asarray(lg[:, 0]))
  lg, cache = model.forward_causal(params, jnp.asarray(conts[:, 3:6]), cache, cfg)  # a chunk, as verify does
  step_logits += [np.asarray(lg[:, i]) for i in range(3)]
  for b, s in enumerate(seqs):
    full = np.asarray(model.forward_full(params, jnp.asarray([s + conts[b].tolist()]), cfg))[0]
    for i in range(7):
      np.testing.assert_allclose(step_logits[i][b], full[len(s) - 1 + i], rtol=1e-4, atol=1e-4)


def test_rollback_is_a_length_update():
  """Writing tokens then lowering lengths gives the same next logits as never writing them."""
  cfg = tiny_config()
  params = _params(cfg, seed=4)
  base = jnp.asarray([[1, 2, 3, 4]])
  cache = KVCache.init(cfg, 1, 32)
  _, cache = model.forward_causal(params, base, cache, cfg)
  cache = cache.replace(lengths=jnp.asarray([4]))
  _, dirty = model.forward_causal(params, jnp.asarray([[9, 9, 9]]), cache, cfg)  # speculative tokens, rejected
  dirty = dirty.replace(lengths=jnp.asarray([4]))
  a, _ = model.forward_causal(params, jnp.asarray([[5]]), dirty, cfg)
  full = model.forward_full(params, jnp.asarray([[1, 2, 3, 4, 5]]), cfg)
  np.testing.assert_allclose(np.asarray(a)[0, 0], np.asarray(full)[0, 4], rtol=1e-4, atol=1e-4)


def test_check_params_reports_shape_mismatch():
  cfg = tiny_config()
  params = _params(cfg)
  params["layers"][0]["wq"] = params["layers"][0]["wq"][:, :-1]
  with pytest.raises(ValueError, match="wq"):
    model.check_params(params, cfg)


def test_rope_is_computed_once_a_forward_with_the_same_bits():
  """A CPU program computes RoPE's cos and sin once (not fused into every layer's q and k rotation, where XLA
  evaluated them per element), and the rotations equal the per-call apply_rope bit for bit."""
  import re
  from ssd_jax.kernels.platform import kernel_platform
  if kernel_platform(None) != "cpu":
    pytest.skip("the hoisting applies to programs for a CPU")
  cfg = tiny_config(n_layers=3)
  params = _params(cfg)
  tokens = jnp.asarray([[3, 5, 7, 9]])
  fwd = jax.jit(model.forward_causal, static_argnames=("cfg",))
  hlo = fwd.lower(params, tokens, KVCache.init(cfg, 1, 16), cfg=cfg).compile().as_text()
  assert len(re.findall(r" cosine\(", hlo)) <= 2, "cos is computed per layer (or per rotation), not once"
  pos = jnp.asarray([[0, 1, 300, 4097]])
  x = jax.random.normal(jax.random.key(3), (1, 4, 2, cfg.head_dim))
  inv = model.rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
  want = jax.jit(lambda x, p: model.apply_rope(x, p, inv))(x, pos)
  got = jax.jit(lambda x, p: model.rotate(x, model.rope_cos_sin(p, inv, "cpu")))(x, pos)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  open_form = jax.jit(lambda x, p: model.rotate(x, model.rope_cos_sin(p, inv, "tpu")))(x, pos)
  np.testing.assert_array_equal(np.asarray(open_form), np.asarray(want))
