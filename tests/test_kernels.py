"""Kernels against their references: the CPU few-row product and the CPU masked attention (the Pallas attention
kernels have tests/test_attention_kernels.py)."""
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ssd_jax.kernels.masked_attention as attn
from ssd_jax.theory.fan_out import geometric_fan_out, uniform_fan_out
from ssd_jax.kernels import cpu_ffi, rows_matmul

from attention_masks import tree_mask, verify_mask

needs_cpu_attention = pytest.mark.skipif(not attn.cpu_attention_available(),
                                         reason="no C++ compiler for the CPU attention kernel")


@pytest.mark.skipif(not rows_matmul.available(), reason="no C++ compiler for the CPU kernel")
@pytest.mark.parametrize("m", [1, 2, 5, 9, 16, 40])
@pytest.mark.parametrize("k,n", [(32, 48), (576, 1536), (37, 101)])  # 37, 101: not multiples of the vector width
@pytest.mark.parametrize("transposed", [False, True])
def test_rows_matmul_matches_reference(m, k, n, transposed):
  rng = np.random.default_rng(m * 1000 + k)
  x = jnp.asarray(rng.standard_normal((m, k), dtype=np.float32))
  w = jnp.asarray(rng.standard_normal((n, k) if transposed else (k, n), dtype=np.float32))
  got = jax.jit(lambda x, w: rows_matmul.rows_matmul(x, w, transposed))(x, w)
  np.testing.assert_allclose(np.asarray(got), np.asarray(rows_matmul.ref_rows_matmul(x, w, transposed)),
                             rtol=1e-4, atol=1e-4)


# Every instruction set the kernels compile for that this CPU can run: the native build (what decoding uses) and the
# x86-64 levels, so an AVX-512 machine also checks the AVX2 code (with GCC's Zen tuning, which once broke it) and the
# portable SSE2 code, and an AVX2 machine its own and the portable one.
ARCHES = [a for a in cpu_ffi.ARCH_FLAGS if cpu_ffi.runs_here(a)]


@pytest.mark.skipif(not rows_matmul.available(), reason="no C++ compiler for the CPU kernel")
@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("transposed", [False, True])
def test_bfloat16_weights_widen_exactly_and_rows_do_not_depend_on_row_count(arch, transposed):
  """bfloat16 weights are widened in the kernel's registers: each row is bit for bit the float32 kernel's on the
  widened weights, whatever the row count (1..17, 24, 29, 41, 64), on every instruction set's build; shapes off the
  vector width take the tail paths."""
  rng = np.random.default_rng(ARCHES.index(arch) + 10 * transposed)
  call = rows_matmul.variant(arch)
  counts = list(range(2, 18)) + [24, 29, 41, 64]
  for k, n in [(576, 200), (37, 101)]:
    x = jnp.asarray(rng.standard_normal((64, k), dtype=np.float32))
    w = jnp.asarray(rng.standard_normal((n, k) if transposed else (k, n), dtype=np.float32)).astype(jnp.bfloat16)
    alone, together, f32 = jax.jit(lambda x, w: (jax.lax.map(lambda xi: call(xi[None], w, transposed)[0], x),
                                                 [call(x[:m], w, transposed) for m in counts],
                                                 call(x, w.astype(jnp.float32), transposed)))(x, w)
    np.testing.assert_array_equal(np.asarray(alone), np.asarray(f32), err_msg=f"{arch} {k}x{n}")
    for m, got in zip(counts, together):
      np.testing.assert_array_equal(np.asarray(got), np.asarray(alone)[:m], err_msg=f"{arch} {k}x{n}: {m} rows")


@pytest.mark.skipif(not rows_matmul.available(), reason="no C++ compiler for the CPU kernel")
def test_dense_sends_bfloat16_weights_through_the_kernel():
  from ssd_jax.models import model
  rng = np.random.default_rng(3)
  w = jnp.asarray(rng.standard_normal((64, 96), dtype=np.float32)).astype(jnp.bfloat16)
  for xdt in (jnp.float32, jnp.bfloat16):
    x = jnp.asarray(rng.standard_normal((3, 64), dtype=np.float32)).astype(xdt)
    assert "ssd_rows_matmul_bf16" in jax.jit(model.dense).lower(x, w).as_text()
    got = model.dense(x, w)
    assert got.dtype == xdt
    want = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-2 if xdt == jnp.bfloat16 else 1e-5,
                               atol=1e-2 if xdt == jnp.bfloat16 else 1e-4)


