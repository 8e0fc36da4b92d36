"""SD and SSD with an EAGLE draft (one that reads the target's features): greedy output equals AR, the features the
draft side receives are the target's own at the right positions, and sampled output follows the target."""
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ssd_jax.models import eagle, model
from ssd_jax.models.config import tiny_config
from ssd_jax.decode import ARDecoder, DecodeOptions, SDDecoder, SpecOptions, SSDDecoder
from ssd_jax.decode.draft import EagleDraftModel
from ssd_jax.models.kv_cache import KVCache

from draft_heads import (LAW_ROWS, LIVE, REAL, REAL_LIVE, REAL_VOCAB, V4_HEAD, cells, concentrate, concentrate_eagle,
                         generate, live, outside_head_rare, padded, real_head_ids)
from pairs import PROMPTS


def _eagle(tcfg, tparams, head_ids, seed=1, scale=0.3):
  cfg = eagle.config_for_target(tcfg, len(head_ids), name="eagle-test")
  params = eagle.init_params(jax.random.key(seed), cfg, tparams, np.asarray(head_ids), scale=scale)
  # Visible residual outputs, so that a wrong feature or position changes what the draft proposes.
  params["layer"]["wo"] = params["layer"]["wo"] * 8
  params["layer"]["w_down"] = params["layer"]["w_down"] * 8
  return cfg, params


@pytest.fixture(scope="module")
def pair():
  tcfg = tiny_config(vocab_size=64, n_layers=4)
  tparams = model.init_params(jax.random.key(7), tcfg, scale=0.3)
  dcfg, dparams = _eagle(tcfg, tparams, np.arange(8, 64))  # a reduced head: ids 0..7 are never proposed
  return tcfg, tparams, dcfg, dparams


@pytest.fixture
def recorded(monkeypatch):
  """Records the target features an in-process EAGLE draft is given: ("prefill", feats) and ("observe", feats,
  start) in order."""
  calls = []
  prefill, observe = EagleDraftModel.prefill, EagleDraftModel.observe

  def rec_prefill(self, features=None):
    calls.append(("prefill", np.asarray(features)))
    return prefill(self, features)

  def rec_observe(self, features, start):
    calls.append(("observe", np.asarray(features), np.asarray(start).copy()))
    return observe(self, features, start)

  monkeypatch.setattr(EagleDraftModel, "prefill", rec_prefill)
  monkeypatch.setattr(EagleDraftModel, "observe", rec_observe)
  return calls


def _check_features(calls, results, tcfg, tparams, layers, k):
  """Every feature the draft received for a committed position equals the target's own feature there, computed
  by one causal pass over the row's final text."""
  full = []
  for p, r in zip(PROMPTS, results):
    text = p + r.token_ids
    _, _, f = model.forward_causal(tparams, jnp.asarray([text]), KVCache.init(tcfg, 1, len(text) + 8), tcfg,
                                   feature_layers=layers)
    full.append(np.asarray(f[0]))
  assert calls[0][0] == "prefill"
  for i, p in enumerate(PROMPTS):
    np.testing.assert_allclose(calls[0][1][i, : len(p)], full[i][: len(p)], rtol=2e-4, atol=2e-4)
  checked = 0
  obs = calls[1:]
  for (_, feats, start), (_, _, nxt) in zip(obs, obs[1:]):
    for i in range(len(PROMPTS)):
      # Positions start..start+K were verified; the next round starts past the ones committed (the token before
      # the drafts and the accepted drafts), whose features must be the target's own on the final text.
      n = int(nxt[i] - start[i])
      assert 0 <= n <= k + 1
      if n:
        np.testing.assert_allclose(feats[i, :n], full[i][start[i]:start[i] + n], rtol=2e-4, atol=2e-4)
        checked += n
  assert checked > 0


@pytest.mark.parametrize("mode,k", [("sd", 1), ("sd", 3), ("ssd", 1), ("ssd", 3)])
def test_greedy_eagle_equals_ar_and_reads_the_targets_features(pair, recorded, mode, k):
  tcfg, tparams, dcfg, dparams = pair
  opts = DecodeOptions(max_new_tokens=14, ignore_eos=True)
  want = [r.token_ids for r in ARDecoder(tcfg, tparams).generate(PROMPTS, opts)]
  if mode == "sd":
    dec = SDDecoder(tcfg, tparams, dcfg, dparams, SpecOptions(k=k))
  else:
    dec = SSDDecoder(tcfg, tparams, dcfg, dparams, SpecOptions(k=k, fan_out=3, placement="devices"))
  res = dec.generate(PROMPTS, opts)
  assert [r.token_ids for r in res] == want
  _check_features(recorded, res, tcfg, tparams, dcfg.feature_layers, k)


