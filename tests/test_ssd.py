"""SSD: the tree (mask, positions), the speculation cache, greedy equality with AR, exactness at temperature 1."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ssd_jax.models import model
from ssd_jax.models.config import tiny_config
from ssd_jax.decode import ARDecoder, DecodeOptions, SpecOptions, SSDDecoder
from ssd_jax.decode.base import pad_prompts, run_lookaheads
from ssd_jax.decode.speculator import SpecCache, cached_tokens, find
from ssd_jax.decode.steps import draft_tree, pick_branch, prefill
from ssd_jax.models.kv_cache import KVCache

import cache_writes
from draft_heads import LAW_ROWS, LIVE, REAL, TINY_LIVE, generate, live, restrict_head
from law_stats import assert_joint_matches_target
from pairs import PROMPTS, two_stop_ids, v4_pair


@pytest.mark.parametrize("head", [False, True])
def test_tree_branches_equal_plain_forward(head):
  """Every branch's draft distributions equal a plain forward over that branch's own text (mask and RoPE right),
  and the fork's candidates are the top tokens there. With a head of 48 shuffled token ids, the laws are compared
  over the head's rows, and token ids (candidates, the drafted token left out) go through the test's own table."""
  cfg = tiny_config(vocab_size=64)
  params = model.init_params(jax.random.key(2), cfg, scale=0.3)
  ids = np.arange(64)
  if head:
    ids = np.random.default_rng(3).permutation(64)[:48]
    cfg, params = restrict_head(cfg, params, ids)
  k, f = 3, 2
  texts = [[5, 6, 7, 8], [9, 10]]  # committed text x_1..x_L per row (ragged)
  spec = np.asarray([[11, 12, 13], [14, 15, 16]], np.int32)
  # Prefill the draft with x_1..x_{L-1} (x_L is pending, as in the decoder).
  toks, lens = pad_prompts([t[:-1] for t in texts], bucket=8)
  cache = KVCache.init(cfg, 2, 128)
  _, cache = prefill(params, jnp.asarray(toks), jnp.asarray(lens), cache, cfg)
  last2 = jnp.asarray([t[-2:] for t in texts], jnp.int32)
  lengths = jnp.asarray([len(t) for t in texts], jnp.int32)
  cand, branch_j, tree_t, tree_q, _, _ = draft_tree(params, cache, None, last2, jnp.asarray(spec), lengths,
                                                    jax.random.key(0), jnp.float32(1.0), jnp.float32(1.0),
                                                    jnp.float32(1.0), cfg=cfg, k=k, fan_out=(f,) * (k + 1))
  cand, branch_j, tree_t, tree_q = (np.asarray(x) for x in (cand, branch_j, tree_t, tree_q))
  for r in range(2):
    glue = texts[r] + spec[r].tolist()
    full_g = np.asarray(jax.nn.softmax(model.forward_full(params, jnp.asarray([glue]), cfg)[0], -1))
    for n in range(len(branch_j)):
      j = int(branch_j[n])
      # Candidates: the top-F tokens after x_L, s_1..s_j, never the drafted token s_{j+1}.
      if j < k:
        assert cand[r, n] != spec[r, j]
      seq = texts[r] + spec[r, :j].tolist() + [int(cand[r, n])] + tree_t[r, n].tolist()
      probs = np.asarray(jax.nn.softmax(model.forward_full(params, jnp.asarray([seq]), cfg)[0], -1))
      start = len(texts[r]) + j  # position of the candidate token
      for d in range(k):  # both over the head's rows
        np.testing.assert_allclose(tree_q[r, n, d], probs[start + d], rtol=1e-4, atol=1e-6)
    # The fork picks the top-F of the glue distribution (drafted token excluded), as token ids.
    for j in range(k + 1):
      p = np.full(64, -2.0)
      p[ids] = full_g[len(texts[r]) - 1 + j]
      if j < k:
        p[spec[r, j]] = -1
      want = set(np.argsort(-p)[:f].tolist())
      assert set(cand[r, branch_j == j].tolist()) == want


def lookup(cand, branch_j, tt, tq, accept_len, bonus):
  """A round's lookup as it runs: the outcome found on the host, the hit's tokens there, its q where the cache lies."""
  cache = SpecCache(np.asarray(cand), np.asarray(branch_j), np.asarray(tt), tq)
  hit, branch = find(cache, np.asarray(accept_len), np.asarray(bonus))
  return hit, cached_tokens(cache, branch), pick_branch(tq, jnp.asarray(branch, jnp.int32))


def test_lookup_hits_and_misses():
  cand = jnp.asarray([[3, 4, 5, 6]])
  branch_j = jnp.asarray([0, 0, 1, 1])
  tt = jnp.arange(8).reshape(1, 4, 2)
  tq = jnp.arange(8 * 3, dtype=jnp.float32).reshape(1, 4, 2, 3)
  hit, toks, q = lookup(cand, branch_j, tt, tq, [1], [6])
  assert bool(hit[0]) and toks[0].tolist() == [6, 7] and np.array_equal(q[0], tq[0, 3])
  for acc, bonus in [(0, 6), (1, 3), (2, 5)]:  # key mismatch: wrong length, wrong token, length not cached
    hit, _, _ = lookup(cand, branch_j, tt, tq, [acc], [bonus])
    assert not bool(hit[0])


def test_lookup_serves_each_row_its_own_branch():
  """Rows of one batch hit different branches (and one misses): each row's tokens and q come from its own branch,
  never from another row's or from the branch another row hit."""
  rng = np.random.default_rng(0)
  cand = jnp.asarray([[3, 4, 5, 6], [1, 2, 4, 0], [7, 3, 1, 2]])
  branch_j = jnp.asarray([0, 0, 1, 1])
  tt = jnp.asarray(rng.integers(0, 8, (3, 4, 2)), jnp.int32)
  tq = jnp.asarray(rng.random((3, 4, 2, 5)), jnp.float32)
  hit, toks, q = lookup(cand, branch_j, tt, tq, [1, 0, 1], [6, 2, 3])
  assert np.asarray(hit).tolist() == [True, True, False]
  for row, branch in [(0, 3), (1, 1)]:
    assert np.array_equal(toks[row], tt[row, branch]) and np.array_equal(q[row], tq[row, branch])


