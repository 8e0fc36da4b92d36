"""Placement: the target over a tensor-parallel mesh, the draft on its own device. All sharding rules live here.

Every parameter and cache array carries logical axis names (`param_axes`, `CACHE_AXES`); `ShardingRules` maps them to
mesh axes: tensor parallel over attention heads (q/o by query heads, k/v by KV heads), MLP columns, the vocabulary of
the embedding / LM head, and the KV cache by KV heads. An axis is sharded only where its logical size divides the
mesh (SmolLM2's 9 query and 3 KV heads over 4 devices are replicated; its MLP and vocabulary are split). XLA's SPMD
partitioner inserts the collectives; the model code is the same on one device or many.

With several processes (`jax.distributed`, see distributed.py) the target mesh is cut from the global device set,
the same number of devices from every process, and the draft runs on a device of each process outside that mesh:
every process runs the same draft computation on its own copy, so the host loop (identical in every process) reads
the draft's results without a transfer. Host data is identical in every process, so arrays on the global mesh are
built from it shard by shard (`Placement.put`), and replicated results are read from the local shard
(`Placement.fetch`).
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from .models.config import ModelConfig
from .models.kv_cache import KVCache
from .settings import check_devices

TP = "tp"

# Logical axes. Weight matrices flatten heads x head_dim into one axis, so head axes split whole heads only.
EMBED = "embed"          # d_model
VOCAB = "vocab"          # rows of the embedding (the draft's head vocabulary when it has one)
OUT_VOCAB = "out_vocab"  # columns of an untied LM head
Q_HEADS = "q_heads"      # query heads (x head_dim in weights)
KV_HEADS = "kv_heads"    # key/value heads (x head_dim in weights)
MLP = "mlp"              # FFN hidden units
TOKEN_TABLE = "token_table"  # head_ids / vocab_map gather tables
BATCH, SEQ, HEAD_DIM = "batch", "seq", "head_dim"

CACHE_AXES = (BATCH, SEQ, KV_HEADS, HEAD_DIM)  # one layer's K or V cache [B, S, G, D]
FEATURE_AXES = (BATCH, SEQ, EMBED)  # target features for an EAGLE draft [B, T, n_layers * d] (model.forward)


def param_axes(cfg: ModelConfig) -> dict:
  """Returns logical axis names (a tuple per array) with the structure of the params of `cfg` (from
  param_decls.py, where each parameter is declared once)."""
  from .models.param_decls import is_decl, param_decls
  return jax.tree.map(lambda d: d.axes, param_decls(cfg), is_leaf=is_decl)


def logical_sizes(cfg: ModelConfig) -> dict:
  """Returns the size of each shardable logical axis: a mesh axis may split it only if it divides this size."""
  return {Q_HEADS: cfg.n_heads, KV_HEADS: cfg.n_kv_heads, MLP: cfg.ffn_dim, VOCAB: cfg.embed_rows,
          OUT_VOCAB: cfg.out_vocab, EMBED: cfg.d_model}


@dataclasses.dataclass(frozen=True)
class ShardingRules:
  """Logical axis -> mesh axis (None: replicated). The default is tensor parallelism over "tp"."""
  rules: tuple = ((Q_HEADS, TP), (KV_HEADS, TP), (MLP, TP), (VOCAB, TP), (OUT_VOCAB, TP))

  def mesh_axis(self, logical: str) -> str | None:
    return dict(self.rules).get(logical)

  def spec(self, axes: tuple, sizes: dict, mesh_shape: dict) -> P:
    """Returns the PartitionSpec of an array with logical `axes`, replicating axes the mesh does not divide."""
    out = []
    for a in axes:
      m = self.mesh_axis(a)
      n = mesh_shape.get(m, 1) if m is not None else 1
      out.append(m if n > 1 and a in sizes and sizes[a] % n == 0 else None)
    return P(*out)


RULES = ShardingRules()


def _is_axes(x) -> bool:
  return isinstance(x, tuple) and all(isinstance(a, str) for a in x)


def param_specs(cfg: ModelConfig, tp: int, rules: ShardingRules = RULES) -> dict:
  """Returns PartitionSpecs with the structure of the params of `cfg` for a tensor-parallel degree `tp`."""
  sizes = logical_sizes(cfg)
  return jax.tree.map(lambda ax: rules.spec(ax, sizes, {TP: tp}), param_axes(cfg), is_leaf=_is_axes)


def cache_spec(cfg: ModelConfig, tp: int, rules: ShardingRules = RULES) -> P:
  """Returns the PartitionSpec of one layer's K or V cache [B, S, G, D]: by KV heads where they divide `tp`."""
  return rules.spec(CACHE_AXES, logical_sizes(cfg), {TP: tp})


def _is_key(x) -> bool:
  return jnp.issubdtype(getattr(x, "dtype", np.float32), jax.dtypes.prng_key)


