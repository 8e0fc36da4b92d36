"""k='auto': K chosen per batch size from step costs and acceptance (ssd_jax/decode/auto_k.py), and the pipeline
running what it chose (0: AR) with the same greedy tokens."""
import dataclasses
import os
import warnings

import pytest

from ssd_jax import api
from ssd_jax.bench import step_cost
from ssd_jax.cli_util import k_arg
from ssd_jax.decode import SpecOptions, auto_k


def costs(verify_growth: float, draft: float = 0.05, batches=(1, 4)) -> auto_k.StepCosts:
  """Costs where AR is 10 ms at every batch and a T-token verify costs 10 ms x (1 + verify_growth (T - 1))."""
  return auto_k.StepCosts(ar_ms={b: 10.0 for b in batches},
                          verify_ms={b: {t: 10.0 * (1 + verify_growth * (t - 1)) for t in range(2, 6)} for b in batches},
                          draft_ms={b: 10.0 * draft for b in batches})


def test_choose_k_follows_the_timing_model():
  # A free verify and a cheap draft with high acceptance: the longest K pays most.
  assert auto_k.choose_k(costs(0.0, 0.0), 1, 0.9) == auto_k.K_MAX
  # Compute-bound verify (T tokens cost T steps): no K beats AR, at any acceptance below 1.
  assert auto_k.choose_k(costs(1.0), 1, 0.8) == 0
  # a = 0.5 with a verify that grows 10% a token: by hand, E(a, K) x 10 / (10 (1 + 0.1 K) + 0.5 K + 1.5) is
  # 1.154, 1.207, 1.172, 1.107 for K = 1..4: the middle K.
  assert auto_k.choose_k(costs(0.1, 0.05), 1, 0.5) == 2
  # A gain inside the margin is not taken: AR is never slower than AR.
  tiny_gain = auto_k.StepCosts({1: 10.0}, {1: {t: 10.0 for t in range(2, 6)}}, {1: 0.0})
  assert 1 < auto_k.sd_speedup(tiny_gain, 1, 1, 0.18) < auto_k.MARGIN  # 1.18 x 10 / 11.5
  assert auto_k.choose_k(tiny_gain, 1, 0.18, k_max=1) == 0


def test_a_mode_asked_for_gets_its_best_k_of_at_least_one():
  """at_least=1 (an explicit sd/ssd): the K with the most expected speed among K >= 1, even below AR's."""
  assert auto_k.choose_k(costs(1.0), 1, 0.8, at_least=1) == 1  # every K loses; K=1 loses least
  # The same costs as the middle-K case above: K=2 is best with or without the floor.
  assert auto_k.choose_k(costs(0.1, 0.05), 1, 0.5, at_least=1) == 2
  assert [auto_k.choose_k(None, b, 0.5, at_least=1) for b in (1, 3, 8)] == [2, 1, 1]
  assert auto_k.choose_k(None, 1, 0.5, builtin=auto_k.BUILTIN_K_BLOCKS, at_least=1) == 1
  with pytest.raises(ValueError, match="at_least"):
    auto_k.choose_k(None, 1, 0.5, k_max=1, at_least=2)


def test_ssd_speedup_hides_the_draft():
  c = costs(0.2, 0.1)
  a, k = 0.6, 2
  round_ms = 10.0 * (1 + 0.2 * 2) + auto_k.ROUND_OVERHEAD * 10.0  # no draft steps: every round a cache hit
  assert auto_k.ssd_speedup(c, 1, k, a) == pytest.approx((1 + a + a * a) * 10.0 / round_ms)
  assert auto_k.ssd_speedup(c, 1, k, a) > auto_k.sd_speedup(c, 1, k, a)


def test_sd_speedup_is_tokens_over_time():
  c = costs(0.2, 0.1)
  a, k = 0.6, 2
  round_ms = 10.0 * (1 + 0.2 * 2) + k * 1.0 + auto_k.ROUND_OVERHEAD * 10.0
  assert auto_k.sd_speedup(c, 1, k, a) == pytest.approx((1 + a + a * a) * 10.0 / round_ms)


