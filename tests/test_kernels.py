"""Kernels against their references: the CPU few-row product (attention kernels join here)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ssd_jax.kernels.masked_attention as attn
from ssd_jax.kernels import rows_matmul


@pytest.mark.skipif(not rows_matmul.available(), reason="no C++ compiler for the CPU kernel")
@pytest.mark.parametrize("m", [1, 2, 5, 9, 16])
@pytest.mark.parametrize("k,n", [(32, 48), (576, 1536), (37, 101)])  # 37, 101: not multiples of the vector width
@pytest.mark.parametrize("transposed", [False, True])
def test_rows_matmul_matches_reference(m, k, n, transposed):
  rng = np.random.default_rng(m * 1000 + k)
  x = jnp.asarray(rng.standard_normal((m, k), dtype=np.float32))
  w = jnp.asarray(rng.standard_normal((n, k) if transposed else (k, n), dtype=np.float32))
  got = jax.jit(lambda x, w: rows_matmul.rows_matmul(x, w, transposed))(x, w)
  np.testing.assert_allclose(np.asarray(got), np.asarray(rows_matmul.ref_rows_matmul(x, w, transposed)),
                             rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not rows_matmul.available(), reason="no C++ compiler for the CPU kernel")
@pytest.mark.parametrize("k,n", [(576, 1536), (37, 101)])
def test_rows_matmul_row_does_not_depend_on_row_count(k, n):
  """[in, out] weights: the unrolled path (4+ rows) adds each row's terms in the order the plain one does, so a
  verify row gets bit for bit what the same row gets in a smaller call."""
  rng = np.random.default_rng(k)
  x = jnp.asarray(rng.standard_normal((16, k), dtype=np.float32))
  w = jnp.asarray(rng.standard_normal((k, n), dtype=np.float32))
  f = jax.jit(rows_matmul.rows_matmul)
  first = np.asarray(f(x[:1], w))[0]
  for m in (2, 3, 4, 5, 8, 16):
    np.testing.assert_array_equal(np.asarray(f(x[:m], w))[0], first)


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


def test_attention_with_unwritten_new_keys_equals_written_cache():
  """The reference's two ways of seeing this call's keys (written into the cache, or passed separately) agree."""
  rng = np.random.default_rng(1)
  b, t, s, h, g, d = 2, 3, 16, 4, 2, 8
  q = jnp.asarray(rng.standard_normal((b, t, h, d), dtype=np.float32))
  k = jnp.asarray(rng.standard_normal((b, s, g, d), dtype=np.float32))
  v = jnp.asarray(rng.standard_normal((b, s, g, d), dtype=np.float32))
  kn = jnp.asarray(rng.standard_normal((b, t, g, d), dtype=np.float32))
  vn = jnp.asarray(rng.standard_normal((b, t, g, d), dtype=np.float32))
  slots = jnp.asarray([[5, 6, 7], [2, 3, 4]])
  mask = attn.causal_mask_info(slots)
  rows = jnp.arange(b)[:, None]
  written = attn.ref_attention(q, k.at[rows, slots].set(kn), v.at[rows, slots].set(vn), mask)
  separate = attn.ref_attention(q, k, v, mask, kn, vn, slots)
  np.testing.assert_allclose(np.asarray(written), np.asarray(separate), rtol=1e-5, atol=1e-5)
