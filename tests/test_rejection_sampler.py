"""Statistical exactness of the speculative rejection sampler.

Each test draws N independent rounds and compares the emitted token's empirical distribution with the target p by a
chi-square test at false-alarm rate 1e-4 per test (N = 60k, V = 6: a wrong residual or greedy routing moves the
distribution by far more than the test's resolution; see test_the_test_catches_a_wrong_residual).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ssd_jax import sampling

N = 60_000
ALPHA = 1e-4


def _chi2_pvalue(counts, probs, min_expected: float = 5.0):
  """Returns the chi-square goodness-of-fit p-value of counts against probs.

  Cells whose expected count is below `min_expected` are pooled into one cell (the usual validity condition: a
  single draw in a cell with expectation 1e-3 would otherwise dominate the statistic). Emitting a token of target
  probability exactly zero fails outright.
  """
  from math import erf, sqrt
  counts = np.asarray(counts, np.float64)
  exp = np.asarray(probs, np.float64) * counts.sum()
  assert counts[exp <= 0].sum() == 0, "token with zero target probability was emitted"
  big = exp >= min_expected
  obs_cells = list(counts[big]) + ([counts[~big & (exp > 0)].sum()] if (~big & (exp > 0)).any() else [])
  exp_cells = list(exp[big]) + ([exp[~big & (exp > 0)].sum()] if (~big & (exp > 0)).any() else [])
  obs_cells, exp_cells = np.asarray(obs_cells), np.asarray(exp_cells)
  stat = float(((obs_cells - exp_cells) ** 2 / exp_cells).sum())
  dof = len(exp_cells) - 1
  assert dof >= 1, "too few cells for a chi-square test"
  # Wilson-Hilferty approximation of the chi-square tail (no scipy dependency).
  z = ((stat / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / sqrt(2 / (9 * dof))
  return 0.5 * (1 - erf(z / sqrt(2)))


def _first_token_dist(key, p_logits, q_logits, temperature, top_p):
  """Simulates N rounds with K=1: draft samples s ~ q; returns the first emitted token of each round."""
  p = sampling.processed_probs(p_logits, temperature, top_p)  # [K+1, V]
  q = sampling.processed_probs(q_logits, temperature, top_p)  # [K, V]

  def one(k):
    kd, kv = jax.random.split(k)
    s = sampling.sample(kd, q)  # [K]
    acc, bonus = sampling.rejection_sample(kv, p[None], q[None], s[None])
    return jnp.where(acc[0] > 0, s[0], bonus[0])

  toks = jax.vmap(one)(jax.random.split(key, N))
  return np.bincount(np.asarray(toks), minlength=p.shape[-1]), np.asarray(p[0])


CASES = {
    "close": (np.log([0.3, 0.25, 0.2, 0.1, 0.1, 0.05]), np.log([0.25, 0.3, 0.15, 0.15, 0.1, 0.05])),
    "far": (np.log([0.02, 0.03, 0.05, 0.1, 0.3, 0.5]), np.log([0.6, 0.3, 0.05, 0.03, 0.01, 0.01])),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 1.0), (1.0, 0.8), (0.7, 0.9)])
def test_emitted_distribution_equals_target(case, temperature, top_p):
  pl, ql = CASES[case]
  p_logits = jnp.asarray(np.stack([pl, pl[::-1]]), jnp.float32)
  q_logits = jnp.asarray(ql[None], jnp.float32)
  counts, p = _first_token_dist(jax.random.key(hash((case, temperature, top_p)) % 2**31), p_logits, q_logits,
                                temperature, top_p)
  assert _chi2_pvalue(counts, p) > ALPHA, (counts / N, p)


def test_the_test_catches_a_wrong_residual():
  """Sampling the replacement from p instead of max(0, p - q) is detected (so the tests above have power)."""
  pl, ql = CASES["close"]
  p = sampling.processed_probs(jnp.asarray(pl, jnp.float32), 1.0, 1.0)
  q = sampling.processed_probs(jnp.asarray(ql, jnp.float32), 1.0, 1.0)

  def one(k):
    kd, ku, kb = jax.random.split(k, 3)
    s = sampling.sample(kd, q)
    accept = jax.random.uniform(ku) * q[s] < p[s]
    return jnp.where(accept, s, sampling.sample(kb, p))  # the classic bug

  toks = np.asarray(jax.vmap(one)(jax.random.split(jax.random.key(0), N)))
  assert _chi2_pvalue(np.bincount(toks, minlength=6), np.asarray(p)) < ALPHA


def test_greedy_accepts_exactly_while_draft_equals_argmax():
  v, k = 7, 4
  rng = np.random.default_rng(0)
  p_logits = jnp.asarray(rng.normal(size=(3, k + 1, v)), jnp.float32)
  p = sampling.processed_probs(p_logits, 0.0, 1.0)
  target = np.asarray(jnp.argmax(p_logits, -1))
  drafts = target[:, :k].copy()
  drafts[0, 2] = (drafts[0, 2] + 1) % v  # row 0 diverges at position 2
  drafts[1, 0] = (drafts[1, 0] + 3) % v  # row 1 at position 0; row 2 all accepted
  q = jax.nn.one_hot(jnp.asarray(drafts), v)
  acc, bonus = sampling.rejection_sample(jax.random.key(1), p, q, jnp.asarray(drafts))
  assert acc.tolist() == [2, 0, 4]
  assert bonus.tolist() == [target[0, 2], target[1, 0], target[2, 4]]


def test_multi_position_joint_distribution_k3():
  """K=3 rounds: the first two emitted tokens are jointly distributed as p_1(x) p_2(y|x) would emit them.

  With fixed per-position p (context-free), the joint of (token 1, token 2 if the round reached it) factorises, so
  we compare the first emitted token with p_1 and, given token 1 was an accepted draft, the second with p_2.
  """
  pl, ql = CASES["far"]
  p = sampling.processed_probs(jnp.asarray(np.stack([pl, pl[::-1], pl, pl]), jnp.float32), 1.0, 1.0)
  q = sampling.processed_probs(jnp.asarray(np.stack([ql, ql, ql]), jnp.float32), 1.0, 1.0)

  def one(k):
    kd, kv = jax.random.split(k)
    s = jax.vmap(sampling.sample)(jax.random.split(kd, 3), q)
    acc, bonus = sampling.rejection_sample(kv, p[None], q[None], s[None])
    second = jnp.where(acc[0] >= 2, s[1], jnp.where(acc[0] == 1, bonus[0], -1))
    return jnp.where(acc[0] > 0, s[0], bonus[0]), second

  first, second = (np.asarray(x) for x in jax.vmap(one)(jax.random.split(jax.random.key(3), N)))
  assert _chi2_pvalue(np.bincount(first, minlength=6), np.asarray(p[0])) > ALPHA
  sec = second[second >= 0]
  assert _chi2_pvalue(np.bincount(sec, minlength=6), np.asarray(p[1])) > ALPHA
