"""The options objects: normalised and checked once where they are built; the context check names the prompt."""
import pytest

from ssd_jax.decode import DecodeOptions, SpecOptions
from ssd_jax.decode.options import check_context


def test_spec_options_normalise_every_way_of_giving_the_fan_out():
  a = SpecOptions(k=2, fan_out=3)
  assert a.fan_out == a.fan_out_miss == (3, 3, 3)
  assert SpecOptions(k=2, fan_out="3") == a and SpecOptions(k=2, fan_out=(3, 3, 3)) == a
  assert hash(SpecOptions(k=2, fan_out="3")) == hash(a)  # usable as a key of the pipeline's decoders
  b = SpecOptions(k=2, fan_out="4,3,2", fan_out_miss=[7, 1, 1])
  assert (b.fan_out, b.fan_out_miss) == ((4, 3, 2), (7, 1, 1))
  assert b.fan_outs(None, 0.0) == ((4, 3, 2), (7, 1, 1))


@pytest.mark.parametrize("settings, msg", [
    (dict(k=0), "K"), (dict(k=1.5), "K"), (dict(k=1, fan_out="1,2,3"), "K\\+1 = 2"), (dict(fan_out=0), "fan-out"),
    (dict(k=2, fan_out=(3, 3, 3), fan_out_miss=(3, 3)), "K\\+1 = 3"),
    (dict(k=2, fan_out=3, fan_out_miss=(9, 0, 1)), "same total"), (dict(backup="psychic"), "unknown backup"),
    (dict(saguaro_c=0.0), "Saguaro C"), (dict(placement="cloud"), "unknown SSD placement"),
    (dict(fan_out_strategy="golden"), "unknown fan-out strategy"),
    (dict(k=2, fan_out=(3, 2, 1), fan_out_strategy="geometric"), "single fan-out F")])
def test_spec_options_reject_bad_settings_when_built(settings, msg):
  with pytest.raises(ValueError, match=msg):
    SpecOptions(**settings)


def test_geometric_fan_out_comes_from_the_calibration_at_the_nearest_temperature():
  from ssd_jax.theory.fan_out import geometric_fan_out
  spec = SpecOptions(k=3, fan_out=2, fan_out_strategy="geometric")
  cal = {0.0: (0.9, 0.5), 1.0: (0.3, 2.0)}  # as fan_out.read_calibration returns it
  f, f_miss = spec.fan_outs(cal, 0.2)
  assert f == f_miss == geometric_fan_out(3, 8, 0.9, 0.5) != (2, 2, 2, 2)
  assert spec.fan_outs(cal, 0.8)[0] == geometric_fan_out(3, 8, 0.3, 2.0)
  with pytest.raises(ValueError, match="calibrat"):
    spec.fan_outs(None, 0.0)


def test_decode_options_reject_bad_values_when_built():
  for bad, msg in ((dict(max_new_tokens=0), "max_new_tokens"), (dict(temperature=-1), "temperature"),
                   (dict(temperature=float("nan")), "finite"), (dict(temperature=float("inf")), "finite"),
                   (dict(top_p=0), "top_p"), (dict(top_p=float("nan")), "top_p")):
    with pytest.raises(ValueError, match=msg):
      DecodeOptions(**bad)


def test_context_check_names_the_prompt_and_the_speculation_slots():
  check_context(100, [10, 60], 40)  # fits exactly
  with pytest.raises(ValueError, match="prompt 2 has 61 tokens; with max_new_tokens 40 it exceeds the context"):
    check_context(100, [10, 61], 40)
  with pytest.raises(ValueError, match="K=3 needs 4 cache slots past the text, but prompt 2"):
    check_context(100, [10, 60], 37, k=3)
  check_context(100, [10, 60], 36, k=3)