@pytest.mark.parametrize("k,f", [(1, 1), (4, 3), (8, 2)])
@pytest.mark.parametrize("draft_kind", ["self", "perturbed", "unrelated"])
def test_greedy_ssd_equals_greedy_ar(tiny_pair, perturbed_draft, k, f, draft_kind):
  cfg, tp = tiny_pair
  if draft_kind == "self":  # all hits after the first round
    dcfg, dp = cfg, tp
  elif draft_kind == "perturbed":  # hits and misses
    dcfg, dp = cfg, perturbed_draft
  else:  # almost all misses
    dcfg = tiny_config(vocab_size=64, n_layers=1, d_model=16, head_dim=4, ffn_dim=24, head_vocab=50)
    dp = model.init_params(jax.random.key(8), dcfg, scale=0.3)
  opts = DecodeOptions(max_new_tokens=23, ignore_eos=True)
  ar = [r.token_ids for r in ARDecoder(cfg, tp).generate(PROMPTS, opts)]
  dec = SSDDecoder(cfg, tp, dcfg, dp, SpecOptions(k=k, fan_out=f))
  res = dec.generate(PROMPTS, opts)
  assert [r.token_ids for r in res] == ar
  assert dec.ddev.id not in dec.tdevs  # the draft really runs on its own device
  hit_rates = [r.stats.extra["cache_hit_rate"] for r in res]
  if draft_kind == "self":
    assert all(h == 1.0 for h in hit_rates)
  if draft_kind == "perturbed" and k == 4:
    assert 0 < np.mean(hit_rates) < 1


@pytest.mark.parametrize("saguaro_c", [1.0, 0.25])
def test_ssd_temperature_one_matches_target_joint_distribution(saguaro_c):
  """As for SD: tokens emitted through SSD rounds (hits and misses) follow the target's joint distribution,
  with plain sampling and with Saguaro sampling (the draft's top set down-weighted by C)."""
  cfg, tp, dcfg, dp = v4_pair()
  prompt = live([1, 2, 0])
  n = LAW_ROWS
  res = generate(SSDDecoder(cfg, tp, dcfg, dp, SpecOptions(k=1, fan_out=1, saguaro_c=saguaro_c)),
      [prompt] * n, DecodeOptions(max_new_tokens=4, temperature=1.0, ignore_eos=True, seed=4))
  hr = np.mean([r.stats.extra["cache_hit_rate"] for r in res])
  assert 0.2 < hr < 0.98  # both hit and miss rounds contribute
  assert_joint_matches_target(np.asarray([r.token_ids[:3] for r in res]), tp, cfg, prompt)


