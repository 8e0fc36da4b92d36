"""Loading a Hugging Face safetensors directory straight onto a mesh: tensor by tensor, shard by shard, each in its
own dtype, so the host never holds the model (nor a float32 copy of it).

Each param is built by `jax.make_array_from_callback` with the NamedSharding `sharding.param_specs` gives it; the
callback reads from the file only the rows the shard needs, in bounded chunks, with plain file reads (a memory map
would leave every page it touched resident). Peak host memory is then one chunk plus one shard, on top of what the
devices hold (on a CPU "device" that is host memory too).
"""
from __future__ import annotations

import numpy as np

from .families import CheckpointError
from .model_files import _ST_DTYPES, _safetensors_header, hf_config, hf_layout, is_layout_entry

CHUNK_BYTES = 32 << 20  # rows read from the file at a time


def tensor_index(files) -> dict:
  """Returns {name without `model.`: (path, stored numpy dtype, shape, absolute byte offset)} over the files."""
  import ml_dtypes

  index = {}
  for path in files:
    header, start = _safetensors_header(path)
    for name, info in header.items():
      dt = _ST_DTYPES.get(info.get("dtype"))
      if dt is None:
        raise CheckpointError(f"{path}: tensor {name} has dtype {info.get('dtype')} (only float32/16, bfloat16 load)")
      dt = np.dtype(ml_dtypes.bfloat16 if dt == "bfloat16" else dt)
      begin, end = info["data_offsets"]
      shape = tuple(info["shape"])
      if end - begin != int(np.prod(shape)) * dt.itemsize:
        raise CheckpointError(f"{path}: tensor {name} does not fit its offsets (truncated or corrupt file)")
      index[name.removeprefix("model.")] = (path, dt, shape, start + begin)
  return index


def read_block(entry, rows: slice, cols: slice | None) -> np.ndarray:
  """Returns rows[, cols] of a stored tensor (1-D: rows only), reading whole rows CHUNK_BYTES at a time."""
  path, dt, shape, offset = entry
  r0, r1, _ = rows.indices(shape[0])
  width = int(np.prod(shape[1:])) if len(shape) > 1 else 1
  per = max(1, CHUNK_BYTES // (width * dt.itemsize))
  parts = []
  with open(path, "rb") as f:
    for a in range(r0, r1, per):
      n = min(per, r1 - a)
      f.seek(offset + a * width * dt.itemsize)
      raw = np.fromfile(f, np.uint8, n * width * dt.itemsize)
      if raw.size != n * width * dt.itemsize:
        raise CheckpointError(f"{path}: file ends inside a tensor (truncated)")
      block = raw.view(dt).reshape((n,) + tuple(shape[1:]))
      parts.append(np.array(block[:, cols]) if cols is not None else block)
  return np.concatenate(parts) if parts else np.zeros((0,) + tuple(shape[1:]), dt)


def _shard_reader(entry, transposed: bool, dtype):
  """Returns the callback giving the block of our param at a shard's index (ours is the stored matrix transposed
  when `transposed`: our columns are the file's rows, so column shards read contiguous bytes)."""
  def read(idx):
    if len(entry[2]) == 1:
      return read_block(entry, idx[0], None).astype(dtype)
    ours_rows, ours_cols = idx
    if transposed:
      return np.ascontiguousarray(read_block(entry, ours_cols, ours_rows).T).astype(dtype)
    return read_block(entry, ours_rows, ours_cols).astype(dtype)
  return read


def load_hf_sharded(directory: str, mesh, dtype: str | None = "auto"):
  """Returns (ModelConfig, params) of a Hugging Face directory, each param placed on `mesh` (1-D, axis "tp") by
  sharding.param_specs, floating params in checkpoints.param_dtype(dtype, stored dtype)."""
  import jax
  from jax.sharding import NamedSharding

  from .checkpoints import param_dtype
  from .sharding import param_specs

  cfg, files = hf_config(directory)
  index = tensor_index(files)
  if cfg.tie_embeddings and "lm_head.weight" in index and not _same_tensor(index["lm_head.weight"],
                                                                           index["embed_tokens.weight"]):
    raise CheckpointError(f"{directory}: tie_word_embeddings is true but lm_head.weight differs from the embedding; "
                          f"refusing to guess which head the model means")
  specs = param_specs(cfg, mesh.devices.size)

  def place(entry, spec):
    name, transposed = entry
    stored = index[name]
    shape = tuple(reversed(stored[2])) if transposed else stored[2]
    dt = param_dtype(dtype, stored[1])
    return jax.make_array_from_callback(shape, NamedSharding(mesh, spec), _shard_reader(stored, transposed, dt))
  return cfg, jax.tree.map(place, hf_layout(cfg), specs, is_leaf=is_layout_entry)


def _same_tensor(a, b) -> bool:
  """Returns True when two stored tensors hold the same values (compared a chunk of rows at a time)."""
  if a[1:3] != b[1:3]:
    return False
  per = max(1, CHUNK_BYTES // (int(np.prod(a[2][1:])) * a[1].itemsize))
  return all(np.array_equal(read_block(a, slice(r, r + per), None), read_block(b, slice(r, r + per), None))
             for r in range(0, a[2][0], per))
