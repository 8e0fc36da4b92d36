"""Attention kernels (installed as `ssd_jax.kernels`).

Each operation has a pure-jnp reference (the CPU default and the test oracle) and accelerator implementations chosen
through one switch, `impl`.
"""
from . import rows_matmul
from .masked_attention import MaskInfo, attention, causal_mask_info, ref_attention, visible_mask

__all__ = ["MaskInfo", "attention", "causal_mask_info", "ref_attention", "rows_matmul", "visible_mask"]