def test_costs_between_and_past_measured_batches():
  c = auto_k.StepCosts(ar_ms={1: 10.0, 4: 16.0}, verify_ms={1: {2: 11.0}, 4: {2: 20.0}}, draft_ms={1: 1.0, 4: 2.5})
  ar, verify, draft = c.at(2)
  assert ar == pytest.approx(12.0) and verify[2] == pytest.approx(14.0) and draft == pytest.approx(1.5)
  ar, verify, draft = c.at(8)  # past the largest: scaled by rows
  assert ar == pytest.approx(32.0) and verify[2] == pytest.approx(40.0) and draft == pytest.approx(5.0)
  assert auto_k.StepCosts.from_json(c.to_json()) == c


def test_builtin_choice_without_measurements():
  assert [auto_k.choose_k(None, b, 0.5) for b in (1, 2, 3, 4, 5, 8, 16)] == [2, 2, 1, 1, 0, 0, 0]
  # A target in GGUF blocks: its verify is too dear for speculation to pay without measurements.
  assert [auto_k.choose_k(None, b, 0.9, builtin=auto_k.BUILTIN_K_BLOCKS) for b in (1, 2, 4)] == [0, 0, 0]
  with pytest.raises(ValueError, match="batch"):
    auto_k.choose_k(None, 0, 0.5)


def test_auto_spec_options():
  s = SpecOptions(k="auto", fan_out=3, backup="fast")
  assert s.auto and s.with_k(2) == SpecOptions(k=2, fan_out=3, backup="fast")
  # Every setting but K survives the choice: a draft process's timeout once fell back to its default here.
  every = dict(fan_out=4, fan_out_miss=4, fan_out_strategy="geometric", backup="ngram", saguaro_c=0.5,
               placement="processes", draft_timeout=7.5)
  assert SpecOptions(k="auto", **every).with_k(3) == SpecOptions(k=3, **every)
  for bad, match in ((dict(k="auto", fan_out="3,2,1"), "single fan-out"), (dict(k="auto", fan_out_miss=4), "same total"),
                     (dict(k="several"), "'auto'"), (dict(k=0), "'auto'")):
    with pytest.raises(ValueError, match=match):
      SpecOptions(**bad)
  assert k_arg("auto") == "auto" and k_arg("3") == 3  # the flag's text as SpecOptions takes it, which checks it
  for bad in ("0", "two", "1.5"):
    with pytest.raises(ValueError, match="K \\(draft tokens per round\\) must be an integer >= 1 or 'auto'"):
      SpecOptions(k=k_arg(bad))


def test_pipeline_runs_the_chosen_k_per_batch(tmp_path, monkeypatch):
  """Without costs: SD at K=2 for one prompt, AR for a batch of 6 (built-in table); with costs that make K=1 pay at
  batch 6, SD at K=1 there. Greedy tokens equal AR's in every case; a ragged last batch gets its own choice."""
  monkeypatch.setenv("SSD_JAX_STEP_COSTS", str(tmp_path / "step_costs"))
  pipe = api.load_tiny()
  prompts = [pipe.encode_prompt(p) for p in ("Hi", "Say something.", "abc", "x", "The end", "Once upon")]
  ar = [r.token_ids for r in pipe.generate_ids(prompts, mode="ar", max_new_tokens=8)]

  assert pipe.default_mode == "sd"

  def run(batch_size, mode=None):  # None: the default mode, which runs AR where no K pays
    res = pipe.generate_ids(prompts, mode=mode, batch_size=batch_size, max_new_tokens=8)
    assert [r.token_ids for r in res] == ar
    return [(r.stats.mode, r.stats.extra.get("k")) for r in res]

  assert run(1) == [("sd", 2)] * 6
  assert run(6) == [("ar", None)] * 6
  assert run(4) == [("sd", 1)] * 4 + [("sd", 2)] * 2  # 4 rows, then a ragged batch of 2
  # Asked for by name, SD runs at every batch (its best K >= 1), and says once that AR is expected faster.
  with pytest.warns(api.SlowerThanAR, match=r"sd at K=1 with 6 rows is not expected to beat AR") as seen:
    assert run(6, "sd") == [("sd", 1)] * 6
  assert len(seen) == 1
  with warnings.catch_warnings():
    warnings.simplefilter("error", api.SlowerThanAR)  # batch 1 is expected to pay: no warning
    assert run(1, "sd") == [("sd", 2)] * 6
  path = pipe.step_costs_path()
  os.makedirs(os.path.dirname(path))
  with open(path, "w") as f:
    f.write(costs(0.05, 0.02, batches=(1, 8)).to_json())
  assert pipe.choose_k(6) >= 1
  assert run(6) == [("sd", pipe.choose_k(6))] * 6
  pipe.weights = "gguf"  # another weight format: its own costs (none measured) and its own built-in table
  assert pipe.step_costs_path() != path and pipe.choose_k(1) == 0


