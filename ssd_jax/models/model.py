"""A Llama-architecture decoder as pure functions over a params pytree.

One code path serves the target and the draft. Params are a dict pytree (functional Flax style: no module state),
each parameter declared once in param_decls.py (shape, logical axes, initialiser); in short:

  embed       [V, d]            token embeddings (also the LM head when tied); [V_out, d] with a reduced vocabulary
                                (unless cfg.full_embed: then all V rows, and only the untied lm_head is reduced)
  layers      a list of L dicts: attn_norm [d], wq [d,H*D], wk/wv [d,G*D], wo [H*D,d],
                                (bq [H*D], bk/bv [G*D] with attention biases), (q_norm/k_norm [D] with
                                per-head q/k norms), mlp_norm [d],
                                w_gate/w_up [d,F], w_down [F,d]
              (a list, not arrays stacked over L: on XLA:CPU a scan over stacked weights measured 25-50% slower
              per step than the unrolled loop, and slicing a stacked array inside jit copies it)
  final_norm  [d]
  lm_head     [d, V_out]        only when untied
  head_ids    [V_out] int32     only with a reduced vocabulary: token id of each embedding/head row
  vocab_map   [V] int32         only with a reduced vocabulary: head row of each token id (unknown tokens -> row 0)

Shapes use: B batch, T new tokens, S cache slots, H query heads, G kv heads, D head dim, V vocab.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from .config import ModelConfig, RopeScaling
from ..kernels import MaskInfo, attention, causal_mask_info, rows_matmul
from ..kernels.platform import kernel_platform
from .kv_cache import KVCache
from . import blocks, param_decls, quant


# XLA:CPU sends a product with a few rows (2..~64) through a GEMM that packs the whole weight matrix first, costing
# 2-3x a one-row product although the weights come from memory either way; speculative verify (K+1 rows) then
# costs several AR steps and speculation loses its premise. On CPU, products with up to ROWS_KERNEL_MAX rows go
# through a small C++ kernel that streams each weight element once for all rows (ssd_jax/kernels/rows_matmul.py).
# One row takes it too: it measured 10-25% faster than XLA's matrix-vector product on the large matrices, and a row
# then gets bit for bit the same result in an AR step as in a verify. Programs compiled for an accelerator never
# take this path, whatever machine compiles them (`platform`, ssd_jax/kernels/platform.py).
# Above 12 rows the kernel works in tiles of 8 over cached chunks of the weights; up to 64 rows (a verify of batch 16
# at K=3) it measured at least as fast as XLA's product on SmolLM2's matrices (0.38x at 24 rows, 0.65x at 48, 1.0x
# at 64, noisy 2-core Xeon), and keeps AR and verify rows bit-identical at every batch size below that.
ROWS_KERNEL_MAX = 64


def _use_rows_kernel(x: jax.Array, w: jax.Array, platform: str | None) -> bool:
  lead = x.shape[:-1]
  m = int(np.prod(lead)) if lead else 1
  dtypes = (x.dtype == jnp.float32 and w.dtype == jnp.float32
            or w.dtype == jnp.bfloat16 and x.dtype in (jnp.float32, jnp.bfloat16))
  return 1 <= m <= ROWS_KERNEL_MAX and dtypes and kernel_platform(platform) == "cpu" and rows_matmul.available()


def _rows(x: jax.Array, w: jax.Array, transposed: bool = False) -> jax.Array:
  """The few-row kernel's float32 product: bfloat16 weights widen in its registers (exactly), bfloat16 activations
  before it (exactly); the sums are float32, as XLA's 16-bit product with a float32 accumulator has them."""
  return rows_matmul.rows_matmul(x.astype(jnp.float32), w, transposed)


def _use_block_kernel(x: jax.Array, platform: str | None) -> bool:
  lead = x.shape[:-1]
  m = int(np.prod(lead)) if lead else 1
  return (1 <= m <= ROWS_KERNEL_MAX and x.dtype == jnp.float32 and kernel_platform(platform) == "cpu"
          and rows_matmul.available())


