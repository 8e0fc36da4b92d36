"""The platform a program is compiled for, which picks every kernel: the C++ CPU kernels, Pallas on TPU (Mosaic) or
GPU (Triton), or plain jnp.

It is an explicit, static argument of the model and of every decode step: a program compiled here for a TPU
topology (ssd_jax/plan) must be the program a TPU run compiles, so the choice can never come from the backend of
the process that traces it.
"""
from __future__ import annotations

import jax

PLATFORMS = ("cpu", "gpu", "tpu")
_ALIASES = {"cuda": "gpu", "rocm": "gpu"}


def kernel_platform(platform: str | None = None) -> str:
  """Returns the platform kernels are chosen for: `platform` when given (a device's `.platform` or one of
  PLATFORMS), else the default backend's (right only for a program run where it is traced: tests, training)."""
  p = platform if platform is not None else jax.default_backend()
  p = _ALIASES.get(p, p)
  if p not in PLATFORMS:
    raise ValueError(f"unknown platform {platform!r}; choose one of {', '.join(PLATFORMS)}")
  return p


def device_platform(device) -> str:
  """Returns the kernel platform of a JAX device (or of the first device of a mesh)."""
  if hasattr(device, "devices"):
    device = device.devices.flat[0]
  return kernel_platform(device.platform)
