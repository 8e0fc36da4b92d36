"""Shared plumbing of the command-line scripts: one clear line and a non-zero exit on bad input."""
from __future__ import annotations

import os
import signal
import sys
import threading

from . import settings


def split_cpu(n: int) -> None:
  """On a machine with only a CPU, splits it into n JAX devices (target mesh + the draft's own device).

  Must run before JAX is imported (this module imports no JAX); does nothing on GPU/TPU platforms or when the user
  already set the flag.
  """
  if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={n}").strip()


def _intel_cpu() -> bool:
  try:
    with open("/proc/cpuinfo") as f:
      return any(line.startswith("vendor_id") and "GenuineIntel" in line for line in f)
  except OSError:
    return False


def compile_cache_reloads() -> bool:
  """Whether XLA's persistent compilation cache is used on this host: not where asked off
  (SSD_JAX_NO_COMPILE_CACHE=1), and not on Intel CPUs unless asked (SSD_JAX_COMPILE_CACHE=1): XLA:CPU rejects its
  own cached programs on many Intel hosts (LLVM tuning flags taken for missing CPU features, openxla/xla#44565), so
  every load there fails with an error line and compiles again."""
  if os.environ.get("SSD_JAX_NO_COMPILE_CACHE"):
    return False
  return bool(os.environ.get("SSD_JAX_COMPILE_CACHE")) or not _intel_cpu()


