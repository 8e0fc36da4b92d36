import numpy as np
import pytest

from ssd_jax.theory import fan_out


@pytest.mark.parametrize("a_p,r,k,budget", [(0.8, 1.0, 7, 24), (0.6, 1.0, 7, 24), (0.9, 0.5, 4, 15), (0.3, 2.0, 3, 12)])
def test_geometric_matches_closed_form_and_budget(a_p, r, k, budget):
  f = fan_out.geometric_fan_out(k, budget, a_p, r)
  assert sum(f) == budget and len(f) == k + 1 and min(f) >= 0
  # Closed form (paper Theorem 12), written out independently of the implementation.
  e = 1 / (1 + r)
  denom = sum(a_p ** (j * e) for j in range(k)) + a_p ** (k * e) * (1 - a_p) ** (-e)
  f0 = budget / denom
  real = [f0 * a_p ** (j * e) for j in range(k)] + [f0 * a_p ** (k * e) * (1 - a_p) ** (-e)]
  assert np.allclose(sum(real), budget)
  assert all(abs(a - b) < 1 for a, b in zip(f, real))  # rounding moves each by less than one


def test_worked_example_from_the_algorithm_notes():
  w = fan_out.geometric_weights(7, 0.8, 1.0)
  real = 24 * w / w.sum()
  np.testing.assert_allclose(real, [3.90, 3.49, 3.12, 2.79, 2.49, 2.23, 2.00, 3.99], atol=0.01)


def test_parse_and_errors():
  assert fan_out.parse_fan_out("3", 2) == (3, 3, 3)
  assert fan_out.parse_fan_out("4,2,0", 2) == (4, 2, 0)
  for bad in ("x", "1,2", "0", "-1,2,3"):
    with pytest.raises(ValueError):
      fan_out.parse_fan_out(bad, 2)
  with pytest.raises(ValueError):
    fan_out.geometric_fan_out(3, 10, 1.2, 1.0)


def test_fan_out_counts_at_below_and_above_their_bounds():
  """A list needs K+1 counts (K and K+2 refused), each at least 0 (-1 refused), summing to at least 1: a tree of one
  branch is taken, one of none refused. A uniform F needs at least 1; a geometric budget too, and spends it exactly."""
  assert fan_out.parse_fan_out("0,0,1", 2) == (0, 0, 1) and fan_out.parse_fan_out("1,0,0", 2) == (1, 0, 0)
  assert fan_out.parse_fan_out("1", 2) == (1, 1, 1)
  for bad in ("0,0,0", "0,1", "0,0,1,0", "1,-1,1", "0"):
    with pytest.raises(ValueError):
      fan_out.parse_fan_out(bad, 2)
  for budget in (1, 2):
    got = fan_out.geometric_fan_out(3, budget, 0.8, 1.0)
    assert len(got) == 4 and sum(got) == budget and min(got) >= 0, got
  with pytest.raises(ValueError, match="budget"):
    fan_out.geometric_fan_out(3, 0, 0.8, 1.0)


def test_fit_power_law_recovers_exponent():
  rng = np.random.default_rng(0)
  for r in (0.5, 1.0, 2.0):
    u = rng.uniform(size=200_000)
    ranks = np.ceil(u ** (-1 / r))  # P(rank > F) = P(u^(-1/r) > F) = F^-r for integer F
    got, c, miss = fan_out.fit_power_law(ranks)
    assert abs(got - r) < 0.08 * r and abs(c - 1) < 0.15


def test_calibrated_geometric_reads_nearest_temperature(tmp_path):
  import json
  f = tmp_path / "cal.json"
  f.write_text(json.dumps({"0": {"a_p": 0.8, "r": 1.0}, "1": {"a_p": 0.6, "r": 1.0}}))
  assert fan_out.calibrated_geometric(str(f), 7, 24, 0.1) == fan_out.geometric_fan_out(7, 24, 0.8, 1.0)
  assert fan_out.calibrated_geometric(str(f), 7, 24, 0.9) == fan_out.geometric_fan_out(7, 24, 0.6, 1.0)
  with pytest.raises(ValueError, match="calibrate_fan_out"):
    fan_out.calibrated_geometric(str(tmp_path / "none.json"), 7, 24, 0.0)


@pytest.mark.parametrize("content,msg", [
    ("[1, 2]", "holds no calibration"),
    ("{}", "holds no calibration"),
    ('{"0": 5}', "entry '0' is not"),
    ('{"0": {"r": 1.0}}', "entry '0' is not"),
    ('{"0": {"a_p": "high", "r": 1.0}}', "entry '0' is not"),
    ('{"warm": {"a_p": 0.5, "r": 1.0}}', "entry 'warm' is not"),
    ('{"0": {"a_p": 1.5, "r": 1.0}}', "needs [0, 1]"),
    ('{"0": {"a_p": 0.5, "r": NaN}}', "needs > 0"),
    ("{not json", "cannot read the fan-out calibration"),
])
def test_calibration_of_the_wrong_shape_is_one_value_error(tmp_path, content, msg):
  """A calibration file that is not {temperature: {a_p, r, ...}} fails with one line naming the file, never with a
  KeyError or TypeError from inside."""
  f = tmp_path / "fan_out_calibration.json"
  f.write_text(content)
  with pytest.raises(ValueError) as e:
    fan_out.calibrated_geometric(str(f), 2, 9, 0.0)
  assert msg in str(e.value) and str(f) in str(e.value) and "\n" not in str(e.value)


def test_calibration_keeps_an_infinite_exponent(tmp_path):
  """fit_power_law returns r = inf when the draft (almost) never misses; json writes it as Infinity."""
  f = tmp_path / "fan_out_calibration.json"
  f.write_text('{"0": {"a_p": 0.5, "r": Infinity}}')
  assert fan_out.read_calibration(str(f)) == {0.0: (0.5, float("inf"))}
  assert sum(fan_out.calibrated_geometric(str(f), 2, 9, 0.0)) == 9


def test_pipeline_reads_geometric_fan_out_from_the_draft_calibration(tmp_path):
  """generate(fan_out_strategy='geometric') from Python: the tree gets the Theorem 12 allocation of F*(K+1) from
  the calibration beside the draft, and greedy SSD output still equals AR; no calibration is a clear error."""
  import json

  from ssd_jax import api
  pipe = api.load_tiny()
  (tmp_path / fan_out.CALIBRATION_FILE).write_text(json.dumps({"0": {"a_p": 0.9, "r": 0.5}}))
  pipe.draft.path = str(tmp_path)
  g = pipe.generate("Say hi.", mode="ssd", max_new_tokens=8, ignore_eos=True, k=3, fan_out=2,
                    fan_out_strategy="geometric")[0]
  want = fan_out.geometric_fan_out(3, 8, 0.9, 0.5)
  assert want != (2, 2, 2, 2) and tuple(g.stats["fan_out"]) == want and g.stats["fan_out_strategy"] == "geometric"
  assert g.token_ids == pipe.generate("Say hi.", mode="ar", max_new_tokens=8, ignore_eos=True)[0].token_ids
  pipe.draft.path = str(tmp_path / "elsewhere")
  with pytest.raises(ValueError, match="calibrate_fan_out"):
    pipe.generate("Say hi.", mode="ssd", max_new_tokens=8, k=2, fan_out=2, fan_out_strategy="geometric")
