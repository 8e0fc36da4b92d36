"""The draft's weight format (ssd_jax/models/draft_weights.py, load's draft_weights): our Q8_0 quantizer, the quantized
draft's forward against its dequantized float32 model, and greedy SD / SSD equal to AR with it (tiny pairs, standalone
and EAGLE, and the real SmolLM2 pair). The sampled law with it: test_sampled_decoding."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from commands import run_script

from ssd_jax import api
from ssd_jax.kernels import causal_mask_info
from ssd_jax.models import blocks, draft_weights, eagle, model
from ssd_jax.models.kv_cache import KVCache

from block_weights import dequantized

EAGLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "checkpoints", "eagle-smollm2")


def test_q8_0_rounds_each_weight_to_its_blocks_scale():
  rng = np.random.default_rng(0)
  rows = rng.normal(size=(5, 96)).astype(np.float32) * np.array([1e-3, 1, 30, 0.2, 5], np.float32)[:, None]
  rows[2, 32:64] = 0.0  # an all-zero block: scale 0, values 0
  w = blocks.quantize_q8_0(rows, transposed=False)
  d = np.asarray(w.d, np.float32)
  amax = np.abs(rows.reshape(5, 3, 32)).max(-1)
  assert w.kind == "Q8_0" and w.d.dtype == np.float16 and w.qs.dtype == np.int8
  np.testing.assert_array_equal(d, (amax / 127).astype(np.float16).astype(np.float32))
  err = np.abs(blocks.dequantize_rows(w, np) - rows).reshape(5, 3, 32)
  assert (err <= d[..., None] / 2 * (1 + 1e-6)).all()
  assert not np.asarray(w.qs)[2, 32:64].any()
  assert np.abs(np.asarray(w.qs, np.int32)).max() <= 127
  again = blocks.quantize_q8_0(blocks.dequantize_rows(w, np), transposed=False)  # its own values: unchanged
  np.testing.assert_array_equal(np.asarray(again.qs), np.asarray(w.qs))
  np.testing.assert_array_equal(np.asarray(again.d), np.asarray(w.d))
  with pytest.raises(ValueError, match="multiple of 32"):
    blocks.quantize_q8_0(rows[:, :40], transposed=False)


def test_q8_0_draft_blocks_its_matrices_and_head_and_keeps_the_rest():
  pipe = api.load_tiny()
  cfg, p = pipe.draft.cfg, pipe.draft.params
  q = draft_weights.quantize_draft(cfg, p, "q8_0")
  lq = q["layers"][0]
  assert blocks.is_block(q["embed"]) and not q["embed"].transposed  # the tied head: rows [V_out, d]
  assert all(blocks.is_block(lq[k]) and lq[k].transposed and lq[k].shape == p["layers"][0][k].shape
             for k in ("wq", "wk", "wv", "wo", "w_gate", "w_up"))
  assert not blocks.is_block(lq["w_down"])  # its summed axis (ffn 48) is not a multiple of 32
  assert lq["attn_norm"] is p["layers"][0]["attn_norm"] and q["head_ids"] is p["head_ids"]
  assert draft_weights.quantize_draft(cfg, p, "full") is p
  assert draft_weights.resolve("auto") == ("q8_0" if jax.default_backend() == "cpu" else "full")
  with pytest.raises(ValueError, match="unknown draft weights 'int4'; choose one of auto, full, q8_0"):
    draft_weights.resolve("int4")


@pytest.mark.parametrize("t", [1, 3, 70])  # the block kernel's few rows, and the portable path above 64
def test_q8_0_draft_forward_equals_its_dequantized_float32_model(t):
  pipe = api.load_tiny()
  cfg = pipe.draft.cfg
  q = draft_weights.quantize_draft(cfg, pipe.draft.params, "q8_0")
  toks = jax.random.randint(jax.random.key(3), (2, t), 0, cfg.vocab_size)
  cache = KVCache.init(cfg, 2, 96).replace(lengths=jnp.array([5, 9], jnp.int32))
  fwd = jax.jit(lambda p, c: model.forward_causal(p, toks, c, cfg)[0])
  got, want = np.asarray(fwd(q, cache)), np.asarray(fwd(dequantized(q), cache))
  scale = np.abs(want).max()  # the same sums in another order: float32 rounding of the largest logit's size
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * scale)
  ref = np.asarray(fwd(pipe.draft.params, cache))  # the unquantized draft: near, and far further than rounding
  assert 1e-3 * scale < np.abs(ref - got).max() < 0.1 * scale


def test_q8_0_eagle_draft_forward_equals_its_dequantized_float32_model():
  pipe = api.load_tiny(eagle=True)
  cfg = pipe.draft.cfg
  q = draft_weights.quantize_draft(cfg, pipe.draft.params, "q8_0")
  assert all(blocks.is_block(x) for x in (q["head"], q["fc"], q["layer"]["wq"]))
  toks = jnp.array([[3, 5]], jnp.int32)
  h = jax.random.normal(jax.random.key(1), (1, 2, cfg.d_model))
  s = jnp.array([[4, 5]], jnp.int32)

  def fwd(p):
    x = eagle.fuse(p, jnp.concatenate([h] * len(cfg.feature_layers), -1))
    return eagle.forward(p, toks, x, s, KVCache.init(cfg, 1, 16), s, causal_mask_info(s), cfg)[0]
  got, want = np.asarray(jax.jit(fwd)(q)), np.asarray(jax.jit(fwd)(dequantized(q)))
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("eagle_draft,placement", [(False, "devices"), (True, "devices"), (False, "processes")])
def test_greedy_sd_and_ssd_equal_ar_with_a_q8_0_tiny_draft(eagle_draft, placement):
  """SSD's draft in this process, or in its own (its params, blocks included, travel to the child as host arrays)."""
  if placement == "processes" and len(os.sched_getaffinity(0)) < 2:
    pytest.skip("needs two CPU cores")
  pipe = api.load_tiny(eagle=eagle_draft)
  pipe.draft.params = draft_weights.quantize_draft(pipe.draft.cfg, pipe.draft.params, "q8_0")
  pipe.ssd_placement = placement
  prompts = ["hello there", "abc abc abc"]
  want = [g.token_ids for g in pipe.generate(prompts, mode="ar", max_new_tokens=12, ignore_eos=True)]
  for mode in ("sd", "ssd"):
    got = pipe.generate(prompts, mode=mode, k=3, max_new_tokens=12, ignore_eos=True)
    assert [g.token_ids for g in got] == want, mode
  assert got[0].stats["placement"]["kind"] == placement


