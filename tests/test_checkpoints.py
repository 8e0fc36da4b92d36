"""Model import paths (GGUF with the q/k permutation, HF safetensors) and the Orbax round trip."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ssd_jax import checkpoints, model
from ssd_jax.config import tiny_config


def _params(cfg, seed=0):
  return jax.device_get(model.init_params(jax.random.key(seed), cfg, scale=0.2))


def _logits(params, cfg, tokens):
  return np.asarray(model.forward_full(jax.device_put(params), jnp.asarray(tokens), cfg))


def test_unpermute_inverts_permute():
  w = np.random.default_rng(0).normal(size=(4 * 8, 16)).astype(np.float32)
  np.testing.assert_array_equal(checkpoints.unpermute_qk(checkpoints.permute_qk(w, 4), 4), w)
  assert not np.array_equal(checkpoints.permute_qk(w, 4), w)


def write_tiny_gguf(path, cfg, params, extra_kv=None, extra_tensors=None):
  from gguf import GGUFWriter
  w = GGUFWriter(path, "llama")
  for k, v in (extra_kv or {}).items():
    (w.add_string if isinstance(v, str) else w.add_uint32)(k, v)
  for k, v in (extra_tensors or {}).items():
    w.add_tensor(k, v)
  w.add_name("tiny-test")
  w.add_block_count(cfg.n_layers)
  w.add_context_length(cfg.max_seq_len)
  w.add_embedding_length(cfg.d_model)
  w.add_feed_forward_length(cfg.ffn_dim)
  w.add_head_count(cfg.n_heads)
  w.add_head_count_kv(cfg.n_kv_heads)
  w.add_rope_freq_base(cfg.rope_theta)
  w.add_layer_norm_rms_eps(cfg.rms_eps)
  w.add_rope_dimension_count(cfg.head_dim)
  w.add_vocab_size(cfg.vocab_size)
  f = lambda a: np.ascontiguousarray(np.asarray(a, np.float32))
  w.add_tensor("token_embd.weight", f(params["embed"]))
  for i, lp in enumerate(params["layers"]):
    w.add_tensor(f"blk.{i}.attn_norm.weight", f(lp["attn_norm"]))
    # llama.cpp stores q/k rows permuted; the loader must undo it.
    w.add_tensor(f"blk.{i}.attn_q.weight", f(checkpoints.permute_qk(np.asarray(lp["wq"]).T, cfg.n_heads)))
    w.add_tensor(f"blk.{i}.attn_k.weight", f(checkpoints.permute_qk(np.asarray(lp["wk"]).T, cfg.n_kv_heads)))
    w.add_tensor(f"blk.{i}.attn_v.weight", f(np.asarray(lp["wv"]).T))
    w.add_tensor(f"blk.{i}.attn_output.weight", f(np.asarray(lp["wo"]).T))
    w.add_tensor(f"blk.{i}.ffn_norm.weight", f(lp["mlp_norm"]))
    w.add_tensor(f"blk.{i}.ffn_gate.weight", f(np.asarray(lp["w_gate"]).T))
    w.add_tensor(f"blk.{i}.ffn_up.weight", f(np.asarray(lp["w_up"]).T))
    w.add_tensor(f"blk.{i}.ffn_down.weight", f(np.asarray(lp["w_down"]).T))
  w.add_tensor("output_norm.weight", f(params["final_norm"]))
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()


def test_gguf_import_matches_source_model(tmp_path):
  cfg = tiny_config(n_heads=4, n_kv_heads=2)
  params = _params(cfg)
  path = str(tmp_path / "tiny.gguf")
  write_tiny_gguf(path, cfg, params)
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
    lp["wq"] = checkpoints.permute_qk(np.asarray(lp["wq"]).T, cfg.n_heads).T
  tokens = np.arange(8)[None] % cfg.vocab_size
  assert not np.allclose(_logits(bad, cfg, tokens), _logits(params, cfg, tokens), atol=1e-4)


def hf_tensors(cfg, params):
  """Returns a Hugging Face checkpoint's tensors ([out, in] matrices, `model.` prefix) of our params."""
  t = {"model.embed_tokens.weight": params["embed"], "model.norm.weight": params["final_norm"]}
  for i, lp in enumerate(params["layers"]):
    pre = f"model.layers.{i}."
    t[pre + "input_layernorm.weight"] = lp["attn_norm"]
    t[pre + "post_attention_layernorm.weight"] = lp["mlp_norm"]
    for ours, theirs in [("wq", "self_attn.q_proj"), ("wk", "self_attn.k_proj"), ("wv", "self_attn.v_proj"),
                         ("wo", "self_attn.o_proj"), ("w_gate", "mlp.gate_proj"), ("w_up", "mlp.up_proj"),
                         ("w_down", "mlp.down_proj")]:
      t[pre + theirs + ".weight"] = np.asarray(lp[ours]).T
    for ours, theirs in [("bq", "q_proj"), ("bk", "k_proj"), ("bv", "v_proj")]:
      if ours in lp:
        t[pre + "self_attn." + theirs + ".bias"] = lp[ours]
  if not cfg.tie_embeddings:
    t["lm_head.weight"] = np.asarray(params["lm_head"]).T
  return t


