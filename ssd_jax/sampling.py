"""Token sampling: temperature / top-p processing and categorical draws with explicit keys.

`processed_probs` gives the exact distribution a token is drawn from. Speculative decoding must hand the verifier the
same processed distribution the draft sampled from, so both sides call this one function.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


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
  """Keeps the smallest set of most likely tokens whose mass reaches top_p (ties broken by index) and renormalises."""
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


def sample_logits(key: jax.Array, logits: jax.Array, temperature, top_p) -> jax.Array:
  """Returns sampled token ids [...] from logits [..., V] under temperature / top-p."""
  return sample(key, processed_probs(logits, temperature, top_p))


def row_keys(key: jax.Array, step, batch: int) -> jax.Array:
  """Returns `batch` independent keys for one decode step: distinct per row and per step, fixed by the seed."""
  return jax.random.split(jax.random.fold_in(key, step), batch)
