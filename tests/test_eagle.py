"""The EAGLE draft: target features out of the target's forward, the draft's forward, its training rollout against
step-by-step inference, checkpoints, and a short training run with resume."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ssd_jax.models import checkpoints, eagle, model
from ssd_jax.models.config import RopeScaling, tiny_config
from ssd_jax.kernels import causal_mask_info
from ssd_jax.models.kv_cache import KVCache
from ssd_jax.training import eagle_data, eagle_train, features


def _target(seed=0, n_layers=5):
  cfg = tiny_config(vocab_size=64, n_layers=n_layers)
  return cfg, model.init_params(jax.random.key(seed), cfg, scale=0.3)


def _draft(tcfg, tparams, head_ids=None, seed=1):
  head_ids = np.arange(tcfg.vocab_size) if head_ids is None else np.asarray(head_ids)
  cfg = eagle.config_for_target(tcfg, len(head_ids))
  params = eagle.init_params(jax.random.key(seed), cfg, tparams, head_ids, scale=0.2)
  # Random (not near-zero) residual outputs, so that a wrong feature or key would change the logits visibly.
  params["layer"]["wo"] = params["layer"]["wo"] * 8
  params["layer"]["w_down"] = params["layer"]["w_down"] * 8
  return cfg, params


def test_forward_features_are_the_residual_stream_and_leave_logits_alone():
  cfg, params = _target()
  toks = jnp.asarray(np.random.default_rng(0).integers(0, 64, (2, 9)), jnp.int32)
  cache = KVCache.init(cfg, 2, 16)
  logits, _ = model.forward_causal(params, toks, cache, cfg)
  logits_f, _, feats = model.forward_causal(params, toks, cache, cfg, feature_layers=(3, 0))
  np.testing.assert_array_equal(np.asarray(logits), np.asarray(logits_f))
  assert feats.shape == (2, 9, 2 * cfg.d_model)
  for part, layer in ((0, 3), (1, 0)):
    # The residual stream after block `layer` is what a model cut after that block feeds its final norm.
    cut_cfg = tiny_config(vocab_size=64, n_layers=layer + 1)
    cut = dict(params, layers=params["layers"][: layer + 1], final_norm=jnp.ones((cfg.d_model,)))
    x, _, _ = model.hidden_states(cut, toks, jnp.broadcast_to(jnp.arange(9), (2, 9)), KVCache.init(cut_cfg, 2, 16),
                                  jnp.broadcast_to(jnp.arange(9), (2, 9)),
                                  causal_mask_info(jnp.broadcast_to(jnp.arange(9), (2, 9))), cut_cfg)
    got = feats[..., part * cfg.d_model:(part + 1) * cfg.d_model]
    want = model.rms_norm(got, jnp.ones((cfg.d_model,)), cfg.rms_eps)
    np.testing.assert_allclose(np.asarray(x), np.asarray(want), rtol=1e-4, atol=1e-4)
  with pytest.raises(ValueError, match="feature_layers"):
    model.forward_causal(params, toks, cache, cfg, feature_layers=(cfg.n_layers,))


def _sequential_logits(dparams, dcfg, toks, fused, anchor, upto):
  """The draft as decoding runs it: target features for positions 1..anchor, then its own outputs; logits at
  position `upto` (one row)."""
  cache = KVCache.init(dcfg, 1, 32)
  t = anchor + 1
  h_in = jnp.concatenate([jnp.zeros((1, 1, dcfg.d_model)), fused[:, :anchor]], axis=1)
  slots = jnp.arange(t)[None]
  logits, h, cache = eagle.forward(dparams, toks[:, :t], h_in, slots, cache, slots, causal_mask_info(slots), dcfg,
                                   attn_impl="ref")
  prev = h[:, -1:]
  for p in range(anchor + 1, upto + 1):
    s = jnp.asarray([[p]])
    logits, h, cache = eagle.forward(dparams, toks[:, p:p + 1], prev, s, cache, s, causal_mask_info(s), dcfg,
                                     attn_impl="ref")
    prev = h
  return logits[0, -1]


def test_rollout_step_j_equals_step_by_step_self_conditioned_drafting():
  tcfg, tparams = _target()
  dcfg, dparams = _draft(tcfg, tparams)
  rng = np.random.default_rng(1)
  n = 12
  toks = jnp.asarray(rng.integers(3, 64, (1, n)), jnp.int32)
  _, _, feats = model.forward_causal(tparams, toks, KVCache.init(tcfg, 1, 16), tcfg,
                                     feature_layers=dcfg.feature_layers)
  # Two examples in one window: the second one (positions 5..11 of the text) must not see the first.
  first = 5
  win_tokens = jnp.concatenate([toks[:, :first], toks[:, :n - first]], axis=1)
  win_feats = jnp.concatenate([feats[:, :first], feats[:, :n - first]], axis=1)
  batch = {"tokens": win_tokens, "feats": win_feats.astype(jnp.float16).astype(jnp.float32),
           "seg": jnp.asarray([[1] * first + [2] * (n - first)]),
           "pos": jnp.asarray([list(range(first)) + list(range(n - first))])}
  fused16 = eagle.fuse(dparams, batch["feats"][:, first:])
  steps = dict(eagle_train.rollout_logits(dparams, batch, dcfg, depth=4))
  for j in range(4):
    for p in (j, 3, n - first - 1):  # positions in the second example
      if p < j:
        continue
      want = _sequential_logits(dparams, dcfg, toks, fused16, p - j, p)
      got = steps[j][0, first + p]
      np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-3, atol=2e-3, err_msg=f"j={j} p={p}")
  # A rollout that read the target's feature instead of its own output would differ: the check has teeth.
  assert not np.allclose(np.asarray(steps[2][0, first + 6]), np.asarray(steps[0][0, first + 6]), atol=1e-3)


def test_eagle_checkpoint_round_trip_without_the_target_parts(tmp_path):
  tcfg, tparams = _target()
  dcfg, dparams = _draft(tcfg, tparams, head_ids=np.arange(0, 64, 2))
  eagle_train.export(str(tmp_path / "d"), dcfg, dparams, {"note": "test"})
  cfg2, own = checkpoints.load_checkpoint(str(tmp_path / "d"))
  assert cfg2 == dcfg and "embed" not in own and "head" not in own
  back = eagle.attach_target(own, tparams)
  np.testing.assert_array_equal(np.asarray(back["head"]), np.asarray(tparams["embed"])[::2])
  np.testing.assert_allclose(np.asarray(back["fc"]), np.asarray(dparams["fc"]), rtol=1e-2, atol=1e-3)  # bfloat16
  with open(tmp_path / "d" / "extra.json") as f:
    assert json.load(f)["note"] == "test"


@pytest.mark.parametrize("over", [dict(qk_norm=True, head_dim=16, tie_embeddings=False),
                                  dict(rope_scaling=RopeScaling("llama3", 8.0, original_max_position=64))])
def test_eagle_reads_the_new_families(over):
  """A Qwen3-shaped (untied, q/k norms, head_dim != d/H) or Llama 3-scaled target: the draft's head is the target's
  own LM head (lm_head when untied, not the embedding), and the draft runs on the target's features."""
  tcfg = tiny_config(vocab_size=64, n_layers=4, **over)
  tparams = model.init_params(jax.random.key(0), tcfg, scale=0.3)
  dcfg, dparams = _draft(tcfg, tparams)
  want_head = tparams["embed"] if tcfg.tie_embeddings else tparams["lm_head"].T
  np.testing.assert_array_equal(np.asarray(dparams["head"]), np.asarray(want_head))
  toks = jnp.asarray(np.random.default_rng(0).integers(3, 64, (1, 7)), jnp.int32)
  _, _, feats = model.forward_causal(tparams, toks, KVCache.init(tcfg, 1, 16), tcfg,
                                     feature_layers=dcfg.feature_layers)
  slots = jnp.arange(7)[None]
  logits, _, _ = eagle.forward(dparams, toks, eagle.fuse(dparams, feats), slots, KVCache.init(dcfg, 1, 16), slots,
                               causal_mask_info(slots), dcfg, attn_impl="ref")
  assert logits.shape == (1, 7, 64) and np.isfinite(np.asarray(logits)).all()


