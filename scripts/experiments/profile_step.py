"""Where the compiled AR step's time goes: XLA:CPU's own per-thunk trace of the decode step, summed by part.

    taskset -c 0 python scripts/experiments/profile_step.py       # the GGUF target, batch 1, 100..400 cached tokens
    python scripts/experiments/profile_step.py --tiny --steps 20  # the tiny random target (a smoke run)

Runs the AR step (`steps.verify` with no drafts, greedy: the program the AR decoder runs each token) --steps times
from --start cached tokens, under jax.profiler with XLA's per-thunk trace on (--xla_cpu_enable_xprof_traceme), and
prints a markdown table: per part of the step (each weight matrix kind, the head, attention, RMSNorm, RoPE, SiLU,
cache writes, argmax, ...) its microseconds and calls a step and its share of the program's time, the weight bytes
and GB/s of the matrix parts, and what the loop spends outside the program (dispatch, arguments). A thunk is one
custom call or one XLA fusion; a part is told from its HLO instruction (the custom call's target and weight operand,
a fusion's operations). On a busy machine compare shares, not microseconds.
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import sys
import tempfile
import time

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_enable_xprof_traceme=true").strip()
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # the repository

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from ssd_jax.decode import steps  # noqa: E402
from ssd_jax.models import blocks  # noqa: E402
from ssd_jax.models.kv_cache import KVCache  # noqa: E402

MATRIX_PARTS = {"wq": "qkv", "wk": "qkv", "wv": "qkv", "wo": "o", "w_gate": "gate/up", "w_up": "gate/up",
                "w_down": "down"}


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--tiny", action="store_true", help="the tiny random target instead of the GGUF one")
  p.add_argument("--start", type=int, default=100, help="cached tokens before the first step")
  p.add_argument("--steps", type=int, default=300, help="steps traced (each adds a cached token)")
  p.add_argument("--cache", type=int, default=512, help="KV cache slots")
  return p.parse_args(argv)


def _instructions(hlo: str) -> tuple[dict, dict]:
  """Returns ({instruction: (opcode, shape, line)}, {computation: its lines}) of an optimized HLO module's text."""
  inst, comps, cur = {}, {}, None
  for line in hlo.splitlines():
    m = re.match(r"\s+(?:ROOT )?%([\w.\-]+) = (\S+?) ([a-z\-]+)\(", line)
    if m:
      inst[m.group(1)] = (m.group(3), m.group(2), line)
    head = re.match(r"%?([\w.\-]+) .*\{$", line)
    if head and not line.startswith(" "):
      cur = comps[head.group(1)] = []
    elif cur is not None and line.startswith(" "):
      cur.append(line)
  return inst, comps


def part_of(name: str, inst: dict, comps: dict) -> str:
  """Returns the part of the step a thunk named `name` belongs to."""
  if name.startswith("end: "):
    return "thunk ends (runtime)"
  if name.startswith("cond"):
    return "conditional"
  if name not in inst:
    return "other"
  op, shape, line = inst[name]
  if op == "custom-call":
    target = re.search(r'custom_call_target="(\w+)"', line).group(1)
    operands = line.split("custom-call(", 1)[1]
    if "attention" in target:
      return "attention"
    if "sumsq" in target:
      return "RMSNorm"
    m = re.search(r"params__layers___\d+___(" + "|".join(MATRIX_PARTS) + r")_", operands)
    kind = target.replace("ssd_rows_", "").replace("_t", "")
    return f"matrix {MATRIX_PARTS.get(m.group(1), m.group(1))} ({kind})" if m else f"head ({kind})"
  if op != "fusion":
    return "other"
  body = "\n".join(comps.get(re.search(r"calls=%([\w.\-]+)", line).group(1), []))
  names = set(re.findall(r'op_name="[^"]*?/([a-z_]+)(?:\[|")', body))
  if {"concatenate", "sub"} <= names:
    return "RoPE k + k cache write" if "scatter" in names else "RoPE q"
  for key, part in (("scatter", "v cache write"), ("exp", "SiLU * up"), ("rsqrt", "RMSNorm"), ("gather", "embedding"),
                    ("cos", "RoPE cos/sin"), ("sin", "RoPE cos/sin")):
    if key in names:
      return part
  if names & {"reduce_max", "reduce_min", "argmax", "iota"}:
    return "argmax"
  return "residual add" if names == {"add"} else "other fusions"


def weight_bytes(params) -> dict:
  """Returns {matrix part: bytes a step reads} of the layer matrices and the head."""
  out = collections.Counter()
  for lp in params["layers"]:
    for k, part in MATRIX_PARTS.items():
      out[part] += blocks.nbytes(lp[k])
  out["head"] = blocks.nbytes(params.get("lm_head", params["embed"]))
  return out


