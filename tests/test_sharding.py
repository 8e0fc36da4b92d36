"""Tensor-parallel target mesh and the draft on its own device: same tokens, intended shardings."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from ssd_jax.models import model
from ssd_jax.models.config import tiny_config
from ssd_jax.decode import ARDecoder, DecodeOptions, SDDecoder, SpecOptions, SSDDecoder
from ssd_jax.sharding import CACHE_AXES, cache_spec, make_placement, param_axes, param_specs

from distributed_worker import make_decoder
from pairs import PROMPTS, perturbed

pytestmark = pytest.mark.skipif(len(jax.devices()) < 5, reason="needs 5 devices (XLA_FLAGS in conftest)")


@pytest.fixture(scope="module")
def pair():
  # 4 query / 4 KV heads and FFN 48: everything divides a mesh of 4, so every rule is exercised.
  cfg = tiny_config(vocab_size=64, n_heads=4, n_kv_heads=4)
  tp = model.init_params(jax.random.key(7), cfg, scale=0.3)
  return cfg, tp, perturbed(tp, 0.06, 1)


def _spec(x):
  return x.sharding.spec


def _assert_placed(tree, specs, devices):
  """Every array of `tree` carries the PartitionSpec of `specs` (same structure) over exactly `devices`."""
  got = jax.tree.map(lambda x: x.sharding.spec, tree)
  assert got == specs
  assert all({d.id for d in x.sharding.device_set} == devices for x in jax.tree.leaves(tree))


def test_every_param_has_logical_axes():
  for cfg in (tiny_config(), tiny_config(attn_bias=True, tie_embeddings=False), tiny_config(head_vocab=32),
              tiny_config(qk_norm=True, head_dim=16)):
    shapes = jax.eval_shape(lambda: model.init_params(jax.random.key(0), cfg))
    axes = param_axes(cfg)
    assert jax.tree.structure(shapes) == jax.tree.structure(axes, is_leaf=lambda a: isinstance(a, tuple))
    for sh, ax in zip(jax.tree.leaves(shapes), jax.tree.leaves(axes, is_leaf=lambda a: isinstance(a, tuple))):
      assert len(sh.shape) == len(ax)
  assert len(CACHE_AXES) == 4


def test_params_and_cache_carry_the_intended_shardings(pair):
  cfg, tp, _ = pair
  pl = make_placement(4, 1)
  sp = pl.shard_target(tp, cfg)
  lp = sp["layers"][0]
  assert _spec(lp["wq"]) == P(None, "tp") and _spec(lp["wo"]) == P("tp", None)
  assert _spec(lp["wk"]) == P(None, "tp") and _spec(lp["w_down"]) == P("tp", None)
  assert _spec(sp["embed"]) == P("tp", None)
  _assert_placed(sp, param_specs(cfg, 4), {0, 1, 2, 3})
  # Each device holds a quarter of the query heads: whole heads, never a split head.
  assert lp["wq"].addressable_shards[0].data.shape == (cfg.d_model, cfg.n_heads * cfg.head_dim // 4)
  cache = pl.target_cache(cfg, 2, 64, np.float32)
  for a in cache.k + cache.v:
    assert _spec(a) == P(None, None, "tp", None) and {d.id for d in a.sharding.device_set} == {0, 1, 2, 3}
    assert a.addressable_shards[0].data.shape == (2, 64, cfg.n_kv_heads // 4, cfg.head_dim)
  assert cache.lengths.sharding.is_fully_replicated
  assert pl.draft_device.id == 4


def test_block_weights_are_placed_by_their_logical_axes():
  """GGUF block weights (ssd_jax/models/blocks.py) keep the param axes of the matrix they replace: a layer matrix's
  arrays are [out, in] rows, so wq's output columns split the rows; wo's input axis splits the blocks (2 of them over a
  mesh of 2). The decoded tokens equal the single-device ones."""
  from block_weights import block_params
  cfg = tiny_config(vocab_size=64, d_model=64, n_heads=4, n_kv_heads=4, head_dim=16, ffn_dim=64)
  bp = block_params(model.init_params(jax.random.key(3), cfg, scale=0.3))
  sp = make_placement(2, 1).shard_target(bp, cfg)
  lp = sp["layers"][0]
  assert _spec(lp["wq"].qs) == P("tp", None) and _spec(lp["wq"].d) == P("tp", None)
  assert _spec(lp["wo"].qs) == P(None, "tp") and _spec(lp["wo"].m) == P(None, "tp")
  opts = DecodeOptions(max_new_tokens=6)
  want = [r.token_ids for r in ARDecoder(cfg, bp).generate(PROMPTS, opts)]
  assert [r.token_ids for r in ARDecoder(cfg, bp, placement=make_placement(2, 1)).generate(PROMPTS, opts)] == want


def test_decoders_hold_their_arrays_where_intended(pair):
  cfg, tp, dp = pair
  pl = make_placement(4, 1)
  ssd = SSDDecoder(cfg, tp, cfg, dp, SpecOptions(k=3, fan_out=2), placement=pl)
  _assert_placed(ssd.tparams, param_specs(cfg, 4), {0, 1, 2, 3})
  assert all(x.sharding.device_set == {pl.draft_device} for x in jax.tree.leaves(ssd.dparams))
  # SD's draft is colocated: replicated over the target's devices.
  sd = SDDecoder(cfg, tp, cfg, dp, SpecOptions(k=3), placement=pl)
  assert all(x.sharding.is_fully_replicated and len(x.sharding.device_set) == 4 for x in jax.tree.leaves(sd.dparams))


def test_indivisible_heads_are_replicated():
  cfg = tiny_config(vocab_size=64, n_heads=9, n_kv_heads=3, head_dim=8, d_model=72)  # SmolLM2-like head counts
  specs = param_specs(cfg, 4)
  assert specs["layers"][0]["wq"] == P(None, None) and specs["layers"][0]["wk"] == P(None, None)
  assert specs["layers"][0]["w_gate"] == P(None, "tp")  # FFN 48 splits
  assert cache_spec(cfg, 4) == P(None, None, None, None)
  pl = make_placement(4, 1)
  params = pl.shard_target(model.init_params(jax.random.key(0), cfg), cfg)
  _assert_placed(params, specs, {0, 1, 2, 3})
  cache = pl.target_cache(cfg, 1, 32, np.float32)
  assert all(a.sharding.is_fully_replicated and len(a.sharding.device_set) == 4 for a in cache.k + cache.v)
  assert cache_spec(cfg, 3) == P(None, None, "tp", None)  # 3 KV heads over 3 devices do split


@pytest.mark.parametrize("mode", ["ar", "sd", "ssd"])
def test_sharded_decoding_equals_single_device(pair, mode):
  cfg, tp, dp = pair
  opts = DecodeOptions(max_new_tokens=15, ignore_eos=True)
  want = [r.token_ids for r in ARDecoder(cfg, tp).generate(PROMPTS, opts)]
  res = make_decoder(mode, cfg, tp, dp, make_placement(4, 1)).generate(PROMPTS, opts)
  assert [r.token_ids for r in res] == want
  if mode == "ssd":
    assert res[0].stats.extra["devices"] == {"target": [0, 1, 2, 3], "draft": 4}


def test_too_few_devices_is_a_clear_error():
  with pytest.raises(ValueError, match="xla_force_host_platform_device_count"):
    make_placement(64, 1)


def test_target_devices_must_divide_the_processes(monkeypatch):
  monkeypatch.setattr(jax, "process_count", lambda: 3)
  with pytest.raises(ValueError, match="multiple of the number of processes"):
    make_placement(4, 1)


@pytest.mark.parametrize("spec", [P(None, "tp"), P("tp", None)])
def test_few_row_kernel_multiplies_local_shards(spec):
  # Without a sharding rule XLA all-gathers the weights onto every device before the CPU kernel's custom call.
  from jax.sharding import NamedSharding

  from ssd_jax.kernels import rows_matmul
  if not rows_matmul.available():
    pytest.skip("CPU few-row kernel not built here")
  mesh = make_placement(4, 0).target_mesh
  w = jax.device_put(np.ones((32, 64), np.float32), NamedSharding(mesh, spec))
  x = jax.device_put(np.ones((3, 32), np.float32), NamedSharding(mesh, P()))
  f = jax.jit(model.dense)
  assert "all-gather" not in f.lower(x, w).compile().as_text()
  np.testing.assert_allclose(np.asarray(f(x, w)), np.full((3, 64), 32.0))


def test_cpu_attention_kernel_attends_over_local_heads():
  # With the KV cache split by KV heads over the mesh, each device runs the kernel on its own heads: no all-gather
  # of the cache before the custom call, and the result is the reference's.
  from jax.sharding import NamedSharding

  from ssd_jax.kernels import masked_attention as attn
  if not attn.cpu_attention_available():
    pytest.skip("CPU attention kernel not built here")
  mesh = make_placement(2, 0).target_mesh
  rng = np.random.default_rng(0)
  q = rng.standard_normal((1, 3, 6, 8), dtype=np.float32)
  k, v = (rng.standard_normal((1, 32, 2, 8), dtype=np.float32) for _ in range(2))
  heads = NamedSharding(mesh, P(None, None, "tp", None))
  mask = attn.causal_mask_info(jnp.asarray([[9, 10, 11]], jnp.int32))
  f = jax.jit(lambda q, k, v, m: attn.attention(q, k, v, m, impl="cpu"))
  args = (jax.device_put(q, heads), jax.device_put(k, heads), jax.device_put(v, heads), mask)
  assert "all-gather" not in f.lower(*args).compile().as_text()
  np.testing.assert_allclose(np.asarray(f(*args)), np.asarray(attn.ref_attention(q, k, v, mask)), rtol=2e-5,
                             atol=2e-5)


def test_rms_norm_kernel_sums_local_heads():
  # Qwen3's per-head q/k norms under tensor parallelism: each device sums its own heads' squares (the CPU kernel's
  # sharding rule); without it XLA all-gathers q and k before the custom call. The logits equal one device's.
  from ssd_jax.kernels import rows_matmul
  from ssd_jax.models.kv_cache import KVCache
  if not rows_matmul.available():
    pytest.skip("CPU kernel not built here")
  cfg = tiny_config(vocab_size=256, qk_norm=True)
  params = model.init_params(jax.random.key(0), cfg)
  placed = make_placement(2, 0).shard_target(params, cfg)
  tokens, cache = jnp.zeros((2, 3), jnp.int32), KVCache.init(cfg, 2, 32)
  f = jax.jit(lambda p, t, c: model.forward_causal(p, t, c, cfg)[0])
  assert "all-gather" not in f.lower(placed, tokens, cache).compile().as_text()
  np.testing.assert_array_equal(np.asarray(f(placed, tokens, cache)), np.asarray(f(params, tokens, cache)))