def prefix_costs(short: float, long: float, batches=(1, 4)) -> auto_k.CostTable:
  """A table at prefixes 64 and 448 where AR is 10 ms (short context) or 14 ms (long) and a T-token verify costs
  AR x (1 + growth (T - 1)), the growth `short` or `long`: the longer context's attention dearer per token."""
  def at(prefix, ar, growth):
    return auto_k.StepCosts({b: ar for b in batches}, {b: {t: ar * (1 + growth * (t - 1)) for t in range(2, 6)}
                                                      for b in batches}, {b: 0.5 for b in batches}, prefix=prefix)
  return auto_k.CostTable((at(448, 14.0, long), at(64, 10.0, short)))


def test_cost_table_reads_the_costs_at_the_runs_prefix():
  c = prefix_costs(0.1, 0.3)
  assert [t.prefix for t in c.tables] == [64, 448]  # sorted
  ar, verify, _ = c.at(4, 256)  # halfway
  assert ar == pytest.approx(12.0) and verify[2] == pytest.approx(0.5 * (11.0 + 18.2))
  assert c.at(1, 10)[0] == pytest.approx(10.0)  # below the shortest: the shortest's costs
  assert c.at(1, 832)[0] == pytest.approx(18.0)  # past the longest: the line through the two
  assert c.at(1, None) == c.at(1, auto_k.DEFAULT_PREFIX)
  assert auto_k.CostTable.from_json(c.to_json()) == c
  # A single table of the first format (no prefix, measured at 300) reads as a table of that one prefix.
  old = costs(0.1).to_json().replace('"prefix": 300', '"prefix_gone": 0')
  assert auto_k.CostTable.from_json(old).tables[0].prefix == auto_k.DEFAULT_PREFIX
  with pytest.raises(ValueError, match="at least one"):
    auto_k.CostTable(())


def test_choose_k_by_the_runs_prefix():
  """The same table gives K=2 for a short context and AR for a long one, where the verify's growth per token is 3x;
  by hand at a = 0.5: prefix 64, K=2: 1.75 x 10 / (10 x 1.2 + 1 + 1.5) = 1.207; prefix 448, K=1: 1.5 x 14 /
  (14 x 1.3 + 0.5 + 2.1) = 1.010 < MARGIN."""
  c = prefix_costs(0.1, 0.3)
  assert auto_k.sd_speedup(c, 1, 2, 0.5, 64) == pytest.approx(1.75 * 10 / 14.5)
  assert auto_k.sd_speedup(c, 1, 1, 0.5, 448) == pytest.approx(1.5 * 14 / 20.8)
  assert auto_k.choose_k(c, 1, 0.5, prefix=64) == 2
  assert auto_k.choose_k(c, 1, 0.5, prefix=448) == 0
  assert auto_k.run_prefix([100, 140], 64) == 152.0  # the mean prompt and half the new tokens


def test_measure_times_every_step_at_each_prefix():
  import jax
  from ssd_jax.models.config import ModelConfig
  from ssd_jax.models.model import init_params
  cfg = ModelConfig(name="t", vocab_size=64, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16,
                    ffn_dim=64, max_seq_len=512)
  m = type("M", (), {"cfg": cfg, "params": init_params(jax.random.PRNGKey(0), cfg)})
  logs = []
  table = step_cost.measure(m, m, batches=(1, 2), k_max=2, repeats=1, prefixes=(8, 100), log=logs.append)
  assert [t.prefix for t in table.tables] == [8, 100] and len(logs) == 4
  for t in table.tables:
    assert sorted(t.ar_ms) == [1, 2] and sorted(t.verify_ms[2]) == [2, 3]
    assert all(v > 0 for v in [*t.ar_ms.values(), *t.draft_ms.values(), *t.verify_ms[1].values()])