def compile_cache() -> str | None:
  """Keeps XLA's compiled programs on disk (JAX's persistent compilation cache) for the scripts, so a second run of
  the same command loads them instead of compiling again; returns the directory, or None when off.

  Under SSD_JAX_CACHE (default ~/.cache/ssd-jax)/xla. A cache the user configured (JAX_COMPILATION_CACHE_DIR) is
  left as it is; SSD_JAX_NO_COMPILE_CACHE=1 turns it off. Off by default on Intel CPUs, whose cached XLA:CPU
  programs current XLA rejects on reload (SSD_JAX_COMPILE_CACHE=1 turns it on there). Set through the environment,
  so child processes (the split SSD placement's draft process, the tests' script runs) share it.
  """
  if os.environ.get("SSD_JAX_NO_COMPILE_CACHE"):
    return None
  if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    if not compile_cache_reloads():
      return None
    root = os.environ.get("SSD_JAX_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "ssd-jax"))
    os.environ["JAX_COMPILATION_CACHE_DIR"] = os.path.join(root, "xla")
    # Small programs too: a decoder's many short compiles add up to most of a script's start-up.
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
  if "jax" in sys.modules:  # imported already: the environment was read, so set the options directly
    import jax
    jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
    jax.config.update("jax_persistent_cache_min_compile_time_secs",
                      float(os.environ.get("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "1")))
    jax.config.update("jax_persistent_cache_min_entry_size_bytes",
                      int(os.environ.get("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")))
  return os.environ["JAX_COMPILATION_CACHE_DIR"]


def follow_measured_cores() -> list[int] | None:
  """Pins this process to one core where `bench.py --calibrate` measured AR faster on one core than on all of them
  on this machine (defaults.cores_to_use: a VM whose threads wake slowly, issue 56) and says so in one line; returns
  the core kept, or None (every core kept: measured faster, not measured, or one core already)."""
  from . import defaults

  one = defaults.cores_to_use()
  if one:
    from .decode.draft_process import set_process_affinity
    cores = len(os.sched_getaffinity(0))
    set_process_affinity(one)
    print(f"note: running on core {one[0]} of {cores}: `bench.py --calibrate` measured AR faster on one core than on "
          f"all here (run it again to re-measure)", file=sys.stderr, flush=True)
  return one


class UsageError(Exception):
  """Bad user input: reported as one line, without a traceback."""


def fail(msg: str):
  raise UsageError(msg)


def warn(msg: str) -> None:
  """Prints one warning line on stderr (input that is accepted but does nothing)."""
  print(f"warning: {msg}", file=sys.stderr, flush=True)


def braces(values) -> str:
  """Returns "{a,b,c}", a flag's metavar in --help for values its options object checks (argparse's choices would
  be a second check, with another message)."""
  return "{" + ",".join(values) + "}"


def add_model_arguments(p) -> None:
  """Adds the flags that say what to load and where (target, draft, weights, attention, placement, devices) to the
  argparse parser `p`: the same flags, with the same help, for every script that loads a model (decode.py, serve.py).
  check_model_args checks them, prepare_model resolves them into a load."""
  p.add_argument("--target", default="smollm2-135m-instruct",
                 help="target: a name, an ssd-jax checkpoint dir, a GGUF file or a Hugging Face safetensors dir")
  p.add_argument("--draft", default="default",
                 help="draft: 'default' (the shipped draft), 'none', our checkpoint, or a GGUF file or Hugging Face "
                      "directory of a supported family that shares the target's tokenizer")
  p.add_argument("--draft-head-vocab", type=int, default=None,
                 help="cut a full-vocabulary draft's head to N tokens at load: the special and end-of-sequence ones, "
                      "then the others in the tokenizer's order (lower ids first: BPE numbers tokens in merge order, "
                      "the most frequent first); exactness unchanged")
  p.add_argument("--draft-timeout", type=float, default=60.0,
                 help="ssd: seconds to wait for a draft process's reply; past it (or when the process exits) the "
                      "run goes on without it, the target alone (one line says so)")
  p.add_argument("--attention", default="auto", metavar=braces(settings.ATTN_IMPLS),
                 help="attention implementation: auto (the C++ kernel on a CPU, else ref), ref (jnp), cpu (the C++ "
                      "kernel) or pallas (kernels; interpret mode on CPU: slow)")
  p.add_argument("--ssd-placement", default="auto", metavar=braces(settings.SSD_PLACEMENTS),
                 help="ssd: the draft on its own JAX device of this process, or in its own process pinned to its "
                      "own CPU cores (the target pinned to the others); auto (default): processes on a CPU with "
                      "2+ usable cores and a one-device target, else devices")
  p.add_argument("--dtype", default="auto", metavar=braces(settings.DTYPES),
                 help="params' dtype on device (auto: the checkpoint's on accelerators, float32 on a CPU)")
  p.add_argument("--kv-dtype", default="auto", metavar=braces(settings.KV_DTYPES),
                 help="the target's KV cache dtype (auto: the params'; a 16-bit cache halves its bytes)")
  p.add_argument("--quantize", default="auto", metavar=braces(settings.WEIGHTS),
                 help="auto: gguf for a GGUF target (the default one included) on one CPU device, else full; int8: "
                      "the target's matrices weight-only int8 per output channel; gguf: a GGUF target's own "
                      "Q8_0/Q4_1 blocks, read from the file")
  p.add_argument("--draft-weights", default="auto", metavar=braces(settings.DRAFT_WEIGHTS),
                 help="the draft's: auto (q8_0 on a CPU, else full), full (as loaded), q8_0 (its matrices and "
                      "head in Q8_0 blocks quantized at load: faster on a CPU, acceptance measured)")
  p.add_argument("--target-devices", type=int, default=1, help="devices of the target's tensor-parallel mesh")
  p.add_argument("--draft-devices", type=int, default=1, help="1: the draft on its own device (after the target's)")


def check_model_args(args) -> None:
  """Raises ValueError (one line) for a bad value of add_model_arguments' flags, before JAX or a model is loaded."""
  settings.LoadSettings(args.attention, args.ssd_placement, args.kv_dtype, args.quantize, args.dtype,
                        args.target_devices, args.draft_devices, args.draft_weights)


def prepare_model(args, draft: str | None, draft_head_vocab: int | None = None):
  """Returns api.prepare's LoadPlan for add_model_arguments' flags with this draft (a path, 'default' or None),
  checked before any weight is read."""
  from . import api

  return api.prepare(args.target, draft, args.attention, args.target_devices, args.draft_devices,
                     args.ssd_placement, args.dtype, args.quantize, draft_head_vocab, args.kv_dtype,
                     args.draft_weights)


def k_arg(text: str):
  """Returns --k as SpecOptions takes it: an integer, or the text ('auto'; anything else SpecOptions refuses)."""
  try:
    return int(text)
  except ValueError:
    return text


def check_output_file(path: str, flag: str) -> None:
  """Fails unless `path` can be written, before any work is done; an existing file is left as it is."""
  if os.path.isdir(path):
    fail(f"{flag} {path} is a directory; give a file name")
  parent = os.path.dirname(os.path.abspath(path))
  if not os.path.isdir(parent):
    fail(f"{flag} {path}: the directory {parent} does not exist")
  existed = os.path.exists(path)
  try:
    with open(path, "a", encoding="utf-8"):
      pass
  except OSError as e:
    fail(f"{flag} {path} cannot be written ({e.strerror})")
  if not existed:
    os.remove(path)


class Interrupted(KeyboardInterrupt):
  """Ctrl-C or SIGTERM during a run; `code` is the exit code a shell expects for it (130, 143)."""

  def __init__(self, code: int):
    super().__init__(code)
    self.code = code


class Interrupts:
  """Within `with Interrupts() as stop:`, Ctrl-C and SIGTERM raise Interrupted wherever the main thread is.

  Python cannot raise into its caller from a weak-reference callback or a __del__: an exception there is printed as
  "Exception ignored" and dropped, and the run would go on as if nothing was pressed. So the signal is also kept:
  `stop.check()` raises it at the next safe point (each finished answer), and such a dropped report is not printed.
  A SIGINT the process was started ignoring (a job started in the background) stays ignored."""

  SIGNALS = (signal.SIGINT, signal.SIGTERM)

  def __init__(self):
    self.code = None
    self._before = {}

  def _raise(self, signum, _frame):
    self.code = 128 + signum
    raise Interrupted(self.code)

  def _unraisable(self, report):
    if not isinstance(report.exc_value, Interrupted):
      self._hook(report)

  def check(self) -> None:
    """Raises Interrupted if a signal came and was dropped on the way (see the class)."""
    if self.code is not None:
      raise Interrupted(self.code)

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():  # signal handlers are the main thread's only
      for s in self.SIGNALS:
        if signal.getsignal(s) is not signal.SIG_IGN:
          self._before[s] = signal.signal(s, self._raise)
    self._hook, sys.unraisablehook = sys.unraisablehook, self._unraisable
    return self

  def __exit__(self, *exc):
    for s, before in self._before.items():
      signal.signal(s, before)
    sys.unraisablehook = self._hook
    return False


def run_main(main) -> None:
  """Runs main() with the compilation cache on (`compile_cache`); expected errors (bad input, and the library's
  ValueError, CheckpointError and DataError, each one line) end the process with that line and exit code 2."""
  compile_cache()
  from .models.checkpoints import CheckpointError
  from .data.datasets import DataError

  try:
    code = main()
  except (UsageError, CheckpointError, DataError, ValueError) as e:  # worded as argparse's: "decode.py: error: ..."
    print(f"{os.path.basename(sys.argv[0])}: error: {e}", file=sys.stderr)
    sys.exit(2)
  except KeyboardInterrupt:
    print("interrupted", file=sys.stderr)
    sys.exit(130)
  sys.exit(code or 0)
