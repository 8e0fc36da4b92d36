"""AR decoding on tiny models: greedy vs reference, sampling determinism, no recompilation, input errors."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ssd_jax.decode import sampling
from ssd_jax.models import model
from ssd_jax.decode import ARDecoder, DecodeOptions


def _greedy_reference(params, cfg, prompt, n):
  seq = list(prompt)
  for _ in range(n):
    logits = model.forward_full(params, jnp.asarray([seq]), cfg)
    seq.append(int(jnp.argmax(logits[0, -1])))
  return seq[len(prompt):]


def test_greedy_matches_full_forward_argmax(tiny_pair):
  cfg, params = tiny_pair
  prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11]]
  res = ARDecoder(cfg, params).generate(prompts, DecodeOptions(max_new_tokens=8, ignore_eos=True))
  for p, r in zip(prompts, res):
    assert r.token_ids == _greedy_reference(params, cfg, p, 8)
    assert r.stats.new_tokens == 8 and r.stats.target_forwards == 8


def test_eos_stops_row_but_not_others(tiny_pair):
  cfg, params = tiny_pair
  prompts = [[1, 2, 3], [4, 5, 6, 7]]
  ref = [_greedy_reference(params, cfg, p, 6) for p in prompts]
  eos = ref[0][2]  # make the first row's third token the EOS
  res = ARDecoder(cfg, params).generate(prompts, DecodeOptions(max_new_tokens=6, eos_id=eos))
  assert res[0].token_ids == ref[0][: ref[0].index(eos) + 1]
  cut = ref[1].index(eos) + 1 if eos in ref[1] else 6
  assert res[1].token_ids == ref[1][:cut]


def test_prompt_and_cache_buckets_at_below_and_above_their_bounds():
  """Prompts pad to a multiple of 64 tokens and caches round up to 128 slots (a few programs serve every length): a
  length at a multiple keeps it, one more takes the next. The padded rows hold their prompts and zeros; a cache holds
  the padded prompt (the prefill writes all of it) and the text with its lookahead."""
  from ssd_jax.decode.base import PROMPT_BUCKET, cache_slots, pad_prompts
  from ssd_jax.models.kv_cache import round_slots

  assert PROMPT_BUCKET == 64
  for n, want in ((1, 128), (127, 128), (128, 128), (129, 256), (255, 256), (256, 256), (257, 384)):
    assert round_slots(n) == want, n
  for longest, width in ((63, 64), (64, 64), (65, 128), (127, 128), (128, 128), (129, 192)):
    prompts = [list(range(1, longest + 1)), [7, 8]]
    tokens, lengths = pad_prompts(prompts)
    assert tokens.shape == (2, width) and lengths.tolist() == [longest, 2], longest
    assert tokens[0, :longest].tolist() == prompts[0] and tokens[1, :2].tolist() == [7, 8]
    assert not tokens[0, longest:].any() and not tokens[1, 2:].any()
    assert cache_slots(longest, 1) >= width, longest
  for ahead, want in ((17, 128), (18, 128), (19, 256)):  # 10 + 100 + ahead: 127, 128, 129 slots needed
    assert cache_slots(10, 100, ahead) == want, ahead


def test_eos_ids_normalised_and_checked():
  assert DecodeOptions(eos_id=(9, 2, 9)).eos_id == (2, 9) == DecodeOptions(eos_id=[9, 2]).eos_id
  assert DecodeOptions(eos_id={9, 2}).eos_id == (2, 9) == DecodeOptions(eos_id=np.array([9, 2])).eos_id
  assert DecodeOptions(eos_id=np.int32(4)).eos_id == (4,) == DecodeOptions(eos_id=np.array(4)).eos_id
  assert DecodeOptions(eos_id=5).stop_ids == {5} and DecodeOptions(eos_id=5, ignore_eos=True).stop_ids == set()
  assert DecodeOptions(eos_id=(3, 7)).cut_at_stop([1, 7, 3, 2]) == ([1, 7], True)
  assert DecodeOptions(eos_id=(3, 7)).cut_at_stop([1, 2]) == ([1, 2], False)
  for bad in (-1, "2", (1, 2.5), True, 2.0):
    with pytest.raises(ValueError, match="eos_id"):
      DecodeOptions(eos_id=bad)


def test_sampling_deterministic_under_seed(tiny_pair):
  cfg, params = tiny_pair
  dec = ARDecoder(cfg, params)
  run = lambda seed: [r.token_ids for r in dec.generate(
      [[1, 2], [3, 4, 5]], DecodeOptions(max_new_tokens=16, temperature=1.0, seed=seed, ignore_eos=True))]
  a, b, c = run(0), run(0), run(1)
  assert a == b
  assert a != c


def test_no_recompilation_across_decode_steps_and_calls(tiny_pair):
  cfg, params = tiny_pair
  dec = ARDecoder(cfg, params)
  opts = DecodeOptions(max_new_tokens=20, temperature=0.8, ignore_eos=True)
  dec.generate([[1, 2, 3], [4, 5]], opts)
  n = dec.programs.compiles
  assert n == 3  # prefill, first-token sampling, one decode step: the same program for all 19 steps
  # Other lengths in the same bucket, another temperature and seed: nothing new to compile, neither in our
  # program cache nor anywhere in JAX (counted through JAX's own compile events).
  events = []
  jax.monitoring.register_event_duration_secs_listener(
      lambda name, *a, **k: events.append(name) if name.endswith("backend_compile_duration") else None)
  dec.generate([[1, 2, 3, 4, 5, 6], [7]], DecodeOptions(max_new_tokens=20, temperature=0.3, seed=5, ignore_eos=True))
  assert dec.programs.compiles == n
  assert events == []


def test_program_keys_follow_each_arrays_shape_and_placement_and_forget_dead_arrays():
  """Programs keeps each argument array's key while the array lives (the params: the same arrays every call); a new
  array of another shape or device is keyed afresh, one of the same finds the same program, and a dead array's entry
  goes (a later array at its id is not mistaken for it)."""
  from ssd_jax.decode.base import Programs
  run, f = Programs(), jax.jit(lambda p, x: p["w"] * x)
  p = {"w": jnp.ones((3,))}
  assert np.asarray(run(f, p, jnp.ones((3,)))).tolist() == [1, 1, 1]
  assert run(f, p, jnp.full((3,), 2.0)).tolist() == [2, 2, 2] and run.compiles == 1
  assert run(f, {"w": jnp.ones((4,))}, jnp.ones((4,))).shape == (4,) and run.compiles == 2
  run(f, p, np.ones(3, np.float32))  # a host array: keyed without a placement, then found again
  run(f, p, np.zeros(3, np.float32))
  assert run.compiles == 3
  if len(jax.devices()) > 1:
    run(f, jax.device_put(p, jax.devices()[1]), jax.device_put(jnp.ones((3,)), jax.devices()[1]))
    assert run.compiles == 4
  n = run.compiles
  for _ in range(20):  # transient arrays of alternating shapes (ids reused): their entries die with them
    assert run(f, {"w": jnp.ones((3,))}, jnp.ones((3,))).shape == (3,)
    assert run(f, {"w": jnp.ones((4,))}, jnp.ones((4,))).shape == (4,)
  assert run.compiles == n and len(run._leaves) <= 4


def test_stable_arguments_are_keyed_once_and_a_changed_one_is_looked_up_in_full(monkeypatch):
  """Programs(stable=n): after a program ran, the first n arguments are not keyed again (the per-step saving); a
  stable argument whose shape or device changed after all is refused by that program and looked up in full, with
  the right result and its own compile."""
  from ssd_jax.decode.base import Programs
  run, f = Programs(), jax.jit(lambda p, x: p["w"].sum() * x)
  p, x = {"w": jnp.ones((3,))}, jnp.ones((2,))
  assert run(f, p, x, stable=1).tolist() == [3, 3] and run.compiles == 1
  keyed = []
  leaf_key = run._leaf_key
  monkeypatch.setattr(run, "_leaf_key", lambda a: keyed.append(a) or leaf_key(a))
  assert run(f, p, jnp.full((2,), 2.0), stable=1).tolist() == [6, 6] and keyed == [] and run.compiles == 1
  assert run(f, {"w": jnp.ones((5,))}, x, stable=1).tolist() == [5, 5] and run.compiles == 2
  assert len(keyed) == 2  # the changed call was keyed in full: the params' leaf and x
  if len(jax.devices()) > 1:
    q = jax.device_put({"w": jnp.ones((5,))}, jax.devices()[1])
    assert run(f, q, jax.device_put(x, jax.devices()[1]), stable=1).tolist() == [5, 5] and run.compiles == 3


def test_bad_options_are_clear_errors(tiny_pair):
  cfg, params = tiny_pair
  dec = ARDecoder(cfg, params)
  with pytest.raises(ValueError, match="max_new_tokens"):
    dec.generate([[1]], DecodeOptions(max_new_tokens=0))
  with pytest.raises(ValueError, match="empty prompt"):
    dec.generate([[]], DecodeOptions())
  with pytest.raises(ValueError, match="context"):
    dec.generate([[1] * 500], DecodeOptions(max_new_tokens=100))


def test_top_p_keeps_smallest_nucleus():
  logits = jnp.log(jnp.asarray([[0.5, 0.3, 0.15, 0.05]]))
  p = np.asarray(sampling.processed_probs(logits, 1.0, 0.7))[0]
  np.testing.assert_allclose(p, [0.5 / 0.8, 0.3 / 0.8, 0, 0], atol=1e-6)
  p = np.asarray(sampling.processed_probs(logits, 1.0, 0.8))[0]  # mass before token 2 is 0.8: not kept
  np.testing.assert_allclose(p, [0.5 / 0.8, 0.3 / 0.8, 0, 0], atol=1e-6)
  g = np.asarray(sampling.processed_probs(logits, 0.0, 0.5))[0]
  np.testing.assert_array_equal(g, [1, 0, 0, 0])


def test_temperature_sampling_frequencies():
  logits = jnp.log(jnp.asarray([0.6, 0.3, 0.1]))
  keys = jax.random.split(jax.random.key(0), 20000)
  toks = np.asarray(jax.vmap(lambda k: sampling.sample(k, sampling.processed_probs(logits, 1.0, 1.0)))(keys))
  freq = np.bincount(toks, minlength=3) / len(toks)
  np.testing.assert_allclose(freq, [0.6, 0.3, 0.1], atol=0.015)
