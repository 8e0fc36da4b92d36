#!/usr/bin/env python
"""What a round of AR and SD costs in this process, and how much of it is host work.

  PYTHONPATH=. taskset -c 0 python scripts/experiments/round_cost.py --ks 1,2 --max-new-tokens 64

Decodes the prompts greedily with AR and SD at each K in turn (interleaved repeats, after a warm-up run that also
checks SD's text equals AR's), timing the round loop (loop.run_rounds) with the strategy each mode runs: "rounds"
(AR, and SD at --sd-chunk 1: a target call a round) or "sd_chunk" (SD in chunks, DecodeOptions.sd_chunk's default: n
rounds a call); the report's `loop` names it, and a run whose rounds went around the loop stops the script. The loop is timed three ways:
  tok_s          tokens a second (wall clock: only meaningful on a quiet machine)
  cpu_us_token   the process's CPU time per token (all threads: the compiled programs and the host work); on one
                 core this is the cost that matters, and it holds up on a busy machine better than the wall clock
  main_us_round  the main thread's CPU time per round: dispatch, keying, fetches, the books (host work)
  x_ar_cpu       AR's cpu_us_token over this mode's: SD's speedup in CPU time
with tokens_per_round and tokens_per_call (a call of the target's program: AR's chunk of steps, SD's chunk of rounds).
Then each mode's compiled programs alone, their arguments on the device, waited for (CPU us a call): `verify` (the
target's verify of K drafts, AR's step at K=0) and `chain` (SD's draft, steps.chain_after): the programs of a round
a call (SD at --sd-chunk 1); a chunk runs both n times inside one program.
"""
from __future__ import annotations

import argparse
import json
import time

from ssd_jax.bench.loop_cost import loop_costs
from ssd_jax.cli_util import fail, run_main

PROMPTS = ("Write a Python function that returns the n-th Fibonacci number.",
           "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many "
           "clips did Natalia sell altogether in April and May?")


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--ks", default="1,2", help="comma-separated K of SD (AR always runs)")
  p.add_argument("--max-new-tokens", type=int, default=64)
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--ar-chunk", type=int, default=None,
                 help="AR's steps a call (default: DecodeOptions'; 1: an AR round is one step)")
  p.add_argument("--sd-chunk", type=int, default=None,
                 help="SD's rounds a call (default: DecodeOptions'; 1: a round a call, the unfused loop)")
  p.add_argument("--tiny", action="store_true", help="the tiny random pair (smoke runs, tests)")
  p.add_argument("--json-out")
  return p.parse_args(argv)


def _cpu_us(fn, reps: int = 20) -> float:
  """Returns the median process CPU time of fn() in us (after two warm-up calls)."""
  import numpy as np
  fn(), fn()
  t = []
  for _ in range(reps):
    c = time.process_time()
    fn()
    t.append(time.process_time() - c)
  return round(float(np.median(t)) * 1e6)


def compiled_costs(dec, prompt, opts) -> dict:
  """Returns CPU us of the mode's compiled verify (all rows inactive: the same work, the cache length kept) and, for
  SD, its chain, each waited for."""
  import jax.numpy as jnp
  import numpy as np

  from ssd_jax.decode import rounds
  from ssd_jax.decode.base import pad_prompts
  from ssd_jax.decode.speculator import DraftJob
  from ssd_jax.decode.steps import chain_after, verify

  tokens, lengths = pad_prompts([prompt])
  t = rounds.TargetSide(dec, tokens, lengths, opts)
  t.prefill()
  k, rep = dec.k, t.rep
  z, off = rep(jnp.zeros((1,), jnp.int32)), rep(jnp.zeros((1,), bool))
  args = [dec.tparams, t.cache, z, rep(jnp.zeros((1, k), jnp.int32)), rep(jnp.zeros((1, k, dec.tcfg.vocab_size))),
          off, t.key, t.temp, t.top_p]
  exe = dec.programs.compile_only(verify, *args, **t.st)

  def run_verify():
    acc, bonus, args[1], *_ = exe(*args)
    bonus.block_until_ready()
  out = {"verify": _cpu_us(run_verify)}
  if k:
    side = dec.draft.side
    side.prepare(DraftJob([list(prompt)], opts))
    side.prefill()
    m = side.model
    m.chain(t.key, tail=(np.ones((1, m.window), np.int32), lengths))  # any tail: the program's cost is the same
    dargs = [m.params, m.cache, m.hist, *m.tail, rep(jnp.zeros((1, k), jnp.int32)), z, z, off, t.key, *m.sampling]
    dexe = m.run.compile_only(chain_after, *dargs, **m.st, k=k, saguaro_top=m.saguaro_top)

    def run_chain():
      tok, _, dargs[1], *_ = dexe(*dargs)
      tok.block_until_ready()
    out["chain"] = _cpu_us(run_chain)
  return out


def main(argv=None):
  args = parse_args(argv)
  ks = [int(x) for x in args.ks.split(",")]
  if args.repeats < 1 or args.max_new_tokens < 2 or min(ks) < 1 or min(args.ar_chunk or 1, args.sd_chunk or 1) < 1:
    fail("--repeats must be >= 1, --max-new-tokens >= 2, --ar-chunk and --sd-chunk >= 1 and every K >= 1")
  import ssd_jax
  from ssd_jax import api
  from ssd_jax.decode.options import DecodeOptions

  pipe = api.load_tiny() if args.tiny else ssd_jax.load()
  prompts = [pipe.encode_prompt(p) for p in PROMPTS]
  chunk = {k: v for k, v in (("ar_chunk", args.ar_chunk), ("sd_chunk", args.sd_chunk)) if v is not None}
  opts = DecodeOptions(max_new_tokens=args.max_new_tokens, ignore_eos=True, **chunk)
  decoders = {"ar": pipe.decoder("ar"), **{f"sd{k}": pipe.decoder("sd", pipe.spec_options(k=k)) for k in ks}}
  report = loop_costs(decoders, prompts, opts, args.repeats)
  for mode, dec in decoders.items():
    report[mode]["compiled_cpu_us"] = compiled_costs(dec, prompts[0], opts)
  for mode, r in report.items():
    print(f"{mode:5s} {json.dumps(r)}")
  if args.json_out:
    with open(args.json_out, "w") as f:
      json.dump(report, f, indent=1)


if __name__ == "__main__":
  run_main(main)