def test_greedy_sd_and_ssd_equal_ar_with_the_real_q8_0_draft():
  """The shipped draft as load() gives it on a CPU by default (q8_0) beside the SmolLM2 target in its blocks."""
  pipe = api.load(ssd_placement="devices")
  assert pipe.draft_weights == draft_weights.resolve("auto")
  if pipe.draft_weights != "q8_0":
    pytest.skip("the default draft format is q8_0 on a CPU only")
  assert draft_weights.is_quantized(pipe.draft.params)
  prompts = ["What is the capital of France?", "List three prime numbers."]
  want = [g.token_ids for g in pipe.generate(prompts, mode="ar", max_new_tokens=16)]
  for mode, k in (("sd", 3), ("ssd", 2)):
    assert [g.token_ids for g in pipe.generate(prompts, mode=mode, k=k, max_new_tokens=16)] == want, mode


@pytest.mark.slow  # an experiment's figures (scripts/experiments/draft_cost.py)
def test_draft_cost_script_times_every_call_of_each_format(tmp_path):
  """scripts/experiments/draft_cost.py on the tiny pair's drafts, run as a command."""
  out = tmp_path / "cost.json"
  r = run_script("draft_cost.py", "--tiny", "--eagle", "tiny", "--repeats", "2", "--ks", "1,2", "--batch", "1",
                 "--prefix", "20", "--json-out", str(out))
  assert r.returncode == 0, r.stderr[-2000:]
  ms = json.loads(out.read_text())["batch1"]
  for label in ("draft/full", "draft/q8_0", "eagle/full", "eagle/q8_0"):
    for name in ("step", "exe_1", "exe_2", "propose_1", "propose_2"):
      assert ms[f"{label}/{name}"] > 0, (label, name)
    assert ms[f"{label}/host_2"] == round(ms[f"{label}/propose_2"] - ms[f"{label}/exe_2"], 3)
  assert "draft/full/linear" in ms and "eagle/full/linear" not in ms
  assert ms["floor/empty_jit"] > 0 and ms["floor/get"] > 0


def test_a_q8_0_eagle_head_is_the_targets_own_blocks():
  """The EAGLE draft's head is rows of the target's Q8_0 embedding, dequantized at attach: our quantizer gives those
  blocks back bit for bit, so the q8_0 EAGLE head computes the target's own head rows."""
  pipe = api.load(draft=EAGLE, draft_weights="q8_0")
  emb, head = jax.device_get(pipe.target.params["embed"]), jax.device_get(pipe.draft.params["head"])
  if not (blocks.is_block(emb) and emb.kind == "Q8_0"):
    pytest.skip("the target is not in its GGUF blocks here")
  want = blocks.take_rows(emb, np.asarray(pipe.draft.params["head_ids"]))
  np.testing.assert_array_equal(np.asarray(head.qs), np.asarray(want.qs))
  np.testing.assert_array_equal(np.asarray(head.d), np.asarray(want.d))
