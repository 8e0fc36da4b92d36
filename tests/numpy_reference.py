"""An independent numpy Llama forward (no KV cache, no JAX), the oracle for the model tests."""
import numpy as np


def _rms(x, w, eps):
  return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _rope(x, pos, theta):
  # x [T, N, D], rotate-half convention
  d = x.shape[-1]
  inv = 1.0 / theta ** (np.arange(0, d, 2) / d)
  ang = pos[:, None] * inv[None, :]
  cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
  x1, x2 = x[..., : d // 2], x[..., d // 2:]
  return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def forward(params, tokens, cfg):
  """Returns logits [T, V_out] for one sequence of token ids."""
  p = {k: v for k, v in params.items()}
  rows = np.asarray(p["vocab_map"])[tokens] if cfg.head_vocab is not None else np.asarray(tokens)
  x = np.asarray(p["embed"], np.float64)[rows]
  t = len(tokens)
  pos = np.arange(t, dtype=np.float64)
  H, G, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
  causal = np.tril(np.ones((t, t), bool))
  for lp in p["layers"]:
    lp = {k: np.asarray(v, np.float64) for k, v in lp.items()}
    h = _rms(x, lp["attn_norm"], cfg.rms_eps)
    q, k, v = h @ lp["wq"], h @ lp["wk"], h @ lp["wv"]
    if cfg.attn_bias:
      q, k, v = q + lp["bq"], k + lp["bk"], v + lp["bv"]
    q = _rope(q.reshape(t, H, D), pos, cfg.rope_theta)
    k = _rope(k.reshape(t, G, D), pos, cfg.rope_theta)
    v = v.reshape(t, G, D)
    out = np.zeros((t, H, D))
    for hh in range(H):
      g = hh // (H // G)
      s = q[:, hh] @ k[:, g].T / np.sqrt(D)
      s = np.where(causal, s, -np.inf)
      s = np.exp(s - s.max(-1, keepdims=True))
      s /= s.sum(-1, keepdims=True)
      out[:, hh] = s @ v[:, g]
    x = x + out.reshape(t, H * D) @ lp["wo"]
    h = _rms(x, lp["mlp_norm"], cfg.rms_eps)
    gate = h @ lp["w_gate"]
    x = x + (gate / (1 + np.exp(-gate)) * (h @ lp["w_up"])) @ lp["w_down"]
  x = _rms(x, np.asarray(p["final_norm"], np.float64), cfg.rms_eps)
  if cfg.tie_embeddings:
    return x @ np.asarray(p["embed"], np.float64).T
  return x @ np.asarray(p["lm_head"], np.float64)
