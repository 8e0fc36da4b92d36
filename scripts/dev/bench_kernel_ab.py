"""A/B of a C++ CPU kernel: its source at a git revision against the working tree's, both built here and registered
side by side, timed interleaved in one process (order alternating per repetition), medians of wall time and of the
process's CPU time (ssd_jax/bench/kernel_ab.py). On a busy machine the CPU time is the steadier figure (a pinned
process that shares its core loses wall time, not CPU time); report ratios, and say the load.

    taskset -c 1 python scripts/dev/bench_kernel_ab.py --kernel blocks --old main            # rows_matmul.cc alone
    taskset -c 1 python scripts/dev/bench_kernel_ab.py --kernel attention --old main         # masked_attention.cc alone
    taskset -c 1 python scripts/dev/bench_kernel_ab.py --kernel blocks --old main --forward  # the gguf target's forward

--kernel blocks multiplies 1..9 rows by random blocks of SmolLM2-135M's shapes (--layers layers of Q4_1 matrices,
the Q8_0 tied head [49152, 576] unless --no-head) and checks both builds give the same bits. --kernel attention runs
--layers layers' attention (9 query heads, 3 KV heads, head dim 64, batch 1) for T new tokens after --prefix cached
ones, as a verify of T tokens sees them, and checks both builds agree within the kernel tests' tolerance. --forward
times the whole target forward of T tokens after --prefix cached ones (bench.py --verify-cost's step) with the
kernel's calls through each build.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # the repository
from ssd_jax.bench import kernel_ab  # noqa: E402
from ssd_jax.kernels import cpu_ffi  # noqa: E402


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--kernel", required=True, choices=tuple(kernel_ab.KERNELS), help="which kernel to A/B")
  p.add_argument("--old", default="main", help="git revision whose kernel source is the baseline")
  p.add_argument("--arch", default="native", choices=tuple(cpu_ffi.ARCH_FLAGS), help="instruction set of both builds")
  p.add_argument("--rows", "--tokens", dest="counts", default=None,
                 help="row counts (blocks) or new tokens T (attention, --forward); default blocks 1,2,3,5,9, "
                      "attention 1,3,5,9")
  p.add_argument("--prefix", type=int, default=300, help="attention and --forward: cached tokens before the T new")
  p.add_argument("--reps", type=int, default=21, help="timed repetitions of each (median reported)")
  p.add_argument("--layers", type=int, default=30, help="kernel mode: layers of Q4_1 matrices or of attention")
  p.add_argument("--no-head", action="store_true", help="blocks kernel mode: leave out the Q8_0 head")
  p.add_argument("--forward", action="store_true", help="time the real gguf target's forward instead")
  return p.parse_args(argv)


def main(argv=None) -> int:
  args = parse_args(argv)
  kernel = kernel_ab.KERNELS[args.kernel]
  if not cpu_ffi.runs_here(args.arch):
    raise SystemExit(f"bench_kernel_ab: this CPU cannot run {args.arch} code")
  try:
    counts = [int(v) for v in (args.counts or kernel.counts).split(",")]
  except ValueError:
    raise SystemExit(f"bench_kernel_ab: --rows/--tokens takes comma-separated integers, not {args.counts!r}")
  targets = kernel_ab.build_pair(kernel, args.old, args.arch)
  if args.forward:
    runs = kernel_ab.forward_runs(kernel, targets, counts, args.prefix)
  else:
    runs = kernel.runs(targets, counts, layers=args.layers, head=not args.no_head, prefix=args.prefix)
  got = kernel_ab.interleave(runs, args.reps)
  what = "T (forward)" if args.forward else kernel.what.format(layers=args.layers)
  print(kernel_ab.report(got, counts, what, f"{kernel.source}.cc, {args.arch}, {args.old} (old) vs working tree "
                         f"(new), medians of {args.reps}, load {os.getloadavg()[0]:.1f}, cores "
                         f"{sorted(os.sched_getaffinity(0))}"))
  return 0


if __name__ == "__main__":
  sys.exit(main())
