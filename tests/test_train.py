"""Draft training pieces: the cached (top-k) distillation teacher against the live one."""
import os

import jax
import jax.numpy as jnp
import numpy as np

from ssd_jax.models import model
from ssd_jax.models.config import ModelConfig
from ssd_jax.training.draft_data import example_starts, pack_examples
from ssd_jax.training.draft_init import deepen, init_draft_from_target, widen, widen_head
from ssd_jax.training.draft_step import TrainConfig, init_opt_state, make_optimizer, make_train_step, teacher_probs
from ssd_jax.training.head_vocab import more_head_vocab
from ssd_jax.training.teacher import TeacherCache

V = 96
TARGET = ModelConfig(vocab_size=V, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=16, ffn_dim=64,
                     max_seq_len=64, name="tiny-target")
DRAFT = ModelConfig(vocab_size=V, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8, ffn_dim=32,
                    max_seq_len=64, head_vocab=40, tie_embeddings=True, name="tiny-draft")


def _setup(seed=0, windows=6, seq=12):
  rng = np.random.default_rng(seed)
  tparams = model.init_params(jax.random.key(1), TARGET, scale=0.3)  # peaked enough that top-k matters
  head_ids = np.sort(rng.choice(V, DRAFT.head_vocab, replace=False)).astype(np.int64)
  dparams = init_draft_from_target(jax.random.key(2), DRAFT, TARGET, tparams, head_ids)
  toks = rng.integers(0, V, (windows, seq + 1)).astype(np.int32)
  mask = (rng.random((windows, seq + 1)) < 0.7).astype(np.float32)
  return tparams, dparams, head_ids, toks, mask


def _assert_live_teacher(tparams, head_ids, toks, rows, probs):
  """The cached rows and probabilities are the live teacher's (float16)."""
  live = np.asarray(teacher_probs(tparams, TARGET, jnp.asarray(head_ids), jnp.asarray(toks)))
  np.testing.assert_allclose(np.take_along_axis(live, rows.astype(np.int64), -1), probs, rtol=2e-3, atol=1e-4)


TC = TrainConfig(lr=1e-2, warmup=1, steps=5, distill_weight=0.8)
OPT = make_optimizer(TC)
STEP = make_train_step(DRAFT, OPT, TARGET, TC.distill_weight)


def _step_loss(dparams, batch, tparams):
  p = jax.tree.map(lambda x: jnp.array(x, copy=True), dparams)  # the step donates its inputs
  new, _, met = STEP(p, init_opt_state(OPT, p), batch, tparams)
  return float(met["loss"]), new


def test_cache_matches_live_teacher_and_full_k_gives_the_same_step(tmp_path):
  tparams, dparams, head_ids, toks, mask = _setup()
  cache = TeacherCache(str(tmp_path), toks, head_ids, "tiny-target", DRAFT.head_vocab, chunk=4)
  cache.build(tparams, TARGET)
  rows, probs = cache.load()
  assert rows.shape == probs.shape == (len(toks), toks.shape[1] - 1, DRAFT.head_vocab)
  # The cache holds the live teacher's distribution (sorted, float16).
  _assert_live_teacher(tparams, head_ids, toks, rows, probs)
  assert (np.diff(probs.astype(np.float32), axis=-1) <= 0).all()
  # With k = the whole head, the cached step is the live step: same loss, same update.
  batch = {"tokens": jnp.asarray(toks[:4]), "mask": jnp.asarray(mask[:4])}
  loss_live, p_live = _step_loss(dparams, batch, tparams)
  cached = dict(batch, t_rows=jnp.asarray(rows[:4].astype(np.int32)), t_probs=jnp.asarray(probs[:4], jnp.float32))
  loss_cached, p_cached = _step_loss(dparams, cached, None)
  assert abs(loss_live - loss_cached) < 1e-3 * abs(loss_live)
  np.testing.assert_allclose(np.asarray(p_cached["embed"]), np.asarray(p_live["embed"]), atol=1e-5)
  # The comparison can tell teachers apart: a top-2 teacher gives another loss, and a wrong row mapping too.
  top2 = dict(batch, t_rows=cached["t_rows"][..., :2], t_probs=cached["t_probs"][..., :2])
  assert abs(_step_loss(dparams, top2, None)[0] - loss_live) > 1e-3 * abs(loss_live)
  shifted = dict(cached, t_rows=(cached["t_rows"] + 1) % DRAFT.head_vocab)
  assert abs(_step_loss(dparams, shifted, None)[0] - loss_live) > 1e-3 * abs(loss_live)


