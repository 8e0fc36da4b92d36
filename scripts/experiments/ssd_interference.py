#!/usr/bin/env python
"""How much SSD's draft side slows the target's verify when the two share a CPU socket, one core each.

  python scripts/experiments/ssd_interference.py --k 1 --fan-out 6 --draft-weights q8_0,full

The target's verify of K+1 tokens a row (batch 1, after a chat prompt, the same position every call) is timed in
this process, pinned to one core, from dispatch to result (median of --repeats), while the other core runs, in
turn and interleaved --rounds times:
  idle      nothing
  compute   an in-cache matrix product in a loop (the core busy, almost no memory traffic)
  stream    copying a --stream-mb array in a loop (memory traffic, little compute)
  tree-FMT  SSD's draft side drafting its speculation tree in a loop (K, --fan-out), the draft's weights in FMT
Each load's slowdown of the verify against idle splits interference into what the draft's memory traffic costs
(stream) and what a busy neighbouring core costs by itself (compute: a shared physical core, power or clock
limits). The tree's own time is printed beside it (the verify it must hide behind). One CPU, one prompt: a figure
of this machine.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--k", type=int, default=1, help="draft tokens a round (the verify feeds K+1 a row)")
  p.add_argument("--fan-out", type=int, default=3, help="the tree's guesses per acceptance length")
  p.add_argument("--draft-weights", default="q8_0,full", help="comma-separated draft formats to draft trees with")
  p.add_argument("--repeats", type=int, default=40, help="verifies timed per load and round")
  p.add_argument("--rounds", type=int, default=3, help="times every load is run, interleaved")
  p.add_argument("--stream-mb", type=int, default=256)
  p.add_argument("--json-out")
  p.add_argument("--worker", help=argparse.SUPPRESS)
  return p.parse_args(argv)


PROMPT = "Write a Python function that returns the n-th Fibonacci number, with a short explanation."


def worker(kind: str, args) -> None:
  """Runs one load on this process's core until killed; prints 'ready <tree ms>' once it runs."""
  import numpy as np
  if kind == "compute":
    a = np.random.default_rng(0).random((96, 96), np.float32)
    print("ready 0", flush=True)
    while True:
      a = (a @ a) * np.float32(1e-2)
  if kind == "stream":
    n = args.stream_mb * (1 << 20) // 8
    a, b = np.ones(n), np.empty(n)
    print("ready 0", flush=True)
    while True:
      np.copyto(b, a)
  fmt = kind.split("-", 1)[1]
  import jax
  import jax.numpy as jnp
  import ssd_jax
  from ssd_jax.decode.base import Programs, cache_slots, pad_prompts
  from ssd_jax.decode.draft import make_draft_model
  from ssd_jax.decode.options import DecodeOptions
  from ssd_jax.decode.steps import tree_lookahead
  from ssd_jax.kernels.platform import device_platform

  pipe = ssd_jax.load(draft_weights=fmt)
  dev = jax.devices()[0]
  m = make_draft_model(pipe.draft.cfg, pipe.draft.params, "auto", lambda x: jax.device_put(x, dev), Programs(),
                       platform=device_platform(dev))
  ids = pipe.encode_prompt(PROMPT)
  tokens, lengths = pad_prompts([ids])
  f = (args.fan_out,) * (args.k + 1)
  m.start(tokens, lengths, cache_slots(len(ids), 8, tree_lookahead(args.k, f)), DecodeOptions(max_new_tokens=8),
          args.k, (f,))
  m.prefill()
  window = np.asarray([ids[-m.window:]], np.int32)
  spec, key = m.put(jnp.zeros((1, args.k), jnp.int32)), jax.random.key(0)
  times = []
  for i in range(20):
    t = time.perf_counter()
    m.tree(window, spec, lengths, key, f).tokens.block_until_ready()
    times.append(time.perf_counter() - t)
  print(f"ready {1e3 * statistics.median(times[5:]):.3f}", flush=True)
  while True:
    m.tree(window, spec, lengths, key, f).tokens.block_until_ready()


