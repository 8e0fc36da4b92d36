"""An EAGLE-3 draft: one decoder layer that reads the target's own hidden states, as pure functions.

The present draft (model.py with a small config) reads tokens only and must learn the context itself. An EAGLE draft
starts from the target's representation of it: at position p it reads the token x_p (through the target's own
embedding) and a d-dim *feature* h_{p-1} that describes the text up to p-1, and predicts the token after x_p.

  feature of a verified position:  fuse(f) = f @ fc, f = the target's residual stream after three of its blocks
                                   (low, middle, high; `feature_layers`), concatenated [3 d] (model.forward returns
                                   them from the pass the target runs anyway);
  feature of a drafted position:   the draft's own output hidden state there (no target pass has seen it yet).

One layer: a = [rms(embed(x_p)) ; rms(h_{p-1})] (2 d), attention with RoPE and its own KV cache (q/k/v read the 2 d
input), h = h_{p-1} + attn(a) ; h_out = h + mlp(rms(h)); logits = head(rms(h_out)) over a reduced vocabulary
(`head_ids`; tokens outside get probability 0, which keeps speculation exact). h_out is the feature the next
position reads when no target feature exists for this one (self-conditioning: SSD pre-drafts before the target has
verified anything, so every position it drafts past the last verified one is self-conditioned).

Params (a dict pytree; `embed` and `head` are the target's, attached at load time, never saved with the draft):
  embed [V, d] (the target's), head [V_out, d] (the target's tied LM head rows of head_ids, frozen),
  fc [n_feat * d, d], layer {norm_e, norm_h [d], wq [2d, H*D], wk/wv [2d, G*D], wo [H*D, d], mlp_norm [d],
  w_gate/w_up [d, F], w_down [F, d]}, final_norm [d], head_ids [V_out], vocab_map [V].
Shapes: B batch, T new tokens, S cache slots, H/G query/kv heads, D head dim, V vocab, V_out head rows.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..kernels import MaskInfo, attention
from .config import from_known_fields
from .kv_cache import KVCache
from .model import apply_rope, dense, rms_norm, rope_inv_freq


@dataclasses.dataclass(frozen=True)
class EagleConfig:
  """Shape of an EAGLE draft (static, hashable: a jit static argument). d_model is the target's."""

  vocab_size: int
  d_model: int
  n_heads: int
  n_kv_heads: int
  head_dim: int
  ffn_dim: int
  feature_layers: tuple  # the target's blocks (0-based) whose outputs are fused, low to high
  head_vocab: int | None = None
  rms_eps: float = 1e-5
  rope_theta: float = 10000.0
  max_seq_len: int = 8192
  name: str = "eagle"
  kind: str = "eagle"

  def __post_init__(self):
    object.__setattr__(self, "feature_layers", tuple(int(i) for i in self.feature_layers))
    if self.n_heads % self.n_kv_heads:
      raise ValueError(f"n_heads={self.n_heads} must be a multiple of n_kv_heads={self.n_kv_heads}")
    if not self.feature_layers:
      raise ValueError("an EAGLE draft needs at least one target feature layer")
    if self.head_vocab is not None and not 0 < self.head_vocab <= self.vocab_size:
      raise ValueError(f"head_vocab={self.head_vocab} must be in [1, vocab_size={self.vocab_size}]")
    if self.kind != "eagle":
      raise ValueError(f"EagleConfig.kind must be 'eagle', got {self.kind!r}")

  n_layers = 1  # one decoder layer: the KV cache has one buffer (KVCache.init reads this)

  @property
  def out_vocab(self) -> int:
    return self.head_vocab if self.head_vocab is not None else self.vocab_size

  @property
  def feature_dim(self) -> int:
    """Width of the target features the draft fuses: len(feature_layers) * d_model."""
    return len(self.feature_layers) * self.d_model

  def to_json(self) -> str:
    return json.dumps(dataclasses.asdict(self), indent=1, sort_keys=True)

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> "EagleConfig":
    return from_known_fields(cls, d)