def test_cache_resumes_by_chunk_and_is_keyed_by_its_inputs(tmp_path):
  tparams, _, head_ids, toks, _ = _setup(windows=7)
  cache = TeacherCache(str(tmp_path), toks, head_ids, "tiny-target", 5, chunk=3)
  assert cache.n_chunks == 3 and cache.missing() == [0, 1, 2] and cache.missing_windows() == 7
  done = []
  cache.build(tparams, TARGET, progress=done.append)
  assert done == [3, 3, 1] and cache.missing() == []
  rows, probs = cache.load()
  os.remove(cache._path(1))  # an interrupted build: only that chunk is redone
  done.clear()
  cache.build(tparams, TARGET, progress=done.append)
  assert done == [3]
  rows2, probs2 = cache.load()
  assert (rows2 == rows).all() and (probs2 == probs).all()
  # Another head or another k: another directory; other windows: other chunks. Never a stale chunk.
  other = [TeacherCache(str(tmp_path), toks, head_ids[::-1].copy(), "tiny-target", 5, chunk=3),
           TeacherCache(str(tmp_path), toks, head_ids, "tiny-target", 4, chunk=3)]
  assert len({cache.dir, *(c.dir for c in other)}) == 3 and all(c.missing() == [0, 1, 2] for c in other)
  reordered = TeacherCache(str(tmp_path), toks[::-1].copy(), head_ids, "tiny-target", 5, chunk=3)
  assert reordered.dir == cache.dir and reordered.missing() == [0, 1, 2]
  # A grown corpus (windows appended) computes only the chunks it does not share, and reads the shared ones.
  more = np.concatenate([toks[:6], _setup(seed=5, windows=4)[3]])
  grown = TeacherCache(str(tmp_path), more, head_ids, "tiny-target", 5, chunk=3)
  assert grown.dir == cache.dir and grown.missing() == [2, 3] and grown.missing_windows() == 4
  done.clear()
  grown.build(tparams, TARGET, progress=done.append)
  assert done == [3, 1]
  g_rows, g_probs = grown.load()
  assert (g_rows[:6] == rows[:6]).all() and (g_probs[:6] == probs[:6]).all()
  _assert_live_teacher(tparams, head_ids, more[6:], g_rows[6:], g_probs[6:])


def _train_two_steps(params, cfg: ModelConfig, toks, mask):
  """Returns `params` after two hard-label steps (lr 1e-2 after a one-step warmup whose first step has lr 0)."""
  opt = make_optimizer(TrainConfig(lr=1e-2, warmup=1, steps=5))
  step = make_train_step(cfg, opt)
  new = jax.tree.map(lambda x: jnp.array(x, copy=True), params)  # the step donates its inputs
  state = init_opt_state(opt, new)
  for _ in range(2):
    new, state, _ = step(new, state, {"tokens": jnp.asarray(toks), "mask": jnp.asarray(mask)}, None)
  return new


