"""Few-row matrix products on XLA:CPU through a small C++ FFI kernel (ssd_jax/kernels/cpu/rows_matmul.cc): float32 or
bfloat16 weights (`rows_matmul`), GGUF Q8_0/Q4_1 blocks (`blocks_matmul`, ssd_jax/models/blocks.py); float32
activations; and each row's sum of squares in a fixed order (`row_sum_squares`, RMSNorm's).

The kernel is compiled on first use (cpu_ffi.py). Where that is impossible (no compiler, another platform)
`available()` is False and callers use plain jnp products. `ref_rows_matmul` is the reference.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec as P

from . import cpu_ffi


_TARGETS = {"ssd_rows_matmul": "SsdRowsMatmul", "ssd_rows_matmul_t": "SsdRowsMatmulT",
            "ssd_rows_q8_0_t": "SsdRowsQ80T", "ssd_rows_q4_1_t": "SsdRowsQ41T",
            "ssd_rows_matmul_bf16": "SsdRowsMatmulBf16", "ssd_rows_matmul_bf16_t": "SsdRowsMatmulBf16T",
            "ssd_rows_sumsq": "SsdRowsSumSq"}


def available() -> bool:
  """Returns whether the CPU kernel is usable (compiling and registering it on first call)."""
  return cpu_ffi.available("rows_matmul", _TARGETS)


def ref_rows_matmul(x, w, transposed: bool = False):
  """Returns x @ w ([K, N] weights) or x @ w.T ([N, K] weights when transposed)."""
  return jnp.einsum("...k,nk->...n", x, w) if transposed else x @ w


def _ffi_local(x, w, transposed: bool, targets: dict[str, str] | None = None):
  n = w.shape[0] if transposed else w.shape[1]
  out = jax.ShapeDtypeStruct(x.shape[:-1] + (n,), jnp.float32)
  name = ("ssd_rows_matmul_bf16" if w.dtype == jnp.bfloat16 else "ssd_rows_matmul") + ("_t" if transposed else "")
  return jax.ffi.ffi_call((targets or {}).get(name, name), out)(x, w)


def _tp_specs(transposed: bool, x_ndim: int, w_sharding):
  """Returns (x spec, w spec, out spec, contracted mesh axis) for weights sharded as `w_sharding`.

  Output columns follow the weights' output axis; a sharded contraction axis splits x the same way and is summed.
  """
  w_spec = (tuple(w_sharding.spec) + (None, None))[:2]
  n_ax, k_ax = (w_spec[0], w_spec[1]) if transposed else (w_spec[1], w_spec[0])
  lead = (None,) * (x_ndim - 1)
  return P(*lead, k_ax), P(*w_spec), P(*lead, n_ax), k_ax


def _partitioned(transposed: bool):
  """Returns the kernel call with a sharding rule: on a tensor-parallel mesh each device multiplies its own shard of
  the weights (without it XLA would all-gather the full weight matrix onto every device before the custom call)."""

  @custom_partitioning
  def call(x, w):
    return _ffi_local(x, w, transposed)

  def infer(mesh, arg_shapes, result_shape):
    return NamedSharding(mesh, _tp_specs(transposed, len(arg_shapes[0].shape), arg_shapes[1].sharding)[2])

  def partition(mesh, arg_shapes, result_shape):
    xs, ws, outs, k_ax = _tp_specs(transposed, len(arg_shapes[0].shape), arg_shapes[1].sharding)

    def lower(x, w):
      y = _ffi_local(x, w, transposed)
      return jax.lax.psum(y, k_ax) if k_ax is not None else y

    return mesh, lower, NamedSharding(mesh, outs), (NamedSharding(mesh, xs), NamedSharding(mesh, ws))

  call.def_partition(partition=partition, infer_sharding_from_operands=infer,
                     sharding_rule="... k, n k -> ... n" if transposed else "... k, k n -> ... n")
  return call


_PARTITIONED = {False: _partitioned(False), True: _partitioned(True)}


def _ffi(x, w, transposed: bool):
  return _PARTITIONED[transposed](x, w)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _rows(x, w, transposed: bool):
  return _ffi(x, w, transposed)


def _rows_fwd(x, w, transposed: bool):
  return _ffi(x, w, transposed), (x, w)


def _rows_bwd(transposed: bool, res, g):
  x, w = res
  if transposed:  # y = x @ w.T with w [N, K]
    return g @ w, jnp.einsum("...k,...n->nk", x, g)
  return g @ w.T, jnp.einsum("...k,...n->kn", x, g)


_rows.defvjp(_rows_fwd, _rows_bwd)


def rows_matmul(x, w, transposed: bool = False):
  """Returns x @ w (or x @ w.T) through the CPU kernel, in float32: float32 x, float32 or bfloat16 w (widened in
  registers, exactly). Builds the kernel on first use; raises a RuntimeError where it cannot (`available()` says so
  beforehand; `ref_rows_matmul` is the portable product)."""
  cpu_ffi.require("rows_matmul", _TARGETS, "ref_rows_matmul")
  if x.dtype != jnp.float32 or w.dtype not in (jnp.float32, jnp.bfloat16):
    raise TypeError(f"rows_matmul takes float32 x and float32 or bfloat16 w, got {x.dtype} and {w.dtype}; "
                    "use ref_rows_matmul")
  if w.ndim != 2 or x.shape[-1] != w.shape[1 if transposed else 0]:
    raise ValueError(f"rows_matmul: x {x.shape} does not match w {w.shape} (transposed={transposed})")
  return _rows(x, w, transposed)


def variant(arch: str):
  """Returns rows_matmul(x, w, transposed) through the kernel built for `arch` (a key of cpu_ffi.ARCH_FLAGS), on one
  device and without a gradient: tests check another instruction set's code path on this machine with it."""
  targets = cpu_ffi.register_variant("rows_matmul", _TARGETS, arch)
  return lambda x, w, transposed=False: _ffi_local(x, w, transposed, targets)


