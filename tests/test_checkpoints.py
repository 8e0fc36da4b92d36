"""Model import paths (GGUF with the q/k permutation, HF safetensors) and the Orbax round trip."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ssd_jax.models import checkpoints, model, model_files
from ssd_jax.models.config import RopeScaling, tiny_config
from model_writers import write_gguf, write_hf_dir


def _params(cfg, seed=0):
  return jax.device_get(model.init_params(jax.random.key(seed), cfg, scale=0.2))


def _logits(params, cfg, tokens):
  return np.asarray(model.forward_full(jax.device_put(params), jnp.asarray(tokens), cfg))


def test_unpermute_inverts_permute():
  w = np.random.default_rng(0).normal(size=(4 * 8, 16)).astype(np.float32)
  np.testing.assert_array_equal(model_files.unpermute_qk(model_files.permute_qk(w, 4), 4), w)
  assert not np.array_equal(model_files.permute_qk(w, 4), w)


def test_gguf_import_matches_source_model(tmp_path):
  cfg = tiny_config(n_heads=4, n_kv_heads=2)
  params = _params(cfg)
  path = str(tmp_path / "tiny.gguf")
  write_gguf(path, cfg, params)
  gcfg, gparams, _ = checkpoints.read_gguf(path, progress=False)
  assert (gcfg.n_layers, gcfg.n_heads, gcfg.n_kv_heads, gcfg.tie_embeddings) == (2, 4, 2, True)
  tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, size=(2, 9))
  np.testing.assert_allclose(_logits(gparams, gcfg, tokens), _logits(params, cfg, tokens), rtol=1e-5, atol=1e-5)


def test_gguf_import_without_unpermute_would_differ(tmp_path):
  """The permutation matters: loading the permuted q/k as is changes the logits (so the test above can fail)."""
  cfg = tiny_config()
  params = _params(cfg)
  bad = jax.tree.map(lambda x: x, params)
  for lp in bad["layers"]:
    lp["wq"] = model_files.permute_qk(np.asarray(lp["wq"]).T, cfg.n_heads).T
  tokens = np.arange(8)[None] % cfg.vocab_size
  assert not np.allclose(_logits(bad, cfg, tokens), _logits(params, cfg, tokens), atol=1e-4)


@pytest.mark.parametrize("tie,bias", [(True, False), (False, True)])
def test_hf_safetensors_import(tmp_path, tie, bias):
  cfg = tiny_config(tie_embeddings=tie, attn_bias=bias)
  params = _params(cfg)
  write_hf_dir(tmp_path, cfg, params)
  hcfg, hparams, _ = checkpoints.load_model(str(tmp_path))
  assert hcfg.attn_bias == bias and hcfg.tie_embeddings == tie
  tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, size=(1, 7))
  np.testing.assert_allclose(_logits(hparams, hcfg, tokens), _logits(params, cfg, tokens), rtol=1e-5, atol=1e-5)


# Config fields that change the math and that we do not compute: each must be refused, never ignored.
REFUSED_CONFIGS = {
    "rope yarn": (dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}), "rope_scaling type 'yarn'"),
    "rope dynamic (4.x key)": (dict(rope_scaling={"type": "dynamic", "factor": 2.0}), "rope_scaling type 'dynamic'"),
    "rope longrope (5.x key)": (dict(rope_parameters={"rope_type": "longrope", "rope_theta": 1e4}), "'longrope'"),
    "partial rotary": (dict(partial_rotary_factor=0.5), "partial rotary"),
    "sliding window on": (dict(model_type="qwen2", use_sliding_window=True, sliding_window=16), "use_sliding_window"),
    "sliding layer types": (dict(layer_types=["full_attention", "sliding_attention"]), "layer_types"),
    "mixtral experts": (dict(num_local_experts=8, num_experts_per_tok=2), "mixture of experts"),
    "qwen moe experts": (dict(num_experts=4), "mixture of experts"),
    "gelu": (dict(hidden_act="gelu_pytorch_tanh"), "hidden_act 'gelu_pytorch_tanh'"),
    "mlp bias": (dict(mlp_bias=True), "mlp_bias"),
    "other model type": (dict(model_type="gemma2"), "model_type 'gemma2'"),
    "llama attention bias": (dict(attention_bias=True), "o_proj bias"),
    "untied without head": (dict(tie_word_embeddings=False), "without an lm_head"),
}


@pytest.mark.parametrize("case", sorted(REFUSED_CONFIGS))
def test_unimplemented_hf_config_is_refused(tmp_path, case):
  overrides, message = REFUSED_CONFIGS[case]
  cfg = tiny_config()
  path = write_hf_dir(tmp_path, cfg, _params(cfg), **overrides)
  with pytest.raises(checkpoints.CheckpointError, match="not implemented") as e:
    model_files.read_hf_safetensors(path, progress=False)
  assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("extra", ["o_proj bias", "q_norm", "unknown layer"])
def test_tensors_we_would_not_read_are_refused(tmp_path, extra):
  cfg = tiny_config()
  d, D = cfg.d_model, cfg.head_dim
  name, value = {"o_proj bias": ("model.layers.0.self_attn.o_proj.bias", np.zeros(d)),
                 "q_norm": ("model.layers.0.self_attn.q_norm.weight", np.ones(D)),
                 "unknown layer": ("model.layers.2.input_layernorm.weight", np.ones(d))}[extra]
  path = write_hf_dir(tmp_path, cfg, _params(cfg), extra_tensors={name: value})
  with pytest.raises(checkpoints.CheckpointError, match="not implemented"):
    model_files.read_hf_safetensors(path, progress=False)


def test_tied_config_with_a_different_head_is_refused(tmp_path):
  cfg = tiny_config(tie_embeddings=False)
  path = write_hf_dir(tmp_path, cfg, _params(cfg), tie_word_embeddings=True)
  with pytest.raises(checkpoints.CheckpointError, match="lm_head.weight differs"):
    model_files.read_hf_safetensors(path, progress=False)


def test_inert_fields_load(tmp_path):
  """Fields that do not change the math are accepted: rope type 'default', Qwen's switched-off sliding window, a
  transformers 5.x rope_parameters block (its rope_theta is the one used), Mistral's window (caps the context)."""
  cfg = tiny_config(rope_theta=500.0, attn_bias=True)
  params = _params(cfg)
  path = write_hf_dir(tmp_path, cfg, params, use_sliding_window=False, sliding_window=4,
                      max_window_layers=1, rope_theta=..., rope_parameters={"rope_type": "default", "rope_theta": 500.0})
  hcfg, hparams = model_files.read_hf_safetensors(path, progress=False)
  assert hcfg.rope_theta == 500.0 and hcfg.max_seq_len == cfg.max_seq_len
  tokens = np.arange(9)[None] % cfg.vocab_size
  np.testing.assert_allclose(_logits(hparams, hcfg, tokens), _logits(params, cfg, tokens), rtol=1e-5, atol=1e-5)
  cfg = tiny_config()
  path = write_hf_dir(tmp_path, cfg, _params(cfg), model_type="mistral", sliding_window=64, rope_scaling=None)
  assert model_files.read_hf_safetensors(path, progress=False)[0].max_seq_len == 64


