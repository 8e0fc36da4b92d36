"""Export a model of this project as a Hugging Face Llama directory (config.json + model.safetensors), without torch.

The benchmark's peer (scripts/bench.py --peer hf) loads the exported draft with transformers as the assistant model
of its assisted generation. Weights are written in the Hugging Face layout: `[out, in]` matrices, rotate-half RoPE
(our layout already; the GGUF's q/k permutation is undone at import).

A draft with a reduced output vocabulary (cfg.head_vocab rows, params `head_ids` / `vocab_map`) is expanded to the
full vocabulary, untied:
  input side,  `embed_tokens` [V, d]: row t = embed[vocab_map[t]], the very vector our draft feeds for token t
               (tokens outside its vocabulary share row 0), so the hidden states are ours exactly;
  output side, `lm_head` [V, d]: a known token gets its own head row; every unknown token gets a copy of the head row
               of the *smallest* known token id (the fill token).
A Llama LM head has no bias, so an unknown token cannot get logit -inf; a copy gives it exactly the fill token's
logit, never more. When the fill token's logit is the maximum, the tie also holds unknown ids, but argmax returns
the first maximal index and the fill token's id is below every unknown id (`greedy_exact`, true when the draft knows
token 0, as the shipped draft does): greedy argmax is always among the draft's own tokens and equals ours. Sampling
from the exported draft differs from ours (each unknown token gets the fill token's probability); transformers'
speculative sampling stays exact for any draft distribution, only its acceptance changes.
"""
from __future__ import annotations

import json
import os

import numpy as np

from ..models.config import ModelConfig


def expanded_vocab(params: dict, cfg: ModelConfig) -> tuple[np.ndarray, np.ndarray, dict]:
  """Returns (embed_tokens [V, d], lm_head [V, d] or None when tied, info) over the full vocabulary."""
  embed = np.asarray(params["embed"], np.float32)
  if cfg.head_vocab is None:
    head = None if cfg.tie_embeddings else np.ascontiguousarray(np.asarray(params["lm_head"], np.float32).T)
    return embed, head, {"expanded": False, "greedy_exact": True}
  head_ids = np.asarray(params["head_ids"], np.int64)
  vocab_map = np.asarray(params["vocab_map"], np.int64)
  rows = embed if cfg.tie_embeddings else np.asarray(params["lm_head"], np.float32).T  # [V_out, d]
  fill_row = int(np.argmin(head_ids))
  fill_token = int(head_ids[fill_row])
  known = np.zeros(cfg.vocab_size, bool)
  known[head_ids] = True
  lm_head = np.repeat(rows[fill_row][None], cfg.vocab_size, axis=0)
  lm_head[head_ids] = rows
  unknown = np.flatnonzero(~known)
  info = {"expanded": True, "head_vocab": cfg.head_vocab, "fill_token": fill_token,
          "unknown_tokens": int(unknown.size),
          "greedy_exact": bool(unknown.size == 0 or fill_token < int(unknown.min()))}
  return embed[vocab_map], lm_head, info


def hf_config(cfg: ModelConfig, tied: bool, bos_id: int | None = None, eos_id: int | None = None) -> dict:
  """Returns the Hugging Face LlamaConfig dict of `cfg` (rope_theta in both the 4.x and the 5.x spelling).

  Raises ValueError for what this plain LlamaConfig would not say (its peer would compute another model): RoPE
  scaling, q/k norms, and q/k/v biases (Llama's attention_bias would bias o_proj too)."""
  unsaid = [f for f, on in (("rope_scaling", cfg.rope_scaling is not None), ("qk_norm", cfg.qk_norm),
                            ("attn_bias", cfg.attn_bias)) if on]
  if unsaid:
    raise ValueError(f"cannot export {cfg.name!r} as a plain Llama: {', '.join(unsaid)} not written by this exporter")
  return {
      "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": cfg.vocab_size,
      "hidden_size": cfg.d_model, "intermediate_size": cfg.ffn_dim, "num_hidden_layers": cfg.n_layers,
      "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim,
      "hidden_act": "silu", "max_position_embeddings": cfg.max_seq_len, "rms_norm_eps": cfg.rms_eps,
      "rope_theta": cfg.rope_theta, "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
      "tie_word_embeddings": tied, "attention_bias": False, "mlp_bias": False, "bos_token_id": bos_id,
      "eos_token_id": eos_id, "pad_token_id": eos_id, "torch_dtype": "float32", "dtype": "float32",
  }


def export_llama(params: dict, cfg: ModelConfig, out_dir: str, tokenizer=None, bos_id: int | None = None,
                 eos_id: int | None = None) -> dict:
  """Writes `out_dir`/{config.json, model.safetensors[, tokenizer.json], ssd_jax_export.json}; returns the info.

  Reduced-vocabulary drafts are expanded as the module docstring says; the info (also written to
  ssd_jax_export.json) records the choice and whether greedy decoding stays exact.
  """
  from safetensors.numpy import save_file

  embed, lm_head, info = expanded_vocab(params, cfg)
  f32 = lambda x: np.ascontiguousarray(np.asarray(x, np.float32))
  tensors = {"model.embed_tokens.weight": f32(embed), "model.norm.weight": f32(params["final_norm"])}
  if lm_head is not None:
    tensors["lm_head.weight"] = f32(lm_head)
  for i, lp in enumerate(params["layers"]):
    pre = f"model.layers.{i}."
    tensors.update({
        pre + "input_layernorm.weight": f32(lp["attn_norm"]),
        pre + "post_attention_layernorm.weight": f32(lp["mlp_norm"]),
        pre + "self_attn.q_proj.weight": f32(np.asarray(lp["wq"]).T),
        pre + "self_attn.k_proj.weight": f32(np.asarray(lp["wk"]).T),
        pre + "self_attn.v_proj.weight": f32(np.asarray(lp["wv"]).T),
        pre + "self_attn.o_proj.weight": f32(np.asarray(lp["wo"]).T),
        pre + "mlp.gate_proj.weight": f32(np.asarray(lp["w_gate"]).T),
        pre + "mlp.up_proj.weight": f32(np.asarray(lp["w_up"]).T),
        pre + "mlp.down_proj.weight": f32(np.asarray(lp["w_down"]).T)})
    if cfg.attn_bias:
      tensors.update({pre + "self_attn.q_proj.bias": f32(lp["bq"]), pre + "self_attn.k_proj.bias": f32(lp["bk"]),
                      pre + "self_attn.v_proj.bias": f32(lp["bv"])})
  os.makedirs(out_dir, exist_ok=True)
  save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
  with open(os.path.join(out_dir, "config.json"), "w") as f:
    json.dump(hf_config(cfg, lm_head is None, bos_id, eos_id), f, indent=1)
  if tokenizer is not None:
    tokenizer.save(os.path.join(out_dir, "tokenizer.json"))
  with open(os.path.join(out_dir, "ssd_jax_export.json"), "w") as f:
    json.dump({"source": cfg.name, **info}, f, indent=1)
  return info