def dense(x: jax.Array, w, platform: str | None = None) -> jax.Array:
  """Returns x @ w in x's dtype for x [..., K], w [K, N] (an array, an Int8Weight or GGUF blocks: blocks.py, whose
  1..ROWS_KERNEL_MAX float32 rows on CPU take the block kernel, else dequantize then a float32 product).

  1..ROWS_KERNEL_MAX rows on CPU with float32 weights and activations, or bfloat16 weights (activations float32 or
  bfloat16): the streaming kernel, summing in float32; float32 x float32 otherwise: XLA's product as before (SmolLM2's
  numbers unchanged); any other 16-bit operand: the product accumulates in float32 (preferred_element_type), as a
  16-bit accumulator would lose the low bits of long sums. platform: what the program is compiled for (None: the
  default backend; see kernels/platform.py).
  """
  if isinstance(w, quant.Int8Weight):
    return quant.int8_dense(x, w)
  if isinstance(w, blocks.BlockWeight):
    if not w.transposed:
      return (x.astype(jnp.float32) @ blocks.dequantize(w)).astype(x.dtype)
    return blocks.dot_rows(x, w, _use_block_kernel(x, platform))
  if _use_rows_kernel(x, w, platform):
    return _rows(x, w).astype(x.dtype)
  if x.dtype == jnp.float32 and w.dtype == jnp.float32:
    return x @ w
  return jnp.matmul(x, w, preferred_element_type=jnp.float32).astype(x.dtype)


def rms_norm(x: jax.Array, w: jax.Array, eps: float, platform: str | None = None) -> jax.Array:
  """Returns x / rms(x) * w, computed in float32. In a program for a CPU each row's sum of squares goes through the
  C++ kernel (rows_matmul.row_sum_squares: one fixed order whatever the row count, so a verify row is normed bit
  for bit as the AR row; XLA's reduce changes order with the row count); elsewhere XLA's reduce."""
  x32 = x.astype(jnp.float32)
  if kernel_platform(platform) == "cpu" and rows_matmul.available():
    ss = rows_matmul.row_sum_squares(x32)
  else:
    ss = jnp.sum(x32 * x32, axis=-1, keepdims=True)
  y = x32 * jax.lax.rsqrt(ss / x.shape[-1] + eps)
  return (y * w).astype(x.dtype)


@functools.lru_cache(maxsize=64)
def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None = None) -> np.ndarray:
  """Returns RoPE's inverse frequencies [D/2] (float32, read-only), computed once per config on the host.

  The base is float32 numpy, as before model families: SmolLM2 keeps its numbers bit for bit (transformers' torch
  pow differs from numpy's in the last bits of some frequencies; logits stay within float32 tolerance).
  """
  inv = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
  inv = scale_inv_freq(inv, scaling) if scaling is not None else inv
  inv.setflags(write=False)  # shared by the cache
  return inv


def scale_inv_freq(inv: np.ndarray, scaling: RopeScaling) -> np.ndarray:
  """Returns the inverse frequencies [D/2] float32 after `scaling`, repeating transformers' float32 operations in
  their order: given its base frequencies, the result is its own bit for bit."""
  inv = np.asarray(inv, np.float32)
  if scaling.kind == "linear":
    return inv / np.float32(scaling.factor)
  if scaling.kind == "divisors":
    return inv / np.asarray(scaling.divisors, np.float32)
  f, lo, hi, orig = scaling.factor, scaling.low_freq_factor, scaling.high_freq_factor, scaling.original_max_position
  wavelen = 2 * np.pi / inv
  scaled = np.where(wavelen > orig / lo, inv / np.float32(f), inv)  # long waves: frequency / factor
  smooth = (orig / wavelen - lo) / (hi - lo)
  smoothed = (1 - smooth) * scaled / np.float32(f) + smooth * scaled  # between the bands: interpolated
  medium = ~(wavelen < orig / hi) & ~(wavelen > orig / lo)
  return np.asarray(np.where(medium, smoothed, scaled), np.float32)


def rope_angles(positions: jax.Array, inv_freq: np.ndarray) -> jax.Array:
  """Returns RoPE's angles [B, T, D/2]: float32 positions times inverse frequencies, one float32 product each, as
  transformers computes them (no error grows with the position beyond that product's rounding)."""
  return positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq, jnp.float32)


