"""jax.distributed: two processes on localhost decode like one; flags and environment; clear errors."""
import os
import socket
import subprocess
import sys
import time

import pytest

from ssd_jax import distributed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "distributed_worker.py")


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _run_processes(out: str, n: int, target_devices: int, modes: str, timeout: float = 240) -> list[dict]:
  """Runs the worker as n processes joined by jax.distributed; returns each process's results."""
  import json

  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # each worker splits its CPU itself
  env.update(JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  port = _free_port()
  procs = [subprocess.Popen([sys.executable, WORKER, out, "--coordinator", f"localhost:{port}", "--num-processes",
                             str(n), "--process-id", str(i), "--target-devices", str(target_devices),
                             "--modes", modes], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for i in range(n)]
  end = time.monotonic() + timeout
  try:
    # A process that fails leaves the others waiting on it forever: stop as soon as one exits non-zero.
    while any(p.poll() is None for p in procs) and time.monotonic() < end:
      if any(p.returncode not in (None, 0) for p in procs):
        break
      time.sleep(0.2)
  finally:
    timed_out = [p.poll() is None for p in procs]
    for p in procs:
      if p.poll() is None:
        p.kill()
    logs = [p.communicate()[1] for p in procs]
  for i, p in enumerate(procs):
    why = f"timed out after {timeout:.0f} s" if timed_out[i] else f"exited with {p.returncode}"
    assert p.returncode == 0, f"process {i} {why}:\n{logs[i][-3000:]}"
  stem, ext = os.path.splitext(out)
  res = []
  for i in range(n):
    with open(f"{stem}.{i}{ext}") as f:
      res.append(json.load(f))
  return res


def _single_process(modes):
  """Returns {mode: tokens} of the same model on this process's first device (the draft on the next)."""
  from ssd_jax.sharding import make_placement

  import distributed_worker as w

  cfg, tp, dp = w.build_models()
  return {m: w.decode(m, cfg, tp, dp, make_placement(1, 1)) for m in modes}


@pytest.mark.parametrize("modes", ["ar", pytest.param("sd,ssd", marks=pytest.mark.slow)])
def test_two_processes_decode_like_one(tmp_path, modes):
  # The target over 4 devices, 2 from each process (its collectives cross processes through gloo); each process
  # runs the draft on its third device. About 40 s for AR and 2 min for SD + SSD on 2 busy cores (compilation).
  got = _run_processes(str(tmp_path / "out.json"), 2, 4, modes, timeout=300 if modes == "ar" else 900)
  want = _single_process(modes.split(","))
  for r in got:
    assert r["devices"]["processes"] == 2 and len(r["devices"]["target"]) == 4
    assert r["devices"]["draft"] not in r["devices"]["target"]
    for m in want:
      assert r[m] == want[m], m
  assert got[0]["devices"]["target"] == got[1]["devices"]["target"]
  assert got[0]["devices"]["draft"] != got[1]["devices"]["draft"]


def test_settings_from_flags_then_environment(monkeypatch):
  for k in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
    monkeypatch.delenv(k, raising=False)
  assert distributed.settings() == (None, 1, None)
  assert distributed.initialize() == 1  # nothing asked: a single process, jax.distributed untouched
  assert distributed.settings("h:1", 2, 1) == ("h:1", 2, 1)
  monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "h:2")
  monkeypatch.setenv("JAX_NUM_PROCESSES", "4")
  monkeypatch.setenv("JAX_PROCESS_ID", "3")
  assert distributed.settings() == ("h:2", 4, 3)
  assert distributed.settings(process_id=0) == ("h:2", 4, 0)  # a flag wins over the environment


@pytest.mark.parametrize("args, match", [((None, 2, 0), "need --coordinator"),
                                         (("h:1", None, 0), "needs --num-processes"),
                                         (("h:1", 2, 2), "must be in 0..1")])
def test_incomplete_or_wrong_settings_are_clear_errors(monkeypatch, args, match):
  for k in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
    monkeypatch.delenv(k, raising=False)
  with pytest.raises(ValueError, match=match):
    distributed.settings(*args)


def test_devices_per_process():
  assert distributed.local_devices_needed(4, 1, 2) == 3
  assert distributed.local_devices_needed(4, 1, 1) == 5
  with pytest.raises(ValueError, match="multiple of --num-processes"):
    distributed.local_devices_needed(3, 1, 2)


def test_decode_script_reports_bad_process_flags_in_one_line():
  env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COORDINATOR")}
  r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "decode.py"), "--num-processes", "2",
                      "--process-id", "1"], capture_output=True, text=True, env=env, timeout=120)
  assert r.returncode == 2
  assert r.stderr.strip().splitlines() == ["decode.py: error: --num-processes / --process-id need --coordinator "
                                           "HOST:PORT (the address of process 0)"]
