#!/usr/bin/env python
"""Issue 42's bar at real widths: a 2-layer model with Llama-3.1-70B's widths, heads and vocabulary, random bfloat16
weights written as safetensors, loaded sharded onto a 4-device target mesh with a 2-layer Llama-3.2-1B-shaped
bfloat16 draft on a fifth device; greedy SSD must emit exactly AR's tokens on that placement, and every token must
pass the teacher-forced check (ssd_jax/theory/exactness.py) against the target on one device, whose own AR tokens are
compared too.

  nice -n 5 env PYTHONPATH=. python scripts/experiments/wide_ssd_check.py --dir /tmp  # ~8.4 GB on disk, ~13 GB memory

Prints the peak host memory after loading and at the end (ru_maxrss; on CPU devices the model itself is host memory)
next to the model's float32 size, and one line per prompt. Exit code 1 when a check fails.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile

from ssd_jax.cli_util import run_main, split_cpu

PROMPTS = [[128000, 791, 6864, 315, 9822, 374], [128000, 8144, 264, 6835, 922], [128000, 16, 11, 220, 17, 11, 220, 18]]
# --tiny: the same flow at widths that run in seconds (tests/test_wide_ssd_check.py), the draft half as wide.
TINY = dict(d_model=64, ffn_dim=128, n_heads=8, n_kv_heads=4, head_dim=8, vocab_size=384)
TINY_DRAFT = dict(TINY, d_model=32, ffn_dim=64)
TINY_PROMPTS = [[1, 5, 9, 200], [7, 3], [300, 2, 2, 2, 11]]


def peak_gb() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # Linux: KiB


def rss_gb() -> float:
  """Returns the resident memory now (VmRSS), in GB."""
  with open("/proc/self/status") as f:
    return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1e6


def decode_check(target_dir: str, draft_dir: str, prompts, new_tokens: int = 8, k: int = 2, fan_out: int = 2,
                 target_devices: int = 4) -> dict:
  """Loads the target sharded over `target_devices` devices and the draft on the next one (bfloat16), decodes
  `prompts` greedily with SSD and AR there, then AR with the target on one device; returns the tokens, whether SSD
  matched AR on the same placement, the teacher-forced gaps and margins of SSD's tokens under the one-device target,
  and peak host memory (GB) after loading and at the end."""
  import jax
  import numpy as np
  from jax.sharding import Mesh

  from ssd_jax.models import checkpoints
  from ssd_jax.theory import exactness
  from ssd_jax.decode import ARDecoder, DecodeOptions, SpecOptions, SSDDecoder
  from ssd_jax.sharding import make_placement

  pl = make_placement(target_devices, 1)
  tcfg, tparams, _ = checkpoints.load_model(target_dir, "bfloat16", mesh=pl.target_mesh)
  dcfg, dparams, _ = checkpoints.load_model(draft_dir, "bfloat16", mesh=Mesh(np.asarray([pl.draft_device]), ("tp",)))
  jax.block_until_ready((tparams, dparams))
  phases = {"loaded": (rss_gb(), peak_gb())}
  out = {"load_peak_gb": peak_gb(), "phases": phases, "target_bytes": sum(x.nbytes for x in jax.tree.leaves(tparams)),
         "dtypes": sorted({str(x.dtype) for x in jax.tree.leaves((tparams, dparams))})}
  opts = DecodeOptions(max_new_tokens=new_tokens, ignore_eos=True)
  spec = SpecOptions(k=k, fan_out=fan_out, placement="devices")
  ssd_res = SSDDecoder(tcfg, tparams, dcfg, dparams, spec, placement=pl).generate(prompts, opts)
  ssd = [r.token_ids for r in ssd_res]
  out["ssd_cache_hit_rate"] = float(np.mean([r.stats.extra.get("cache_hit_rate", 0.0) for r in ssd_res]))
  phases["ssd"] = (rss_gb(), peak_gb())
  ar = [r.token_ids for r in ARDecoder(tcfg, tparams, placement=pl).generate(prompts, opts)]
  phases["ar"] = (rss_gb(), peak_gb())
  del tparams, dparams  # the decoders above are gone too: free the mesh copy before the one-device one
  phases["freed"] = (rss_gb(), peak_gb())
  one = make_placement(1, 0)
  _, params1, _ = checkpoints.load_model(target_dir, "bfloat16", mesh=one.target_mesh)
  phases["loaded one device"] = (rss_gb(), peak_gb())
  ar1 = [r.token_ids for r in ARDecoder(tcfg, params1, placement=one).generate(prompts, opts)]
  phases["ar one device"] = (rss_gb(), peak_gb())
  gaps = [exactness.teacher_forced_gaps(params1, tcfg, p, t) for p, t in zip(prompts, ssd)]
  out.update(ssd=ssd, ar=ar, ar_one_device=ar1, ssd_equals_ar=ssd == ar,
             gaps=[g.tolist() for g, _ in gaps], margins=[m.tolist() for _, m in gaps],
             within_margin=all(bool((g <= m).all()) for g, m in gaps), peak_gb=peak_gb())
  return out


def report(out: dict, n_params: int) -> bool:
  """Prints the result; returns True when every check passed."""
  print(f"target: {n_params / 1e9:.3f}B weights, {out['target_bytes'] / 1e9:.2f} GB on the mesh "
        f"({4 * n_params / 1e9:.2f} GB in float32); params {', '.join(out['dtypes'])}")
  print(f"peak host memory: {out['load_peak_gb']:.2f} GB after loading target and draft, {out['peak_gb']:.2f} GB "
        f"at the end (ru_maxrss; CPU devices hold the model in host memory)")
  print("by phase, resident now / peak so far (GB): " + "; ".join(f"{k} {a:.2f} / {b:.2f}"
                                                                  for k, (a, b) in out["phases"].items()))
  for i, (s, a, a1, g, m) in enumerate(zip(out["ssd"], out["ar"], out["ar_one_device"], out["gaps"], out["margins"])):
    print(f"prompt {i}: ssd {s}\n          ar {a} ({'same' if s == a else 'DIFFERENT'})\n   ar 1 device {a1} "
          f"({'same' if s == a1 else 'different'}); largest teacher-forced gap {max(g):.4g} "
          f"(smallest margin {min(m):.4g})")
  ok = out["ssd_equals_ar"] and out["within_margin"]
  print(f"SSD == AR on the 4+1 placement: {out['ssd_equals_ar']}; every SSD token within the near-tie margin of the "
        f"one-device target's argmax: {out['within_margin']}; SSD cache hit rate {out['ssd_cache_hit_rate']:.2f}")
  return ok


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--target", default="llama-3.1-70b")
  ap.add_argument("--draft", default="llama-3.2-1b")
  ap.add_argument("--layers", type=int, default=2)
  ap.add_argument("--new-tokens", type=int, default=8)
  ap.add_argument("--dir", help="where to write the models (default: a temporary directory; removed after)")
  ap.add_argument("--tiny", action="store_true", help="tiny widths (d_model 64, a vocabulary of 384): the flow in "
                  "seconds (tests)")
  ap.add_argument("--json-out")
  args = ap.parse_args(argv)
  split_cpu(5)
  from ssd_jax.models.named_configs import named_config, write_random_hf

  with tempfile.TemporaryDirectory(dir=args.dir) as d:
    tdir, ddir = os.path.join(d, "target"), os.path.join(d, "draft")
    os.makedirs(tdir)
    os.makedirs(ddir)
    n = write_random_hf(tdir, named_config(args.target, n_layers=args.layers, **(TINY if args.tiny else {})), seed=0)
    write_random_hf(ddir, named_config(args.draft, n_layers=args.layers, **(TINY_DRAFT if args.tiny else {})), seed=1)
    print(f"wrote {args.target} and {args.draft} at {args.layers} layers (random bfloat16) under {d}", flush=True)
    out = decode_check(tdir, ddir, TINY_PROMPTS if args.tiny else PROMPTS, args.new_tokens)
  ok = report(out, n)
  if args.json_out:
    with open(args.json_out, "w") as f:
      json.dump(dict(out, params=n), f, indent=1)
  return 0 if ok else 1


if __name__ == "__main__":
  run_main(main)
