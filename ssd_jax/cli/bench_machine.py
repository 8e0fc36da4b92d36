"""scripts/bench.py's measurements of the machine (ssd_jax/cli/bench.py): --calibrate (the step costs k='auto' reads),
--verify-cost (the target's forward by new tokens), the CPU's name and its memory bandwidth, AR against it."""
from __future__ import annotations

import dataclasses
import json
import os
import platform
import subprocess
import sys
import time

from .bench_peers import llamacpp_forwards
from .bench_runs import load_pipe


def calibrate(args, modes) -> int:
  """--calibrate: measures the step costs k='auto' chooses K from (after auto_k.PREFIXES cached tokens) and, in real
  decodes at batch 1, the loop's own time and each mode's speed (the default mode here is then the fastest: AR, SD,
  or SSD where the draft has hardware of its own), caches them for this machine and pair, and prints the default
  mode, the K each batch size then gets and the speedups the model expects at a run of --max-new-tokens after
  150-token prompts."""
  from .. import defaults
  from ..bench import step_cost
  from ..decode import auto_k
  from ..models.kv_cache import cache_dtype

  pipe = load_pipe(args, ["sd"])
  costs = step_cost.measure(pipe.target, pipe.draft, kv_dtype=cache_dtype(pipe.target.params, pipe.kv_dtype),
                            log=lambda m: print(m, flush=True))
  costs = dataclasses.replace(costs, about=f"{cpu_model()}, {len(os.sched_getaffinity(0))} cores, "
                              f"{pipe.target.cfg.name} ({pipe.weights}) + {pipe.draft.cfg.name}")
  # AR, SD and (where the draft has hardware of its own) SSD decoded alike: their speeds choose the default mode.
  own = defaults.draft_has_own_hardware(pipe.placement, pipe.ssd_placement_in_use())
  decode = host_decoder(pipe, HOST_NEW_TOKENS)
  costs = step_cost.measure_host(costs, decode, auto_k.run_prefix([len(host_prompt(pipe))], HOST_NEW_TOKENS),
                                 log=lambda m: print(m, flush=True), modes=("ar", "sd", "ssd") if own else ("ar", "sd"))
  # AR on one core and on all: a machine whose second core slows the decode (issue 56) gets runs on one.
  cores = step_cost.measure_cores(decode, log=lambda m: print(m, flush=True))
  path = pipe.step_costs_path()
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    f.write(costs.to_json())
  if pipe.measured_modes_path is not None:  # the speeds again, under the key decode.py reads before it loads
    auto_k.save_modes(pipe.measured_modes_path, costs.modes_tok_s, costs.about)
  if cores:  # the machine's, whatever the models
    auto_k.save_modes(auto_k.cores_path(), cores, costs.about)
  a = pipe.auto_k_inputs(args.temperature)[1]
  prefix = auto_k.run_prefix([150], args.max_new_tokens)
  print(f"the default mode here is now {pipe.default_mode} (the fastest of "
        + ", ".join(f"{m.upper()} {v:.1f}" for m, v in costs.modes_tok_s.items()) + " tok/s at batch 1, K=1)")
  if cores:
    one = defaults.cores_to_use(cores, sorted(os.sched_getaffinity(0)))
    print(f"decode.py and serve.py run on {'one core' if one else 'every core'} here (AR {cores['1']:.1f} tok/s on "
          f"one, {cores['all']:.1f} on all)")
  print(f"step costs written to {path}; acceptance a = {a:.3f} at temperature {args.temperature:g}; "
        f"at {prefix:g} cached tokens (150-token prompts, {args.max_new_tokens} new):")
  for b in auto_k.BATCHES:
    ups = ", ".join(f"K={k} {auto_k.sd_speedup(costs, b, k, a, prefix):.2f}x" for k in range(1, auto_k.K_MAX + 1))
    print(f"batch {b:>2}: k=auto -> K={pipe.choose_k(b, args.temperature, prefix)}  (expected SD over AR: {ups})")
  return 0


HOST_NEW_TOKENS = 48  # the calibration's real decodes (auto_k.measure_host): long enough for ~30 SD rounds


def host_prompt(pipe) -> list[int]:
  """Returns the prompt auto_k.measure_host decodes: a fixed instruction (its text matters little: the loop's time,
  not the tokens, is measured), or ids 1..120 for a pair without a tokenizer."""
  if pipe.tokenizer is None:
    return list(range(1, 121))
  return pipe.encode_prompt("Explain, step by step, how a bicycle's gears make it easier to ride up a steep hill.")


def host_decoder(pipe, new_tokens: int):
  """Returns decode(mode) -> (decode seconds, new tokens, target forwards) of host_prompt at batch 1, greedy, EOS
  ignored: AR, or SD or SSD at K=1 (step_cost.measure_host)."""
  ids = [host_prompt(pipe)]

  def decode(mode):
    stats = pipe.generate_ids(ids, mode=mode, batch_size=1, k=1, max_new_tokens=new_tokens, ignore_eos=True)[0].stats
    return stats.decode_seconds, stats.new_tokens, stats.target_forwards
  return decode


