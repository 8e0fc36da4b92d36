#!/usr/bin/env python
"""The draft's per-token cost, call by call, in this process: what a round of SD spends on its draft.

  PYTHONPATH=. python scripts/experiments/draft_cost.py --batch 1,4 --draft-weights full,q8_0

For each draft weight format and batch size, medians (ms) of interleaved repeats (every call of every format in
turn, so drift on a shared machine hits them alike), after a --prefix-token cache:
  empty_jit     a jitted x + 1 on [B] int32, dispatched and waited for (the floor of any call)
  ready / get   waiting for an array already computed / fetching a [B] int32 result to the host (device_get)
  step          one draft forward of one token a row, its head and the argmax (compiled, waited for)
  linear        the forward SD's proposal starts with: 2 tokens a row, logits of the last
  exe_K         steps.draft_propose's compiled program at K (its arguments already on the device), waited for
  propose_K     DraftModel.chain as SD calls it (its tail and the outcome already on the device, the program
                keyed once a run; the round's key folded apart) with the tokens fetched: the draft's share of a round
  host_K        propose_K - exe_K: host-side work and dispatch of a proposal
The standalone draft and an EAGLE draft (--eagle: the target's head rows attached, as load() gives it) are both
measured when given; each format is made from the same loaded weights by draft_weights.quantize_draft.
"""
from __future__ import annotations

import argparse
import json
import time

from ssd_jax import settings
from ssd_jax.cli_util import braces, fail, run_main
from ssd_jax.models.config import is_eagle


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--draft", default="default", help="standalone draft ('default': the shipped one; 'none': skip)")
  p.add_argument("--eagle", default=None, help="also an EAGLE draft (e.g. checkpoints/eagle-smollm2; with --tiny "
                 "any value: the tiny one)")
  p.add_argument("--draft-weights", default="full,q8_0", help=f"comma-separated, of {braces(settings.DRAFT_WEIGHTS)}")
  p.add_argument("--tiny", action="store_true", help="the tiny random pair's drafts (smoke runs, tests)")
  p.add_argument("--batch", default="1", help="comma-separated batch sizes")
  p.add_argument("--ks", default="1,2,3", help="comma-separated K of draft_propose")
  p.add_argument("--prefix", type=int, default=300)
  p.add_argument("--repeats", type=int, default=21)
  p.add_argument("--json-out")
  return p.parse_args(argv)


def _timer(fn):
  """Returns run() -> seconds of fn() (warmed up)."""
  def run():
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0
  for _ in range(3):
    run()
  return run


