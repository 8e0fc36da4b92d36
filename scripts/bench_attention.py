"""A/B of the CPU masked-attention kernel (ssd_jax/kernels/cpu/masked_attention.cc): the source at a git revision
against the working tree's, both built here and registered side by side, timed interleaved in one process (order
alternating per repetition), medians of wall time and of the process's CPU time. On a busy machine the CPU time is
the steadier figure; report ratios, and say the load.

    taskset -c 1 python scripts/bench_attention.py --old main               # the kernel alone, SmolLM2-135M's shapes
    taskset -c 1 python scripts/bench_attention.py --old main --forward     # the gguf target's forward, 300 cached

Kernel mode runs 30 layers' attention (9 query heads, 3 KV heads, head dim 64, batch 1) for T new tokens after
`--prefix` cached ones, as a verify of T tokens sees them, and checks both builds agree within the kernel tests'
tolerance; forward mode times the whole target forward of T tokens (bench.py --verify-cost's step) with the
attention through each build.
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
from ssd_jax.kernels import cpu_ffi  # noqa: E402
from ssd_jax.kernels.masked_attention import cpu as attn_cpu  # noqa: E402
from ssd_jax.kernels.mask import causal_mask_info  # noqa: E402

_TARGET = {"ssd_masked_attention": "SsdMaskedAttention"}  # the one target both revisions export


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--old", default="main", help="git revision whose kernel source is the baseline")
  p.add_argument("--arch", default="native", choices=tuple(cpu_ffi.ARCH_FLAGS), help="instruction set of both builds")
  p.add_argument("--tokens", default="1,3,5,9", help="new tokens T per forward")
  p.add_argument("--prefix", type=int, default=300, help="cached tokens before the T new ones")
  p.add_argument("--reps", type=int, default=21, help="timed repetitions of each (median reported)")
  p.add_argument("--forward", action="store_true", help="time the real gguf target's forward instead")
  return p.parse_args(argv)


def build_pair(old: str, arch: str) -> dict:
  """Returns {'old': target name, 'new': target name}: the kernel at revision `old` and the working tree's."""
  root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
  tmp = tempfile.mkdtemp(prefix="bench_attention_")
  for f in ("masked_attention.cc", "simd.h"):
    src = subprocess.run(["git", "-C", root, "show", f"{old}:ssd_jax/kernels/cpu/{f}"], capture_output=True,
                         text=True)
    if src.returncode != 0:
      raise SystemExit(f"bench_attention: cannot read {f} at {old!r}: {src.stderr.strip()[:200]}")
    with open(os.path.join(tmp, f), "w") as fh:
      fh.write(src.stdout)
  flags = ["-O3", *cpu_ffi.ARCH_FLAGS[arch], *cpu_ffi._FP_FLAGS, "-fopenmp", "-fPIC", "-shared", "-std=c++17", "-w"]
  lib = os.path.join(tmp, "old.so")
  res = subprocess.run([os.environ.get("CXX", "g++"), *flags, "-I", jax.ffi.include_dir(),
                        os.path.join(tmp, "masked_attention.cc"), "-o", lib], capture_output=True, text=True)
  if res.returncode != 0:
    raise SystemExit(f"bench_attention: the {old} kernel did not build: {res.stderr[-300:]}")
  suffix = arch.replace("-", "_")
  old_t = cpu_ffi._register(lib, _TARGET, f"__ab_old_{suffix}")
  new_t = cpu_ffi._register(cpu_ffi.build("masked_attention", arch), _TARGET, f"__ab_new_{suffix}")
  return {"old": old_t["ssd_masked_attention"], "new": new_t["ssd_masked_attention"]}


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


def kernel_runs(targets: dict, counts: list[int], prefix: int, layers: int = 30, cache: int = 512) -> dict:
  """Returns {(name, T): run} over `layers` attention calls; exits if the builds disagree beyond 2e-5."""
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
      raise SystemExit(f"bench_attention: the two builds disagree at T={t}")
  return runs


def forward_runs(targets: dict, counts: list[int], prefix: int) -> dict:
  """Returns {(name, T): run}: the gguf target's T-token forward after `prefix` cached tokens through each build."""
  from ssd_jax import api
  from ssd_jax.bench.step_cost import compiled_step
  pipe = api.load("smollm2-135m-instruct", draft=None, weights="gguf")
  local, runs = attn_cpu._cpu_local, {}
  try:
    for name, tg in targets.items():
      attn_cpu._cpu_local = lambda *a, tg=tg, **kw: local(*a, **{**kw, "target": tg})
      attn_cpu._cpu_partitioned.cache_clear()
      jax.clear_caches()  # a new trace, so the attention binds this build's target
      for t in counts:
        runs[name, t] = compiled_step(pipe.target.cfg, pipe.target.params, t, prefix)
  finally:
    attn_cpu._cpu_local = local
    attn_cpu._cpu_partitioned.cache_clear()
  return runs


def main(argv=None) -> int:
  args = parse_args(argv)
  if not cpu_ffi.runs_here(args.arch):
    raise SystemExit(f"bench_attention: this CPU cannot run {args.arch} code")
  counts = [int(v) for v in args.tokens.split(",")]
  targets = build_pair(args.old, args.arch)
  runs = forward_runs(targets, counts, args.prefix) if args.forward else kernel_runs(targets, counts, args.prefix)
  got = interleave(runs, args.reps)
  what = "T (forward)" if args.forward else "T (30 layers' attention)"
  print(f"{args.arch}, {args.old} (old) vs working tree (new), medians of {args.reps}, load "
        f"{os.getloadavg()[0]:.1f}, cores {sorted(os.sched_getaffinity(0))}")
  print(f"| {what} | wall old | wall new | new/old | CPU old | CPU new | new/old |\n|---|---|---|---|---|---|---|")
  for c in counts:
    (wo, co), (wn, cn) = got["old", c], got["new", c]
    print(f"| {c} | {wo:.2f} | {wn:.2f} | {wn / wo:.3f} | {co:.2f} | {cn:.2f} | {cn / co:.3f} |")
  return 0


if __name__ == "__main__":
  sys.exit(main())
