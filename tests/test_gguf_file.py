"""ssd_jax.models.gguf_file reads what the `gguf` package's reader reads (every value type, every tensor type we
load, the real SmolLM2 file), and a file cut short or not GGUF is one line."""
import numpy as np
import pytest

from ssd_jax.models.checkpoints import CheckpointError, locate_smollm2_gguf
from ssd_jax.models.gguf_file import read_gguf_file
from ssd_jax.models.model_files import gguf_tensors


def _as_gguf_reads(path):
  from gguf import GGUFReader
  r = GGUFReader(path)
  return {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}, r.tensors  # GGUF.*: its own


def _assert_same(path):
  meta, tensors = read_gguf_file(path)
  ref_meta, ref_tensors = _as_gguf_reads(path)
  assert list(meta) == list(ref_meta)
  for k, v in ref_meta.items():
    assert meta[k] == v and type(meta[k]) is type(v), k
    if isinstance(v, list) and v:
      assert type(meta[k][0]) is type(v[0]), k
  assert [t.name for t in tensors] == [t.name for t in ref_tensors]
  for t, ref in zip(tensors, ref_tensors):
    assert t.tensor_type == ref.tensor_type and t.shape == tuple(int(x) for x in ref.shape), t.name
    assert t.n_bytes == int(ref.n_bytes) and t.data.dtype == ref.data.dtype and t.data.shape == ref.data.shape
    np.testing.assert_array_equal(np.asarray(t.data), np.asarray(ref.data))
  return meta, tensors


def test_every_value_and_tensor_type_reads_as_the_gguf_package_reads_it(tmp_path):
  from gguf import GGMLQuantizationType as Q, GGUFWriter
  from gguf.quants import quantize

  path = str(tmp_path / "all.gguf")
  w = GGUFWriter(path, "llama")
  w.add_uint8("t.u8", 200)
  w.add_int8("t.i8", -100)
  w.add_uint16("t.u16", 60000)
  w.add_int16("t.i16", -30000)
  w.add_uint32("t.u32", 4_000_000_000)
  w.add_int32("t.i32", -2_000_000_000)
  w.add_float32("t.f32", 0.1)
  w.add_uint64("t.u64", 2**63 + 5)
  w.add_int64("t.i64", -(2**62))
  w.add_float64("t.f64", 0.1)
  w.add_bool("t.bool", True)
  w.add_string("t.str", "héllo ☃")
  w.add_array("t.strs", ["a", "", "Ġthe", "ü"])
  w.add_array("t.ints", [1, -2, 3])
  w.add_array("t.floats", [0.5, -1.25])
  w.add_array("t.bools", [True, False])
  w.add_custom_alignment(64)  # not the default 32: the data's start moves
  rng = np.random.default_rng(0)
  x = rng.normal(size=(4, 64)).astype(np.float32)
  w.add_tensor("f32", x)
  w.add_tensor("f16", x.astype(np.float16))
  w.add_tensor("vec", x[0])
  w.add_tensor("i32", np.arange(12, dtype=np.int32).reshape(3, 4))
  for kind in (Q.Q8_0, Q.Q4_1, Q.BF16):
    w.add_tensor(kind.name.lower(), quantize(x, kind), raw_dtype=kind)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  meta, tensors = _assert_same(path)
  assert meta["t.u64"] == 2**63 + 5 and meta["t.strs"] == ["a", "", "Ġthe", "ü"] and meta["general.alignment"] == 64
  assert {t.tensor_type.name for t in tensors} == {"F32", "F16", "I32", "Q8_0", "Q4_1", "BF16"}


def test_the_real_smollm2_file_reads_as_the_gguf_package_reads_it():
  _assert_same(locate_smollm2_gguf())


@pytest.mark.parametrize("cut", [3, 10, 30, 5000, "table", -100])
def test_a_file_cut_short_or_not_gguf_is_one_line(tmp_path, cut):
  """Cut inside the magic, the counts, the metadata, the tensor table, and the last tensor's data."""
  data = open(locate_smollm2_gguf(), "rb").read()
  if cut == "table":  # inside the first tensor's name in the table (the metadata never names a tensor)
    cut = data.index(b"token_embd.weight") + 5
  bad = tmp_path / "cut.gguf"
  bad.write_bytes(data[:cut])
  with pytest.raises(CheckpointError, match=r"^cannot read GGUF file .*cut\.gguf: \S") as e:
    gguf_tensors(str(bad))
  assert "\n" not in str(e.value)
  bad.write_bytes(b"GGML" + data[4:200])
  with pytest.raises(CheckpointError, match="not a GGUF file"):
    gguf_tensors(str(bad))
