"""Speculative decoding: greedy equality with AR, end-to-end distribution at temperature 1, bad input."""
import jax
import numpy as np
import pytest

from ssd_jax.models import model
from ssd_jax.models.config import tiny_config
from ssd_jax.decode import ARDecoder, DecodeOptions, SDDecoder, SpecOptions

from draft_heads import LAW_ROWS, generate, live, restrict_head
from law_stats import assert_joint_matches_target
from pairs import PROMPTS, perturbed, two_stop_ids, v4_pair


@pytest.mark.parametrize("k", [1, 4, 8])
@pytest.mark.parametrize("draft_kind", ["self", "perturbed", "unrelated"])
def test_greedy_sd_equals_greedy_ar(tiny_pair, k, draft_kind):
  cfg, tp = tiny_pair
  if draft_kind == "self":
    dcfg, dp = cfg, tp
  elif draft_kind == "perturbed":
    dcfg, dp = cfg, perturbed(tp, 0.08, 1)
  else:
    dcfg = tiny_config(vocab_size=64, n_layers=1, d_model=16, head_dim=4, ffn_dim=24)
    dp = model.init_params(jax.random.key(8), dcfg, scale=0.3)
  opts = DecodeOptions(max_new_tokens=23, ignore_eos=True)
  ar = [r.token_ids for r in ARDecoder(cfg, tp).generate(PROMPTS, opts)]
  sd = SDDecoder(cfg, tp, dcfg, dp, SpecOptions(k=k)).generate(PROMPTS, opts)
  assert [r.token_ids for r in sd] == ar
  rates = [r.stats.extra["acceptance_rate"] for r in sd]
  if draft_kind == "self":
    assert all(r == 1.0 for r in rates)
    assert all(r.stats.target_forwards == 1 + -(-22 // (k + 1)) for r in sd)
  if draft_kind == "perturbed" and k == 4:
    assert 0 < np.mean(rates) < 1  # rows accept different lengths: rollback is exercised


def test_greedy_sd_with_reduced_vocab_draft_and_eos(tiny_pair):
  cfg, tp = tiny_pair
  # The target, perturbed, cut to a shuffled head of 40 tokens: it agrees often enough for accepted drafts to matter.
  dcfg, dp = restrict_head(cfg, perturbed(tp, 0.06, 1), np.random.default_rng(0).permutation(64)[:40])
  ar = ARDecoder(cfg, tp).generate(PROMPTS, DecodeOptions(max_new_tokens=15, ignore_eos=True))
  eos = ar[0].token_ids[5]
  opts = DecodeOptions(max_new_tokens=15, eos_id=eos)
  want = [r.token_ids for r in ARDecoder(cfg, tp).generate(PROMPTS, opts)]
  res = SDDecoder(cfg, tp, dcfg, dp, SpecOptions(k=3)).generate(PROMPTS, opts)
  assert [r.token_ids for r in res] == want
  assert 0 < np.mean([r.stats.extra["acceptance_rate"] for r in res]) < 1


@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize("draft_kind", ["self", "perturbed"])
def test_greedy_sd_stops_at_the_first_of_several_eos_ids(tiny_pair, k, draft_kind):
  cfg, tp = tiny_pair
  stops, want = two_stop_ids(cfg, tp)
  opts = DecodeOptions(max_new_tokens=15, eos_id=stops)
  assert [r.token_ids for r in ARDecoder(cfg, tp).generate(PROMPTS, opts)] == want
  dp = tp if draft_kind == "self" else perturbed(tp, 0.08, 1)
  assert [r.token_ids for r in SDDecoder(cfg, tp, cfg, dp, SpecOptions(k=k)).generate(PROMPTS, opts)] == want


def test_sd_temperature_one_matches_target_joint_distribution():
  """Tokens 2 and 3 (emitted by speculation rounds, not prefill) jointly follow the target's own distribution.

  V=4, one prompt repeated over 3000 rows (independent per-row randomness); the exact target joint of the first
  three tokens is enumerated from full forwards. Chi-square over the 64 cells at false-alarm rate 1e-4.
  """
  cfg, tp, dcfg, dp = v4_pair()
  prompt = live([1, 2, 0])
  n = LAW_ROWS
  res = generate(SDDecoder(cfg, tp, dcfg, dp, SpecOptions(k=2)),
                 [prompt] * n, DecodeOptions(max_new_tokens=3, temperature=1.0, ignore_eos=True, seed=3))
  seqs = np.asarray([r.token_ids for r in res])
  assert 0 < np.mean([r.stats.extra["acceptance_rate"] for r in res]) < 1
  assert_joint_matches_target(seqs, tp, cfg, prompt)


def test_sd_bad_input(tiny_pair):
  cfg, tp = tiny_pair
  with pytest.raises(ValueError, match="K"):
    SDDecoder(cfg, tp, cfg, tp, SpecOptions(k=0))
  with pytest.raises(ValueError, match="K=200 needs"):  # tiny context is 512 tokens
    SDDecoder(cfg, tp, cfg, tp, SpecOptions(k=200)).generate([[1] * 100], DecodeOptions(max_new_tokens=250))
  other = tiny_config(vocab_size=65)
  line = "draft has a vocabulary of 65 tokens, the target 64; a draft must share the target's tokenizer"
  with pytest.raises(ValueError, match=f"^{line}$"):
    SDDecoder(cfg, tp, other, model.init_params(jax.random.key(0), other), SpecOptions(k=2))


def test_a_draft_of_another_vocabulary_reads_one_line_wherever_it_is_paired(tiny_pair):
  """One check of the pair's vocabulary (config.check_same_vocabulary): the decoders and a Pipeline built by hand
  say the same line (the Pipeline with the draft's path)."""
  from ssd_jax.api import LoadedModel, Pipeline
  from ssd_jax.decode import SSDDecoder
  cfg, tp = tiny_pair
  other = tiny_config(vocab_size=65)
  op = model.init_params(jax.random.key(0), other)
  tail = "has a vocabulary of 65 tokens, the target 64; a draft must share the target's tokenizer"
  with pytest.raises(ValueError, match=f"^draft {tail}$"):
    SSDDecoder(cfg, tp, other, op, SpecOptions(k=2))
  with pytest.raises(ValueError, match=f"^draft /d/x {tail}$"):
    Pipeline(LoadedModel(cfg, tp, "/t"), None, LoadedModel(other, op, "/d/x"))


@pytest.mark.parametrize("decoder", ["sd", "ssd"])
def test_a_target_with_a_reduced_head_is_rejected(tiny_pair, decoder):
  """verify indexes p by token id and draws the bonus over p's rows: a target whose head holds only some tokens
  would accept and emit the wrong ones, so it is refused up front. SD never reads the fan-out: a draft with a small
  head is no reason to refuse it."""
  from ssd_jax.decode import SSDDecoder
  cfg, tp = tiny_pair
  rcfg, rp = restrict_head(cfg, tp, np.random.default_rng(1).permutation(64)[:40])
  make = SDDecoder if decoder == "sd" else SSDDecoder
  with pytest.raises(ValueError, match="reduced head"):
    make(rcfg, rp, cfg, tp, SpecOptions(k=2, fan_out=1))
  small, sp = restrict_head(cfg, tp, (5, 1, 2))
  if decoder == "sd":
    SDDecoder(cfg, tp, small, sp, SpecOptions(k=2, fan_out=3))
  else:
    with pytest.raises(ValueError, match="fan-out"):
      SSDDecoder(cfg, tp, small, sp, SpecOptions(k=2, fan_out=3))


def test_acceptance_statistics_count_tried_drafts():
  """Rounds accepting 2, 0 and 1 of K=2 drafts: 3 of 6 drafts accepted, but only 5 tried (a rejection ends a round)."""
  from ssd_jax.decode.base import SpecBook
  book = SpecBook([[5, 6]], np.array([7]), DecodeOptions(max_new_tokens=20), k=2, now=0.0)
  for acc in (2, 0, 1):
    book.commit(np.array([acc]), np.array([9]), np.array([[8, 8]]), now=1.0)
  s = book.results("sd", 0.1, 0.0, lambda i: {})[0].stats.extra
  assert s["rounds"] == 3 and s["acceptance_rate"] == 0.5
  assert (s["drafts_tried"], s["drafts_accepted"]) == (5, 3) and s["per_token_acceptance"] == 0.6
  assert s["per_position_acceptance"] == pytest.approx([2 / 3, 0.5], abs=1e-4)
