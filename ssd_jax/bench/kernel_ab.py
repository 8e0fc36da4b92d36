"""A/B of a C++ CPU kernel (ssd_jax/kernels/cpu/*.cc): the source at a git revision against the working tree's, both
built here and registered side by side, timed interleaved in one process (order alternating per repetition), medians
of wall time and of the process's CPU time. scripts/dev/bench_kernel_ab.py is its command line.

Two kernels: 'blocks' (rows_matmul.cc, the GGUF block products; both builds must give the same bits) and 'attention'
(masked_attention.cc; both builds must agree within the kernel tests' 2e-5). Kernel mode times the kernel alone on
SmolLM2-135M's shapes; forward mode times the gguf target's whole forward (bench.py --verify-cost's step) with the
kernel's local call swapped for one bound to each build.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import statistics
import subprocess
import tempfile
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from ..kernels import cpu_ffi, rows_matmul
from ..kernels.mask import causal_mask_info
from ..kernels.masked_attention import cpu as attn_cpu
from ..models import blocks

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_HEADERS = ("simd.h", "parallel.h")  # a header missing at the old revision is skipped (parallel.h is newer)
CACHE = 512  # KV slots of the timed attention and forward
BLOCK_SHAPES = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]  # [R, C]


def _fail(msg: str):
  raise SystemExit(f"bench_kernel_ab: {msg}")


def build_old(source: str, old: str, arch: str) -> str:
  """Returns the path of cpu/{source}.cc (and its headers) as at git revision `old`, built for `arch`; the build is
  kept in the kernel cache under the hash of those sources and flags, so a second A/B against it does not rebuild."""
  texts = {}
  for f in (source + ".cc", *_HEADERS):
    got = subprocess.run(["git", "-C", _ROOT, "show", f"{old}:ssd_jax/kernels/cpu/{f}"], capture_output=True,
                         text=True)
    if got.returncode != 0 and f in _HEADERS:
      continue
    if got.returncode != 0:
      _fail(f"cannot read {f} at {old!r}: {got.stderr.strip()[:200]}")
    texts[f] = got.stdout
  # -fopenmp too: revisions before the kernels ran on XLA's thread pool (parallel.h) used OpenMP.
  flags = ["-O3", *cpu_ffi.ARCH_FLAGS[arch], *cpu_ffi._FP_FLAGS, "-pthread", "-fopenmp", "-fPIC", "-shared",
           "-std=c++17", "-w"]
  key = "".join(texts.values()) + " ".join(flags) + (cpu_ffi._cpu_signature() if arch == "native" else "")
  lib = os.path.join(cpu_ffi._cache_dir(), f"ab_old_{source}_{hashlib.sha256(key.encode()).hexdigest()[:16]}.so")
  if os.path.exists(lib):
    return lib
  tmp = tempfile.mkdtemp(prefix="kernel_ab_")
  for f, text in texts.items():
    with open(os.path.join(tmp, f), "w") as fh:
      fh.write(text)
  os.makedirs(cpu_ffi._cache_dir(), exist_ok=True)
  res = subprocess.run([os.environ.get("CXX", "g++"), *flags, "-I", jax.ffi.include_dir(),
                        os.path.join(tmp, source + ".cc"), "-o", os.path.join(tmp, "old.so")], capture_output=True,
                       text=True)
  if res.returncode != 0:
    _fail(f"the {old} kernel did not build: {res.stderr[-300:]}")
  os.replace(os.path.join(tmp, "old.so"), lib)
  return lib


def timed(run) -> tuple[float, float]:
  """Returns (wall ms, process CPU ms) of run()."""
  c0, t0 = time.process_time(), time.perf_counter()
  run()
  return (time.perf_counter() - t0) * 1e3, (time.process_time() - c0) * 1e3


def interleave(runs: dict, reps: int) -> dict:
  """Returns {(name, key): (median wall ms, median CPU ms)} for runs {(name, key): run}, names 'old' and 'new'."""
  got = {k: [] for k in runs}
  keys = sorted({k for _, k in runs})
  for i in range(reps):
    for key in keys:
      for name in (("old", "new") if i % 2 == 0 else ("new", "old")):
        got[name, key].append(timed(runs[name, key]))
  return {k: tuple(statistics.median(v[j] for v in got[k]) for j in (0, 1)) for k in got}


def report(got: dict, counts: list[int], what: str, head: str) -> str:
  """Returns the markdown table of interleave's medians (rows `counts`, first column titled `what`) under `head`."""
  lines = [head, f"| {what} | wall old | wall new | new/old | CPU old | CPU new | new/old |",
           "|---|---|---|---|---|---|---|"]
  for c in counts:
    (wo, co), (wn, cn) = got["old", c], got["new", c]
    lines.append(f"| {c} | {wo:.2f} | {wn:.2f} | {wn / wo:.3f} | {co:.2f} | {cn:.2f} | {cn / co:.3f} |")
  return "\n".join(lines)


