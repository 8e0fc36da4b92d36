"""Sharded loading (ssd_jax/models/sharded_load.py): an HF directory goes tensor by tensor onto a mesh in its own dtype,
with the values the whole-file reader gives and the shardings sharding.param_specs asks for."""
import jax
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import Mesh

from ssd_jax.models import checkpoints, model, model_files, sharded_load
from ssd_jax.models.config import tiny_config
from ssd_jax.models.families import CheckpointError
from ssd_jax.sharding import param_specs

from model_writers import write_hf_dir

needs5 = pytest.mark.skipif(len(jax.devices()) < 5, reason="needs 5 devices (XLA_FLAGS in conftest)")


def _hf_dir(tmp_path, tie=False, shards=1):
  cfg = tiny_config(vocab_size=64, n_heads=4, n_kv_heads=4, tie_embeddings=tie)
  params = model.init_params(jax.random.key(3), cfg, scale=0.3)
  return cfg, write_hf_dir(tmp_path, cfg, params, dtype=ml_dtypes.bfloat16, shards=shards)


@needs5
@pytest.mark.parametrize("tie,shards", [(False, 1), (True, 2)])
def test_sharded_load_equals_whole_file_reader_in_bf16(tmp_path, monkeypatch, tie, shards):
  monkeypatch.setattr(sharded_load, "CHUNK_BYTES", 200)  # several chunks per tensor: the chunked reads are checked
  cfg, path = _hf_dir(tmp_path, tie, shards)
  mesh = Mesh(np.asarray(jax.devices()[:4]), ("tp",))
  lcfg, placed = sharded_load.load_hf_sharded(path, mesh, dtype="bfloat16")
  _, whole = model_files.read_hf_safetensors(path, progress=False)
  assert lcfg == model_files.hf_config(path)[0]
  specs = param_specs(lcfg, 4)
  flat_p, flat_w = jax.tree.leaves(placed), jax.tree.leaves(whole)
  flat_s = jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
  for p, w, s in zip(flat_p, flat_w, flat_s):
    assert p.dtype == ml_dtypes.bfloat16 and p.sharding.spec == s
    np.testing.assert_array_equal(np.asarray(p), w)
  assert any(s != jax.sharding.PartitionSpec() and any(s) for s in flat_s)  # some params really are split


def test_auto_dtype_on_cpu_is_float32_and_load_model_uses_the_sharded_path(tmp_path):
  cfg, path = _hf_dir(tmp_path)
  _, params, _ = checkpoints.load_model(path)
  assert {x.dtype for x in jax.tree.leaves(params)} == {np.dtype(np.float32)}
  _, kept, _ = checkpoints.load_model(path, dtype="bfloat16")
  assert kept["layers"][0]["wq"].dtype == ml_dtypes.bfloat16


def test_truncated_file_fails_with_one_line(tmp_path):
  _, path = _hf_dir(tmp_path)
  f = tmp_path / "model.safetensors"
  f.write_bytes(f.read_bytes()[:-100])
  with pytest.raises(CheckpointError, match="truncated"):
    jax.tree.map(np.asarray, checkpoints.load_model(path)[1])


@needs5
@pytest.mark.parametrize("dtype", ["auto", "bfloat16"])
def test_orbax_checkpoint_restores_onto_the_mesh_like_the_host_path(tmp_path, dtype):
  cfg = tiny_config(vocab_size=64, n_heads=4, n_kv_heads=4, head_vocab=40)
  checkpoints.save_checkpoint(str(tmp_path), cfg, model.init_params(jax.random.key(1), cfg, scale=0.3),
                              storage_dtype="bfloat16")
  mesh = Mesh(np.asarray(jax.devices()[:4]), ("tp",))
  _, placed = checkpoints.load_checkpoint(str(tmp_path), dtype, mesh=mesh)
  _, host = checkpoints.load_checkpoint(str(tmp_path), dtype)
  for p, h, s in zip(jax.tree.leaves(placed), jax.tree.leaves(host), jax.tree.leaves(
      param_specs(cfg, 4), is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))):
    assert p.dtype == h.dtype and p.sharding.spec == s
    np.testing.assert_array_equal(np.asarray(p), np.asarray(h))
  assert placed["layers"][0]["w_up"].dtype == (np.float32 if dtype == "auto" else ml_dtypes.bfloat16)
