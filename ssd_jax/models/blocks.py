"""GGUF block weights (Q8_0, Q4_1) kept as the file stores them, dequantized inside the product.

A GGUF matrix is stored [out, in] with blocks of 32 weights along `in`, each with a half-precision scale d (and a min
m for Q4_1): Q8_0 w = d * q (q int8), Q4_1 w = d * q + m (q a 4-bit nibble). A BlockWeight holds those arrays in the
file's row order ([R, C] rows of blocks along C) and reports the logical shape of the param it replaces: a layer
matrix [in, out] (`transposed`: the file's rows are its columns) or the tied embedding [V, d] (not transposed).

Dequantization gives exactly the float32 values gguf.quants.dequantize gives (what the float32 conversion of the file
holds): d * q is exact in float32 (an 11-bit half times an 8- or 4-bit integer), so Q4_1's fl(fl(d * q) + m) is the
only rounding, and a fused multiply-add rounds the same. A block-format model therefore computes the float32 model,
differing only in summation order.

The product: on a CPU, 1..ROWS_KERNEL_MAX float32 rows go through the few-row C++ kernel (kernels/rows_matmul.py),
which widens the blocks in registers and reads each weight byte once for all rows; elsewhere (and for more rows) a
portable path dequantizes and multiplies in float32.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

QK = 32  # weights per block
KINDS = ("Q8_0", "Q4_1")
_BLOCK_BYTES = {"Q8_0": 34, "Q4_1": 20}  # d (2 bytes), [m (2 bytes)], the 32 values


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class BlockWeight:
  qs: jax.Array               # Q8_0: [R, C] int8; Q4_1: [R, C/2] uint8 (byte j of a block: element j low, j+16 high)
  d: jax.Array                # [R, C/32] float16: each block's scale
  m: jax.Array | None         # [R, C/32] float16: each block's min (Q4_1), None for Q8_0
  kind: str = dataclasses.field(metadata=dict(static=True))
  transposed: bool = dataclasses.field(metadata=dict(static=True))  # logical shape [C, R] (a layer matrix [in, out])

  @property
  def rows_shape(self) -> tuple[int, int]:
    """(R, C): the file's rows and the weights along each."""
    r, c = self.d.shape
    return int(r), int(c) * QK

  @property
  def shape(self) -> tuple[int, int]:
    r, c = self.rows_shape
    return (c, r) if self.transposed else (r, c)

  @property
  def dtype(self):
    """The dtype it computes in (what dequantize gives)."""
    return jnp.dtype(jnp.float32)

  @property
  def ndim(self) -> int:
    return 2


def from_gguf(raw: np.ndarray, kind: str, transposed: bool) -> BlockWeight:
  """Returns the BlockWeight of a GGUF tensor's raw bytes ([R, C/32 * block bytes] uint8, gguf's reader's `data`)."""
  if kind not in KINDS:
    raise ValueError(f"unsupported block kind {kind!r}; one of {', '.join(KINDS)}")
  raw = np.asarray(raw, np.uint8)
  r = raw.shape[0]
  b = raw.reshape(r, -1, _BLOCK_BYTES[kind])
  d = np.ascontiguousarray(b[..., 0:2]).view(np.float16).reshape(r, -1)
  if kind == "Q8_0":
    return BlockWeight(np.ascontiguousarray(b[..., 2:]).view(np.int8).reshape(r, -1), d, None, kind, transposed)
  m = np.ascontiguousarray(b[..., 2:4]).view(np.float16).reshape(r, -1)
  return BlockWeight(np.ascontiguousarray(b[..., 4:]).reshape(r, -1), d, m, kind, transposed)


def block_bytes(kind: str, n: int) -> int:
  """Returns the bytes of n weights (a multiple of QK) held in blocks of `kind` (qs, d and m together)."""
  return n // QK * _BLOCK_BYTES[kind]


