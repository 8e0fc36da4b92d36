"""Several processes, one decode: `jax.distributed` from flags or the environment.

Every process runs the same script with the same arguments; JAX's own runtime joins them (no home-made transport).
The target mesh is then cut from the global device set and the draft runs on a device of each process
(sharding.make_placement). Only process 0 prints.

  flags                       environment                 meaning
  --coordinator HOST:PORT     JAX_COORDINATOR_ADDRESS     process 0's address (all processes give the same one);
                                                          'auto': let JAX detect the cluster (TPU pod slice, SLURM)
  --num-processes N           JAX_NUM_PROCESSES           how many processes take part
  --process-id I              JAX_PROCESS_ID              this process, 0..N-1

On CPU the processes exchange collectives through gloo (JAX's CPU collectives); on GPU through NCCL, on TPU through
the chips' interconnect, without configuration.
"""
from __future__ import annotations

import argparse
import os
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
  """Adds --coordinator, --num-processes and --process-id to a script's parser."""
  g = p.add_argument_group("multi-process (jax.distributed)")
  g.add_argument("--coordinator", default=None,
                 help="HOST:PORT of process 0 (or 'auto' on a TPU pod slice / SLURM); env JAX_COORDINATOR_ADDRESS")
  g.add_argument("--num-processes", type=int, default=None, help="processes taking part; env JAX_NUM_PROCESSES")
  g.add_argument("--process-id", type=int, default=None, help="this process, 0..N-1; env JAX_PROCESS_ID")


def _env_int(name: str) -> int | None:
  v = os.environ.get(name)
  if v is None or v == "":
    return None
  try:
    return int(v)
  except ValueError:
    raise ValueError(f"{name}={v!r} is not an integer") from None


def settings(coordinator: str | None = None, num_processes: int | None = None, process_id: int | None = None
             ) -> tuple[str | None, int, int | None]:
  """Returns (coordinator, num_processes, process_id) from the arguments, else the environment, checked.

  No coordinator means a single process (num_processes 1). Raises ValueError saying what is missing or wrong.
  """
  coordinator = coordinator or os.environ.get("JAX_COORDINATOR_ADDRESS") or None
  num_processes = num_processes if num_processes is not None else _env_int("JAX_NUM_PROCESSES")
  process_id = process_id if process_id is not None else _env_int("JAX_PROCESS_ID")
  if coordinator is None:
    if (num_processes or 1) > 1 or process_id not in (None, 0):
      raise ValueError("--num-processes / --process-id need --coordinator HOST:PORT (the address of process 0)")
    return None, 1, None
  if coordinator == "auto":
    return coordinator, num_processes or 0, process_id  # the cluster tells JAX; 0 = not known before joining
  if num_processes is None or process_id is None:
    raise ValueError("--coordinator needs --num-processes and --process-id (or JAX_NUM_PROCESSES, JAX_PROCESS_ID)")
  if num_processes < 1 or not 0 <= process_id < num_processes:
    raise ValueError(f"--process-id must be in 0..{num_processes - 1} and --num-processes >= 1; got process "
                     f"{process_id} of {num_processes}")
  return coordinator, num_processes, process_id


def local_devices_needed(target_devices: int, draft_devices: int, num_processes: int) -> int:
  """Returns how many devices each process needs: its share of the target mesh plus its draft device."""
  if num_processes > 1 and target_devices % num_processes:
    raise ValueError(f"--target-devices {target_devices} must be a multiple of --num-processes {num_processes}: "
                     f"every process contributes the same number of devices to the target mesh")
  return target_devices // max(num_processes, 1) + draft_devices


def initialize(coordinator: str | None = None, num_processes: int | None = None, process_id: int | None = None
               ) -> int:
  """Joins the processes with jax.distributed.initialize() when a coordinator is given; returns the process count.

  Must run before anything else touches a JAX device. With no coordinator (flag or environment) this does nothing
  and returns 1. Processes other than 0 have their standard output silenced, so only process 0 prints.
  """
  coordinator, num_processes, process_id = settings(coordinator, num_processes, process_id)
  if coordinator is None:
    return 1
  import jax

  if jax.config.jax_cpu_collectives_implementation is None:  # older JAX: no CPU collectives unless asked
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  if coordinator == "auto":
    jax.distributed.initialize()
  else:
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes, process_id=process_id)
  if not is_main():
    sys.stdout = open(os.devnull, "w")
  return jax.process_count()


def is_main() -> bool:
  """Returns True in the process that prints and writes files (process 0; the only one without jax.distributed)."""
  import jax

  return jax.process_index() == 0
