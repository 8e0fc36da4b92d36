"""The plan (ssd_jax/plan): its bytes per device are what a real run allocates; its estimate of the paper's pair;
its command line; and (with libtpu) every program of an SSD round compiled for a TPU v5e topology."""
import importlib.util
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ssd_jax.models import model
from ssd_jax.models.config import tiny_config
from ssd_jax.decode import DecodeOptions, SpecOptions, SSDDecoder
from ssd_jax.plan import make_plan, memory
from ssd_jax.sharding import Placement, make_placement

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = tiny_config(vocab_size=64, n_heads=4, n_kv_heads=4, name="tiny-target")  # every axis splits over 4
DRAFT = tiny_config(vocab_size=64, d_model=16, ffn_dim=24, head_dim=4, n_layers=1, name="tiny-draft")


def _per_device(tree) -> dict:
  """Returns {device: bytes} of the arrays in `tree` from their real shardings (valid for donated arrays too)."""
  out = {}
  for x in jax.tree.leaves(tree):
    shard = int(np.prod(x.sharding.shard_shape(x.shape))) * x.dtype.itemsize
    for d in x.sharding.device_set:
      out[d] = out.get(d, 0) + shard
  return out


@pytest.mark.skipif(len(jax.devices()) < 5, reason="needs 5 devices (XLA_FLAGS in conftest)")
def test_plan_bytes_per_device_equal_a_real_runs(monkeypatch):
  """bfloat16 weights over a target mesh of 4 and a draft device: parameters, target KV cache and draft KV cache
  per device, as the SSD decoder allocates them, equal the plan's (issue 43's bar)."""
  tp, k, f = 4, 2, 2
  tparams = model.init_params(jax.random.key(0), TARGET, jnp.bfloat16)
  dparams = model.init_params(jax.random.key(1), DRAFT, jnp.bfloat16)
  caches = []
  real_cache = Placement.target_cache
  monkeypatch.setattr(Placement, "target_cache", lambda self, *a: caches.append(real_cache(self, *a)) or caches[-1])
  pl = make_placement(tp, 1)
  dec = SSDDecoder(TARGET, tparams, DRAFT, dparams, SpecOptions(k=k, fan_out=f), placement=pl)
  prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10]]
  dec.generate(prompts, DecodeOptions(max_new_tokens=6))
  plan = memory.sizing(TARGET, DRAFT, tp, len(prompts), 7, 6, k, (f,) * (k + 1), "bfloat16")
  tdevs, ddev = list(pl.target_mesh.devices.flat), pl.draft_device
  assert _per_device(dec.tparams) == {d: plan.target_params for d in tdevs}
  assert _per_device(caches[-1]) == {d: plan.target_kv for d in tdevs}
  side = dec.draft.side.model
  assert _per_device(dec.dparams) == {ddev: plan.draft_params}
  assert _per_device(side.cache) == {ddev: plan.draft_kv}
  assert caches[-1].k[0].dtype == jnp.bfloat16 and side.cache.k[0].dtype == jnp.float32


def test_plan_of_the_papers_llama_pair():
  """The 70B's bytes per device from its shapes by hand; the estimate within 20% of the paper's AR and printed
  beside its figures."""
  plan = make_plan("llama-3.1-70b", "llama-3.2-1b", 4, "h100-80gb")
  d, f, v, layers = 8192, 28672, 128256, 80
  matrices = layers * (d * (d + 2 * 1024) + d * d + 3 * d * f) + 2 * v * d  # all split four ways
  vectors = layers * 2 * d + d                                               # norms: whole on every device
  assert plan["memory"]["target"]["params"] == 2 * (matrices // 4 + vectors)
  sp = plan["speed"]
  assert sp["paper"]["ar"] == 54.7 and abs(sp["ratio"]["ar"] - 1) < 0.2
  assert sp["estimate"]["ar"] < sp["estimate"]["sd"] < sp["estimate"]["ssd"]
  assert plan["memory"]["target"]["fits"] and plan["memory"]["largest_batch"][8192] > 1


def test_plan_cli_prints_memory_and_paper_figures_and_refuses_bad_input():
  env = dict(os.environ, PYTHONPATH=ROOT)  # this checkout's package, not an installed one
  run = lambda *a: subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "plan.py"), *a],  # noqa: E731
                                  capture_output=True, text=True, cwd=ROOT, env=env)
  ok = run("--target", "qwen3-32b", "--draft", "qwen3-0.6b", "--device", "h100-80gb")
  assert ok.returncode == 0, ok.stderr
  assert "Memory per device" in ok.stdout and "paper (4+1 H100)" in ok.stdout and "203.8" in ok.stdout
  bad = run("--target", "qwen3-32b", "--draft", "llama-3.2-1b")
  assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "vocabular" in bad.stderr
  bad = run("--target", "qwen3-33b", "--draft", "qwen3-0.6b")
  assert bad.returncode == 2 and "unknown model" in bad.stderr


@pytest.mark.slow  # 14 compiles for TPU: about 90 s on a busy 2-core machine
@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="needs libtpu (pip install -e '.[tpu]')")
def test_every_ssd_program_compiles_for_a_tpu_v5e_topology():
  """The small configuration's SSD round (and AR's step, SD's chain) compiled for v5e chips with the Pallas
  kernels: every program compiles, keeps its cache's sharding, and the compiler's arguments hold the plan's bytes."""
  from ssd_jax.plan import compile_round, tpu_devices
  from ssd_jax.plan.programs import Layout

  tcfg = tiny_config(vocab_size=512, d_model=256, n_heads=4, n_kv_heads=4, head_dim=64, ffn_dim=512)
  dcfg = tiny_config(vocab_size=512, d_model=128, n_heads=2, n_kv_heads=2, head_dim=64, ffn_dim=256, n_layers=1)
  devs = tpu_devices("v5e:2x4")
  recs = compile_round(tcfg, dcfg, Layout(tuple(devs[:4]), devs[4]), None, dtype="bfloat16", batch=2, prompt=64,
                       slots_t=256, slots_d=384, k=2, fan_out=(2, 2, 2), sd_k=3, attn_impl="pallas")
  assert [r["name"] for r in recs if "error" in r] == []
  assert all(r["sharding_ok"] for r in recs)
  verify = next(r for r in recs if r["name"] == "target.verify")
  assert verify["argument"] >= memory.param_bytes(tcfg, 4) + memory.kv_bytes(tcfg, 4, 2, 256, jnp.bfloat16)


@pytest.mark.parametrize("tie", [True, False])
def test_int8_sizing_is_what_quant_makes(tie):
  """The plan sizes int8 as quant.py builds it from a bfloat16 checkpoint: layer matrices int8 with a float32 scale
  per output column, the embedding, head and norms bfloat16 (byte for byte, one device)."""
  from ssd_jax.models import quant
  cfg = tiny_config(vocab_size=96, tie_embeddings=tie)
  bf16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16) if jnp.issubdtype(x.dtype, jnp.floating) else x,
                      model.init_params(jax.random.key(0), cfg))
  made = quant.quantize_params(bf16, "int8")
  assert memory.param_bytes(cfg, 1, "int8") == sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(made))