def test_deepen_keeps_the_output_and_the_new_layers_train():
  cfg2 = ModelConfig(**{**DRAFT.__dict__, "n_layers": 2})
  _, _, head_ids, toks, mask = _setup()
  tparams = model.init_params(jax.random.key(1), TARGET, scale=0.3)
  params = init_draft_from_target(jax.random.key(3), cfg2, TARGET, tparams, head_ids)
  params = dict(params, layers=[{k: v + 0.05 * jax.random.normal(jax.random.key(i), v.shape) for k, v in lp.items()}
                                for i, lp in enumerate(params["layers"])])  # a "trained" draft: no zero blocks
  ref = np.asarray(model.forward_full(params, jnp.asarray(toks), cfg2))
  for n_new, expect_after in ((1, [0]), (2, [0, 1])):
    grown, gcfg = deepen(params, cfg2, n_new)
    assert gcfg.n_layers == 2 + n_new and len(grown["layers"]) == 2 + n_new
    model.check_params(grown, gcfg)
    np.testing.assert_array_equal(np.asarray(model.forward_full(grown, jnp.asarray(toks), gcfg)), ref)
    new_at = [i for i, lp in enumerate(grown["layers"]) if not np.asarray(lp["wo"]).any()]
    assert new_at == [a + 1 + j for j, a in enumerate(expect_after)]  # each copy follows its layer
    for i in new_at:  # the copy's inputs are its predecessor's, not random
      np.testing.assert_array_equal(np.asarray(grown["layers"][i]["wq"]), np.asarray(grown["layers"][i - 1]["wq"]))
  # Training moves the zeroed outputs, and the grown draft's output with them (the schedule's first step has lr 0).
  new = _train_two_steps(grown, gcfg, toks, mask)
  assert all(np.asarray(new["layers"][i]["wo"]).any() for i in new_at)
  assert not np.allclose(np.asarray(model.forward_full(new, jnp.asarray(toks), gcfg)), ref)
  for bad in (0, 3):
    try:
      deepen(params, cfg2, bad)
    except ValueError as e:
      assert "can add 1 to 2 layers" in str(e)
    else:
      raise AssertionError(f"deepen accepted n_new={bad}")


def test_widen_keeps_the_output_and_the_new_parts_train():
  cfg2 = ModelConfig(**{**DRAFT.__dict__, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2})  # 2 query heads per KV head
  _, _, head_ids, toks, mask = _setup()
  tparams = model.init_params(jax.random.key(1), TARGET, scale=0.3)
  params = init_draft_from_target(jax.random.key(3), cfg2, TARGET, tparams, head_ids)
  params = jax.tree.map(lambda v: v + 0.05 * jax.random.normal(jax.random.key(7), v.shape)
                        if v.dtype == jnp.float32 else v, params)  # a "trained" draft: uneven norms, no zero blocks
  ref = np.asarray(model.forward_full(params, jnp.asarray(toks), cfg2))
  wide, wcfg = widen(params, cfg2, 32, jax.random.key(4))
  model.check_params(wide, wcfg)
  assert (wcfg.d_model, wcfg.n_heads, wcfg.n_kv_heads, wcfg.ffn_dim) == (32, 8, 4, 64)
  np.testing.assert_allclose(np.asarray(model.forward_full(wide, jnp.asarray(toks), wcfg)), ref, rtol=1e-5, atol=1e-5)
  # The old weights sit where they were; what writes to the new residual dimensions is zero, what reads them is not.
  lp0, lp1 = params["layers"][0], wide["layers"][0]
  np.testing.assert_array_equal(np.asarray(lp1["wq"])[:16, :32], np.asarray(lp0["wq"]))
  assert not np.asarray(lp1["wo"])[32:].any() and not np.asarray(lp1["wo"])[:, 16:].any()
  assert not np.asarray(lp1["w_down"])[:, 16:].any() and not np.asarray(wide["embed"])[:, 16:].any()
  assert np.asarray(lp1["wq"])[16:].any() and np.asarray(lp1["w_up"])[:, 32:].any()
  # Training moves the zero blocks, and the output with them (the schedule's first step has lr 0).
  new = _train_two_steps(wide, wcfg, toks, mask)
  assert np.asarray(new["layers"][0]["wo"])[32:].any() and np.asarray(new["embed"])[:, 16:].any()
  assert not np.allclose(np.asarray(model.forward_full(new, jnp.asarray(toks), wcfg)), ref)
  for bad in (16, 8, 20):  # not wider; 20 would need 5 query heads, not a multiple of the 2 per KV head
    try:
      widen(params, cfg2, bad, jax.random.key(0))
    except ValueError as e:
      assert "the new width must exceed 16 and give whole numbers" in str(e)
    else:
      raise AssertionError(f"widen accepted d_model={bad}")


