"""Off-the-shelf drafts (issue 41 item 5): a same-family model written as a Hugging Face directory or a GGUF
(tests/model_writers.py) runs as the standalone draft kind, with its full vocabulary or a head cut at load; SD and
SSD stay exact with it, and a draft of another vocabulary is refused in one line."""
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from ssd_jax import api
from ssd_jax.models import drafts, model
from ssd_jax.models.config import tiny_config
from ssd_jax.decode import ARDecoder, DecodeOptions, SDDecoder, SpecOptions, SSDDecoder
from ssd_jax.models.families import CheckpointError
from ssd_jax.models.tokenizer import byte_level_tokenizer

from draft_heads import LAW_ROWS, REAL, REAL_LIVE, V4_HEAD, concentrate, generate, live, real_head_ids
from law_stats import assert_rows_follow_their_laws
from model_writers import write_gguf, write_hf_dir
from pairs import LAW_PROMPT, PROMPTS, perturbed, v4_pair
from tokenizer_writers import byte_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEAD48_COUNTS = np.random.default_rng(8).permutation(64)  # token frequencies whose top 48 are a shuffled non-prefix


def _write(tmp, fmt, cfg, params, name="draft"):
  """Writes `params` as a Hugging Face directory or a llama GGUF under `tmp`; returns its path."""
  if fmt == "hf":
    d = tmp / name
    d.mkdir()
    return write_hf_dir(d, cfg, params)
  path = str(tmp / f"{name}.gguf")
  write_gguf(path, cfg, params)
  return path


@pytest.fixture(scope="module")
def pair(tmp_path_factory, tiny_pair, perturbed_draft):
  """A V=64 target, AR's greedy tokens, and a perturbed copy of it (the same family) written as HF and GGUF."""
  cfg, tp = tiny_pair
  dp = jax.device_get(perturbed_draft)
  tmp = tmp_path_factory.mktemp("offshelf")
  paths = {fmt: _write(tmp, fmt, cfg, dp) for fmt in ("hf", "gguf")}
  want = [r.token_ids for r in ARDecoder(cfg, tp).generate(PROMPTS, DecodeOptions(max_new_tokens=17,
                                                                                     ignore_eos=True))]
  return cfg, tp, paths, want


def test_head_cut_at_load_is_the_most_frequent_tokens_in_order(pair):
  """The head's rows: the kept (special) tokens, then the most frequent by the counts, most frequent first; the
  embedding stays whole and the head is the model's own rows, so the draft's logits over its head are the full
  model's logits at those ids."""
  cfg, _, paths, _ = pair
  full_cfg, full = drafts.load_draft(paths["hf"], cfg)
  dcfg, dp = drafts.load_draft(paths["hf"], cfg, head_vocab=48, head_counts=HEAD48_COUNTS)
  want = drafts.choose_head(64, 48, HEAD48_COUNTS)
  assert list(want) == list(np.argsort(-HEAD48_COUNTS, kind="stable")[:48])
  np.testing.assert_array_equal(np.asarray(dp["head_ids"]), want)
  np.testing.assert_array_equal(np.asarray(dp["vocab_map"])[want], np.arange(48))  # each head token's row
  assert dcfg.head_vocab == 48 and dcfg.full_embed and dp["embed"].shape == (64, cfg.d_model)
  assert sorted(want) != list(range(48))
  tokens = np.asarray([[5, 9, 60, 61, 2]], np.int32)  # 60/61 may lie outside the head: still read as themselves
  np.testing.assert_allclose(np.asarray(model.forward_full(dp, tokens, dcfg)),
                             np.asarray(model.forward_full(full, tokens, full_cfg))[..., want], rtol=1e-5, atol=1e-5)
  assert list(drafts.choose_head(10, 4, None, keep=[9, 7])) == [7, 9, 0, 1]  # kept first, then lower ids
  with pytest.raises(ValueError, match="must be in \\(2, 10\\]"):
    drafts.choose_head(10, 2, None, keep=[9, 7])


CASES = [  # (format, head, mode, SpecOptions)
    ("hf", None, "sd", dict(k=3)),
    ("gguf", 48, "sd", dict(k=4)),
    ("hf", 48, "ssd", dict(k=3, fan_out=(3, 2, 2, 3), backup="neural")),
    ("gguf", None, "ssd", dict(k=2, fan_out=2, backup="fast")),
    ("gguf", 48, "ssd", dict(k=3, fan_out=(3, 2, 2, 3), backup="ngram", placement="processes")),
    ("hf", 48, "ssd", dict(k=2, fan_out=2, backup="neural", placement="processes")),
]


