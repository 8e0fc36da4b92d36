"""Every program of an SSD round (and AR's step and SD's chain for comparison) as the decoders call it, over abstract
arrays placed as the decoders place them: the target's over its tensor-parallel mesh by the sharding rules, the
draft's on its own device. compile.py compiles them for any devices, a TPU topology's included.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P, SingleDeviceSharding

from ..decode.backup import point_mass, random_speculation
from ..models.config import ModelConfig
from ..decode.base import PROMPT_BUCKET
from ..decode.draft import CACHE_DTYPE as DRAFT_CACHE_DTYPE
from ..decode.steps import (chain_after, draft_propose, draft_tree, first_tokens, merge_rows, pick_branch, prefill,
                            serve_q,
                            verify)
from ..kernels.platform import device_platform
from ..models.kv_cache import KVCache, round_slots
from ..sharding import TP, cache_spec, param_specs
from .memory import abstract_params


@dataclasses.dataclass(frozen=True)
class Program:
  name: str         # e.g. 'target.verify'
  side: str         # 'target' or 'draft': whose device(s) it runs on
  fn: object        # the jitted step
  args: tuple       # abstract arguments with shardings
  static: dict      # static keyword arguments
  cache_in: int | None = None  # index of the KV cache argument (its output sharding must equal its input's)
  mesh: object = None          # the mesh it is lowered under (the target's, or the draft device's own)
  model: str = ""              # whose layers it runs, 'target' or 'draft' (default: its side's)

  @property
  def layered(self) -> bool:
    """Whether the program runs the model's layers (its size and compile time grow with the depth)."""
    return self.cache_in is not None


def _sds(shape, dtype, sharding):
  return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)


def _place(tree, shardings):
  return jax.tree.map(lambda x, s: _sds(x.shape, x.dtype, s), tree, shardings)


def _cache(cfg: ModelConfig, batch: int, slots: int, dtype, sh, rep) -> KVCache:
  shape = (batch, slots, cfg.n_kv_heads, cfg.head_dim)
  layers = [_sds(shape, dtype, sh) for _ in range(cfg.n_layers)]
  return KVCache(k=layers, v=list(layers), lengths=_sds((batch,), jnp.int32, rep))


@dataclasses.dataclass(frozen=True)
class Layout:
  """Where the pair runs: the target mesh ('tp') over `target` devices, the draft on `draft`."""
  target: tuple
  draft: object

  @property
  def mesh(self) -> Mesh:
    return Mesh(np.asarray(self.target), (TP,))


