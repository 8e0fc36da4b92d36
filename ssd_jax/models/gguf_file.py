"""A GGUF file's metadata and tensor table, read in milliseconds.

The `gguf` package's reader builds a numpy view for every part of every field, which for a tokenizer's 49152 tokens
and 48900 merges is hundreds of thousands of views: 4-6 s for SmolLM2's file, paid each time a run opened it (the
memory check and the load each did, three opens per decode.py run). This reader walks the same layout with `struct`
on the mapped file and gives the tensors as the `gguf` reader shapes them (a view of the mapped bytes, never a copy),
so its dequantizers apply unchanged.

Layout (GGUF v2/v3, little-endian): magic "GGUF", version u32, tensor count u64, field count u64; each field a key
(u64 length + UTF-8), a value type u32 and its value (an array: element type u32, count u64, elements); each tensor a
name, n_dims u32, dims u64 (GGUF order, fastest first), type u32, offset u64 into the data, which starts at the next
multiple of `general.alignment` (32 unless given).
"""
from __future__ import annotations

import dataclasses
import struct

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q, GGUFReader, GGUFValueType

# A number value type's little-endian numpy dtype, from the numpy type gguf's reader reads it as
_NUMBERS = {kind: np.dtype(t).newbyteorder("<") for kind, t in GGUFReader.gguf_scalar_to_np.items()}
# numpy's view of tensor types that are plain numbers; other types (quantized blocks, BF16) are bytes, one row of
# blocks a row, as gguf's reader gives them
_PLAIN = {Q.F32: np.float32, Q.F16: np.float16, Q.I8: np.int8, Q.I16: np.int16, Q.I32: np.int32, Q.I64: np.int64,
          Q.F64: np.float64}


@dataclasses.dataclass(frozen=True)
class GGUFTensor:
  name: str
  tensor_type: object  # gguf.GGMLQuantizationType
  shape: tuple         # GGUF order (fastest dimension first), as gguf's reader gives it
  n_bytes: int
  data: np.ndarray     # a view of the mapped file: numbers in numpy order, or block bytes [..., bytes a row]


class _Cursor:
  def __init__(self, buf):
    self.buf, self.pos = buf, 0

  def take(self, fmt: str):
    size = struct.calcsize("<" + fmt)
    if self.pos + size > len(self.buf):
      raise ValueError(f"ends at byte {len(self.buf)}, inside its header")
    out = struct.unpack_from("<" + fmt, self.buf, self.pos)
    self.pos += size
    return out[0] if len(out) == 1 else out

  def string(self) -> str:
    n = self.take("Q")
    if self.pos + n > len(self.buf):
      raise ValueError(f"a string of {n} bytes runs past its end")
    s = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8")
    self.pos += n
    return s

  def numbers(self, kind: int, n: int) -> np.ndarray:
    if kind not in _NUMBERS:
      raise ValueError(f"a value of type {kind}, which GGUF does not define")
    dt = _NUMBERS[kind]
    if self.pos + n * dt.itemsize > len(self.buf):
      raise ValueError(f"{n} values run past its end")
    out = np.frombuffer(self.buf, dt, n, self.pos)
    self.pos += n * dt.itemsize
    return out

  def value(self, kind: int):
    """Returns a metadata value as gguf's `ReaderField.contents()` does: a Python number, str, or list of them."""
    if kind == GGUFValueType.STRING:
      return self.string()
    if kind == GGUFValueType.ARRAY:
      item, n = self.take("I"), self.take("Q")
      return [self.string() for _ in range(n)] if item == GGUFValueType.STRING else self.numbers(item, n).tolist()
    return self.numbers(kind, 1)[0].item()


def read_gguf_file(path: str) -> tuple[dict, list[GGUFTensor]]:
  """Returns (metadata {key: value}, [GGUFTensor]) of a GGUF file: values as Python numbers, strings and lists (as
  gguf's `ReaderField.contents()` gives them), tensors as views of the mapped file. Raises ValueError, saying what is
  wrong, on a file that is not GGUF v2/v3 or is cut short."""
  mm = np.memmap(path, dtype=np.uint8, mode="r")
  c = _Cursor(memoryview(mm))
  if bytes(c.buf[:4]) != b"GGUF":
    raise ValueError("not a GGUF file (its first bytes are not 'GGUF')")
  c.pos = 4
  version = c.take("I")
  if version not in (2, 3):
    raise ValueError(f"GGUF version {version} (this reader reads versions 2 and 3, little-endian)")
  n_tensors, n_fields = c.take("Q"), c.take("Q")
  meta = {}
  for _ in range(n_fields):
    key = c.string()
    meta[key] = c.value(c.take("I"))
  table = []
  for _ in range(n_tensors):
    name = c.string()
    dims = tuple(c.take("Q") for _ in range(c.take("I")))
    table.append((name, dims, c.take("I"), c.take("Q")))
  align = int(meta.get("general.alignment", 32))
  start = -(-c.pos // align) * align
  tensors, names = [], set()
  for name, dims, raw, offset in table:
    if name in names:
      raise ValueError(f"the tensor {name} twice")
    names.add(name)
    kind = Q(raw)
    block, size = GGML_QUANT_SIZES[kind]
    n = int(np.prod(dims, dtype=np.int64))
    n_bytes = n * size // block
    at = start + offset
    if at + n_bytes > len(mm):
      raise ValueError(f"the tensor {name} runs past the file's end")
    shape = tuple(reversed(dims))
    if kind in _PLAIN:
      data = mm[at:at + n_bytes].view(_PLAIN[kind]).reshape(shape)
    else:
      data = mm[at:at + n_bytes].reshape(*shape[:-1], shape[-1] // block * size)
    tensors.append(GGUFTensor(name, kind, dims, n_bytes, data))
  return meta, tensors