@pytest.mark.parametrize("backup", ["fast", "ngram", "auto"])
def test_greedy_eagle_ssd_backups_and_fan_out_vectors(pair, backup):
  """Every miss backup and per-acceptance-length fan-outs (after a hit and after a miss) keep SSD-EAGLE exact."""
  tcfg, tparams, dcfg, dparams = pair
  opts = DecodeOptions(max_new_tokens=12, ignore_eos=True)
  want = [r.token_ids for r in ARDecoder(tcfg, tparams).generate(PROMPTS, opts)]
  spec = SpecOptions(k=2, fan_out=(4, 3, 2), fan_out_miss=(6, 2, 1), backup=backup, placement="devices")
  assert [r.token_ids for r in SSDDecoder(tcfg, tparams, dcfg, dparams, spec).generate(PROMPTS, opts)] == want


def test_eagle_draft_needs_a_matching_target(pair):
  tcfg, tparams, dcfg, dparams = pair
  other = tiny_config(vocab_size=64, n_layers=2)
  with pytest.raises(ValueError, match="layers"):
    SDDecoder(other, model.init_params(jax.random.key(0), other), dcfg, dparams, SpecOptions(k=2))


def _v4_pair():
  """Returns (cfg, target params, EAGLE cfg, EAGLE params) for the laws at T > 0: pairs.v4_pair's untied V=4 target (a
  tied one peaks) with an EAGLE draft whose head is draft_heads.V4_HEAD (shuffled, token 1 left out), the target's
  lm_head rows at init scale 0.3: a law flat enough for Saguaro's q' to differ from q. Under SSD_JAX_TEST_HEAD=real
  the same at a real draft's sizes (draft_heads: 49152 ids, a 16384-row head, the mass on LIVE), with the target's
  mass on LIVE[1], the id outside the head, cut to about 5% (draft_heads.outside_head_rare; 45% uncut, where a
  rejection's bonus was mostly that id and the cache served 0-2.8% of rows in three tokens)."""
  cfg = tiny_config(vocab_size=REAL_VOCAB if REAL else 4, d_model=16, head_dim=4, ffn_dim=24, n_layers=3,
                    tie_embeddings=False)
  tp = model.init_params(jax.random.key(11), cfg, scale=0.3)
  if REAL:
    tp = outside_head_rare(concentrate(tp, REAL_LIVE))
    dcfg, dp = _eagle(cfg, tp, real_head_ids(), seed=5, scale=0.5)
    return cfg, tp, dcfg, concentrate_eagle(dp)
  dcfg, dp = _eagle(cfg, tp, np.asarray(V4_HEAD), seed=5, scale=0.5)
  # The head is the target's untied lm_head at these rows (init scale 0.3): as flat as the embedding rows at 0.3 it
  # had before the draft read lm_head, which leaves both cache hits and misses at every temperature.
  return cfg, tp, dcfg, dp


@pytest.fixture(scope="module")
def v4():
  cfg, tp, dcfg, dp = _v4_pair()
  return cfg, tp, dcfg, dp, jax.device_get(tp)


LAW_SETTINGS = [(t, tp) for t in (0.5, 1.0, 1.5) for tp in (0.7, 1.0)]
LAW_RUNS = ([("ssd", "neural", t, tp) for t, tp in LAW_SETTINGS] + [("ssd", "fast", 1.0, 1.0)]
            + [("sd", None, t, tp) for t, tp in ((1.0, 1.0), (0.5, 0.7), (1.5, 1.0))]
            + [("ssd-processes", "neural", 1.5, 0.7)])
# The runs under the real head (a decode there costs 10-30x a row; draft_heads.LAW_ROWS = 500 rows).
REAL_RUNS = [("ssd", "neural", t, tp) for t, tp in ((1.0, 1.0), (0.5, 0.7), (1.5, 0.7))] + [
    ("sd", None, 1.0, 1.0), ("ssd-processes", "neural", 1.5, 0.7)]