def test_fan_out_fits_the_drafts_vocabulary_less_the_drafted_token():
  """SSD's fork picks an acceptance length's F guesses from the draft's head less the drafted token: F = V - 1 is
  taken, F = V refused, on a full head (64) and a cut one (40 rows); SD, which forks nothing, takes either."""
  from ssd_jax.decode.options import check_pair
  from ssd_jax.models.config import tiny_config

  target = tiny_config(vocab_size=64)
  for draft in (target, tiny_config(vocab_size=64, head_vocab=40)):
    v = draft.out_vocab
    check_pair(target, draft, SpecOptions(k=2, fan_out=v - 1))
    with pytest.raises(ValueError, match=f"fan-out {v} exceeds the draft's vocabulary"):
      check_pair(target, draft, SpecOptions(k=2, fan_out=v))
    check_pair(target, draft, SpecOptions(k=2, fan_out=v), tree=False)


@pytest.mark.parametrize("setting,value,msg", [
    ("attn_impl", "flash", "unknown attention implementation 'flash'"),
    ("ssd_placement", "cloud", "unknown SSD placement 'cloud'"),
    ("kv_dtype", "float8", "unknown KV cache dtype 'float8'"),
    ("weights", "int4", "unknown weights 'int4'"),
])
def test_load_and_pipeline_refuse_a_bad_setting_alike_before_any_weight(monkeypatch, setting, value, msg):
  """load() checks its settings (LoadSettings) before it reads a weight, and a Pipeline built directly refuses the same
  value with the same line."""
  from ssd_jax import api
  from ssd_jax.models import checkpoints

  def no_read(*args, **kwargs):
    raise AssertionError("a weight was read")
  monkeypatch.setattr(checkpoints, "load_model", no_read)
  with pytest.raises(ValueError, match=msg):
    api.load("nowhere", **{setting: value})
  tiny = api.load_tiny()
  with pytest.raises(ValueError, match=msg):
    api.Pipeline(tiny.target, tiny.tokenizer, **{setting: value})


def test_a_setting_reads_the_same_line_wherever_it_is_caught():
  """Each setting has one check (ssd_jax/settings.py): LoadSettings and the modules that use the value (the attention
  switch, the KV cache, the params' dtype, the placement) refuse a bad value with the same line, from the same tuple."""
  import numpy as np

  from ssd_jax import settings, sharding
  from ssd_jax.kernels import masked_attention
  from ssd_jax.models import checkpoints, kv_cache

  def line(fn, *args, **kwargs):
    with pytest.raises(ValueError) as e:
      fn(*args, **kwargs)
    return str(e.value)
  same = [(dict(attn_impl="flash"), lambda: masked_attention.resolve_impl("flash")),
          (dict(kv_dtype="float8"), lambda: kv_cache.cache_dtype({}, "float8")),
          (dict(dtype="float8"), lambda: checkpoints.param_dtype("float8", np.float32)),
          (dict(target_devices=0), lambda: sharding.make_placement(0, 1)),
          (dict(draft_devices=2), lambda: sharding.make_placement(1, 2))]
  for bad, elsewhere in same:
    assert line(settings.LoadSettings, **bad) == line(elsewhere)
  assert masked_attention.IMPLS is settings.ATTN_IMPLS and kv_cache.KV_DTYPES is settings.KV_DTYPES
  assert checkpoints.DTYPES is settings.DTYPES


def test_one_k_default_which_a_decoder_refuses_in_one_line(tiny_pair):
  """K has one default, 'auto' (chosen per batch), in SpecOptions and in the API's generate alike; a decoder runs
  one K, so one given k='auto' says how to fix it instead of failing deep inside."""
  import inspect

  from ssd_jax import api
  from ssd_jax.decode import SDDecoder, SSDDecoder
  assert SpecOptions().auto
  for fn in (api.Pipeline.generate, api.Pipeline.generate_ids):
    assert inspect.signature(fn).parameters["k"].default == SpecOptions().k
  cfg, tp = tiny_pair
  for decoder in (SDDecoder, SSDDecoder):
    with pytest.raises(ValueError, match=r"runs one K: give SpecOptions\(k=\.\.\.\)"):
      decoder(cfg, tp, cfg, tp, SpecOptions())
