"""Decode prompts with the embedded default models (SmolLM2-135M-Instruct target) or your own.

  python scripts/decode.py                                   # a built-in prompt, greedy, prints answer and stats
  python scripts/decode.py --prompt "Write a haiku" --temperature 0.7 --seed 1 --stream
  python scripts/decode.py --prompts prompts.jsonl --json-out out.jsonl --batch-size 4

--prompts takes one {"prompt": ...} object per line. --json-out writes one JSON object per prompt, in input order,
as each batch finishes: {"prompt", "token_ids", "text", "stats", "settings"}. Ctrl-C or SIGTERM keeps every answer
finished (exit code 130 or 143); --resume then answers only the prompts the file lacks, with the same settings.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import warnings

from .. import distributed, settings
from ..cli_util import (Interrupted, Interrupts, add_model_arguments, braces, check_model_args, check_output_file,
                        fail, follow_measured_cores, k_arg, prepare_model, split_cpu, warn)
from ..results_file import ResultsFile, settings_of
from ..decode.options import BACKUPS, FAN_OUT_STRATEGIES, DecodeOptions, SpecOptions  # no JAX

DEFAULT_PROMPT = "What is the capital of France? Answer in one sentence, then name two famous sights there."
# Options only some modes read (argparse dests): a run of another mode warns that they do nothing.
SSD_ONLY = ("fan_out", "fan_out_miss", "fan_out_strategy", "backup", "saguaro_c", "ssd_placement", "draft_timeout")
DRAFT_ONLY = ("k", "draft_head_vocab", "draft_weights")  # sd and ssd


def make_parser() -> argparse.ArgumentParser:
  """The flags; each setting is checked where its options object is built (check_args), not here."""
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  src = p.add_mutually_exclusive_group()
  src.add_argument("--prompt", action="append", help="a prompt (repeatable)")
  src.add_argument("--prompts", help="a JSONL file with one {\"prompt\": ...} object per line")
  p.add_argument("--mode", default=None, metavar=braces(settings.MODES),
                 help="default: the fastest `bench.py --calibrate` measured for this load on this machine, else "
                      "the fastest measured on this backend (ssd_jax.defaults): sd on a CPU with the shipped draft; "
                      "ar when no draft is loaded or nothing was measured")
  p.add_argument("--k", default="auto", type=k_arg,
                 help="draft tokens per round (sd, ssd): an integer, or auto (the default) to choose per batch from "
                      "this machine's step costs (scripts/bench.py --calibrate measures them; without them K=2 at "
                      "batch 1-2, 1 at 3-4, and plain AR for larger batches)")
  p.add_argument("--fan-out", default="3",
                 help="ssd: bonus-token guesses cached per acceptance length: F, or K+1 counts 'F0,F1,...,FK'")
  p.add_argument("--fan-out-miss", default=None, help="ssd: the same after a cache miss (same total)")
  p.add_argument("--fan-out-strategy", default="uniform", metavar=braces(FAN_OUT_STRATEGIES),
                 help="ssd: geometric spreads a budget of F*(K+1) by Theorem 12, from the draft's calibration "
                      "(scripts/calibrate_fan_out.py)")
  p.add_argument("--backup", default="neural", metavar=braces(BACKUPS),
                 help="ssd: speculator on a cache miss (auto: Theorem 17 from measured statistics)")
  p.add_argument("--saguaro-c", type=float, default=1.0,
                 help="ssd: Saguaro sampling, the draft's top tokens down-weighted by C in (0, 1] (1 = off)")
  p.add_argument("--max-new-tokens", type=int, default=128)
  p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
  p.add_argument("--top-p", type=float, default=1.0)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--batch-size", type=int, default=8)
  p.add_argument("--ignore-eos", action="store_true", help="produce exactly --max-new-tokens tokens")
  p.add_argument("--ar-chunk", type=int, default=DecodeOptions.ar_chunk,
                 help="ar: target steps a call (the host's work per call paid once per chunk; the same tokens; "
                      "--stream prints chunks)")
  p.add_argument("--sd-chunk", type=int, default=DecodeOptions.sd_chunk,
                 help="sd: rounds a call with a draft that reads tokens (verify and the next chain in one program; "
                      "the same tokens; --stream prints chunks)")
  p.add_argument("--raw", action="store_true",
                 help="feed the prompt as is, without the chat template (only the tokenizer's own BOS, if any)")
  p.add_argument("--thinking", choices=["on", "off"], default=None,
                 help="the chat template's thinking switch (Qwen3's enable_thinking; default: the template's)")
  p.add_argument("--stream", action="store_true", help="print the text of a single prompt as it is produced")
  p.add_argument("--json-out", help="write one JSON object per prompt to this file, each as its batch finishes")
  p.add_argument("--resume", action="store_true",
                 help="with --json-out: keep the answers already in the file (written with the same settings) and "
                      "answer only the prompts it lacks")
  add_model_arguments(p)
  distributed.add_arguments(p)
  return p


def parse_args(argv=None):
  return make_parser().parse_args(argv)


def check_args(args) -> tuple[SpecOptions, DecodeOptions]:
  """Fails on input that can be checked before JAX or a model is loaded; returns the speculation settings
  (SpecOptions, placed on 'devices' until the placement is resolved) and the decode options. Each setting is checked
  where its options object is built (SpecOptions, DecodeOptions, settings.LoadSettings): the same line as the API's."""
  if args.mode is not None:
    settings.check_mode(args.mode)
  settings.check_batch_size(args.batch_size)
  check_model_args(args)
  opts = DecodeOptions(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                       seed=args.seed, ignore_eos=args.ignore_eos, ar_chunk=args.ar_chunk,
                       sd_chunk=args.sd_chunk)
  spec = SpecOptions(k=args.k, fan_out=args.fan_out, fan_out_miss=args.fan_out_miss,
                     fan_out_strategy=args.fan_out_strategy, backup=args.backup, saguaro_c=args.saguaro_c,
                     draft_timeout=args.draft_timeout)
  if args.json_out:
    check_output_file(args.json_out, "--json-out")
  elif args.resume:
    fail("--resume continues a --json-out file: give --json-out")
  if args.raw and args.thinking:
    fail("--thinking is a chat template switch; --raw bypasses the template")
  return spec, opts