def rope_cos_sin(positions: jax.Array, inv_freq: np.ndarray, platform: str | None = None
                 ) -> tuple[jax.Array, jax.Array]:
  """Returns RoPE's (cos, sin) [B, T, 1, D/2] at integer `positions` [B, T], to compute once a forward and share with
  every layer's q and k (`rotate`).

  In a program for a CPU they come out of a conditional whose two branches are the same computation: its results are
  buffers, which XLA cannot fuse into their readers. Computed in the open, XLA:CPU fused a copy of cos and sin into
  each of the 2 * n_layers rotations and called libm's sincosf once per element of q and k (~1.5% of a GGUF AR step on
  one core). A conditional on an accelerator waits for its predicate on the host, so other programs compute in the
  open. The values are the same either way: the same operations on the same angles."""
  ang = rope_angles(positions, inv_freq)

  def cos_sin(a):
    return jnp.cos(a), jnp.sin(a)

  if kernel_platform(platform) == "cpu":
    cos, sin = jax.lax.cond(jnp.all(positions >= 0), cos_sin, cos_sin, ang)
  else:
    cos, sin = cos_sin(ang)
  return cos[:, :, None, :], sin[:, :, None, :]


def rotate(x: jax.Array, cos_sin: tuple[jax.Array, jax.Array]) -> jax.Array:
  """Returns x [B, T, N, D] rotated by RoPE's (cos, sin) from rope_cos_sin (Hugging Face rotate-half layout)."""
  cos, sin = cos_sin
  d = x.shape[-1]
  x1, x2 = x[..., : d // 2].astype(jnp.float32), x[..., d // 2:].astype(jnp.float32)
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def apply_rope(x: jax.Array, positions: jax.Array, inv_freq: np.ndarray) -> jax.Array:
  """Returns x [B, T, N, D] rotated by RoPE at integer `positions` [B, T] (Hugging Face rotate-half layout), with
  inverse frequencies `inv_freq` [D/2] (rope_inv_freq)."""
  return rotate(x, rope_cos_sin(positions, inv_freq))


def init_params(key: jax.Array, cfg: ModelConfig, dtype=jnp.float32, scale: float = 0.02) -> dict:
  """Returns randomly initialised params for `cfg` (tests and draft training), as param_decls.py declares them."""
  key, k_embed, k_head = jax.random.split(key, 3)
  decls = param_decls.param_decls(cfg)
  top = {k: v for k, v in decls.items() if k != "layers"}
  params = {k: param_decls.init_param(dc, (k_embed, k_head), cfg, dtype, scale) for k, dc in top.items()}
  params["layers"] = [{k: param_decls.init_param(dc, jax.random.split(lk, 10), cfg, dtype, scale)
                       for k, dc in ld.items()}
                      for ld, lk in zip(decls["layers"], jax.random.split(key, cfg.n_layers))]
  return params


def check_params(params: dict, cfg: ModelConfig) -> None:
  """Raises ValueError with a readable message if `params` do not have the shapes `cfg` asks for."""
  expected = param_decls.abstract_params(cfg)
  exp_flat = {jax.tree_util.keystr(p): v.shape for p, v in jax.tree_util.tree_leaves_with_path(expected)}
  got_flat = {jax.tree_util.keystr(p): v.shape if blocks.is_block(v) else np.shape(v)
              for p, v in jax.tree_util.tree_leaves_with_path(params, is_leaf=blocks.is_block)}
  if set(exp_flat) != set(got_flat):
    raise ValueError(f"params keys differ from config {cfg.name!r}: missing {sorted(set(exp_flat) - set(got_flat))}, "
                     f"unexpected {sorted(set(got_flat) - set(exp_flat))}")
  bad = [f"{k}: {got_flat[k]} != {exp_flat[k]}" for k in exp_flat if tuple(got_flat[k]) != tuple(exp_flat[k])]
  if bad:
    raise ValueError(f"params shapes differ from config {cfg.name!r}: " + "; ".join(bad))


def _layer(x, lp, k_cache, v_cache, rope, write_slots, mask: MaskInfo, cfg: ModelConfig, attn_impl: str,
           platform: str | None):
  """One transformer block (rope: the forward's rope_cos_sin). Writes the new K/V into this layer's cache
  [B, S, G, D]; returns (x, k_cache, v_cache)."""
  b, t, _ = x.shape
  H, G, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
  h = rms_norm(x, lp["attn_norm"], cfg.rms_eps, platform)
  q, k, v = dense(h, lp["wq"], platform), dense(h, lp["wk"], platform), dense(h, lp["wv"], platform)
  if cfg.attn_bias:
    q, k, v = q + lp["bq"], k + lp["bk"], v + lp["bv"]
  q, k = q.reshape(b, t, H, D), k.reshape(b, t, G, D)
  if cfg.qk_norm:  # Qwen3: each head's q and k normalised over head_dim, before RoPE
    q, k = rms_norm(q, lp["q_norm"], cfg.rms_eps, platform), rms_norm(k, lp["k_norm"], cfg.rms_eps, platform)
  q, k = rotate(q, rope), rotate(k, rope)
  rows = jnp.arange(b)[:, None]
  # Out-of-range slots (padding) are dropped rather than clamped onto real entries.
  k_cache = k_cache.at[rows, write_slots].set(k.astype(k_cache.dtype), mode="drop")
  v_cache = v_cache.at[rows, write_slots].set(v.reshape(b, t, G, D).astype(v_cache.dtype), mode="drop")
  o = attention(q, k_cache, v_cache, mask, impl=attn_impl, platform=platform)
  x = x + dense(o.reshape(b, t, H * D), lp["wo"], platform)
  h = rms_norm(x, lp["mlp_norm"], cfg.rms_eps, platform)
  x = x + dense(jax.nn.silu(dense(h, lp["w_gate"], platform)) * dense(h, lp["w_up"], platform), lp["w_down"], platform)
  return x, k_cache, v_cache


def hidden_states(params, tokens, positions, cache: KVCache, write_slots, mask: MaskInfo, cfg: ModelConfig,
                  attn_impl: str = "auto", feature_layers: tuple = (), platform: str | None = None):
  """Returns (final-normed hidden states [B, T, d], cache with new K/V written; lengths unchanged, features).

  features: the residual stream after each block in `feature_layers` (0-based block indices, static), concatenated
  on the last axis, [B, T, len(feature_layers) * d] (logical axes `sharding.FEATURE_AXES`): what an EAGLE draft
  reads (ssd_jax/models/eagle.py). None when `feature_layers` is empty. Taking them costs no second pass.
  """
  if any(not 0 <= i < cfg.n_layers for i in feature_layers):
    raise ValueError(f"feature_layers {feature_layers} must lie in [0, {cfg.n_layers})")
  x = embed_lookup(params["embed"], embed_rows(params, tokens, cfg))
  ks, vs, taken = [], [], {}
  rope = rope_cos_sin(positions, rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling), platform)
  for i, (lp, kc, vc) in enumerate(zip(params["layers"], cache.k, cache.v)):
    x, kc, vc = _layer(x, lp, kc, vc, rope, write_slots, mask, cfg, attn_impl, platform)
    ks.append(kc)
    vs.append(vc)
    if i in feature_layers:
      taken[i] = x
  x = rms_norm(x, params["final_norm"], cfg.rms_eps, platform)
  feats = jnp.concatenate([taken[i] for i in feature_layers], axis=-1) if feature_layers else None
  return x, cache.replace(k=ks, v=vs), feats


