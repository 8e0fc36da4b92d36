"""Peak host memory of loading a Hugging Face safetensors model: sharded (tensor by tensor onto the mesh, in its own
dtype) against the whole-model reader widened to float32 (how every load worked before).

  PYTHONPATH=. python scripts/experiments/load_memory.py --model llama-3.2-1b --layers 2 --devices 4

Writes a random bfloat16 model with the named model's real widths, heads and vocabulary (ssd_jax.models.named_configs)
at --layers depth into --dir, then loads it in a fresh process per method (ru_maxrss is a process's peak) over
--devices forced CPU devices, and prints a markdown table. On a CPU, device memory is host memory: the sharded
load's peak is the model itself (bytes on the devices) plus what loading adds, which is the figure to read.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile


CHILD = r"""
import os, resource, sys, json
import jax, numpy as np
from jax.sharding import Mesh
path, method = sys.argv[1], sys.argv[2]
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
mesh = Mesh(np.asarray(jax.devices()[:int(sys.argv[3])]), ("tp",))
if method == "sharded":
  from ssd_jax.models.sharded_load import load_hf_sharded
  cfg, params = load_hf_sharded(path, mesh, dtype="bfloat16")
else:  # the loader before issue 42: the whole model read, widened to float32 on the host, then placed
  from ssd_jax.models.model_files import read_hf_safetensors
  from ssd_jax.sharding import Placement
  cfg, params = read_hf_safetensors(path, progress=False)
  params = jax.tree.map(lambda x: np.asarray(x, np.float32), params)
  params = Placement(mesh, jax.devices()[0]).shard_target(params, cfg)
jax.block_until_ready(params)
dev = sum(x.nbytes for x in jax.tree.leaves(params))
print(json.dumps({"method": method, "peak_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  "base_kb": base, "device_bytes": dev}))
"""


def write_model(directory: str, name: str, layers: int) -> tuple[int, int]:
  """Writes config.json and model.safetensors (bfloat16, random: named_configs.write_random_hf) tensor by tensor;
  returns (params, file bytes)."""
  from ssd_jax.models.named_configs import named_config, write_random_hf

  n = write_random_hf(directory, named_config(name, n_layers=layers))
  return n, os.path.getsize(os.path.join(directory, "model.safetensors"))


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--model", default="llama-3.2-1b", help="a name from ssd_jax.models.named_configs (Llama family)")
  ap.add_argument("--layers", type=int, default=2)
  ap.add_argument("--devices", type=int, default=4)
  ap.add_argument("--methods", default="sharded,whole-float32")
  ap.add_argument("--dir", help="where to write the model (default: a temporary directory, removed after)")
  args = ap.parse_args()
  with tempfile.TemporaryDirectory(dir=args.dir) as d:
    n, size = write_model(d, args.model, args.layers)
    print(f"{args.model} at {args.layers} layers: {n / 1e9:.3f}B params, {size / 1e9:.2f} GB bfloat16 on disk, "
          f"{4 * n / 1e9:.2f} GB in float32; {args.devices} forced CPU devices")
    print("| load | peak RSS GB | RSS after imports GB | on devices GB |\n|---|---|---|---|")
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={args.devices}")
    for m in args.methods.split(","):
      out = subprocess.run([sys.executable, "-c", CHILD, d, m.split("-")[0], str(args.devices)], env=env,
                           capture_output=True, text=True)
      if out.returncode:
        print(f"| {m} | failed: {out.stderr.strip().splitlines()[-1]} | | |")
        continue
      r = json.loads(out.stdout.strip().splitlines()[-1])
      print(f"| {m} | {r['peak_kb'] / 1e6:.2f} | {r['base_kb'] / 1e6:.2f} | {r['device_bytes'] / 1e9:.2f} |")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
