"""An EAGLE draft's decode steps (ssd_jax/decode/eagle_steps.py, and the shared chain and tree of steps.py with its
DraftKind) against step-by-step drafting with a KV cache."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ssd_jax.models import eagle, model
from ssd_jax.models.config import tiny_config
from ssd_jax.decode import eagle_steps as es
from ssd_jax.decode.steps import draft_propose, draft_tree
from ssd_jax.kernels import causal_mask_info
from ssd_jax.models.kv_cache import KVCache


HEAD = np.random.default_rng(1).permutation(64)[:56]


@pytest.fixture(scope="module")
def pair():
  tcfg = tiny_config(vocab_size=64, n_layers=5)
  tparams = model.init_params(jax.random.key(0), tcfg, scale=0.3)
  head = HEAD  # shuffled, 8 token ids outside it: every head row is mapped to its token id
  dcfg = eagle.config_for_target(tcfg, len(head))
  dparams = eagle.init_params(jax.random.key(1), dcfg, tparams, head, scale=0.2)
  dparams["layer"]["wo"] = dparams["layer"]["wo"] * 8
  dparams["layer"]["w_down"] = dparams["layer"]["w_down"] * 8
  return tcfg, tparams, dcfg, dparams


def _greedy_chain(dcfg, dparams, text, fused, anchor, n):
  """Draft n tokens greedily after `text` (1 row) reading target features for positions <= anchor, then its own."""
  cache = KVCache.init(dcfg, 1, 64)
  t = anchor + 1
  h_in = jnp.concatenate([jnp.zeros((1, 1, dcfg.d_model)), fused[:, :anchor]], axis=1)
  s = jnp.arange(t)[None]
  lg, h, cache = eagle.forward(dparams, jnp.asarray([text[:t]]), h_in, s, cache, s, causal_mask_info(s), dcfg,
                               attn_impl="ref")
  prev, logits = h[:, -1:], lg[:, -1]
  seq = list(text)
  out = []
  for p in range(t, len(text) + n):
    if p >= len(text):
      seq.append(int(HEAD[int(jnp.argmax(logits[0]))]))  # the head row's token id
      out.append(seq[-1])
    if p == len(text) + n - 1 and len(out) == n:
      break
    s = jnp.asarray([[p]])
    lg, prev, cache = eagle.forward(dparams, jnp.asarray([[seq[p]]]), prev, s, cache, s, causal_mask_info(s), dcfg,
                                    attn_impl="ref")
    logits = lg[:, -1]
  return out[:n]


def _setup(pair, prompt_len=7, k=3, slots=64):
  tcfg, tparams, dcfg, dparams = pair
  rng = np.random.default_rng(0)
  text = rng.integers(3, 64, prompt_len + 1).tolist()  # the prompt, then the first (bonus) token
  toks = jnp.asarray([text[:prompt_len]])
  _, _, feats = model.forward_causal(tparams, toks, KVCache.init(tcfg, 1, 16), tcfg, feature_layers=dcfg.feature_layers)
  cache, hist = es.eagle_prefill(dparams, toks, feats, KVCache.init(dcfg, 1, slots), es.init_hist(dcfg, 1, slots),
                                 dcfg, attn_impl="ref")
  return text, feats, cache, hist


def test_propose_drafts_like_step_by_step_decoding(pair):
  tcfg, tparams, dcfg, dparams = pair
  k = 3
  text, feats, cache, hist = _setup(pair, k=k)
  L = len(text)
  window = jnp.asarray([text[L - k - 1:]])
  toks, q, _ = draft_propose(dparams, cache, hist, window, jnp.asarray([L]), jax.random.key(0), 0.0, 1.0, 1.0, dcfg,
                              k, attn_impl="ref")
  want = _greedy_chain(dcfg, dparams, text, eagle.fuse(dparams, feats), L - 1, k)
  assert np.asarray(toks)[0].tolist() == want
  np.testing.assert_allclose(np.asarray(q).sum(-1), 1.0, atol=1e-5)
  assert (np.asarray(q)[0, np.arange(k), want] == 1.0).all()  # greedy: one-hot on the drafted token


def test_tree_branches_draft_like_step_by_step_decoding(pair):
  tcfg, tparams, dcfg, dparams = pair
  k, fan_out = 2, (2, 2, 1)
  text, feats, cache, hist = _setup(pair, k=k)
  L = len(text)
  fused = eagle.fuse(dparams, feats)
  spec = _greedy_chain(dcfg, dparams, text, fused, L - 1, k)
  spec[1] = (spec[1] + 5) % 64  # a speculation that is not the draft's own: the glue must read it as given
  out = draft_tree(dparams, cache, hist, jnp.asarray([text[L - k - 1:]]), jnp.asarray([spec]), jnp.asarray([L]),
                   jax.random.key(0), 0.0, 1.0, 1.0, dcfg, k, fan_out, attn_impl="ref")
  cand, branch_j, tree_t = (np.asarray(x) for x in out[:3])
  assert branch_j.tolist() == [0, 0, 1, 1, 2]
  for n, j in enumerate(branch_j):
    if j < k:
      assert cand[0, n] != spec[j]  # the drafted token is left out of the fork
    branch_text = text + spec[:j] + [int(cand[0, n])]
    want = _greedy_chain(dcfg, dparams, branch_text, fused, L - 1, k)
    assert tree_t[0, n].tolist() == want, (n, j)
  # The fork's candidates are the top tokens after x_L, s_1..s_j read with the draft's own features.
  g = np.asarray(out[4])[0]
  assert g.shape == (k + 1, dcfg.out_vocab)
  top0 = [int(HEAD[t]) for t in np.argsort(-g[0]) if HEAD[t] != spec[0]][:2]
  assert sorted(cand[0, :2].tolist()) == sorted(top0)


def test_observe_writes_fused_features_at_their_positions(pair):
  _, _, dcfg, dparams = pair
  hist = es.init_hist(dcfg, 2, 16)
  f = jax.random.normal(jax.random.key(3), (2, 3, dcfg.feature_dim))
  hist = es.eagle_observe(dparams, hist, f, jnp.asarray([4, 14]))
  fused = np.asarray(eagle.fuse(dparams, f))
  np.testing.assert_allclose(np.asarray(hist)[0, 4:7], fused[0], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(hist)[1, 14:16], fused[1, :2], rtol=1e-5, atol=1e-5)  # past the end: dropped
  assert not np.asarray(hist)[0, :4].any() and not np.asarray(hist)[0, 7:].any()