@contextlib.contextmanager
def swapped(module, attr: str, replacement, clear: Callable[[], None] = lambda: None):
  """Sets module.attr to `replacement` for the block (calling `clear` on entry and on exit, for caches that hold
  the old function) and drops JAX's trace caches, so a new trace binds the replacement; restores it after."""
  local = getattr(module, attr)
  setattr(module, attr, replacement)
  clear()
  jax.clear_caches()
  try:
    yield local
  finally:
    setattr(module, attr, local)
    clear()


def _check_fits(counts: list[int], prefix: int, cache: int) -> None:
  if prefix < 0 or prefix + max(counts) > cache:
    _fail(f"--prefix {prefix} + T {max(counts)} must fit the cache of {cache}")


def random_blocks(rng, kind: str, rows: int, cols: int) -> blocks.BlockWeight:
  nb = cols // blocks.QK
  d = jnp.asarray((rng.standard_normal((rows, nb)) * 0.01).astype(np.float16))
  if kind == "Q8_0":
    return blocks.BlockWeight(jnp.asarray(rng.integers(-128, 128, (rows, cols), dtype=np.int8)), d, None, kind, False)
  m = jnp.asarray((rng.standard_normal((rows, nb)) * 0.01).astype(np.float16))
  return blocks.BlockWeight(jnp.asarray(rng.integers(0, 256, (rows, cols // 2), dtype=np.uint8)), d, m, kind, True)


def blocks_runs(targets: dict, counts: list[int], layers: int = 30, head: bool = True, **_) -> dict:
  """Returns {(name, rows): run} over `layers` layers of SmolLM2-135M's Q4_1 matrices (and its Q8_0 tied head
  [49152, 576]); exits if the builds' bits differ."""
  rng = np.random.default_rng(0)
  ws = [random_blocks(rng, "Q4_1", r, c) for _ in range(layers) for r, c in BLOCK_SHAPES]
  ws += [random_blocks(rng, "Q8_0", 49152, 576)] if head else []
  runs = {}
  for m in counts:
    xs = {c: jnp.asarray(rng.standard_normal((m, c)).astype(np.float32)) for c in (576, 1536)}
    outs = {}
    for name, tg in targets.items():
      f = jax.jit(lambda xs, ws, tg=tg: [rows_matmul._blocks_local(xs[w.rows_shape[1]], w, tg) for w in ws])
      outs[name] = jax.block_until_ready(f(xs, ws))
      runs[name, m] = lambda f=f, xs=xs: jax.block_until_ready(f(xs, ws))
    if not all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(outs["old"], outs["new"])):
      _fail(f"the two builds give different bits at {m} rows")
  return runs


def attention_runs(targets: dict, counts: list[int], layers: int = 30, prefix: int = 300, cache: int = CACHE,
                   **_) -> dict:
  """Returns {(name, T): run} over `layers` attention calls (9 query heads, 3 KV heads, head dim 64, batch 1) of T
  new tokens after `prefix` cached ones; exits if the builds disagree beyond 2e-5."""
  _check_fits(counts, prefix, cache)
  rng = np.random.default_rng(0)
  h, g, d = 9, 3, 64
  kv = [(jnp.asarray(rng.standard_normal((1, cache, g, d), dtype=np.float32)),
         jnp.asarray(rng.standard_normal((1, cache, g, d), dtype=np.float32))) for _ in range(layers)]
  runs = {}
  for t in counts:
    q = jnp.asarray(rng.standard_normal((1, t, h, d), dtype=np.float32))
    mask = causal_mask_info(jnp.arange(prefix, prefix + t, dtype=jnp.int32)[None])
    args = (mask.visible_end, mask.tree_start, mask.tree_branch, mask.tree_depth)
    outs = {}
    for name, tg in targets.items():
      f = jax.jit(lambda q, kv, tg=tg: [attn_cpu._cpu_local(q, k, v, *args, mask.tree_width, tg) for k, v in kv])
      outs[name] = jax.block_until_ready(f(q, kv))
      runs[name, t] = lambda f=f, q=q: jax.block_until_ready(f(q, kv))
    diff = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(outs["old"], outs["new"]))
    print(f"T={t}: largest |old - new| {diff:.2e}")
    if diff > 2e-5:
      _fail(f"the two builds disagree at T={t}")
  return runs


def _blocks_swap(tg):
  local = rows_matmul._blocks_local
  return swapped(rows_matmul, "_blocks_local", lambda x, w, t=None: local(x, w, t or tg))


def _attention_swap(tg):
  local = attn_cpu._cpu_local
  return swapped(attn_cpu, "_cpu_local", lambda *a, **kw: local(*a, **{**kw, "target": tg}),
                 attn_cpu._cpu_partitioned.cache_clear)


@dataclasses.dataclass(frozen=True)
class Kernel:
  source: str  # ssd_jax/kernels/cpu/{source}.cc
  targets: dict  # {FFI target: symbol} registered for each build
  pick: Callable  # registered {target: name} -> what runs/swap take
  runs: Callable  # kernel mode: (targets, counts, layers=, head=, prefix=) -> {(name, count): run}
  swap: Callable  # forward mode: picked targets -> context manager routing the model's calls to them
  counts: str  # default --rows/--tokens
  what: str  # the table's first column in kernel mode ({layers} filled in)


KERNELS = {
  "blocks": Kernel("rows_matmul", rows_matmul._TARGETS, lambda t: t, blocks_runs, _blocks_swap, "1,2,3,5,9",
                   "rows"),
  "attention": Kernel("masked_attention", {"ssd_masked_attention": "SsdMaskedAttention"},
                      lambda t: t["ssd_masked_attention"], attention_runs, _attention_swap, "1,3,5,9",
                      "T ({layers} layers' attention)"),
}


def build_pair(kernel: Kernel, old: str, arch: str) -> dict:
  """Returns {'old': picked targets, 'new': picked targets}: the kernel at revision `old` and the working tree's,
  registered under names of their own."""
  suffix = arch.replace("-", "_")
  old_t = cpu_ffi._register(build_old(kernel.source, old, arch), kernel.targets, f"__ab_old_{suffix}")
  new_t = cpu_ffi._register(cpu_ffi.build(kernel.source, arch), kernel.targets, f"__ab_new_{suffix}")
  return {"old": kernel.pick(old_t), "new": kernel.pick(new_t)}


def forward_runs(kernel: Kernel, targets: dict, counts: list[int], prefix: int) -> dict:
  """Returns {(name, T): run}: the gguf target's T-token forward after `prefix` cached tokens through each build."""
  from .. import api
  from .step_cost import compiled_step
  _check_fits(counts, prefix, CACHE)
  pipe = api.load("smollm2-135m-instruct", draft=None, weights="gguf")
  runs = {}
  for name, tg in targets.items():
    with kernel.swap(tg):
      for t in counts:
        runs[name, t] = compiled_step(pipe.target.cfg, pipe.target.params, t, prefix, CACHE)
  return runs
