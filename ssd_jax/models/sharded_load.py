"""Loading a Hugging Face safetensors directory straight onto a mesh: tensor by tensor, shard by shard, each in its
own dtype, so the host never holds the model (nor a float32 copy of it).

Each param gets the NamedSharding `sharding.param_specs` gives it; each of its shards is read from the file (only the
rows it needs, in bounded chunks, with plain file reads: a memory map would leave every page it touched resident),
put on its device, and dropped, then the shards are assembled (`make_array_from_single_device_arrays`). Peak host
memory is then about one shard (twice for a transposed one) on top of what the devices hold (on a CPU "device"
that is host memory too). Multi-process meshes read only this process's shards.
"""
from __future__ import annotations

import numpy as np

from .families import CheckpointError
from .model_files import hf_config, hf_layout, is_layout_entry, safetensors_entries

CHUNK_BYTES = 32 << 20  # rows read from the file at a time


def tensor_index(files) -> dict:
  """Returns {name without `model.`: (path, stored numpy dtype, shape, absolute byte offset)} over the files."""
  index = {}
  for path in files:
    start, entries = safetensors_entries(path)
    for name, dt, shape, begin, _ in entries:
      index[name.removeprefix("model.")] = (path, dt, shape, start + begin)
  return index


def read_block(entry, rows: slice, cols: slice | None) -> np.ndarray:
  """Returns rows[, cols] of a stored tensor (1-D: rows only), reading whole rows CHUNK_BYTES at a time."""
  path, dt, shape, offset = entry
  r0, r1, _ = rows.indices(shape[0])
  width = int(np.prod(shape[1:])) if len(shape) > 1 else 1
  per = max(1, CHUNK_BYTES // (width * dt.itemsize))
  out_cols = len(range(*cols.indices(shape[1]))) if cols is not None else None
  out = np.empty((r1 - r0,) + ((out_cols,) if cols is not None else tuple(shape[1:])), dt)  # filled in place
  with open(path, "rb") as f:
    for a in range(r0, r1, per):
      n = min(per, r1 - a)
      f.seek(offset + a * width * dt.itemsize)
      raw = np.fromfile(f, np.uint8, n * width * dt.itemsize)
      if raw.size != n * width * dt.itemsize:
        raise CheckpointError(f"{path}: file ends inside a tensor (truncated)")
      block = raw.view(dt).reshape((n,) + tuple(shape[1:]))
      out[a - r0:a - r0 + n] = block[:, cols] if cols is not None else block
  return out


def _shard_reader(entry, transposed: bool, dtype):
  """Returns the callback giving the block of our param at a shard's index (ours is the stored matrix transposed
  when `transposed`: our columns are the file's rows, so column shards read contiguous bytes)."""
  def read(idx):
    if len(entry[2]) == 1:
      return read_block(entry, idx[0], None).astype(dtype, copy=False)
    ours_rows, ours_cols = idx
    if transposed:
      return np.ascontiguousarray(read_block(entry, ours_cols, ours_rows).T).astype(dtype, copy=False)
    return read_block(entry, ours_rows, ours_cols).astype(dtype, copy=False)
  return read


def load_hf_sharded(directory: str, mesh, dtype: str | None = "auto"):
  """Returns (ModelConfig, params) of a Hugging Face directory, each param placed on `mesh` (1-D, axis "tp") by
  sharding.param_specs, floating params in checkpoints.param_dtype(dtype, stored dtype)."""
  import jax
  from jax.sharding import NamedSharding

  from .checkpoints import param_dtype
  from ..sharding import param_specs

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
    read = _shard_reader(stored, transposed, param_dtype(dtype, stored[1]))
    sh = NamedSharding(mesh, spec)
    # One shard at a time onto its device (make_array_from_callback reads every shard before placing any: a whole
    # tensor's worth of host memory at once).
    shards = [jax.device_put(read(idx), dev) for dev, idx in sh.addressable_devices_indices_map(shape).items()]
    return jax.make_array_from_single_device_arrays(shape, sh, shards)
  return cfg, jax.tree.map(place, hf_layout(cfg), specs, is_leaf=is_layout_entry)


def _same_tensor(a, b) -> bool:
  """Returns True when two stored tensors hold the same values (compared a chunk of rows at a time)."""
  if a[1:3] != b[1:3]:
    return False
  per = max(1, CHUNK_BYTES // (int(np.prod(a[2][1:])) * a[1].itemsize))
  return all(np.array_equal(read_block(a, slice(r, r + per), None), read_block(b, slice(r, r + per), None))
             for r in range(0, a[2][0], per))