def verifier(args):
  """Returns a function timing one verify (seconds) of the loaded target, pinned to this process's core."""
  import numpy as np
  import jax.numpy as jnp
  import ssd_jax
  from ssd_jax.decode import rounds
  from ssd_jax.decode.base import pad_prompts
  from ssd_jax.decode.options import DecodeOptions

  pipe = ssd_jax.load()
  dec = pipe.decoder("sd", pipe.spec_options(k=args.k))
  ids = pipe.encode_prompt(PROMPT)
  tokens, lengths = pad_prompts([ids])
  t = rounds.TargetSide(dec, tokens, lengths, DecodeOptions(max_new_tokens=8, sd_chunk=1))
  t.prefill()
  drafts, q = t.rep(np.zeros((1, args.k), np.int32)), t._q(None)
  bonus_prev, key = t.first, t.verify_root
  still = t.rep(jnp.zeros((1,), bool))  # no row advances: every call verifies at the same position

  def one():
    t0 = time.perf_counter()
    acc, *_ = t.verify(drafts, q, bonus_prev, still, key)
    acc.block_until_ready()
    return time.perf_counter() - t0
  for _ in range(5):
    one()
  return one


def main(argv=None):
  args = parse_args(argv)
  if args.worker:
    return worker(args.worker, args)
  cores = sorted(os.sched_getaffinity(0))
  if len(cores) < 2:
    print("needs two usable cores", file=sys.stderr)
    return 2
  mine, other = cores[0], cores[1]
  os.sched_setaffinity(0, {mine})  # before JAX starts its threads and the kernels count their cores
  one = verifier(args)
  loads = ["idle", "compute", "stream"] + [f"tree-{f}" for f in args.draft_weights.split(",") if f]
  ms = {x: [] for x in loads}
  tree_ms = {}
  for r in range(args.rounds):
    for load in loads:
      proc = None
      if load != "idle":
        cmd = [sys.executable, os.path.join(HERE, "ssd_interference.py"), "--worker", load, "--k", str(args.k),
               "--fan-out", str(args.fan_out), "--stream-mb", str(args.stream_mb)]
        proc = subprocess.Popen(["taskset", "-c", str(other)] + cmd, stdout=subprocess.PIPE, text=True,
                                env=dict(os.environ, OMP_NUM_THREADS="1"))
        line = proc.stdout.readline().split()
        if not line or line[0] != "ready":
          raise RuntimeError(f"load {load} did not start")
        tree_ms.setdefault(load, float(line[1]))
        time.sleep(0.2)
      try:
        ms[load] += [1e3 * one() for _ in range(args.repeats)]
      finally:
        if proc is not None:
          proc.kill()
          proc.wait()
      print(f"[round {r + 1}/{args.rounds}] {load}: {statistics.median(ms[load][-args.repeats:]):.2f} ms",
            file=sys.stderr, flush=True)
  base = statistics.median(ms["idle"])
  out = {"k": args.k, "fan_out": args.fan_out, "verify_tokens": args.k + 1, "cores": [mine, other],
         "verify_ms": {x: round(statistics.median(v), 3) for x, v in ms.items()},
         "slowdown": {x: round(statistics.median(v) / base, 3) for x, v in ms.items()},
         "tree_ms_alone_on_its_core": tree_ms}
  print(f"verify of {args.k + 1} tokens, batch 1, core {mine}; the other core ({other}) runs:")
  for x in loads:
    tree = f"   (its tree: {tree_ms[x]:.2f} ms a round)" if x.startswith("tree") else ""
    print(f"  {x:12s} {out['verify_ms'][x]:7.2f} ms  {out['slowdown'][x]:.3f}x{tree}")
  if args.json_out:
    with open(args.json_out, "w") as f:
      json.dump(out, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