@pytest.mark.parametrize("mode,backup,temperature,top_p", LAW_RUNS)
def test_eagle_sampled_decoding_follows_the_numpy_law(v4, mode, backup, temperature, top_p):
  """Tokens emitted through rounds with an EAGLE draft follow the target's law at T in {0.5, 1, 1.5} x top_p in
  {0.7, 1}: SSD at every setting (hits from draft_tree, misses from draft_propose as the neural backup, which is SD's
  proposal too), the fast backup, and SD itself at three. The joint law of the first three tokens from
  numpy_reference (3000 rows over 64 cells at 1e-4: detects w >= 0.18 with power 0.99, as
  test_sampled_decoding's). One run puts the draft in its own process, where q crosses the pipe over the head's
  rows. A draft law handed to the verifier without top-p or at another temperature than it was drawn at, or a head
  row taken for a token id, fails it (scripts/dev/mutation_run.py)."""
  import numpy_reference as ref
  from law_stats import chi2_pvalue
  if REAL and (mode, backup, temperature, top_p) not in REAL_RUNS:
    pytest.skip(f"the real head runs {REAL_RUNS}")
  cfg, tp, dcfg, dp, host = v4
  prompt = live([1, 2, 0])
  opts = DecodeOptions(max_new_tokens=3, temperature=temperature, top_p=top_p, ignore_eos=True,
                       seed=300 + LAW_RUNS.index((mode, backup, temperature, top_p)))
  if mode == "sd":
    res = generate(SDDecoder(cfg, tp, dcfg, dp, SpecOptions(k=2)), [prompt] * LAW_ROWS, opts)
    assert 0.1 < np.mean([r.stats.extra["acceptance_rate"] for r in res]) < 0.9
  else:
    placement = "processes" if mode == "ssd-processes" else "devices"
    if placement == "processes" and len(os.sched_getaffinity(0)) < 2:
      pytest.skip("needs two CPU cores")
    dec = SSDDecoder(cfg, tp, dcfg, dp, SpecOptions(k=2, fan_out=2, backup=backup, placement=placement))
    try:
      res = generate(dec, [prompt] * LAW_ROWS, opts)
    finally:
      dec.close()
    hits = np.mean([r.stats.extra["cache_hit_rate"] > 0 for r in res])
    # Rows served from the speculation cache and rows that missed every time. The real-sized pair hits in 39-82% of
    # rows (2.8% or none before draft_heads.outside_head_rare: a bonus outside the head is never cached).
    assert (0.3 if REAL else 0.1) <= hits < 0.9, hits
  law = ref.joint_law(host, cfg, prompt, 3, temperature, top_p, support=LIVE)
  assert chi2_pvalue(cells([r.token_ids for r in res]).ravel(), padded(law).ravel()) > 1e-4


def test_eagle_ssd_saguaro_tokens_served_from_the_cache_follow_the_numpy_law(v4):
  """SSD-EAGLE with Saguaro sampling where q' is far from q (C = 0.1 on the top 2 of the head's 3 tokens; fan-out 1
  plus the drafted token): tokens 4 to 6, emitted mostly from cached speculations, against the marginal of the numpy
  joint law of six tokens (3000 rows, 64 cells at 1e-4: detects w >= 0.18 with power 0.99). scripts/dev/mutation_run.py
  hands the verifier the EAGLE draft's plain q; this test fails."""
  import numpy_reference as ref
  from law_stats import chi2_pvalue
  cfg, tp, dcfg, dp, host = v4
  prompt = live([1, 2, 0])
  res = generate(SSDDecoder(cfg, tp, dcfg, dp, SpecOptions(k=2, fan_out=1, saguaro_c=0.1, placement="devices")),
                 [prompt] * LAW_ROWS, DecodeOptions(max_new_tokens=6, temperature=1.0, ignore_eos=True, seed=1))
  assert (0.3 if REAL else 0.2) < np.mean([r.stats.extra["cache_hit_rate"] for r in res]) < 0.9  # real: 0.42
  law = ref.joint_law(host, cfg, prompt, 6, 1.0, 1.0, support=LIVE).sum(axis=(0, 1, 2))
  assert chi2_pvalue(cells([r.token_ids for r in res], 3, start=3).ravel(), padded(law).ravel()) > 1e-4


