"""The tiny models the decoding tests share: the V=64 target (conftest's `tiny_pair`), drafts made by perturbing a
target (`perturbed`; conftest's `perturbed_draft`), the V=4 pair of the law tests (`v4_pair`), the ragged test
prompts, and the stop ids every decoder must stop at (`two_stop_ids`, `cut_at_first`)."""
import os

import jax
import jax.numpy as jnp

from ssd_jax.models import checkpoints, model
from ssd_jax.models.config import tiny_config
from ssd_jax.decode import ARDecoder, DecodeOptions

from draft_heads import REAL, REAL_LIVE, REAL_VOCAB, V4_HEAD, concentrate, real_head_ids, restrict_head

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11], [12, 13, 14, 15, 16]]  # ragged rows
LAW_PROMPT = [1, 2, 0]  # the prompt the law tests decode v4_pair from (draft_heads.live maps it to the pair's ids)

# The params' dtype of v4_pair, which the law tests decode with: SSD_JAX_TEST_PARAM_DTYPE=bfloat16 runs them with
# 16-bit params (scripts/dev/mutation_run.py --param-dtype bfloat16); float32 by default.
TEST_PARAM_DTYPE = os.environ.get("SSD_JAX_TEST_PARAM_DTYPE", "float32")


def tiny_target():
  """Returns (cfg, params): the V=64 tiny target most decoding tests run (conftest's `tiny_pair`)."""
  cfg = tiny_config(vocab_size=64)
  return cfg, model.init_params(jax.random.key(7), cfg, scale=0.3)


def perturbed(params, scale, seed):
  """A draft that agrees with the target often but not always (partial acceptance exercises rollback): every
  floating leaf plus `scale` times normal noise (drawn in float32, the sum cast back to the leaf's dtype)."""
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  return jax.tree.unflatten(tree, [(x + scale * jax.random.normal(k, x.shape, jnp.float32)).astype(x.dtype)
                                   if x.dtype in (jnp.float32, jnp.bfloat16) else x for x, k in zip(leaves, keys)])


def v4_pair(dtype: str | None = None, real: bool = REAL):
  """Returns (cfg, target params, draft cfg, draft params): a V=4 target and a draft noticeably different from it,
  for the laws at T > 0. Untied embeddings: with tied ones a tiny model repeats its last token with probability
  ~0.99, and a law that peaked leaves a test little to see. The draft's head is draft_heads.V4_HEAD (shuffled, token 1
  left out), as a trained draft's is not a prefix of the vocabulary. real (SSD_JAX_TEST_HEAD=real): the pair at a real
  draft's sizes, vocabulary 49152 and draft_heads.real_head_ids(), its mass on draft_heads.LIVE (token t is LIVE[t]).
  dtype: the floating params' (None: TEST_PARAM_DTYPE), cast after the draft is drawn, so both dtypes decode the same
  pair up to rounding."""
  cfg = tiny_config(vocab_size=REAL_VOCAB if real else 4, d_model=16, head_dim=4, ffn_dim=24, tie_embeddings=False)
  tp = model.init_params(jax.random.key(11), cfg, scale=0.3)
  if not real:
    dcfg, dp = restrict_head(cfg, perturbed(tp, 0.3, 5), V4_HEAD)
  else:
    tp = concentrate(tp, REAL_LIVE)
    dcfg, dp = restrict_head(cfg, concentrate(perturbed(tp, 0.3, 5), REAL_LIVE), real_head_ids())
  dt = dtype or TEST_PARAM_DTYPE
  return cfg, checkpoints.cast_params(tp, dt), dcfg, checkpoints.cast_params(dp, dt)


def cut_at_first(tokens, stops):
  """Returns tokens up to and including the first of `stops` (the reference every decoder must match)."""
  hits = [j for j, t in enumerate(tokens) if t in stops]
  return tokens[: hits[0] + 1] if hits else tokens


def two_stop_ids(cfg, tp):
  """Returns (ids, AR's rows cut at the first of either): two stop ids as Llama 3's <|eot_id|> and <|end_of_text|>,
  each the first stop of a different row, each mid-text (inside a speculative round's accepted drafts)."""
  full = [r.token_ids for r in ARDecoder(cfg, tp).generate(PROMPTS, DecodeOptions(max_new_tokens=15, ignore_eos=True))]
  stops = (full[0][8], full[1][4])
  want = [cut_at_first(t, stops) for t in full]
  assert want[0][-1] == stops[0] and want[1][-1] == stops[1] and len(want[0]) < 15 and len(want[1]) < 15
  return stops, want