def lm_head(params, x, cfg: ModelConfig, platform: str | None = None):
  """Returns logits [..., V_out] (float32) from final hidden states."""
  if cfg.tie_embeddings:
    if isinstance(params["embed"], blocks.BlockWeight):
      return blocks.dot_rows(x, params["embed"], _use_block_kernel(x, platform)).astype(jnp.float32)
    if _use_rows_kernel(x, params["embed"], platform):
      return _rows(x, params["embed"], transposed=True)
    if x.dtype == jnp.float32 and params["embed"].dtype == jnp.float32:
      return jnp.einsum("...d,vd->...v", x, params["embed"])
    return jnp.einsum("...d,vd->...v", x, params["embed"], preferred_element_type=jnp.float32)
  head = params["lm_head"]
  if x.dtype == jnp.float32 and head.dtype == jnp.float32:
    return dense(x, head, platform)
  if _use_rows_kernel(x, head, platform):  # bfloat16 weights: the float32 sums as they come from the kernel
    return _rows(x, head)
  # 16-bit: the logits keep the float32 accumulator (rounding them to 16 bits would make near-ties exact ties).
  return jnp.matmul(x, head, preferred_element_type=jnp.float32)


def forward(params, tokens, positions, cache: KVCache, write_slots, mask: MaskInfo, cfg: ModelConfig,
            logit_index=None, attn_impl: str = "auto", feature_layers: tuple = (), platform: str | None = None):
  """Returns (logits, cache), or (logits, cache, features) when `feature_layers` is not empty.

  tokens, positions, write_slots: [B, T] int32 (RoPE position and cache slot of each new token); mask describes what
  each query sees (ssd_jax/kernels/mask.py). logit_index: optional [B, R] indices into T; logits are then [B, R, V_out]
  (prefill only needs the last position of each row), else [B, T, V_out]. The cache's lengths are not changed: the
  caller commits tokens by advancing lengths. features: [B, T, len(feature_layers) * d], the residual stream after
  those blocks at every new position (see `hidden_states`); the logits are the same with or without them.
  platform: what the program is compiled for (None: the default backend).
  """
  x, cache, feats = hidden_states(params, tokens, positions, cache, write_slots, mask, cfg, attn_impl, feature_layers,
                                  platform)
  if logit_index is not None:
    x = jnp.take_along_axis(x, logit_index[:, :, None], axis=1)
  logits = lm_head(params, x, cfg, platform)
  return (logits, cache) if not feature_layers else (logits, cache, feats)


