#!/usr/bin/env python
"""Measure decoding speed: AR, SD and SSD (and optionally transformers' AR and assisted generation) in one run.

  python scripts/bench.py --num-prompts 4 --max-new-tokens 128 --out-dir bench-out
  python scripts/bench.py --sweep fan-out --modes ar,sd,ssd --num-prompts 2 --out-dir bench-fanout
  python scripts/bench.py --peer hf --out-dir bench-peer          # + hf-ar, hf-sd (needs the 'peer' extra)
  taskset -c 0 python scripts/bench.py --modes ar --peer llamacpp \
    --peer-bin $(scripts/dev/build_llamacpp.sh | tail -n 1)
  python scripts/bench.py --tiny --prompts p.jsonl --max-new-tokens 8   # tiny random pair: a smoke run

The pair is loaded once. Prompts (HumanEval, GSM8K, AlpacaEval, MT-Bench, or --prompts FILE.jsonl) are decoded by
every variant (a mode with its options; a sweep makes one variant per value for the modes it changes) in interleaved
order, group by group, so machine drift hits all variants alike. Each variant first decodes a warm-up batch; compile
and warm-up times are reported apart from the decode times, which never include them. Every run prints a progress
line. Output: a markdown table (stdout and --out-dir/bench.md), a JSON file with every per-prompt figure, the
summary and the timing model's predictions (--out-dir/bench.json or --json-out), and PNG plots in --out-dir (with
the optional matplotlib: pip install -e ".[bench]"). See docs/benchmarks.md for what each figure means.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time

from ssd_jax import settings
from ssd_jax.bench.plan import SWEEPS
from ssd_jax.cli_util import braces, fail, k_arg, run_main, split_cpu
from ssd_jax.decode.options import BACKUPS, DecodeOptions  # no JAX


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--modes", default="ar,sd,ssd", help="comma-separated: ar, sd, ssd")
  p.add_argument("--peer", default="none", choices=["none", "hf", "llamacpp"],
                 help="hf: also run transformers' AR (hf-ar) and assisted generation (hf-sd) on the same prompts; "
                      "llamacpp: also run llama.cpp's llama-bench (token generation of --max-new-tokens) on the "
                      "target's GGUF with the cores our AR uses (with --verify-cost: its T-token forwards)")
  p.add_argument("--peer-bin", default=None,
                 help="llamacpp: the llama-bench binary (default: $LLAMA_BENCH, else llama-bench on the PATH; "
                      "scripts/dev/build_llamacpp.sh builds it)")
  p.add_argument("--datasets", default="humaneval,gsm8k,alpaca,mtbench")
  p.add_argument("--prompts", help="a JSONL file of {\"prompt\": ...} objects instead of --datasets")
  p.add_argument("--num-prompts", type=int, default=4, help="prompts per dataset")
  p.add_argument("--max-new-tokens", type=int, default=128, help="tokens per prompt (EOS ignored)")
  p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--batch-size", type=int, default=1)
  p.add_argument("--ar-chunk", type=int, default=DecodeOptions.ar_chunk,
                 help="ar: target steps a call (the host's work per call paid once per chunk; same tokens)")
  p.add_argument("--sd-chunk", type=int, default=DecodeOptions.sd_chunk,
                 help="sd: rounds a call with a draft that reads tokens (verify and next chain fused; same tokens)")
  p.add_argument("--k", default="auto", type=k_arg,
                 help="draft tokens per round (sd, ssd, hf-sd): an integer, or auto (default, as decode.py and the "
                      "API): chosen per batch from this machine's step costs (--calibrate), 0 meaning AR")
  p.add_argument("--calibrate", action="store_true",
                 help="only measure this machine's step costs (AR step, verify of T = 2..5 and the draft step at "
                      "batch 1, 2, 4, 8, 16) for k=auto, cache them and print the K chosen per batch size")
  p.add_argument("--fan-out", default="3", help="ssd: F, or K+1 counts 'F0,...,FK'")
  p.add_argument("--fan-out-miss", default=None, help="ssd: the fan-out after a cache miss (same total)")
  p.add_argument("--backup", default="neural", metavar=braces(BACKUPS), help="ssd: miss backup")
  p.add_argument("--backups", default=None,
                 help="ssd: comma-separated backups (e.g. neural,fast,auto), SSD run once per backup as its own "
                      "series (ssd-fast, ...), combined with any --sweep: with --sweep batch one run measures SSD "
                      "with each backup against SD and AR at every batch size")
  p.add_argument("--saguaro-c", type=float, default=1.0, help="ssd: Saguaro sampling C in (0, 1] (1 = off)")
  p.add_argument("--dtype", default="auto", metavar=braces(settings.DTYPES),
                 help="params' dtype on device (auto: the checkpoint's on accelerators, float32 on a CPU)")
  p.add_argument("--quantize", default="auto", metavar=braces(settings.WEIGHTS),
                 help="target weights: auto (gguf for a GGUF target on one CPU device, else full), full, int8 "
                 "(weight-only int8), gguf (the GGUF's own Q8_0/Q4_1 blocks)")
  p.add_argument("--draft-weights", default="auto", metavar=braces(settings.DRAFT_WEIGHTS),
                 help="the draft's: auto (q8_0 on a CPU, else full), full (as loaded), q8_0 (its matrices and "
                      "head in Q8_0 blocks quantized at load: faster on a CPU, acceptance measured)")
  p.add_argument("--attention", default="auto", metavar=braces(settings.ATTN_IMPLS),
                 help="attention implementation: auto (the C++ kernel on a CPU, else ref), ref, cpu or pallas")
  p.add_argument("--ssd-placement", default="auto", metavar=braces(settings.SSD_PLACEMENTS),
                 help="SSD: the draft on its own JAX device of this process (both share the cores), or in its own "
                      "process pinned to its own cores; auto (default, as decode.py and the API): processes on a CPU "
                      "with 2+ usable cores, else devices; --sweep ssd-placement runs devices and processes side by "
                      "side")
  p.add_argument("--target-devices", type=int, default=1, help="devices of the target's tensor-parallel mesh")
  p.add_argument("--draft-devices", type=int, default=1,
                 help="1: the draft on its own device after the target's (SSD); 0: on the target's first device")
  p.add_argument("--target", default="smollm2-135m-instruct", help="target name, checkpoint dir, GGUF or HF dir")
  p.add_argument("--draft", default="default", help="draft checkpoint ('default' = the shipped draft)")
  p.add_argument("--tiny", action="store_true", help="a tiny random target and draft (smoke runs, tests)")
  p.add_argument("--baseline-cores", default="all", choices=["all", "target"],
                 help="target: AR, SD and the peer run pinned to the cores SSD's target gets in the processes "
                      "placement (half of them), i.e. one core each on a 2-core machine, as the issue's bar asks")
  p.add_argument("--sweep", default=None, choices=tuple(SWEEPS))  # the plan's own (no JAX)
  p.add_argument("--sweep-values", default=None, help="comma-separated values (default: per sweep, see docs)")
  p.add_argument("--out-dir", help="write bench.json, bench.md and the PNG plots here")
  p.add_argument("--json-out", help="write the JSON result to this file (default: OUT_DIR/bench.json)")
  p.add_argument("--bandwidth", action=argparse.BooleanOptionalAction, default=True,
                 help="measure memory bandwidth and set the AR step against its limit (real target only); with "
                      "--verify-cost: the single-core streaming bandwidth, the limit of each side of SSD")
  p.add_argument("--peer-threads", type=int, default=None, help="torch threads for the peer (default: torch's)")
  p.add_argument("--verify-cost", action="store_true",
                 help="only measure the target forward cost for T = 1..9 new tokens (verify of K = T-1) vs T = 1, "
                      "with the weight bytes each forward reads and the bandwidth it achieves")
  return p.parse_args(argv)


def verify_cost_table(pipe, prefix: int = 300, repeats: int = 15):
  """Returns {T: median ms} of one target forward of T tokens after a `prefix`-token cache (AOT compiled)."""
  from ssd_jax.bench.step_cost import compiled_step, interleaved_ms
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
import bench
print(bench.streaming_bandwidth_gbs())
"""


