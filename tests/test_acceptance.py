import numpy as np
import pytest

from ssd_jax.theory import acceptance


def test_worked_rounds():
  # Rounds at K=2: [0,0 | bonus rank 3] [0 | rank 1] [0,0 | rank 0] [rank 2] [rank 5, the last token].
  ranks = [0, 0, 3, 0, 1, 0, 0, 0, 2, 5]
  c = acceptance.replay_greedy_rounds(ranks, 2, (2, 2, 2))
  assert c == {"tokens": 10, "rounds": 5, "accepted": 5, "hits": 3, "hit_chances": 4}
  s = acceptance.summarize([c], 2)
  assert s["tokens_per_forward"] == 2.0 and s["acceptance"] == 0.5 and s["cache_hit_rate"] == 0.75
  # F = 1: below K only rank 1 (the drafted token, rank 0, was rejected); at K only rank 0 (nothing was rejected).
  c1 = acceptance.replay_greedy_rounds(ranks, 2, (1, 1, 1))
  assert (c1["hits"], c1["hit_chances"]) == (2, 4)
  # The fan-out is read at the round's acceptance length: (0, 0, 2) covers only the all-accepted rounds.
  assert acceptance.replay_greedy_rounds(ranks, 2, (0, 0, 2))["hits"] == 1


def test_answer_ending_inside_an_accepted_run():
  c = acceptance.replay_greedy_rounds([0, 0, 0], 4, (3,) * 5)
  assert c == {"tokens": 3, "rounds": 1, "accepted": 3, "hits": 0, "hit_chances": 0}
  assert acceptance.summarize([c], 4)["cache_hit_rate"] is None


@pytest.mark.parametrize("a,k", [(0.6, 3), (0.3, 2), (0.85, 6)])
def test_iid_ranks_give_the_closed_form(a, k):
  rng = np.random.default_rng(0)
  answers = [np.where(rng.random(2000) < a, 0, 1 + rng.integers(0, 4, 2000)) for _ in range(50)]
  s = acceptance.summarize([acceptance.replay_greedy_rounds(r, k) for r in answers], k)
  expect = (1 - a ** (k + 1)) / (1 - a)
  assert s["tokens_per_forward"] == pytest.approx(expect, rel=0.015)
  assert s["acceptance"] == pytest.approx((expect - 1) / k, rel=0.03)


def test_bad_arguments():
  with pytest.raises(ValueError, match="K must be"):
    acceptance.replay_greedy_rounds([0], 0)
  with pytest.raises(ValueError, match="K\\+1 = 3"):
    acceptance.replay_greedy_rounds([0], 2, (1, 1))


def _tops_from_ranks(ranks, depths, r=6, vocab=100, seed=0):
  """Top-r lists [J, n, r] in which the target token (id 50 + i % 7) sits at the given rank at every depth."""
  target = np.asarray([50 + i % 7 for i in range(len(ranks))])
  top = np.zeros((depths, len(ranks), r), np.int64)
  for j in range(depths):
    rng = np.random.default_rng(seed)  # the same other tokens at every depth
    for i, rk in enumerate(ranks):
      others = [t for t in rng.permutation(vocab) if t != target[i]][:r]
      row = list(others)
      if rk < r:
        row[rk] = target[i]
      top[j, i] = row
  return top, target


def test_eagle_replay_matches_the_rank_replay_when_depth_does_not_matter():
  rng = np.random.default_rng(3)
  ranks = np.where(rng.random(300) < 0.7, 0, 1 + rng.integers(0, 5, 300))
  top, target = _tops_from_ranks(ranks, 9)
  for k in (1, 2, 4):
    sd = acceptance.replay_eagle_rounds(top, target, k)
    ref = acceptance.replay_greedy_rounds(ranks, k)
    assert {x: sd[x] for x in ("tokens", "rounds", "accepted")} == {x: ref[x] for x in ("tokens", "rounds", "accepted")}
  ssd = acceptance.replay_eagle_rounds(top, target, 2, (2, 2, 2))
  ref = acceptance.replay_greedy_rounds(ranks, 2, (2, 2, 2))
  assert (ssd["hits"], ssd["hit_chances"], ssd["accepted"]) == (ref["hits"], ref["hit_chances"], ref["accepted"])


def test_eagle_ssd_replay_reads_deeper_predictions_after_a_hit():
  # Depths 0..K right, deeper ones wrong. SD drafts at depths 0..K-1: everything is accepted. SSD's first round
  # (depth 0) accepts K and its cache hits (the bonus is the depth-K glue's argmax), so the next speculation was
  # drafted at depth K+1 and is rejected at once; that outcome hits too (the depth-0 glue ranks the bonus first once
  # the rejected draft is left out), so the one after is drafted at depth 1 and accepted: rounds alternate.
  n, k = 40, 2
  right, target = _tops_from_ranks([0] * n, k + 1)
  wrong, _ = _tops_from_ranks([9] * n, 6, seed=1)
  top = np.concatenate([right, wrong])
  sd = acceptance.replay_eagle_rounds(top, target, k)
  assert sd["accepted"] == sd["tried"] and sd["rounds"] == -(-n // (k + 1))
  ssd = acceptance.replay_eagle_rounds(top, target, k, (1, 1, 1))
  assert ssd["hits"] == ssd["hit_chances"] > 0
  assert ssd["accepted"] < sd["accepted"]
  s = acceptance.summarize([ssd], k)
  assert s["per_token_acceptance"] == pytest.approx(2 / 3, abs=0.05)  # rounds of 2 of 2, then 0 of 1
  # A miss resets the depth: with no fan-out the SSD replay is SD's.
  none = acceptance.replay_eagle_rounds(top, target, k, (0, 0, 0))
  assert (none["accepted"], none["rounds"], none["hits"]) == (sd["accepted"], sd["rounds"], 0)
  with pytest.raises(ValueError, match="depths 0..4"):
    acceptance.replay_eagle_rounds(top[:4], target, k, (1, 1, 1))