def test_cost_cache_key_covers_weight_formats_of_target_and_draft(tmp_path, monkeypatch):
  """The cached costs belong to the formats measured: another dtype or shape of any leaf of the target or the draft
  (a draft loaded in another weights choice), or another KV cache dtype, is another file."""
  import jax
  import jax.numpy as jnp
  monkeypatch.setenv("SSD_JAX_STEP_COSTS", str(tmp_path / "step_costs"))
  pipe = api.load_tiny()
  base = pipe.step_costs_path()
  assert pipe.step_costs_path() == base  # stable
  fmt = auto_k.params_format(pipe.draft.params)
  assert auto_k.params_format(jax.tree.map(lambda x: x, pipe.draft.params)) == fmt  # the format, not the object
  half = jax.tree.map(lambda x: x.astype(jnp.bfloat16) if x.dtype == jnp.float32 else x, pipe.draft.params)
  assert auto_k.params_format(half) != fmt
  draft = pipe.draft
  pipe.draft = dataclasses.replace(draft, params=half)
  assert pipe.step_costs_path() != base
  pipe.draft = draft
  pipe.kv_dtype = "bfloat16"
  assert pipe.step_costs_path() != base


def test_measured_host_time_replaces_the_fixed_round_overhead():
  """A table with the loop's measured time: an AR token costs its step plus host_ms["ar"], an SD round its verify,
  K draft steps and host_ms["round"] (at every batch), not ROUND_OVERHEAD AR steps; it survives the JSON cache."""
  steps = auto_k.StepCosts({1: 7.2, 4: 11.0}, {1: {t: 7.2 * (1 + 0.23 * (t - 1)) for t in range(2, 6)},
                                               4: {t: 11.0 * (1 + 0.4 * (t - 1)) for t in range(2, 6)}},
                           {1: 0.8, 4: 1.2}, prefix=64)
  fixed = auto_k.CostTable((steps,))
  measured = dataclasses.replace(fixed, host_ms={"ar": 0.5, "round": 0.9})
  a = 0.56
  assert auto_k.sd_speedup(measured, 1, 1, a) == pytest.approx((1 + a) * (7.2 + 0.5) / (7.2 * 1.23 + 0.8 + 0.9))
  assert auto_k.sd_speedup(measured, 4, 2, a) == pytest.approx((1 + a + a * a) * 11.5 / (11.0 * 1.8 + 2.4 + 0.9))
  # With a 7 ms step the fixed overhead (0.15 steps, ~1.1 ms) keeps AR; the measured loop time makes K=1 pay.
  assert auto_k.choose_k(fixed, 1, a) == 0 and auto_k.choose_k(measured, 1, a) == 1
  assert auto_k.choose_k(measured, 4, a) == 0
  back = auto_k.CostTable.from_json(measured.to_json())
  assert back == measured and auto_k.CostTable.from_json(fixed.to_json()).host_ms is None


def test_measure_host_subtracts_the_compiled_steps_from_real_decodes():
  """AR: seconds over the tokens after the first, less the AR step; SD: seconds over the verifies (forwards less
  the prefill), less a 2-token verify and a draft step. The warm-up decode of each mode is not counted."""
  table = auto_k.CostTable((auto_k.StepCosts({1: 7.0}, {1: {2: 8.5, 3: 10.0}}, {1: 0.8}, prefix=64),))
  calls = []

  def decode(mode):
    calls.append(mode)
    warm = len(calls) <= 2
    if mode == "ar":  # 48 tokens: 47 steps of 7.5 ms
      return (99.0 if warm else 47 * 7.5e-3), 48, 48
    return (99.0 if warm else 30 * 10.1e-3), 48, 31  # 30 rounds of 10.1 ms

  out = step_cost.measure_host(table, decode, prefix=64, repeats=3, log=lambda m: None)
  assert calls == ["ar", "sd"] * 4
  assert out.host_ms == pytest.approx({"ar": 0.5, "round": 10.1 - 8.5 - 0.8})
  assert out.tables == table.tables
  with pytest.raises(ValueError, match="no steps"):
    step_cost.measure_host(table, lambda mode: (0.1, 1, 1), prefix=64, repeats=1, log=lambda m: None)


