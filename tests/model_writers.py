"""Writers of other projects' model files from our params, for the import tests: a Hugging Face directory
(config.json + safetensors, optionally sharded and 16-bit) and a llama.cpp GGUF (llama, qwen2, qwen3)."""
import json

import ml_dtypes
import numpy as np

from ssd_jax.models import model_files

HF_MODEL_TYPE = {(False, False): "llama", (True, False): "qwen2", (False, True): "qwen3"}


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
    for ours, theirs in [("bq", "q_proj.bias"), ("bk", "k_proj.bias"), ("bv", "v_proj.bias"),
                         ("q_norm", "q_norm.weight"), ("k_norm", "k_norm.weight")]:
      if ours in lp:
        t[pre + "self_attn." + theirs] = lp[ours]
  if not cfg.tie_embeddings:
    t["lm_head.weight"] = np.asarray(params["lm_head"]).T
  return t


def hf_config(cfg, **overrides):
  """Returns the config.json dict of `cfg` as transformers writes it (keys whose value is `...` are left out)."""
  hf = {"model_type": HF_MODEL_TYPE[(cfg.attn_bias, cfg.qk_norm)], "hidden_size": cfg.d_model,
        "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim, "intermediate_size": cfg.ffn_dim, "vocab_size": cfg.vocab_size,
        "rms_norm_eps": cfg.rms_eps, "rope_theta": cfg.rope_theta, "tie_word_embeddings": cfg.tie_embeddings,
        "max_position_embeddings": cfg.max_seq_len, "hidden_act": "silu"}
  s = cfg.rope_scaling
  if s is not None and s.kind == "llama3":
    hf["rope_scaling"] = {"rope_type": "llama3", "factor": s.factor, "low_freq_factor": s.low_freq_factor,
                          "high_freq_factor": s.high_freq_factor,
                          "original_max_position_embeddings": s.original_max_position}
  elif s is not None:
    hf["rope_scaling"] = {"rope_type": s.kind, "factor": s.factor}
  hf.update(overrides)
  return {k: v for k, v in hf.items() if v is not ...}


def save_safetensors(tensors, fn):
  """Writes a safetensors file by its specification (safetensors.numpy cannot write bfloat16)."""
  names = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(ml_dtypes.bfloat16): "BF16"}
  header, offset = {}, 0
  for k, v in tensors.items():
    header[k] = {"dtype": names[v.dtype], "shape": list(v.shape), "data_offsets": [offset, offset + v.nbytes]}
    offset += v.nbytes
  raw = json.dumps(header).encode()
  raw += b" " * (-len(raw) % 8)
  with open(fn, "wb") as f:
    f.write(len(raw).to_bytes(8, "little") + raw)
    for v in tensors.values():
      f.write(np.ascontiguousarray(v).tobytes())


def write_hf_dir(path, cfg, params, extra_tensors=None, dtype=np.float32, shards=1, **config_overrides):
  """Writes a tiny Hugging Face directory for `cfg` into `path` (a pathlib.Path); returns it as a string.

  shards > 1: the tensors are split over model-0000i-of-0000n.safetensors with a model.safetensors.index.json."""
  save_file = save_safetensors
  t = {**hf_tensors(cfg, params), **(extra_tensors or {})}
  t = {k: np.ascontiguousarray(np.asarray(v, np.float32).astype(dtype)) for k, v in t.items()}
  if shards == 1:
    save_file(t, str(path / "model.safetensors"))
  else:
    names = sorted(t)
    weight_map = {}
    for s in range(shards):
      fn = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
      part = names[s::shards]
      save_file({k: t[k] for k in part}, str(path / fn))
      weight_map.update({k: fn for k in part})
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
  (path / "config.json").write_text(json.dumps(hf_config(cfg, **config_overrides)))
  return str(path)


