#!/usr/bin/env python
"""What placement costs: AR and SSD with the target over 1, 2 and 4 devices, and the bytes between target and draft.

  python scripts/experiments/bench_placement.py   # SmolLM2-135M target + shipped draft, 1/2/4 devices
  python scripts/experiments/bench_placement.py --tiny --devices 1,2 --max-new-tokens 16 --repeats 1   # a smoke run

On a CPU the script splits it into max(--devices) + 1 devices (the target's mesh and the draft's own device), so on
a machine with few cores this shows the overheads of the mesh (collectives, dispatch), not a speed-up. Every
configuration decodes the same prompts greedily after a warm-up run (compilation is excluded and reported apart);
the figures are medians over --repeats runs.

Bytes per SSD round are counted from the arrays the SSD decoder actually moves (Placement.to_target / fetch): the
served speculation (tokens [B, K] int32 and their draft distributions [B, K, V] float32) from the draft's device to
the target's, and the verify outcome (accept length and bonus token, [B] int32 each) from the target back through the
host to the draft. They are checked against the formula from those shapes.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys

from ssd_jax.cli_util import fail, run_main, split_cpu

PROMPTS = ["Write a Python function that checks whether a number is prime.",
           "Explain in two sentences why the sky is blue."]


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--devices", default="1,2,4", help="comma-separated sizes of the target's mesh")
  p.add_argument("--modes", default="ar,ssd", help="comma-separated: ar, ssd")
  p.add_argument("--max-new-tokens", type=int, default=64)
  p.add_argument("--repeats", type=int, default=3, help="timed runs per configuration (median reported)")
  p.add_argument("--k", type=int, default=2, help="ssd: draft tokens per round")
  p.add_argument("--fan-out", type=int, default=3, help="ssd: bonus-token guesses per acceptance length")
  p.add_argument("--target", default="smollm2-135m-instruct", help="target name, checkpoint dir, GGUF or HF dir")
  p.add_argument("--draft", default="default", help="draft checkpoint ('default' = the shipped draft)")
  p.add_argument("--tiny", action="store_true", help="a tiny random target and draft instead (smoke runs)")
  p.add_argument("--json-out", help="also write the results as JSON to this file")
  return p.parse_args(argv)


def load_pair(args):
  """Returns (target cfg, target params, draft cfg, draft params, prompt token lists)."""
  if args.tiny:
    import jax

    from ssd_jax.models import model
    from ssd_jax.models.config import tiny_config

    cfg = tiny_config(vocab_size=512, n_heads=4, n_kv_heads=4)
    tp = model.init_params(jax.random.key(0), cfg, scale=0.3)
    dcfg = tiny_config(vocab_size=512, n_layers=1, n_heads=4, n_kv_heads=4)
    dp = model.init_params(jax.random.key(1), dcfg, scale=0.3)
    return cfg, tp, dcfg, dp, [[1 + i, 7, 42, 100 + i] for i in range(len(PROMPTS))]
  from ssd_jax import api, settings

  pipe = api.load(args.target, draft=args.draft, target_devices=1, draft_devices=0)
  if "ssd" in args.modes:
    settings.check_mode("ssd", pipe.draft is not None)  # the API's line for a mode without a draft
  d = pipe.draft
  return (pipe.target.cfg, pipe.target.params, d and d.cfg, d and d.params,
          [pipe.encode_prompt(p) for p in PROMPTS])


def counting_placement(tp: int):
  """Returns a Placement (target over `tp` devices, the draft on the next) that tallies the bytes it moves."""
  import jax

  from ssd_jax.sharding import Placement, make_placement

  @dataclasses.dataclass(frozen=True)
  class Counting(Placement):
    moved: dict = dataclasses.field(default_factory=dict, compare=False)

    def _add(self, key: str, n: int):
      self.moved[key] = self.moved.get(key, 0) + n

    def to_target(self, tree):
      for x in jax.tree.leaves(tree):
        on_draft = isinstance(x, jax.Array) and x.sharding.device_set == {self.draft_device}
        if on_draft and self.draft_device not in set(self.target_mesh.devices.flat):
          self._add("draft_to_target", x.nbytes)
        elif not on_draft:
          self._add("host_to_target", getattr(x, "nbytes", 0))
      return super().to_target(tree)

    def fetch(self, x):
      self._add("target_to_host", x.nbytes)
      return super().fetch(x)

  base = make_placement(tp, 1)
  return Counting(base.target_mesh, base.draft_device)


def sharded_axes(cfg, tp: int) -> str:
  """Returns which logical axes the rules split over a mesh of `tp` (the rest is replicated)."""
  from ssd_jax.sharding import RULES, logical_sizes

  sizes = logical_sizes(cfg)
  split = [a for a, _ in RULES.rules if tp > 1 and sizes[a] % tp == 0]
  return ",".join(split) if split else "-"


def run_config(mode: str, tp_n: int, pair, args) -> dict:
  """Returns the median decode cost of `mode` with the target over `tp_n` devices (and, for SSD, bytes/round)."""
  import numpy as np

  from ssd_jax.decode import ARDecoder, DecodeOptions, SpecOptions, SSDDecoder

  tcfg, tparams, dcfg, dparams, prompts = pair
  pl = counting_placement(tp_n)
  if mode == "ar":
    dec = ARDecoder(tcfg, tparams, placement=pl)
  else:
    dec = SSDDecoder(tcfg, tparams, dcfg, dparams, SpecOptions(k=args.k, fan_out=args.fan_out), placement=pl)
  opts = DecodeOptions(max_new_tokens=args.max_new_tokens, ignore_eos=True)
  ms, tokens, moved, rounds = [], None, {}, 0
  for rep in range(args.repeats + 1):  # run 0 compiles and warms up
    for p in prompts:  # one prompt at a time: B = 1
      pl.moved.clear()
      r = dec.generate([p], opts)[0]
      if rep == 0:
        continue
      ms.append(1000 * r.stats.decode_seconds / max(r.stats.new_tokens - 1, 1))
      if rep == 1:
        tokens = (tokens or []) + [r.token_ids]
        if mode == "ssd":
          rounds += r.stats.extra["rounds"]
          for key, n in pl.moved.items():
            moved[key] = moved.get(key, 0) + n
  out = {"mode": mode, "target_devices": tp_n, "draft_device": pl.draft_device.id,
         "sharded_axes": sharded_axes(tcfg, tp_n), "ms_per_token_median": round(statistics.median(ms), 3),
         "ms_per_token_runs": [round(x, 3) for x in ms], "compile_seconds": dec.programs.compile_seconds,
         "tokens": tokens}
  if mode == "ssd":
    per_round = {key: n / max(rounds, 1) for key, n in moved.items()}
    k, v = args.k, tcfg.vocab_size
    formula = {"draft_to_target": k * 4 + k * v * 4, "target_to_draft": 2 * 4}  # B = 1
    out.update(rounds=rounds, bytes_per_round={key: round(n, 1) for key, n in per_round.items()},
               bytes_per_round_formula=formula)
    # Every round moves one speculation; the first token and the prefill add a little, hence the tolerance.
    got = per_round.get("draft_to_target", 0)
    out["formula_matches"] = bool(np.isclose(got, formula["draft_to_target"], rtol=0.05))
  return out


def main(argv=None):
  args = parse_args(argv)
  try:
    sizes = [int(x) for x in args.devices.split(",")]
  except ValueError:
    fail(f"--devices must be comma-separated integers, got {args.devices!r}")
  modes = args.modes.split(",")
  if min(sizes) < 1 or any(m not in ("ar", "ssd") for m in modes) or args.repeats < 1:
    fail("--devices must be >= 1, --modes from ar, ssd, --repeats >= 1")
  split_cpu(max(sizes) + 1)
  import jax

  if len(jax.devices()) < max(sizes) + 1:
    fail(f"{max(sizes) + 1} devices needed (target mesh + draft), {len(jax.devices())} available")
  pair = load_pair(args)
  rows = []
  for mode in modes:
    for n in sizes:
      r = run_config(mode, n, pair, args)
      rows.append(r)
      print(f"[{mode} tp={n}] {r['ms_per_token_median']} ms/token", file=sys.stderr, flush=True)
  base = {r["mode"]: r["tokens"] for r in rows if r["target_devices"] == sizes[0]}
  print(f"platform {jax.default_backend()}, {len(jax.devices())} devices; target {pair[0].name}, "
        f"vocab {pair[0].vocab_size}; K={args.k}, F={args.fan_out}, {args.max_new_tokens} new tokens, B=1")
  print("| mode | target devices | draft device | sharded axes | ms/token (median) | same tokens | compile s |")
  print("|---|---|---|---|---|---|---|")
  for r in rows:
    same = "yes" if r["tokens"] == base[r["mode"]] else "NO"
    print(f"| {r['mode']} | {r['target_devices']} | {r['draft_device']} | {r['sharded_axes']} | "
          f"{r['ms_per_token_median']:.2f} | {same} | {r['compile_seconds']:.1f} |")
  for r in rows:
    if r["mode"] == "ssd":
      b = r["bytes_per_round"]
      print(f"ssd tp={r['target_devices']}: per round {b.get('draft_to_target', 0):.0f} B draft->target "
            f"(formula K*4 + K*V*4 = {r['bytes_per_round_formula']['draft_to_target']}), "
            f"{b.get('target_to_host', 0):.0f} B target->host->draft (accept length + bonus: 8), "
            f"{b.get('host_to_target', 0):.0f} B host->target inputs; {r['rounds']} rounds")
  if args.json_out:
    with open(args.json_out, "w", encoding="utf-8") as f:
      json.dump({"args": vars(args), "results": rows}, f, indent=1)
  return 0


if __name__ == "__main__":
  run_main(main)