def test_each_rope_source_alone_and_together():
  """RoPE's base and scaling come from a transformers 4.x config (rope_theta, rope_scaling with 'rope_type' or the
  older 'type') or a 5.x one (rope_parameters, the base inside it): each alone is read, none gives plain RoPE at
  10000, and where both are the 5.x block wins."""
  from ssd_jax.models.families import hf_rope
  linear = {"rope_type": "linear", "factor": 4.0}
  llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64, "rope_theta": 700.0}
  want3 = RopeScaling("llama3", 8.0, 1.0, 4.0, 64)
  for hf, want in (({}, (10000.0, None)), (dict(rope_theta=500.0), (500.0, None)),
                   (dict(rope_scaling=linear), (10000.0, RopeScaling("linear", factor=4.0))),
                   (dict(rope_scaling={"type": "linear", "factor": 2.0}), (10000.0, RopeScaling("linear", factor=2.0))),
                   (dict(rope_parameters={"rope_type": "default", "rope_theta": 700.0}), (700.0, None)),
                   (dict(rope_parameters=llama3), (700.0, want3)),
                   (dict(rope_theta=500.0, rope_scaling=linear, rope_parameters=llama3), (700.0, want3))):
    assert hf_rope(hf, "config.json") == want, hf


def test_each_gguf_head_width_source_alone():
  """A GGUF states a head's width as attention.key_length or rope.dimension_count, else it is the embedding over the
  heads: each alone is read (16 here, where 32 over 4 heads would be 8); its RoPE base is rope.freq_base, else 10000."""
  from ssd_jax.models.families import gguf_model_config, gguf_tensor_names
  cfg = tiny_config(head_dim=16)
  meta = {"general.architecture": "llama", "llama.block_count": 2, "llama.context_length": 512,
          "llama.embedding_length": 32, "llama.feed_forward_length": 48, "llama.attention.head_count": 4,
          "llama.attention.head_count_kv": 2, "llama.attention.layer_norm_rms_epsilon": 1e-5}
  shapes = dict.fromkeys(gguf_tensor_names(cfg), (1,)) | {"token_embd.weight": (64, 32)}
  for keys, width in (({"llama.attention.key_length": 16}, 16), ({"llama.rope.dimension_count": 16}, 16),
                      ({"llama.attention.key_length": 16, "llama.rope.dimension_count": 16}, 16), ({}, 8)):
    got = gguf_model_config(meta | keys, shapes, "m.gguf")
    assert (got.head_dim, got.rope_theta) == (width, 10000.0), keys
  assert gguf_model_config(meta | {"llama.rope.freq_base": 500.0}, shapes, "m.gguf").rope_theta == 500.0


