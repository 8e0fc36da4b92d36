"""GGUF block weights (ssd_jax/models/blocks.py): exact dequantization against gguf's, the block kernel against the
float32 dot form and the portable path, its row-count invariance on every instruction set this CPU runs, and greedy
SD/SSD == AR on the real SmolLM2 pair with weights='gguf'."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from ssd_jax.models import blocks, model
from ssd_jax.kernels import cpu_ffi, rows_matmul

from block_weights import block_weight

needs_kernel = pytest.mark.skipif(not rows_matmul.available(), reason="no C++ compiler for the CPU kernel")
KINDS = blocks.KINDS


def _random_halves(rng, shape) -> np.ndarray:
  """Random finite halves over their whole range (normals, subnormals, both signs, zeros)."""
  h = rng.integers(0, 1 << 16, size=shape, dtype=np.uint16)
  h[(h & 0x7C00) == 0x7C00] &= 0xBFFF  # inf/NaN exponent -> a finite one
  h.flat[:4] = [0, 0x8000, 1, 0x83FF]  # zeros and subnormals for sure
  return h.view(np.float16)


def _random_blocks(rng, kind, rows, cols) -> blocks.BlockWeight:
  nb = cols // blocks.QK
  d = _random_halves(rng, (rows, nb))
  if kind == "Q8_0":
    return blocks.BlockWeight(rng.integers(-128, 128, (rows, cols), dtype=np.int8), d, None, kind, True)
  return blocks.BlockWeight(rng.integers(0, 256, (rows, cols // 2), dtype=np.uint8), d, _random_halves(rng, (rows, nb)),
                            kind, True)


def _same_bits(a, b):
  a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
  assert a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("kind", KINDS)
def test_dequantize_equals_gguf_bit_for_bit_on_random_blocks(kind):
  rng = np.random.default_rng(KINDS.index(kind))
  w = _random_blocks(rng, kind, 64, 256)
  raw = blocks.to_gguf(w)
  want = gguf_dequantize(raw, getattr(GGMLQuantizationType, kind))
  _same_bits(blocks.dequantize_rows(w, np), want)
  _same_bits(jax.jit(blocks.dequantize_rows)(jax.tree.map(jnp.asarray, w)), want)
  _same_bits(blocks.dequantize(jax.tree.map(jnp.asarray, w)), want.T)  # the logical [in, out] matrix
  back = blocks.from_gguf(raw, kind, True)  # from_gguf inverts to_gguf
  assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(w)))


@pytest.fixture(scope="module")
def smollm2_gguf():
  from ssd_jax.models.checkpoints import locate_smollm2_gguf
  from ssd_jax.models.families import CheckpointError
  try:
    return locate_smollm2_gguf(fetch=False)
  except CheckpointError:
    pytest.skip("the SmolLM2 GGUF is not here")


def test_real_smollm2_tensors_dequantize_as_gguf_and_the_float32_conversion(smollm2_gguf):
  """Every Q8_0/Q4_1 tensor of the real file equals gguf's dequantization bit for bit; and the params read with
  keep_blocks (q/k rows un-permuted as whole blocks) equal the float32 conversion's, param by param."""
  from gguf import GGUFReader

  from ssd_jax.models.model_files import read_gguf
  for t in GGUFReader(smollm2_gguf).tensors[:12]:  # the Q8_0 embedding and a layer's Q4_1 matrices
    if t.tensor_type.name in KINDS:
      w = blocks.from_gguf(np.asarray(t.data), t.tensor_type.name, False)
      _same_bits(blocks.dequantize_rows(w, np), gguf_dequantize(t.data, t.tensor_type))
  _, full, _ = read_gguf(smollm2_gguf, progress=False)
  _, kept, _ = read_gguf(smollm2_gguf, progress=False, keep_blocks=True)
  assert blocks.is_block(kept["embed"]) and kept["embed"].kind == "Q8_0"
  assert blocks.is_block(kept["layers"][0]["wq"]) and kept["layers"][0]["wq"].kind == "Q4_1"
  logical = lambda w: (blocks.dequantize_rows(w, np).T if w.transposed else blocks.dequantize_rows(w, np)) \
      if blocks.is_block(w) else w  # noqa: E731
  for name in ("embed", "final_norm"):
    _same_bits(logical(kept[name]), full[name])
  for i in (0, 17, 29):
    for name, want in full["layers"][i].items():
      assert kept["layers"][i][name].shape == want.shape, name
      _same_bits(logical(kept["layers"][i][name]), want)