def llama3_divisors(cfg):
  """Returns the per-frequency divisors a Llama 3 GGUF stores in rope_freqs.weight (float64 arithmetic, as
  llama.cpp's converter computes them)."""
  s = cfg.rope_scaling
  inv = 1.0 / cfg.rope_theta ** (np.arange(0, cfg.head_dim, 2) / cfg.head_dim)
  out = []
  for f in inv:
    w = 2 * np.pi / f
    if w < s.original_max_position / s.high_freq_factor:
      out.append(1.0)
    elif w > s.original_max_position / s.low_freq_factor:
      out.append(s.factor)
    else:
      a = (s.original_max_position / w - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
      out.append(1 / ((1 - a) / s.factor + a))
  return np.asarray(out, np.float32)


def write_gguf(path, cfg, params, arch="llama", extra_kv=None, extra_tensors=None):
  """Writes a float32 GGUF of our params as llama.cpp's converter lays it out for `arch` (q/k rows permuted for
  llama only; Llama 3 scaling as rope_freqs.weight; linear scaling as metadata)."""
  from gguf import GGUFWriter
  w = GGUFWriter(path, arch)
  w.add_name("tiny-test")
  for k, v in (extra_kv or {}).items():
    (w.add_string if isinstance(v, str) else w.add_uint32)(k, v)
  w.add_block_count(cfg.n_layers)
  w.add_context_length(cfg.max_seq_len)
  w.add_embedding_length(cfg.d_model)
  w.add_feed_forward_length(cfg.ffn_dim)
  w.add_head_count(cfg.n_heads)
  w.add_head_count_kv(cfg.n_kv_heads)
  w.add_rope_freq_base(cfg.rope_theta)
  w.add_layer_norm_rms_eps(cfg.rms_eps)
  w.add_key_length(cfg.head_dim)
  w.add_value_length(cfg.head_dim)
  w.add_vocab_size(cfg.vocab_size)
  f = lambda a: np.ascontiguousarray(np.asarray(a, np.float32))  # noqa: E731
  s = cfg.rope_scaling
  if s is not None and s.kind == "linear":
    w.add_string(f"{arch}.rope.scaling.type", "linear")
    w.add_float32(f"{arch}.rope.scaling.factor", s.factor)
  elif s is not None:
    w.add_tensor("rope_freqs.weight", llama3_divisors(cfg) if s.kind == "llama3" else f(s.divisors))
  for k, v in (extra_tensors or {}).items():
    w.add_tensor(k, v)
  qk = (lambda m, heads: model_files.permute_qk(m, heads)) if arch == "llama" else (lambda m, heads: m)
  w.add_tensor("token_embd.weight", f(params["embed"]))
  for i, lp in enumerate(params["layers"]):
    b = f"blk.{i}."
    w.add_tensor(b + "attn_norm.weight", f(lp["attn_norm"]))
    w.add_tensor(b + "attn_q.weight", f(qk(np.asarray(lp["wq"]).T, cfg.n_heads)))
    w.add_tensor(b + "attn_k.weight", f(qk(np.asarray(lp["wk"]).T, cfg.n_kv_heads)))
    for ours, theirs in [("wv", "attn_v"), ("wo", "attn_output"), ("w_gate", "ffn_gate"), ("w_up", "ffn_up"),
                         ("w_down", "ffn_down")]:
      w.add_tensor(b + theirs + ".weight", f(np.asarray(lp[ours]).T))
    w.add_tensor(b + "ffn_norm.weight", f(lp["mlp_norm"]))
    for ours, theirs in [("bq", "attn_q.bias"), ("bk", "attn_k.bias"), ("bv", "attn_v.bias"),
                         ("q_norm", "attn_q_norm.weight"), ("k_norm", "attn_k_norm.weight")]:
      if ours in lp:
        w.add_tensor(b + theirs, f(lp[ours]))
  w.add_tensor("output_norm.weight", f(params["final_norm"]))
  if not cfg.tie_embeddings:
    w.add_tensor("output.weight", f(np.asarray(params["lm_head"]).T))
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
