"""Builds and registers the project's C++ XLA:CPU FFI kernels (ssd_jax/kernels/cpu/*.cc).

Each kernel is compiled with the system C++ compiler on first use and cached (by source hash and CPU model and flags) under
~/.cache/ssd-jax/kernels. Where that is impossible (no compiler, another platform, SSD_JAX_NO_CPU_KERNELS set)
`available(name)` is False and callers use plain jnp code.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import subprocess
import sys
import threading

import jax

_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpu")
_LOCK = threading.Lock()
_STATE: dict[str, bool] = {}  # source name -> whether its targets are registered (after the first attempt)


def _cache_dir() -> str:
  return os.path.join(os.environ.get("SSD_JAX_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "ssd-jax")),
                      "kernels")


def _cpu_signature() -> str:
  """Returns what -march=native compiles for: the machine, CPU model and instruction-set flags. A cache directory
  copied to another machine (a cloned home, a shared volume) must not hand it a kernel built for instructions it
  lacks; platform.processor() alone is often just 'x86_64'."""
  sig = [platform.machine(), platform.processor()]
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        key = line.split(":", 1)[0].strip()
        if key in ("vendor_id", "model name", "flags", "Features", "CPU part"):
          sig.append(line.strip())
        elif not line.strip() and len(sig) > 2:
          break  # the first processor's block is enough
  except OSError:
    pass
  return "\n".join(sig)


def _build(name: str) -> str:
  src = os.path.join(_DIR, name + ".cc")
  with open(src, "rb") as f:
    src_hash = hashlib.sha256(f.read()).hexdigest()[:16]
  cpu = hashlib.sha256(_cpu_signature().encode()).hexdigest()[:8]
  out = os.path.join(_cache_dir(), f"{name}_{src_hash}_{cpu}.so")
  if os.path.exists(out):
    return out
  os.makedirs(_cache_dir(), exist_ok=True)
  cxx = os.environ.get("CXX", "g++")
  tmp = f"{out}.{os.getpid()}.tmp"
  # -fno-associative-math: sums keep the order the source gives, so a row's result does not depend on how many
  # rows share a call (the few-row kernel's unrolled and plain paths add the same terms in the same order).
  cmd = [cxx, "-O3", "-march=native", "-ffast-math", "-fno-associative-math", "-fopenmp", "-fPIC", "-shared", "-std=c++17",
         "-I", jax.ffi.include_dir(), src, "-o", tmp]
  res = subprocess.run(cmd, capture_output=True, text=True)
  if res.returncode != 0:
    raise RuntimeError(res.stderr[-2000:])
  os.replace(tmp, out)
  return out


def _switched_off() -> str | None:
  """Returns why the CPU kernels are not to be used here at all, or None."""
  if os.environ.get("SSD_JAX_NO_CPU_KERNELS"):
    return "SSD_JAX_NO_CPU_KERNELS is set"
  if jax.default_backend() != "cpu":
    return f"the backend is {jax.default_backend()!r}"
  return None


def available(name: str, targets: dict[str, str]) -> bool:
  """Returns whether ssd_jax/kernels/cpu/{name}.cc is usable, compiling it and registering `targets` ({XLA target name:
  exported symbol}) on the first call."""
  if name in _STATE:
    return _STATE[name]
  with _LOCK:
    if name not in _STATE:
      if _switched_off():
        _STATE[name] = False
        return False
      try:
        # Idle OpenMP threads must sleep, not spin: they share two cores with XLA's own threads.
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        lib = ctypes.CDLL(_build(name))
        for target, symbol in targets.items():
          jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu")
        _STATE[name] = True
      except Exception as e:  # no compiler, missing headers, ...: fall back to jnp code
        print(f"[ssd-jax] CPU kernel {name} unavailable ({type(e).__name__}: {str(e)[:200]}); using jnp code",
              file=sys.stderr)
        _STATE[name] = False
  return _STATE[name]


def require(name: str, targets: dict[str, str], fallback: str) -> None:
  """Like `available`, but raises a RuntimeError naming `fallback` (what to call instead) when the kernel is not
  usable, instead of letting XLA fail later with an unregistered custom call."""
  if not available(name, targets):
    why = _switched_off() or "it did not build (the message above says why)"
    raise RuntimeError(f"the C++ CPU kernel {name} is not available: {why}; use {fallback} instead")
