"""Placement: the target over a tensor-parallel mesh, the draft on its own device. All sharding rules live here.

Logical axes -> mesh axis "tp": attention heads (q/o by query heads, k/v by KV heads), MLP columns, the vocabulary
of the embedding / LM head, and the KV cache by KV heads. An axis is sharded only where its size divides the mesh
(SmolLM2's 9 query and 3 KV heads over 4 devices are replicated; its MLP and vocabulary are split). XLA's SPMD
partitioner inserts the collectives; the model code is the same on one device or many.
"""
from __future__ import annotations

import dataclasses

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from .config import ModelConfig
from .kv_cache import KVCache

TP = "tp"


def _split(n: int, tp: int):
  return TP if tp > 1 and n % tp == 0 else None


def param_specs(cfg: ModelConfig, tp: int) -> dict:
  """Returns PartitionSpecs with the structure of the params of `cfg` for a tensor-parallel degree `tp`."""
  heads_q = _split(cfg.n_heads, tp)
  heads_kv = _split(cfg.n_kv_heads, tp)
  ffn = _split(cfg.ffn_dim, tp)
  vocab = _split(cfg.embed_rows, tp)
  layer = {"attn_norm": P(), "mlp_norm": P(), "wq": P(None, heads_q), "wk": P(None, heads_kv),
           "wv": P(None, heads_kv), "wo": P(heads_q, None), "w_gate": P(None, ffn), "w_up": P(None, ffn),
           "w_down": P(ffn, None)}
  if cfg.attn_bias:
    layer.update(bq=P(heads_q), bk=P(heads_kv), bv=P(heads_kv))
  specs = {"embed": P(vocab, None), "layers": [dict(layer) for _ in range(cfg.n_layers)], "final_norm": P()}
  if not cfg.tie_embeddings:
    specs["lm_head"] = P(None, _split(cfg.out_vocab, tp))
  if cfg.head_vocab is not None:
    specs["head_ids"] = P()
    specs["vocab_map"] = P()
  return specs


def cache_spec(cfg: ModelConfig, tp: int) -> P:
  """Returns the PartitionSpec of one layer's K or V cache [B, S, G, D]."""
  return P(None, None, _split(cfg.n_kv_heads, tp), None)


@dataclasses.dataclass(frozen=True)
class Placement:
  target_mesh: Mesh          # 1-D mesh ("tp",) over the target's devices
  draft_device: jax.Device   # the draft's own device (equal to a target device when there is only one)

  @property
  def tp(self) -> int:
    return self.target_mesh.devices.size

  def replicated(self) -> NamedSharding:
    return NamedSharding(self.target_mesh, P())

  def shard_target(self, params, cfg: ModelConfig):
    """Returns the target params placed on the target mesh by the rules above."""
    specs = param_specs(cfg, self.tp)
    return jax.tree.map(lambda x, s: jax.device_put(x, NamedSharding(self.target_mesh, s)), params, specs,
                        is_leaf=lambda s: isinstance(s, P))

  def target_cache(self, cfg: ModelConfig, batch: int, slots: int, dtype) -> KVCache:
    """Returns an empty target KV cache, sharded by KV heads where they divide the mesh."""
    sh = NamedSharding(self.target_mesh, cache_spec(cfg, self.tp))
    c = KVCache.init(cfg, batch, slots, dtype)
    return KVCache(k=[jax.device_put(a, sh) for a in c.k], v=[jax.device_put(a, sh) for a in c.v],
                   lengths=jax.device_put(c.lengths, self.replicated()))


def make_placement(target_devices: int = 1, draft_devices: int = 1, devices=None) -> Placement:
  """Returns the target mesh over the first `target_devices` devices and the draft on the next one.

  Raises ValueError with what to do when the platform has too few devices.
  """
  devices = list(devices if devices is not None else jax.devices())
  if target_devices < 1 or draft_devices < 0:
    raise ValueError("need at least one target device (and a non-negative number of draft devices)")
  if draft_devices > 1:
    raise ValueError("the draft runs on one device; draft data parallelism is not implemented")
  need = target_devices + draft_devices
  if len(devices) < target_devices:
    raise ValueError(f"{target_devices} target devices requested but only {len(devices)} available; on a CPU set "
                     f"XLA_FLAGS=--xla_force_host_platform_device_count={need} before starting")
  mesh = Mesh(np.asarray(devices[:target_devices]), (TP,))
  draft = devices[target_devices] if (draft_devices and len(devices) > target_devices) else devices[0]
  return Placement(mesh, draft)
