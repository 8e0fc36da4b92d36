"""Kernels behind portable switches: masked attention over a KV cache (`masked_attention`: reference, C++ CPU and
Pallas implementations, chosen by `impl`) and few-row products (`rows_matmul`: a C++ CPU kernel and its jnp
reference). The C++ sources are in cpu/ and are built on first use by `cpu_ffi`.
"""
from . import rows_matmul
from .mask import MaskInfo, causal_mask_info, visible_mask
from .masked_attention import attention, ref_attention

__all__ = ["MaskInfo", "attention", "causal_mask_info", "ref_attention", "rows_matmul", "visible_mask"]
