import numpy as np
import pytest

from ssd_jax import acceptance


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
