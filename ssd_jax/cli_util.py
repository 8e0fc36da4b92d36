"""Shared plumbing of the command-line scripts: one clear line and a non-zero exit on bad input."""
from __future__ import annotations

import os
import sys


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
    if not os.environ.get("SSD_JAX_COMPILE_CACHE") and _intel_cpu():
      # XLA:CPU rejects its own cached programs on many Intel hosts (LLVM tuning flags taken for missing CPU
      # features, openxla/xla#44565): every load fails with an error line and recompiles. Off there unless asked.
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