@needs_kernel
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("m", [1, 3, 9, 40])
def test_block_kernel_equals_the_float32_dot_form_and_the_portable_path(kind, m):
  """The kernel widens each block in registers and sums as the float32 dot form does: bit for bit that form on the
  dequantized weights. The portable path (dequantize, then XLA's product) sums in another order: equal to 1e-5
  relative to the output's scale."""
  rng = np.random.default_rng(m)
  w = jax.tree.map(jnp.asarray, block_weight(rng.standard_normal((576, 200)).astype(np.float32), kind))
  x = jnp.asarray(rng.standard_normal((m, 576)).astype(np.float32))
  got = np.asarray(jax.jit(lambda x, w: blocks.dot_rows(x, w, True))(x, w))
  _same_bits(got, jax.jit(lambda x, e: rows_matmul.rows_matmul(x, e, True))(x, blocks.dequantize_rows(w)))
  portable = np.asarray(jax.jit(lambda x, w: blocks.dot_rows(x, w, False))(x, w))
  ref = np.asarray(x, np.float64) @ np.asarray(blocks.dequantize(w), np.float64)
  scale = np.abs(ref).max()
  assert np.abs(got - ref).max() < 1e-5 * scale and np.abs(portable - ref).max() < 1e-5 * scale


@needs_kernel
@pytest.mark.parametrize("kind", KINDS)
def test_block_kernel_on_random_blocks_over_the_whole_half_range(kind):
  """Scales and mins anywhere in the half range (subnormals, -0 included): still the dot form's bits."""
  w = jax.tree.map(jnp.asarray, _random_blocks(np.random.default_rng(9), kind, 40, 256))
  x = jnp.asarray(np.random.default_rng(10).standard_normal((3, 256)).astype(np.float32))
  _same_bits(jax.jit(rows_matmul.blocks_matmul)(x, w),
             jax.jit(lambda x, e: rows_matmul.rows_matmul(x, e, True))(x, blocks.dequantize_rows(w)))


@needs_kernel
def test_dense_takes_the_kernel_for_few_rows_and_the_portable_path_for_many():
  """1..ROWS_KERNEL_MAX rows take the block kernel, each row bit for bit what it gets alone; one row more takes the
  portable path (dequantize, XLA's product), bit for bit dot_rows' portable form: at 2 rows, the limit less one, the
  limit and one past it."""
  rng = np.random.default_rng(5)
  lim = model.ROWS_KERNEL_MAX
  w = jax.tree.map(jnp.asarray, block_weight(rng.standard_normal((64, 96)).astype(np.float32), "Q4_1"))
  xs = jnp.asarray(rng.standard_normal((lim + 1, 64)).astype(np.float32))
  dense = jax.jit(lambda x, w: model.dense(x, w))
  alone = np.stack([np.asarray(dense(xs[i:i + 1], w))[0] for i in range(lim)])
  for rows in (2, lim - 1, lim, lim + 1):
    x = xs[:rows]
    assert ("ssd_rows_q4_1_t" in dense.lower(x, w).as_text()) == (rows <= lim), rows
    want = alone[:rows] if rows <= lim else jax.jit(lambda x, w: blocks.dot_rows(x, w, False))(x, w)
    _same_bits(dense(x, w), want)
    np.testing.assert_allclose(np.asarray(dense(x, w)), np.asarray(x) @ np.asarray(blocks.dequantize(w)),
                               rtol=1e-4, atol=1e-4)


ARCHES = [a for a in cpu_ffi.ARCH_FLAGS if cpu_ffi.runs_here(a)]


