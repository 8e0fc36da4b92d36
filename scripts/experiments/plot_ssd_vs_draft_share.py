#!/usr/bin/env python
"""Draws docs/img/ssd_vs_draft_share.png: SSD best over SD best against the draft's share of an SD round, for the
four shipped drafts, beside the timing model's curves (issue 55 item 5; docs/benchmarks.md, "SSD's rounds in one
program").

The points are the recorded figures of docs/benchmarks.md (2-core AMD EPYC VM, one core per side, fan-out 6): the
share from the run with a call a round, SSD best / SD best from the one-program run. The curves are Theorem 7 with
as many tokens on a hit as on a miss: every round a hit (SSD's round is the verify alone, 1 / (1 - s) of SD's
speed), and a hit rate p where each miss also waits one draft chain (1 / (1 - p s)).

  python scripts/experiments/plot_ssd_vs_draft_share.py [--out PATH] [--hit-rate 0.65]
"""
import argparse
import os

import numpy as np

POINTS = [("standalone Q8_0", 0.12, 0.93), ("standalone float32", 0.17, 0.88), ("EAGLE-3 Q8_0", 0.14, 1.10),
          ("EAGLE-3 float32", 0.23, 1.03)]


def main() -> int:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "..", "docs", "img",
                                               "ssd_vs_draft_share.png"))
  p.add_argument("--hit-rate", type=float, default=0.65)
  args = p.parse_args()
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  s = np.linspace(0.0, 0.35, 100)
  fig, ax = plt.subplots(figsize=(6.4, 4.2))
  ax.plot(s, 1 / (1 - s), "-", label="model: every round a hit (SSD = verify alone)")
  ax.plot(s, 1 / (1 - args.hit_rate * s), "--",
          label=f"model: hit rate {args.hit_rate:g}, a miss waits one draft chain")
  ax.axhline(1.0, color="grey", lw=0.8)
  ax.set_ylim(0.83, 1.56)
  for name, x, y in POINTS:
    ax.plot(x, y, "o", color="C3")
    below = name == "standalone float32"
    ax.annotate(name, (x, y), textcoords="offset points", xytext=(5, -12 if below else 5), fontsize=8)
  ax.set(xlabel="draft's share of an SD round (K=1)", ylabel="SSD best / SD best (tok/s)",
         title="SSD against SD by the draft's cost, one core per side")
  ax.legend(fontsize=8, loc="upper left")
  fig.tight_layout()
  fig.savefig(args.out, dpi=110)
  print(f"wrote {os.path.normpath(args.out)}")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