def quantize_q8_0(rows, transposed: bool) -> BlockWeight:
  """Returns Q8_0 blocks of a float matrix given as its rows [R, C] (C a multiple of 32), quantized by us (GGUF's
  Q8_0 rule with the scale rounded first): d = fp16(max |w| / 127) per block of 32, q = clip(round(w / d), -127, 127)
  (q = 0 where d = 0). Not exact: each weight moves by at most d / 2; dequantize gives the values it computes with.
  `transposed` as in BlockWeight (rows [out, in] of a layer matrix [in, out])."""
  w = np.asarray(rows, np.float32)
  r, c = w.shape
  if c % QK:
    raise ValueError(f"Q8_0 needs rows of a multiple of {QK} weights, got {c}")
  b = w.reshape(r, c // QK, QK)
  d = (np.abs(b).max(axis=-1) / 127.0).astype(np.float16)
  d32 = d.astype(np.float32)[..., None]
  q = np.where(d32 > 0, np.rint(b / np.where(d32 > 0, d32, 1.0)), 0.0)
  return BlockWeight(np.clip(q, -127, 127).astype(np.int8).reshape(r, c), d, None, "Q8_0", transposed)


def to_gguf(w: BlockWeight) -> np.ndarray:
  """Returns the raw GGUF bytes [R, C/32 * block bytes] of a BlockWeight (inverse of from_gguf; for test writers)."""
  r, _ = w.rows_shape
  parts = [np.asarray(w.d).view(np.uint8).reshape(r, -1, 2)]
  if w.kind == "Q4_1":
    parts.append(np.asarray(w.m).view(np.uint8).reshape(r, -1, 2))
  parts.append(np.asarray(w.qs).view(np.uint8).reshape(r, len(parts[0][0]), -1))
  return np.concatenate(parts, axis=-1).reshape(r, -1)


def take_rows(w: BlockWeight, idx) -> BlockWeight:
  """Returns the file rows `idx` of w (an un-permutation of q/k output rows, a gather); numpy or jax index."""
  return BlockWeight(w.qs[idx], w.d[idx], None if w.m is None else w.m[idx], w.kind, w.transposed)


def _values(w: BlockWeight, xp):
  """Returns the block values [R, C/32, 32] as float32 (Q8_0: q; Q4_1: the nibbles in gguf's element order)."""
  r, c = w.rows_shape
  if w.kind == "Q8_0":
    return w.qs.reshape(r, c // QK, QK).astype(xp.float32)
  b = w.qs.reshape(r, c // QK, QK // 2)
  return xp.concatenate([b & 15, b >> 4], axis=-1).astype(xp.float32)


def dequantize_rows(w: BlockWeight, xp=jnp):
  """Returns the float32 matrix [R, C] in the file's row order (xp: jnp or np)."""
  r, c = w.rows_shape
  d = w.d.astype(xp.float32)[..., None]
  v = _values(w, xp) * d
  if w.m is not None:
    v = v + w.m.astype(xp.float32)[..., None]
  return v.reshape(r, c)


def dequantize(w: BlockWeight, dtype=jnp.float32):
  """Returns the logical matrix (w.shape) a BlockWeight stands for, in `dtype`."""
  rows = dequantize_rows(w)
  return (rows.T if w.transposed else rows).astype(dtype)


def embed_lookup(w: BlockWeight, ids):
  """Returns the float32 rows `ids` of an embedding [V, d] held in blocks (only those rows are dequantized)."""
  return dequantize_rows(take_rows(w, ids.reshape(-1))).reshape(ids.shape + (w.rows_shape[1],))


def dot_rows(x, w: BlockWeight, use_kernel: bool):
  """Returns x @ W^T for x [..., C] and W = dequantize_rows(w) [R, C], in x's dtype: through the few-row CPU kernel
  when `use_kernel` (float32 x), else dequantize then the product in float32."""
  if use_kernel:
    from ..kernels import rows_matmul
    return rows_matmul.blocks_matmul(x, w).astype(x.dtype)
  y = jnp.einsum("...k,nk->...n", x.astype(jnp.float32), dequantize_rows(w))
  return y.astype(x.dtype)


def is_block(x) -> bool:
  return isinstance(x, BlockWeight)


def nbytes(params) -> int:
  """Returns the bytes of a params pytree as stored (blocks at their own size)."""
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