@dataclasses.dataclass(frozen=True)
class Placement:
  target_mesh: Mesh          # 1-D mesh ("tp",) over the target's devices (across processes under jax.distributed)
  draft_device: jax.Device   # this process's draft device (equal to a target device when there is no spare one)

  @property
  def tp(self) -> int:
    return self.target_mesh.devices.size

  @property
  def multi_process(self) -> bool:
    """True when the target mesh spans devices this process cannot address (jax.distributed)."""
    return not self.replicated().is_fully_addressable

  def replicated(self) -> NamedSharding:
    return NamedSharding(self.target_mesh, P())

  def put(self, x, sharding: NamedSharding):
    """Returns host data or a local array `x` placed with `sharding` (which may span several processes).

    Under jax.distributed every process passes the same value; each builds only its own shards, without the
    cross-process equality check `jax.device_put` would run on every call. An array already placed so is returned as
    it is (what device_put returns too, after ~20-80 us of host work a call: a round puts its keys and tokens).
    """
    if isinstance(x, jax.Array) and x.sharding == sharding:
      return x
    if sharding.is_fully_addressable:
      return jax.device_put(x, sharding)
    if _is_key(x):  # typed PRNG keys travel as their raw data
      return jax.random.wrap_key_data(self.put(jax.random.key_data(x), sharding), impl=jax.random.key_impl(x))
    data = np.asarray(x)
    return jax.make_array_from_callback(data.shape, sharding, lambda idx: data[idx])

  def to_target(self, tree):
    """Returns `tree` (host data or arrays, e.g. the draft's speculation) replicated on every target device."""
    sh = self.replicated()
    return jax.tree.map(lambda x: self.put(x, sh), tree)

  def fetch(self, x) -> np.ndarray:
    """Returns a target result as a numpy array; a replicated result is read from this process's shard."""
    if x.is_fully_addressable:
      return np.asarray(x)
    if not x.sharding.is_fully_replicated:
      raise ValueError(f"cannot read a sharded result ({x.sharding}) in one process; replicate it first")
    return np.asarray(x.addressable_data(0))

  def shard_target(self, params, cfg: ModelConfig):
    """Returns the target params placed on the target mesh by the rules above."""
    specs = param_specs(cfg, self.tp)
    return jax.tree.map(lambda s, x: self.put_param(x, s), specs, params, is_leaf=lambda s: isinstance(s, P))

  def put_param(self, x, spec: P):
    """Returns one param placed by `spec`; an int8 matrix's scales [N] are split like its output columns."""
    from .models.blocks import BlockWeight
    from .models.quant import Int8Weight
    if isinstance(x, BlockWeight):  # its arrays are in the file's row order (a layer matrix's [out, in]); the axis
      s2 = (tuple(spec) + (None, None))[:2]  # along the blocks is split only where the blocks divide the mesh
      rows, cols = s2[::-1] if x.transposed else s2
      if cols is not None and x.d.shape[1] % self.target_mesh.shape[cols]:
        cols = None
      fs = NamedSharding(self.target_mesh, P(rows, cols))
      return dataclasses.replace(x, qs=self.put(x.qs, fs), d=self.put(x.d, fs),
                                 m=None if x.m is None else self.put(x.m, fs))
    if isinstance(x, Int8Weight):
      return Int8Weight(q=self.put(x.q, NamedSharding(self.target_mesh, spec)),
                        scale=self.put(x.scale, NamedSharding(self.target_mesh, P(spec[1] if len(spec) > 1 else None))))
    return self.put(x, NamedSharding(self.target_mesh, spec))

  def target_cache(self, cfg: ModelConfig, batch: int, slots: int, dtype) -> KVCache:
    """Returns an empty target KV cache, sharded by KV heads where they divide the mesh."""
    return _empty_cache(cfg, batch, slots, np.dtype(dtype), NamedSharding(self.target_mesh, cache_spec(cfg, self.tp)),
                        self.replicated())()


@functools.lru_cache(maxsize=32)
def _empty_cache(cfg: ModelConfig, batch: int, slots: int, dtype, sh: NamedSharding, rep: NamedSharding):
  """Returns a jitted program creating an empty KV cache in place with these shardings (no host copy; works across
  processes)."""
  layers = [sh] * cfg.n_layers
  return jax.jit(lambda: KVCache.init(cfg, batch, slots, dtype),
                 out_shardings=KVCache(k=layers, v=layers, lengths=rep))


def _split_by_process(devices, target_devices: int, draft_devices: int):
  """Returns (target devices, this process's draft device): the same number of target devices from every process."""
  nproc = jax.process_count()
  if target_devices % nproc:
    raise ValueError(f"--target-devices {target_devices} must be a multiple of the number of processes ({nproc}): "
                     f"every process contributes the same number of devices to the target mesh")
  per = target_devices // nproc
  by_proc = [sorted((d for d in devices if d.process_index == p), key=lambda d: d.id) for p in range(nproc)]
  short = [p for p, ds in enumerate(by_proc) if len(ds) < per]
  if short:
    raise ValueError(f"{target_devices} target devices over {nproc} processes need {per} devices in each, but "
                     f"process {short[0]} has {len(by_proc[short[0]])}")
  local = by_proc[jax.process_index()]
  draft = local[per] if (draft_devices and len(local) > per) else local[0]
  return [d for ds in by_proc for d in ds[:per]], draft


def make_placement(target_devices: int = 1, draft_devices: int = 1, devices=None) -> Placement:
  """Returns the target mesh over the first `target_devices` devices and the draft on the next one.

  Under jax.distributed (several processes) the target takes target_devices / process_count devices from every
  process and each process runs the draft on its next local device. Raises ValueError with what to do when the
  platform has too few devices.
  """
  check_devices(target_devices, draft_devices)
  if devices is None and jax.process_count() > 1:
    tdevs, draft = _split_by_process(jax.devices(), target_devices, draft_devices)
    return Placement(Mesh(np.asarray(tdevs), (TP,)), draft)
  devices = list(devices if devices is not None else jax.devices())
  need = target_devices + draft_devices
  if len(devices) < target_devices:
    raise ValueError(f"{target_devices} target devices requested but only {len(devices)} available; on a CPU set "
                     f"XLA_FLAGS=--xla_force_host_platform_device_count={need} before starting")
  mesh = Mesh(np.asarray(devices[:target_devices]), (TP,))
  draft = devices[target_devices] if (draft_devices and len(devices) > target_devices) else devices[0]
  return Placement(mesh, draft)