def test_measure_host_times_each_mode_asked_and_the_table_keeps_their_speeds():
  """With SSD among the modes, each mode is decoded alike (interleaved, one warm-up each) and its median tokens a
  second goes into modes_tok_s (what the default mode is chosen by), which survives the JSON cache."""
  table = auto_k.CostTable((auto_k.StepCosts({1: 7.0}, {1: {2: 8.5}}, {1: 0.8}, prefix=64),))
  secs = {"ar": [9.0, 0.40, 0.50, 0.45], "sd": [9.0, 0.30, 0.32, 0.31], "ssd": [9.0, 0.25, 0.20, 0.24]}
  calls = []

  def decode(mode):
    calls.append(mode)
    return secs[mode][calls.count(mode) - 1], 48, 48 if mode == "ar" else 31

  out = step_cost.measure_host(table, decode, prefix=64, repeats=3, log=lambda m: None, modes=("ar", "sd", "ssd"))
  assert calls == ["ar", "sd", "ssd"] * 4
  assert out.modes_tok_s == pytest.approx({"ar": 48 / 0.45, "sd": 48 / 0.31, "ssd": 48 / 0.24}, abs=0.01)
  assert auto_k.CostTable.from_json(out.to_json()) == out
  calls.clear()
  assert step_cost.measure_host(table, decode, prefix=64, repeats=1, log=lambda m: None).modes_tok_s.keys() == {
      "ar", "sd"}


def test_calibration_decodes_measure_the_loop_of_a_real_pipeline(tmp_path, monkeypatch):
  """bench.py's host decoder on the tiny pair: AR and SD at K=1 decode the fixed prompt, and the loop's time per AR
  token and SD round comes out finite and smaller than a whole token's or round's time."""
  from ssd_jax.cli import bench_machine
  monkeypatch.setenv("SSD_JAX_STEP_COSTS", str(tmp_path / "step_costs"))
  pipe = api.load_tiny()
  decode = bench_machine.host_decoder(pipe, 12)
  seconds, new, forwards = decode("sd")
  assert new == 12 and 1 < forwards <= 12 and seconds > 0
  steps = auto_k.CostTable((auto_k.StepCosts({1: 0.0}, {1: {2: 0.0}}, {1: 0.0}, prefix=64),))
  out = step_cost.measure_host(steps, decode, prefix=64, repeats=1, log=lambda m: None)
  assert 0 < out.host_ms["ar"] < 1e3 and 0 < out.host_ms["round"] < 1e3


def test_acceptance_reads_the_calibration_at_the_nearest_temperature():
  """The draft's per-token acceptance for a run: its fan-out calibration's a at the temperature nearest the run's
  (ties to the first listed), the default without a calibration."""
  cal = {0.0: (0.55, 0.3), 0.7: (0.45, 0.4), 1.0: (0.40, 0.5)}
  got = [auto_k.acceptance(cal, t) for t in (0.0, 0.3, 0.36, 0.8, 0.9, 5.0)]
  assert got == [0.55, 0.55, 0.45, 0.45, 0.40, 0.40]
  assert auto_k.acceptance(None, 0.7) == 0.5 and auto_k.acceptance({}, 0.7, default=0.3) == 0.3
  assert isinstance(auto_k.acceptance({0.0: (1, 0)}, 0.0), float)


def test_choose_k_reads_each_batchs_own_costs():
  """AR and verify costs that differ by batch: at batch 1 a verify costs about an AR step (K >= 2 pays), at batch 4
  it costs 1.7-3.8 steps (no K pays: AR); batch 2 reads costs a third of the way between (K=1 gains too little),
  batch 8 batch 4's scaled.
  A choice that read batch 1's costs everywhere would speculate at every batch."""
  c = auto_k.StepCosts(ar_ms={1: 10.0, 4: 20.0},
                       verify_ms={1: {2: 10.5, 3: 11.0, 4: 11.5, 5: 12.0}, 4: {2: 34.0, 3: 48.0, 4: 62.0, 5: 76.0}},
                       draft_ms={1: 0.5, 4: 1.0})
  assert auto_k.choose_k(c, 1, 0.6) >= 2 and [auto_k.choose_k(c, b, 0.6) for b in (2, 4, 8)] == [0, 0, 0]
  ar2, v2, d2 = c.at(2)
  assert (ar2, v2[2], d2) == pytest.approx((10 + 10 / 3, 10.5 + 23.5 / 3, 0.5 + 0.5 / 3))
  # batch 2: K=1 gains 4%, under the 10% a K must beat AR by; batch 4: K=1 loses
  assert auto_k.sd_speedup(c, 1, 2, 0.6) > 1.4 and 1.0 < auto_k.sd_speedup(c, 2, 1, 0.6) < auto_k.MARGIN
  assert auto_k.sd_speedup(c, 4, 1, 0.6) < 1.0
