"""The one round loop (decode/loop.py): every mode runs its rounds through `run_rounds`, with the strategy its run
calls for, and the loop alone settles a draft side lost mid-round (the verify in hand committed, the strategy
closed, the rounds counted once)."""
import numpy as np
import pytest

from ssd_jax.decode import ARDecoder, DecodeOptions, SDDecoder, SpecOptions, SSDDecoder
from ssd_jax.decode import loop, rounds
from ssd_jax.decode.speculator import DraftLost

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8]]
OPTS = dict(max_new_tokens=9, ignore_eos=True)


@pytest.fixture
def strategies(monkeypatch):
  """Records the name of each strategy rounds.generate hands the loop, and the rounds it reports."""
  seen, run = [], rounds.run_rounds

  def recording(strategy, s):
    out = run(strategy, s)
    seen.append((strategy.name, out["rounds"], out["calls"]))
    return out

  monkeypatch.setattr(rounds, "run_rounds", recording)
  return seen


def test_every_mode_runs_the_one_loop_with_its_strategy(sd_pair, strategies):
  """AR, SD a call a round, SD in chunks and SSD on a device of its own each go through run_rounds once a run,
  with the strategy named for them; greedy SD and SSD equal AR, and the rounds and calls each reports are the ones
  its strategy runs (a call a round, or fewer calls than rounds)."""
  cfg, tp, dp = sd_pair
  want = [r.token_ids for r in ARDecoder(cfg, tp).generate(PROMPTS, DecodeOptions(ar_chunk=1, **OPTS))]
  assert strategies.pop() == ("rounds", 8, 8)  # AR: the prefill's token, then a step a round, a call each
  runs = {"rounds": (SDDecoder(cfg, tp, cfg, dp, SpecOptions(k=2)), 1),
          "sd_chunk": (SDDecoder(cfg, tp, cfg, dp, SpecOptions(k=2)), 4),
          "ssd_host": (SSDDecoder(cfg, tp, cfg, dp, SpecOptions(k=2, fan_out=2, placement="devices")), 1)}
  for name, (dec, n) in runs.items():
    got = [r.token_ids for r in dec.generate(PROMPTS, DecodeOptions(sd_chunk=n, **OPTS))]
    assert got == want, name
    (ran, rnds, calls), = strategies
    strategies.clear()
    assert ran == name and 1 < rnds <= 8, (name, rnds)  # each round commits a token or more
    assert calls == rnds if name != "sd_chunk" else calls < rnds


class _Book:
  def __init__(self):
    self.commits = []

  def commit(self, acc, bonus, drafts, now, stream=None):
    self.commits.append((int(acc[0]), int(bonus[0])))


class _Target:
  fetch = staticmethod(np.asarray)

  class programs:
    compile_seconds = 0.0


class _Strategy:
  """Commits two rounds, dispatches a third and loses its draft side before committing it."""
  name = "fake"

  def __init__(self):
    self.target, self.times, self.closed = _Target(), loop.RoundTimes(), False

  def begin(self, s):
    pass

  def advance(self, s):
    if s.committed < 2:
      s.book.commit(np.array([1]), np.array([10 + s.committed]), None, 0.0)
      s.committed += 1
      s.last = np.array([10 + s.committed - 1])
      self.times.rounds += 1
      return
    s.pending = (np.array([0]), np.array([42]), None, np.zeros((1, 2), np.int32))
    self.times.rounds += 1  # dispatched, not yet committed
    raise DraftLost("gone")

  def close(self):
    self.closed = True


def test_a_lost_draft_side_leaves_the_verify_in_hand_committed():
  """The loop, not each strategy, settles a lost draft side: the verify dispatched is committed (its bonus becomes
  the last token), the strategy is closed, and `lost` names the rounds committed, each counted once."""
  strategy, book = _Strategy(), _Book()
  s = loop.LoopState(book, np.array([7]), None, np.array([7]))
  out = loop.run_rounds(strategy, s)
  error, last, committed = out["lost"]
  assert isinstance(error, DraftLost) and strategy.closed
  assert book.commits == [(1, 10), (1, 11), (0, 42)] and int(last[0]) == 42
  assert committed == out["rounds"] == s.committed == 3 and s.pending is None


END_AT = 3  # tokens after which the listener needs no more of a row


def _ending(rows):
  """Returns a stream over every row that ends each row of `rows` once it holds END_AT tokens (SpecBook.end)."""
  from ssd_jax.decode import EveryRow
  got = {}

  def listen(row, ids):
    got.setdefault(row, []).extend(ids)
    return row in rows and len(got[row]) >= END_AT
  return EveryRow(listen)


@pytest.mark.parametrize("mode", ["ar", "sd", "sd-unfused", "ssd-devices", "ssd-processes"])
def test_rows_ended_from_outside_stop_the_batch_and_leave_the_others_alone(sd_pair, mode, strategies):
  """A listener that needs no more of a row ends it (a server's request at its own stop string, or a client gone):
  the other rows' greedy tokens are the ones they get without it, and once every row has ended the run stops,
  in every strategy of the loop; SSD's draft side ends the same rows (its lookups agree with the target's, in its
  own process too)."""
  cfg, tp, dp = sd_pair
  if mode == "ar":
    dec = ARDecoder(cfg, tp)
  elif mode.startswith("sd"):
    dec = SDDecoder(cfg, tp, cfg, dp, SpecOptions(k=2))
  else:
    dec = SSDDecoder(cfg, tp, cfg, dp, SpecOptions(k=2, fan_out=2, placement=mode.split("-")[1]))
  prompts = PROMPTS + [[9, 10], [11]]
  opts = DecodeOptions(max_new_tokens=16, ignore_eos=True, ar_chunk=1, sd_chunk=1 if mode == "sd-unfused" else 4)
  try:
    full = dec.generate(prompts, opts)
    one = dec.generate(prompts, opts, stream=_ending({0}))
    every = dec.generate(prompts, opts, stream=_ending(set(range(len(prompts)))))
  finally:
    getattr(dec, "close", lambda: None)()
  want = [r.token_ids for r in full]
  assert [r.token_ids for r in one][1:] == want[1:]
  assert END_AT <= len(one[0].token_ids) < 16 and one[0].token_ids == want[0][:len(one[0].token_ids)]
  for r, w in zip(every, want):
    assert END_AT <= len(r.token_ids) < 16 and r.token_ids == w[:len(r.token_ids)]
  (_, full_rounds, _), _, (_, every_rounds, _) = strategies  # the loop's rounds of each run
  assert every_rounds < full_rounds  # the run stopped once every row had ended
