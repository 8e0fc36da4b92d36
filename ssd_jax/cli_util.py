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


class UsageError(Exception):
  """Bad user input: reported as one line, without a traceback."""


def fail(msg: str):
  raise UsageError(msg)


def run_main(main) -> None:
  """Runs main(); expected errors end the process with a one-line message and exit code 2."""
  from .checkpoints import CheckpointError
  from .datasets import DataError

  try:
    code = main()
  except UsageError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  except (CheckpointError, DataError, ValueError) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  except KeyboardInterrupt:
    print("interrupted", file=sys.stderr)
    sys.exit(130)
  sys.exit(code or 0)
