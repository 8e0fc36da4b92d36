"""One process of the two-process jax.distributed test (tests/test_distributed.py): decodes a tiny random model.

  python tests/distributed_worker.py OUT.json --coordinator localhost:PORT --num-processes 2 --process-id I \
      --target-devices 4 [--modes ar,sd,ssd]

Every process builds the same model from the same seed (as the test does), decodes the test prompts greedily with the
target sharded over the global mesh and writes its tokens to OUT.json with `.{process id}` before the suffix.
"""
from __future__ import annotations

import argparse
import json
import os

from ssd_jax import distributed  # no JAX import yet: the CPU is split first
from ssd_jax.cli_util import run_main, split_cpu

MAX_NEW = 12


def build_models():
  """Returns (cfg, target params, draft params): the tiny pair the distributed test compares against.

  Drawn with numpy (identical in every process, and much faster than eager JAX ops on a busy CPU); the draft is the
  target perturbed, so that it agrees often but not always.
  """
  import jax
  import numpy as np

  from ssd_jax.models import model
  from ssd_jax.models.config import tiny_config

  cfg = tiny_config(vocab_size=64, n_heads=4, n_kv_heads=4, n_layers=1)
  shapes = jax.eval_shape(lambda: model.init_params(jax.random.key(0), cfg))
  rng = np.random.default_rng(7)
  draw = lambda s: (np.ones(s.shape, np.float32) if s.ndim == 1 else rng.normal(0, 0.3, s.shape).astype(np.float32))
  tp = jax.tree.map(draw, shapes)
  dp = jax.tree.map(lambda x: (x + rng.normal(0, 0.06, x.shape)).astype(np.float32), tp)
  return cfg, tp, dp


PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11], [12, 13, 14, 15, 16]]


def make_decoder(mode: str, cfg, tp, dp, placement):
  """Returns the decoder for `mode` (ar, sd: K=3, ssd: K=3, F=2) with this placement (also used by test_sharding)."""
  from ssd_jax.decode import ARDecoder, SDDecoder, SpecOptions, SSDDecoder

  if mode == "ar":
    return ARDecoder(cfg, tp, placement=placement)
  if mode == "sd":
    return SDDecoder(cfg, tp, cfg, dp, SpecOptions(k=3), placement=placement)
  return SSDDecoder(cfg, tp, cfg, dp, SpecOptions(k=3, fan_out=2), placement=placement)


def decode(mode: str, cfg, tp, dp, placement) -> list[list[int]]:
  """Returns the greedy tokens of PROMPTS under `mode` (ar, sd, ssd) with this placement."""
  from ssd_jax.decode import DecodeOptions

  opts = DecodeOptions(max_new_tokens=MAX_NEW, ignore_eos=True)
  return [r.token_ids for r in make_decoder(mode, cfg, tp, dp, placement).generate(PROMPTS, opts)]


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("out")
  p.add_argument("--target-devices", type=int, default=2)
  p.add_argument("--modes", default="ar,sd,ssd")
  distributed.add_arguments(p)
  args = p.parse_args(argv)
  _, nproc, _ = distributed.settings(args.coordinator, args.num_processes, args.process_id)
  split_cpu(distributed.local_devices_needed(args.target_devices, 1, nproc))
  distributed.initialize(args.coordinator, args.num_processes, args.process_id)
  import jax

  from ssd_jax.sharding import make_placement

  placement = make_placement(args.target_devices, 1)
  cfg, tp, dp = build_models()
  res = {m: decode(m, cfg, tp, dp, placement) for m in args.modes.split(",")}
  res["devices"] = {"target": sorted(d.id for d in placement.target_mesh.devices.flat),
                    "draft": placement.draft_device.id, "process": jax.process_index(),
                    "processes": jax.process_count()}
  stem, ext = os.path.splitext(args.out)
  with open(f"{stem}.{jax.process_index()}{ext}", "w") as f:
    json.dump(res, f)
  return 0


if __name__ == "__main__":
  run_main(main)
