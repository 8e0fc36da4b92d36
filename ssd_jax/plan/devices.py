"""The devices a plan is made for: memory, bandwidths, peak FLOPs and latencies, each a public figure or an assumption
(printed with every estimate). TPUs are compiled for for real through libtpu topologies (compile.py); GPUs are
sized and estimated analytically only.
"""
from __future__ import annotations

import dataclasses

GIB = 2 ** 30


@dataclasses.dataclass(frozen=True)
class Device:
  name: str
  platform: str            # kernel platform of the programs (kernels/platform.py)
  memory: int              # bytes of device memory
  hbm_gbs: float           # peak memory bandwidth, GB/s
  tflops: float            # peak dense bfloat16 TFLOP/s
  link_gbs: float          # one direction of a device's links to its tensor-parallel peers, GB/s
  allreduce_us: float      # latency of one small all-reduce over the target mesh (assumption)
  launch_us: float         # cost of one kernel in a step beyond its bytes (assumption: CUDA graphs on GPU)
  step_us: float           # fixed cost of dispatching one step (host to device, sampling's small ops)
  transfer_us: float       # latency of one transfer between the target's and the draft's device
  topology: str = ""       # libtpu topology name prefix ('v5e'); empty for a GPU
  bw_eff: float = 0.8      # achieved fraction of peak bandwidth on streaming weights (assumption)
  flops_eff: float = 0.5   # achieved fraction of peak FLOP/s on the few-row products of decoding (assumption)


DEVICES = {d.name: d for d in (
    # H100 SXM 80 GB: 3.35 TB/s HBM3, 989 dense bf16 TFLOP/s, NVLink 4 (450 GB/s each way).
    Device("h100-80gb", "gpu", 81559 * 2 ** 20, 3350, 989, 450, allreduce_us=10, launch_us=3, step_us=60,
           transfer_us=15),
    # H200: 141 GB HBM3e at 4.8 TB/s, the same compute and NVLink as the H100.
    Device("h200", "gpu", 143771 * 2 ** 20, 4800, 989, 450, allreduce_us=10, launch_us=3, step_us=60,
           transfer_us=15),
    # TPU v5e: 16 GiB HBM2 at 819 GB/s, 197 bf16 TFLOP/s, ICI 1,600 Gbit/s a chip.
    Device("tpu-v5e", "tpu", 16 * GIB, 819, 197, 200, allreduce_us=8, launch_us=1, step_us=50, transfer_us=20,
           topology="v5e"),
    # TPU v5p: 95 GiB HBM2e at 2,765 GB/s, 459 bf16 TFLOP/s, ICI 4,800 Gbit/s a chip.
    Device("tpu-v5p", "tpu", 95 * GIB, 2765, 459, 600, allreduce_us=8, launch_us=1, step_us=50, transfer_us=20,
           topology="v5p"),
    # TPU v6e (Trillium): 32 GiB HBM at 1,640 GB/s, 918 bf16 TFLOP/s, ICI 3,584 Gbit/s a chip.
    Device("tpu-v6e", "tpu", 32 * GIB, 1640, 918, 448, allreduce_us=8, launch_us=1, step_us=50, transfer_us=20,
           topology="v6e"),
)}

# Slice shapes by chip count, smallest first: a plan takes the first that holds the target mesh and the draft chip.
_SHAPES = {"v5e": ("2x2", "2x4", "4x4", "4x8"), "v6e": ("2x2", "2x4", "4x4", "4x8"),
           "v5p": ("2x2x1", "2x2x2", "2x2x4", "2x4x4")}


def device(name: str) -> Device:
  """Returns the device called `name`; a ValueError names the known ones."""
  if name not in DEVICES:
    raise ValueError(f"unknown device {name!r}; choose one of {', '.join(DEVICES)}")
  return DEVICES[name]


def topology_name(dev: Device, chips: int, shape: str | None = None) -> str:
  """Returns the libtpu topology ('v5e:2x4') of the smallest standard slice with at least `chips` chips (or of the
  given shape)."""
  if not dev.topology:
    raise ValueError(f"{dev.name} is not a TPU: it is estimated analytically, not compiled for")
  if shape:
    return f"{dev.topology}:{shape}"
  for s in _SHAPES[dev.topology]:
    n = 1
    for x in s.split("x"):
      n *= int(x)
    if n >= chips:
      return f"{dev.topology}:{s}"
  raise ValueError(f"no standard {dev.topology} slice here holds {chips} chips; give --slice")


def assumptions(dev: Device) -> str:
  """Returns the device's figures as one printable line."""
  return (f"{dev.name}: {dev.memory / GIB:.1f} GiB, {dev.hbm_gbs:.0f} GB/s x {dev.bw_eff:.0%} achieved, "
          f"{dev.tflops:.0f} TFLOP/s x {dev.flops_eff:.0%}, links {dev.link_gbs:.0f} GB/s, all-reduce "
          f"{dev.allreduce_us:g} us, {dev.launch_us:g} us a kernel, {dev.step_us:g} us a step, draft<->target "
          f"transfer {dev.transfer_us:g} us")
