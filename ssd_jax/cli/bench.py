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
import datetime
import json
import os
import platform
import resource
import subprocess
import tempfile

from .. import settings
from ..bench.plan import SWEEPS
from ..cli_util import add_model_arguments, braces, check_model_args, fail, k_arg, split_cpu
from ..decode.options import BACKUPS, DecodeOptions  # no JAX
from .bench_machine import ar_bandwidth, calibrate, print_verify_cost
from .bench_peers import check_llamacpp, llamacpp_beside, load_peer
from .bench_runs import Runner, load_pipe, spec_options, timed_runs, warm_up


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
  # What to load and where: decode.py's and serve.py's flags (--ssd-placement is every SSD variant's; --sweep
  # ssd-placement runs devices and processes side by side).
  add_model_arguments(p)
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
  check_model_args(args)
  if args.tiny and args.draft_head_vocab is not None:
    fail("--draft-head-vocab cuts a loaded draft's head; the --tiny pair's draft has its own reduced head")
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


def main(argv=None):
  args = parse_args(argv)
  modes = check_args(args)
  split_cpu(max(2, args.target_devices + args.draft_devices))  # before JAX is imported
  from ..bench import plan

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
  from ..bench import by_batch
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
  from .. import defaults
  from ..bench import plan
  from ..sharding import make_placement

  all_modes = modes + (["hf-ar", "hf-sd"] if args.peer == "hf" else [])
  # 'auto' resolved as the pipeline will (the placement does not depend on the weights).
  where = defaults.resolve(True, make_placement(args.target_devices, args.draft_devices), args.ssd_placement)[1]
  base = {"k": args.k, "fan_out": args.fan_out, "fan_out_miss": args.fan_out_miss, "backup": args.backup,
          "saguaro_c": args.saguaro_c, "temperature": args.temperature, "batch_size": args.batch_size,
          "ssd_placement": where, "draft_timeout": args.draft_timeout, "ar_chunk": args.ar_chunk,
          "sd_chunk": args.sd_chunk, "cores": "all"}
  values = args.sweep_values.split(",") if args.sweep_values else None
  backups = [b for b in args.backups.split(",") if b] if args.backups else None
  variants = plan.make_variants(all_modes, base, args.sweep, values, backups)
  for v in variants:  # each variant's own settings (fan-out against its K, swept temperature, ...) fail before loading
    spec_options(v.opts)
    DecodeOptions(temperature=v.opts["temperature"], ar_chunk=v.opts["ar_chunk"], sd_chunk=v.opts["sd_chunk"])
  return variants


def read_prompt_sets(args) -> dict[str, list[str]]:
  """Returns {dataset: prompts}: --prompts FILE (one set named after the file) or the --datasets."""
  from ..data import datasets

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


def write_outputs(result, table: str, args) -> None:
  """Writes the plots and bench.md under --out-dir and the JSON result to --json-out (default <out-dir>/bench.json)."""
  if args.out_dir:
    from ..bench import plots
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