def test_unimplemented_gguf_is_refused(tmp_path):
  cfg = tiny_config()
  params = _params(cfg)
  for kv, message in [({"llama.expert_count": 8}, "mixture of experts"),
                      ({"llama.rope.scaling.type": "yarn"}, "rope scaling type 'yarn'")]:
    path = str(tmp_path / "m.gguf")
    write_gguf(path, cfg, params, extra_kv=kv)
    with pytest.raises(checkpoints.CheckpointError, match=message):
      checkpoints.read_gguf(path, progress=False)
  write_gguf(path, cfg, params, extra_tensors={"blk.0.attn_output.bias": np.zeros(cfg.d_model, np.float32)})
  with pytest.raises(checkpoints.CheckpointError, match="attn_output.bias"):
    checkpoints.read_gguf(path, progress=False)
  write_gguf(path, cfg, params, extra_tensors={"rope_freqs.weight": np.ones(cfg.head_dim, np.float32)})
  with pytest.raises(checkpoints.CheckpointError, match="8 RoPE frequency divisors for head_dim=8"):
    checkpoints.read_gguf(path, progress=False)


def test_orbax_round_trip(tmp_path):
  cfg = tiny_config(head_vocab=48, vocab_size=64)
  params = _params(cfg)
  checkpoints.save_checkpoint(str(tmp_path / "ck"), cfg, params)
  lcfg, lparams = checkpoints.load_checkpoint(str(tmp_path / "ck"))
  assert lcfg == cfg
  assert isinstance(lparams["embed"], jax.Array)  # on the device, not host numpy
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(lparams)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_unreadable_checkpoint_is_a_clear_error(tmp_path):
  (tmp_path / "params").mkdir()
  (tmp_path / "config.json").write_text("{not json")
  with pytest.raises(checkpoints.CheckpointError, match="cannot read checkpoint"):
    checkpoints.load_checkpoint(str(tmp_path))
  with pytest.raises(checkpoints.CheckpointError, match="not an ssd-jax checkpoint"):
    checkpoints.load_checkpoint(str(tmp_path / "nowhere"))
  bad = tmp_path / "bad.gguf"
  bad.write_bytes(b"GGUF garbage")
  with pytest.raises(checkpoints.CheckpointError):
    checkpoints.read_gguf(str(bad), progress=False)


def _with_random_qk_norms(params, seed=3):
  rng = np.random.default_rng(seed)
  for lp in params["layers"]:
    for k in ("q_norm", "k_norm"):
      if k in lp:
        lp[k] = (1 + 0.3 * rng.normal(size=np.shape(lp[k]))).astype(np.float32)
  return params


