"""Pallas masked attention against the jnp reference: verify (causal) and tree masks, GQA, float32 and bfloat16.

On CPU every kernel runs in interpret mode (slow to compile, so each test compiles one program and draws several
random cases of that shape). On a GPU the same tests compile the Triton kernel for real (the TPU kernel's are skipped),
on a TPU the Mosaic one; the GPU- and TPU-marked tests add realistic shapes and skip elsewhere.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ssd_jax.models import model
from ssd_jax.models.config import tiny_config
from ssd_jax.decode import DecodeOptions, SpecOptions, SSDDecoder
from ssd_jax.theory.fan_out import geometric_fan_out, uniform_fan_out
from ssd_jax.kernels import masked_attention as attn

from attention_masks import tree_mask, verify_mask

KERNELS = ("triton", "mosaic")
# Small key blocks so that a short cache spans several blocks and (triton) several splits; the TPU interpreter pays
# per grid step, so its query block takes every row.
SMALL_BLOCKS = {"triton": dict(block_k=16, split_k=32, block_q=16), "mosaic": dict(block_k=16, block_q=128)}
TOL = {jnp.float32: 2e-5, jnp.bfloat16: 2e-2}
ref_attention = jax.jit(attn.ref_attention)


def _qkv(rng, b: int, t: int, h: int, g: int, d: int, s: int, dtype):
  """Returns random q [B, T, H, D] and a cache k, v [B, S, G, D] in dtype (every slot filled, visible or not)."""
  def draw(*shape):
    return jnp.asarray(rng.standard_normal(shape, dtype=np.float32)).astype(dtype)
  return draw(b, t, h, d), draw(b, s, g, d), draw(b, s, g, d)


def _run(kernel: str, q, k, v, mask: attn.MaskInfo):
  """Returns the kernel's output with small test blocks: compiled where its backend is, else interpreted on CPU."""
  backend = jax.default_backend()
  native = {"triton": "gpu", "mosaic": "tpu"}[kernel]
  if backend not in (native, "cpu"):
    pytest.skip(f"the {kernel} kernel neither compiles nor is interpreted here ({backend})")
  return attn.pallas_attention(q, k, v, mask, kernel=kernel, interpret=backend != native, **SMALL_BLOCKS[kernel])


def _check(out, want, dtype, mask: attn.MaskInfo, num_slots: int):
  """Asserts the kernel output matches the reference, and is exactly 0 for queries that see no key."""
  out, want = np.asarray(out, np.float32), np.asarray(want, np.float32)
  np.testing.assert_allclose(out, want, rtol=TOL[dtype], atol=TOL[dtype])
  blind = ~np.asarray(jax.jit(attn.visible_mask, static_argnums=1)(mask, num_slots).any(-1))  # [B, T]
  assert np.all(out[blind] == 0)


# (queries T, query heads H, KV heads G, head dim D, cache slots S, dtype, K values). One compiled program per case:
# K < T - 1 pads the queries past K+1 (they see nothing and must give 0). S = 100 is not a multiple of the key
# block, so the cache padding path runs too. GQA ratios 8 and 3 here, 1 in the tree cases.
VERIFY_CASES = [(9, 8, 1, 32, 80, jnp.bfloat16, (8, 4, 1)), (2, 6, 2, 16, 100, jnp.float32, (1,))]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("t,h,g,d,s,dtype,ks", VERIFY_CASES)
def test_verify_attention_matches_reference(kernel, t, h, g, d, s, dtype, ks):
  """K+1 causal queries over ragged prefixes (one row with an empty prefix), K from 1 to 8."""
  rng = np.random.default_rng(t * 100 + h)
  b = 3
  q, k, v = _qkv(rng, b, t, h, g, d, s, dtype)
  for kk in ks:
    lengths = rng.integers(0, s - t, b)
    lengths[0] = 0  # an empty prefix: the first query sees only itself
    mask = verify_mask(lengths, t, kk)
    _check(_run(kernel, q, k, v, mask), ref_attention(q, k, v, mask), dtype, mask, s)


# (K, fan-out vector, H, G, D, dtype): uniform and geometric fan-out, GQA ratios 1 and 3.
TREE_CASES = [(3, uniform_fan_out(3, 2), 2, 2, 8, jnp.float32),
              (4, geometric_fan_out(4, 12, 0.8, 0.5), 6, 2, 16, jnp.bfloat16)]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("k,fan_out,h,g,d,dtype", TREE_CASES)
def test_tree_attention_matches_reference(kernel, k, fan_out, h, g, d, dtype):
  """Every branch sees the prefix, the glue up to its fork point and its own scratch entries up to its depth."""
  rng = np.random.default_rng(sum(fan_out))
  b, n = 2, sum(fan_out)
  s = 48 + k + k * n
  q, kc, vc = _qkv(rng, b, n, h, g, d, s, dtype)
  for _ in range(2):
    lengths = rng.integers(1, 48, b)
    mask = tree_mask(rng, lengths, k, fan_out)
    _check(_run(kernel, q, kc, vc, mask), ref_attention(q, kc, vc, mask), dtype, mask, s)


def test_attention_switch():
  """One switch picks the implementation; unknown names fail early."""
  rng = np.random.default_rng(0)
  q, k, v = _qkv(rng, 1, 2, 2, 1, 8, 16, jnp.float32)
  slots = jnp.asarray([[3, 4]], jnp.int32)
  mask = attn.causal_mask_info(slots)
  with pytest.raises(ValueError, match="unknown attention implementation 'flash'"):
    attn.attention(q, k, v, mask, impl="flash")
  with pytest.raises(ValueError, match="unknown Pallas attention kernel"):
    attn.pallas_attention(q, k, v, mask, kernel="cuda")