def print_verify_cost(args) -> int:
  """--verify-cost: prints (and writes to --json-out) the verify step's cost by the number of new tokens, per weight
  format (float32, and --quantize's when it is another: the same forward at the bytes of each format), with the CPU,
  the weight bytes each forward reads, the bandwidth that achieves and (--bandwidth) one core's streaming bandwidth,
  so a reader sees the distance to the limit."""
  from .. import api
  from ..models import blocks
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  print(f"CPU: {cpu_model()} ({cores} usable cores)")
  quantize = api.resolve_weights(args.quantize, args.target, args.target_devices)
  formats = ["full"] + ([quantize] if quantize != "full" and not args.tiny else [])
  result = {"cpu": cpu_model(), "cores": cores, "formats": {}}
  for fmt in formats:
    pipe = (api.load_tiny(seed=args.seed) if args.tiny else
            api.load(args.target, draft=None, attn_impl=args.attention, dtype=args.dtype, weights=fmt))
    table = verify_cost_table(pipe)
    weight_bytes = blocks.nbytes(pipe.target.params)
    print(f"\nweights {fmt} (dtype {args.dtype}): {weight_bytes / 1e6:.0f} MB read per forward")
    print("| new tokens T (verify K = T-1) | ms | cost / AR step | weights GB/s |\n|---|---|---|---|")
    for t, ms in table.items():
      print(f"| {t} | {ms:.1f} | {ms / table[1]:.2f}x | {weight_bytes / ms / 1e6:.1f} |")
    result["formats"][fmt] = {"verify_cost_ms": table, "weight_bytes": weight_bytes,
                              "weights_gbs": {t: weight_bytes / ms / 1e6 for t, ms in table.items()}}
    del pipe
  bw = single_core_bandwidth_gbs() if args.bandwidth and not args.tiny else None
  if bw is not None:
    for fmt, r in result["formats"].items():
      print(f"single-core streaming bandwidth: {bw:.1f} GB/s => one core reads the {fmt} weights in at best "
            f"{r['weight_bytes'] / bw / 1e6:.1f} ms")
  result["single_core_stream_gbs"] = bw
  result["llamacpp"] = llamacpp_forwards(args) if args.peer == "llamacpp" else None
  if args.json_out:
    with open(args.json_out, "w") as f:
      json.dump(result, f, indent=1)
  return 0


def verify_cost_table(pipe, prefix: int = 300, repeats: int = 15):
  """Returns {T: median ms} of one target forward of T tokens after a `prefix`-token cache (AOT compiled)."""
  from ..bench.step_cost import compiled_step, interleaved_ms
  steps = {t: compiled_step(pipe.target.cfg, pipe.target.params, t, prefix) for t in range(1, 10)}
  return interleaved_ms(steps, repeats)


def streaming_bandwidth_gbs(n_bytes: int = 1 << 30, repeats: int = 7) -> float:
  """Returns the median read bandwidth (GB/s) of a jitted reduction over a large float32 array."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  x = jnp.ones((n_bytes // 4,), jnp.float32)
  f = jax.jit(lambda a: jnp.sum(a))
  f(x).block_until_ready()
  ts = []
  for _ in range(repeats):
    t = time.perf_counter()
    f(x).block_until_ready()
    ts.append(time.perf_counter() - t)
  del x
  return n_bytes / float(np.median(ts)) / 1e9


_PINNED_PROBE = """
import os, sys
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
sys.path.insert(0, sys.argv[1])
from ssd_jax.cli.bench_machine import streaming_bandwidth_gbs
print(streaming_bandwidth_gbs())
"""


def single_core_bandwidth_gbs() -> float:
  """Returns streaming_bandwidth_gbs() measured in a child process pinned to one core (what one side of SSD, or a
  `taskset -c 0` run, can read at most); an affinity set in this process would not reach XLA's running threads."""
  package_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the probe's ssd_jax
  res = subprocess.run([sys.executable, "-c", _PINNED_PROBE, package_parent],
                       capture_output=True, text=True, timeout=600)
  if res.returncode != 0:
    raise RuntimeError(f"the single-core bandwidth probe failed: {res.stderr[-500:]}")
  return float(res.stdout.strip().splitlines()[-1])


def cpu_model() -> str:
  """Returns the CPU's model name as /proc/cpuinfo gives it (else platform's processor or machine)."""
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def ar_bandwidth(result, pipe, variants) -> dict:
  """Returns AR's time per token against the limit the measured memory bandwidth sets for reading the weights."""
  import jax
  bw = streaming_bandwidth_gbs()
  weight_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(pipe.target.params))
  ar = next(v for v in variants if v.mode == "ar")
  ar_tps = result["summary"]["by_variant"][ar.label]["all"]["tokens_per_second"]
  limit_ms = weight_bytes / (bw * 1e9) * 1e3
  return {"stream_gbs": bw, "weight_bytes": weight_bytes, "limit_ms": limit_ms, "ar_ms_per_token": 1e3 / ar_tps,
          "fraction_of_limit": limit_ms * ar_tps / 1e3}