def test_widen_head_adds_rows_and_keeps_the_known_tokens_logits():
  tparams, dparams, head_ids, toks, mask = _setup()
  dparams = dict(dparams, embed=dparams["embed"] + 0.05 * jax.random.normal(jax.random.key(5), dparams["embed"].shape))
  outside = np.setdiff1d(np.arange(V), head_ids)
  # The tokens to add go by how often they are targets; ids never seen are not added.
  ids = np.concatenate([np.repeat(outside[:3], [5, 1, 3]), head_ids[:10]])
  picked = more_head_vocab(ids, np.ones_like(ids), V, head_ids, 2)
  assert picked.tolist() == sorted([outside[0], outside[2]])
  assert more_head_vocab(ids, np.ones_like(ids), V, head_ids, 10).tolist() == outside[:3].tolist()
  new_ids = outside[[0, 5, 20]]
  wide, wcfg = widen_head(dparams, DRAFT, tparams, new_ids)
  model.check_params(wide, wcfg)
  assert wcfg.head_vocab == DRAFT.head_vocab + 3
  h = np.asarray(wide["head_ids"])
  assert (np.diff(h) > 0).all() and set(h.tolist()) == set(head_ids.tolist()) | set(new_ids.tolist())
  vm = np.asarray(wide["vocab_map"])
  assert (h[vm[h]] == h).all()  # every head token reads its own row
  # The known rows are the old ones, moved to their sorted places.
  np.testing.assert_array_equal(np.asarray(wide["embed"])[vm[head_ids]], np.asarray(dparams["embed"]))
  # On text of known tokens, the known tokens' logits are unchanged; the new ones get finite logits.
  known = head_ids[toks % len(head_ids)]
  ref = np.asarray(model.forward_full(dparams, jnp.asarray(known), DRAFT))
  got = np.asarray(model.forward_full(wide, jnp.asarray(known), wcfg))
  np.testing.assert_allclose(got[..., vm[head_ids]], ref, rtol=1e-5, atol=1e-5)
  assert np.isfinite(got[..., vm[new_ids]]).all()
  # A new token now reads its own row, not row 0 (which it shared before).
  text = known.copy()
  text[:, 3] = new_ids[1]
  before = np.asarray(model.forward_full(dparams, jnp.asarray(text), DRAFT))
  after = np.asarray(model.forward_full(wide, jnp.asarray(text), wcfg))[..., vm[head_ids]]
  assert not np.allclose(before[:, 3:], after[:, 3:], atol=1e-4)
  np.testing.assert_allclose(after[:, :3], before[:, :3], rtol=1e-5, atol=1e-5)  # causal: earlier positions agree
  # The new rows follow the target's geometry: an exactly affine draft embedding is extended exactly.
  a = np.random.default_rng(0).normal(size=(TARGET.d_model, DRAFT.d_model))
  e_t = np.asarray(tparams["embed"], np.float64)
  lin = dict(dparams, embed=jnp.asarray(e_t[head_ids] @ a + 0.5, jnp.float32))
  wide_lin, _ = widen_head(lin, DRAFT, tparams, new_ids)
  np.testing.assert_allclose(np.asarray(wide_lin["embed"])[vm[new_ids]], e_t[new_ids] @ a + 0.5, rtol=1e-4, atol=1e-4)
  for bad in (head_ids[:1], np.array([outside[0], outside[0]]), np.array([V]), np.array([], np.int64)):
    try:
      widen_head(dparams, DRAFT, tparams, bad)
    except ValueError as e:
      assert "outside the head" in str(e)
    else:
      raise AssertionError(f"widen_head accepted {bad}")


def _answer_stream(rng, n_examples, start_id=1):
  """A target-answer stream as make_target_corpus writes it: per example [start, prompt..] (mask 0), its answer
  (mask 1), then one trailing mask-0 token; returns (ids, mask, the examples as (ids, mask) pairs)."""
  examples = []
  for _ in range(n_examples):
    prompt = [start_id] + rng.integers(3, V, rng.integers(2, 9)).tolist()
    answer = rng.integers(3, V, rng.integers(1, 15)).tolist()
    # A start token inside a prompt (the template's later turns) must not begin a new example.
    prompt += [start_id, 5]
    examples.append((np.asarray(prompt + answer + [7]), np.asarray([0] * len(prompt) + [1] * len(answer) + [0])))
  return (np.concatenate([e[0] for e in examples]).astype(np.uint16),
          np.concatenate([e[1] for e in examples]).astype(np.uint8), examples)