# Each family's tiny shape; its HF directory (model_type from the shape) must load and compute our model exactly.
FAMILIES = {
    "llama3.1 (llama3 rope, untied)": dict(tie_embeddings=False,
                                            rope_scaling=RopeScaling("llama3", factor=8.0, original_max_position=64)),
    "llama linear rope": dict(rope_scaling=RopeScaling("linear", factor=4.0)),
    "qwen2 (biases)": dict(attn_bias=True, n_kv_heads=1),
    "qwen3 (q/k norms, head_dim 16 != 32/4)": dict(qk_norm=True, head_dim=16, tie_embeddings=False),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("dtype,shards", [("float32", 1), ("bfloat16", 2), ("float16", 3)])
def test_hf_families_load_sharded_and_16_bit(tmp_path, family, dtype, shards):
  import ml_dtypes
  cfg = tiny_config(**FAMILIES[family])
  params = _with_random_qk_norms(_params(cfg))
  dt = np.dtype(getattr(ml_dtypes, dtype, dtype))
  write_hf_dir(tmp_path, cfg, params, dtype=dt, shards=shards)
  (tmp_path / "consolidated.safetensors").write_bytes(b"not ours")  # Mistral repos ship one beside; not read
  hcfg, hparams = model_files.read_hf_safetensors(str(tmp_path), progress=False)
  assert hcfg == cfg.__class__(**{**cfg.__dict__, "name": hcfg.name})
  rounded = jax.tree.map(lambda x: np.asarray(x, np.float32).astype(dt).astype(np.float32), params)
  for a, b in zip(jax.tree.leaves(rounded), jax.tree.leaves(hparams)):
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_gguf_families_load(tmp_path, family):
  cfg = tiny_config(**FAMILIES[family])
  params = _with_random_qk_norms(_params(cfg))
  arch = "qwen2" if cfg.attn_bias else "qwen3" if cfg.qk_norm else "llama"
  path = str(tmp_path / "m.gguf")
  write_gguf(path, cfg, params, arch=arch)
  gcfg, gparams, _ = checkpoints.read_gguf(path, progress=False)
  assert (gcfg.attn_bias, gcfg.qk_norm, gcfg.head_dim) == (cfg.attn_bias, cfg.qk_norm, cfg.head_dim)
  if cfg.rope_scaling is not None and cfg.rope_scaling.kind == "llama3":
    assert gcfg.rope_scaling.kind == "divisors"  # what the file says: the converter's per-frequency divisors
  else:
    assert gcfg.rope_scaling == cfg.rope_scaling
  tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, size=(2, 9))
  np.testing.assert_allclose(_logits(gparams, gcfg, tokens), _logits(params, cfg, tokens), rtol=1e-5, atol=1e-5)


def test_llama3_scaling_changes_the_logits(tmp_path):
  """The silent error of issue 41 cannot come back: the scaled model's logits are not plain RoPE's."""
  cfg = tiny_config(**FAMILIES["llama3.1 (llama3 rope, untied)"])
  params = _params(cfg)
  hcfg, hparams = model_files.read_hf_safetensors(write_hf_dir(tmp_path, cfg, params), progress=False)
  plain = cfg.__class__(**{**cfg.__dict__, "rope_scaling": None})
  tokens = np.arange(12)[None] % cfg.vocab_size
  assert hcfg.rope_scaling == cfg.rope_scaling
  assert not np.allclose(_logits(hparams, hcfg, tokens), _logits(params, plain, tokens), atol=1e-4)


def test_incomplete_llama3_block_is_one_line(tmp_path):
  cfg = tiny_config()
  path = write_hf_dir(tmp_path, cfg, _params(cfg), rope_scaling={"rope_type": "llama3", "factor": 8.0})
  with pytest.raises(checkpoints.CheckpointError, match="incomplete or invalid"):
    model_files.read_hf_safetensors(path, progress=False)


def test_new_config_fields_survive_orbax(tmp_path):
  cfg = tiny_config(**FAMILIES["qwen3 (q/k norms, head_dim 16 != 32/4)"],
                    rope_scaling=RopeScaling("divisors", divisors=(1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0)))
  params = _with_random_qk_norms(_params(cfg))
  checkpoints.save_checkpoint(str(tmp_path / "ck"), cfg, params)
  lcfg, lparams = checkpoints.load_checkpoint(str(tmp_path / "ck"))
  assert lcfg == cfg and hash(lcfg) == hash(cfg)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(lparams)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_refusal_comes_before_reading_any_weight(tmp_path):
  """A 140 GB checkpoint we would refuse is refused from config.json and the headers alone: here its data is cut
  off, and the refusal, not the truncation, is what is reported."""
  cfg = tiny_config()
  path = write_hf_dir(tmp_path, cfg, _params(cfg), rope_scaling={"rope_type": "yarn", "factor": 4.0})
  st = tmp_path / "model.safetensors"
  st.write_bytes(st.read_bytes()[:-1000])
  with pytest.raises(checkpoints.CheckpointError, match="'yarn'"):
    model_files.read_hf_safetensors(path, progress=False)
  write_hf_dir(tmp_path, cfg, _params(cfg))
  st.write_bytes(st.read_bytes()[:-1000])
  with pytest.raises(checkpoints.CheckpointError, match="truncated or corrupt"):
    model_files.read_hf_safetensors(path, progress=False)
