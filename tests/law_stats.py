"""The statistics of the law tests: the chi-square goodness-of-fit p-value, the power of such a test
(`detectable_w`) and the size of a bug's deviation (`effect_size`), and the assertions that decoded rows follow the
target's law (`assert_joint_matches_target`: the JAX model's exact joint; `assert_rows_follow_their_laws`:
numpy_reference's). No scipy: the tail is Wilson-Hilferty's approximation."""
import itertools

import jax
import jax.numpy as jnp
import numpy as np

import numpy_reference as ref
from ssd_jax.models import model

from draft_heads import LIVE, cells, live, padded

ALPHA = 1e-4  # the law tests' false-alarm rate


def chi2_pvalue(counts, probs, min_expected: float = 5.0):
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


def detectable_w(n: float, cells: int, alpha: float = ALPHA, power: float = 0.99) -> float:
  """Returns the smallest effect size w that a chi-square test of n draws over `cells` cells at level alpha detects
  with probability `power` (noncentral chi-square with noncentrality n w^2, simulated with a fixed seed; the
  critical value from the same Wilson-Hilferty tail chi2_pvalue uses)."""
  from statistics import NormalDist
  dof = cells - 1
  z = NormalDist().inv_cdf(1 - alpha)
  crit = dof * (1 - 2 / (9 * dof) + z * np.sqrt(2 / (9 * dof))) ** 3
  rng = np.random.default_rng(0)
  lo, hi = 0.0, 10.0 * crit + 100.0
  for _ in range(40):  # bisect on the noncentrality
    lam = (lo + hi) / 2
    if (rng.noncentral_chisquare(dof, max(lam, 1e-9), 20_000) > crit).mean() >= power:
      hi = lam
    else:
      lo = lam
  return float(np.sqrt(hi / n))


def effect_size(p_bug, p) -> float:
  """Returns Cohen's w of law p_bug against p (infinite where p_bug puts mass on a token p never emits)."""
  p_bug, p = np.asarray(p_bug, np.float64).ravel(), np.asarray(p, np.float64).ravel()
  if (p_bug[p <= 0] > 1e-12).any():
    return float("inf")
  m = p > 0
  return float(np.sqrt(((p_bug[m] - p[m]) ** 2 / p[m]).sum()))


def assert_joint_matches_target(seqs, tp, cfg, prompt, alpha=1e-4, ids=LIVE):
  """Chi-square test of the empirical joint of the first three tokens (ids) against the target's exact joint over
  draft_heads.LIVE (the whole vocabulary of the tiny pair)."""
  v = len(ids)
  probs = np.zeros((v, v, v))
  for a, b in itertools.product(range(v), range(v)):
    seq = jnp.asarray([prompt + [ids[a], ids[b]]])
    lg = np.asarray(jax.nn.softmax(model.forward_full(tp, seq, cfg)[0], -1))[:, list(ids)]
    probs[a, b, :] = lg[len(prompt) - 1, a] * lg[len(prompt), b] * lg[len(prompt) + 1]
  assert abs(probs.sum() - 1) < 1e-4  # all the mass on LIVE (draft_heads.concentrate under the real head)
  assert chi2_pvalue(cells(seqs, ids=ids).ravel(), padded(probs).ravel()) > alpha


def assert_rows_follow_their_laws(res, prompts, host, cfg, temperature, top_p, n_new=3, tail=False):
  """Chi-square at 1e-4 of the first three tokens of rows (prompts alternating over the rows) against each prompt's
  numpy joint law, over 64 cells per prompt; with tail=True also tokens 4 to 6 against their marginal law (which
  SSD emits mostly from speculations served out of its cache). Cells count the pair's LIVE ids; any other id counts
  in a cell of law zero, which fails outright."""
  counts, probs = [], []
  for g, prompt in enumerate(prompts):
    rows = [r.token_ids for i, r in enumerate(res) if i % len(prompts) == g]
    law = ref.joint_law(host, cfg, live(prompt), 6 if tail else 3, temperature, top_p, support=LIVE)
    parts = [(0, law.sum(axis=(3, 4, 5)) if tail else law)] + ([(3, law.sum(axis=(0, 1, 2)))] if tail else [])
    for start, part in parts:
      counts.append(cells(rows, 3, start).ravel())
      probs.append(padded(part).ravel() * len(rows))
  counts, probs = np.concatenate(counts), np.concatenate(probs)
  if not tail:
    assert chi2_pvalue(counts, probs / probs.sum()) > 1e-4
    return
  half = len(counts) // (2 * len(prompts))  # first three and tail, tested apart: they are not independent
  for part in (0, 1):
    idx = np.concatenate([np.arange(half) + (2 * g + part) * half for g in range(len(prompts))])
    assert chi2_pvalue(counts[idx], probs[idx] / probs[idx].sum()) > 1e-4, ("tokens 4-6" if part else "tokens 1-3")