@pytest.mark.parametrize("k,draft_kind", [(4, "self"), (2, "perturbed")])
def test_greedy_ssd_stops_at_the_first_of_several_eos_ids(tiny_pair, perturbed_draft, k, draft_kind):
  cfg, tp = tiny_pair
  stops, want = two_stop_ids(cfg, tp)
  dp = tp if draft_kind == "self" else perturbed_draft
  res = SSDDecoder(cfg, tp, cfg, dp, SpecOptions(k=k, fan_out=2)).generate(
      PROMPTS, DecodeOptions(max_new_tokens=15, eos_id=stops))
  assert [r.token_ids for r in res] == want


def test_ssd_bad_input(tiny_pair):
  cfg, tp = tiny_pair
  with pytest.raises(ValueError, match="fan-out"):
    SSDDecoder(cfg, tp, cfg, tp, SpecOptions(k=2, fan_out=0))
  with pytest.raises(ValueError, match="K"):
    SSDDecoder(cfg, tp, cfg, tp, SpecOptions(k=0))


@pytest.mark.parametrize("backup", ["fast", "ngram", "auto"])
@pytest.mark.parametrize("fan_out,fan_out_miss", [(3, None), ((4, 3, 2, 2, 4), (9, 3, 1, 1, 1))])
def test_greedy_ssd_backups_and_fan_out_vectors(tiny_pair, perturbed_draft, backup, fan_out, fan_out_miss):
  cfg, tp = tiny_pair
  dp = perturbed_draft
  opts = DecodeOptions(max_new_tokens=23, ignore_eos=True)
  ar = [r.token_ids for r in ARDecoder(cfg, tp).generate(PROMPTS, opts)]
  dec = SSDDecoder(cfg, tp, cfg, dp, SpecOptions(k=4, fan_out=fan_out, fan_out_miss=fan_out_miss, backup=backup))
  res = dec.generate(PROMPTS, opts)
  assert [r.token_ids for r in res] == ar
  used = res[0].stats.extra["backups_used"]
  if backup != "auto":
    assert used[backup] >= 1 and sum(used.values()) == used[backup]


@pytest.mark.parametrize("backup", ["fast", "ngram"])
def test_ssd_temperature_one_exact_with_fast_backups(backup):
  """Fast backups' tokens are not drawn from the draft: they must still give the target's distribution."""
  # The fast backup drafts uniformly over the vocabulary: on the real head's 49152 ids every draft would be rejected.
  real = REAL and backup != "fast"
  cfg, tp, dcfg, dp = v4_pair(real=real)
  ids = LIVE if real else TINY_LIVE
  prompt = [ids[t] for t in (1, 2, 0, 1, 2)]
  res = generate(SSDDecoder(cfg, tp, dcfg, dp, SpecOptions(k=2, fan_out=1, backup=backup)),
      [prompt] * LAW_ROWS, DecodeOptions(max_new_tokens=4, temperature=1.0, ignore_eos=True, seed=6))
  # The first speculation is always the backup's, so count the others: misses after the first round were served
  # by this backup alone, and its drafts were accepted (emitted as drafts, not only replaced by residuals).
  used = res[0].stats.extra["backups_used"]
  assert used[backup] >= 2 and sum(used.values()) == used[backup]
  assert 0.05 < np.mean([r.stats.extra["acceptance_rate"] for r in res]) < 0.95
  assert_joint_matches_target(np.asarray([r.token_ids[:3] for r in res]), tp, cfg, prompt, ids=ids)


def test_ngram_propose():
  from ssd_jax.decode.backup import ngram_propose
  assert ngram_propose([1, 2, 3, 9, 1, 2, 3], 3) == [9, 1, 2]   # longest suffix 1 2 3 seen before -> 9 1 2
  assert ngram_propose([5, 6, 7], 2) == [7, 7]                   # no match: repeat the last token
  assert ngram_propose([4, 8, 4], 3) == [8, 4, 4]                # unigram match, padded


def test_theorem17_choice():
  from ssd_jax.theory.timing_model import critical_batch, neural_backup_better
  # A cheap, accurate neural backup wins at batch 1 and loses at a large batch.
  assert neural_backup_better(1, 0.8, 3.0, 3.0, 0.3)
  assert not neural_backup_better(256, 0.8, 3.0, 3.0, 0.3)
  b_star = critical_batch(0.8, 3.0, 3.0, 0.3)
  assert 1 < b_star < 256
  assert neural_backup_better(int(b_star) - 1 or 1, 0.8, 3.0, 3.0, 0.3)
  assert not neural_backup_better(int(b_star) + 1, 0.8, 3.0, 3.0, 0.3)


