"""SSD's rounds in one program (decode/ssd_loop.py): the target's verifies run in an XLA loop that calls back to the
host after each; the same keys, speculations and so the same tokens as the loop that dispatches a verify a round."""
import math
import os

import pytest

from ssd_jax.decode import ARDecoder, DecodeOptions, SpecOptions, SSDDecoder, ssd_loop

from pairs import PROMPTS, two_stop_ids

pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPU cores")


@pytest.fixture(scope="module")
def split(tiny_pair, cut_head_draft):
  """A target and a draft with a cut head (40 of 64 rows) in its own process, and the target alone."""
  cfg, tp = tiny_pair
  dcfg, dp = cut_head_draft
  dec = SSDDecoder(cfg, tp, dcfg, dp, SpecOptions(k=2, fan_out=2, placement="processes"))
  yield cfg, tp, dec
  dec.close()


def _run(dec, opts, one_program: bool, monkeypatch, prompts=PROMPTS):
  monkeypatch.setattr(ssd_loop, "ONE_PROGRAM", one_program)
  return dec.generate(prompts, opts)


def test_one_program_draws_the_host_loops_samples(split, monkeypatch):
  """Temperature 1, hits and neural-backup misses, the cut head's laws widened on the host, 3 rounds a call (the
  loop's carry and a pending HIT reply cross calls): the tokens a seed draws equal the host loop's, which the
  placements test ties to the draft on its own device. Another seed draws others."""
  _, _, dec = split
  monkeypatch.setattr(ssd_loop, "ROUNDS_PER_CALL", 3)
  opts = DecodeOptions(max_new_tokens=25, temperature=1.0, ignore_eos=True, seed=5)
  fused, host = (_run(dec, opts, one, monkeypatch, PROMPTS[:2]) for one in (True, False))
  assert [r.token_ids for r in fused] == [r.token_ids for r in host]
  ex, hx = fused[0].stats.extra, host[0].stats.extra
  assert 0 < ex["hit_rounds"] < ex["loop_rounds"] and ex["loop_rounds"] == hx["loop_rounds"]
  assert ex["target_program_calls"] == math.ceil(ex["loop_rounds"] / 3)  # the rounds ran inside the programs
  assert hx["target_program_calls"] == hx["loop_rounds"]
  assert ex["cache_hit_rate"] == hx["cache_hit_rate"]
  parts = ex["round_parts_seconds"]
  assert sum(parts.values()) == pytest.approx(ex["target_idle_seconds"], abs=2e-3) and min(parts.values()) >= 0
  other = _run(dec, DecodeOptions(max_new_tokens=25, temperature=1.0, ignore_eos=True, seed=6), True, monkeypatch,
               PROMPTS[:2])
  assert [r.token_ids for r in other] != [r.token_ids for r in fused]


def test_one_program_greedy_equals_ar_and_stops_where_it_does(split, monkeypatch):
  """Greedy, ragged rows that stop at different rounds (several stop ids), 2 rounds a call: AR's tokens."""
  cfg, tp, dec = split
  monkeypatch.setattr(ssd_loop, "ROUNDS_PER_CALL", 2)
  stops, cut = two_stop_ids(cfg, tp)
  assert [r.token_ids for r in _run(dec, DecodeOptions(max_new_tokens=15, eos_id=stops), True, monkeypatch)] == cut
  opts = DecodeOptions(max_new_tokens=21, ignore_eos=True)
  want = [r.token_ids for r in ARDecoder(cfg, tp).generate(PROMPTS, opts)]
  res = _run(dec, opts, True, monkeypatch)
  assert [r.token_ids for r in res] == want
  assert res[0].stats.extra["target_program_calls"] == math.ceil(res[0].stats.extra["loop_rounds"] / 2)


def test_a_failure_inside_the_loop_reaches_the_caller(split, monkeypatch):
  """An error in the host's part of a round (here: the lookup, at round 4) ends the program and is raised on the
  caller's thread as itself, not as an XLA error; the run's callback entry and its draft process are dropped; the
  next run starts a fresh one and is unharmed."""
  cfg, tp, dec = split
  real, seen = ssd_loop.find, []

  def failing(cache, acc, bonus):
    seen.append(1)
    if len(seen) == 4:
      raise KeyError("planted")
    return real(cache, acc, bonus)

  monkeypatch.setattr(ssd_loop, "find", failing)
  opts = DecodeOptions(max_new_tokens=21, ignore_eos=True)
  with pytest.raises(KeyError, match="planted"):
    _run(dec, opts, True, monkeypatch)
  assert not ssd_loop._RUNS and dec.draft._proc is None  # the failed run's draft process is gone
  monkeypatch.setattr(ssd_loop, "find", real)
  want = [r.token_ids for r in ARDecoder(cfg, tp).generate(PROMPTS, opts)]
  assert [r.token_ids for r in _run(dec, opts, True, monkeypatch)] == want
