"""One thread pool (issue 56): the C++ kernels run on XLA's intra-op pool (kernels/cpu/parallel.h), nothing of
ours spins once a call returns, and SSD's split placement keeps every thread of each side on its own cores (read from
the kernel's view of each thread, /proc, not from the lists the code echoes back)."""
import os
import resource
import time

import pytest

from ssd_jax import api
from ssd_jax.decode import DecodeOptions, SpecOptions
from ssd_jax.kernels import cpu_ffi

TWO = len(os.sched_getaffinity(0)) >= 2


def _threads_cores(pid: int) -> dict[int, set[int]]:
  """Returns {thread id: the cores it may run on} for every thread of process `pid`, as the kernel holds them."""
  out = {}
  for tid in os.listdir(f"/proc/{pid}/task"):
    try:
      with open(f"/proc/{pid}/task/{tid}/status") as f:
        line = next(x for x in f if x.startswith("Cpus_allowed_list:"))
    except (OSError, StopIteration):
      continue  # a thread that just exited
    cores = set()
    for part in line.split(":", 1)[1].strip().split(","):
      lo, _, hi = part.partition("-")
      cores.update(range(int(lo), int(hi or lo) + 1))
    out[int(tid)] = cores
  return out


def _cpu_seconds() -> float:
  r = resource.getrusage(resource.RUSAGE_SELF)
  return r.ru_utime + r.ru_stime


def test_the_kernels_build_without_openmp():
  """The kernels' only threads are XLA's: their sources use parallel.h and neither OpenMP nor its build flag."""
  for name in ("rows_matmul", "masked_attention"):
    src = open(os.path.join(cpu_ffi._DIR, name + ".cc")).read()
    assert "<omp.h>" not in src and "#pragma omp" not in src and '#include "parallel.h"' in src
  assert "-fopenmp" not in cpu_ffi.BUILD_FLAGS and "-pthread" in cpu_ffi.BUILD_FLAGS


def test_nothing_spins_after_generate_returns():
  """Once generate returns, the process's CPU time stands still over a second of sleep (a spinning worker would add
  about a second); the kernels ran (the tiny pipeline's attention and products are the C++ kernels on a CPU)."""
  pipe = api.load_tiny()
  assert pipe.attn_impl == "auto"
  for mode in ("ar", "sd"):
    pipe.generate("Hello there", mode=mode, max_new_tokens=16, ignore_eos=True)
  time.sleep(0.2)  # let the pool settle
  before, t0 = _cpu_seconds(), time.perf_counter()
  time.sleep(1.0)
  used, wall = _cpu_seconds() - before, time.perf_counter() - t0
  assert used < 0.1 * wall, f"{used:.3f} s of CPU in {wall:.2f} s of sleep"


@pytest.mark.skipif(not TWO, reason="needs two CPU cores")
def test_split_placement_keeps_each_sides_threads_on_its_cores():
  """While SSD runs with the draft in its own process, every thread of this process (XLA's pool included) may run
  only on the target's cores, and every thread of the draft process only on the draft's: read from /proc in the
  middle of the run (the stream callback), for both processes."""
  pipe = api.load_tiny()
  dec = pipe.decoder("ssd", SpecOptions(k=2, fan_out=2, placement="processes"))
  seen = []

  def during(row, ids):
    if not seen:
      seen.append((_threads_cores(os.getpid()), _threads_cores(dec.draft._proc.pid)))

  try:
    ids = pipe.encode_prompt("Tell me about the sea.")
    dec.generate([ids], DecodeOptions(max_new_tokens=24, ignore_eos=True), stream=during)
    target, draft = seen[0]
    t_cores, d_cores = set(dec.draft.target_cores), set(dec.draft.draft_cores)
    assert t_cores and d_cores and not t_cores & d_cores
    assert len(target) > 2 and len(draft) > 2  # XLA's pools are there to check
    assert all(c <= t_cores for c in target.values()), target
    assert all(c <= d_cores for c in draft.values()), draft
    # After the run this process may use every core again.
    assert all(c == set(os.sched_getaffinity(0)) for c in _threads_cores(os.getpid()).values())
  finally:
    dec.close()


def test_a_machine_measured_faster_on_one_core_runs_the_scripts_on_one(tmp_path):
  """Where `bench.py --calibrate` measured AR faster on one core than on all (a VM whose threads wake slowly), the
  scripts pin every thread of their process to the first core and say so in one line; measured faster on all, or
  not measured, they keep every core (read from /proc, not from what the code echoes)."""
  import subprocess
  import sys

  from ssd_jax import defaults
  from ssd_jax.decode import auto_k
  assert defaults.cores_to_use({"1": 120.0, "all": 80.0}, [3, 1]) == [1]
  assert defaults.cores_to_use({"1": 80.0, "all": 120.0}, [0, 1]) is None
  assert defaults.cores_to_use({"1": 120.0, "all": 80.0}, [0]) is None and defaults.cores_to_use({}, [0, 1]) is None
  cores = sorted(os.sched_getaffinity(0))
  if len(cores) < 2:
    pytest.skip("needs two usable cores")
  code = ("import os, jax.numpy as jnp; from ssd_jax.cli_util import follow_measured_cores; "
          "kept = follow_measured_cores(); (jnp.ones(64) * 2).block_until_ready(); "
          "print(kept, sorted({tuple(sorted(os.sched_getaffinity(int(t)))) for t in os.listdir('/proc/self/task')}))")
  env = dict(os.environ, SSD_JAX_STEP_COSTS=str(tmp_path))

  def run():
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout.strip(), r.stderr
  assert run() == (f"None [{tuple(cores)}]", "")  # not measured: every core
  path = subprocess.run([sys.executable, "-c", "from ssd_jax.decode import auto_k; print(auto_k.cores_path())"],
                        capture_output=True, text=True, env=env, check=True).stdout.strip()
  auto_k.save_modes(path, {"1": 90.0, "all": 120.0})
  assert run() == (f"None [{tuple(cores)}]", "")  # measured faster on all
  auto_k.save_modes(path, {"1": 120.0, "all": 90.0})
  out, err = run()
  assert out == f"[{cores[0]}] [({cores[0]},)]"  # every thread on the first core
  assert err.count("\n") == 1 and f"running on core {cores[0]} of {len(cores)}" in err