def test_saguaro_rescale_moves_residual_mass_onto_the_cached_set():
  from ssd_jax.decode import sampling
  rng = np.random.default_rng(0)
  q = jax.nn.softmax(jnp.asarray(rng.normal(size=50) * 2, jnp.float32))
  p = jax.nn.softmax(jnp.asarray(np.asarray(jnp.log(q)) + rng.normal(size=50) * 0.7, jnp.float32))
  top = np.argsort(-np.asarray(q))[:4]
  mass = []
  for c in (1.0, 0.5, 0.25):
    qc = np.asarray(sampling.saguaro_rescale(q, c, 4))
    assert abs(qc.sum() - 1) < 1e-5
    resid = np.maximum(np.asarray(p) - qc, 0)
    mass.append(resid[top].sum() / resid.sum())
  assert mass[0] < mass[1] < mass[2]  # the residual (where the bonus comes from) concentrates on cached tokens
  onehot = jax.nn.one_hot(3, 50)
  np.testing.assert_array_equal(np.asarray(sampling.saguaro_rescale(onehot, 0.25, 4)), np.asarray(onehot))


def test_bonus_rank():
  from ssd_jax.decode.steps import bonus_rank
  cfg = tiny_config(vocab_size=8)
  params = {}
  g = jnp.asarray([[[0.1, 0.4, 0.2, 0.3, 0, 0, 0, 0], [0.5, 0.1, 0.1, 0.3, 0, 0, 0, 0]]])  # K = 1
  spec = jnp.asarray([[1]])
  # k = 0: drafted token 1 excluded, so token 3 is the top candidate; token 2 second.
  assert bonus_rank(params, g, spec, jnp.asarray([0]), jnp.asarray([3]), cfg=cfg).tolist() == [1]
  assert bonus_rank(params, g, spec, jnp.asarray([0]), jnp.asarray([2]), cfg=cfg).tolist() == [2]
  # k = K: nothing excluded.
  assert bonus_rank(params, g, spec, jnp.asarray([1]), jnp.asarray([3]), cfg=cfg).tolist() == [2]


def test_choose_backup_from_tally():
  from ssd_jax.decode.backup import choose_backup, new_tally, record_round
  t = new_tally()
  assert choose_backup("ngram", t, 1) == "ngram"
  assert choose_backup("auto", t, 1) == "neural"  # no statistics yet
  live, seqs, before = np.ones(4, bool), [[0] * 13] * 4, [10] * 4  # every row committed 3 tokens
  record_round(t, "neural", live, seqs, before)  # the first round: no lookup, so neither a hit nor a miss
  assert (t["hit_rows"], t["miss_rows"], t["neural_rows"], t["neural_tokens"]) == (0, 0, 4, 12)
  record_round(t, "neural", live, seqs, before, row_hit=np.array([True, True, True, False]))  # one row missed
  assert (t["hit_rows"], t["hit_tokens"], t["miss_rows"], t["neural_rows"]) == (3, 9, 1, 5)
  record_round(t, "fast", live, seqs, before, row_hit=np.array([True, False, True, True]))  # a miss, not neural
  assert (t["hit_rows"], t["miss_rows"], t["neural_rows"]) == (6, 2, 5)
  record_round(t, "fast", np.array([True, False, True, True]), seqs, before, row_hit=np.ones(4, bool))
  assert t["hit_rows"] == 9  # a finished row counts no more
  # p_hit 0.8, 3 tokens a hit and a neural row, one neural call of 0.3 verifies per miss (whole batch): worth it for
  # one row; not for 256, whose rounds nearly all have a miss somewhere.
  t.update(hit_rows=16, hit_tokens=48, miss_rows=4, neural_rows=4, neural_tokens=12, neural_calls=4,
           neural_s=0.3 * 4, verify_s=2.0, verify_n=2)
  assert choose_backup("auto", t, 1) == "neural"
  assert choose_backup("auto", t, 256) == "fast"


def test_auto_backup_gathers_each_statistic_twice_before_it_chooses():
  """'auto' keeps the neural backup until hits, neural rows and verifies are each counted twice and a neural call
  timed: at those counts the statistics choose (fast, for 256 rows), any one of them a count short keeps neural
  where the same rates would choose fast."""
  from ssd_jax.decode.backup import choose_backup, new_tally
  t = dict(new_tally(), hit_rows=2, hit_tokens=6, miss_rows=2, neural_rows=2, neural_tokens=3, neural_calls=1,
           neural_s=0.3, verify_s=2.0, verify_n=2)
  assert choose_backup("auto", t, 256) == "fast"
  assert choose_backup("auto", dict(t, hit_rows=3, hit_tokens=9, neural_rows=3, neural_tokens=4), 256) == "fast"
  for short in (dict(hit_rows=1, hit_tokens=3), dict(neural_rows=1, neural_tokens=2), dict(verify_n=1, verify_s=1.0),
                dict(neural_calls=0)):
    assert choose_backup("auto", dict(t, **short), 256) == "neural", short