@pytest.fixture(scope="module")
def agreeing_pair():
  """A V=8 target and an EAGLE draft that agrees with it often enough (about 1 draft in 3) for the replay test."""
  cfg = tiny_config(vocab_size=8, n_layers=4)
  tp = model.init_params(jax.random.key(2), cfg, scale=0.3)
  dcfg, dp = _eagle(cfg, tp, np.arange(8), seed=0, scale=0.1)
  return cfg, tp, dcfg, dp


REPLAY_PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 1, 2, 3], [1], [2, 3, 4, 5, 6]]


@pytest.mark.parametrize("mode,k,placement", [("sd", 1, None), ("sd", 3, None), ("ssd", 1, "devices"),
                                              ("ssd", 2, "devices"), ("ssd", 2, "processes")])
def test_greedy_eagle_rounds_equal_the_teacher_forced_replay(agreeing_pair, mode, k, placement):
  """Round for round, greedy decoding with an EAGLE draft accepts exactly what the teacher-forced replay of its
  training rollout predicts (ssd_jax.theory.acceptance.replay_eagle_rounds): the same rounds, accepted drafts and, for
  SSD, cache hits. A draft that misses the verify's features, reads them at the wrong positions, or pre-drafts SSD's
  outcomes from anything but its own activations (Figure 9) proposes other tokens and fails this."""
  from ssd_jax.theory import acceptance
  from ssd_jax.training.eagle_eval import answer_stats
  if placement == "processes" and len(os.sched_getaffinity(0)) < 2:
    pytest.skip("needs two CPU cores")
  cfg, tp, dcfg, dp = agreeing_pair
  opts = DecodeOptions(max_new_tokens=30, ignore_eos=True)
  if mode == "sd":
    res = SDDecoder(cfg, tp, dcfg, dp, SpecOptions(k=k)).generate(REPLAY_PROMPTS, opts)
  else:
    res = SSDDecoder(cfg, tp, dcfg, dp, SpecOptions(k=k, fan_out=2, backup="neural", placement=placement)).generate(
        REPLAY_PROMPTS, opts)
  total = 0
  for p, r in zip(REPLAY_PROMPTS, res):
    # The first token comes from the target's prefill; rounds draft the rest.
    top, _, _ = answer_stats(tp, cfg, dp, dcfg, p + r.token_ids[:1], r.token_ids[1:], 2 * k + 1, 3)
    rep = acceptance.replay_eagle_rounds(top, np.asarray(r.token_ids[1:]), k,
                                         None if mode == "sd" else (2,) * (k + 1))
    e = r.stats.extra
    assert (e["rounds"], e["drafts_accepted"]) == (rep["rounds"], rep["accepted"])
    if mode == "ssd":
      assert e["cache_hit_rate"] == pytest.approx(rep["hits"] / rep["hit_chances"], abs=1e-4)
    total += rep["accepted"]
  assert total >= 10  # the draft agrees often enough for the comparison to mean something


def test_sd_not_in_chunks_sizes_both_caches_for_a_round_a_call(pair, monkeypatch):
  """An EAGLE draft's SD rounds are not fused (it reads the verify's features), so the loop decides a round a call
  (DecodeOptions.sd_chunk's 8 notwithstanding) and both sides size their caches from that one decision: the draft's
  cache is the target's size, not one sized for chunks of 8 rounds the run never runs."""
  import cache_writes

  from ssd_jax.decode.base import cache_slots, run_lookaheads
  tcfg, tparams, dcfg, dparams = pair
  last = cache_writes.record_caches(monkeypatch)
  prompt, new, k = 40, 60, 3  # the text fills 100 of 128 slots: 37 slots for 8 rounds would need 256
  prompts = np.random.default_rng(0).integers(8, 64, (2, prompt)).tolist()
  SDDecoder(tcfg, tparams, dcfg, dparams, SpecOptions(k=k)).generate(
      prompts, DecodeOptions(max_new_tokens=new, ignore_eos=True))
  slots = {name: c.k[0].shape[1] for (name, _), c in last.items()}
  ahead = run_lookaheads(k, None, 1)
  assert slots["verify"] == cache_slots(prompt, new, ahead[0]) == 128
  assert slots["chain_after"] == cache_slots(prompt, new, ahead[1]) == slots["verify"], slots