@pytest.mark.skipif(not rows_matmul.available(), reason="no C++ compiler for the CPU kernel")
@pytest.mark.parametrize("wdtype", ["float32", "bfloat16"])
def test_dense_takes_the_kernel_up_to_its_row_limit_and_xla_past_it(wdtype):
  """model.dense chooses its product by the row count: 1..ROWS_KERNEL_MAX rows go through the few-row kernel, each
  row bit for bit what it gets alone (an AR step's row is a verify's), one row more through XLA's product, bit for bit
  the plain product. Checked at one row and at the limit less one, the limit and one past it."""
  from ssd_jax.models import model
  lim, f32 = model.ROWS_KERNEL_MAX, jnp.float32
  rng = np.random.default_rng(lim)
  x = jnp.asarray(rng.standard_normal((lim + 1, 96), dtype=np.float32))
  w = jnp.asarray(rng.standard_normal((96, 80), dtype=np.float32)).astype(wdtype)
  kernel = "ssd_rows_matmul_bf16" if wdtype == "bfloat16" else "ssd_rows_matmul"
  dense = jax.jit(model.dense)
  alone = np.stack([np.asarray(dense(x[i:i + 1], w))[0] for i in range(lim)])
  plain = jax.jit(lambda x, w: x @ w if w.dtype == f32 else jnp.matmul(x, w, preferred_element_type=f32))
  for m in (1, lim - 1, lim, lim + 1):
    hlo, got = dense.lower(x[:m], w).as_text(), np.asarray(dense(x[:m], w))
    assert (kernel in hlo) == (m <= lim), m
    np.testing.assert_array_equal(got, alone[:m] if m <= lim else np.asarray(plain(x[:m], w)), err_msg=str(m))
  np.testing.assert_allclose(alone, np.asarray(x[:lim]) @ np.asarray(w, np.float32), rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not rows_matmul.available(), reason="no C++ compiler for the CPU kernel")
@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("k,n", [(576, 1536), (1536, 576), (37, 101), (16, 7)])
@pytest.mark.parametrize("transposed", [False, True])
def test_rows_matmul_row_does_not_depend_on_row_count(arch, k, n, transposed):
  """Every row count (each has its own register blocking, some split the columns into different blocks) gives each
  row bit for bit what that row gets alone: an AR step and a verify see the same logits for the same prefix. Shapes
  off the vector width take the tail paths too. Checked for each instruction set's build on this CPU."""
  rng = np.random.default_rng(k + n)
  x = jnp.asarray(rng.standard_normal((41, k), dtype=np.float32))
  w = jnp.asarray(rng.standard_normal((n, k) if transposed else (k, n), dtype=np.float32))
  call = rows_matmul.variant(arch)
  counts = list(range(2, 18)) + [24, 29, 41]  # one register block up to 12, tiles of at most 8 rows above
  # One program for all calls: each row alone, then the first m rows together for every m.
  outs = jax.jit(lambda x, w: ([call(x[i:i + 1], w, transposed)[0] for i in range(41)],
                               [call(x[:m], w, transposed) for m in counts]))(x, w)
  alone = np.stack([np.asarray(o) for o in outs[0]])
  np.testing.assert_allclose(alone, np.asarray(rows_matmul.ref_rows_matmul(x, w, transposed)), rtol=1e-4, atol=1e-4)
  for m, got in zip(counts, outs[1]):
    np.testing.assert_array_equal(np.asarray(got), alone[:m], err_msg=f"{arch}: {m} rows")