def _write_corpus(root, tcfg, tparams, rng, shards=2, examples=12):
  """Shards in make_target_corpus.py's format: examples of a prompt (<|im_start|> = 1 first) and an answer that
  follows a fixed rule (token t is followed by t + 1), so a draft can learn it from the features."""
  corpus = os.path.join(root, "target_answers_t")
  os.makedirs(corpus)
  for s in range(shards):
    ids, mask = [], []
    for _ in range(examples):
      prompt = [1] + rng.integers(3, 60, 4).tolist()
      start = int(rng.integers(3, 40))
      ans = list(range(start, start + int(rng.integers(5, 20))))
      ids += prompt + ans
      mask += [0] * len(prompt) + [1] * len(ans)
    np.savez(os.path.join(corpus, f"shard_{s:05d}.npz"), ids=np.asarray(ids, np.uint16),
             mask=np.asarray(mask, np.uint8))
  return corpus


def test_feature_cache_then_training_learns_and_resumes(tmp_path):
  tcfg, tparams = _target(n_layers=4)
  rng = np.random.default_rng(0)
  corpus = _write_corpus(str(tmp_path), tcfg, tparams, rng)
  root = str(tmp_path / "feats")
  layers = eagle.default_feature_layers(tcfg.n_layers)
  assert features.build(root, [corpus], tparams, tcfg, layers, "tiny", log=lambda m: None) == 2
  assert features.build(root, [corpus], tparams, tcfg, layers, "tiny", log=lambda m: None) == 0  # cached
  meta = np.load(os.path.join(root, "target_answers_t", "shard_00000.meta.npz"))
  z = np.load(os.path.join(corpus, "shard_00000.npz"))
  np.testing.assert_array_equal(meta["ids"], z["ids"])
  # Features of an example do not depend on the examples before it in the stream.
  f = np.load(os.path.join(root, "target_answers_t", "shard_00000.feats.npy"))
  s1 = int(meta["starts"][1])
  n = int(meta["starts"][2]) - s1
  _, _, alone = model.forward_causal(tparams, jnp.asarray(z["ids"][None, s1:s1 + n].astype(np.int32)),
                                     KVCache.init(tcfg, 1, 64), tcfg, feature_layers=layers)
  np.testing.assert_allclose(f[s1:s1 + n].astype(np.float32), np.asarray(alone[0]), rtol=2e-3, atol=2e-2)

  shards = eagle_data.load_shards(root, [corpus], held_out=False)
  head = eagle_data.choose_head(shards, tcfg.vocab_size, 48)
  dcfg = eagle.config_for_target(tcfg, len(head))
  params = eagle.init_params(jax.random.key(0), dcfg, tparams, head)
  tc = eagle_train.EagleTrainConfig(seq_len=64, batch_size=2, steps=30, depth=2, lr=3e-3, warmup=2, eval_every=30,
                                    eval_windows=4, save_every=15, log_every=15)
  logs = []
  best = eagle_train.train(dcfg, params, shards, shards, tc, str(tmp_path / "work"), str(tmp_path / "out"),
                           {"test": 1}, log=logs.append)
  first = [m for m in logs if m.startswith("step 15/")][0]
  last = [m for m in logs if m.startswith("step 30/")][0]
  loss = lambda m: float(m.split("loss ")[1].split(",")[0])  # noqa: E731
  assert loss(last) < loss(first)
  assert os.path.exists(tmp_path / "out" / "config.json") and best["step"] == 30
  # Resume: a longer run continues from step 30 (the state saved there), not from scratch.
  tc2 = dataclasses_replace(tc, steps=40, eval_every=40, save_every=40)
  logs2 = []
  eagle_train.train(dcfg, params, shards, shards, tc2, str(tmp_path / "work"), None, {}, log=logs2.append)
  assert any("resumed at step 30" in m for m in logs2)


def dataclasses_replace(x, **kw):
  import dataclasses
  return dataclasses.replace(x, **kw)
