"""Every draft proposal draws its tokens from the q it hands the verifier: chi-square over many draws, for the chain
(SD's draft, SSD's neural backup), the tree (SSD's speculation cache) and both for an EAGLE draft.

The verifier's ratio test is exact only if each token was drawn from the very law handed with it. test_sampled_
decoding checks that law against numpy; here the tokens are checked against it. At each depth d, the count of token
t over R rows has expectation sum_r q_r,d(t) (each row's own law given its own earlier tokens): Pearson's statistic
against those sums (conservative: the rows are independent, not identically distributed). The drafts' heads are
shuffled, non-prefix subsets (draft_heads), and the tree's q over head rows is scattered to token ids here with the
test's own table, so a head row returned for a token id, or q scattered to the wrong ids, fails as well.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ssd_jax.models import eagle, model
from ssd_jax.models.config import tiny_config
from ssd_jax.decode import eagle_steps as es
from ssd_jax.decode.base import pad_prompts
from ssd_jax.decode.steps import draft_propose, draft_tree, prefill
from ssd_jax.models.kv_cache import KVCache

from draft_heads import head_tables, restrict_head
from law_stats import chi2_pvalue, detectable_w
from pairs import perturbed

V, ROWS, K, FAN = 8, 2000, 3, (2, 1, 1, 2)
HEAD = (6, 1, 4, 0, 7)  # tokens 2, 3 and 5 lie outside the draft's head
TEXTS = [[5, 1, 6, 2, 0, 3], [2, 7, 7, 4, 1, 6]]  # rows alternate between them
# (temperature, top_p, Saguaro C): top_p 0.7 cuts the nucleus (a q handed without it puts mass where no token is
# drawn), T != 1 and C < 1 move q away from the plain softmax.
SETTINGS = [(1.3, 0.7, 1.0), (0.7, 1.0, 0.3), (1.0, 0.8, 0.5)]
N_TOP = 2  # Saguaro's rescaled set


@pytest.fixture(scope="module")
def models():
  """A V=8 target, a standalone draft (the target perturbed, cut to HEAD) and an EAGLE draft with HEAD."""
  cfg = tiny_config(vocab_size=V, d_model=16, head_dim=4, ffn_dim=24, n_layers=3, tie_embeddings=False)
  tp = model.init_params(jax.random.key(3), cfg, scale=0.1)
  dcfg, dp = restrict_head(cfg, perturbed(tp, 0.2, 4), HEAD)
  ecfg = eagle.config_for_target(cfg, len(HEAD), name="eagle-test")
  ep = eagle.init_params(jax.random.key(4), ecfg, tp, np.asarray(HEAD), scale=0.3)
  # The target's embedding rows, flattened so that top_p = 0.7 keeps several tokens, but not so far that temperature
  # stops mattering: at x0.15 a tree handing its law at T = 1 while drawing at T passed every setting.
  ep["head"] = ep["head"] * 0.5
  return cfg, tp, dcfg, dp, ecfg, ep


def _full(q_head):
  """Scatters a law over HEAD's rows [..., V_out] to token ids [..., V] with the test's own table."""
  ids, _ = head_tables(HEAD, V)
  out = np.zeros(q_head.shape[:-1] + (V,))
  out[..., ids] = q_head
  return out


def _assert_drawn_from(tokens, q):
  """tokens [R, D] drawn at D depths, q [R, D, V] the law handed with each: chi-square per depth at 1e-4."""
  for d in range(tokens.shape[1]):
    counts = np.bincount(tokens[:, d], minlength=V)
    expected = q[:, d].sum(0)
    assert abs(expected.sum() - len(tokens)) < 1e-2 * len(tokens)
    assert chi2_pvalue(counts, expected / expected.sum()) > 1e-4, (d, counts, expected.round(1))


def _standalone(models, temperature, top_p, c):
  cfg, _, dcfg, dp, _, _ = models
  texts = [TEXTS[r % 2] for r in range(ROWS)]
  toks, lens = pad_prompts([t[:-1] for t in texts], bucket=8)
  cache = KVCache.init(dcfg, ROWS, 64)
  _, cache = prefill(dp, jnp.asarray(toks), jnp.asarray(lens), cache, dcfg)
  last2, lengths = jnp.asarray([t[-2:] for t in texts], jnp.int32), jnp.asarray([len(t) for t in texts], jnp.int32)
  s = (jnp.float32(temperature), jnp.float32(top_p), jnp.float32(c))
  drafted, q, cache = draft_propose(dp, cache, None, last2, lengths, jax.random.key(11), *s, cfg=dcfg, k=K,
                                    saguaro_top=N_TOP)
  _, _, tree_t, tree_q, _, _ = draft_tree(dp, cache, None, last2, drafted, lengths, jax.random.key(12), *s, cfg=dcfg,
                                          k=K, fan_out=FAN, saguaro_top=N_TOP)
  return (np.asarray(drafted), np.asarray(q, np.float64)), (np.asarray(tree_t), np.asarray(tree_q, np.float64))


def _eagle(models, temperature, top_p, c):
  cfg, tp, _, _, ecfg, ep = models
  texts = np.asarray([TEXTS[r % 2] for r in range(ROWS)], np.int32)  # one length: no padding to think about
  L = texts.shape[1]
  prompts = jnp.asarray(texts[:, :-1])
  _, _, feats = model.forward_causal(tp, prompts, KVCache.init(cfg, ROWS, 16), cfg, feature_layers=ecfg.feature_layers)
  cache, hist = es.eagle_prefill(ep, prompts, feats, KVCache.init(ecfg, ROWS, 64), es.init_hist(ecfg, ROWS, 64), ecfg)
  window, lengths = jnp.asarray(texts[:, L - K - 1:]), jnp.full((ROWS,), L, jnp.int32)
  s = (jnp.float32(temperature), jnp.float32(top_p), jnp.float32(c))
  drafted, q, cache = draft_propose(ep, cache, hist, window, lengths, jax.random.key(13), *s, ecfg, K,
                                    saguaro_top=N_TOP)
  _, _, tree_t, tree_q, _, _ = draft_tree(ep, cache, hist, window, drafted, lengths, jax.random.key(14), *s, ecfg, K,
                                          FAN, saguaro_top=N_TOP)
  return (np.asarray(drafted), np.asarray(q, np.float64)), (np.asarray(tree_t), np.asarray(tree_q, np.float64))


@pytest.mark.parametrize("temperature,top_p,c", SETTINGS)
@pytest.mark.parametrize("kind", ["standalone", "eagle"])
def test_proposals_draw_their_tokens_from_the_q_they_hand_over(models, kind, temperature, top_p, c):
  """2000 rows (two texts), K = 3: the chain's tokens at each depth (2000 draws over 8 cells at 1e-4: detects
  w >= 0.17 with power 0.99) and the tree's, every branch pooled (12000 draws per depth: w >= 0.07). A q handed
  without top-p at top_p = 0.7 puts a tenth or more of its mass on tokens never drawn (w > 0.3)."""
  (chain_t, chain_q), (tree_t, tree_q) = (_standalone if kind == "standalone" else _eagle)(models, temperature, top_p,
                                                                                           c)
  assert chain_q.shape == (ROWS, K, V)
  _assert_drawn_from(chain_t, chain_q)
  n = tree_t.shape[1]
  _assert_drawn_from(tree_t.reshape(ROWS * n, K), _full(tree_q).reshape(ROWS * n, K, V))
  # The draws are not all on one token: the laws leave each test something to see.
  assert len(np.unique(chain_t[:, 0])) >= 3


def test_power():
  assert detectable_w(ROWS, V) < 0.17 and detectable_w(ROWS * sum(FAN), V) < 0.07