@pytest.mark.skipif(not rows_matmul.available(), reason="no C++ compiler for the CPU kernel")
@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("k", [576, 37, 8, 1])
def test_row_sum_squares_row_does_not_depend_on_row_count(arch, k):
  """RMSNorm's sum of squares: each row gets bit for bit what it gets alone, whatever the row count (XLA's reduce
  does not: 8 or more rows of 576 changed its order), close to the float64 sum; its gradient is 2 x."""
  rng = np.random.default_rng(k)
  x = jnp.asarray(rng.standard_normal((3, 11, k), dtype=np.float32))
  call = rows_matmul.sum_squares_variant(arch)
  alone = np.stack([np.asarray(call(x[b, t:t + 1])) for b in range(3) for t in range(11)]).reshape(3, 11, 1)
  np.testing.assert_allclose(alone, np.sum(np.asarray(x, np.float64) ** 2, -1, keepdims=True), rtol=1e-5)
  for b in (1, 2, 3):
    for t in (1, 4, 11):
      np.testing.assert_array_equal(np.asarray(call(x[:b, :t])), alone[:b, :t], err_msg=f"{arch}: {b}x{t} rows")
  g = jax.grad(lambda x: jnp.sum(rows_matmul.row_sum_squares(x) * 3.0))(x)
  np.testing.assert_allclose(np.asarray(g), 6.0 * np.asarray(x), rtol=1e-6)


_FIRST_USE = """
import jax.numpy as jnp
from ssd_jax.kernels import masked_attention as a, rows_matmul as r
x = jnp.ones((2, 8), jnp.float32)
q, k = jnp.ones((1, 1, 2, 8), jnp.float32), jnp.ones((1, 4, 1, 8), jnp.float32)
mask = a.causal_mask_info(jnp.asarray([[2]], jnp.int32))
for name, f in (("rows", lambda: r.rows_matmul(x, jnp.ones((8, 3), jnp.float32))),
                ("attention", lambda: a.cpu_attention(q, k, k, mask))):
  try:
    print(name, "ok", float(f().sum()))
  except RuntimeError as e:
    print(name, "refused", e)
"""


@pytest.mark.skipif(not (rows_matmul.available() and attn.cpu_attention_available()),
                    reason="no C++ compiler for the CPU kernels")
@pytest.mark.parametrize("disabled", [False, True])
def test_kernel_entry_points_register_on_first_use_or_refuse_clearly(disabled):
  """Called before any available() check (a fresh process), each kernel builds and registers itself instead of
  XLA failing on an unregistered custom call; where kernels are off, the error names the portable function."""
  env = {k: v for k, v in os.environ.items() if k != "SSD_JAX_NO_CPU_KERNELS"}
  if disabled:
    env["SSD_JAX_NO_CPU_KERNELS"] = "1"
  res = subprocess.run([sys.executable, "-c", _FIRST_USE], capture_output=True, text=True, env=env, timeout=300)
  assert res.returncode == 0, res.stderr[-2000:]
  lines = res.stdout.splitlines()
  if disabled:
    assert lines[0].startswith("rows refused") and "use ref_rows_matmul" in lines[0], lines
    assert lines[1].startswith("attention refused") and "ref_attention" in lines[1], lines
  else:
    assert lines == ["rows ok 48.0", "attention ok 16.0"], (lines, res.stderr[-2000:])


@pytest.mark.skipif(not rows_matmul.available(), reason="no C++ compiler for the CPU kernel")
def test_rows_matmul_gradient_matches_reference():
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((3, 16), dtype=np.float32))
  w = jnp.asarray(rng.standard_normal((16, 24), dtype=np.float32))
  for t, ww in ((False, w), (True, w.T)):
    g1 = jax.grad(lambda x, w: jnp.sum(jnp.sin(rows_matmul.rows_matmul(x, w, t))), argnums=(0, 1))(x, ww)
    g2 = jax.grad(lambda x, w: jnp.sum(jnp.sin(rows_matmul.ref_rows_matmul(x, w, t))), argnums=(0, 1))(x, ww)
    for a, b in zip(g1, g2):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-4)


def _draw(rng, *shape):
  return jnp.asarray(rng.standard_normal(shape, dtype=np.float32))


def _check_cpu_attention(q, k, v, mask):
  """The CPU kernel matches the reference, and gives exactly 0 for queries that see no key."""
  got = np.asarray(jax.jit(attn.cpu_attention)(q, k, v, mask))
  np.testing.assert_allclose(got, np.asarray(attn.ref_attention(q, k, v, mask)), rtol=2e-5, atol=2e-5)
  blind = ~np.asarray(attn.visible_mask(mask, k.shape[1]).any(-1))
  assert np.all(got[blind] == 0)


