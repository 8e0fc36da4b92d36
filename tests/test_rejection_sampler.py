"""Statistical exactness of the speculative rejection sampler, against laws written independently in numpy.

Each test draws N independent rounds with a fixed seed and compares emitted tokens with the target's law
(numpy_reference.sampling_law, never sampling.processed_probs) by a chi-square test at false-alarm rate 1e-4.
Power: `detectable_w` (law_stats) gives the smallest deviation (Cohen's w = sqrt(sum (p_bug - p)^2 / p)) a test
detects with probability 0.99; each test states it for its sample size, and test_each_test_has_power_against_its_bug
checks that the bugs they are meant to catch deviate by more.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import numpy_reference as ref
from ssd_jax.decode import sampling

from law_stats import ALPHA, chi2_pvalue, detectable_w, effect_size

N = 60_000


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
  return np.bincount(np.asarray(toks), minlength=p.shape[-1]), ref.sampling_law(p_logits[0], temperature, top_p)


CASES = {
    "close": (np.log([0.3, 0.25, 0.2, 0.1, 0.1, 0.05]), np.log([0.25, 0.3, 0.15, 0.15, 0.1, 0.05])),
    "far": (np.log([0.02, 0.03, 0.05, 0.1, 0.3, 0.5]), np.log([0.6, 0.3, 0.05, 0.03, 0.01, 0.01])),
}


SETTINGS = [(1.0, 1.0), (0.7, 1.0), (1.0, 0.78), (0.7, 0.9)]  # no top_p where a cumulative mass sits on it


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("temperature,top_p", SETTINGS)
def test_emitted_distribution_equals_target(case, temperature, top_p):
  """K = 1, the first emitted token against the numpy law; N = 60k over 6 cells detects w >= 0.029 (power 0.99)."""
  pl, ql = CASES[case]
  p_logits = np.stack([pl, pl[::-1]])
  seed = 10 * sorted(CASES).index(case) + SETTINGS.index((temperature, top_p))
  counts, p = _first_token_dist(jax.random.key(seed), jnp.asarray(p_logits, jnp.float32),
                                jnp.asarray(ql[None], jnp.float32), temperature, top_p)
  assert chi2_pvalue(counts, p) > ALPHA, (counts / N, p)


@pytest.mark.parametrize("temperature", [0.5, 1.0, 1.5])
@pytest.mark.parametrize("top_p", [0.7, 0.9, 1.0])
def test_processed_probs_equals_the_numpy_law(temperature, top_p):
  """The law every token is drawn from (both sides call processed_probs) equals softmax(logits / T) cut to the
  top-p nucleus, written independently: exact up to float32, so any temperature or top-p slip fails outright."""
  rng = np.random.default_rng(1)
  logits = rng.normal(size=(5, 40)) * 3
  got = np.asarray(sampling.processed_probs(jnp.asarray(logits, jnp.float32), temperature, top_p))
  np.testing.assert_allclose(got, ref.sampling_law(logits, temperature, top_p), rtol=2e-4, atol=1e-6)
  np.testing.assert_array_equal(np.asarray(sampling.processed_probs(jnp.asarray(logits, jnp.float32), 0.0, top_p)),
                                ref.sampling_law(logits, 0.0, top_p))


BASE = np.asarray([0.05, 0.1, 0.1, 0.2, 0.25, 0.3])
N_ROUNDS = 20_000


def _round_laws(k):
  """Returns context-free (p [K+1, V], q [K, V]): p_i a different rotation of BASE per position, q_i = 0.8 p_i + 0.2
  uniform (acceptance about 0.95 per token, so about 0.8 of K=4 rounds reach the bonus after all K)."""
  p = np.stack([np.roll(BASE, i) for i in range(k + 1)])
  q = 0.8 * p[:k] + 0.2 / BASE.size
  return p, q


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_every_position_of_a_round_follows_the_target(k):
  """For K = 1..4, the token a round emits at each position 1..K+1 (the bonus after all K accepted included),
  among the rounds that reach it, follows that position's target law p_i (context-free laws, so each position's
  conditional law is p_i itself).

  N_ROUNDS = 20k rounds; the rarest position (K+1 at K=4) is reached over 14k times: 6 cells at 1e-4 detect
  w >= 0.060 there (power 0.99). Drawing the bonus after all K from the residual against q_K gives w = 1.5.
  """
  p, q = _round_laws(k)
  pj, qj = jnp.asarray(p, jnp.float32), jnp.asarray(q, jnp.float32)

  def one(key):
    kd, kv = jax.random.split(key)
    s = jax.vmap(sampling.sample)(jax.random.split(kd, k), qj)
    acc, bonus = sampling.rejection_sample(kv, pj[None], qj[None], s[None])
    emitted = jnp.concatenate([s, jnp.zeros((1,), jnp.int32)]).at[acc[0]].set(bonus[0])
    return emitted, acc[0]

  emitted, acc = (np.asarray(x) for x in jax.vmap(one)(jax.random.split(jax.random.key(100 + k), N_ROUNDS)))
  for i in range(k + 1):
    reached = acc >= i
    assert reached.sum() > 0.7 * N_ROUNDS  # every position, the bonus after all K too, is well sampled
    counts = np.bincount(emitted[reached, i], minlength=BASE.size)
    assert chi2_pvalue(counts, p[i]) > ALPHA, (k, i, counts / reached.sum(), p[i])


def test_each_test_has_power_against_its_bug():
  """The bugs these tests are meant to catch deviate from the target law by more than the tests resolve."""
  def resid(a, b):
    r = np.maximum(a - b, 0)
    return r / r.sum()

  # All K accepted, bonus from normalise(max(0, p_{K+1} - q_K)) instead of p_{K+1} (K = 4: reached ~16k times).
  p, q = _round_laws(4)
  assert effect_size(resid(p[4], q[3]), p[4]) > detectable_w(0.7 * N_ROUNDS, 6)
  # A rejection's replacement drawn from p instead of max(0, p - q) (K = 1, the 'far' case at T = 1).
  pl, ql = CASES["far"]
  pp, qq = ref.sampling_law(pl, 1, 1), ref.sampling_law(ql, 1, 1)
  acc = np.minimum(qq, pp)
  assert effect_size(acc + (1 - acc.sum()) * pp, pp) > detectable_w(N, 6)
  # Temperature applied as logits * T (T = 0.7): the K = 1 test sees the draft and target both at the wrong law.
  assert effect_size(ref.sampling_law(pl * 0.7, 1, 1), ref.sampling_law(pl, 0.7, 1)) > detectable_w(N, 6)


def test_the_test_catches_a_wrong_residual():
  """Sampling the replacement from p instead of max(0, p - q) is detected (so the tests above have power)."""
  pl, ql = CASES["close"]
  p = jnp.asarray(ref.sampling_law(pl, 1.0, 1.0), jnp.float32)
  q = jnp.asarray(ref.sampling_law(ql, 1.0, 1.0), jnp.float32)

  def one(k):
    kd, ku, kb = jax.random.split(k, 3)
    s = sampling.sample(kd, q)
    accept = jax.random.uniform(ku) * q[s] < p[s]
    return jnp.where(accept, s, sampling.sample(kb, p))  # the classic bug

  toks = np.asarray(jax.vmap(one)(jax.random.split(jax.random.key(0), N)))
  assert chi2_pvalue(np.bincount(toks, minlength=6), ref.sampling_law(pl, 1.0, 1.0)) < ALPHA


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
  """K=3 rounds: the first emitted token follows p_1, and the first two, in rounds that accept the first draft, are
  jointly distributed as min(p_1, q_1) / beta (x) p_2: a draft accepted, then a token of position 2's own law,
  drawn independently of it. The laws are numpy's (context-free, so the joint is that product); 36 cells, 60k
  rounds of which 90% accept the first draft: w >= 0.04 detected with power 0.99. A second position that
  reused the first's uniform, or a bonus drawn at the wrong position, changes the joint.
  """
  pl, ql = CASES["close"]
  p_np = ref.sampling_law(np.stack([pl, pl[::-1], pl, pl]), 1.0, 1.0)
  q_np = ref.sampling_law(np.stack([ql, ql, ql]), 1.0, 1.0)
  p, q = jnp.asarray(p_np, jnp.float32), jnp.asarray(q_np, jnp.float32)

  def one(k):
    kd, kv = jax.random.split(k)
    s = jax.vmap(sampling.sample)(jax.random.split(kd, 3), q)
    acc, bonus = sampling.rejection_sample(kv, p[None], q[None], s[None])
    second = jnp.where(acc[0] >= 2, s[1], jnp.where(acc[0] == 1, bonus[0], -1))
    return jnp.where(acc[0] > 0, s[0], bonus[0]), second

  first, second = (np.asarray(x) for x in jax.vmap(one)(jax.random.split(jax.random.key(3), N)))
  assert chi2_pvalue(np.bincount(first, minlength=6), p_np[0]) > ALPHA
  both = second >= 0
  accepted = np.minimum(p_np[0], q_np[0])
  assert abs(both.mean() - accepted.sum()) < 0.01
  joint = np.outer(accepted / accepted.sum(), p_np[1])
  counts = np.zeros((6, 6))
  np.add.at(counts, (first[both], second[both]), 1)
  assert detectable_w(both.sum(), 36) < 0.04
  assert chi2_pvalue(counts.ravel(), joint.ravel()) > ALPHA


def test_greedy_outcome_equals_the_rejection_rule_at_temperature_0():
  """verify's greedy shortcut (argmaxes, no draw) gives what rejection_sample gives with one-hot p and q, for every
  acceptance length 0..K, with ties in the logits (both take the first maximum)."""
  rng = np.random.default_rng(5)
  b, k, v = 400, 3, 12
  logits = rng.integers(0, 4, size=(b, k + 1, v)).astype(np.float32)  # small integers: many ties
  top = logits.argmax(-1)
  stop = rng.integers(0, k + 1, size=b)  # the first position whose draft differs from the argmax (k: none)
  other = (top[:, :k] + 1 + rng.integers(0, v - 1, (b, k))) % v  # never the argmax
  drafts = np.where(np.arange(k)[None, :] < stop[:, None], top[:, :k], other)
  p = sampling.processed_probs(jnp.asarray(logits), 0.0, 1.0)
  q = jax.nn.one_hot(jnp.asarray(drafts), v)
  want = sampling.rejection_sample(jax.random.key(0), p, q, jnp.asarray(drafts, jnp.int32))
  got = sampling.greedy_outcome(jnp.asarray(logits), jnp.asarray(drafts, jnp.int32))
  np.testing.assert_array_equal(np.asarray(got[0]), stop)
  for w, g in zip(want, got):
    np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_argmax_is_jnp_argmax_on_ties_infinities_and_nans():
  """sampling.argmax (two vectorised passes) returns jnp.argmax's index in every case: the first maximum, the first
  NaN where there is one, over ties, infinities, signed zeros and all -inf rows."""
  rng = np.random.default_rng(1)
  f = jax.jit(sampling.argmax)
  for case in range(48):
    x = rng.standard_normal((3, int(rng.integers(1, 300)))).astype(np.float32)
    if case % 4 == 1:
      x = np.round(x)  # many ties
    elif case % 4 == 2:
      x[rng.random(x.shape) < 0.05] = np.nan
    elif case % 4 == 3:
      x[:] = -np.inf
      x[rng.random(x.shape) < 0.1] = rng.choice([np.inf, np.nan, -0.0, 0.0])
    np.testing.assert_array_equal(np.asarray(f(jnp.asarray(x))), np.asarray(jnp.argmax(jnp.asarray(x), -1)))
  big = np.zeros((1, 2, 49152), np.float32)
  big[0, 0, [7, 40000]] = 1.0  # a tie far apart: the first
  big[0, 1, [9, 30000]] = [np.nan, np.nan]
  assert np.asarray(f(jnp.asarray(big))).tolist() == [[7, 9]]