def trace_step(cfg, params, start: int, n: int, cache_len: int, trace_dir: str) -> tuple[str, float]:
  """Runs n AR steps from `start` cached tokens under the profiler; returns (the program's optimized HLO text, wall
  ms a step of the traced loop)."""
  if start < 0 or start + n + 20 > cache_len:
    raise SystemExit(f"profile_step: --start {start} + --steps {n} (+20 warm-up) must fit the cache of {cache_len}")
  bonus, drafts, active = jnp.ones((1,), jnp.int32), jnp.zeros((1, 0), jnp.int32), jnp.ones((1,), bool)
  q = jnp.zeros((1, 0, cfg.vocab_size), jnp.float32)
  rest = (jax.random.key(0), jnp.float32(0), jnp.float32(1))

  def fresh():
    return KVCache.init(cfg, 1, cache_len, jnp.float32).replace(lengths=jnp.full((1,), start, jnp.int32))

  exe = steps.verify.lower(params, fresh(), bonus, drafts, q, active, *rest, cfg=cfg).compile()

  def loop(steps_: int) -> float:
    cache, b = fresh(), bonus
    t0 = time.perf_counter()
    for _ in range(steps_):
      _, b, cache = exe(params, cache, b, drafts, q, active, *rest)
    b.block_until_ready()
    return (time.perf_counter() - t0) / steps_ * 1e3

  loop(20)
  jax.profiler.start_trace(trace_dir)
  ms = loop(n)
  jax.profiler.stop_trace()
  return exe.as_text(), ms


def sum_parts(trace_dir: str, hlo: str) -> tuple[collections.Counter, collections.Counter, int]:
  """Returns ({part: ns}, {part: calls}, ns of the program's executions) over the trace's XLA thunks. A thunk run
  inside a conditional counts in the conditional and, separately, as 'in conditional: part'."""
  try:
    from jaxlib._profile_data import ProfileData
  except ImportError:
    raise SystemExit("profile_step: this jaxlib cannot read its profiles (no jaxlib._profile_data)")
  paths = [os.path.join(d, f) for d, _, fs in os.walk(trace_dir) for f in fs if f.endswith(".xplane.pb")]
  if not paths:
    raise SystemExit(f"profile_step: the profiler wrote no trace under {trace_dir}")
  inst, comps = _instructions(hlo)
  ns, calls, total = collections.Counter(), collections.Counter(), 0
  for plane in ProfileData.from_file(paths[0]).planes:
    for line in plane.lines:
      ends = []  # end times of the conditionals seen on this line
      for ev in sorted(line.events, key=lambda e: e.start_ns):
        if ev.name == "ThunkExecutor::Execute":
          total += ev.duration_ns
          continue
        if not line.name.startswith("tf_XLA"):
          continue
        part = part_of(ev.name, inst, comps)
        if ends and ev.start_ns < ends[-1]:
          part = "in conditional: " + part
        elif part == "conditional":
          ends.append(ev.start_ns + ev.duration_ns)
        ns[part] += ev.duration_ns
        calls[part] += 1
  return ns, calls, total


def table(ns, calls, total: int, steps_: int, loop_ms: float, wbytes: dict) -> str:
  """Returns the markdown table of sum_parts' figures."""
  us = lambda v: v / steps_ / 1e3  # noqa: E731
  lines = ["| part | us a step | calls a step | share of the program | weight MB | GB/s |", "|---|---|---|---|---|---|"]
  for part, v in sorted(ns.items(), key=lambda kv: -kv[1]):
    key = part.split(" ")[1] if part.startswith("matrix ") else "head" if part.startswith("head") else None
    mb = wbytes.get(key, 0) / 1e6 if key else 0
    gbs = f"{mb / us(v) * 1e3:.1f}" if mb and v else ""
    lines.append(f"| {part} | {us(v):.0f} | {calls[part] / steps_:.0f} | {v / max(total, 1):.1%} | "
                 f"{f'{mb:.1f}' if mb else ''} | {gbs} |")
  top = sum(v for k, v in ns.items() if not k.startswith("in conditional"))
  lines += [f"| thunks, summed | {us(top):.0f} | | {top / max(total, 1):.1%} | | |",
            f"| the program (ThunkExecutor::Execute) | {us(total):.0f} | | 100% | | |",
            f"| outside it: dispatch, arguments, the loop | {loop_ms * 1e3 - us(total):.0f} | | | | |"]
  return "\n".join(lines)


def main(argv=None) -> int:
  args = parse_args(argv)
  from ssd_jax import api
  if args.tiny:
    pipe = api.load_tiny()
  else:
    pipe = api.load("smollm2-135m-instruct", draft=None, weights="gguf")
  cfg, params = pipe.target.cfg, pipe.target.params
  with tempfile.TemporaryDirectory(prefix="profile_step_") as d:
    hlo, loop_ms = trace_step(cfg, params, args.start, args.steps, args.cache, d)
    ns, calls, total = sum_parts(d, hlo)
  print(f"AR step, batch 1, {args.start}..{args.start + args.steps} cached tokens, {args.steps} steps: {loop_ms:.3f} "
        f"ms a step (the loop), load {os.getloadavg()[0]:.1f}, cores {sorted(os.sched_getaffinity(0))}")
  print(table(ns, calls, total, args.steps, loop_ms, weight_bytes(params)))
  return 0


if __name__ == "__main__":
  sys.exit(main())
