"""SD's chain reads the verify's outcome on the device (steps.advance_tail, chain_after): the tail it drafts from is
the committed text's, whether the outcome comes as the verify's arrays or from the host, and nothing is placed from
the host in a round. These are rounds of a call each (sd_chunk=1); test_sd_chunk.py checks that chunks of rounds
give the same tokens."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ssd_jax.decode import DecodeOptions, SDDecoder, SpecOptions
from ssd_jax.decode import speculator
from ssd_jax.decode.base import SpecBook
from ssd_jax.decode.steps import advance_tail

from pairs import PROMPTS


@pytest.mark.parametrize("w,k", [(2, 1), (2, 3), (4, 3), (6, 2)])
def test_advance_tail_gives_the_committed_tail(w, k):
  """Random outcomes on rows of several lengths (some shorter than the window: left-padded with 0), against
  SpecBook's own commit and state; a row not verified keeps its tail."""
  rng = np.random.default_rng(w * 10 + k)
  prompts = [list(rng.integers(1, 50, n)) for n in (1, 2, 5, 9, 3, 1)]
  b = len(prompts)
  book = SpecBook(prompts, rng.integers(1, 50, b), DecodeOptions(max_new_tokens=200, ignore_eos=True), k, 0.0)
  window, lens = (jnp.asarray(x) for x in book.state(w))
  for _ in range(6):
    drafts = rng.integers(1, 50, (b, k)).astype(np.int32)
    acc, bonus = rng.integers(0, k + 1, b).astype(np.int32), rng.integers(1, 50, b).astype(np.int32)
    active = rng.random(b) < 0.7
    acc[~active] = 0  # as the verify gives them
    before = book.state(w)
    book.done[:] = ~active
    book.commit(acc, bonus, drafts, 0.0)
    window, lens = advance_tail(window, lens, jnp.asarray(drafts), jnp.asarray(acc), jnp.asarray(bonus),
                                jnp.asarray(active))
    want_w, want_l = book.state(w)
    np.testing.assert_array_equal(np.asarray(window), want_w)
    np.testing.assert_array_equal(np.asarray(lens), want_l)
    assert (want_l[~active] == before[1][~active]).all() and (want_l[active] > before[1][active]).all()


def _checked_rounds(monkeypatch, strip: bool = False):
  """Checks after every outcome that the chain drafted from the committed tail of each live row (the draft side's
  book, as the host would have read it); strip: the outcome comes without the verify's arrays (the host path).
  Returns the list of rounds checked."""
  outcome, rounds = speculator.ChainDraft.outcome, []

  def checked(self, o):
    if strip:
      o.on_target = None
    spec = outcome(self, o)
    window, lens = self.book.state(self.model.window)
    live = ~self.book.done
    np.testing.assert_array_equal(np.asarray(self.model.tail[0])[live], window[live])
    np.testing.assert_array_equal(np.asarray(self.model.tail[1])[live], lens[live])
    rounds.append(int(live.sum()))
    return spec

  monkeypatch.setattr(speculator.ChainDraft, "outcome", checked)
  return rounds


@pytest.mark.parametrize("k", [1, 3])
def test_the_chain_drafts_from_the_committed_tail_with_rows_ending_apart(sd_pair, monkeypatch, k):
  """Rows stop at different rounds (an EOS mid-text, max_new_tokens): every live row's proposal read its committed
  tail, on the device and on the host path alike, and both give the same tokens at T = 1 (their drafts and q
  decide the text with the seed)."""
  cfg, tp, dp = sd_pair
  dec = SDDecoder(cfg, tp, cfg, dp, SpecOptions(k=k))
  base = [r.token_ids for r in dec.generate(PROMPTS, DecodeOptions(max_new_tokens=15, ignore_eos=True, sd_chunk=1))]
  opts = DecodeOptions(max_new_tokens=15, eos_id=base[1][6], sd_chunk=1)  # row 1 stops mid-text
  sampled = DecodeOptions(max_new_tokens=15, temperature=1.0, seed=3, ignore_eos=True, sd_chunk=1)
  out = {}
  for strip in (False, True):
    rounds = _checked_rounds(monkeypatch, strip)
    greedy = dec.generate(PROMPTS, opts)
    assert min(rounds) < len(PROMPTS) and max(rounds) == len(PROMPTS)  # some rows ended before others
    out[strip] = [r.token_ids for r in greedy + dec.generate(PROMPTS, sampled)]
    assert 0 < np.mean([r.stats.extra["acceptance_rate"] for r in greedy]) < 1
  assert out[False] == out[True]
  eos = base[1][6]
  assert out[False][1] == base[1][:base[1].index(eos) + 1]  # row 1 stopped at its EOS