def single_core_bandwidth_gbs() -> float:
  """Returns streaming_bandwidth_gbs() measured in a child process pinned to one core (what one side of SSD, or a
  `taskset -c 0` run, can read at most); an affinity set in this process would not reach XLA's running threads."""
  res = subprocess.run([sys.executable, "-c", _PINNED_PROBE, os.path.dirname(os.path.abspath(__file__))],
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


def check_args(args) -> list[str]:
  """Fails on bad input before anything is loaded; returns the modes."""
  modes = [m for m in args.modes.split(",") if m]
  for m in modes:  # the peer's modes come with --peer hf
    settings.check_mode(m)
  if not modes and args.peer != "hf":
    fail("no modes to run")
  for name, val, ok in (("--num-prompts", args.num_prompts, args.num_prompts >= 1),
                        ("--max-new-tokens", args.max_new_tokens, args.max_new_tokens >= 2)):
    if not ok:
      fail(f"{name} {val} is out of range (--num-prompts >= 1, --max-new-tokens >= 2: a first token and a timed one)")
  # The settings' own checks (the API's lines); K, the fan-out, backup and Saguaro C: per variant (bench_variants).
  settings.check_batch_size(args.batch_size)
  settings.LoadSettings(args.attention, args.ssd_placement, "auto", args.quantize, args.dtype, args.target_devices,
                        args.draft_devices, args.draft_weights)
  DecodeOptions(max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed,
                ar_chunk=args.ar_chunk, sd_chunk=args.sd_chunk)
  if args.sweep_values and not args.sweep:
    fail("--sweep-values needs --sweep")
  if args.backups is not None:
    if "ssd" not in modes:
      fail("--backups needs the ssd mode in --modes")
    if args.sweep == "backup":
      fail("--backups and --sweep backup both set the backup: give one")
    for b in args.backups.split(","):
      if b not in BACKUPS:
        fail(f"--backups: unknown backup {b!r}; choose from {', '.join(BACKUPS)}")
  if args.peer == "hf" and (args.batch_size != 1 or args.sweep == "batch"):
    fail("--peer hf needs batch size 1: transformers' assisted generation decodes one sequence at a time")
  if args.peer == "hf":
    import importlib.util
    missing = [m for m in ("torch", "transformers", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
      fail(f"--peer hf needs {', '.join(missing)}: pip install -e \".[peer]\"")
  if args.peer == "llamacpp":
    check_llamacpp(args)
  if args.sweep == "batch":
    top = max(int(v) for v in (args.sweep_values or "1,2,4,8").split(","))
    if args.num_prompts < top:
      fail(f"--sweep batch up to {top} needs --num-prompts >= {top} (one group of prompts feeds every batch size)")
  return modes


_GGUF_TARGETS = ("smollm2-135m-instruct", "smollm2", "target", "default")


def target_gguf(args) -> str | None:
  """Returns the GGUF file the target is read from (--target FILE.gguf or the SmolLM2 target's), else None."""
  if args.tiny:
    return None
  if args.target.endswith(".gguf"):
    return args.target
  if args.target in _GGUF_TARGETS:
    from ssd_jax.models import checkpoints
    return checkpoints.locate_smollm2_gguf()
  return None


def check_llamacpp(args) -> None:
  """--peer llamacpp: fails unless the target comes from a GGUF, decoding is batch 1 and llama-bench is found (its
  path goes to args.peer_bin)."""
  from ssd_jax.bench import llamacpp_peer
  if args.tiny or not (args.target.endswith(".gguf") or args.target in _GGUF_TARGETS):
    fail("--peer llamacpp needs a GGUF target: the default SmolLM2 target or --target FILE.gguf")
  if args.batch_size != 1 or args.sweep == "batch":
    fail("--peer llamacpp compares batch-1 decoding (llama-bench's token generation): use --batch-size 1")
  try:
    args.peer_bin = llamacpp_peer.find_binary(args.peer_bin)
  except llamacpp_peer.LlamaBenchError as e:
    fail(str(e))


def llamacpp_beside(result, args, variants) -> str:
  """Runs llama-bench's token generation on the target's GGUF, pinned as our AR ran (--baseline-cores), with one
  thread per usable core; stores it with ours / llama.cpp per variant in result['llamacpp'] and returns its lines."""
  from ssd_jax.bench import llamacpp_peer
  saved = os.sched_getaffinity(0)
  if args.baseline_cores == "target":
    from ssd_jax.decode.draft_process import set_process_affinity, split_cores
    set_process_affinity(split_cores()[0])
  try:
    print(f"[bench] llama.cpp: llama-bench tg{args.max_new_tokens} on {llamacpp_peer.usable_cores()} thread(s)",
          file=sys.stderr, flush=True)
    peer = llamacpp_peer.measure(args.peer_bin, target_gguf(args), args.max_new_tokens)
  except llamacpp_peer.LlamaBenchError as e:
    fail(str(e))
  finally:
    if args.baseline_cores == "target":
      set_process_affinity(saved)
  ours = {v.label: result["summary"]["by_variant"][v.label]["all"]["tokens_per_second"] for v in variants}
  peer["ours_over_llamacpp"] = {k: t / peer["generation"]["tokens_per_second"] for k, t in ours.items()}
  result["llamacpp"] = peer
  return llamacpp_peer.markdown(peer, ours)


def read_prompt_sets(args) -> dict[str, list[str]]:
  """Returns {dataset: prompts}: --prompts FILE (one set named after the file) or the --datasets."""
  from ssd_jax.data import datasets

  if args.prompts:
    name = os.path.splitext(os.path.basename(args.prompts))[0]
    return {name: datasets.load_prompt_file(args.prompts)[: args.num_prompts]}
  return {d: datasets.load_prompts(d, args.num_prompts) for d in args.datasets.split(",") if d}


def environment(pipe) -> dict:
  """Returns what the figures depend on: date, machine, load, library versions, devices, commit."""
  import jax

  try:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or None
  except (OSError, subprocess.SubprocessError):
    commit = None
  return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
          "host": platform.node(), "machine": platform.machine(), "cpus": os.cpu_count(),
          "load_average": os.getloadavg(), "python": platform.python_version(), "jax": jax.__version__,
          "backend": jax.default_backend(), "devices": [str(d) for d in jax.devices()], "commit": commit,
          "target": {"name": pipe.target.cfg.name, "path": pipe.target.path},
          "draft": None if pipe.draft is None else {"name": pipe.draft.cfg.name, "path": pipe.draft.path}}


def spec_options(o: dict):
  """Returns a variant's SpecOptions (raises ValueError on bad settings)."""
  from ssd_jax.decode import SpecOptions
  return SpecOptions(k=o["k"], fan_out=o["fan_out"], fan_out_miss=o["fan_out_miss"], backup=o["backup"],
                     saguaro_c=o["saguaro_c"], placement=o["ssd_placement"])


class Runner:
  """Decodes one batch of token-id prompts with one variant, ours or the peer's; returns rows and compile time."""

  def __init__(self, pipe, peer, args):
    self.pipe, self.peer, self.args = pipe, peer, args
    self.auto_k = {}  # label -> [{batch, prefix, k, predicted_sd_over_ar}] per batch run of SD or with k='auto'

  def __call__(self, variant, ids):
    cores = variant.opts.get("cores", "all")
    if cores != "all" or (self.args.baseline_cores == "target" and variant.mode != "ssd"):
      from ssd_jax.decode.draft_process import set_process_affinity, split_cores
      saved = os.sched_getaffinity(0)
      # --sweep cores: the first N usable cores; else --baseline-cores target: the cores SSD's target gets.
      set_process_affinity(sorted(saved)[:int(cores)] if cores != "all" else split_cores()[0])
      try:
        return self._run(variant, ids)
      finally:
        set_process_affinity(saved)
    return self._run(variant, ids)

  def _run(self, variant, ids):
    o = variant.opts
    if variant.mode.startswith("hf-"):
      rows = []
      for p in ids:
        k = (self.choose(variant, [p]) or 1) if o["k"] == "auto" else o["k"]
        toks, stats = self.peer.generate(p, variant.mode, self.args.max_new_tokens, o["temperature"], self.args.seed,
                                         k=k)
        rows.append({"token_ids": toks, "stats": stats})
      return rows, 0.0
    spec, mode = spec_options(o), variant.mode
    if spec.auto and mode != "ar":  # as generate_ids resolves it for a mode asked for by name
      spec = spec.with_k(self.choose(variant, ids))
    elif mode in ("ar", "sd") and self.pipe.draft is not None:
      self.note_k(variant, ids, 0 if mode == "ar" else spec.k)
    dec = self.pipe.decoder(mode, spec)
    before = dec.programs.compile_seconds
    res = self.pipe.generate_ids(ids, mode=mode, batch_size=len(ids), spec=spec,
                                 max_new_tokens=self.args.max_new_tokens, temperature=o["temperature"],
                                 seed=self.args.seed, ignore_eos=True, ar_chunk=o["ar_chunk"],
                                 sd_chunk=o["sd_chunk"])
    return [{"token_ids": r.token_ids, "stats": r.stats.to_dict()} for r in res], dec.programs.compile_seconds - before

  def choose(self, variant, ids) -> int:
    """Returns k='auto''s K for this batch (as generate_ids chooses it), noted (note_k)."""
    from ssd_jax.decode import auto_k
    prefix = auto_k.run_prefix([len(p) for p in ids], self.args.max_new_tokens)
    # A variant names its mode, as `decode.py --mode` does: k=auto picks its best K >= 1 (api.generate_ids).
    return self.note_k(variant, ids, self.pipe.choose_k(len(ids), variant.opts["temperature"], prefix, at_least=1))

  def note_k(self, variant, ids, k: int) -> int:
    """Notes in self.auto_k[label] the K an AR (0), SD or k='auto' batch runs, with the cost model's expected SD
    speedup over AR and the table's AR step and verify at its batch and prefix (None without measured costs): the
    by-batch table sets them beside the run's. Returns k."""
    from ssd_jax.decode import auto_k
    temperature, b = variant.opts["temperature"], len(ids)
    prefix = auto_k.run_prefix([len(p) for p in ids], self.args.max_new_tokens)
    costs, a = self.pipe.auto_k_inputs(temperature)
    ar_ms, verify_ms, _ = costs.at(b, prefix) if costs is not None else (None, {}, None)
    note = {"batch": b, "prefix": prefix, "k": k, "acceptance": a,
            "predicted_sd_over_ar": None if costs is None else auto_k.sd_speedup(costs, b, k, a, prefix),
            "table_ar_ms": ar_ms, "table_verify_ms": verify_ms.get(k + 1) if k else None}
    self.auto_k.setdefault(variant.label, []).append(note)
    return k


def load_peer(pipe, args, work_dir: str):
  """Returns (HFPeer, description): the target from its GGUF (or an export), the draft exported to work_dir."""
  from ssd_jax.bench import hf_export
  from ssd_jax.bench.hf_peer import HFPeer

  eos = pipe.tokenizer.eos_id
  draft_dir = None
  info = None
  if pipe.draft is not None:
    draft_dir = os.path.join(work_dir, "hf-draft")
    info = hf_export.export_llama(pipe.draft.params, pipe.draft.cfg, draft_dir, tokenizer=pipe.tokenizer.tok,
                                  eos_id=eos)
    if not info["greedy_exact"]:
      print(f"[bench] warning: the exported draft's greedy argmax may leave its vocabulary ({info})", file=sys.stderr)
  src = target_gguf(args)
  if src is None:
    src = args.target if (not args.tiny and os.path.isdir(args.target)
                          and any(f.endswith(".safetensors") for f in os.listdir(args.target))) else None
    if src is None:  # an ssd-jax checkpoint or the tiny pair: transformers reads the exported copy
      src = os.path.join(work_dir, "hf-target")
      hf_export.export_llama(pipe.target.params, pipe.target.cfg, src, tokenizer=pipe.tokenizer.tok, eos_id=eos)
  print(f"[bench] peer: loading the target from {src} and the draft from {draft_dir} in transformers",
        file=sys.stderr, flush=True)
  peer = HFPeer(src, draft_dir, threads=args.peer_threads)
  return peer, {"target_source": src, "draft_dir": draft_dir, "draft_export": info, "schedule": "constant",
                "torch_threads": peer.torch.get_num_threads()}


def main(argv=None):
  args = parse_args(argv)
  modes = check_args(args)
  split_cpu(max(2, args.target_devices + args.draft_devices))  # before JAX is imported
  from ssd_jax.bench import plan

  variants = bench_variants(args, modes)
  if args.verify_cost:
    return print_verify_cost(args)
  if args.calibrate:
    return calibrate(args, modes)
  prompt_sets = read_prompt_sets(args)
  names = list(prompt_sets)
  pipe = load_pipe(args, modes)
  work = tempfile.mkdtemp(prefix="ssd-bench-") if not args.out_dir else args.out_dir
  os.makedirs(work, exist_ok=True)
  peer, peer_info = (load_peer(pipe, args, work) if args.peer == "hf" else (None, None))
  run = Runner(pipe, peer, args)
  ids = {d: [pipe.encode_prompt(p) for p in ps] for d, ps in prompt_sets.items()}
  warmup = warm_up(run, variants, ids[names[0]])
  run.auto_k = {}  # the timed runs' choices only
  runs = timed_runs(run, variants, names, ids)

  result = {"schema": plan.SCHEMA, "environment": environment(pipe), "args": vars(args), "datasets": names,
            "variants": [{"label": v.label, "mode": v.mode, "series": v.series, "options": v.opts,
                          "sweep_value": v.sweep_value} for v in variants],
            "warmup": warmup, "runs": runs, "peer": peer_info, "auto_k": run.auto_k}
  result["summary"] = plan.summarize(runs, variants, names)
  result["fan_out_fit"] = plan.fan_out_fit(result)
  if "ar" in modes and args.bandwidth and not args.tiny:
    result["ar_bandwidth"] = ar_bandwidth(result, pipe, variants)
  result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  table = plan.markdown(result)
  from ssd_jax.bench import by_batch
  batch_table = by_batch.markdown(result)
  if batch_table:
    table += "\n\nBy batch size (whole-batch decode tokens a second; ratios at the same batch size):\n\n" + batch_table
  if args.peer == "llamacpp":
    table += "\n\n" + llamacpp_beside(result, args, variants)
  print("\n" + table)
  if "ar_bandwidth" in result:
    b = result["ar_bandwidth"]
    print(f"\nAR: {b['ar_ms_per_token']:.1f} ms/token; weights {b['weight_bytes'] / 1e6:.0f} MB at measured "
          f"{b['stream_gbs']:.1f} GB/s => bandwidth limit {b['limit_ms']:.1f} ms/token ({b['fraction_of_limit']:.0%})")
  print(f"peak resident memory: {result['peak_rss_mb']:.0f} MB")
  write_outputs(result, table, args)
  return 0


def bench_variants(args, modes) -> list:
  """Returns the variants to run (modes, the peer's, the sweep), each one's settings checked before anything loads."""
  from ssd_jax import defaults
  from ssd_jax.bench import plan
  from ssd_jax.sharding import make_placement

  all_modes = modes + (["hf-ar", "hf-sd"] if args.peer == "hf" else [])
  # 'auto' resolved as the pipeline will (the placement does not depend on the weights).
  where = defaults.resolve(True, make_placement(args.target_devices, args.draft_devices), args.ssd_placement)[1]
  base = {"k": args.k, "fan_out": args.fan_out, "fan_out_miss": args.fan_out_miss, "backup": args.backup,
          "saguaro_c": args.saguaro_c, "temperature": args.temperature, "batch_size": args.batch_size,
          "ssd_placement": where, "ar_chunk": args.ar_chunk,
          "sd_chunk": args.sd_chunk, "cores": "all"}
  values = args.sweep_values.split(",") if args.sweep_values else None
  backups = [b for b in args.backups.split(",") if b] if args.backups else None
  variants = plan.make_variants(all_modes, base, args.sweep, values, backups)
  for v in variants:  # each variant's own settings (fan-out against its K, swept temperature, ...) fail before loading
    spec_options(v.opts)
    DecodeOptions(temperature=v.opts["temperature"], ar_chunk=v.opts["ar_chunk"], sd_chunk=v.opts["sd_chunk"])
  return variants


def calibrate(args, modes) -> int:
  """--calibrate: measures the step costs k='auto' chooses K from (after auto_k.PREFIXES cached tokens), caches them
  for this machine and pair, and prints the K each batch size then gets and the speedups the model expects at a
  run of --max-new-tokens after 150-token prompts."""
  from ssd_jax.bench import step_cost
  from ssd_jax.decode import auto_k
  from ssd_jax.models.kv_cache import cache_dtype

  pipe = load_pipe(args, ["sd"])
  costs = step_cost.measure(pipe.target, pipe.draft, kv_dtype=cache_dtype(pipe.target.params, pipe.kv_dtype),
                            log=lambda m: print(m, flush=True))
  costs = dataclasses.replace(costs, about=f"{cpu_model()}, {len(os.sched_getaffinity(0))} cores, "
                              f"{pipe.target.cfg.name} ({pipe.weights}) + {pipe.draft.cfg.name}")
  costs = step_cost.measure_host(costs, host_decoder(pipe, HOST_NEW_TOKENS), auto_k.run_prefix(
      [len(host_prompt(pipe))], HOST_NEW_TOKENS), log=lambda m: print(m, flush=True))
  path = pipe.step_costs_path()
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    f.write(costs.to_json())
  a = pipe.auto_k_inputs(args.temperature)[1]
  prefix = auto_k.run_prefix([150], args.max_new_tokens)
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
  ignored: AR, or SD at K=1 (auto_k.measure_host)."""
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
  from ssd_jax import api
  from ssd_jax.models import blocks
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


def llamacpp_forwards(args, prefix: int = 300) -> dict:
  """--verify-cost --peer llamacpp: prints and returns llama-bench's forward of T = 1, 2, 3, 5, 9 tokens after a
  `prefix`-token cache (as verify_cost_table measures ours), one thread per usable core."""
  from ssd_jax.bench import llamacpp_peer
  threads = llamacpp_peer.usable_cores()
  cmd = llamacpp_peer.forward_command(args.peer_bin, target_gguf(args), threads, depth=prefix)
  try:
    forwards = llamacpp_peer.parse_report(llamacpp_peer.run(cmd))
  except llamacpp_peer.LlamaBenchError as e:
    fail(str(e))
  print(f"llama.cpp on the same GGUF, {threads} thread(s): {' '.join(cmd)}")
  print("\n".join(llamacpp_peer.forward_lines(forwards)))
  return {"command": cmd, "threads": threads, "forwards": forwards}


def load_pipe(args, modes):
  """Returns the pipeline the bench measures (the tiny pair with --tiny), with a draft when a mode needs one."""
  from ssd_jax import api
  spec = any(m in ("sd", "ssd") for m in modes) or args.peer == "hf"
  if args.tiny:
    pipe = api.load_tiny(seed=args.seed, target_devices=args.target_devices, draft_devices=args.draft_devices)
    pipe.attn_impl = args.attention
  else:
    pipe = api.load(args.target, draft=args.draft if spec else None, attn_impl=args.attention,
                    target_devices=args.target_devices, draft_devices=args.draft_devices, dtype=args.dtype,
                    weights=args.quantize, draft_weights=args.draft_weights)
  if spec and pipe.draft is None:
    fail("modes sd/ssd and the peer's hf-sd need a draft: none found (checkpoints/draft-smollm2 or --draft PATH)")
  return pipe


def warm_up(run, variants, first) -> dict:
  """Runs every variant once on the first prompts (compiling every program and touching every buffer before the
  clock matters); returns each one's wall and compile seconds."""
  warmup = {}
  for v in variants:
    t = time.perf_counter()
    _, comp = run(v, first[: v.opts["batch_size"]])
    warmup[v.label] = {"wall_seconds": round(time.perf_counter() - t, 3), "compile_seconds": round(comp, 3)}
    print(f"[bench] warm-up {v.label}: {warmup[v.label]['wall_seconds']:.1f} s (compile {comp:.1f} s)",
          file=sys.stderr, flush=True)
  return warmup


def timed_runs(run, variants, names, ids) -> list:
  """Returns the measured runs' records: every set's prompts in groups of the largest batch, each group run by every
  variant in turn (interleaved, so a slow spell of the machine falls on all of them)."""
  from ssd_jax.bench import plan
  group = max(v.opts["batch_size"] for v in variants)
  order = [(d, g, v, ids[d][b: b + v.opts["batch_size"]], list(range(b, min(b + v.opts["batch_size"], len(ids[d])))))
           for d in names for g in range(0, len(ids[d]), group) for v in variants
           for b in range(g, min(g + group, len(ids[d])), v.opts["batch_size"])]
  runs = []
  t_start = time.perf_counter()
  for n, (d, _, v, batch, idx) in enumerate(order, 1):
    rows, comp = run(v, batch)
    rec = plan.run_record(d, v, idx, rows, comp)
    runs.append(rec)
    el = time.perf_counter() - t_start
    s0 = rows[0]["stats"]
    extra = (f", hits {s0['cache_hit_rate']:.2f}, target idle {s0['target_idle_seconds']:.2f} s"
             if "cache_hit_rate" in s0 else "")
    tps = rec["decode_tokens"] / rec["decode_seconds"] if rec["decode_seconds"] > 0 else 0.0
    print(f"[bench {n}/{len(order)} {el:.0f}s, eta {el / n * (len(order) - n):.0f}s] {d}{idx} {v.label}: "
          f"{tps:.2f} tok/s, {rec['new_tokens'] / max(rec['target_forwards'], 1):.2f} tok/fwd{extra}",
          file=sys.stderr, flush=True)
  return runs


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


def write_outputs(result, table: str, args) -> None:
  """Writes the plots and bench.md under --out-dir and the JSON result to --json-out (default <out-dir>/bench.json)."""
  if args.out_dir:
    from ssd_jax.bench import plots
    try:
      result["plots"] = [os.path.basename(p) for p in plots.write_plots(result, args.out_dir)]
      print(f"plots: {', '.join(result['plots'])} in {args.out_dir}")
    except ImportError:
      result["plots"] = []
      print("plots skipped: matplotlib is not installed (pip install -e \".[bench]\")")
    with open(os.path.join(args.out_dir, "bench.md"), "w") as f:
      f.write(table + "\n")
  else:
    print("plots skipped: no --out-dir")
  json_out = args.json_out or (os.path.join(args.out_dir, "bench.json") if args.out_dir else None)
  if json_out:
    with open(json_out, "w") as f:
      json.dump(result, f, indent=1)


if __name__ == "__main__":
  run_main(main)
