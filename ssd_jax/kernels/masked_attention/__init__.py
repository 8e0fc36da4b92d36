"""Masked attention over a KV cache, described by compact per-query metadata (`..mask`), and the one switch between
its implementations, each in its own module beside the reference:

  * 'auto' (default): 'cpu' for a program compiled for a CPU with float32 inputs when the kernel builds, else 'ref'.
  * 'ref' (ref.py): the pure-jnp oracle (float32 scores over the whole cache).
  * 'cpu' (cpu.py): a C++ XLA:CPU kernel that walks only the slots each query sees.
  * 'pallas' (pallas.py): flash-decoding kernels, Triton layout on GPU, Mosaic on TPU, interpret mode on CPU.
"""
from __future__ import annotations

import jax.numpy as jnp

from ...settings import ATTN_IMPLS, check_choice
from ..mask import MaskInfo, causal_mask_info, visible_mask
from ..platform import kernel_platform
from .cpu import cpu_attention, cpu_attention_available, cpu_attention_variant, cpu_vector_exp
from .pallas import pallas_attention
from .ref import ref_attention

__all__ = ["IMPLS", "MaskInfo", "attention", "causal_mask_info", "cpu_attention", "cpu_attention_available",
           "cpu_attention_variant", "cpu_vector_exp", "pallas_attention", "ref_attention", "resolve_impl", "visible_mask"]

IMPLS = ATTN_IMPLS


def resolve_impl(impl: str, q=None, k=None, platform: str | None = None) -> str:
  """Returns the implementation 'auto' stands for in a program compiled for `platform` (None: the default backend):
  the CPU kernel on a CPU for float32 inputs when it builds, else the reference. Other names are returned as they
  are (after a check)."""
  check_choice("attention implementation", impl, ATTN_IMPLS)
  if impl != "auto":
    return impl
  f32 = all(x is None or x.dtype == jnp.float32 for x in (q, k))
  return "cpu" if f32 and kernel_platform(platform) == "cpu" and cpu_attention_available() else "ref"


def attention(q, k, v, mask: MaskInfo, impl: str = "auto", platform: str | None = None, **kernel_options):
  """Returns masked attention [B, T, H, D] (see `ref_attention`) by the chosen implementation.

  impl: 'auto' (the default: 'cpu' on a CPU for float32 inputs when the kernel builds, else 'ref'), 'ref' (pure jnp,
  the oracle), 'cpu' (`cpu_attention`, the C++ kernel; float32 on a CPU) or 'pallas' (`pallas_attention`: Triton on
  GPU, Mosaic on TPU, interpret mode on CPU); kernel_options (block sizes, kernel, interpret) go to the Pallas
  kernel. platform: what the program is compiled for (None: the default backend); it picks 'auto', the Pallas
  kernel's lowering and interpret mode. Every implementation only reads the cache (the model writes this call's
  keys and values into it first).
  """
  platform = kernel_platform(platform)
  impl = resolve_impl(impl, q, k, platform)
  if impl == "ref":
    return ref_attention(q, k, v, mask)
  if impl == "cpu":
    if platform != "cpu" or q.dtype != jnp.float32 or k.dtype != jnp.float32:
      raise ValueError("attention 'cpu' runs float32 in a program for a CPU; use 'auto', 'ref' or 'pallas'")
    if not cpu_attention_available():
      raise ValueError("the CPU attention kernel could not be built (see the message above); use 'auto' or 'ref'")
    return cpu_attention(q, k, v, mask).astype(q.dtype)
  return pallas_attention(q, k, v, mask, platform=platform, **kernel_options)