def floor_calls(b: int) -> dict:
  """The per-call floors: an empty jitted call, waiting for a ready array, fetching a small one."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  x = jnp.zeros((b,), jnp.int32)
  inc = jax.jit(lambda v: v + 1)
  done = inc(x).block_until_ready()
  return {"empty_jit": _timer(lambda: inc(x).block_until_ready()),
          "ready": _timer(lambda: done.block_until_ready()),
          "get": _timer(lambda: np.asarray(jax.device_get(done)))}


def step_calls(cfg, params, b: int, prefix: int, cache_len: int) -> dict:
  """One forward of 1 and of 2 tokens a row after `prefix` cached ones, with the head and the argmax (an EAGLE
  draft: one step, step_cost.compiled_eagle_step)."""
  import jax
  import jax.numpy as jnp

  from ssd_jax.models import model
  from ssd_jax.models.kv_cache import KVCache

  def fwd(params, toks, cache):
    logits, cache = model.forward_causal(params, toks, cache, cfg)
    return jnp.argmax(logits[:, -1], -1), cache

  if is_eagle(cfg):  # one step reading its own hidden state (its head's logits, no argmax)
    from ssd_jax.bench.step_cost import compiled_eagle_step
    return {"step": compiled_eagle_step(cfg, params, prefix, cache_len, b)}
  calls = {}
  for name, t in (("step", 1), ("linear", 2)):
    state = {"cache": KVCache.init(cfg, b, cache_len).replace(lengths=jnp.full((b,), prefix, jnp.int32))}
    toks = jnp.ones((b, t), jnp.int32)
    exe = jax.jit(fwd, donate_argnums=2).lower(params, toks, state["cache"]).compile()

    def call(exe=exe, toks=toks, state=state):
      tok, state["cache"] = exe(params, toks, state["cache"])
      tok.block_until_ready()
    calls[name] = _timer(call)
  return calls


def propose_calls(cfg, params, b: int, ks, prefix: int, cache_len: int) -> dict:
  """draft_propose at each K: its compiled program alone (exe_K), and DraftModel.chain with the fetch (propose_K)."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  from ssd_jax.decode.base import Programs
  from ssd_jax.decode.draft import make_draft_model
  from ssd_jax.decode.options import DecodeOptions
  from ssd_jax.decode.steps import draft_propose

  dev = jax.devices()[0]
  put = lambda x: jax.device_put(x, dev)  # noqa: E731
  tokens, lengths = np.ones((b, prefix), np.int32), np.full((b,), prefix, np.int32)
  calls = {}
  for k in ks:
    m = make_draft_model(cfg, params, "auto", put, Programs(), np.asarray)
    m.start(tokens, lengths, cache_len, DecodeOptions(max_new_tokens=16), k, chain=True)
    f = getattr(cfg, "feature_dim", None)
    m.prefill(None if f is None else put(jnp.zeros((b, prefix, f), jnp.float32)))
    window, key = np.ones((b, m.window), np.int32), jax.random.key(1)
    args = (m.params, m.cache, m.hist, put(window), put(lengths), put(key), *m.sampling)
    exe = m.run.compile_only(draft_propose, *args, **dict(m.st, k=k, saguaro_top=0))

    def direct(m=m, exe=exe, args=args):
      tok, _, m.cache = exe(args[0], m.cache, *args[2:])
      tok.block_until_ready()

    m.chain(args[5], tail=(window, lengths))  # the tail on the device; an outcome of no verified row keeps it
    outcome = put((np.zeros((b, k), np.int32), np.zeros(b, np.int32), np.zeros(b, np.int32), np.zeros(b, bool)))

    def via_model(m=m, key=args[5], outcome=outcome):
      tok, _ = m.chain(key, outcome)
      np.asarray(m.fetch(tok))
    calls[f"exe_{k}"], calls[f"propose_{k}"] = _timer(direct), _timer(via_model)
  return calls


def load_drafts(args):
  """Returns {label: (cfg, params)} of every draft and format asked for (formats as draft_weights makes them)."""
  from ssd_jax import api
  from ssd_jax.models import draft_weights

  formats = args.draft_weights.split(",")
  for f in formats:
    settings.check_choice("draft weights", f, settings.DRAFT_WEIGHTS)
  out = {}
  for name, path in (("draft", None if args.draft == "none" else args.draft), ("eagle", args.eagle)):
    if path is None:
      continue
    pipe = (api.load_tiny(eagle=name == "eagle") if args.tiny
            else api.load(draft=path, draft_weights="full"))
    for f in formats:
      d = pipe.draft
      out[f"{name}/{draft_weights.resolve(f)}"] = (d.cfg, draft_weights.quantize_draft(d.cfg, d.params, f))
  return out


def main(argv=None):
  args = parse_args(argv)
  if args.repeats < 1 or args.prefix < 2:
    fail("--repeats must be >= 1 and --prefix >= 2")
  import numpy as np

  batches, ks = [int(x) for x in args.batch.split(",")], [int(x) for x in args.ks.split(",")]
  drafts = load_drafts(args)
  cache_len = args.prefix + 64
  report = {}
  for b in batches:
    calls = {f"floor/{n}": r for n, r in floor_calls(b).items()}
    for label, (cfg, params) in drafts.items():
      calls.update({f"{label}/{n}": r for n, r in step_calls(cfg, params, b, args.prefix, cache_len).items()})
      calls.update({f"{label}/{n}": r for n, r in propose_calls(cfg, params, b, ks, args.prefix, cache_len).items()})
    times = {n: [] for n in calls}
    for _ in range(args.repeats):
      for n, run in calls.items():
        times[n].append(run())
    ms = {n: round(float(np.median(t)) * 1e3, 3) for n, t in times.items()}
    for label in drafts:
      for k in ks:
        ms[f"{label}/host_{k}"] = round(ms[f"{label}/propose_{k}"] - ms[f"{label}/exe_{k}"], 3)
    report[f"batch{b}"] = ms
    print(f"batch {b} (median ms of {args.repeats} interleaved repeats):")
    for n in sorted(ms):
      print(f"  {n:28s} {ms[n]:8.3f}")
  if args.json_out:
    with open(args.json_out, "w") as f:
      json.dump(report, f, indent=1)


if __name__ == "__main__":
  run_main(main)
