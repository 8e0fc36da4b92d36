"""Masked attention by Pallas flash-decoding kernels that rebuild the mask per key block from the metadata.

On GPU (Triton lowering) each program owns one KV head, one block of query rows (all T queries times the H/G query
heads that share that KV head, so a key block is read once per group) and one split of the cache; the splits' partial
softmaxes are merged by log-sum-exp afterwards. On TPU (Mosaic) each program owns one block of query rows for all KV
heads and walks the cache block by block along a sequential grid axis, merging into VMEM scratch. Both stop reading at
the last slot any of their rows can see. On CPU the GPU kernel runs in interpret mode (slow; for tests and checks).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.sharding import PartitionSpec as P

from ..mask import MaskInfo
from ..platform import kernel_platform

_NEG = -1e30  # finite "minus infinity": exp(_NEG - _NEG) is 1, not NaN, so masked terms are zeroed explicitly


def _row_bounds(mask: MaskInfo, heads_per_group: int, num_slots: int, rows_padded: int):
  """Returns (visible_end, tree_lo, tree_hi, end), each int32 [B, M_pad, 1], for query rows m = t * R + r.

  A row sees slots < visible_end, and, in the tree, every tree_width-th slot from tree_lo (its branch's depth-0 slot)
  up to tree_hi (its slot at its own depth); end bounds every slot it sees (clipped to the cache). Padding rows see
  nothing.
  """
  vis_end = mask.visible_end.astype(jnp.int32)
  if mask.tree_width > 0:
    lo = (mask.tree_start[:, None] + mask.tree_branch).astype(jnp.int32)
    hi = lo + mask.tree_depth.astype(jnp.int32) * mask.tree_width
    end = jnp.maximum(vis_end, jnp.where(mask.tree_depth >= 0, hi + 1, 0))
  else:
    lo, hi, end = jnp.zeros_like(vis_end), jnp.full_like(vis_end, -1), vis_end
  end = jnp.clip(end, 0, num_slots)
  rows = vis_end.shape[1] * heads_per_group
  pad_values = (0, 0, -1, 0)
  out = []
  for x, pad_value in zip((vis_end, lo, hi, end), pad_values):
    x = jnp.repeat(x, heads_per_group, axis=1)
    x = jnp.pad(x, ((0, 0), (0, rows_padded - rows)), constant_values=pad_value)
    out.append(x[:, :, None])
  return tuple(out)


def _visible_block(slot, vis_end, tree_lo, tree_hi, tree_width: int):
  """Returns [M, C] bool: whether row m (bounds [M, 1] from `_row_bounds`) sees the key at slot[0, c] ([1, C]).

  The same rule as `visible_mask`; the remainder is only taken of non-negative offsets, so truncating `lax.rem` is
  exact and lowers on every backend.
  """
  vis = slot < vis_end
  if tree_width > 0:
    rel = slot - tree_lo
    own = (rel >= 0) & (slot <= tree_hi)
    if tree_width > 1:
      own = own & (lax.rem(rel, jnp.full_like(rel, tree_width)) == 0)
    vis = vis | own
  return vis


def _online_softmax_step(q, k, v, vis, m, l, acc, scale: float):
  """Returns (m, l, acc) after folding one key block into a running softmax.

  q: [M, D]; k, v: [C, D]; vis: [M, C]; m: running max [M, 1]; l: denominator [M, 1]; acc: numerator [M, D]. All
  running state is float32; masked scores contribute exactly 0 (not exp(0)) so a row that has seen nothing keeps l = 0.
  """
  s = lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32) * scale
  s = jnp.where(vis, s, _NEG)
  m_new = jnp.maximum(m, jnp.max(s, axis=1, keepdims=True))
  alpha = jnp.exp(m - m_new)
  p = jnp.where(vis, jnp.exp(s - m_new), 0.0)
  l = alpha * l + jnp.sum(p, axis=1, keepdims=True)
  pv = lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
  return m_new, l, alpha * acc + pv


def _split_kernel(q_ref, end_ref, vis_ref, lo_ref, hi_ref, k_ref, v_ref, acc_ref, m_ref, l_ref, *, block_k: int,
                  split_k: int, tree_width: int, scale: float):
  """One program (row b, KV head g, query block i, cache split s): unnormalised softmax over its split.

  Refs: q [Mb, D]; end/vis/lo/hi [Mb, 1]; k, v [split_k, D] (this KV head's lanes of the split); outputs acc [Mb, D],
  m, l [Mb, 1]. Only the key blocks below the block's last visible slot are read.
  """
  base = pl.program_id(3) * split_k
  q = q_ref[...]
  vis_end, lo, hi = vis_ref[...], lo_ref[...], hi_ref[...]
  kv_end = jnp.max(end_ref[...])
  n_blocks = jnp.clip(lax.div(kv_end - base + (block_k - 1), jnp.int32(block_k)), 0, split_k // block_k)

  def body(j, carry):
    start = pl.multiple_of(j * block_k, block_k)
    k = k_ref[pl.ds(start, block_k), :].astype(q.dtype)
    v = v_ref[pl.ds(start, block_k), :].astype(q.dtype)
    slot = base + start + lax.broadcasted_iota(jnp.int32, (1, block_k), 1)
    vis = _visible_block(slot, vis_end, lo, hi, tree_width)
    return _online_softmax_step(q, k, v, vis, *carry, scale)

  rows = q.shape[0]
  init = (jnp.full((rows, 1), _NEG, jnp.float32), jnp.zeros((rows, 1), jnp.float32),
          jnp.zeros(q.shape, jnp.float32))
  m, l, acc = lax.fori_loop(0, n_blocks, body, init)
  acc_ref[...] = acc
  m_ref[...] = m
  l_ref[...] = l


def _mosaic_kernel(kv_end_ref, q_ref, vis_ref, lo_ref, hi_ref, k_ref, v_ref, o_ref, m_scr, l_scr, acc_scr, *,
                   groups: int, head_dim: int, block_k: int, tree_width: int, scale: float):
  """One grid step (row b, query block i, key block j) of the TPU kernel; j is sequential and accumulates in scratch.

  Refs: kv_end [B, NQ] (SMEM, scalar prefetch); q [G, Mb, D]; vis/lo/hi [Mb, 1]; k, v [block_k, G*D] (all KV heads'
  lanes, a layout-legal block whatever D is); o [G, Mb, D]; scratch m, l [G, Mb, 1] and acc [G, Mb, D] float32.
  Steps past the last visible slot skip the compute, and their index map repeats the previous block so no DMA is issued.
  """
  b, i, j = pl.program_id(0), pl.program_id(1), pl.program_id(2)

  @pl.when(j == 0)
  def _init():
    m_scr[...] = jnp.full(m_scr.shape, _NEG, jnp.float32)
    l_scr[...] = jnp.zeros(l_scr.shape, jnp.float32)
    acc_scr[...] = jnp.zeros(acc_scr.shape, jnp.float32)

  @pl.when(j * block_k < kv_end_ref[b, i])
  def _step():
    slot = j * block_k + lax.broadcasted_iota(jnp.int32, (1, block_k), 1)
    vis = _visible_block(slot, vis_ref[...], lo_ref[...], hi_ref[...], tree_width)
    for g in range(groups):
      q = q_ref[g]
      k = k_ref[:, g * head_dim:(g + 1) * head_dim].astype(q.dtype)
      v = v_ref[:, g * head_dim:(g + 1) * head_dim].astype(q.dtype)
      m, l, acc = _online_softmax_step(q, k, v, vis, m_scr[g], l_scr[g], acc_scr[g], scale)
      m_scr[g], l_scr[g], acc_scr[g] = m, l, acc

  @pl.when(j == pl.num_programs(2) - 1)
  def _finish():
    l = l_scr[...]
    o_ref[...] = (acc_scr[...] / jnp.where(l > 0, l, 1.0)).astype(o_ref.dtype)


def _round_up(x: int, m: int) -> int:
  return -(-x // m) * m


def _cost(q, k, out_bytes: int) -> pl.CostEstimate:
  """Returns the compiler's cost hint: two matmuls and one exp per (query head, slot), the cache read once."""
  b, t, h, d = q.shape
  s = k.shape[1]
  kv_bytes = 2 * k.size * k.dtype.itemsize
  return pl.CostEstimate(flops=4 * b * t * h * s * d, transcendentals=b * t * h * s,
                         bytes_accessed=kv_bytes + q.size * q.dtype.itemsize + out_bytes)


@functools.partial(jax.jit, static_argnames=("kernel", "interpret", "block_q", "block_k", "split_k", "platform"))
def pallas_attention(q, k, v, mask: MaskInfo, *, kernel: str | None = None, interpret: bool | None = None,
                     block_q: int | None = None, block_k: int | None = None, split_k: int | None = None,
                     platform: str | None = None):
  """Returns `ref_attention(q, k, v, mask)` computed by a Pallas kernel, [B, T, H, D] in q's dtype.

  kernel: 'triton' (GPU layout: grid (B, G, query blocks, cache splits), partial softmaxes merged by log-sum-exp
  after the call) or 'mosaic' (TPU layout: grid (B, query blocks, key blocks), merged in VMEM); default 'mosaic' for
  TPU, else 'triton'. interpret: run the kernel in interpret mode (default: for CPU). platform: what the program is
  compiled for (None: the default backend), which sets both defaults. block_q: query rows (queries x
  the H/G heads of one KV head) per program; block_k: keys per inner step; split_k: cache slots per program (triton
  only; default: enough splits to fill a GPU, 256-1024 slots each). Static: all keyword arguments, the shapes and
  mask.tree_width.
  Scores accumulate in float32; the probabilities meet V in the compute dtype (bfloat16 for a bfloat16 cache).
  Padding that costs a copy of the cache: S to a multiple of block_k, and for triton D to a power of two >= 16.
  On a mesh each device runs the kernel over its own rows and KV heads (`_partitioned`).
  """
  backend = kernel_platform(platform)
  kernel = kernel or ("mosaic" if backend == "tpu" else "triton")
  if kernel not in ("triton", "mosaic"):
    raise ValueError(f"unknown Pallas attention kernel {kernel!r}; choose 'triton' or 'mosaic'")
  if interpret is None:
    interpret = backend == "cpu"
  if q.shape[2] % k.shape[2]:
    raise ValueError(f"query heads {q.shape[2]} must be a multiple of key/value heads {k.shape[2]}")
  options = (("kernel", kernel), ("interpret", interpret), ("block_q", block_q), ("block_k", block_k),
             ("split_k", split_k))
  return _partitioned(mask.tree_width, options)(q, k, v, mask.visible_end, mask.tree_start, mask.tree_branch,
                                                mask.tree_depth)


def _partitioned(tree_width: int, options: tuple):
  """Returns the kernel call for this mesh: XLA cannot partition a Pallas (Mosaic or Triton) call, so under a mesh
  (`jax.set_mesh`, which Programs and the plan lower under) each device attends over its own KV heads and their
  query heads through shard_map (GQA groups stay whole: query head h reads KV head h // (H / G)); without a mesh,
  the plain call."""
  def local(q, k, v, vis_end, tree_start, tree_branch, tree_depth):
    return _local(q, k, v, MaskInfo(vis_end, tree_start, tree_branch, tree_depth, tree_width), **dict(options))

  def call(q, k, v, *meta):
    mesh = jax.sharding.get_abstract_mesh()
    n = 1 if mesh.empty else mesh.size
    if n == 1:
      return local(q, k, v, *meta)
    # Heads that do not divide the mesh are replicated (as the sharding rules leave them): every device runs them all.
    heads = P() if k.shape[2] % n or q.shape[2] % n else P(None, None, mesh.axis_names, None)
    return jax.shard_map(local, mesh=mesh, in_specs=(heads, heads, heads, P(), P(), P(), P()), out_specs=heads,
                         check_vma=False)(q, k, v, *meta)
  return call


def _local(q, k, v, mask: MaskInfo, *, kernel: str, interpret: bool, block_q: int | None, block_k: int | None,
           split_k: int | None):
  """Returns attention [B, T, H, D] in q's dtype by the chosen kernel on one device's arrays."""
  b, t, h, d = q.shape
  s, g = k.shape[1], k.shape[2]
  r = h // g
  rows = t * r
  scale = d ** -0.5
  compute_dtype = jnp.promote_types(q.dtype, k.dtype)
  # Rows of one KV head: query t, head r within the group -> row t * R + r (GQA: one key block serves them all).
  qg = q.astype(compute_dtype).reshape(b, t, g, r, d).transpose(0, 2, 1, 3, 4).reshape(b, g, rows, d)

  if kernel == "triton":
    block_k = block_k or 64
    bq = max(16, min(block_q or 64, pl.next_power_of_2(rows)))  # Triton dots need >= 16 rows, power-of-two tiles
    dp = max(16, pl.next_power_of_2(d))
  else:
    block_k = block_k or 128
    bq = min(_round_up(block_q or 128, 16), _round_up(rows, 16))  # a sublane-tile multiple, bf16's (16) included
    dp = d
  rows_p = _round_up(rows, bq)
  s_p = _round_up(s, block_k)
  if s_p != s or dp != d:
    k = jnp.pad(k, ((0, 0), (0, s_p - s), (0, 0), (0, dp - d)))
    v = jnp.pad(v, ((0, 0), (0, s_p - s), (0, 0), (0, dp - d)))
  qg = jnp.pad(qg, ((0, 0), (0, 0), (0, rows_p - rows), (0, dp - d)))
  k2, v2 = k.reshape(b, s_p, g * dp), v.reshape(b, s_p, g * dp)  # free view: KV head g is lanes [g*D, (g+1)*D)
  vis_end, lo, hi, end = _row_bounds(mask, r, s, rows_p)

  if kernel == "triton":
    out = _triton_call(qg, k2, v2, (end, vis_end, lo, hi), q, k, block_q=bq, block_k=block_k, split_k=split_k,
                       tree_width=mask.tree_width, scale=scale, interpret=interpret)
  else:
    out = _mosaic_call(qg, k2, v2, (end, vis_end, lo, hi), q, k, block_q=bq, block_k=block_k,
                       tree_width=mask.tree_width, scale=scale, interpret=interpret)
  out = out[:, :, :rows, :d].reshape(b, g, t, r, d).transpose(0, 2, 1, 3, 4)
  return out.reshape(b, t, h, d).astype(q.dtype)


def _meta_spec(block_q: int, index_map):
  """The BlockSpec of a per-row metadata array [B, rows, 1]: block_q rows a program."""
  return pl.BlockSpec((None, block_q, 1), index_map)


def _triton_call(qg, k2, v2, meta, q, k, *, block_q: int, block_k: int, split_k: int | None, tree_width: int,
                 scale: float, interpret: bool):
  """Returns attention [B, G, rows, Dp] (float32) in the GPU layout: grid (B, G, query blocks, cache splits), the
  splits' partial softmaxes merged by log-sum-exp after the call. qg [B, G, rows, Dp]; k2, v2 [B, S, G * Dp];
  meta: (end, vis_end, lo, hi), each [B, rows, 1]; q, k: the caller's (padded) inputs, for the cost estimate."""
  end, vis_end, lo, hi = meta
  b, g, rows_p, dp = qg.shape
  s_p, bq = k2.shape[1], block_q
  nq = rows_p // bq
  if split_k is None:
    # Enough programs to fill a GPU (about 2 per SM of an H200's 132), but splits long enough that the partial
    # results written per split stay well below the keys and values it reads. A guess until measured.
    split_k = min(1024, max(256, pl.cdiv(s_p, pl.cdiv(256, b * g * nq))))
  split_k = min(max(block_k, split_k // block_k * block_k), s_p)
  ns = pl.cdiv(s_p, split_k)
  compiler_params = None
  if not interpret:  # Triton's parameters also select the Triton lowering (JAX's GPU default is Mosaic GPU)
    from jax.experimental.pallas import triton as plgpu
    compiler_params = plgpu.CompilerParams(num_warps=4, num_stages=2)
  part_shape = (b, g, ns, rows_p)
  acc, m, l = pl.pallas_call(
      functools.partial(_split_kernel, block_k=block_k, split_k=split_k, tree_width=tree_width, scale=scale),
      grid=(b, g, nq, ns),
      in_specs=[pl.BlockSpec((None, None, bq, dp), lambda bi, gi, qi, si: (bi, gi, qi, 0))]
      + [_meta_spec(bq, lambda bi, gi, qi, si: (bi, qi, 0))] * 4
      + [pl.BlockSpec((None, split_k, dp), lambda bi, gi, qi, si: (bi, si, gi))] * 2,
      out_specs=[pl.BlockSpec((None, None, None, bq, dp), lambda bi, gi, qi, si: (bi, gi, si, qi, 0)),
                 pl.BlockSpec((None, None, None, bq, 1), lambda bi, gi, qi, si: (bi, gi, si, qi, 0)),
                 pl.BlockSpec((None, None, None, bq, 1), lambda bi, gi, qi, si: (bi, gi, si, qi, 0))],
      out_shape=[jax.ShapeDtypeStruct(part_shape + (dp,), jnp.float32),
                 jax.ShapeDtypeStruct(part_shape + (1,), jnp.float32),
                 jax.ShapeDtypeStruct(part_shape + (1,), jnp.float32)],
      interpret=interpret, compiler_params=compiler_params, name="masked_attention_split",
      cost_estimate=_cost(q, k, 4 * b * g * ns * rows_p * (dp + 2)),
  )(qg, end, vis_end, lo, hi, k2, v2)
  # Merge the splits' partial softmaxes (log-sum-exp): rescale each to the common max, then normalise once.
  w = jnp.exp(m - jnp.max(m, axis=2, keepdims=True))
  l_tot = jnp.sum(w * l, axis=2)
  return jnp.sum(w * acc, axis=2) / jnp.where(l_tot > 0, l_tot, 1.0)


def _mosaic_call(qg, k2, v2, meta, q, k, *, block_q: int, block_k: int, tree_width: int, scale: float,
                 interpret: bool):
  """Returns attention [B, G, rows, D] in q's dtype in the TPU layout: grid (B, query blocks, key blocks), merged in
  VMEM, key blocks past the last slot any row of a query block sees never fetched. Arguments as _triton_call's."""
  from jax.experimental.pallas import tpu as pltpu

  end, vis_end, lo, hi = meta
  b, g, rows_p, d = qg.shape
  bq = block_q
  nq, nb = rows_p // bq, k2.shape[1] // block_k
  kv_end = jnp.max(end[:, :, 0].reshape(b, nq, bq), axis=2)  # [B, NQ]: last slot any row of the block sees

  def kv_map(bi, qi, ji, kv_end_ref):
    last = jnp.maximum(lax.div(kv_end_ref[bi, qi] + (block_k - 1), jnp.int32(block_k)) - 1, 0)
    return bi, jnp.minimum(ji, last), 0

  grid_spec = pltpu.PrefetchScalarGridSpec(
      num_scalar_prefetch=1, grid=(b, nq, nb),
      in_specs=[pl.BlockSpec((None, g, bq, d), lambda bi, qi, ji, e: (bi, 0, qi, 0))]
      + [_meta_spec(bq, lambda bi, qi, ji, e: (bi, qi, 0))] * 3
      + [pl.BlockSpec((None, block_k, g * d), kv_map)] * 2,
      out_specs=pl.BlockSpec((None, g, bq, d), lambda bi, qi, ji, e: (bi, 0, qi, 0)),
      scratch_shapes=[pltpu.VMEM((g, bq, 1), jnp.float32), pltpu.VMEM((g, bq, 1), jnp.float32),
                      pltpu.VMEM((g, bq, d), jnp.float32)])
  return pl.pallas_call(
      functools.partial(_mosaic_kernel, groups=g, head_dim=d, block_k=block_k, tree_width=tree_width, scale=scale),
      grid_spec=grid_spec,
      out_shape=jax.ShapeDtypeStruct((b, g, rows_p, d), q.dtype),
      interpret=pltpu.InterpretParams() if interpret else False,
      compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
      name="masked_attention_tpu", cost_estimate=_cost(q, k, q.size * q.dtype.itemsize),
  )(kv_end, qg, vis_end, lo, hi, k2, v2)
