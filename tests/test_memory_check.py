"""The memory check load() and decode.py make (ssd_jax/memory_check.py) sizes the params in the dtype and format they
will have (dtype, weights int8 or a GGUF's blocks, the draft's q8_0 blocks and cut head, from the files' headers:
nothing is read or converted to size them) and the KV cache in kv_dtype: it refuses a float32 model that does not fit
and passes the same model in bfloat16 or int8."""

import jax
import numpy as np
import pytest

from ssd_jax import api, memory_check
from ssd_jax.decode import SpecOptions
from ssd_jax.memory_check import kv_cache_bytes, param_bytes
from ssd_jax.models import checkpoints, draft_weights, drafts, model, quant
from ssd_jax.models.config import tiny_config
from ssd_jax.models.kv_cache import KVCache
from ssd_jax.models.named_configs import named_config, write_random_hf
from ssd_jax.preflight import LoadPlan
from ssd_jax.settings import LoadSettings
from ssd_jax.sharding import make_placement


@pytest.mark.parametrize("dtype,weights", [("float32", "full"), ("bfloat16", "full"), ("bfloat16", "int8")])
@pytest.mark.parametrize("tp", [1, 4])
def test_param_bytes_are_what_the_placed_arrays_hold(dtype, weights, tp):
  cfg = tiny_config(vocab_size=260, tie_embeddings=False, n_heads=4, n_kv_heads=2)
  params = quant.quantize_params(checkpoints.cast_params(model.init_params(jax.random.key(0), cfg), dtype), weights)
  placed = make_placement(tp, 0).shard_target(params, cfg)
  dev = jax.devices()[0]
  on_dev = sum(s.data.nbytes for x in jax.tree.leaves(placed) for s in x.addressable_shards if s.device == dev)
  assert param_bytes(cfg, np.dtype(jax.numpy.dtype(dtype)), weights, tp) == on_dev


def test_kv_cache_bytes_are_the_caches():
  cfg = tiny_config(vocab_size=64)
  cache = KVCache.init(cfg, 3, 256, jax.numpy.bfloat16)
  assert kv_cache_bytes(cfg, 3, 256, jax.numpy.bfloat16) == cache.nbytes()
  assert kv_cache_bytes(cfg, 3, 256, np.float32) == 2 * cache.nbytes()


def _check(monkeypatch, available, target, mode="ar", draft=None, backend="cpu", batch=1, max_new=8, spec=None,
           **settings):
  """Runs the check of prepare(target, draft, **settings) for a run of one short prompt with `available` bytes free
  and JAX's backend taken to be `backend`."""
  monkeypatch.setattr(memory_check, "available_memory", lambda device=None: available)
  plan = api.prepare(target, draft, **settings)
  monkeypatch.setattr(jax, "default_backend", lambda: backend)
  try:
    plan.check_memory(api.Run(mode, batch, 10, max_new, spec or SpecOptions(k=3, fan_out=4)))
  finally:
    monkeypatch.undo()


