"""Few-row matrix products on XLA:CPU through a small C++ FFI kernel (kernels/cpu/rows_matmul.cc).

The kernel is compiled with the system C++ compiler on first use and cached (by source hash and CPU) under
~/.cache/ssd-jax. Where that is impossible (no compiler, another platform) `available()` is False and callers use
plain jnp products. `ref_rows_matmul` is the reference.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import subprocess
import sys
import threading

import jax
import jax.numpy as jnp
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec as P

_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpu", "rows_matmul.cc")
_LOCK = threading.Lock()
_STATE = {"loaded": None}  # None: not tried; True / False after the first attempt


def _cache_dir() -> str:
  return os.path.join(os.environ.get("SSD_JAX_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "ssd-jax")),
                      "kernels")


def _build() -> str:
  with open(_SRC, "rb") as f:
    src_hash = hashlib.sha256(f.read()).hexdigest()[:16]
  cpu = hashlib.sha256((platform.machine() + platform.processor()).encode()).hexdigest()[:8]
  out = os.path.join(_cache_dir(), f"rows_matmul_{src_hash}_{cpu}.so")
  if os.path.exists(out):
    return out
  os.makedirs(_cache_dir(), exist_ok=True)
  cxx = os.environ.get("CXX", "g++")
  cmd = [cxx, "-O3", "-march=native", "-ffast-math", "-fopenmp", "-fPIC", "-shared", "-std=c++17",
         "-I", jax.ffi.include_dir(), _SRC, "-o", out + ".tmp"]
  res = subprocess.run(cmd, capture_output=True, text=True)
  if res.returncode != 0:
    raise RuntimeError(res.stderr[-2000:])
  os.replace(out + ".tmp", out)
  return out


def available() -> bool:
  """Returns whether the CPU kernel is usable (compiling and registering it on first call)."""
  if _STATE["loaded"] is not None:
    return _STATE["loaded"]
  with _LOCK:
    if _STATE["loaded"] is None:
      if os.environ.get("SSD_JAX_NO_CPU_KERNELS") or jax.default_backend() != "cpu":
        _STATE["loaded"] = False
        return False
      try:
        # Idle OpenMP threads must sleep, not spin: they share two cores with XLA's own threads.
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        lib = ctypes.CDLL(_build())
        jax.ffi.register_ffi_target("ssd_rows_matmul", jax.ffi.pycapsule(lib.SsdRowsMatmul), platform="cpu")
        jax.ffi.register_ffi_target("ssd_rows_matmul_t", jax.ffi.pycapsule(lib.SsdRowsMatmulT), platform="cpu")
        _STATE["loaded"] = True
      except Exception as e:  # no compiler, missing headers, ...: fall back to jnp products
        print(f"[ssd-jax] CPU few-row kernel unavailable ({type(e).__name__}: {str(e)[:200]}); using XLA's products",
              file=sys.stderr)
        _STATE["loaded"] = False
  return _STATE["loaded"]


def ref_rows_matmul(x, w, transposed: bool = False):
  """Returns x @ w ([K, N] weights) or x @ w.T ([N, K] weights when transposed)."""
  return jnp.einsum("...k,nk->...n", x, w) if transposed else x @ w


def _ffi_local(x, w, transposed: bool):
  n = w.shape[0] if transposed else w.shape[1]
  out = jax.ShapeDtypeStruct(x.shape[:-1] + (n,), jnp.float32)
  name = "ssd_rows_matmul_t" if transposed else "ssd_rows_matmul"
  return jax.ffi.ffi_call(name, out)(x, w)


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
  """Returns x @ w (or x @ w.T) through the CPU kernel; float32 only (callers check `available()` first)."""
  return _rows(x, w, transposed)