@needs_kernel
@pytest.mark.parametrize("arch", ARCHES)
def test_block_kernel_row_does_not_depend_on_row_count(arch):
  """Each row count (its own register blocking; tiles above 12 rows) gives each row bit for bit what it gets alone,
  for both kinds, on every instruction set's build this CPU runs; and that is the same build's float32 dot form on
  the dequantized weights. 37 output rows: blocks of rows and their tail."""
  rng = np.random.default_rng(ARCHES.index(arch))
  call, dot = rows_matmul.blocks_variant(arch), rows_matmul.variant(arch)
  counts = list(range(2, 18)) + [24, 29, 41, 64]
  x = jnp.asarray(rng.standard_normal((64, 192)).astype(np.float32))
  for kind in KINDS:
    w = jax.tree.map(jnp.asarray, block_weight(rng.standard_normal((192, 37)).astype(np.float32), kind))
    alone, together, f32 = jax.jit(lambda x, w: (jax.lax.map(lambda xi: call(xi[None], w)[0], x),
                                                 [call(x[:m], w) for m in counts],
                                                 dot(x, blocks.dequantize_rows(w), True)))(x, w)
    alone = np.asarray(alone)
    _same_bits(alone, f32)
    for m, got in zip(counts, together):
      np.testing.assert_array_equal(np.asarray(got), alone[:m], err_msg=f"{arch} {kind}: {m} rows")


def test_block_weight_reports_its_logical_shape_and_bytes():
  w = block_weight(np.ones((64, 96), np.float32), "Q4_1")
  assert w.shape == (64, 96) and w.rows_shape == (96, 64) and w.dtype == jnp.float32
  assert dataclasses.replace(w, transposed=False).shape == (96, 64)
  assert blocks.nbytes({"w": w}) == 96 * 2 * 20  # 20 bytes a block of 32, as in the file


@pytest.fixture(scope="module")
def gguf_pair():
  import ssd_jax
  from ssd_jax.models import checkpoints
  pipe = ssd_jax.load(draft=None, weights="gguf")
  dcfg, dparams, _ = checkpoints.load_model("default-draft")
  return pipe, dcfg, dparams


@pytest.mark.slow  # test_draft_weights' real Q8_0 draft test proves the same on the default pair
def test_greedy_sd_and_ssd_equal_ar_with_gguf_weights(gguf_pair):
  """The SmolLM2 target in its own blocks: verify rows (the block kernel, several rows) give what AR rows give."""
  from ssd_jax.decode import ARDecoder, DecodeOptions, SDDecoder, SpecOptions, SSDDecoder
  pipe, dcfg, dparams = gguf_pair
  assert blocks.is_block(pipe.target.params["layers"][0]["w_up"])
  prompts = [pipe.encode_prompt("What is the capital of France?"), pipe.encode_prompt("List three prime numbers.")]
  opts = DecodeOptions(max_new_tokens=12, eos_id=pipe.tokenizer.eos_id)
  tcfg, tparams = pipe.target.cfg, pipe.target.params
  want = [r.token_ids for r in ARDecoder(tcfg, tparams).generate(prompts, opts)]
  got = SDDecoder(tcfg, tparams, dcfg, dparams, SpecOptions(k=4)).generate(prompts, opts)
  assert [r.token_ids for r in got] == want
  got = SSDDecoder(tcfg, tparams, dcfg, dparams, SpecOptions(k=3, fan_out=2)).generate(prompts, opts)
  assert [r.token_ids for r in got] == want


def test_auto_weights_take_a_gguf_targets_blocks_on_one_cpu_device():
  """weights='auto' (load's default) is the file's blocks for a GGUF target on one CPU device, float32 otherwise."""
  from ssd_jax import api
  assert api.resolve_weights("auto", "smollm2-135m-instruct") == "gguf"
  assert api.resolve_weights("auto", "/models/x.Q4_1.gguf") == "gguf"
  assert api.resolve_weights("auto", "smollm2-135m-instruct", target_devices=2) == "full"
  assert api.resolve_weights("auto", "/models/llama-hf-dir") == "full"
  assert api.resolve_weights("int8", "smollm2-135m-instruct") == "int8"


def test_the_default_target_in_blocks_loads_without_its_float32_conversion(smollm2_gguf, monkeypatch):
  """load() with the GGUF's blocks (the CPU default) reads the target and its tokenizer from the GGUF file, and checks
  the shipped draft's tokenizer against it: nothing asks for the converted float32 checkpoint."""
  from ssd_jax import api
  from ssd_jax.models import checkpoints

  def no_conversion(*args, **kwargs):
    raise AssertionError("the float32 conversion was asked for")
  monkeypatch.setattr(checkpoints, "ensure_target", no_conversion)
  pipe = api.load(weights="gguf")
  assert pipe.weights == "gguf" and blocks.is_block(pipe.target.params["layers"][0]["w_up"])
  assert pipe.draft is not None and pipe.tokenizer.vocab_size == pipe.draft.cfg.vocab_size
