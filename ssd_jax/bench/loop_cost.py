"""The decode loop's cost in this process, timed around the round loop every mode runs (loop.run_rounds), named by
the strategy that ran it (rounds.StepRounds "rounds": AR, and SD with a target call a round; sd_chunk.SDChunks
"sd_chunk": SD in chunks), in process CPU time, the main thread's CPU time and wall time
(scripts/experiments/round_cost.py reports them, with each mode's compiled programs alone)."""
from __future__ import annotations

import time


def timed_loop(loop, box: dict):
  """Returns a stand-in for the round loop `loop` (loop.run_rounds) that records its strategy's name and its
  process, main-thread and wall seconds in `box`."""
  def timed(strategy, *args):
    c, m, w = time.process_time(), time.thread_time(), time.perf_counter()
    out = loop(strategy, *args)
    box.update(loop=strategy.name, cpu=time.process_time() - c, main=time.thread_time() - m,
               wall=time.perf_counter() - w)
    return out
  return timed


def timed_run(dec, prompt, opts, box: dict):
  """Returns rounds.generate's result for `prompt`, `box` holding what its round loop cost; raises if no timed loop
  ran (a new loop in rounds.generate would otherwise leave the figures of the previous run in `box`)."""
  from ..decode import rounds
  box.clear()
  r = rounds.generate(dec, dec.draft, [prompt], opts)
  if "loop" not in box:
    raise RuntimeError("the rounds ran outside loop.run_rounds, the loop timed here")
  return r


def loop_costs(decoders: dict, prompts, opts, repeats: int) -> dict:
  """Returns per mode the loop's figures (round_cost.py's docstring names them), from `repeats` interleaved passes
  over the prompts."""
  from ..decode import rounds
  box, text = {}, {}
  acc = {m: dict(cpu=0.0, main=0.0, wall=0.0, rounds=0, calls=0, tokens=0, loops=set()) for m in decoders}
  plain = rounds.run_rounds
  rounds.run_rounds = timed_loop(plain, box)
  try:
    for rep in range(repeats + 1):  # pass 0 warms up and checks the text
      for mode, dec in decoders.items():
        for p in prompts:
          r = timed_run(dec, p, opts, box)
          if rep == 0:
            text.setdefault(mode, []).append(r.book.out[0])
            continue
          a = acc[mode]
          for key in ("cpu", "main", "wall"):
            a[key] += box[key]
          a["loops"].add(box["loop"])
          a["rounds"] += r.timing["rounds"]
          a["calls"] += r.timing["calls"]
          a["tokens"] += len(r.book.out[0]) - 1  # the first token comes from the prefill
  finally:
    rounds.run_rounds = plain
  if any(t != text["ar"] for t in text.values()):
    raise ValueError("greedy SD's text differs from AR's")
  out = {m: dict(loop="+".join(sorted(a["loops"])), tok_s=round(a["tokens"] / a["wall"], 2),
                 cpu_us_token=round(a["cpu"] / a["tokens"] * 1e6), main_us_round=round(a["main"] / a["rounds"] * 1e6),
                 tokens_per_round=round(a["tokens"] / a["rounds"], 3),
                 tokens_per_call=round(a["tokens"] / a["calls"], 3)) for m, a in acc.items()}
  for m in out:
    out[m]["x_ar_cpu"] = round(out["ar"]["cpu_us_token"] / out[m]["cpu_us_token"], 3)
  return out