def write_hf_dir(path, cfg, params, extra_tensors=None, **config_overrides):
  """Writes a tiny Hugging Face directory (config.json + model.safetensors) for `cfg`; returns its path."""
  from safetensors.numpy import save_file
  t = {**hf_tensors(cfg, params), **(extra_tensors or {})}
  save_file({k: np.ascontiguousarray(v, np.float32) for k, v in t.items()}, str(path / "model.safetensors"))
  hf = {"model_type": "llama", "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads, "intermediate_size": cfg.ffn_dim,
        "vocab_size": cfg.vocab_size, "rms_norm_eps": cfg.rms_eps, "rope_theta": cfg.rope_theta,
        "tie_word_embeddings": cfg.tie_embeddings, "max_position_embeddings": cfg.max_seq_len, "hidden_act": "silu"}
  hf.update(config_overrides)
  (path / "config.json").write_text(json.dumps({k: v for k, v in hf.items() if v is not ...}))
  return str(path)


@pytest.mark.parametrize("tie,bias", [(True, False), (False, True)])
def test_hf_safetensors_import(tmp_path, tie, bias):
  cfg = tiny_config(tie_embeddings=tie, attn_bias=bias)
  params = _params(cfg)
  write_hf_dir(tmp_path, cfg, params, model_type="qwen2" if bias else "llama")
  hcfg, hparams, _ = checkpoints.load_model(str(tmp_path))
  assert hcfg.attn_bias == bias and hcfg.tie_embeddings == tie
  tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, size=(1, 7))
  np.testing.assert_allclose(_logits(hparams, hcfg, tokens), _logits(params, cfg, tokens), rtol=1e-5, atol=1e-5)


LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192}


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
    "untied without head": (dict(tie_word_embeddings=False), "without an lm_head"),
}


@pytest.mark.parametrize("case", sorted(REFUSED_CONFIGS))
def test_unimplemented_hf_config_is_refused(tmp_path, case):
  overrides, message = REFUSED_CONFIGS[case]
  cfg = tiny_config()
  path = write_hf_dir(tmp_path, cfg, _params(cfg), **overrides)
  with pytest.raises(checkpoints.CheckpointError, match="not implemented") as e:
    checkpoints.read_hf_safetensors(path, progress=False)
  assert message in str(e.value) and "\n" not in str(e.value)


def test_llama3_rope_scaling_is_refused_until_implemented(tmp_path):
  """The silent error of issue 41: a Llama 3.1 config loaded as plain RoPE. Refused until it is computed."""
  cfg = tiny_config(tie_embeddings=False)
  path = write_hf_dir(tmp_path, cfg, _params(cfg), rope_scaling=LLAMA3_SCALING)
  with pytest.raises(checkpoints.CheckpointError, match="rope_scaling type 'llama3' is not implemented"):
    checkpoints.read_hf_safetensors(path, progress=False)


@pytest.mark.parametrize("extra", ["o_proj bias", "q_norm", "unknown layer"])
def test_tensors_we_would_not_read_are_refused(tmp_path, extra):
  cfg = tiny_config()
  d, D = cfg.d_model, cfg.head_dim
  name, value = {"o_proj bias": ("model.layers.0.self_attn.o_proj.bias", np.zeros(d)),
                 "q_norm": ("model.layers.0.self_attn.q_norm.weight", np.ones(D)),
                 "unknown layer": ("model.layers.2.input_layernorm.weight", np.ones(d))}[extra]
  path = write_hf_dir(tmp_path, cfg, _params(cfg), extra_tensors={name: value})
  with pytest.raises(checkpoints.CheckpointError, match="not implemented"):
    checkpoints.read_hf_safetensors(path, progress=False)


def test_tied_config_with_a_different_head_is_refused(tmp_path):
  cfg = tiny_config(tie_embeddings=False)
  path = write_hf_dir(tmp_path, cfg, _params(cfg), tie_word_embeddings=True)
  with pytest.raises(checkpoints.CheckpointError, match="lm_head.weight differs"):
    checkpoints.read_hf_safetensors(path, progress=False)


def test_inert_fields_load(tmp_path):
  """Fields that do not change the math are accepted: rope type 'default', Qwen's switched-off sliding window, a
  transformers 5.x rope_parameters block (its rope_theta is the one used), Mistral's window (caps the context)."""
  cfg = tiny_config(rope_theta=500.0)
  params = _params(cfg)
  path = write_hf_dir(tmp_path, cfg, params, model_type="qwen2", use_sliding_window=False, sliding_window=4,
                      max_window_layers=1, rope_theta=..., rope_parameters={"rope_type": "default", "rope_theta": 500.0})
  hcfg, hparams = checkpoints.read_hf_safetensors(path, progress=False)
  assert hcfg.rope_theta == 500.0 and hcfg.max_seq_len == cfg.max_seq_len
  tokens = np.arange(9)[None] % cfg.vocab_size
  np.testing.assert_allclose(_logits(hparams, hcfg, tokens), _logits(params, cfg, tokens), rtol=1e-5, atol=1e-5)
  path = write_hf_dir(tmp_path, cfg, params, model_type="mistral", sliding_window=64, rope_scaling=None)
  assert checkpoints.read_hf_safetensors(path, progress=False)[0].max_seq_len == 64


def test_unimplemented_gguf_is_refused(tmp_path):
  cfg = tiny_config()
  params = _params(cfg)
  for kv, message in [({"llama.expert_count": 8}, "mixture of experts"),
                      ({"llama.rope.scaling.type": "yarn"}, "rope scaling type 'yarn'")]:
    path = str(tmp_path / "m.gguf")
    write_tiny_gguf(path, cfg, params, extra_kv=kv)
    with pytest.raises(checkpoints.CheckpointError, match=message):
      checkpoints.read_gguf(path, progress=False)
  write_tiny_gguf(path, cfg, params, extra_tensors={"rope_freqs.weight": np.ones(cfg.head_dim // 2, np.float32)})
  with pytest.raises(checkpoints.CheckpointError, match="rope_freqs.weight"):
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