@needs_cpu_attention
@pytest.mark.parametrize("t,h,g,kk", [(1, 9, 3, 0), (5, 9, 3, 4), (6, 4, 4, 2), (3, 8, 1, 2)])
def test_cpu_attention_causal_matches_reference(t, h, g, kk):
  """AR steps, verify of K+1 tokens (queries past K+1 are padding and see nothing), prefill; GQA ratios 3, 1, 8;
  ragged prefixes, one of them empty."""
  rng = np.random.default_rng(t * 10 + h)
  b, s, d = 3, 70, 16
  q, k, v = _draw(rng, b, t, h, d), _draw(rng, b, s, g, d), _draw(rng, b, s, g, d)
  _check_cpu_attention(q, k, v, verify_mask(np.asarray([0, 17, s - t]), t, kk))


@needs_cpu_attention
@pytest.mark.parametrize("kk,fan_out,h,g", [(3, uniform_fan_out(3, 2), 2, 2), (4, geometric_fan_out(4, 12, 0.8, 0.5), 6, 2)])
def test_cpu_attention_tree_matches_reference(kk, fan_out, h, g):
  """The draft's tree step: each branch sees the prefix, the glue up to its fork and its own scratch slots up to its
  depth (depth -1: none), laid out as draft_tree writes them (attention_masks.tree_mask)."""
  rng = np.random.default_rng(sum(fan_out))
  b, n, d = 2, sum(fan_out), 8
  s = 48 + kk + kk * n
  q, k, v = _draw(rng, b, n, h, d), _draw(rng, b, s, g, d), _draw(rng, b, s, g, d)
  for _ in range(3):
    _check_cpu_attention(q, k, v, tree_mask(rng, rng.integers(1, 48, b), kk, fan_out))


@needs_cpu_attention
@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("h,g,d", [(9, 3, 64), (4, 2, 12), (2, 1, 37)])  # head dims on and off the vector width
def test_cpu_attention_query_does_not_depend_on_the_others(arch, h, g, d):
  """A query attends to the same keys whether it comes alone (an AR step) or among the T queries of a verify, and
  gets the same bits: for each instruction set's build on this CPU, and against the reference."""
  rng = np.random.default_rng(d)
  b, t, s = 2, 6, 90  # the second row's queries see 78..83 slots: 4 or 5 whole blocks of 16 keys, then the rest
  q, k, v = _draw(rng, b, t, h, d), _draw(rng, b, s, g, d), _draw(rng, b, s, g, d)
  mask = verify_mask(np.asarray([3, 77]), t, t - 1)
  call = attn.cpu_attention_variant(arch)

  def alone(i):
    one = attn.MaskInfo(mask.visible_end[:, i:i + 1], mask.tree_start, mask.tree_branch[:, i:i + 1],
                        mask.tree_depth[:, i:i + 1], mask.tree_width)
    return call(q[:, i:i + 1], k, v, one)

  together, singles = jax.jit(lambda: (call(q, k, v, mask), [alone(i) for i in range(t)]))()
  np.testing.assert_allclose(np.asarray(together), np.asarray(attn.ref_attention(q, k, v, mask)), rtol=2e-5, atol=2e-5)
  np.testing.assert_array_equal(np.asarray(together), np.concatenate([np.asarray(x) for x in singles], axis=1),
                                err_msg=arch)


@needs_cpu_attention
def test_softmax_exp_is_within_an_ulp_and_the_same_bits_on_every_instruction_set():
  """The attention's own exp (simd.h): within 2 ulp of float64's exp down to FLT_MIN (0 below), exactly 1 at 0, and
  its vector and scalar forms give the same bits on every instruction set's build this CPU runs."""
  rng = np.random.default_rng(7)
  x = np.concatenate([rng.uniform(-87.3, 88, 50000), rng.uniform(-1, 0, 50000), np.linspace(-20, 0, 20001),
                      [0.0, -1e-8, -90.0, -1e30]]).astype(np.float32)
  want = np.exp(x.astype(np.float64))
  normal = want >= np.finfo(np.float32).tiny
  first = None
  for arch in ARCHES:
    got = np.asarray(attn.cpu_vector_exp(x, arch))
    np.testing.assert_array_equal(got[0].view(np.int32), got[1].view(np.int32), err_msg=arch)
    ulps = np.abs(got[0][normal] - want[normal]) / np.spacing(want[normal].astype(np.float32))
    assert ulps.max() <= 2, (arch, ulps.max())
    assert got[0][np.flatnonzero(x == 0)[0]] == 1 and np.all(got[0][x < -88] == 0), arch
    first = got if first is None else first
    np.testing.assert_array_equal(got.view(np.int32), first.view(np.int32), err_msg=arch)