def read_prompts(args) -> list[str]:
  if args.prompts:
    from ..data.datasets import load_prompt_file
    return load_prompt_file(args.prompts)  # bad files raise DataError: one line, exit code 2
  prompts = args.prompt or [DEFAULT_PROMPT]
  if any(not p.strip() for p in prompts):
    fail("empty --prompt")
  return prompts


def ignored_options(args, mode: str) -> list[str]:
  """Returns the options (as --flags) set away from their defaults that `mode` does not read."""
  unread = {"ar": DRAFT_ONLY + SSD_ONLY, "sd": SSD_ONLY}.get(mode, ())
  parser = make_parser()
  unread += ("draft",) if mode == "ar" and args.draft != "none" else ()
  # k='auto' may run a batch of the default mode as AR; a mode asked for by name runs as asked.
  unread += ("ar_chunk",) if mode != "ar" and (args.k != "auto" or args.mode is not None) else ()
  unread += ("sd_chunk",) if mode != "sd" else ()
  return ["--" + d.replace("_", "-") for d in unread if getattr(args, d) != parser.get_default(d)]


def check_template(args, switches: dict) -> None:
  """Fails, before any weights are read, when a model directory's chat template does not parse, is missing (and
  --raw is not given) or lacks a switch asked for."""
  from ..models.tokenizer import TextTokenizer

  if not args.raw and os.path.isfile(os.path.join(args.target, "tokenizer.json")):
    TextTokenizer.from_dir(args.target).chat_prompt("Hi", **switches)  # one line: TemplateError / TokenizerError


def check_calibration(args, draft_path: str | None) -> None:
  """Fails unless the draft has a well-formed fan-out calibration (the library reads it for geometric fan-out)."""
  from ..theory.fan_out import CALIBRATION_FILE, read_calibration

  if draft_path is None:
    fail("--fan-out-strategy geometric reads the draft's fan-out calibration, but no draft is loaded "
         f"({'--draft none' if args.draft == 'none' else 'the shipped draft is missing'}); pass --draft PATH or "
         "use --fan-out-strategy uniform")
  read_calibration(os.path.join(draft_path, CALIBRATION_FILE))  # a missing or malformed file: one line


def one_line_warnings(categories: tuple) -> None:
  """Shows warnings of these categories as one line each, as the CLI's other warnings; others as before."""
  for category in categories:
    warnings.simplefilter("always", category)
  show = warnings.showwarning
  warnings.showwarning = lambda message, category, *a, **kw: (
      warn(str(message)) if issubclass(category, categories) else show(message, category, *a, **kw))


