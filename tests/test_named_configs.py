"""The paper's models by name (issue 41, item 6): published numbers, and buildable at any depth."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ssd_jax.models import model
from ssd_jax.models.named_configs import NAMED_CONFIGS, PAPER_PAIRS, named_config, param_count, random_model

# Parameter counts as their model cards and safetensors indexes state them: exact where the count is published to
# the weight, else (Qwen3-32B: "32.8B, 31.2B non-embedding") to the stated digits.
EXACT_COUNTS = {"llama-3.1-8b": 8_030_261_248, "llama-3.1-70b": 70_553_706_496, "llama-3.2-1b": 1_235_814_400,
                "qwen3-0.6b": 596_049_920}


@pytest.mark.parametrize("name", sorted(NAMED_CONFIGS))
def test_parameter_counts_match_the_published_ones(name):
  cfg = named_config(name)
  n = param_count(cfg)
  if name in EXACT_COUNTS:
    assert n == EXACT_COUNTS[name]
  else:
    embed = cfg.vocab_size * cfg.d_model * (1 if cfg.tie_embeddings else 2)
    assert round(n / 1e9, 1) == 32.8 and round((n - embed) / 1e9, 1) == 31.2


def test_pairs_share_a_vocabulary_and_the_named_shapes_hold():
  for target, draft in PAPER_PAIRS:
    assert named_config(target).vocab_size == named_config(draft).vocab_size
  q = named_config("Qwen3-0.6B-Instruct")  # names are case-insensitive, -Instruct optional
  assert q.qk_norm and q.head_dim * q.n_heads != q.d_model and q.tie_embeddings
  assert named_config("llama-3.2-1b").rope_scaling.factor == 32.0
  assert named_config("llama-3.1-70b", n_layers=2).n_layers == 2
  with pytest.raises(ValueError, match="no model named"):
    named_config("llama-4")


@pytest.mark.parametrize("name", sorted(NAMED_CONFIGS))
def test_full_width_forward_traces_at_depth_2(name):
  """At the real width and vocabulary, params and a forward check out abstractly (nothing allocated)."""
  cfg = named_config(name, n_layers=2)
  params = jax.eval_shape(lambda: model.init_params(jax.random.key(0), cfg))
  out = jax.eval_shape(lambda p, t: model.forward_full(p, t, cfg), params, jax.ShapeDtypeStruct((1, 5), jnp.int32))
  assert out.shape == (1, 5, cfg.vocab_size)


@pytest.mark.parametrize("name", sorted(NAMED_CONFIGS))
def test_forward_runs_at_depth_1_with_real_heads(name):
  """Real heads, head_dim, RoPE scaling and q/k norms; width, MLP and vocabulary shrunk only for memory."""
  cfg, params = random_model(name, n_layers=1, vocab_size=512, d_model=256, ffn_dim=512)
  full = NAMED_CONFIGS[name]
  assert (cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.rope_scaling, cfg.qk_norm) == (
      full.n_heads, full.n_kv_heads, full.head_dim, full.rope_scaling, full.qk_norm)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 512, (1, 6)), jnp.int32)
  logits = np.asarray(model.forward_full(params, tokens, cfg))
  assert logits.shape == (1, 6, 512) and np.isfinite(logits).all()