@needs_cpu_attention
def test_cpu_attention_counts_a_slot_once_when_tree_and_prefix_overlap():
  """The mask is a union: a branch slot that also lies below visible_end is one key, not two (the reference's
  semantics); tree slots past the cache's end are ignored."""
  rng = np.random.default_rng(3)
  b, t, h, g, d, s = 1, 4, 2, 1, 8, 20
  q, k, v = _draw(rng, b, t, h, d), _draw(rng, b, s, g, d), _draw(rng, b, s, g, d)
  mask = attn.MaskInfo(visible_end=jnp.asarray([[10, 12, 3, 0]], jnp.int32), tree_start=jnp.asarray([8], jnp.int32),
                       tree_branch=jnp.asarray([[0, 1, 2, 3]], jnp.int32),
                       tree_depth=jnp.asarray([[2, 1, 0, 5]], jnp.int32), tree_width=4)
  _check_cpu_attention(q, k, v, mask)


@needs_cpu_attention
def test_cpu_attention_gradient_matches_reference():
  """Draft training differentiates through attention: the kernel's VJP equals the reference's."""
  rng = np.random.default_rng(5)
  b, t, h, g, d = 2, 6, 4, 2, 8
  q, k, v = _draw(rng, b, t, h, d), _draw(rng, b, t, g, d), _draw(rng, b, t, g, d)
  mask = attn.causal_mask_info(jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t)))
  loss = lambda fn: lambda q, k, v: jnp.sum(jnp.sin(fn(q, k, v, mask)))  # noqa: E731
  got = jax.grad(loss(attn.cpu_attention), argnums=(0, 1, 2))(q, k, v)
  want = jax.grad(loss(attn.ref_attention), argnums=(0, 1, 2))(q, k, v)
  for a, w in zip(got, want):
    np.testing.assert_allclose(np.asarray(a), np.asarray(w), rtol=1e-4, atol=1e-5)


@needs_cpu_attention
def test_attention_auto_is_the_cpu_kernel_for_float32_on_cpu():
  """'auto' picks the kernel for float32 on a CPU and the reference otherwise; 'cpu' refuses what it cannot run."""
  rng = np.random.default_rng(0)
  q, k = _draw(rng, 1, 1, 2, 8), _draw(rng, 1, 4, 1, 8)
  assert attn.resolve_impl("auto", q, k) == "cpu"
  assert attn.resolve_impl("auto", q.astype(jnp.bfloat16), k.astype(jnp.bfloat16)) == "ref"
  mask = attn.causal_mask_info(jnp.asarray([[2]], jnp.int32))
  with pytest.raises(ValueError, match="float32"):
    attn.attention(q.astype(jnp.bfloat16), k.astype(jnp.bfloat16), k.astype(jnp.bfloat16), mask, impl="cpu")


@needs_cpu_attention
def test_kernels_follow_the_platform_compiled_for_not_the_backend():
  """A program traced here for a TPU or GPU holds none of the C++ CPU kernels (XLA would refuse their custom calls
  there), and 'auto' attention is the reference there; for a CPU the kernels are in. Issue 43 item 1."""
  from ssd_jax.models import model
  from ssd_jax.models.config import tiny_config
  from ssd_jax.models.kv_cache import KVCache

  cfg = tiny_config()
  params = jax.eval_shape(lambda: model.init_params(jax.random.key(0), cfg))
  cache = jax.eval_shape(lambda: KVCache.init(cfg, 1, 128))
  toks = jax.ShapeDtypeStruct((1, 3), jnp.int32)
  fwd = jax.jit(model.forward_causal, static_argnames=("cfg", "attn_impl", "platform"))
  text = lambda platform: fwd.lower(params, toks, cache, cfg=cfg, platform=platform).as_text()  # noqa: E731
  assert "ssd_rows_matmul" in text("cpu") and "ssd_masked_attention" in text("cpu")
  for platform in ("tpu", "gpu"):
    assert "ssd_rows_matmul" not in text(platform) and "ssd_masked_attention" not in text(platform)
    assert attn.resolve_impl("auto", platform=platform) == "ref"
  with pytest.raises(ValueError, match="unknown platform"):
    attn.resolve_impl("auto", platform="npu")