@pytest.mark.parametrize("fmt,head,mode,spec", CASES)
def test_greedy_sd_and_ssd_with_an_off_the_shelf_draft_equal_ar(pair, fmt, head, mode, spec):
  cfg, tp, paths, want = pair
  if spec.get("placement") == "processes" and len(os.sched_getaffinity(0)) < 2:
    pytest.skip("needs two CPU cores")
  dcfg, dp = drafts.load_draft(paths[fmt], cfg, head_vocab=head, head_counts=HEAD48_COUNTS if head else None)
  dec = (SDDecoder if mode == "sd" else SSDDecoder)(cfg, tp, dcfg, dp, SpecOptions(**spec))
  try:
    res = dec.generate(PROMPTS, DecodeOptions(max_new_tokens=17, ignore_eos=True))
  finally:
    getattr(dec, "close", lambda: None)()
  assert [r.token_ids for r in res] == want
  ex = res[0].stats.extra
  assert 0 < np.mean([r.stats.extra["acceptance_rate"] for r in res]) < 1  # drafts accepted and rejected
  if mode == "ssd":
    assert ex["cache_hit_rate"] > 0


@pytest.fixture(scope="module")
def v4(tmp_path_factory):
  """pairs.v4_pair's V=4 target and, as the off-the-shelf draft, its perturbed full-vocabulary copy written as an HF
  directory, loaded with its head cut to V4_HEAD's three tokens (by counts that rank them in that order). Under
  SSD_JAX_TEST_HEAD=real: the real-sized pair (draft_heads), cut to real_head_ids()'s 16384 rows."""
  cfg, tp, _, _ = v4_pair()
  draft, head, counts = perturbed(tp, 0.3, 5), V4_HEAD, [2, 0, 1, 3]
  if REAL:
    draft, head = concentrate(draft, REAL_LIVE), tuple(real_head_ids().tolist())
    counts = np.zeros(cfg.vocab_size)
    counts[list(head)] = np.arange(len(head), 0, -1)
  path = _write(tmp_path_factory.mktemp("v4"), "hf", cfg, jax.device_get(draft))
  dcfg, dp = drafts.load_draft(path, cfg, head_vocab=len(head), head_counts=counts)
  assert tuple(np.asarray(dp["head_ids"]).tolist()) == head  # shuffled, token 1 outside
  return cfg, tp, dcfg, dp, jax.device_get(tp)


@pytest.mark.parametrize("mode,temperature,top_p,placement", [
    ("sd", 1.5, 1.0, None), ("ssd", 1.0, 0.7, "devices"), ("ssd", 0.5, 1.0, "processes")])
def test_sampled_decoding_with_an_off_the_shelf_draft_follows_the_numpy_law(v4, mode, temperature, top_p, placement):
  """test_sampled_decoding's numpy-law test, the draft an HF directory cut to a shuffled non-prefix head at load."""
  cfg, tp, dcfg, dp, host = v4
  if placement == "processes" and len(os.sched_getaffinity(0)) < 2:
    pytest.skip("needs two CPU cores")
  n_new = 6 if mode == "ssd" else 4
  opts = DecodeOptions(max_new_tokens=n_new, temperature=temperature, top_p=top_p, ignore_eos=True,
                       seed=1300 + int(10 * temperature))
  dec = (SDDecoder(cfg, tp, dcfg, dp, SpecOptions(k=2)) if mode == "sd"
         else SSDDecoder(cfg, tp, dcfg, dp, SpecOptions(k=2, fan_out=2, placement=placement)))
  try:
    res = generate(dec, [live(LAW_PROMPT)] * LAW_ROWS, opts)
  finally:
    getattr(dec, "close", lambda: None)()
  assert 0 < np.mean([r.stats.extra["acceptance_rate"] for r in res]) < 1
  if mode == "ssd":
    assert (0.1 if REAL else 0.2) < np.mean([r.stats.extra["cache_hit_rate"] for r in res]) < 0.9  # real T=0.5: 0.17
  assert_rows_follow_their_laws(res, [LAW_PROMPT], host, cfg, temperature, top_p, tail=mode == "ssd")


@pytest.fixture(scope="module")
def with_text(tmp_path_factory):
  """A V=259 target with the byte-level tokenizer (an HF directory) and drafts: the same tokenizer (HF), no
  tokenizer (GGUF), another vocabulary size, and the same size with two tokens swapped."""
  tmp = tmp_path_factory.mktemp("text")
  tok = byte_level_tokenizer()
  cfg = tiny_config(vocab_size=tok.get_vocab_size())
  tp = jax.device_get(model.init_params(jax.random.key(3), cfg, scale=0.3))
  out = {"target": _write(tmp, "hf", cfg, tp, "target")}
  tok.save(os.path.join(out["target"], "tokenizer.json"))
  dp = jax.device_get(perturbed(tp, 0.05, 2))
  out["hf"] = _write(tmp, "hf", cfg, dp, "same")
  tok.save(os.path.join(out["hf"], "tokenizer.json"))
  out["gguf"] = _write(tmp, "gguf", cfg, dp)
  small = tiny_config(vocab_size=200)
  out["smaller"] = _write(tmp, "hf", small, jax.device_get(model.init_params(jax.random.key(4), small)), "smaller")
  out["swapped"] = _write(tmp, "hf", cfg, dp, "swapped")
  byte_tokenizer(["<|im_start|>", "<|endoftext|>", "<|im_end|>"]).save(os.path.join(out["swapped"], "tokenizer.json"))
  return out


