"""One declaration per parameter: shape, logical axes, dtype kind and initialiser, from which random init
(model.init_params), logical axes and shardings (sharding.param_axes / param_specs) and abstract arrays
(`abstract_params`, for compiling without memory) all derive. A new parameter is taught here once.

The params pytree (model.py's docstring shows it) is a dict: embed, layers (a list of dicts), final_norm, and
lm_head / head_ids / vocab_map when the config has them.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from .config import ModelConfig
from ..sharding import EMBED, HEAD_DIM, KV_HEADS, MLP, OUT_VOCAB, Q_HEADS, TOKEN_TABLE, VOCAB

# Initialisers: 'normal' draws N(0, scale^2); 'normal1' N(0, 1) (embeddings); 'ones' (norm weights); 'head_ids' and
# 'vocab_map' (the reduced-vocabulary tables, int32, deterministic).
INITS = ("normal", "normal1", "ones", "head_ids", "vocab_map")


@dataclasses.dataclass(frozen=True)
class ParamDecl:
  shape: tuple  # the array's shape
  axes: tuple   # logical axis per dimension (sharding.py's names)
  init: str     # one of INITS
  key: int = -1  # which split key draws it (model.init_params' order, so seeds keep giving the same params)

  @property
  def is_table(self) -> bool:
    """True for int32 index tables (not floating weights: not cast, not quantized)."""
    return self.init in ("head_ids", "vocab_map")


def is_decl(x) -> bool:
  return isinstance(x, ParamDecl)


def param_decls(cfg: ModelConfig) -> dict:
  """Returns a ParamDecl per parameter of `cfg`, with the structure of its params."""
  d, H, G, D, F = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn_dim
  n = lambda shape, axes, key: ParamDecl(shape, axes, "normal", key)  # noqa: E731
  layer = {"attn_norm": ParamDecl((d,), (EMBED,), "ones"), "mlp_norm": ParamDecl((d,), (EMBED,), "ones"),
           "wq": n((d, H * D), (EMBED, Q_HEADS), 0), "wk": n((d, G * D), (EMBED, KV_HEADS), 1),
           "wv": n((d, G * D), (EMBED, KV_HEADS), 2), "wo": n((H * D, d), (Q_HEADS, EMBED), 3),
           "w_gate": n((d, F), (EMBED, MLP), 4), "w_up": n((d, F), (EMBED, MLP), 5),
           "w_down": n((F, d), (MLP, EMBED), 6)}
  if cfg.attn_bias:
    layer.update(bq=n((H * D,), (Q_HEADS,), 7), bk=n((G * D,), (KV_HEADS,), 8), bv=n((G * D,), (KV_HEADS,), 9))
  if cfg.qk_norm:  # one weight shared by every head: replicated
    layer.update(q_norm=ParamDecl((D,), (HEAD_DIM,), "ones"), k_norm=ParamDecl((D,), (HEAD_DIM,), "ones"))
  decls = {"embed": ParamDecl((cfg.embed_rows, d), (VOCAB, EMBED), "normal1", 0),
           "layers": [dict(layer) for _ in range(cfg.n_layers)], "final_norm": ParamDecl((d,), (EMBED,), "ones")}
  if not cfg.tie_embeddings:
    decls["lm_head"] = ParamDecl((d, cfg.out_vocab), (EMBED, OUT_VOCAB), "normal", 1)
  if cfg.head_vocab is not None:
    decls["head_ids"] = ParamDecl((cfg.head_vocab,), (TOKEN_TABLE,), "head_ids")
    decls["vocab_map"] = ParamDecl((cfg.vocab_size,), (TOKEN_TABLE,), "vocab_map")
  return decls


def init_param(decl: ParamDecl, keys, cfg: ModelConfig, dtype, scale: float) -> jax.Array:
  """Returns one parameter drawn as `decl` says (`keys`: the split keys its `key` indexes)."""
  if decl.init == "ones":
    return jnp.ones(decl.shape, dtype)
  if decl.init in ("normal", "normal1"):
    s = 1.0 if decl.init == "normal1" else scale
    return (jax.random.normal(keys[decl.key], decl.shape, jnp.float32) * s).astype(dtype)
  if decl.init == "head_ids":
    return jnp.arange(cfg.head_vocab, dtype=jnp.int32)
  v = jnp.arange(cfg.vocab_size)
  return jnp.where(v < cfg.head_vocab, v, 0).astype(jnp.int32)


def abstract_params(cfg: ModelConfig, dtype=jnp.float32, shardings=None) -> dict:
  """Returns jax.ShapeDtypeStruct per parameter (tables int32), with `shardings` (a matching tree) when given: what
  jit(...).lower() needs to compile for a model without allocating it."""
  decls = param_decls(cfg)
  sh = shardings if shardings is not None else jax.tree.map(lambda _: None, decls, is_leaf=is_decl)
  return jax.tree.map(lambda dc, s: jax.ShapeDtypeStruct(dc.shape, jnp.int32 if dc.is_table else dtype, sharding=s),
                      decls, sh, is_leaf=is_decl)