def _blocks_local(x, w, targets: dict[str, str] | None = None):
  """x [..., C] @ dequantize_rows(w)^T [C, R] through the block kernel (w a blocks.BlockWeight)."""
  name = "ssd_rows_q8_0_t" if w.kind == "Q8_0" else "ssd_rows_q4_1_t"
  out = jax.ShapeDtypeStruct(x.shape[:-1] + (w.rows_shape[0],), jnp.float32)
  args = (w.qs, w.d) if w.m is None else (w.qs, w.d, w.m)
  return jax.ffi.ffi_call((targets or {}).get(name, name), out)(x, *args)


def blocks_matmul(x, w):
  """Returns x @ W^T for GGUF block weights w (blocks.BlockWeight, W [R, C] its rows) and float32 x [..., C], through
  the CPU kernel, on one device and without a gradient (the weights are frozen). Raises like rows_matmul where the
  kernel is not available."""
  cpu_ffi.require("rows_matmul", _TARGETS, "blocks.dot_rows(..., use_kernel=False)")
  if x.dtype != jnp.float32:
    raise TypeError(f"blocks_matmul takes float32 activations, got {x.dtype}")
  if x.shape[-1] != w.rows_shape[1]:
    raise ValueError(f"blocks_matmul: x {x.shape} does not match blocks of rows {w.rows_shape}")
  return _blocks_local(x, w)


def blocks_variant(arch: str):
  """Returns blocks_matmul(x, w) through the kernel built for `arch` (as `variant`; for tests)."""
  targets = cpu_ffi.register_variant("rows_matmul", _TARGETS, arch)
  return lambda x, w: _blocks_local(x, w, targets)


def _sum_squares_local(x, targets: dict[str, str] | None = None):
  out = jax.ShapeDtypeStruct(x.shape[:-1] + (1,), jnp.float32)
  name = (targets or {}).get("ssd_rows_sumsq", "ssd_rows_sumsq")
  return jax.ffi.ffi_call(name, out, vmap_method="broadcast_all")(x)


def _lead_spec(x_sharding, ndim: int):
  """The leading axes' split of x (rows are independent); the summed axis must be whole."""
  spec = (tuple(getattr(x_sharding, "spec", ())) + (None,) * ndim)[:ndim]
  return P(*spec[:-1], None)


@custom_partitioning
def _sum_squares_partitioned(x):
  return _sum_squares_local(x)


def _sumsq_infer(mesh, arg_shapes, result_shape):
  return NamedSharding(mesh, _lead_spec(arg_shapes[0].sharding, len(arg_shapes[0].shape)))


def _sumsq_partition(mesh, arg_shapes, result_shape):
  # Each device sums its own rows (e.g. its query heads under tensor parallelism): without this rule XLA would
  # all-gather x onto every device before the custom call.
  spec = NamedSharding(mesh, _lead_spec(arg_shapes[0].sharding, len(arg_shapes[0].shape)))
  return mesh, _sum_squares_local, spec, (spec,)


_sum_squares_partitioned.def_partition(partition=_sumsq_partition, infer_sharding_from_operands=_sumsq_infer,
                                       sharding_rule="... d -> ... o")


@jax.custom_jvp
def _sum_squares(x):
  return _sum_squares_partitioned(x)


@_sum_squares.defjvp
def _sum_squares_jvp(primals, tangents):
  (x,), (dx,) = primals, tangents
  return _sum_squares(x), 2.0 * jnp.sum(x * dx, axis=-1, keepdims=True)


def row_sum_squares(x):
  """Returns sum(x * x) over the last axis, kept ([..., 1], float32), for float32 x through the CPU kernel: each
  row's sum in one fixed order, whatever the number of rows (XLA's reduce promises no order: on XLA:CPU a reduction
  of 8 or more rows of 576 goes to a YNNPACK fusion that sums in another order than the loop it emits for fewer
  rows, so RMSNorm of a verify row differed from the AR row in the last bit). Raises like rows_matmul where the
  kernel is not available; `jnp.sum(x * x, -1, keepdims=True)` is the portable form."""
  cpu_ffi.require("rows_matmul", _TARGETS, "jnp.sum(x * x, -1, keepdims=True)")
  if x.dtype != jnp.float32:
    raise TypeError(f"row_sum_squares takes float32 x, got {x.dtype}")
  return _sum_squares(x)


def sum_squares_variant(arch: str):
  """Returns row_sum_squares(x) through the kernel built for `arch` (as `variant`; for tests)."""
  targets = cpu_ffi.register_variant("rows_matmul", _TARGETS, arch)
  return lambda x: _sum_squares_local(x, targets)
