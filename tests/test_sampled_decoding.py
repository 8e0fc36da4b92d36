"""Sampled decoding end to end: AR, SD and SSD at T in {0.5, 1, 1.5} and top_p in {0.7, 1} emit the target's law, and
the draft's proposal functions hand the verifier the exact q' they sampled from (Saguaro sampling included).

The law is numpy_reference's (a numpy forward and numpy temperature / top-p), never the code's own processed_probs.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import numpy_reference as ref
from ssd_jax.models import model
from ssd_jax.models.config import tiny_config
from ssd_jax.decode import ARDecoder, DecodeOptions, SDDecoder, SpecOptions, SSDDecoder
from ssd_jax.decode.base import pad_prompts
from ssd_jax.decode.steps import draft_propose, draft_tree, prefill
from ssd_jax.models.kv_cache import KVCache

from draft_heads import LAW_ROWS, LIVE, REAL, cells, generate, live, padded, restrict_head
from law_stats import assert_rows_follow_their_laws, chi2_pvalue, detectable_w, effect_size
from pairs import LAW_PROMPT, v4_pair

# Under SSD_JAX_TEST_HEAD=real (draft_heads) the pair has 49152 ids and a 16384-row head: the law tests then draw
# LAW_ROWS = 500 rows (w >= 0.45 at 64 cells) in two settings per mode.
ROWS, PROMPT = LAW_ROWS, LAW_PROMPT
SETTINGS = [(t, tp) for t in (0.5, 1.0, 1.5) for tp in (0.7, 1.0)]
REAL_SETTINGS = [(1.0, 1.0), (1.5, 0.7)]


def skip_unless_real_setting(temperature, top_p, settings=REAL_SETTINGS):
  if REAL and (temperature, top_p) not in settings:
    pytest.skip(f"the real head runs the settings {settings}")


@pytest.fixture(scope="module")
def tiny():
  """pairs.v4_pair (untied: a peaked law would leave top_p = 0.7 a single token) and the target on the host."""
  cfg, tp, dcfg, dp = v4_pair()
  return cfg, tp, dcfg, dp, jax.device_get(tp)


@pytest.fixture(scope="module")
def tiny_bf16():
  """The same pair with bfloat16 params."""
  cfg, tp, dcfg, dp = v4_pair("bfloat16")
  return cfg, tp, dcfg, dp, jax.device_get(tp)


def _decode(mode, cfg, tp, dcfg, dp, temperature, top_p, seed, prompts=(PROMPT,), n_new=4):
  opts = DecodeOptions(max_new_tokens=n_new, temperature=temperature, top_p=top_p, ignore_eos=True, seed=seed)
  if mode == "ar":
    dec = ARDecoder(cfg, tp)
  elif mode == "sd":
    dec = SDDecoder(cfg, tp, dcfg, dp, SpecOptions(k=2))
  else:
    dec = SSDDecoder(cfg, tp, dcfg, dp, SpecOptions(k=2, fan_out=2))
  return generate(dec, [live(prompts[r % len(prompts)]) for r in range(ROWS)], opts)


@pytest.mark.parametrize("temperature,top_p", SETTINGS)
@pytest.mark.parametrize("mode", ["ar", "sd", "ssd"])
def test_sampled_decoding_follows_the_numpy_law(tiny, mode, temperature, top_p):
  """The joint law of the first three tokens (the first from prefill, the others from rounds: SD and SSD at K=2
  emit them through accepted drafts, residuals and bonuses after all K; SSD through hits and misses). The first
  speculation is always the backup's, so SSD's tokens 2 and 3 come mostly from it: SSD decodes six and tokens 4 to 6,
  mostly from speculations served out of the cache, are tested too (their marginal law).

  3000 rows over the 64 cells, chi-square at 1e-4: detects w >= 0.18 with power 0.99 (fewer cells after pooling
  only lower that bound); test_end_to_end_power shows the bugs it is for deviate by more.
  """
  skip_unless_real_setting(temperature, top_p)
  _check_law(tiny, mode, temperature, top_p, 1000 + 10 * ["ar", "sd", "ssd"].index(mode) +
             SETTINGS.index((temperature, top_p)))


@pytest.mark.parametrize("mode,temperature,top_p", [("sd", 1.5, 1.0), ("ssd", 1.0, 0.7)])
def test_sampled_decoding_follows_the_numpy_law_in_bf16(tiny_bf16, mode, temperature, top_p):
  """The test above with bfloat16 params, in two of its settings (the time it adds; SD's and SSD's first token is
  AR's prefill draw, and the law is the numpy forward's
  in float64 over the same bfloat16 weights. It cannot hold bit for bit: the decoders round activations to
  bfloat16 at every layer and the reference does not, so the two laws differ by about 2^-8 relative per probability,
  far below what 3000 rows can see (w >= 0.18); a broken law (test_end_to_end_power's bugs) is still seen."""
  if REAL:
    pytest.skip("the real head runs in the params dtype SSD_JAX_TEST_PARAM_DTYPE gives the test above")
  _check_law(tiny_bf16, mode, temperature, top_p, 1300 + 10 * ["ar", "sd", "ssd"].index(mode))


def _check_law(tiny, mode, temperature, top_p, seed):
  cfg, tp, dcfg, dp, host = tiny
  res = _decode(mode, cfg, tp, dcfg, dp, temperature, top_p, seed, n_new=6 if mode == "ssd" else 4)
  if mode == "sd":
    assert 0 < np.mean([r.stats.extra["acceptance_rate"] for r in res]) < 1
  if mode == "ssd":
    hits = np.mean([r.stats.extra["cache_hit_rate"] for r in res])
    # Rounds served from the speculation cache and rounds the backup drafted (bfloat16 params at T = 0.5 hit 0.93).
    assert 0.2 < hits < 0.95, hits
  assert_rows_follow_their_laws(res, [PROMPT], host, cfg, temperature, top_p, tail=mode == "ssd")


@pytest.mark.parametrize("mode", ["sd", "ssd"])
def test_sampled_decoding_with_block_weights_follows_the_numpy_law(tiny_blocks, mode):
  """The law test above with the target in GGUF blocks (ssd_jax/models/blocks.py): its law is the dequantized model's.
  SD and SSD (their verify takes the block weights through several rows; AR's sampling is theirs)."""
  if REAL:
    pytest.skip("its pair is the tiny one at either head")
  cfg, tp, dcfg, dp, host = tiny_blocks
  res = _decode(mode, cfg, tp, dcfg, dp, 1.0, 1.0, 2000 + ["sd", "ssd"].index(mode), n_new=4)
  assert_rows_follow_their_laws(res, [PROMPT], host, cfg, 1.0, 1.0)


@pytest.mark.parametrize("mode", ["sd", "ssd"])
def test_sampled_decoding_with_a_q8_0_draft_follows_the_numpy_law(tiny_blocks, mode):
  """The law test with the draft quantized by us to Q8_0 at load (draft_weights.py, the default on a CPU) beside the
  block-weight target: another draft, the same target law."""
  if REAL:
    pytest.skip("its pair is the tiny one at either head")
  from ssd_jax.models import draft_weights
  cfg, tp, dcfg, dp, host = tiny_blocks
  dq = draft_weights.quantize_draft(dcfg, dp, "q8_0")
  assert draft_weights.is_quantized(dq)
  res = _decode(mode, cfg, tp, dcfg, dq, 1.0, 1.0, 2100 + ["sd", "ssd"].index(mode), n_new=4)
  assert_rows_follow_their_laws(res, [PROMPT], host, cfg, 1.0, 1.0)


RAGGED = ([1, 2, 0], [3, 0, 2, 2, 1, 3, 0])


@pytest.mark.parametrize("mode,temperature,top_p", [("sd", 1.5, 1.0), ("ssd", 1.0, 0.7)])
def test_ragged_rows_follow_their_own_laws(tiny, mode, temperature, top_p):
  """A batch of prompts of lengths 3 and 7 (alternating rows), whose rows accept different numbers of drafts and
  (SSD) hit or miss in different rounds: each row's first three tokens follow its own prompt's numpy law. 1500 rows
  per prompt, 128 cells at 1e-4: detects w >= 0.21 with power 0.99 over the batch."""
  cfg, tp, dcfg, dp, host = tiny
  seed = 1200 + 10 * ["sd", "ssd"].index(mode) + int(2 * temperature)
  res = _decode(mode, cfg, tp, dcfg, dp, temperature, top_p, seed, prompts=RAGGED)
  accept = [np.mean([r.stats.extra["acceptance_rate"] for r in res[g::2]]) for g in (0, 1)]
  assert min(accept) > 0 and max(accept) < 1
  assert_rows_follow_their_laws(res, RAGGED, host, cfg, temperature, top_p)


def test_end_to_end_power(tiny):
  """Each bug the test above is for moves the joint law by more than w = 0.18 on this model in some setting it runs:
  temperature as logits * T (the law at 1/T), the verifier ignoring top_p (tokens 2 and 3 without the nucleus), and
  greedy verification at T > 0 (tokens 2 and 3 the argmax)."""
  if REAL:
    pytest.skip("the real head's 500 rows are for gross errors: scripts/dev/mutation_run.py --head real shows which")
  cfg, _, _, _, host = tiny
  w = detectable_w(ROWS, 64)
  assert w < 0.19
  law = lambda t, tp: ref.joint_law(host, cfg, PROMPT, 3, t, tp)
  for t in (0.5, 1.5):
    assert effect_size(law(1 / t, 1.0), law(t, 1.0)) > w
  assert effect_size(law(1.0, [0.7, 1.0, 1.0]), law(1.0, 0.7)) > w
  assert effect_size(law([1.0, 0, 0], 1.0), law(1.0, 1.0)) > w


def test_ssd_saguaro_tokens_served_from_the_cache_follow_the_numpy_law(tiny):
  """Saguaro sampling with q' far from q: C = 0.1 on the top F+1 = 2 of the head's 3 tokens, so a verifier handed
  plain q for tokens drawn from q' accepts the wrong ones. Tokens 4 to 6, which SSD at K=2 emits mostly from speculations served
  out of the cache (the first three come mostly from the first round's own drafts), against the marginal of the
  numpy joint law of six tokens.

  3000 rows over the 64 cells at 1e-4: detects w >= 0.18 with power 0.99. scripts/dev/mutation_run.py hands the
  verifier plain q from the tree (cache hits) and from the chain (the neural backup on a miss); this test fails on
  each.
  """
  cfg, tp, dcfg, dp, host = tiny
  res = generate(SSDDecoder(cfg, tp, dcfg, dp, SpecOptions(k=2, fan_out=1, saguaro_c=0.1)),
                 [live(PROMPT)] * ROWS, DecodeOptions(max_new_tokens=6, temperature=1.0, ignore_eos=True, seed=1100))
  # The real-sized pair hits less (0.11 measured): served tokens still make a tenth of the rounds.
  assert (0.05 if REAL else 0.2) < np.mean([r.stats.extra["cache_hit_rate"] for r in res]) < 0.9
  counts = cells([r.token_ids for r in res], 3, start=3)
  law = ref.joint_law(host, cfg, live(PROMPT), 6, 1.0, 1.0, support=LIVE).sum(axis=(0, 1, 2))
  assert chi2_pvalue(counts.ravel(), padded(law).ravel()) > 1e-4


def _numpy_q(logits, temperature, top_p, c, n_top):
  return ref.saguaro_law(ref.sampling_law(logits, temperature, top_p), c, n_top)


HEAD48 = np.random.default_rng(5).permutation(64)[:48]  # a shuffled head: 16 token ids outside it


def _head_draft():
  """Returns (cfg, params, host params, head ids) of a V=64 draft whose head is HEAD48."""
  cfg = tiny_config(vocab_size=64)
  cfg, params = restrict_head(cfg, model.init_params(jax.random.key(2), cfg, scale=0.3), HEAD48)
  return cfg, params, jax.device_get(params), HEAD48


def _to_ids(law_rows, ids):
  """Scatters a law over head rows to token ids with the test's own table."""
  out = np.zeros(law_rows.shape[:-1] + (64,))
  out[..., ids] = law_rows
  return out


@pytest.mark.parametrize("temperature,top_p,c", [(1.0, 1.0, 0.25), (0.7, 0.8, 0.5), (1.3, 1.0, 1.0)])
def test_chain_proposal_returns_the_q_it_sampled_from(temperature, top_p, c):
  """draft_propose (SD's draft, SSD's neural backup) returns for each token the law it was drawn from, q': the
  draft's processed law with its top tokens scaled by C (Saguaro), recomputed here from a numpy forward, over a
  shuffled head and scattered to token ids with the test's own table. (That the tokens are distributed as q:
  test_proposal_laws.)"""
  cfg, params, host, ids = _head_draft()
  k, n_top = 3, 3
  texts = [[5, 6, 7, 8], [9, 10]]
  toks, lens = pad_prompts([t[:-1] for t in texts], bucket=8)
  cache = KVCache.init(cfg, 2, 128)
  _, cache = prefill(params, jnp.asarray(toks), jnp.asarray(lens), cache, cfg)
  last2 = jnp.asarray([t[-2:] for t in texts], jnp.int32)
  drafted, q, _ = draft_propose(params, cache, None, last2, jnp.asarray([len(t) for t in texts], jnp.int32),
                                jax.random.key(3), jnp.float32(temperature), jnp.float32(top_p), jnp.float32(c),
                                cfg=cfg, k=k, saguaro_top=n_top)
  drafted, q = np.asarray(drafted), np.asarray(q)
  for r, text in enumerate(texts):
    logits = ref.forward(host, text + drafted[r, :k - 1].tolist(), cfg)
    for i in range(k):
      want = _to_ids(_numpy_q(logits[len(text) - 1 + i], temperature, top_p, c, n_top), ids)
      np.testing.assert_allclose(q[r, i], want, rtol=2e-3, atol=2e-6)
      assert want[drafted[r, i]] > 0


@pytest.mark.parametrize("temperature,top_p,c", [(1.0, 1.0, 0.25), (0.7, 0.8, 0.5)])
def test_tree_returns_the_q_it_sampled_from(temperature, top_p, c):
  """draft_tree's speculation cache holds, for every branch and depth, q' of the token drawn there (numpy law, over
  a shuffled head's rows; the token drawn is looked up by id through the test's own table)."""
  cfg, params, host, ids = _head_draft()
  k, f, n_top = 2, 2, 3
  texts = [[5, 6, 7, 8], [9, 10]]
  spec = np.asarray([[11, 12], [14, 15]], np.int32)
  toks, lens = pad_prompts([t[:-1] for t in texts], bucket=8)
  cache = KVCache.init(cfg, 2, 128)
  _, cache = prefill(params, jnp.asarray(toks), jnp.asarray(lens), cache, cfg)
  cand, branch_j, tree_t, tree_q, _, _ = draft_tree(
      params, cache, None, jnp.asarray([t[-2:] for t in texts], jnp.int32), jnp.asarray(spec),
      jnp.asarray([len(t) for t in texts], jnp.int32), jax.random.key(0), jnp.float32(temperature),
      jnp.float32(top_p), jnp.float32(c), cfg=cfg, k=k, fan_out=(f,) * (k + 1), saguaro_top=n_top)
  cand, branch_j, tree_t, tree_q = (np.asarray(x) for x in (cand, branch_j, tree_t, tree_q))
  for r, text in enumerate(texts):
    for n, j in enumerate(branch_j):
      seq = text + spec[r, :j].tolist() + [int(cand[r, n])] + tree_t[r, n, :k - 1].tolist()
      logits = ref.forward(host, seq, cfg)
      for d in range(k):
        want = _numpy_q(logits[len(text) + j + d], temperature, top_p, c, n_top)
        np.testing.assert_allclose(tree_q[r, n, d], want, rtol=2e-3, atol=2e-6)
        assert _to_ids(want, ids)[tree_t[r, n, d]] > 0
