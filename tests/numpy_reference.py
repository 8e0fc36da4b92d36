"""An independent numpy Llama forward (no KV cache, no JAX), the oracle for the model tests."""
import numpy as np


def _rms(x, w, eps):
  return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _inv_freq(cfg):
  """RoPE inverse frequencies in float64, with the scaling rules as docs/model_families.md states them."""
  d = cfg.head_dim
  inv = 1.0 / cfg.rope_theta ** (np.arange(0, d, 2) / d)
  s = cfg.rope_scaling
  if s is None:
    return inv
  if s.kind == "linear":
    return inv / s.factor
  if s.kind == "divisors":
    return inv / np.asarray(s.divisors)
  wavelength = 2 * np.pi / inv
  low, high = s.original_max_position / s.low_freq_factor, s.original_max_position / s.high_freq_factor
  out = np.empty_like(inv)
  for i, (f, w) in enumerate(zip(inv, wavelength)):
    if w > low:
      out[i] = f / s.factor
    elif w < high:
      out[i] = f
    else:
      a = (s.original_max_position / w - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
      out[i] = (1 - a) * f / s.factor + a * f
  return out


def _rope(x, pos, inv):
  # x [T, N, D], rotate-half convention
  d = x.shape[-1]
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
    q, k = q.reshape(t, H, D), k.reshape(t, G, D)
    if cfg.qk_norm:
      q, k = _rms(q, lp["q_norm"], cfg.rms_eps), _rms(k, lp["k_norm"], cfg.rms_eps)
    q, k = _rope(q, pos, _inv_freq(cfg)), _rope(k, pos, _inv_freq(cfg))
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


# ------------------------------------------------------------------ sampling laws, written independently of sampling.py


def sampling_law(logits, temperature, top_p):
  """Returns the law a token is drawn from under temperature and nucleus (top-p) sampling, float64 [..., V].

  softmax(logits / T); with top_p < 1, the most likely tokens are kept, in order, while the mass before each is below
  top_p, and any token as likely as the last one kept is kept too; renormalised. T = 0 is a point mass on the argmax.
  """
  logits = np.asarray(logits, np.float64)
  if temperature == 0:
    return np.eye(logits.shape[-1])[np.argmax(logits, -1)]
  z = logits / temperature
  e = np.exp(z - z.max(-1, keepdims=True))
  p = e / e.sum(-1, keepdims=True)
  if top_p >= 1:
    return p
  out = np.zeros_like(p)
  for idx in np.ndindex(p.shape[:-1]):
    row = p[idx]
    mass, last = 0.0, None
    for t in np.argsort(-row, kind="stable"):
      if mass >= top_p and row[t] < last:
        break
      out[idx + (t,)] = last = row[t]
      mass += row[t]
  return out / out.sum(-1, keepdims=True)


def saguaro_law(probs, c, n_top):
  """Returns probs with its n_top most likely entries multiplied by c, renormalised (the draft's q')."""
  probs = np.array(probs, np.float64)
  if n_top <= 0:
    return probs
  for idx in np.ndindex(probs.shape[:-1]):
    top = np.argsort(-probs[idx], kind="stable")[:n_top]
    probs[idx + (top,)] *= c
  return probs / probs.sum(-1, keepdims=True)


def joint_law(params, cfg, prompt, n, temperature, top_p, support=None):
  """Returns the target's exact law of its first n sampled tokens after `prompt`, float64 [V] * n.

  temperature and top_p are numbers, or one per token (the law a decoder that mixes them up would follow).
  support: token ids that hold all the law's mass (tests/draft_heads.concentrate's); the law is then over them,
  [len(support)] * n, and every law on the way is checked to put no more than 1e-12 outside them.
  """
  ids = np.arange(cfg.vocab_size) if support is None else np.asarray(support)
  v = len(ids)
  temps, tops = (np.broadcast_to(np.asarray(x, np.float64), (n,)) for x in (temperature, top_p))
  law = np.zeros((v,) * n)
  for seq in np.ndindex(*(v,) * (n - 1)):
    logits = forward(params, list(prompt) + ids[list(seq)].tolist(), cfg)
    probs = [sampling_law(logits[len(prompt) - 1 + i], temps[i], tops[i]) for i in range(n)]
    assert all(1 - p[ids].sum() <= 1e-12 for p in probs), "mass outside the support"
    probs = [p[ids] for p in probs]
    pre = 1.0
    for i, t in enumerate(seq):
      pre *= probs[i][t]
    law[seq] = pre * probs[n - 1]
  return law
