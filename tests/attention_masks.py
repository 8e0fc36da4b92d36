"""The attention mask descriptors the kernel tests run: the target's verify (causal) mask and the draft's tree mask
as `draft_tree` builds it."""
import jax.numpy as jnp
import numpy as np

from ssd_jax.kernels import masked_attention as attn


def verify_mask(lengths: np.ndarray, t: int, k: int) -> attn.MaskInfo:
  """Returns the target's verify descriptor: K+1 causal queries at each row's length; queries past K+1 are padding."""
  slots = jnp.asarray(lengths[:, None] + np.arange(t)[None, :], jnp.int32)
  mask = attn.causal_mask_info(slots)
  return mask.replace(visible_end=jnp.where(jnp.arange(t)[None, :] <= k, mask.visible_end, 0))


def tree_mask(rng, lengths: np.ndarray, k: int, fan_out: tuple) -> attn.MaskInfo:
  """Returns the draft's tree descriptor as `draft_tree` builds it, each branch at a random depth in [-1, K-1].

  Branch n forks after acceptance length j_n (it sees the prefix and glue up to L + j_n) and owns scratch slots
  L + K + d * N + n; depth -1 sees no scratch slot.
  """
  b, n = len(lengths), sum(fan_out)
  branch_j = np.repeat(np.arange(k + 1), fan_out)
  return attn.MaskInfo(visible_end=jnp.asarray(lengths[:, None] + branch_j[None, :], jnp.int32),
                       tree_start=jnp.asarray(lengths + k, jnp.int32),
                       tree_branch=jnp.asarray(np.broadcast_to(np.arange(n), (b, n)), jnp.int32),
                       tree_depth=jnp.asarray(rng.integers(-1, k, (b, n)), jnp.int32), tree_width=n)
