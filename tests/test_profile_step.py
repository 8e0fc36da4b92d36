"""scripts/experiments/profile_step.py: the AR step's per-thunk profile, summed by part, on the tiny target (a
subprocess: XLA's trace flag must be set before JAX starts)."""
import re

import pytest
from commands import run_script


def test_profile_step_attributes_the_step_to_its_parts():
  pytest.importorskip("jaxlib._profile_data")
  from ssd_jax.kernels import rows_matmul
  if not rows_matmul.available():
    pytest.skip("no C++ compiler for the CPU kernels")
  res = run_script("profile_step.py", "--tiny", "--steps", "6", "--start", "3", "--cache", "64")
  assert res.returncode == 0, res.stderr[-2000:]
  row = re.compile(r"^\| ([^|]+?) \|\s*(\d+)\s*\|\s*(\d*)\s*\|\s*([\d.]+)%", re.M)
  rows = {m.group(1): m.groups()[1:] for m in row.finditer(res.stdout)}
  for part in ("matrix qkv (matmul)", "matrix gate/up (matmul)", "matrix down (matmul)", "matrix o (matmul)",
               "head (matmul)", "attention", "RMSNorm"):
    assert part in rows, (part, res.stdout)
  # Two layers: q, k, v and gate, up per layer; the parts cover the program's time. Thunks on XLA's pool threads may
  # overlap a little: a kernel's thunk waits for its parts, which run on the pool beside other thunks (the suite's
  # load gave 101.2% and, with a second test worker beside it, 110.2%), so the sum may pass the program's time by some
  # percent, never by half the largest part's worth (a part counted twice would).
  assert rows["matrix qkv (matmul)"][1] == "6" and rows["matrix gate/up (matmul)"][1] == "4", res.stdout
  largest = max(float(share) for part, (_, _, share) in rows.items() if part not in ("thunks, summed",)
                and not part.startswith("the program"))
  assert 50.0 < float(rows["thunks, summed"][2]) <= 100.0 + largest / 2, res.stdout