def test_auto_backup_choice_falls_with_the_batch_at_theorem_17s_critical_batch():
  """The neural call's time is per call, not per row: at 8 rows a call of 0.3 verifies (4 calls for 32 neural rows)
  still costs 0.3 a miss, so the choice turns at the critical batch b* of Theorem 17 (about 3.2 here), where a time
  divided by rows (0.0375) would keep the neural backup far past it."""
  from ssd_jax.decode.backup import choose_backup, new_tally
  from ssd_jax.theory.timing_model import critical_batch
  t = new_tally()
  t.update(hit_rows=160, hit_tokens=480, miss_rows=40, neural_rows=32, neural_tokens=96, neural_calls=4,
           neural_s=1.2, verify_s=2.0, verify_n=2)
  b_star = critical_batch(0.8, 3.0, 3.0, 0.3)
  assert 2 < b_star < 4
  assert [choose_backup("auto", t, b) for b in (1, 2, 4, 8, 16)] == ["neural", "neural", "fast", "fast", "fast"]
  assert critical_batch(0.8, 3.0, 3.0, 0.3 / 8) > 16  # what the per-row time would have said


def test_auto_backup_tally_of_a_batch_run_counts_rows_and_calls(tiny_pair, perturbed_draft):
  """A batch of 4 decoded with backup='auto': the tally's hits and misses are the per-row lookups the draft counted
  (each live row of each lookup once), and its neural calls the neural backups served, whatever the batch."""
  cfg, tp = tiny_pair
  dec = SSDDecoder(cfg, tp, cfg, perturbed_draft, SpecOptions(k=2, fan_out=2, backup="auto"))
  opts = DecodeOptions(max_new_tokens=23, ignore_eos=True)
  res = dec.generate(PROMPTS, opts)
  assert [r.token_ids for r in res] == [r.token_ids for r in ARDecoder(cfg, tp).generate(PROMPTS, opts)]
  side = dec.draft.side
  t = side.tally
  assert t["hit_rows"] == side.hits.sum() and t["hit_rows"] + t["miss_rows"] == side.rounds_by_len.sum() > 0
  assert t["neural_calls"] == side.backups_used["neural"] >= 1
  assert t["neural_rows"] >= len(PROMPTS)  # the first round's rows, all served by the neural backup


def test_a_run_writes_within_its_lookahead(tiny_pair, perturbed_draft, monkeypatch):
  """Every slot a run writes lies within its lookahead past the text (run_lookaheads: the verify's K+2 on the target,
  the tree's on the draft; what cache_slots and the memory check size caches with). Rows that end early keep
  verifying until the last is done; at 6 new tokens the target's writes reach K+2 exactly."""
  cfg, tp = tiny_pair
  last = cache_writes.record_caches(monkeypatch)
  SSDDecoder(cfg, tp, cfg, perturbed_draft, SpecOptions(k=2, fan_out=2)).generate(
      cache_writes.prompts(cfg.vocab_size), DecodeOptions(max_new_tokens=6, ignore_eos=True))
  past, ahead = cache_writes.slots_past_text(last, 6), run_lookaheads(2, (2, 2, 2))
  assert sorted(past) == [0, 1] and all(0 < past[s] <= ahead[s] for s in past), (past, ahead)


def test_merge_rows_keeps_each_rows_tokens_with_their_q():
  """A round where some rows hit: a row that hit is served its cached tokens with the cached q they were drawn from,
  a row that missed the backup's tokens with the backup's q (the verifier's ratio test needs each token's own q;
  the end-to-end laws barely see a swap, since the backup's first q equals the cached one on the same text)."""
  from ssd_jax.decode.steps import merge_rows
  hit = jnp.asarray([True, False, True])
  a_t, b_t = jnp.arange(6).reshape(3, 2), 10 + jnp.arange(6).reshape(3, 2)
  a_q = jax.nn.softmax(jnp.arange(24, dtype=jnp.float32).reshape(3, 2, 4))
  b_q = jnp.full((3, 2, 4), 0.25)
  tok, q = (np.asarray(x) for x in merge_rows(hit, a_t, a_q, b_t, b_q))
  np.testing.assert_array_equal(tok, [[0, 1], [12, 13], [4, 5]])
  for row, src in enumerate([a_q, b_q, a_q]):
    np.testing.assert_array_equal(q[row], np.asarray(src[row]))
