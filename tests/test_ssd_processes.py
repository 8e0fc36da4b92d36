"""SSD with the draft side in its own process on its own cores (decode/draft_process.py): same tokens, same
distribution, and the same samples for a seed as with the draft on its own device."""
import os

import jax
import numpy as np
import pytest

from ssd_jax.models import model
from ssd_jax.models.config import tiny_config
from ssd_jax.decode import ARDecoder, DecodeOptions, SpecOptions, SSDDecoder
from ssd_jax.decode.draft_process import split_cores

from draft_heads import (LAW_ROWS, REAL, REAL_LIVE, REAL_VOCAB, V4_HEAD, concentrate, generate, live, real_head_ids,
                         restrict_head)
from law_stats import assert_joint_matches_target
from pairs import PROMPTS, perturbed, two_stop_ids

pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPU cores")


def test_split_greedy_equals_ar(tiny_pair, cut_head_draft):
  """Token for token equal to AR, batch of ragged prompts, with a reduced-vocabulary draft: cache hits travel over
  its head vocabulary, rounds with the n-gram backup over the full vocabulary (an n-gram token may lie outside it).
  (The neural backup's compaction is covered by the temperature-1 test below.)"""
  cfg, tp = tiny_pair
  backup = "ngram"
  dcfg, dp = cut_head_draft
  opts = DecodeOptions(max_new_tokens=21, ignore_eos=True)
  want = [r.token_ids for r in ARDecoder(cfg, tp).generate(PROMPTS, opts)]
  dec = SSDDecoder(cfg, tp, dcfg, dp, SpecOptions(k=3, fan_out=(3, 2, 2, 3), backup=backup, placement="processes"))
  try:
    affinity = os.sched_getaffinity(0)
    res = dec.generate(PROMPTS, opts)
    assert os.sched_getaffinity(0) == affinity  # the caller's affinity is restored
    assert [r.token_ids for r in res] == want
    ex = res[0].stats.extra
    assert ex["placement"]["kind"] == "processes"
    assert set(ex["placement"]["target_cores"]).isdisjoint(ex["placement"]["draft_cores"])  # what it reports;
    # tests/test_threads.py reads from /proc where each side's threads may run, mid-run
    assert ex["backups_used"][backup] >= 1
    assert ex["cache_hit_rate"] > 0  # both kinds of round happened
    assert ex["speculation_cache_bytes"] >= 4 * len(PROMPTS) * 10 * 3 * 40  # 10 branches x K=3 x 40 head rows
    # At temperature 0 no law crosses: the cache's guesses and tokens (10 branches x K=3), and a miss's tokens.
    assert 4 * len(PROMPTS) * 10 * 3 <= ex["bytes_per_round"]["draft_to_target"] < 4 * len(PROMPTS) * 3 * 40
    # Where the target's idle time went, part by part; the draft side's phases are its own (mostly hidden).
    parts, phases = ex["round_parts_seconds"], ex["draft_phase_seconds"]
    assert sum(parts.values()) == pytest.approx(ex["target_idle_seconds"], abs=2e-3)
    assert parts["backup_wait"] > 0 and parts["lookup"] > 0 and min(parts.values()) >= 0
    assert parts["cache_wait"] + parts["backup_wait"] == pytest.approx(ex["draft_wait_seconds"], abs=2e-3)
    assert set(phases) == {"commit", "tree_wait", "send", "lookup", "backup", "serve"} and min(phases.values()) >= 0
    assert phases["backup"] > 0 and phases["lookup"] > 0
    assert 0 < ex["hit_rounds"] < ex["loop_rounds"]
    # A second call reuses the same draft process.
    assert [r.token_ids for r in dec.generate(PROMPTS[:2], opts)] == want[:2]
    # The draft process stops its rows where the target does, at the first of several stop ids.
    stops, cut = two_stop_ids(cfg, tp)
    assert [r.token_ids for r in dec.generate(PROMPTS, DecodeOptions(max_new_tokens=15, eos_id=stops))] == cut
  finally:
    dec.close()


def test_split_temperature_one_matches_target_joint_distribution():
  """Hits, neural-backup misses, and q compacted to the draft's head for the pipe and scattered back on the target's
  side: still the target's distribution. The head is draft_heads.V4_HEAD (shuffled, token 1 left out: only the
  residual emits it), so a row taken for a token id on either side of the pipe changes the law."""
  cfg = tiny_config(vocab_size=REAL_VOCAB if REAL else 4, d_model=16, head_dim=4, ffn_dim=24,
                    tie_embeddings=not REAL)
  tp = model.init_params(jax.random.key(11), cfg, scale=0.5)
  if REAL:  # draft_heads: 49152 ids, a shuffled 16384-row head, the mass on LIVE (untied: concentrate's LM head)
    tp = concentrate(tp, REAL_LIVE)
    dcfg, dp = restrict_head(cfg, concentrate(perturbed(tp, 0.5, 5), REAL_LIVE), real_head_ids())
  else:
    dcfg, dp = restrict_head(cfg, perturbed(tp, 0.5, 5), V4_HEAD)
  prompt = live([1, 2, 0])
  dec = SSDDecoder(cfg, tp, dcfg, dp, SpecOptions(k=1, fan_out=1, placement="processes"))
  try:
    res = generate(dec, [prompt] * LAW_ROWS, DecodeOptions(max_new_tokens=4, temperature=1.0, ignore_eos=True, seed=4))
  finally:
    dec.close()
  hr = np.mean([r.stats.extra["cache_hit_rate"] for r in res])
  # At temperature 1 the cache's laws cross: at least one law over the draft's head a row per round.
  assert res[0].stats.extra["bytes_per_round"]["draft_to_target"] >= 4 * LAW_ROWS * dcfg.out_vocab
  assert 0.05 < hr < 0.98  # both hit and miss rounds contribute (thousands of each)
  assert_joint_matches_target(np.asarray([r.token_ids[:3] for r in res]), tp, cfg, prompt)


def test_split_cores_validation():
  cores = sorted(os.sched_getaffinity(0))
  t, d = split_cores()
  assert t and d and not set(t) & set(d) and sorted(t + d) == cores
  with pytest.raises(ValueError, match="disjoint"):
    split_cores([cores[0]], [cores[0]])
  with pytest.raises(ValueError, match="not usable"):
    split_cores([cores[0]], [10_000])
  with pytest.raises(ValueError, match="both"):
    split_cores([cores[0]], None)


def test_same_seed_same_samples_in_both_placements():
  """The draft side is one object in either placement (same keys, same backups): at temperature 1, with cache hits
  and misses, a seed draws the same tokens with the draft on its own device and in its own process."""
  from ssd_jax import api
  pipe = api.load_tiny()
  prompts = ["Say hi.", "Write one line about the sea", "abc"]
  got, hit_rates = {}, {}
  for placement in ("devices", "processes", "devices@4"):
    pipe.ssd_placement = placement.split("@")[0]
    spec = pipe.spec_options(k=2, fan_out=2)
    try:
      res = pipe.generate(prompts, mode="ssd", max_new_tokens=20, temperature=1.0, ignore_eos=True, spec=spec,
                          seed=4 if "@" in placement else 3)
    finally:
      pipe.decoder("ssd", spec).close()
    got[placement] = [g.token_ids for g in res]
    hit_rates[placement] = np.mean([g.stats["cache_hit_rate"] for g in res])
  assert 0 < hit_rates["devices"] < 1  # served from the cache and from the backup
  assert got["processes"] == got["devices"]
  assert got["devices@4"] != got["devices"]  # the tokens are samples: another seed draws others
