"""scripts/dev/bench_kernel_ab.py run as a command in a tiny configuration for each kernel (the working tree against
HEAD), so the A/B script cannot rot; and its library's (ssd_jax/bench/kernel_ab.py) forward mode's swap really routes
the model's calls to the build it names."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from commands import run_script
from ssd_jax.bench import kernel_ab
from ssd_jax.kernels import causal_mask_info, rows_matmul
from ssd_jax.kernels.masked_attention import cpu as attn_cpu

TINY = {"blocks": ["--rows", "1,2", "--layers", "1", "--no-head"],
        "attention": ["--tokens", "1,3", "--layers", "2", "--prefix", "20"]}


def _needs(kernel: str):
  ok = rows_matmul.available() if kernel == "blocks" else attn_cpu.cpu_attention_available()
  if not ok:
    pytest.skip(f"the {kernel} kernel does not build here")


@pytest.mark.parametrize("kernel", sorted(TINY))
def test_kernel_mode_times_both_builds(kernel):
  _needs(kernel)
  res = run_script("bench_kernel_ab.py", "--kernel", kernel, "--old", "HEAD", "--reps", "2", *TINY[kernel])
  assert res.returncode == 0, res.stderr[-2000:]
  out = res.stdout
  assert f"{kernel_ab.KERNELS[kernel].source}.cc" in out and "HEAD (old) vs working tree (new), medians of 2" in out
  counts = [int(c) for c in TINY[kernel][1].split(",")]
  rows = [line for line in out.splitlines() if re.match(r"\| \d+ \|", line)]
  assert [int(r.split("|")[1]) for r in rows] == counts
  for r in rows:
    wo, wn, ratio = (float(v) for v in r.split("|")[2:5])  # printed to 0.01 ms, the ratio from the unrounded ones
    assert wo > 0.005 and (wn - 0.005) / (wo + 0.005) - 5e-4 <= ratio <= (wn + 0.005) / (wo - 0.005) + 5e-4


def test_a_revision_without_the_kernel_is_one_line():
  with pytest.raises(SystemExit, match=r"^bench_kernel_ab: cannot read rows_matmul.cc at 'no-such-rev'"):
    kernel_ab.build_pair(kernel_ab.KERNELS["blocks"], "no-such-rev", "native")


def _compiled_text(f, *args) -> str:
  return jax.jit(f).lower(*args).compile().as_text()


@pytest.mark.parametrize("kernel", sorted(TINY))
def test_forward_swap_routes_the_models_calls_to_the_named_build(kernel):
  _needs(kernel)
  spec = kernel_ab.KERNELS[kernel]
  targets = kernel_ab.build_pair(spec, "HEAD", "native")
  rng = np.random.default_rng(1)
  if kernel == "blocks":
    w = kernel_ab.random_blocks(rng, "Q4_1", 64, 64)
    args = (jnp.asarray(rng.standard_normal((2, 64)), jnp.float32),)
    f = lambda x: rows_matmul.blocks_matmul(x, w)  # noqa: E731
  else:
    q, k, v = (jnp.asarray(rng.standard_normal(s), jnp.float32) for s in ((1, 2, 4, 8), (1, 16, 2, 8), (1, 16, 2, 8)))
    mask = causal_mask_info(jnp.arange(5, 7, dtype=jnp.int32)[None])
    args = (q, k, v)
    f = lambda q, k, v: attn_cpu.cpu_attention(q, k, v, mask)  # noqa: E731
  for name in ("old", "new"):
    with spec.swap(targets[name]):
      text = _compiled_text(f, *args)
    assert f"__ab_{name}_" in text and f"__ab_{'new' if name == 'old' else 'old'}_" not in text
  jax.clear_caches()
  assert "__ab_" not in _compiled_text(f, *args)  # restored on leaving