def show_answer(args, g, index: int, total: int) -> None:
  """Prints one finished answer (unless it was streamed) and its statistics line."""
  if args.stream:
    print()
  else:
    if total > 1:
      print(f"=== [{index + 1}] {g.prompt[:70]!r}")
    print(g.text, flush=True)
  s = g.stats
  print(f"--- {s['mode']}: {s['new_tokens']} tokens, {s['tokens_per_second']:.1f} tok/s decode, "
        f"{s['tokens_per_target_forward']:.2f} tokens/target forward, prefill {s['prefill_seconds']:.2f} s"
        + (f", acceptance {s['acceptance_rate']:.2f}" if "acceptance_rate" in s else "")
        + (f", cache hits {s['cache_hit_rate']:.2f}, target idle {s['target_idle_seconds']:.2f} s"
           if "cache_hit_rate" in s else ""), file=sys.stderr, flush=True)


def main(argv=None):
  args = parse_args(argv)
  spec, opts = check_args(args)
  prompts = read_prompts(args)
  if args.stream and len(prompts) != 1:
    fail("--stream needs exactly one prompt")
  out = None  # the --json-out file, read and checked (--resume) before any model loads
  if args.json_out and distributed.is_main():
    out = ResultsFile(args.json_out, settings_of(args), prompts, args.resume)
    if not out.todo:
      print(f"every prompt already has its answer in {args.json_out}", file=sys.stderr)
      return 0
  _, nproc, _ = distributed.settings(args.coordinator, args.num_processes, args.process_id)
  split_cpu(max(2, distributed.local_devices_needed(args.target_devices, args.draft_devices, nproc)))
  distributed.initialize(args.coordinator, args.num_processes, args.process_id)  # before any device is touched
  from .. import api

  # What runs, decided before any weights are read, as api.load decides it: bad input fails here, in a second.
  no_draft = args.mode == "ar" or args.draft == "none"  # (a run in the default mode may still end up AR)
  if args.mode == "ar" and args.draft not in ("default", "none"):
    api.draft_dir(args.draft)  # unread under ar (a warning below), but a draft that is not there is still a mistake
  if args.fan_out_strategy == "geometric" and args.mode != "ar" and args.draft == "none":
    check_calibration(args, None)  # before prepare, which may fetch the target's weights
  follow_measured_cores()  # before the plan counts the usable cores (SSD's placement, the default mode)
  plan = prepare_model(args, None if no_draft else args.draft, None if args.mode == "ar" else args.draft_head_vocab)
  default_mode, where = plan.mode_and_placement()
  spec = dataclasses.replace(spec, placement=where)
  mode = args.mode or default_mode
  settings.check_mode(mode, plan.draft is not None)
  if args.fan_out_strategy == "geometric" and args.mode != "ar":  # also in the default mode, where it may be unused
    check_calibration(args, plan.draft)
  ignored = ignored_options(args, mode)
  if ignored:
    warn(f"{', '.join(ignored)} {'does' if len(ignored) == 1 else 'do'} nothing under --mode {mode}"
         + ("" if args.mode else " (the default here; choose another with --mode)"))
  switches = {} if args.thinking is None else {"enable_thinking": args.thinking == "on"}
  check_template(args, switches)
  plan = plan.without_draft() if mode == "ar" else plan
  plan.check_memory(api.Run.for_texts(mode, prompts, args.batch_size, opts.max_new_tokens, spec, opts.sd_chunk))
  pipe = api.load_prepared(plan)
  stream = (lambda s: print(s, end="", flush=True)) if args.stream else None
  one_line_warnings((api.SlowerThanAR, api.DraftLostWarning))
  if out is not None:
    out.open()
  todo = out.todo if out is not None else list(range(len(prompts)))

  stop = Interrupts()

  def finished(i: int, g) -> None:  # each answer as its batch finishes: to the file, then to the screen
    stop.check()  # a signal Python dropped on its way (see Interrupts) stops the run here
    if out is not None:
      try:
        out.write(g)
      except OSError as e:  # checked before decoding; this is the disk filling up or the like
        fail(f"--json-out {args.json_out} could not be written ({e.strerror})")
    if distributed.is_main():
      show_answer(args, g, todo[i], len(prompts))

  try:
    with stop:
      pipe.generate([prompts[i] for i in todo], mode=args.mode, max_new_tokens=opts.max_new_tokens,
                    temperature=opts.temperature, top_p=opts.top_p, seed=opts.seed, batch_size=args.batch_size,
                    ignore_eos=opts.ignore_eos, ar_chunk=opts.ar_chunk, sd_chunk=opts.sd_chunk, chat=not args.raw,
                    stream=stream, spec=spec, on_result=finished, **switches)
  except Interrupted as e:  # Ctrl-C or SIGTERM
    done = (out.answered_before + out.written) if out is not None else None
    where = (f"; {done} of {len(prompts)} answers are in {args.json_out} (--resume answers the rest)"
             if out is not None else "")
    print(f"\ninterrupted{where}", file=sys.stderr)
    return e.code
  finally:
    if out is not None:
      out.close()
  return 0