def test_a_round_places_nothing_from_the_host(sd_pair, monkeypatch):
  """After the first proposal the chain's inputs are device arrays: the draft side puts no host data in a round
  (the tail and the outcome stay on the device)."""
  cfg, tp, dp = sd_pair
  dec = SDDecoder(cfg, tp, cfg, dp, SpecOptions(k=2))
  side = dec.draft.side
  host_puts = []
  put = side.model.put

  def recording(tree):
    host_puts.extend(x for x in jax.tree.leaves(tree) if not isinstance(x, jax.Array))
    return put(tree)

  monkeypatch.setattr(side.model, "put", recording)
  first = speculator.ChainDraft.first

  def first_then_clear(self, f):
    spec = first(self, f)
    host_puts.clear()  # the first proposal places the prompts' tails
    return spec

  monkeypatch.setattr(speculator.ChainDraft, "first", first_then_clear)
  res = dec.generate(PROMPTS, DecodeOptions(max_new_tokens=12, ignore_eos=True, sd_chunk=1))
  assert res[0].stats.extra["rounds"] > 3
  assert host_puts == []


# In chunks (the default) is the loop its timings once missed; unfused repeats the rounds loop other tests time.
@pytest.mark.parametrize("sd_chunk", [None, pytest.param(1, marks=pytest.mark.slow)], ids=["chunks", "unfused"])
def test_round_cost_script_times_each_modes_own_loop(tmp_path, sd_chunk):
  """scripts/experiments/round_cost.py on the tiny pair, run as a command: each mode's loop figures come from the loop
  that mode runs (SD in chunks by default: the sd_chunk strategy, not a call a round, whose timings were once
  reported as SD's), its compiled calls, SD's text checked against AR's."""
  import json

  from commands import run_script
  out = tmp_path / "rounds.json"
  ks = "1,2" if sd_chunk is None else "1"
  chunk = [] if sd_chunk is None else ["--sd-chunk", str(sd_chunk)]
  r = run_script("round_cost.py", "--tiny", "--ks", ks, "--repeats", "1", "--max-new-tokens", "8", "--ar-chunk", "1",
                 *chunk, "--json-out", str(out))
  assert r.returncode == 0, r.stderr[-2000:]
  rep = json.loads(out.read_text())
  assert sorted(rep) == ["ar"] + [f"sd{k}" for k in ks.split(",")]
  for mode, r in rep.items():
    assert r["cpu_us_token"] > 0 and r["main_us_round"] > 0 and r["compiled_cpu_us"]["verify"] > 0
    assert ("chain" in r["compiled_cpu_us"]) == (mode != "ar")
    if mode == "ar":  # a step a round, a round a call
      assert r["loop"] == "rounds" and r["tokens_per_round"] == r["tokens_per_call"] == 1.0
    elif sd_chunk is None:  # rounds that commit more than a token each, several rounds a call
      assert r["loop"] == "sd_chunk" and 1.0 < r["tokens_per_round"] < r["tokens_per_call"]
    else:
      assert r["loop"] == "rounds" and 1.0 < r["tokens_per_round"] == r["tokens_per_call"]
  assert rep["ar"]["x_ar_cpu"] == 1.0


def test_round_cost_script_refuses_rounds_it_did_not_time(monkeypatch):
  """A run whose rounds do not go through the timed loop stops round_cost.py (its loop timing: bench/loop_cost.py)
  instead of reporting the figures left from the run before."""
  from types import SimpleNamespace

  from ssd_jax.bench import loop_cost
  from ssd_jax.decode import rounds
  monkeypatch.setattr(rounds, "generate", lambda *args: None)
  box = dict(loop="rounds", cpu=1.0, main=1.0, wall=1.0)
  with pytest.raises(RuntimeError, match="ran outside loop.run_rounds"):
    loop_cost.timed_run(SimpleNamespace(draft=None), [1, 2], None, box)
