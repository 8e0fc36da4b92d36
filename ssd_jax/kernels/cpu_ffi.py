"""Builds and registers the project's C++ XLA:CPU FFI kernels (ssd_jax/kernels/cpu/*.cc).

Each kernel is compiled with the system C++ compiler on first use, for this CPU (-march=native), and cached (by the
sources' hash, the flags and the CPU model and flags) under ~/.cache/ssd-jax/kernels. `build(name, arch)` also
compiles for another x86-64 level (the tests check every vector width's code path on one machine). Where building is
impossible (no compiler, another platform, SSD_JAX_NO_CPU_KERNELS set) `available(name)` is False and callers use
plain jnp code.
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
_VARIANTS: dict[tuple[str, str], dict[str, str]] = {}  # (source name, arch) -> {target: registered name}


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


# Instruction sets a kernel can be built for. "native" is what the kernels run with (-march=native: this CPU's
# vector width and tuning); the others exist so that one machine can check the code paths of the others (the tests
# build each that this CPU can execute). "x86-64-v3-zen" is AVX2 with GCC's AMD Zen tuning, which declines to
# contract multiply-add chains into FMAs: the one combination that broke row-count invariance on an EPYC before the
# kernels wrote every FMA out.
ARCH_FLAGS = {
    "native": ["-march=native"],
    "x86-64-v4": ["-march=x86-64-v4"],          # AVX-512
    "x86-64-v3": ["-march=x86-64-v3"],          # AVX2 + FMA
    "x86-64-v3-zen": ["-march=x86-64-v3", "-mtune=znver3"],
    "x86-64": ["-march=x86-64"],                # SSE2 only: the portable fallback, no FMA
}
# CPU flags (/proc/cpuinfo) each x86 level needs to run.
_ARCH_NEEDS = {"x86-64-v4": {"avx512f", "avx512bw", "avx512dq", "avx512vl", "avx2", "fma"},
               "x86-64-v3": {"avx2", "fma", "bmi2", "f16c", "movbe"},
               "x86-64-v3-zen": {"avx2", "fma", "bmi2", "f16c", "movbe"},
               "x86-64": set()}


def _cpu_flags() -> set[str]:
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.split(":", 1)[0].strip() == "flags":
          return set(line.split(":", 1)[1].split())
  except OSError:
    pass
  return set()


def runs_here(arch: str) -> bool:
  """Returns whether code built for `arch` (a key of ARCH_FLAGS) can execute on this CPU."""
  if arch == "native":
    return True
  if platform.machine() not in ("x86_64", "AMD64"):
    return False
  return _ARCH_NEEDS[arch] <= _cpu_flags()


# Floating point as the source writes it: no reassociation, no contraction (every FMA in the kernels is written out
# explicitly, so whether a multiply-add is fused is decided in the code, the same for every template instance and
# every tuning), no reciprocal tricks. What remains of -ffast-math (no errno, no traps) cannot change a result.
_FP_FLAGS = ["-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math"]


# No OpenMP: the kernels split their work over XLA's own intra-op thread pool (cpu/parallel.h), one pool for the
# process, whose threads sleep between calls.
BUILD_FLAGS = ["-pthread", "-fPIC", "-shared", "-std=c++17"]


def build(name: str, arch: str = "native") -> str:
  """Returns the path of ssd_jax/kernels/cpu/{name}.cc compiled for `arch` (ARCH_FLAGS), building it if needed."""
  src = os.path.join(_DIR, name + ".cc")
  h = hashlib.sha256()
  for path in [src] + sorted(os.path.join(_DIR, f) for f in os.listdir(_DIR) if f.endswith(".h")):
    with open(path, "rb") as f:
      h.update(f.read())
  src_hash = h.hexdigest()[:16]
  flags = ["-O3", *ARCH_FLAGS[arch], *_FP_FLAGS, *BUILD_FLAGS]
  # The key covers the source, the flags and (for -march=native) the CPU: a cache copied to another machine must not
  # hand it a kernel built for instructions it lacks.
  key = hashlib.sha256((" ".join(flags) + (_cpu_signature() if arch == "native" else "")).encode()).hexdigest()[:8]
  suffix = "" if arch == "native" else "_" + arch.replace("-", "_")
  out = os.path.join(_cache_dir(), f"{name}{suffix}_{src_hash}_{key}.so")
  if os.path.exists(out):
    return out
  os.makedirs(_cache_dir(), exist_ok=True)
  cxx = os.environ.get("CXX", "g++")
  tmp = f"{out}.{os.getpid()}.tmp"
  res = subprocess.run([cxx, *flags, "-I", jax.ffi.include_dir(), src, "-o", tmp], capture_output=True, text=True)
  if res.returncode != 0:
    raise RuntimeError(res.stderr[-2000:])
  os.replace(tmp, out)
  return out


def kernel_arch() -> str:
  """Returns the instruction set the decoding kernels are built for: $SSD_JAX_CPU_ARCH (a key of ARCH_FLAGS: e.g.
  x86-64-v3 for a cache shared by AVX2 and AVX-512 hosts, or to run another level's code path end to end), else
  "native"."""
  arch = os.environ.get("SSD_JAX_CPU_ARCH", "native")
  if arch not in ARCH_FLAGS:
    raise ValueError(f"SSD_JAX_CPU_ARCH={arch!r} is not one of {', '.join(ARCH_FLAGS)}")
  if not runs_here(arch):
    raise ValueError(f"SSD_JAX_CPU_ARCH={arch!r}: this CPU lacks its instructions")
  return arch


def _register(lib_path: str, targets: dict[str, str], suffix: str = "") -> dict[str, str]:
  """Loads a built kernel library and registers each {target: symbol} as target + suffix; returns {target: registered
  name}."""
  lib = ctypes.CDLL(lib_path)
  names = {t: t + suffix for t in targets}
  for target, symbol in targets.items():
    jax.ffi.register_ffi_target(names[target], jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu")
  return names


def register_variant(name: str, targets: dict[str, str], arch: str) -> dict[str, str]:
  """Builds {name}.cc for `arch` and registers its targets under names of their own; returns {target: variant
  target}. For tests that check another instruction set's code path on this machine."""
  if arch == "native":
    if not available(name, targets):
      raise RuntimeError(f"the C++ CPU kernel {name} is not available")
    return {t: t for t in targets}
  key = (name, arch)
  if key not in _VARIANTS:
    with _LOCK:
      _VARIANTS[key] = _register(build(name, arch), targets, f"__{arch.replace('-', '_')}")
  return _VARIANTS[key]


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
        _register(build(name, kernel_arch()), targets)
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