def round_programs(tcfg: ModelConfig, dcfg: ModelConfig, layout: Layout, dtype: str, batch: int, prompt: int,
                   slots_t: int, slots_d: int, k: int, fan_out: tuple, sd_k: int, attn_impl: str) -> list[Program]:
  """Returns the programs of an AR step, an SD round and an SSD round for these shapes (weights in `dtype`)."""
  mesh, tp = layout.mesh, len(layout.target)
  rep, dsh = NamedSharding(mesh, P()), SingleDeviceSharding(layout.draft)
  wdt = jnp.dtype(dtype)
  tspecs = jax.tree.map(lambda s: NamedSharding(mesh, s), param_specs(tcfg, tp), is_leaf=lambda s: isinstance(s, P))
  tparams = _place(abstract_params(tcfg, dtype), tspecs)
  dabs = abstract_params(dcfg, dtype)
  dparams = _place(dabs, jax.tree.map(lambda _: dsh, dabs))
  sd_dparams = _place(dabs, jax.tree.map(lambda _: rep, dabs))  # SD: the draft replicated on the target's devices
  tcache = _cache(tcfg, batch, slots_t, wdt, NamedSharding(mesh, cache_spec(tcfg, tp)), rep)
  dcache = _cache(dcfg, batch, slots_d, DRAFT_CACHE_DTYPE, dsh, dsh)
  sd_dcache = _cache(dcfg, batch, slots_d, DRAFT_CACHE_DTYPE, rep, rep)
  key = jax.eval_shape(lambda: jax.random.key(0))
  b, v, v_out, n = batch, tcfg.vocab_size, dcfg.out_vocab, sum(fan_out)
  t_pad = round_slots(prompt, PROMPT_BUCKET)

  def small(sh):
    """The small inputs of a step on these devices: (int rows [B], bools [B], key, float scalars)."""
    return (_sds((b,), jnp.int32, sh), _sds((b,), jnp.bool_, sh), _sds(key.shape, key.dtype, sh),
            _sds((), jnp.float32, sh))
  zi, zb, zkey, f = small(rep)
  di, _, dkey, df = small(dsh)
  tst = dict(cfg=tcfg, attn_impl=attn_impl, platform=device_platform(mesh))
  dst = dict(cfg=dcfg, attn_impl=attn_impl, platform=device_platform(layout.draft))
  toks = lambda shape, sh: _sds(shape, jnp.int32, sh)  # noqa: E731
  flts = lambda shape, sh: _sds(shape, jnp.float32, sh)  # noqa: E731
  progs = [
      Program("target.prefill", "target", prefill, (tparams, toks((b, t_pad), rep), zi, tcache), tst, 3),
      Program("target.first_tokens", "target", first_tokens, (tparams, flts((b, tcfg.out_vocab), rep), zkey, f, f),
              dict(cfg=tcfg)),
      # AR's step is a verify of no drafts (decode/rounds.py)
      Program("target.ar_step", "target", verify,
              (tparams, tcache, zi, toks((b, 0), rep), flts((b, 0, v), rep), zb, zkey, f, f), tst, 1),
      Program("target.verify", "target", verify,
              (tparams, tcache, zi, toks((b, k), rep), flts((b, k, v), rep), zb, zkey, f, f), tst, 1),
      Program("draft.prefill", "draft", prefill, (dparams, toks((b, t_pad), dsh), di, dcache), dst, 3),
      Program("draft.propose (backup)", "draft", draft_propose,
              (dparams, dcache, None, toks((b, 2), dsh), di, dkey, df, df, df), dict(dst, k=k, saguaro_top=0), 1),
      Program("draft.tree (glue+fork+tree)", "draft", draft_tree,
              (dparams, dcache, None, toks((b, 2), dsh), toks((b, k), dsh), di, dkey, df, df, df),
              dict(dst, k=k, fan_out=tuple(fan_out), saguaro_top=0), 1),
      # a hit's q, picked where the cache lies (the outcome is found on the host: speculator.find)
      Program("draft.pick_branch", "draft", pick_branch, (flts((b, n, k, v_out), dsh), di), {}),
      Program("draft.serve_q", "draft", serve_q, (dparams, flts((b, k, v_out), dsh)), dict(cfg=dcfg)),
      Program("draft.merge_rows", "draft", merge_rows, (_sds((b,), jnp.bool_, dsh), toks((b, k), dsh),
                                                        flts((b, k, v), dsh), toks((b, k), dsh), flts((b, k, v), dsh)),
              {}),
      Program("draft.random_speculation", "draft", random_speculation, (dkey,), dict(batch=b, k=k, vocab=v)),
      Program("draft.point_mass", "draft", point_mass, (toks((b, k), dsh),), dict(vocab=v)),
  ]
  if sd_k != k:
    progs.append(Program(f"target.verify (SD, K={sd_k})", "target", verify,
                         (tparams, tcache, zi, toks((b, sd_k), rep), flts((b, sd_k, v), rep), zb, zkey, f, f), tst, 1))
  progs.append(Program(f"sd.chain_after (K={sd_k}, on the target mesh)", "target", chain_after,
                       (sd_dparams, sd_dcache, None, toks((b, 2), rep), zi, toks((b, sd_k), rep), zi, zi, zb, zkey,
                        f, f, f),
                       dict(cfg=dcfg, attn_impl=attn_impl, platform=tst["platform"], k=sd_k, saguaro_top=0), 1,
                       model="draft"))
  dmesh = Mesh(np.asarray([layout.draft]), (TP,))
  return [dataclasses.replace(p, mesh=mesh if p.side == "target" else dmesh, model=p.model or p.side) for p in progs]