def test_example_starts_finds_each_prompt_once():
  ids, mask, examples = _answer_stream(np.random.default_rng(0), 12)
  lens = [len(e[0]) for e in examples]
  assert example_starts(ids, mask, 1).tolist() == np.concatenate([[0], np.cumsum(lens)[:-1]]).tolist()


def test_pack_examples_keeps_every_example_whole_and_starts_windows_at_a_prompt():
  ids, mask, examples = _answer_stream(np.random.default_rng(1), 40)
  seq = 31
  toks, wmask = pack_examples(ids, mask, seq, start_id=1)
  assert toks.shape[1] == seq + 1 and wmask.shape == toks.shape
  assert (toks[:, 0] == 1).all()  # every window begins at an example's first token
  assert int(wmask.sum()) == int(mask.sum())  # every answer token once, none invented
  assert len(toks) < len(ids) / (seq + 1) * 1.3  # packed, not one example a window
  # Each example (short enough) sits whole and contiguous in exactly one window, its mask with it.
  found = 0
  for e_ids, e_mask in examples:
    if len(e_ids) > seq + 1:
      continue
    hits = [(r, j) for r in range(len(toks)) for j in range(seq + 2 - len(e_ids))
            if (toks[r, j:j + len(e_ids)] == e_ids).all() and (wmask[r, j:j + len(e_ids)] == e_mask).all()]
    assert hits, e_ids
    found += 1
  assert found > 30
  # The stream cut every seq tokens leaves most answers without their prompt's start; packing leaves none.
  starts = example_starts(ids, mask, 1)
  owner = np.searchsorted(starts, np.arange(len(ids)), side="right") - 1
  cut = (starts[owner] < (np.arange(len(ids)) // seq) * seq) & mask.astype(bool)
  assert cut.sum() > 0.2 * mask.sum()


def test_pack_examples_cuts_an_example_longer_than_a_window():
  ids = np.asarray([1, 4, 5] + list(range(10, 30)) + [7], np.uint16)
  mask = np.asarray([0, 0, 0] + [1] * 20 + [0], np.uint8)
  toks, wmask = pack_examples(ids, mask, 9, start_id=1)
  assert int(wmask.sum()) == 20 and toks[0, 0] == 1
  assert sorted(toks[wmask.astype(bool)].tolist()) == list(range(10, 30))


# ------------------------------------------------------------------------------------- the training run as a function

def _byte_target():
  """A tiny random target over the byte-level tokenizer (259 tokens, the chat specials at 0-2)."""
  from ssd_jax.models.config import tiny_config
  from ssd_jax.models.tokenizer import TextTokenizer, byte_level_tokenizer
  from ssd_jax.training.draft_loop import Target
  tok = TextTokenizer(byte_level_tokenizer())
  cfg = tiny_config(vocab_size=tok.vocab_size, name="byte-target")
  return Target(cfg, model.init_params(jax.random.key(0), cfg, scale=0.3), tok, "byte-target")


def _conversations(n, seed=0):
  rng = np.random.default_rng(seed)
  words = ["alpha", "beta", "gamma", "delta", "sum", "of", "two", "and", "is", "the"]
  say = lambda k: " ".join(rng.choice(words, k))  # noqa: E731
  return [[("user", say(6)), ("assistant", say(12))] for _ in range(n)]


def _answer_corpus(path, target, n_shards=8):
  """Shards in make_target_corpus.py's format; shard 7 is held out (n % 25 == 7)."""
  from ssd_jax.training.draft_data import tokenize_conversations
  os.makedirs(path)
  for b in range(n_shards):
    ids, mask = tokenize_conversations(target.tokenizer, _conversations(3, seed=100 + b), progress=False)
    np.savez(os.path.join(path, f"shard_{b:05d}.npz"), ids=ids, mask=mask)
  return str(path)


def _run(tmp_path, name, **kw):
  from ssd_jax.training.draft_loop import TINY_RECIPE, DraftRun
  kw.setdefault("tc", TrainConfig(seq_len=32, batch_size=2, steps=4, eval_every=2, save_every=2, eval_windows=2,
                                  warmup=1))
  return DraftRun(work_dir=str(tmp_path / f"work_{name}"), out=str(tmp_path / f"draft_{name}"),
                  recipe=dict(TINY_RECIPE), tiny=True, **kw)


def test_train_resumes_to_the_same_draft_exports_the_best_and_grows(tmp_path, capsys):
  """draft_loop.train: 4 steps straight equal 3 steps, then a resume for the 4th (the same batches, the restored
  optimizer); the export carries its figures; an --init-from run grows that export."""
  import json

  from ssd_jax.models import checkpoints
  from ssd_jax.training.draft_loop import train
  target = _byte_target()
  convs = _conversations(30)
  corpus = _answer_corpus(tmp_path / "answers", target)
  straight = train(_run(tmp_path, "a", target_corpus=corpus, corpus_mix=0.5), target, convs)
  err = capsys.readouterr().err
  assert "target-answer corpus" in err and "on held-out target answers" in err and "resumed" not in err
  first = train(_run(tmp_path, "b", target_corpus=corpus, corpus_mix=0.5, until=3), target, convs)
  assert first.step == 3
  resumed = train(_run(tmp_path, "b", target_corpus=corpus, corpus_mix=0.5), target, convs)
  assert "resumed from step 3" in capsys.readouterr().err
  assert resumed.step == straight.step == 4
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(resumed.params), jax.device_get(straight.params))
  assert resumed.best_agreement == straight.best_agreement
  extra = json.loads((tmp_path / "draft_a" / "extra.json").read_text())
  best = json.loads((tmp_path / "work_a" / "best.json").read_text())
  assert best["metric"] == "target_answers" and extra["step"] == best["step"] in (2, 4)
  assert extra["train_tokens"] == extra["step"] * 2 * 32 and extra["corpus_mix"] == 0.5
  assert extra["heldout_target_answer_agreement"] == best["agreement"] == straight.best_agreement
  cfg, params, tok = checkpoints.load_model(str(tmp_path / "draft_a"))
  assert cfg == straight.cfg and cfg.head_vocab == target.cfg.vocab_size and tok is not None
  # Grow the export by a layer and train on: it starts from what the export computes.
  grown = train(_run(tmp_path, "g", target_corpus="none", init_from=str(tmp_path / "draft_a"), grow_layers=1,
                     until=1), target, convs)
  assert grown.cfg.n_layers == 2 and "grown from 1 to 2 layers" in capsys.readouterr().err
  extra_g = json.loads((tmp_path / "draft_g" / "extra.json").read_text())
  assert extra_g["grown"] == "from 1 to 2 layers (--grow-layers)" and extra_g["init_extra"] == extra
  assert extra_g["train_tokens"] == extra["train_tokens"] + 2 * 32


def test_train_refuses_bad_runs_with_one_line(tmp_path):
  import re

  import pytest

  from ssd_jax.training.draft_loop import train
  for kw, msg in ((dict(until=5), "--until must be in [1, --steps = 4]"),
                  (dict(grow_layers=1), "without --init-from"),
                  (dict(corpus_mix=1.5), "--corpus-mix must be in [0, 1]"),
                  (dict(tc=TrainConfig(teacher_top_k=4, distill_weight=0.5)), "--corpus-mix 1")):
    with pytest.raises(ValueError, match=re.escape(msg)):
      _run(tmp_path, "bad", **kw)
  target = _byte_target()
  with pytest.raises(ValueError, match="there is none"):
    train(_run(tmp_path, "w", target_corpus="none", whole_examples=True), target, _conversations(30))
  train(_run(tmp_path, "a", target_corpus="none"), target, _conversations(30))
  with pytest.raises(ValueError, match="already in the draft's head"):  # the tiny head holds every byte already
    train(_run(tmp_path, "h", target_corpus="none", init_from=str(tmp_path / "draft_a"), grow_head=4), target,
          _conversations(30))