def _greedy_reference(params, cfg, prompts, n: int) -> list:
  """Returns n greedy tokens per prompt from plain causal forwards with the reference attention (one program)."""
  width = max(map(len, prompts)) + n
  seqs = [list(p) for p in prompts]
  forward = jax.jit(model.forward_full, static_argnames="cfg")
  for _ in range(n):
    logits = forward(params, jnp.asarray([s + [0] * (width - len(s)) for s in seqs]), cfg=cfg)
    for row, s in enumerate(seqs):
      s.append(int(jnp.argmax(logits[row, len(s) - 1])))
  return [s[len(p):] for s, p in zip(seqs, prompts)]


@pytest.mark.slow  # about as long as the rest of this file: every SSD program compiles with interpreted kernels
def test_greedy_ssd_with_pallas_attention_gives_reference_tokens():
  """Greedy SSD whose every attention (prefill, verify, glue, tree, backup) runs the Pallas kernel emits the tokens of
  greedy decoding with the reference attention (test_ssd.py shows greedy SSD with 'ref' equals greedy AR)."""
  cfg = tiny_config(vocab_size=64, n_layers=1)
  params = model.init_params(jax.random.key(7), cfg, scale=0.3)
  prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10]]
  got = SSDDecoder(cfg, params, cfg, params, SpecOptions(k=2, fan_out=2), attn_impl="pallas").generate(
      prompts, DecodeOptions(max_new_tokens=8, ignore_eos=True))
  assert [r.token_ids for r in got] == _greedy_reference(params, cfg, prompts, 8)


@pytest.mark.parametrize("kernel,platform", [("triton", "cuda"), ("mosaic", "tpu")])
def test_kernels_lower_for_their_accelerator(kernel, platform):
  """Cross-platform lowering from this CPU: Pallas turns each kernel into Triton / Mosaic IR at realistic shapes
  (tree step over GQA 9/3, D=64, bf16; verify over GQA 64/8, D=128, f32). The accelerator's own compiler passes
  (register / VMEM layouts) only run on the device: see the gpu / tpu tests."""
  b, s = 2, 1280
  i32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32)  # noqa: E731
  for t, h, g, d, dtype, width in [(24, 9, 3, 64, jnp.bfloat16, 24), (8, 64, 8, 128, jnp.float32, 0)]:
    q, kv = jax.ShapeDtypeStruct((b, t, h, d), dtype), jax.ShapeDtypeStruct((b, s, g, d), dtype)
    mask = attn.MaskInfo(visible_end=i32(b, t), tree_start=i32(b), tree_branch=i32(b, t), tree_depth=i32(b, t),
                         tree_width=width)
    fn = jax.jit(lambda q, k, v, m: attn.pallas_attention(q, k, v, m, kernel=kernel, interpret=False))
    text = fn.trace(q, kv, kv, mask).lower(lowering_platforms=(platform,)).as_text()
    assert "masked_attention" in text


def _realistic_case(rng, h: int, g: int, prefix: int, dtype):
  """Returns (q, k, v, mask) for one 24-branch tree step (K=7, F=3) over a `prefix`-slot prefix, D = 64."""
  k, fan_out = 7, uniform_fan_out(7, 3)
  n = sum(fan_out)
  s = prefix + k + k * n + 64
  q, kc, vc = _qkv(rng, 2, n, h, g, 64, s, dtype)
  return q, kc, vc, tree_mask(rng, np.asarray([prefix, prefix // 2]), k, fan_out)


def _on(backend: str, kernel: str):
  mark = pytest.mark.gpu if backend == "gpu" else pytest.mark.tpu
  return pytest.param(kernel, marks=[mark, pytest.mark.skipif(jax.default_backend() != backend,
                                                              reason=f"needs a {backend.upper()} ({kernel} lowering)")])


@pytest.mark.parametrize("kernel", [_on("gpu", "triton"), _on("tpu", "mosaic")])
@pytest.mark.parametrize("h,g", [(9, 3), (64, 8)])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_compiled_kernel_on_accelerator(kernel, h, g, dtype):
  """The compiled kernel (Triton on a GPU, Mosaic on a TPU; not interpret mode) matches the reference at a
  realistic tree step."""
  q, k, v, mask = _realistic_case(np.random.default_rng(h), h, g, 1000, dtype)
  out = attn.pallas_attention(q, k, v, mask, kernel=kernel, interpret=False)
  _check(out, ref_attention(q, k, v, mask), dtype, mask, k.shape[1])


@pytest.mark.skipif(len(jax.devices()) < 4, reason="needs 4 devices (XLA_FLAGS in conftest)")
@pytest.mark.parametrize("g", [4, 2])
def test_pallas_under_a_mesh_splits_by_kv_heads(g):
  """Under a tensor-parallel mesh (as Programs lowers) the Pallas call runs per device over its own KV heads (or
  replicated where they do not divide the mesh): XLA cannot partition a Mosaic call. Same values as the reference."""
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

  rng = np.random.default_rng(3)
  q, k, v = _qkv(rng, 2, 3, 8, g, 16, 64, jnp.float32)
  mask = verify_mask(np.asarray([20, 40]), 3, 2)
  mesh = Mesh(np.asarray(jax.devices()[:4]), ("tp",))
  split = NamedSharding(mesh, P(None, None, "tp", None) if g == 4 else P())
  q, k, v = (jax.device_put(x, split) for x in (q, k, v))
  fn = jax.jit(lambda q, k, v, m: attn.pallas_attention(q, k, v, m, kernel="triton", interpret=True,
                                                         **SMALL_BLOCKS["triton"]))
  with jax.set_mesh(mesh):
    out = fn(q, k, v, mask)
  np.testing.assert_allclose(np.asarray(out), np.asarray(attn.ref_attention(q, k, v, mask)), rtol=2e-5, atol=2e-5)
