"""What a Hugging Face config.json or GGUF file says, as a ModelConfig, or one clear line why we cannot compute it.

A checkpoint whose config asks for math that model.py does not implement (a RoPE scaling type, sliding windows that
are switched on, experts, another activation, tensors we would not read) must never load: it would decode without
error and produce another model's tokens. Every such field is refused here, before any weight is read.
"""
from __future__ import annotations

from .config import ModelConfig, RopeScaling


class CheckpointError(RuntimeError):
  """A checkpoint is missing, unreadable, does not match its config, or asks for math we do not implement."""


HF_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
GGUF_ARCHS = ("llama", "qwen2", "qwen3")
# Keys that count experts in the MoE configs of transformers (Mixtral, Qwen2-MoE / Qwen3-MoE, DeepSeek).
_MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
_SILU = ("silu", "swish")
# Buffers some older checkpoints carry; recomputed from the config, so not weights we would be ignoring.
_IGNORABLE_SUFFIXES = ("rotary_emb.inv_freq",)


def _refuse(where: str, what: str):
  raise CheckpointError(f"{where}: {what} is not implemented; refusing to load a model we would compute wrongly")


def hf_rope(hf: dict, where: str) -> tuple[float, RopeScaling | None]:
  """Returns (rope_theta, scaling) from a transformers 4.x (`rope_theta`, `rope_scaling`) or 5.x (`rope_parameters`)
  config; refuses the scaling types we do not compute."""
  block = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
  kind = block.get("rope_type", block.get("type", "default"))
  if float(hf.get("partial_rotary_factor", block.get("partial_rotary_factor", 1.0))) != 1.0:
    _refuse(where, "partial rotary embeddings (partial_rotary_factor)")
  theta = float(block.get("rope_theta", hf.get("rope_theta", 10000.0)))
  try:
    if kind in ("default", None):
      return theta, None
    if kind == "linear":
      return theta, RopeScaling("linear", factor=float(block["factor"]))
    if kind == "llama3":
      return theta, RopeScaling("llama3", factor=float(block["factor"]),
                                low_freq_factor=float(block["low_freq_factor"]),
                                high_freq_factor=float(block["high_freq_factor"]),
                                original_max_position=int(block["original_max_position_embeddings"]))
  except (KeyError, TypeError, ValueError) as e:
    raise CheckpointError(f"{where}: rope_scaling {block} is incomplete or invalid ({type(e).__name__}: {e})") from e
  _refuse(where, f"rope_scaling type {kind!r} (implemented: default, linear, llama3)")


def _hf_context(hf: dict, where: str) -> int:
  """Returns the context we may serve: a Mistral-style sliding window is exact full attention up to its width."""
  ctx = int(hf.get("max_position_embeddings", 8192))
  if hf.get("use_sliding_window") is True:  # Qwen2/Qwen3's switch; its `sliding_window` is inert when false
    _refuse(where, "use_sliding_window: true (sliding-window attention)")
  layer_types = hf.get("layer_types") or []
  if any(t != "full_attention" for t in layer_types):
    _refuse(where, f"layer_types {sorted(set(layer_types))} (only full_attention is)")
  window = hf.get("sliding_window")
  if "use_sliding_window" not in hf and window:
    ctx = min(ctx, int(window))  # a query never reaches past the window when the context is no longer than it
  return ctx