def forward_causal(params, tokens, cache: KVCache, cfg: ModelConfig, logit_index=None, attn_impl: str = "auto",
                   feature_layers: tuple = (), platform: str | None = None):
  """Returns (logits, cache[, features]) for tokens appended at each row's length (causal among themselves; lengths
  unchanged); features and platform as in `forward`."""
  t = tokens.shape[1]
  slots = cache.lengths[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]
  return forward(params, tokens, slots, cache, slots, causal_mask_info(slots), cfg, logit_index, attn_impl,
                 feature_layers, platform)


def forward_full(params, tokens, cfg: ModelConfig):
  """Returns logits [B, T, V_out] of a plain causal forward over whole sequences (no cache kept; training, tests)."""
  b, t = tokens.shape
  cache = KVCache.init(cfg, b, t, params["embed"].dtype)
  logits, _ = forward_causal(params, tokens, cache, cfg)
  return logits


def embed_lookup(embed, rows):
  """Returns the embedding rows `rows` (an array's, or dequantized from GGUF blocks)."""
  return blocks.embed_lookup(embed, rows) if isinstance(embed, blocks.BlockWeight) else embed[rows]


def embed_rows(params, tokens, cfg: ModelConfig):
  """Maps token ids to embedding rows (identity unless the embedding itself is reduced)."""
  return tokens if cfg.head_vocab is None or cfg.full_embed else params["vocab_map"][tokens]


def to_token_ids(params, head_index, cfg: ModelConfig):
  """Maps head rows to vocabulary token ids (identity unless the head vocabulary is reduced)."""
  if cfg.head_vocab is None:
    return head_index
  return params["head_ids"][head_index]


def scatter_to_vocab(params, probs_head, cfg: ModelConfig):
  """Returns a distribution over the full vocabulary [..., V] from one over the head rows [..., V_out]."""
  if cfg.head_vocab is None:
    return probs_head
  out = jnp.zeros(probs_head.shape[:-1] + (cfg.vocab_size,), probs_head.dtype)
  return out.at[..., params["head_ids"]].set(probs_head)
