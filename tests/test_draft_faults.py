"""A draft side that is lost mid-run costs speed, not the answer: a draft process that exits, is killed or stops
answering, or a draft in this process that fails, is said once (DraftLostWarning) and the target finishes the run
alone; at temperature 0 the tokens are AR's. (Elsewhere in the suite a DraftLostWarning is an error: pyproject.)"""
import os
import signal

import pytest

from ssd_jax.decode import ARDecoder, DecodeOptions, SDDecoder, SpecOptions, SSDDecoder, rounds, ssd_loop
from ssd_jax.decode.speculator import ChainDraft, DraftLostWarning
from ssd_jax.decode.tree_draft import TreeDraft

from pairs import PROMPTS

TWO_CORES = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPU cores")
OPTS = DecodeOptions(max_new_tokens=21, ignore_eos=True)


@pytest.fixture(scope="module")
def pair(tiny_pair, perturbed_draft):
  cfg, tp = tiny_pair
  return cfg, tp, perturbed_draft, [r.token_ids for r in ARDecoder(cfg, tp).generate(PROMPTS, OPTS)]


def _at_round(n: int, act):
  """A stream callback that calls act() when row 0's n-th piece is committed (its first token is piece 1)."""
  seen = []

  def stream(row, tokens):
    seen.append(1)
    if len(seen) == n:
      act()
  return stream


def _check_alone(res, want, lost: str):
  assert [r.token_ids for r in res] == want
  ex = res[0].stats.extra
  assert ex["rounds_without_draft"] > 0 and lost in ex["draft_lost"]
  return ex


@TWO_CORES
@pytest.mark.parametrize("one_program", [True, False])
def test_a_killed_draft_process_leaves_the_target_to_finish(pair, one_program, monkeypatch):
  """The child killed (as the OOM killer would) at round 3: one warning, AR's tokens, the stats say which rounds ran
  how; the next run starts a fresh child and runs SSD throughout. In one program and a verify a round alike."""
  cfg, tp, dp, want = pair
  monkeypatch.setattr(ssd_loop, "ONE_PROGRAM", one_program)
  dec = SSDDecoder(cfg, tp, cfg, dp, SpecOptions(k=2, fan_out=2, placement="processes"))
  try:
    with pytest.warns(DraftLostWarning, match=r"the draft process exited .*alone \(AR\) from round 4") as w:
      res = dec.generate(PROMPTS, OPTS, stream=_at_round(4, lambda: dec.draft._proc.kill()))
    assert len(w) == 1
    ex = _check_alone(res, want, "exited")
    assert ex["loop_rounds"] == 3 and dec.draft._proc is None
    again = dec.generate(PROMPTS, OPTS)
    assert [r.token_ids for r in again] == want
    assert again[0].stats.extra["rounds_without_draft"] == 0 and again[0].stats.extra["draft_lost"] is None
  finally:
    dec.close()


@TWO_CORES
def test_a_draft_process_that_stops_answering_is_given_up_after_the_timeout(pair):
  """The child stopped (SIGSTOP) mid-run, a timeout of 1.5 s: the target gives it up, kills it and finishes alone."""
  cfg, tp, dp, want = pair
  dec = SSDDecoder(cfg, tp, cfg, dp, SpecOptions(k=2, fan_out=2, placement="processes", draft_timeout=1.5))
  try:
    with pytest.warns(DraftLostWarning, match="did not answer within 1.5 s"):
      res = dec.generate(PROMPTS, OPTS, stream=_at_round(3, lambda: os.kill(dec.draft._proc.pid, signal.SIGSTOP)))
    _check_alone(res, want, "did not answer")
    assert dec.draft._proc is None  # killed, not left stopped
  finally:
    dec.close()


def test_a_failing_draft_in_this_process_leaves_the_target_to_finish(pair, monkeypatch):
  """SSD with the draft on its own device of this process: its tree fails at round 3 (the cache's hand-over)."""
  cfg, tp, dp, want = pair
  calls, real = [], TreeDraft.cache

  def failing(self):
    calls.append(1)
    if len(calls) == 3:
      raise ZeroDivisionError("planted")
    return real(self)

  monkeypatch.setattr(TreeDraft, "cache", failing)
  dec = SSDDecoder(cfg, tp, cfg, dp, SpecOptions(k=2, fan_out=2, placement="devices"))
  with pytest.warns(DraftLostWarning, match=r"the draft side failed \(ZeroDivisionError: planted\)"):
    res = dec.generate(PROMPTS, OPTS)
  ex = _check_alone(res, want, "ZeroDivisionError")
  assert ex["loop_rounds"] == 3


@pytest.mark.parametrize("fail_in", ["outcome", "first"])
def test_sd_with_a_failing_draft_finishes_alone(pair, monkeypatch, fail_in):
  """SD a round a call: the chain fails on round 2's outcome (the verify in hand is committed first) or before the
  first round; at 'first' no round ran with it."""
  cfg, tp, dp, want = pair
  real = getattr(ChainDraft, fail_in)
  calls = []

  def failing(self, arg):
    calls.append(1)
    if len(calls) == (2 if fail_in == "outcome" else 1):
      raise OSError("planted")
    return real(self, arg)

  monkeypatch.setattr(ChainDraft, fail_in, failing)
  dec = SDDecoder(cfg, tp, cfg, dp, SpecOptions(k=2))
  with pytest.warns(DraftLostWarning, match="planted"):
    res = dec.generate(PROMPTS, DecodeOptions(max_new_tokens=21, ignore_eos=True, sd_chunk=1))
  _check_alone(res, want, "OSError")
  rounds = res[0].stats.extra["rounds"] - res[0].stats.extra["rounds_without_draft"]
  assert rounds == (2 if fail_in == "outcome" else 0)


def test_draft_timeout_is_checked():
  for bad in (0, -1, float("inf"), "10", True):
    with pytest.raises(ValueError, match="draft timeout"):
      SpecOptions(draft_timeout=bad)


@TWO_CORES
def test_a_draft_process_lost_after_the_last_round_costs_only_its_statistics(pair, monkeypatch):
  """The child killed once the rounds are over, as the target asks for the draft side's statistics: no error and no
  warning (nothing was left to finish), the tokens stand and draft_lost says what happened; the next run starts a
  fresh child. (A server's batch met this: its client had its answer, and killed the child meanwhile.)"""
  cfg, tp, dp, want = pair
  dec = SSDDecoder(cfg, tp, cfg, dp, SpecOptions(k=2, fan_out=2, placement="processes"))
  stats = rounds._stats

  def killed_first(link):
    dec.draft._proc.kill()
    dec.draft._proc.wait()
    return stats(link)

  try:
    monkeypatch.setattr(rounds, "_stats", killed_first)
    res = dec.generate(PROMPTS, OPTS)
    assert [r.token_ids for r in res] == want
    assert "exited" in res[0].stats.extra["draft_lost"] and dec.draft._proc is None
    monkeypatch.setattr(rounds, "_stats", stats)
    again = dec.generate(PROMPTS, OPTS)
    assert [r.token_ids for r in again] == want and again[0].stats.extra["draft_lost"] is None
  finally:
    dec.close()
