"""SSD's draft side in its own process on its own CPU cores: the CPU analogue of the paper's separate draft GPU.

JAX CPU devices in one process share one thread pool, so drafting on "device 1" takes cores from the target's verify
(an SSD round then costs more than an SD round). Here the draft side (tree_draft.TreeDraft, the same object the
`devices` placement calls directly) runs in a child process pinned to its own cores, and the parent process (the
target) is pinned to the others for the duration of a `generate` call. `DraftProcess` sends the target's calls over
a socket pair wrapped in a `multiprocessing` Connection (Python's standard, well-kept pickling channel; a
two-process `jax.distributed` run would need both sides to enter the same collective program every round, which
does not fit two different programs running side by side). Per round only what the algorithm needs crosses:

  draft -> target: the speculation cache, unasked, as soon as the child's tree is built (while the target
                   verifies): every branch's guess and K tokens, and at temperature > 0 their distributions over the
                   draft's head vocabulary ([B, N, K, V_head] float32); the target looks its outcome up in it and,
                   on a hit, dispatches the next verify before anything else;
  target -> draft: the Outcome (accepted length k and bonus token t* per row, the verify time for the automatic
                   backup choice, and for an EAGLE draft the target's features of the K+1 verified positions,
                   [B, K+1, n_feat * d] float32);
  draft -> target: the reply: HIT (the child found the same hits and drafts on from the cached speculation), or on
                   a miss the backup's Speculation (K tokens a row, and at temperature > 0 their distributions).

So per verify the target reads one cache and one reply, and on a hit waits for neither beyond the cache's arrival.
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import traceback

import jax
from multiprocessing.connection import Connection

from ..kernels.platform import device_platform
from .base import Programs
from .draft import make_draft_model
from .speculator import DraftLost, Speculation
from .tree_draft import TreeDraft


SLOW_REPLY_S = 600.0


def set_process_affinity(cores) -> None:
  """Pins every thread of this process (XLA's and OpenMP's pools included) to `cores`; new threads inherit it."""
  cores = set(int(c) for c in cores)
  for tid in os.listdir("/proc/self/task"):
    try:
      os.sched_setaffinity(int(tid), cores)
    except OSError:
      pass  # a thread that just exited


def split_cores(target_cores=None, draft_cores=None) -> tuple[list[int], list[int]]:
  """Returns (target cores, draft cores): by default the usable cores split in two halves, the target first."""
  avail = sorted(os.sched_getaffinity(0))
  if target_cores is None and draft_cores is None:
    if len(avail) < 2:
      raise ValueError(f"the split placement needs at least 2 usable CPU cores, this process has {len(avail)}")
    half = len(avail) // 2
    return avail[:half], avail[half:]
  if target_cores is None or draft_cores is None:
    raise ValueError("give both target_cores and draft_cores, or neither")
  t, d = sorted(set(target_cores)), sorted(set(draft_cores))
  if not t or not d or set(t) & set(d):
    raise ValueError(f"target cores {t} and draft cores {d} must be non-empty and disjoint")
  bad = [c for c in t + d if c not in avail]
  if bad:
    raise ValueError(f"cores {bad} are not usable by this process (usable: {avail})")
  return t, d


class DraftProcess:
  """A TreeDraft in a child process pinned to `draft_cores`: the same calls as speculator.InProcessDraft, over a
  pipe; the caller (the target) is pinned to `target_cores` during each `session`."""

  remote = True
  sync = False  # its TreeDraft drafts ahead while the target verifies

  def __init__(self, init: dict, target_cores=None, draft_cores=None, timeout: float = 60.0):
    """init: TreeDraft's settings (cfg, params as host arrays, spec, attn_impl, calibration, record_ranks);
    timeout: seconds the target waits for any reply before it gives the child up (DraftLost)."""
    self.timeout, self._slow = timeout, False
    self.target_cores, self.draft_cores = split_cores(target_cores, draft_cores)
    self._init = init
    self._proc = self._conn = None

  @contextlib.contextmanager
  def session(self):
    """Starts the draft process if needed and pins this process to the target's cores until the block ends; a block
    that raises kills the draft process (the next session starts a fresh one)."""
    self._start()
    saved = os.sched_getaffinity(0)
    set_process_affinity(self.target_cores)
    try:
      yield
    except BaseException:  # a run that failed or was interrupted mid-round: the child's state and the pipe are void
      self.abort()
      raise
    finally:
      set_process_affinity(saved)

  def _start(self):
    if self._proc is not None and self._proc.poll() is None:
      return
    # A fresh interpreter (not multiprocessing's spawn, which re-imports the caller's main module) that reads its
    # JAX settings from the environment: one CPU device (XLA sizes its thread pool, which the kernels share, by the
    # cores the child pins itself to); OMP_NUM_THREADS holds any OpenMP library (a BLAS) to those cores too.
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "force_host_platform_device_count" not in f]
    env = dict(os.environ, XLA_FLAGS=" ".join(flags + ["--xla_force_host_platform_device_count=1"]),
               OMP_NUM_THREADS=str(len(self.draft_cores)), JAX_PLATFORMS="cpu")
    ours, theirs = socket.socketpair()
    code = "import sys; from ssd_jax.decode.draft_process import worker_entry; worker_entry(sys.argv[1], sys.argv[2])"
    self._proc = subprocess.Popen([sys.executable, "-c", code, str(theirs.fileno()),
                                   ",".join(map(str, self.draft_cores))], pass_fds=(theirs.fileno(),), env=env)
    theirs.close()
    self._conn = Connection(ours.detach())
    self.send("init", self._init)
    self.receive()

  def send(self, call: str, arg=None) -> None:
    self._slow = call in ("init", "prepare")  # its reply waits for the child's start or compiles
    try:
      self._conn.send((call, arg))
    except OSError:  # a broken pipe: the child is gone
      raise DraftLost(self._gone()) from None

  def receive(self, timeout: float | None = None):
    """Returns the child's next reply; DraftLost when it exited, failed, or sent nothing within `timeout` seconds
    (default: self.timeout; the replies to init and prepare, which wait for the child's start and compiles, at least
    SLOW_REPLY_S)."""
    if timeout is None:
      timeout = max(self.timeout, SLOW_REPLY_S) if self._slow else self.timeout
    try:
      if not self._conn.poll(timeout):
        raise DraftLost(f"the draft process did not answer within {timeout:g} s")
      kind, payload = self._conn.recv()
    except (EOFError, OSError):
      raise DraftLost(self._gone()) from None
    if kind == "error":
      last = payload.strip().splitlines()[-1] if payload.strip() else "?"
      raise DraftLost(f"the draft process failed ({last})\n{payload}")
    return payload

  def _gone(self) -> str:
    code = self._proc.poll() if self._proc is not None else None
    return "the draft process exited" + (f" (exit code {code})" if code is not None else "")

  def draft_ahead(self) -> None:
    pass  # the child dispatches its tree as soon as it has replied

  def cache(self):
    """Returns the speculation cache the child sent once its tree was built (speculator.SpecCache)."""
    return self.receive()

  def abort(self):
    """Kills the draft process at once (a run that failed mid-round: its state is void); the next session starts a
    fresh one."""
    if self._proc is not None:
      self._proc.kill()
      self._proc.wait()
      self._conn.close()
      self._proc = self._conn = None

  def close(self):
    """Stops the draft process."""
    if self._proc is not None:
      try:
        self.send("stop")
      except OSError:
        pass
      try:
        self._proc.wait(timeout=10)
      except subprocess.TimeoutExpired:
        self._proc.kill()
      self._conn.close()
      self._proc = self._conn = None

  def __del__(self):
    try:
      self.close()
    except Exception:
      pass


def worker_entry(fd: str, cores: str):
  """The draft process: pins itself, builds its TreeDraft on 'init', then answers every call until 'stop' or until
  the target's end of the pipe closes. Ctrl-C at a terminal reaches the whole process group: the target decides
  what becomes of this process (it stops or kills it), so SIGINT is ignored here."""
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  set_process_affinity([int(c) for c in cores.split(",")])
  conn = Connection(int(fd))
  side = None
  while True:
    try:
      call, arg = conn.recv()
    except (EOFError, OSError):
      return
    if call == "stop":
      return
    try:
      if call == "init":
        side = _tree_draft(**arg)
        reply = None
      else:
        reply = getattr(side, call)(arg)
      conn.send(("ok", reply.to_host() if isinstance(reply, Speculation) else reply))
      # After the reply the target verifies while this drafts; the cache goes to the target as soon as it is
      # built, unasked, so that the target finds the next speculation there the moment its verify ends.
      if side is not None and side.draft_ahead():
        conn.send(("ok", side.cache()))
    except OSError:  # the pipe is closed: the target is gone or gave this process up
      return
    except Exception:
      try:
        conn.send(("error", traceback.format_exc()))
      except OSError:
        return


def _tree_draft(cfg, params, spec, attn_impl, calibration, record_ranks) -> TreeDraft:
  dev = jax.devices()[0]
  model = make_draft_model(cfg, params, attn_impl, lambda x: jax.device_put(x, dev), Programs(),
                           platform=device_platform(dev))
  return TreeDraft(model, spec, calibration, record_ranks, host_cache=True)