def test_check_refuses_what_does_not_fit_and_passes_16_bit_and_int8_that_do(tmp_path, monkeypatch):
  cfg = named_config("llama-3.1-70b", n_layers=2, d_model=256, ffn_dim=1024, n_heads=8, n_kv_heads=2, head_dim=32,
                     vocab_size=512)
  write_random_hf(str(tmp_path), cfg)
  f32, bf16, int8 = (param_bytes(cfg, dt, w) for dt, w in ((np.float32, "full"), (jax.numpy.bfloat16, "full"),
                                                           (jax.numpy.bfloat16, "int8")))
  assert int8 < bf16 < f32

  def check(available, **settings):
    _check(monkeypatch, available, str(tmp_path), draft_devices=0, **settings)

  check((bf16 + f32) // 2, dtype="bfloat16")  # fits in 16 bits
  with pytest.raises(ValueError, match=f"target params {f32 / 2**20:.1f} MiB"):  # the same model in float32 does not
    check((bf16 + f32) // 2, dtype="float32")
  with pytest.raises(ValueError, match="needs an estimated"):
    check((bf16 + f32) // 2)  # 'auto' on a CPU is float32
  check((int8 + bf16) // 2, dtype="bfloat16", weights="int8")
  with pytest.raises(ValueError):
    check((int8 + bf16) // 2, dtype="bfloat16")
  with pytest.raises(ValueError, match="target KV cache"):  # a float32 cache of 60k slots does not fit where bf16 params do
    _check(monkeypatch, (bf16 + f32) // 2, str(tmp_path), max_new=60000, draft_devices=0, dtype="bfloat16",
           kv_dtype="float32")
  check(None, dtype="float32")  # unknown available memory: no check


def test_ssd_counts_the_draft_side_where_it_lives(tmp_path, monkeypatch):
  """On a CPU the target, draft and speculation cache share the host; on an accelerator the draft's side is checked
  on its own device."""
  small = dict(n_layers=2, n_heads=8, n_kv_heads=2, head_dim=32, vocab_size=512)
  (tmp_path / "t").mkdir()
  (tmp_path / "d").mkdir()
  write_random_hf(str(tmp_path / "t"), named_config("llama-3.1-70b", d_model=256, ffn_dim=1024, **small))
  write_random_hf(str(tmp_path / "d"), named_config("llama-3.2-1b", d_model=128, ffn_dim=256, **small))
  run = api.Run("ssd", 1, 10, 8, SpecOptions(k=3, fan_out=4))
  t, d = memory_check.parts(api.prepare(str(tmp_path / "t"), str(tmp_path / "d"), dtype="bfloat16"), run)
  assert set(t) == {"target params", "target KV cache"}
  assert set(d) == {"draft params", "draft KV cache", "speculation cache"}
  target, draft = sum(t.values()), sum(d.values())
  assert target > draft > d["speculation cache"] > 0

  def check(available, backend):
    _check(monkeypatch, available, str(tmp_path / "t"), "ssd", str(tmp_path / "d"), backend, dtype="bfloat16")
  check(target + draft, "cpu")
  with pytest.raises(ValueError, match="speculation cache"):  # every part named
    check(target + draft - 1, "cpu")
  check(target, "gpu")  # each side fits its own device
  with pytest.raises(ValueError, match="on the host"):
    check(target, "cpu")  # but not the host together
  with pytest.raises(ValueError, match="the target's first device"):
    check(draft, "gpu")


def _held_bytes(params) -> int:
  return sum(x.nbytes for x in jax.tree.leaves(params))


def _draft_plan(path, head_vocab=None, **settings):
  """A LoadPlan of the draft at `path` (the target: the same model, so that parts() needs nothing else)."""
  return LoadPlan(path, LoadSettings(**settings), None, path, drafts.read_vocab(path)[0], head_vocab)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("fmt", ["full", "q8_0", "auto"])
def test_the_shipped_draft_is_sized_as_it_is_held(dtype, fmt):
  """The shipped draft (bfloat16 on disk; 'auto' is q8_0 on a CPU: its matrices and tied head in Q8_0 blocks, about
  a quarter of its float32 bytes) is sized as load_prepared holds it: loaded, then put in draft_weights' format."""
  path = checkpoints.resolve_model_dir(checkpoints.DEFAULT_DRAFT_NAME)
  cfg, params = drafts.load_draft(path, drafts.read_vocab(path)[0], dtype=dtype)
  held = _held_bytes(draft_weights.quantize_draft(cfg, params, fmt))
  assert memory_check.parts(_draft_plan(path, dtype=dtype, draft_weights=fmt))[1] == {"draft params": held}


@pytest.mark.parametrize("fmt", ["full", "q8_0"])
def test_a_cut_head_is_sized_as_it_is_held(tmp_path, fmt):
  """A full-vocabulary draft whose head load() cuts to draft_head_vocab rows holds the whole embedding, an untied head
  of those rows (q8_0: in blocks) and the token tables."""
  write_random_hf(str(tmp_path), named_config("llama-3.2-1b", n_layers=2, d_model=64, ffn_dim=128, n_heads=4,
                                              n_kv_heads=2, head_dim=16, vocab_size=512))
  cfg, params = drafts.load_draft(str(tmp_path), drafts.read_vocab(str(tmp_path))[0], head_vocab=96,
                                  dtype="float32")
  held = _held_bytes(draft_weights.quantize_draft(cfg, params, fmt))
  plan = _draft_plan(str(tmp_path), 96, dtype="float32", draft_weights=fmt)
  assert memory_check.parts(plan)[1] == {"draft params": held}
  # Apart from how either side computes it: the embedding is whole, the token tables are there, and each head row
  # the estimate adds costs a float32 row of d=64 (Q8_0: two blocks of 32 values in 34 bytes each) and its head id.
  assert params["embed"].shape == (512, 64) and params["head_ids"].shape == (96,)
  assert params["vocab_map"].shape == (512,)
  est = lambda n: memory_check.parts(_draft_plan(str(tmp_path), n, dtype="float32", draft_weights=fmt))[1]  # noqa
  row = 64 * 4 if fmt == "full" else 2 * 34
  assert est(200)["draft params"] - est(96)["draft params"] == (200 - 96) * (row + 4)


@pytest.mark.parametrize("mode,sd_chunk,ar_chunk", [("ar", 1, 4), ("ar", 1, 1), ("sd", 8, 4), ("sd", 1, 4),
                                                  ("sd", 3, 4), ("ssd", 1, 4)])
def test_the_sizers_lookaheads_are_the_decoders(tiny_pair, mode, sd_chunk, ar_chunk, monkeypatch):
  """decode.base.run_lookaheads (the slots past the text that decode.py's check and scripts/plan.py size caches
  with, memory_check.run_slots) is what the decoders ask decode.base.cache_slots for, target and draft, read as
  they set a run up: each passes it the run's own K, chunks and fan-out."""
  from ssd_jax.decode import ARDecoder, DecodeOptions, SDDecoder, SSDDecoder, rounds, speculator, tree_draft
  from ssd_jax.decode.base import run_lookaheads

  cfg, tp = tiny_pair
  k, f = (0 if mode == "ar" else 2), (2, 1, 1)
  asked = {}

  def recorder(side):
    def cache_slots(max_prompt, max_new, lookahead=0):
      asked[side] = lookahead
      if side == "target":  # the draft side prepared first: nothing left to read
        raise _Stop()
      return 128
    return cache_slots

  monkeypatch.setattr(rounds, "cache_slots", recorder("target"))
  monkeypatch.setattr(speculator, "cache_slots", recorder("draft"))
  monkeypatch.setattr(tree_draft, "cache_slots", recorder("draft"))
  dec = {"ar": lambda: ARDecoder(cfg, tp), "sd": lambda: SDDecoder(cfg, tp, cfg, tp, SpecOptions(k=k)),
         "ssd": lambda: SSDDecoder(cfg, tp, cfg, tp, SpecOptions(k=k, fan_out=f, placement="devices"))}[mode]()
  with pytest.raises(_Stop):
    dec.generate([[1, 2, 3]], DecodeOptions(max_new_tokens=9, sd_chunk=sd_chunk, ar_chunk=ar_chunk))
  want = run_lookaheads(k, f if mode == "ssd" else None, sd_chunk, ar_chunk)
  assert asked["target"] == want[0] and asked.get("draft", want[1]) == want[1], (asked, want)
  assert mode == "ar" or "draft" in asked


class _Stop(Exception):
  pass
