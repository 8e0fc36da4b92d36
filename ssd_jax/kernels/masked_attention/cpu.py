"""Masked attention by a C++ XLA:CPU kernel (ssd_jax/kernels/cpu/masked_attention.cc) that walks only the slots each
query sees, with an online softmax: at decode it costs the visible prefix, not the whole cache and a dense mask."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding

from .. import cpu_ffi
from ..mask import MaskInfo, kernel_specs
from .ref import ref_attention


_CPU_TARGETS = {"ssd_masked_attention": "SsdMaskedAttention", "ssd_vector_exp": "SsdVectorExp"}


def cpu_attention_available() -> bool:
  """Returns whether the C++ CPU kernel (cpu/masked_attention.cc) is usable, building it on first call."""
  return cpu_ffi.available("masked_attention", _CPU_TARGETS)


def _cpu_local(q, k, v, vis_end, tree_start, tree_branch, tree_depth, tree_width: int,
               target: str = "ssd_masked_attention"):
  out = jax.ShapeDtypeStruct(q.shape, jnp.float32)
  return jax.ffi.ffi_call(target, out)(q, k, v, vis_end, tree_start, tree_branch, tree_depth,
                                                      tree_width=np.int64(tree_width))


@functools.lru_cache(maxsize=None)
def _cpu_partitioned(tree_width: int):
  """The kernel call with a sharding rule, so on a mesh each device attends over its own rows and KV heads instead
  of XLA gathering the whole cache onto every device before the custom call."""

  @custom_partitioning
  def call(q, k, v, vis_end, tree_start, tree_branch, tree_depth):
    return _cpu_local(q, k, v, vis_end, tree_start, tree_branch, tree_depth, tree_width)

  def infer(mesh, arg_shapes, result_shape):
    return NamedSharding(mesh, kernel_specs(arg_shapes[0].sharding, arg_shapes[1].sharding)[0])

  def partition(mesh, arg_shapes, result_shape):
    qs, kvs, meta, start = kernel_specs(arg_shapes[0].sharding, arg_shapes[1].sharding)
    lower = functools.partial(_cpu_local, tree_width=tree_width)
    args = tuple(NamedSharding(mesh, x) for x in (qs, kvs, kvs, meta, start, meta, meta))
    return mesh, lower, NamedSharding(mesh, qs), args

  call.def_partition(partition=partition, infer_sharding_from_operands=infer,
                     sharding_rule="b t h d, b s g d, b s g d, b t, b, b t, b t -> b t h d")
  return call


@functools.partial(jax.custom_vjp, nondiff_argnums=(7,))
def _cpu_attention(q, k, v, vis_end, tree_start, tree_branch, tree_depth, tree_width):
  return _cpu_partitioned(tree_width)(q, k, v, vis_end, tree_start, tree_branch, tree_depth)


def _cpu_fwd(q, k, v, vis_end, tree_start, tree_branch, tree_depth, tree_width):
  res = (q, k, v, vis_end, tree_start, tree_branch, tree_depth)
  return _cpu_attention(q, k, v, vis_end, tree_start, tree_branch, tree_depth, tree_width), res


def _cpu_bwd(tree_width, res, g):
  """Gradients through the reference (training only: the draft's forward_full); the mask gets none."""
  q, k, v, vis_end, tree_start, tree_branch, tree_depth = res
  mask = MaskInfo(vis_end, tree_start, tree_branch, tree_depth, tree_width)
  _, vjp = jax.vjp(lambda q, k, v: ref_attention(q, k, v, mask), q, k, v)
  return (*vjp(g), None, None, None, None)


_cpu_attention.defvjp(_cpu_fwd, _cpu_bwd)


def cpu_attention(q, k, v, mask: MaskInfo):
  """Returns `ref_attention(q, k, v, mask)` from the C++ CPU kernel, which reads only the slots each query sees
  (float32). Builds the kernel on first use; raises a RuntimeError where it cannot (`cpu_attention_available()`
  says so beforehand; `ref_attention` is the portable path)."""
  cpu_ffi.require("masked_attention", _CPU_TARGETS, "ref_attention (attn_impl='ref')")
  if not all(x.dtype == jnp.float32 for x in (q, k, v)):
    raise TypeError(f"cpu_attention takes float32 q, k, v, got {q.dtype}, {k.dtype}, {v.dtype}; use ref_attention")
  i32 = lambda x: x.astype(jnp.int32)  # noqa: E731
  return _cpu_attention(q, k, v, i32(mask.visible_end), i32(mask.tree_start), i32(mask.tree_branch),
                        i32(mask.tree_depth), mask.tree_width)


def cpu_attention_variant(arch: str):
  """Returns cpu_attention(q, k, v, mask) through the kernel built for `arch` (a key of cpu_ffi.ARCH_FLAGS), on one
  device and without a gradient: tests check another instruction set's code path on this machine with it."""
  target = cpu_ffi.register_variant("masked_attention", _CPU_TARGETS, arch)["ssd_masked_attention"]

  def call(q, k, v, mask: MaskInfo):
    i32 = lambda x: x.astype(jnp.int32)  # noqa: E731
    return _cpu_local(q, k, v, i32(mask.visible_end), i32(mask.tree_start), i32(mask.tree_branch),
                      i32(mask.tree_depth), mask.tree_width, target)

  return call


def cpu_vector_exp(x, arch: str = "native"):
  """Returns exp of the float32 array x (flattened) as [2, x.size]: the kernel's vector form, then its scalar form
  (simd.h's Exp), built for `arch`. For tests of the softmax's exp: its accuracy and that the forms agree."""
  target = cpu_ffi.register_variant("masked_attention", _CPU_TARGETS, arch)["ssd_vector_exp"]
  x = jnp.ravel(jnp.asarray(x, jnp.float32))
  return jax.ffi.ffi_call(target, jax.ShapeDtypeStruct((2, x.size), jnp.float32))(x)