@pytest.mark.parametrize("fmt,head", [("hf", None), ("gguf", 100)])
def test_api_load_takes_an_off_the_shelf_draft(with_text, fmt, head):
  pipe = api.load(with_text["target"], draft=with_text[fmt], draft_head_vocab=head, ssd_placement="devices")
  d = pipe.draft.cfg
  assert d.head_vocab == head and d.vocab_size == 259
  if head:
    ids = np.asarray(pipe.draft.params["head_ids"])
    assert list(ids[:3]) == [0, 1, 2]  # the specials (<|im_end|>: the EOS) first, then the lowest other ids
    assert list(ids[3:]) == list(range(3, head))
  prompts = [[5, 6, 7], [40, 41, 42, 43, 44]]
  got = {m: [r.token_ids for r in pipe.generate_ids(prompts, mode=m, k=2, max_new_tokens=9, ignore_eos=True)]
         for m in ("ar", "sd", "ssd")}
  assert got["sd"] == got["ar"] and got["ssd"] == got["ar"]


def test_a_cut_head_keeps_the_special_tokens_wherever_they_lie(tmp_path):
  """The chat specials at the top of the vocabulary (ids 256-258, where many tokenizers number their added
  tokens): a head of 100 rows keeps them (the EOS <|im_end|> among them) first, then the lowest other ids; plain id
  order would cut them off. Greedy SD with that head is AR's."""
  from ssd_jax.models.tokenizer import ENDOFTEXT, IM_END, IM_START

  tok = byte_tokenizer([ENDOFTEXT, IM_START, IM_END], specials_last=True)
  cfg = tiny_config(vocab_size=259)
  tp = jax.device_get(model.init_params(jax.random.key(3), cfg, scale=0.3))
  target = _write(tmp_path, "hf", cfg, tp, "target")
  tok.save(os.path.join(target, "tokenizer.json"))
  pipe = api.load(target, draft=_write(tmp_path, "gguf", cfg, jax.device_get(perturbed(tp, 0.05, 2))),
                  draft_head_vocab=100, ssd_placement="devices")
  ids = np.asarray(pipe.draft.params["head_ids"])
  assert IM_END in [tok.id_to_token(i) for i in pipe.tokenizer.eos_ids]
  assert list(ids[:3]) == [256, 257, 258] and list(ids[3:]) == list(range(97))
  prompts = [[5, 6, 7], [40, 41, 42, 43, 44]]
  got = {m: [r.token_ids for r in pipe.generate_ids(prompts, mode=m, k=2, max_new_tokens=9, ignore_eos=True)]
         for m in ("ar", "sd")}
  assert got["sd"] == got["ar"]


@pytest.mark.parametrize("which,msg", [
    ("smaller", "has a vocabulary of 200 tokens, the target 259"),
    ("swapped", "has token '<|im_start|>' at id 0 where the target has '<|endoftext|>'")])
def test_a_draft_of_another_vocabulary_is_refused_in_one_line(with_text, which, msg):
  with pytest.raises(CheckpointError, match=msg.replace("|", "\\|")) as e:
    api.load(with_text["target"], draft=with_text[which])
  assert "\n" not in str(e.value)
  r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "decode.py"), "--target", with_text["target"],
                      "--draft", with_text[which], "--mode", "sd", "--raw", "--prompt", "hi"],
                     capture_output=True, text=True, timeout=600, cwd=ROOT,
                     env=dict(os.environ, PYTHONPATH=ROOT))  # this checkout's package
  assert r.returncode == 2 and msg in r.stderr, r.stderr[-2000:]
  assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_configs_of_every_draft_format_read_without_weights(pair):
  """What decode.py sizes SSD's memory from before loading: a Hugging Face directory's, a GGUF's and our checkpoints'
  configs, the EAGLE one included (decode.py once parsed every config.json as a ModelConfig and refused it)."""
  cfg, _, paths, _ = pair
  for fmt in ("hf", "gguf"):
    got, tok = drafts.read_vocab(paths[fmt])
    assert (got.vocab_size, got.n_layers, got.d_model, tok) == (cfg.vocab_size, cfg.n_layers, cfg.d_model, None)
  ours, tok = drafts.read_vocab(os.path.join(ROOT, "checkpoints", "draft-smollm2"))
  assert ours.head_vocab is not None and tok.get_vocab_size() == ours.vocab_size
  eagle, _ = drafts.read_vocab(os.path.join(ROOT, "checkpoints", "eagle-smollm2"))
  assert eagle.kind == "eagle" and eagle.out_vocab < eagle.vocab_size
  with pytest.raises(CheckpointError, match="no model at"):
    drafts.read_vocab(os.path.join(ROOT, "tests"))