def default_feature_layers(n_layers: int) -> tuple:
  """Returns the (low, middle, high) target blocks to read: (1, L//2 - 1, L - 1), 0-based.

  EAGLE-3 reads the residual stream after blocks 2, L/2 and L-3 (counted from 1); here the high one is the target's
  last block (EAGLE-1's feature), whose output the target's own final norm and head turn into its next token: on
  SmolLM2-135M the head reads the stream after block 26 (0-based) as the target's token only 46% of the time.
  """
  if n_layers < 4:
    return tuple(range(n_layers))
  return tuple(sorted({1, n_layers // 2 - 1, n_layers - 1}))


def config_for_target(target_cfg, head_vocab: int | None, name: str = "eagle-draft", ffn_dim: int | None = None
                      ) -> EagleConfig:
  """Returns the EAGLE config that matches a target (its width, heads, RoPE and vocabulary)."""
  return EagleConfig(vocab_size=target_cfg.vocab_size, d_model=target_cfg.d_model, n_heads=target_cfg.n_heads,
                     n_kv_heads=target_cfg.n_kv_heads, head_dim=target_cfg.head_dim,
                     ffn_dim=ffn_dim or target_cfg.ffn_dim, feature_layers=default_feature_layers(target_cfg.n_layers),
                     head_vocab=head_vocab, rms_eps=target_cfg.rms_eps, rope_theta=target_cfg.rope_theta,
                     max_seq_len=target_cfg.max_seq_len, name=name)


def check_target(cfg: EagleConfig, target_cfg) -> None:
  """Raises ValueError when an EAGLE draft cannot read this target (width, feature layers, vocabulary)."""
  if cfg.d_model != target_cfg.d_model or cfg.vocab_size != target_cfg.vocab_size:
    raise ValueError(f"EAGLE draft {cfg.name!r} reads a target of width {cfg.d_model} and vocabulary "
                     f"{cfg.vocab_size}; this target has {target_cfg.d_model} and {target_cfg.vocab_size}")
  if max(cfg.feature_layers) >= target_cfg.n_layers:
    raise ValueError(f"EAGLE draft {cfg.name!r} reads target layers {cfg.feature_layers}; this target has "
                     f"{target_cfg.n_layers}")


# ---------------------------------------------------------------------------------------------------------- params

def init_params(key: jax.Array, cfg: EagleConfig, target_params: dict, head_ids: np.ndarray,
                scale: float = 0.02) -> dict:
  """Returns fresh EAGLE params (target parts attached): random fc and layer, the final norm started at the target's.

  The head is the target's own LM head (tied or not) restricted to `head_ids`, and stays frozen: the layer
  learns to land where the target's last residual stream would, which the target's head then reads. Frozen and
  derived from the target, it is never saved with the draft (a checkpoint holds fc, the layer and two tables).
  """
  d, H, G, D, F = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn_dim
  ks = jax.random.split(key, 8)
  n = lambda k, shape, s=scale: jax.random.normal(k, shape, jnp.float32) * s  # noqa: E731
  head_ids = np.asarray(head_ids, np.int32)
  if len(head_ids) != cfg.out_vocab:
    raise ValueError(f"{len(head_ids)} head ids for a head of {cfg.out_vocab} rows")
  vocab_map = np.zeros((cfg.vocab_size,), np.int32)
  vocab_map[head_ids] = np.arange(len(head_ids), dtype=np.int32)
  layer = {"norm_e": jnp.ones((d,)), "norm_h": jnp.ones((d,)), "mlp_norm": jnp.ones((d,)),
           "wq": n(ks[0], (2 * d, H * D)), "wk": n(ks[1], (2 * d, G * D)), "wv": n(ks[2], (2 * d, G * D)),
           # residual outputs start small: the layer begins near the identity on the fused feature
           "wo": n(ks[3], (H * D, d), scale / 4), "w_gate": n(ks[4], (d, F)), "w_up": n(ks[5], (d, F)),
           "w_down": n(ks[6], (F, d), scale / 4)}
  # fc starts as the identity on the highest feature layer (plus noise): the layer then starts from the target's
  # last residual stream at the position before (which the target's head reads as the token now fed) and learns the
  # step from there to this position's.
  fc = n(ks[7], (cfg.feature_dim, d), scale / np.sqrt(cfg.feature_dim)).at[cfg.feature_dim - d:].add(jnp.eye(d))
  own = {"fc": fc, "layer": layer,
         "final_norm": jnp.asarray(target_params["final_norm"], jnp.float32), "head_ids": jnp.asarray(head_ids),
         "vocab_map": jnp.asarray(vocab_map)}
  return attach_target(own, target_params)


TARGET_PARTS = ("embed", "head")  # taken from the target at load time, never saved with the draft
TABLES = ("head_ids", "vocab_map")  # integer token-id tables: data, not weights


def attach_target(params: dict, target_params: dict) -> dict:
  """Returns draft params with the target's parts attached: its token embedding [V, d] and the draft's head
  [V_out, d], the `head_ids` rows of the target's LM head (its embedding when tied, its lm_head [d, V] when not:
  Llama-3.1-70B and Qwen3-32B are untied)."""
  from .blocks import dequantize, is_block
  embed, ids = target_params["embed"], jnp.asarray(params["head_ids"])
  embed = dequantize(embed) if is_block(embed) else embed  # GGUF blocks: the draft reads float32 rows
  head = jnp.take(target_params["lm_head"], ids, axis=1).T if "lm_head" in target_params else jnp.take(embed, ids, 0)
  return dict(params, embed=embed, head=head)


def detach_target(params: dict) -> dict:
  """Returns the params a checkpoint stores: everything but the parts taken from the target."""
  return {k: v for k, v in params.items() if k not in TARGET_PARTS}


def split_trainable(params: dict) -> tuple[dict, dict]:
  """Returns (trained weights: fc, layer, final_norm; the rest: target parts and token tables)."""
  fixed = TARGET_PARTS + TABLES
  return {k: v for k, v in params.items() if k not in fixed}, {k: v for k, v in params.items() if k in fixed}


# --------------------------------------------------------------------------------------------------------- forward

def fuse(params: dict, features: jax.Array, eps: float = 1e-5, platform: str | None = None) -> jax.Array:
  """Returns the draft's input feature [..., d] from target features [..., n_feat * d].

  Each layer's feature is scaled to unit RMS first (no learned weight): the target's residual stream grows from
  ~5 to ~1,000 RMS between its low and high layers, with single values near 25,000 at a text's first token, and
  one linear map over such inputs trains badly.
  """
  f = features.astype(jnp.float32)
  d = params["fc"].shape[1]
  f = f.reshape(f.shape[:-1] + (-1, d))
  f = f * jax.lax.rsqrt(jnp.mean(f * f, axis=-1, keepdims=True) + eps)
  return dense(f.reshape(f.shape[:-2] + (-1,)), params["fc"], platform)


def layer_inputs(params: dict, tokens: jax.Array, h_prev: jax.Array, positions: jax.Array, cfg: EagleConfig,
                 platform: str | None = None):
  """Returns (q [B, T, H, D], k [B, T, G, D], v [B, T, G, D]) for tokens [B, T] that read features h_prev [B, T, d]."""
  b, t = tokens.shape
  lp = params["layer"]
  e = rms_norm(params["embed"][tokens], lp["norm_e"], cfg.rms_eps)
  a = jnp.concatenate([e, rms_norm(h_prev, lp["norm_h"], cfg.rms_eps)], axis=-1)
  inv_freq = rope_inv_freq(cfg.head_dim, cfg.rope_theta)
  q = apply_rope(dense(a, lp["wq"], platform).reshape(b, t, cfg.n_heads, cfg.head_dim), positions, inv_freq)
  k = apply_rope(dense(a, lp["wk"], platform).reshape(b, t, cfg.n_kv_heads, cfg.head_dim), positions, inv_freq)
  v = dense(a, lp["wv"], platform).reshape(b, t, cfg.n_kv_heads, cfg.head_dim)
  return q, k, v


def layer_outputs(params: dict, h_prev: jax.Array, attn_out: jax.Array, cfg: EagleConfig,
                  platform: str | None = None):
  """Returns (h_out [B, T, d], the normed hidden state the head reads [B, T, d]) from attention outputs
  [B, T, H, D]."""
  lp = params["layer"]
  b, t = attn_out.shape[:2]
  h = h_prev + dense(attn_out.reshape(b, t, cfg.n_heads * cfg.head_dim), lp["wo"], platform)
  m = rms_norm(h, lp["mlp_norm"], cfg.rms_eps)
  h = h + dense(jax.nn.silu(dense(m, lp["w_gate"], platform)) * dense(m, lp["w_up"], platform), lp["w_down"], platform)
  return h, rms_norm(h, params["final_norm"], cfg.rms_eps)


def head_logits(params: dict, x: jax.Array, platform: str | None = None) -> jax.Array:
  """Returns logits [..., V_out] (float32) over the draft's head rows (an array [V_out, d], or its Q8_0 blocks:
  draft_weights.py)."""
  from . import blocks
  from .model import _rows, _use_block_kernel, _use_rows_kernel
  if blocks.is_block(params["head"]):
    return blocks.dot_rows(x, params["head"], _use_block_kernel(x, platform)).astype(jnp.float32)
  if _use_rows_kernel(x, params["head"], platform):
    return _rows(x, params["head"], transposed=True)
  return jnp.einsum("...d,vd->...v", x, params["head"]).astype(jnp.float32)


def forward(params: dict, tokens: jax.Array, h_prev: jax.Array, positions: jax.Array, cache: KVCache,
            write_slots: jax.Array, mask: MaskInfo, cfg: EagleConfig, logit_index=None, attn_impl: str = "auto",
            platform: str | None = None):
  """Returns (logits [B, T or R, V_out], h_out [B, T, d], cache) for tokens [B, T] reading features h_prev [B, T, d].

  positions / write_slots / mask as in model.forward (tree drafting uses the same MaskInfo); the cache has one
  layer; its lengths are not changed. logit_index: optional [B, R] positions whose logits are wanted. platform:
  what the program is compiled for (None: the default backend), which picks the kernels.
  """
  b, t = tokens.shape
  q, k, v = layer_inputs(params, tokens, h_prev, positions, cfg, platform)
  rows = jnp.arange(b)[:, None]
  kc = cache.k[0].at[rows, write_slots].set(k.astype(cache.k[0].dtype), mode="drop")
  vc = cache.v[0].at[rows, write_slots].set(v.astype(cache.v[0].dtype), mode="drop")
  o = attention(q, kc, vc, mask, impl=attn_impl, platform=platform)
  h, x = layer_outputs(params, h_prev, o, cfg, platform)
  if logit_index is not None:
    x = jnp.take_along_axis(x, logit_index[:, :, None], axis=1)
  return head_logits(params, x, platform), h, cache.replace(k=[kc], v=[vc])


def macs_per_token(cfg: EagleConfig, fused: bool = True) -> int:
  """Multiply-accumulates of one drafted token through the weights (fc included when `fused`: a verified position)."""
  d, hd = cfg.d_model, cfg.head_dim
  attn = 2 * d * hd * (cfg.n_heads + 2 * cfg.n_kv_heads) + cfg.n_heads * hd * d
  return attn + 3 * d * cfg.ffn_dim + d * cfg.out_vocab + (cfg.feature_dim * d if fused else 0)
