"""Static configuration objects.

`ModelConfig` is frozen and hashable so it can be passed to `jax.jit` as a static argument: changing it changes the
compiled program, everything else (weights, caches, lengths) is dynamic.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any


ROPE_SCALING_KINDS = ("llama3", "linear", "divisors")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
  """How RoPE's inverse frequencies are changed from theta's (model.rope_inv_freq computes them).

  llama3:   Llama 3.1+'s band-wise rule (factor, low/high_freq_factor, original_max_position).
  linear:   every frequency divided by `factor` (positions divided by it).
  divisors: each frequency divided by its own number, as a Llama 3 GGUF's `rope_freqs.weight` stores them.
  """

  kind: str
  factor: float = 1.0
  low_freq_factor: float = 1.0
  high_freq_factor: float = 4.0
  original_max_position: int = 8192
  divisors: tuple = ()  # [D/2] floats, kind "divisors" only

  def __post_init__(self):
    if self.kind not in ROPE_SCALING_KINDS:
      raise ValueError(f"rope scaling kind {self.kind!r} is not one of {ROPE_SCALING_KINDS}")
    # JSON gives a list back; a tuple keeps the config hashable (it is a static jit argument).
    object.__setattr__(self, "divisors", tuple(float(x) for x in self.divisors))
    if self.kind == "llama3" and not self.high_freq_factor > self.low_freq_factor:
      raise ValueError(f"llama3 rope scaling needs high_freq_factor > low_freq_factor, got {self}")


def from_known_fields(cls, d: dict[str, Any]):
  """Returns the dataclass `cls` built from the dict `d`, refusing (one line) any key that is not one of its fields."""
  unknown = set(d) - {f.name for f in dataclasses.fields(cls)}
  if unknown:
    raise ValueError(f"unknown {cls.__name__} fields: {sorted(unknown)}")
  return cls(**d)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Shape of a Llama-architecture decoder: Llama 1-3.x, Mistral-style, Qwen2 (attention biases), Qwen3 (q/k norms),
  SmolLM2."""

  vocab_size: int
  d_model: int
  n_layers: int
  n_heads: int
  n_kv_heads: int
  head_dim: int
  ffn_dim: int
  rms_eps: float = 1e-5
  rope_theta: float = 10000.0
  tie_embeddings: bool = True
  attn_bias: bool = False  # Qwen2-style q/k/v projection biases
  qk_norm: bool = False  # Qwen3-style RMSNorm of each head's q and k over head_dim (weights q_norm/k_norm [D])
  rope_scaling: RopeScaling | None = None  # None: plain RoPE from rope_theta
  # A draft may know only a subset of the vocabulary: its embedding (and tied LM head) then has `head_vocab` rows, the
  # params carry `head_ids` [head_vocab] (token id of each row) and `vocab_map` [vocab_size] (row of each token id;
  # unknown tokens share row 0). Tokens outside the subset get draft probability 0, which keeps speculation exact.
  head_vocab: int | None = None
  # With head_vocab, full_embed keeps the input embedding's vocab_size rows (every token is read as itself) and
  # reduces only the untied lm_head to the head's rows: an off-the-shelf draft cut at load (ssd_jax/models/drafts.py).
  full_embed: bool = False
  max_seq_len: int = 8192
  name: str = "llama"

  def __post_init__(self):
    if isinstance(self.rope_scaling, dict):  # from JSON
      object.__setattr__(self, "rope_scaling", RopeScaling(**self.rope_scaling))
    if self.n_heads % self.n_kv_heads:
      raise ValueError(f"n_heads={self.n_heads} must be a multiple of n_kv_heads={self.n_kv_heads}")
    if self.head_dim % 2:
      raise ValueError(f"head_dim={self.head_dim} must be even for RoPE")
    s = self.rope_scaling
    if s is not None and s.kind == "divisors" and len(s.divisors) != self.head_dim // 2:
      raise ValueError(f"{len(s.divisors)} RoPE frequency divisors for head_dim={self.head_dim} (need head_dim / 2)")
    if self.head_vocab is not None and not 0 < self.head_vocab <= self.vocab_size:
      raise ValueError(f"head_vocab={self.head_vocab} must be in [1, vocab_size={self.vocab_size}]")
    if self.full_embed and (self.head_vocab is None or self.tie_embeddings):
      raise ValueError("full_embed needs a reduced head (head_vocab) in an untied lm_head")

  @property
  def embed_rows(self) -> int:
    return self.vocab_size if self.full_embed else self.out_vocab

  @property
  def out_vocab(self) -> int:
    """Number of logits the model returns per position."""
    return self.head_vocab if self.head_vocab is not None else self.vocab_size

  def to_json(self) -> str:
    return json.dumps(dataclasses.asdict(self), indent=1, sort_keys=True)

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> "ModelConfig":
    return from_known_fields(cls, d)

  @classmethod
  def from_json(cls, s: str) -> "ModelConfig":
    return cls.from_dict(json.loads(s))


SMOLLM2_135M = ModelConfig(
    vocab_size=49152, d_model=576, n_layers=30, n_heads=9, n_kv_heads=3, head_dim=64, ffn_dim=1536,
    rms_eps=1e-5, rope_theta=100000.0, tie_embeddings=True, max_seq_len=8192, name="smollm2-135m-instruct")


def check_same_vocabulary(draft_cfg, target_cfg, where: str = "", error=ValueError) -> None:
  """Raises `error` (one line) unless the draft's vocabulary has the target's size: the one check of it, wherever a
  pair is put together (load, a Pipeline, the decoders, the placement plan). `where`: the draft's path, if known."""
  dv, tv = draft_cfg.vocab_size, target_cfg.vocab_size
  if dv != tv:
    raise error(f"draft{' ' + where if where else ''} has a vocabulary of {dv} tokens, the target {tv}; a draft must "
                f"share the target's tokenizer")


def tiny_config(vocab_size: int = 64, **overrides) -> ModelConfig:
  """A tiny model for tests: 2 layers, d_model 32, GQA 4/2."""
  base = dict(vocab_size=vocab_size, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, ffn_dim=48,
              rope_theta=10000.0, tie_embeddings=True, max_seq_len=512, name="tiny")
  base.update(overrides)
  return ModelConfig(**base)


def is_eagle(cfg) -> bool:
  """Whether a draft's config is an EAGLE-3 draft's (models/eagle.EagleConfig, which reads the target's features),
  the one place the draft kind is asked; any other config is a standalone model's."""
  return getattr(cfg, "kind", None) == "eagle"
