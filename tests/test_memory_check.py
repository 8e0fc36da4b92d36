"""decode.py's memory check sizes the params in the dtype they will have (--dtype, --quantize int8) and the KV cache
in --kv-dtype: it refuses a float32 model that does not fit and passes the same model in bfloat16 or int8."""

import jax
import numpy as np
import pytest

from ssd_jax import checkpoints, model, quant
from ssd_jax.cli_util import UsageError, kv_cache_bytes, param_bytes
from ssd_jax.config import tiny_config
from ssd_jax.kv_cache import KVCache
from ssd_jax.named_configs import named_config, write_random_hf
from ssd_jax.sharding import make_placement
from script_modules import load_script



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


@pytest.fixture(scope="module")
def decode_script():
  return load_script("decode.py", "decode_script")


def test_check_refuses_what_does_not_fit_and_passes_16_bit_and_int8_that_do(tmp_path, decode_script, monkeypatch):
  cfg = named_config("llama-3.1-70b", n_layers=2, d_model=256, ffn_dim=1024, n_heads=8, n_kv_heads=2, head_dim=32,
                     vocab_size=512)
  write_random_hf(str(tmp_path), cfg)
  f32, bf16, int8 = (param_bytes(cfg, dt, w) for dt, w in ((np.float32, "full"), (jax.numpy.bfloat16, "full"),
                                                           (jax.numpy.bfloat16, "int8")))
  assert int8 < bf16 < f32

  def check(available, *flags):
    monkeypatch.setattr(decode_script, "available_memory", lambda device=None: available)
    args = decode_script.parse_args(["--target", str(tmp_path), "--draft", "none", "--prompt", "Hi",
                                     "--max-new-tokens", "8", *flags])
    decode_script.model_memory(args, "ar", None, ["Hi"], (), make_placement(1, 0), "cpu")

  check((bf16 + f32) // 2, "--dtype", "bfloat16")  # fits in 16 bits
  with pytest.raises(UsageError, match=f"target params {f32 / 2**20:.1f} MiB"):  # the same model in float32 does not
    check((bf16 + f32) // 2, "--dtype", "float32")
  with pytest.raises(UsageError, match="needs an estimated"):
    check((bf16 + f32) // 2)  # 'auto' on a CPU is float32
  check((int8 + bf16) // 2, "--dtype", "bfloat16", "--quantize", "int8")
  with pytest.raises(UsageError):
    check((int8 + bf16) // 2, "--dtype", "bfloat16")
  with pytest.raises(UsageError):  # a float32 KV cache of 60k slots does not fit where the bf16 params do
    check((bf16 + f32) // 2, "--dtype", "bfloat16", "--max-new-tokens", "60000", "--kv-dtype", "float32")
  check(None, "--dtype", "float32")  # unknown available memory: no check


def test_ssd_counts_the_draft_side_where_it_lives(tmp_path, decode_script, monkeypatch):
  """On a CPU the target, draft and speculation cache share the host; on an accelerator the draft's side is checked
  on its own device."""
  small = dict(n_layers=2, n_heads=8, n_kv_heads=2, head_dim=32, vocab_size=512)
  (tmp_path / "t").mkdir()
  (tmp_path / "d").mkdir()
  write_random_hf(str(tmp_path / "t"), named_config("llama-3.1-70b", d_model=256, ffn_dim=1024, **small))
  write_random_hf(str(tmp_path / "d"), named_config("llama-3.2-1b", d_model=128, ffn_dim=256, **small))
  seen = []

  def run(available, backend):
    monkeypatch.setattr(decode_script, "available_memory", lambda device=None: available)
    args = decode_script.parse_args(["--target", str(tmp_path / "t"), "--draft", str(tmp_path / "d"), "--prompt",
                                     "Hi", "--k", "3", "--fan-out", "4", "--dtype", "bfloat16"])
    decode_script.check_args(args)
    try:
      decode_script.model_memory(args, "ssd", str(tmp_path / "d"), ["Hi"], (4,) * 4, make_placement(1, 1), backend)
    except UsageError as e:
      seen.append(str(e))
      raise
  with pytest.raises(UsageError, match="speculation cache"):
    run(1, "cpu")
  parts = dict(p.rsplit(" ", 2)[:2] for p in seen[-1].split("(")[1].split(")")[0].split(", "))
  mib = {k: float(v) * 2**20 for k, v in parts.items()}  # every part of this small pair is in MiB
  target = mib["target params"] + mib["target KV cache"]
  draft = mib["draft params"] + mib["draft KV cache"] + mib["speculation cache"]
  assert target > draft > 0
  run(int(target + draft) + 2**18, "cpu")
  run(int(target) + 2**18, "gpu")  # each side fits its own device
  with pytest.raises(UsageError, match="on the host"):
    run(int(target) + 2**18, "cpu")  # but not the host together
  with pytest.raises(UsageError, match="the target's first device"):
    run(int(draft) + 2**18, "gpu")
