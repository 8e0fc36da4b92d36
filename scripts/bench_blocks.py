"""A/B of the GGUF block kernel (ssd_jax/kernels/cpu/rows_matmul.cc): the source at a git revision against the working
tree's, both built here and registered side by side, timed interleaved in one process (order alternating per
repetition), medians of wall time and of the process's CPU time. On a busy machine the CPU time is the steadier
figure (a pinned process that shares its core loses wall time, not CPU time); report ratios, and say the load.

    taskset -c 1 python scripts/bench_blocks.py --old main                 # the kernel alone, SmolLM2-135M's shapes
    taskset -c 1 python scripts/bench_blocks.py --old main --forward       # the real gguf target's forward, 300 cached

Kernel mode multiplies 1..9 rows by random blocks of SmolLM2-135M's shapes (30 layers of Q4_1 matrices, the Q8_0
tied head [49152, 576]) and checks both builds give the same bits; forward mode times the whole target forward of T
tokens (bench.py --verify-cost's step) with the block products through each build.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from ssd_jax.kernels import cpu_ffi, rows_matmul  # noqa: E402
from ssd_jax.models import blocks  # noqa: E402

SHAPES = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]  # file rows [R, C]


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--old", default="main", help="git revision whose kernel source is the baseline")
  p.add_argument("--arch", default="native", choices=tuple(cpu_ffi.ARCH_FLAGS), help="instruction set of both builds")
  p.add_argument("--rows", default="1,2,3,5,9", help="row counts (kernel mode) or new tokens T (forward mode)")
  p.add_argument("--reps", type=int, default=21, help="timed repetitions of each (median reported)")
  p.add_argument("--layers", type=int, default=30, help="kernel mode: layers of Q4_1 matrices")
  p.add_argument("--no-head", action="store_true", help="kernel mode: leave out the Q8_0 head")
  p.add_argument("--forward", action="store_true", help="time the real gguf target's forward instead")
  return p.parse_args(argv)


def build_pair(old: str, arch: str) -> dict:
  """Returns {'old': targets, 'new': targets}: the kernel at revision `old` and the working tree's, registered."""
  root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
  tmp = tempfile.mkdtemp(prefix="bench_blocks_")
  for f in ("rows_matmul.cc", "simd.h"):
    src = subprocess.run(["git", "-C", root, "show", f"{old}:ssd_jax/kernels/cpu/{f}"], capture_output=True,
                         text=True)
    if src.returncode != 0:
      raise SystemExit(f"bench_blocks: cannot read {f} at {old!r}: {src.stderr.strip()[:200]}")
    with open(os.path.join(tmp, f), "w") as fh:
      fh.write(src.stdout)
  flags = ["-O3", *cpu_ffi.ARCH_FLAGS[arch], *cpu_ffi._FP_FLAGS, "-fopenmp", "-fPIC", "-shared", "-std=c++17", "-w"]
  lib = os.path.join(tmp, "old.so")
  res = subprocess.run([os.environ.get("CXX", "g++"), *flags, "-I", jax.ffi.include_dir(),
                        os.path.join(tmp, "rows_matmul.cc"), "-o", lib], capture_output=True, text=True)
  if res.returncode != 0:
    raise SystemExit(f"bench_blocks: the {old} kernel did not build: {res.stderr[-300:]}")
  suffix = arch.replace("-", "_")
  return {"old": cpu_ffi._register(lib, rows_matmul._TARGETS, f"__ab_old_{suffix}"),
          "new": cpu_ffi._register(cpu_ffi.build("rows_matmul", arch), rows_matmul._TARGETS, f"__ab_new_{suffix}")}


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


def random_blocks(rng, kind: str, rows: int, cols: int) -> blocks.BlockWeight:
  nb = cols // blocks.QK
  d = jnp.asarray((rng.standard_normal((rows, nb)) * 0.01).astype(np.float16))
  if kind == "Q8_0":
    return blocks.BlockWeight(jnp.asarray(rng.integers(-128, 128, (rows, cols), dtype=np.int8)), d, None, kind, False)
  m = jnp.asarray((rng.standard_normal((rows, nb)) * 0.01).astype(np.float16))
  return blocks.BlockWeight(jnp.asarray(rng.integers(0, 256, (rows, cols // 2), dtype=np.uint8)), d, m, kind, True)


def kernel_runs(args, targets: dict, counts: list[int]) -> dict:
  """Returns {(name, rows): run} over SmolLM2-135M's block products; exits if the builds' bits differ."""
  rng = np.random.default_rng(0)
  ws = [random_blocks(rng, "Q4_1", r, c) for _ in range(args.layers) for r, c in SHAPES]
  ws += [] if args.no_head else [random_blocks(rng, "Q8_0", 49152, 576)]
  runs = {}
  for m in counts:
    xs = {c: jnp.asarray(rng.standard_normal((m, c)).astype(np.float32)) for c in (576, 1536)}
    outs = {}
    for name, tg in targets.items():
      f = jax.jit(lambda xs, ws, tg=tg: [rows_matmul._blocks_local(xs[w.rows_shape[1]], w, tg) for w in ws])
      outs[name] = jax.block_until_ready(f(xs, ws))
      runs[name, m] = lambda f=f, xs=xs: jax.block_until_ready(f(xs, ws))
    if not all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(outs["old"], outs["new"])):
      raise SystemExit(f"bench_blocks: the two builds give different bits at {m} rows")
  return runs


def forward_runs(targets: dict, counts: list[int]) -> dict:
  """Returns {(name, T): run}: the gguf target's T-token forward after 300 cached tokens through each build."""
  from ssd_jax import api
  from ssd_jax.bench.step_cost import compiled_step
  pipe = api.load("smollm2-135m-instruct", draft=None, weights="gguf")
  local, runs = rows_matmul._blocks_local, {}
  try:
    for name, tg in targets.items():
      rows_matmul._blocks_local = lambda x, w, t=None, tg=tg: local(x, w, t or tg)
      jax.clear_caches()  # a new trace, so the products bind this build's targets
      for t in counts:
        runs[name, t] = compiled_step(pipe.target.cfg, pipe.target.params, t, 300)
  finally:
    rows_matmul._blocks_local = local
  return runs


def main(argv=None) -> int:
  args = parse_args(argv)
  if not cpu_ffi.runs_here(args.arch):
    raise SystemExit(f"bench_blocks: this CPU cannot run {args.arch} code")
  counts = [int(v) for v in args.rows.split(",")]
  targets = build_pair(args.old, args.arch)
  runs = forward_runs(targets, counts) if args.forward else kernel_runs(args, targets, counts)
  got = interleave(runs, args.reps)
  what = "T (forward)" if args.forward else "rows"
  print(f"{args.arch}, {args.old} (old) vs working tree (new), medians of {args.reps}, load "
        f"{os.getloadavg()[0]:.1f}, cores {sorted(os.sched_getaffinity(0))}")
  print(f"| {what} | wall old | wall new | new/old | CPU old | CPU new | new/old |\n|---|---|---|---|---|---|---|")
  for c in counts:
    (wo, co), (wn, cn) = got["old", c], got["new", c]
    print(f"| {c} | {wo:.2f} | {wn:.2f} | {wn / wo:.3f} | {co:.2f} | {cn:.2f} | {cn / co:.3f} |")
  return 0


if __name__ == "__main__":
  sys.exit(main())