def hf_model_config(hf: dict, names: set[str], name: str, where: str) -> ModelConfig:
  """Returns the ModelConfig of a Hugging Face config.json whose (prefix-stripped) tensor names are `names`."""
  model_type = hf.get("model_type")
  if model_type is not None and model_type not in HF_MODEL_TYPES:
    _refuse(where, f"model_type {model_type!r} (supported: {', '.join(HF_MODEL_TYPES)})")
  act = hf.get("hidden_act", hf.get("hidden_activation", "silu"))
  if act not in _SILU:
    _refuse(where, f"hidden_act {act!r} (only silu is)")
  moe = [k for k in _MOE_KEYS if (hf.get(k) or 0) > 0]
  if moe:
    _refuse(where, f"mixture of experts ({moe[0]}={hf[moe[0]]})")
  if hf.get("mlp_bias"):
    _refuse(where, "mlp_bias: true")
  if hf.get("attention_bias") and model_type != "qwen2":  # Llama/Qwen3 then bias o_proj too
    _refuse(where, "attention_bias: true (with an o_proj bias)")
  theta, scaling = hf_rope(hf, where)
  ctx = _hf_context(hf, where)
  has_head = "lm_head.weight" in names
  tie = hf.get("tie_word_embeddings")
  if tie is False and not has_head:
    _refuse(where, "tie_word_embeddings: false without an lm_head.weight (an untrained head)")
  n_heads, d = int(hf["num_attention_heads"]), int(hf["hidden_size"])
  cfg = _model_config(
      where, vocab_size=int(hf["vocab_size"]), d_model=d, n_layers=int(hf["num_hidden_layers"]), n_heads=n_heads,
      n_kv_heads=int(hf.get("num_key_value_heads") or n_heads), head_dim=int(hf.get("head_dim") or d // n_heads),
      ffn_dim=int(hf["intermediate_size"]), rms_eps=float(hf.get("rms_norm_eps", 1e-6)), rope_theta=theta,
      rope_scaling=scaling, tie_embeddings=bool(tie) if tie is not None else not has_head,
      # The model type fixes these as transformers' classes do; without one, the tensors tell.
      attn_bias=model_type == "qwen2" if model_type else "layers.0.self_attn.q_proj.bias" in names,
      qk_norm=model_type == "qwen3" if model_type else "layers.0.self_attn.q_norm.weight" in names,
      max_seq_len=ctx, name=name)
  # A tied model may still ship an lm_head copy; the reader checks that it equals the embedding.
  expected = hf_tensor_names(cfg) | ({"lm_head.weight"} if cfg.tie_embeddings and has_head else set())
  _check_names(names, expected, where)
  return cfg


def _model_config(where: str, **fields) -> ModelConfig:
  try:
    return ModelConfig(**fields)
  except ValueError as e:  # inconsistent numbers (heads, head_dim, divisors): the file's fault, said in one line
    raise CheckpointError(f"{where}: {e}") from e


def hf_tensor_names(cfg: ModelConfig) -> set[str]:
  """Returns the (prefix-stripped) tensor names a Hugging Face checkpoint of `cfg` holds."""
  names = {"embed_tokens.weight", "norm.weight"} | (set() if cfg.tie_embeddings else {"lm_head.weight"})
  for i in range(cfg.n_layers):
    pre = f"layers.{i}."
    names |= {pre + s + ".weight" for s in ("input_layernorm", "post_attention_layernorm", "self_attn.q_proj",
                                            "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                            "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")}
    if cfg.attn_bias:
      names |= {pre + f"self_attn.{p}_proj.bias" for p in "qkv"}
    if cfg.qk_norm:
      names |= {pre + "self_attn.q_norm.weight", pre + "self_attn.k_norm.weight"}
  return names


def _check_names(names: set[str], expected: set[str], where: str) -> None:
  """Refuses a checkpoint with tensors we would not read (they change the math) or without ones we need."""
  extra = sorted(n for n in names - expected if not n.endswith(_IGNORABLE_SUFFIXES))
  if extra:
    _refuse(where, f"tensors {extra[:3]}{' ...' if len(extra) > 3 else ''} (not part of the model we compute)")
  missing = sorted(expected - names)
  if missing:
    raise CheckpointError(f"{where}: missing tensors {missing[:3]}{' ...' if len(missing) > 3 else ''} that its "
                          f"config implies")


def gguf_model_config(meta: dict, shapes: dict[str, tuple], where: str, rope_freqs=None) -> ModelConfig:
  """Returns the ModelConfig of a GGUF file from its metadata, tensor shapes (numpy order, by name) and, when it
  has one, its `rope_freqs.weight` (per-frequency divisors, what a Llama 3 converter stores its scaling as)."""
  arch = meta.get("general.architecture")
  if arch not in GGUF_ARCHS:
    raise CheckpointError(f"{where}: architecture {arch!r} is not supported (only {', '.join(GGUF_ARCHS)})")
  a = lambda k, default=None: meta.get(f"{arch}.{k}", default)
  if int(a("expert_count", 0) or 0) > 0:
    _refuse(where, f"mixture of experts ({arch}.expert_count={a('expert_count')})")
  if a("attention.sliding_window"):
    _refuse(where, "sliding-window attention")
  n_heads, d = int(a("attention.head_count")), int(a("embedding_length"))
  head_dim = int(a("attention.key_length") or a("rope.dimension_count") or d // n_heads)
  if int(a("attention.value_length") or head_dim) != head_dim or int(a("rope.dimension_count") or head_dim) != head_dim:
    _refuse(where, "keys, values and RoPE of different widths")
  cfg = _model_config(
      where, vocab_size=int(a("vocab_size", 0)) or int(shapes["token_embd.weight"][0]), d_model=d,
      n_layers=int(a("block_count")), n_heads=n_heads, n_kv_heads=int(a("attention.head_count_kv", n_heads)),
      head_dim=head_dim, ffn_dim=int(a("feed_forward_length")), rms_eps=float(a("attention.layer_norm_rms_epsilon")),
      rope_theta=float(a("rope.freq_base", 10000.0)), rope_scaling=_gguf_rope_scaling(a, rope_freqs, where),
      tie_embeddings="output.weight" not in shapes, attn_bias=arch == "qwen2", qk_norm=arch == "qwen3",
      max_seq_len=int(a("context_length")), name=str(meta.get("general.name", "gguf")))
  _check_names(set(shapes), gguf_tensor_names(cfg) | ({"rope_freqs.weight"} if rope_freqs is not None else set()),
               where)
  return cfg


def _gguf_rope_scaling(a, rope_freqs, where: str) -> RopeScaling | None:
  """Returns the RoPE scaling a GGUF states: linear by its factor, per-frequency divisors, or both (llama.cpp
  applies both)."""
  kind = a("rope.scaling.type", "none")
  if kind not in ("none", "linear"):
    _refuse(where, f"rope scaling type {kind!r} (implemented: none, linear, rope_freqs.weight)")
  factor = float(a("rope.scaling.factor", 1.0) or 1.0) if kind == "linear" else 1.0
  if rope_freqs is None:
    return RopeScaling("linear", factor=factor) if factor != 1.0 else None
  return RopeScaling("divisors", divisors=tuple(float(x) * factor for x in rope_freqs.reshape(-1)))


def gguf_tensor_names(cfg: ModelConfig) -> set[str]:
  """Returns the tensor names a llama.cpp GGUF of `cfg` holds (rope_freqs.weight aside)."""
  names = {"token_embd.weight", "output_norm.weight"} | (set() if cfg.tie_embeddings else {"output.weight"})
  for i in range(cfg.n_layers):
    names |= {f"blk.{i}.{s}.weight" for s in ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm",
                                              "ffn_gate", "ffn_up", "ffn_down")}
    if cfg.attn_bias:
      names |= {f"blk.{i}.attn_{p}.bias" for p in "qkv"}
    if cfg.qk_norm:
      names |= {f"blk.{i}.attn_q_norm.weight", f"blk.{i}.attn_k_norm.weight"}
  return names
