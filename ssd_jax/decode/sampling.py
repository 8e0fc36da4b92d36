"""Token sampling: temperature / top-p processing and categorical draws with explicit keys.

`processed_probs` gives the exact distribution a token is drawn from. Speculative decoding must hand the verifier the
same processed distribution the draft sampled from, so both sides call this one function.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def argmax(logits: jax.Array) -> jax.Array:
  """Returns jnp.argmax(logits, -1) as int32, the same index in every case (the first maximum; the first NaN where
  there is one), in two vectorised passes: a max, then the least index holding it. XLA:CPU compiles jnp.argmax over
  the 49,152 logits of a row to one scalar (value, index) reduction, ~145 us a row, 2% of a GGUF AR step; this is
  ~40 us (one core, busy machine)."""
  lg = logits.astype(jnp.float32)
  v = lg.shape[-1]
  mx = jnp.max(lg, -1, keepdims=True)
  io = jax.lax.broadcasted_iota(jnp.int32, lg.shape, lg.ndim - 1)
  # A NaN ranks before every maximum (jnp.argmax returns the first NaN), whether or not max propagated it.
  idx = jnp.min(jnp.where(jnp.isnan(lg), io, jnp.where(lg == mx, io + v, 2 * v)), -1)
  return jnp.where(idx >= v, idx - v, idx).astype(jnp.int32)


def processed_probs(logits: jax.Array, temperature, top_p) -> jax.Array:
  """Returns the sampling distribution [..., V] (float32) after temperature and nucleus (top-p) processing.

  temperature == 0 gives a one-hot on the argmax (greedy). top_p >= 1 disables nucleus filtering. Both are dynamic
  scalars (no recompilation when they change).
  """
  logits = logits.astype(jnp.float32)
  temperature = jnp.asarray(temperature, jnp.float32)
  top_p = jnp.asarray(top_p, jnp.float32)
  greedy = jax.nn.one_hot(jnp.argmax(logits, -1), logits.shape[-1], dtype=jnp.float32)
  # Guard the division so temperature 0 never makes NaNs (the greedy branch is selected below).
  probs = jax.nn.softmax(logits / jnp.maximum(temperature, 1e-6), axis=-1)
  probs = jax.lax.cond(top_p < 1.0, lambda p: _top_p(p, top_p), lambda p: p, probs)
  return jnp.where(temperature > 0, probs, greedy)


def _top_p(probs: jax.Array, top_p) -> jax.Array:
  """Keeps the smallest set of most likely tokens whose mass reaches top_p, and every token tied with the least
  likely of them, and renormalises."""
  sorted_p = -jnp.sort(-probs, axis=-1)
  cum = jnp.cumsum(sorted_p, axis=-1)
  # Threshold = probability of the last token kept; a token is kept if the mass strictly before it is < top_p.
  keep_sorted = (cum - sorted_p) < top_p
  kth = jnp.min(jnp.where(keep_sorted, sorted_p, jnp.inf), axis=-1, keepdims=True)
  kept = jnp.where(probs >= kth, probs, 0.0)
  return kept / kept.sum(-1, keepdims=True)


def sample(key: jax.Array, probs: jax.Array) -> jax.Array:
  """Returns one token id per row of probs [..., V] (int32)."""
  return jax.random.categorical(key, jnp.log(jnp.maximum(probs, 0.0)), axis=-1).astype(jnp.int32)


def row_keys(key: jax.Array, step, batch: int) -> jax.Array:
  """Returns `batch` independent keys for one decode step: distinct per row and per step, fixed by the seed."""
  return jax.random.split(jax.random.fold_in(key, step), batch)


def rejection_sample(key: jax.Array, p: jax.Array, q: jax.Array, draft_tokens: jax.Array):
  """Returns (accept_len [B] int32 in 0..K, bonus token [B] int32): the lossless speculative-sampling rule.

  p: [B, K+1, V] the target's processed distributions at the K+1 verified positions; q: [B, K, V] the exact processed
  distributions the draft sampled draft_tokens [B, K] from. Draft token i is accepted with probability
  min(1, p_i(s_i) / q_i(s_i)) (independent uniforms, per row), stopping at the first rejection; the bonus token is drawn
  from normalize(max(0, p_k - q_k)) after a rejection at k, or from p_{K+1} when all K are accepted. With greedy
  (one-hot) p and q this is exactly "accept while s_i == argmax p_i, then emit argmax p_k", so one rule serves all
  temperatures and the emitted tokens are distributed as the target's.
  """
  b, k1, v = p.shape
  k = k1 - 1
  ku, kb = jax.random.split(key)
  u = jax.random.uniform(ku, (b, k), jnp.float32)
  p_s = jnp.take_along_axis(p[:, :k], draft_tokens[..., None], -1)[..., 0]
  q_s = jnp.take_along_axis(q, draft_tokens[..., None], -1)[..., 0]
  # u < p/q without dividing (q_s > 0 for a token the draft actually sampled).
  accept = u * q_s < p_s
  accept_len = jnp.sum(jnp.cumprod(accept.astype(jnp.int32), axis=1), axis=1).astype(jnp.int32)
  q_pad = jnp.concatenate([q, jnp.zeros((b, 1, v), q.dtype)], axis=1)  # position K: bonus straight from p_{K+1}
  p_k = jnp.take_along_axis(p, accept_len[:, None, None], 1)[:, 0]
  q_k = jnp.take_along_axis(q_pad, accept_len[:, None, None], 1)[:, 0]
  resid = jnp.maximum(p_k - q_k, 0.0)
  mass = resid.sum(-1, keepdims=True)
  # mass == 0 only if p_k == q_k, where a rejection has probability 0; fall back to p_k to stay well defined.
  resid = jnp.where(mass > 0, resid / jnp.where(mass > 0, mass, 1.0), p_k)
  bonus = sample(kb, resid)
  return accept_len, bonus


def greedy_or(sampled, logits: jax.Array, temperature):
  """Returns sampled(logits) -> (tokens, probs) at temperature > 0, else (argmax, its one-hot): what sampled returns
  at temperature 0 (a one-hot law, which Saguaro leaves unchanged, draws its argmax), without the softmax and the
  Gumbel draw over the vocabulary (one lax.cond: both branches compiled, one run)."""
  def greedy(lg):
    tok = argmax(lg)
    return tok, jax.nn.one_hot(tok, lg.shape[-1], dtype=jnp.float32)
  return jax.lax.cond(temperature > 0, sampled, greedy, logits)


def greedy_outcome(logits: jax.Array, draft_tokens: jax.Array):
  """Returns (accept_len [B], bonus [B]) of rejection_sample at temperature 0, from the logits [B, K+1, V] directly:
  draft i is accepted while it is the target's argmax there, and the bonus is the argmax where the run stops (with
  one-hot p and q, rejection_sample draws exactly these)."""
  top = argmax(logits)  # [B, K+1]
  match = (draft_tokens == top[:, :-1]).astype(jnp.int32)
  accept_len = jnp.sum(jnp.cumprod(match, axis=1), axis=1).astype(jnp.int32)
  return accept_len, jnp.take_along_axis(top, accept_len[:, None], 1)[:, 0]


def saguaro_rescale(probs: jax.Array, c, n_top: int) -> jax.Array:
  """Returns probs with its `n_top` most likely tokens down-weighted by C and renormalised (Saguaro sampling).

  The draft samples from this q' and hands q' itself to the verifier, which keeps speculation exact for any C in
  (0, 1]. n_top is static: the fan-out plus one (the cached candidates and the drafted token, which the fork
  excludes). n_top = 0 or C = 1 leaves probs unchanged; a one-hot (greedy) distribution is unchanged for any C.
  """
  if n_top <= 0:
    return probs
  kth = jax.lax.top_k(probs, n_top)[0][..., -1:]
  scaled = jnp.where(probs >= kth, probs * jnp.asarray(c, probs.dtype), probs)
  return scaled / scaled.sum(-1, keepdims=True)
