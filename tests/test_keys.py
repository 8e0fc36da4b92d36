"""Randomness: no two rounds, rows, depths or roles of a run draw from the same key.

Two checks. Every compiled call that takes a key is recorded (Programs.__call__): no two calls of a run may get the
same key (for ar_step and first_tokens, the same key and step: they fold the step in themselves). And with a target
and draft whose law is uniform whatever the text (all weights zero), every token is a function of its key alone, so a
key reused inside a program (one key for all rows, for every depth of the tree) shows up as repeated tokens.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ssd_jax import model
from ssd_jax.config import tiny_config
from ssd_jax.decode import ARDecoder, DecodeOptions, SDDecoder, SpecOptions, SSDDecoder
from ssd_jax.decode.base import Programs, pad_prompts
from ssd_jax.decode.steps import draft_propose, draft_tree, prefill
from ssd_jax.kv_cache import KVCache

V, ROWS = 64, 6
STEP_FOLDED = ("ar_step", "first_tokens")  # programs given the run's key and a step (first_tokens: step 0)


@pytest.fixture(scope="module")
def uniform():
  cfg = tiny_config(vocab_size=V)
  return cfg, jax.tree.map(jnp.zeros_like, model.init_params(jax.random.key(0), cfg))


def _record(monkeypatch):
  calls = []
  call = Programs.__call__

  def recording(self, fn, *args, **static):
    keys = [a for a in args if isinstance(a, jax.Array) and jnp.issubdtype(a.dtype, jax.dtypes.prng_key)]
    if keys:
      name = getattr(fn, "__name__", repr(fn))
      step = 0
      if name == "ar_step":
        step = int(args[5])
      for k in keys:
        ident = np.asarray(jax.random.key_data(k)).tobytes() + (bytes([step % 256, step // 256])
                                                                 if name in STEP_FOLDED else b"")
        calls.append((name, ident))
    return call(self, fn, *args, **static)

  monkeypatch.setattr(Programs, "__call__", recording)
  return calls


def _repeated_4grams(seqs) -> int:
  grams = [tuple(s[i:i + 4]) for s in seqs for i in range(len(s) - 3)]
  return len(grams) - len(set(grams))


DECODERS = {
    "ar": lambda cfg, p: ARDecoder(cfg, p),
    "sd": lambda cfg, p: SDDecoder(cfg, p, cfg, p, SpecOptions(k=4)),
    "ssd-neural": lambda cfg, p: SSDDecoder(cfg, p, cfg, p, SpecOptions(k=4, fan_out=8, backup="neural")),
    "ssd-fast": lambda cfg, p: SSDDecoder(cfg, p, cfg, p, SpecOptions(k=4, fan_out=8, backup="fast")),
}


@pytest.mark.parametrize("mode", sorted(DECODERS))
def test_every_round_and_role_gets_its_own_key(uniform, monkeypatch, mode):
  """Per run: each call's key differs from every other call's (rounds, draft vs verifier, tree vs backup), and the
  emitted text, a function of the keys alone here, repeats no 4-gram across rows and positions (by chance: about
  5e-4 for these ~130 4-grams of 64 tokens)."""
  cfg, params = uniform
  calls = _record(monkeypatch)
  res = DECODERS[mode](cfg, params).generate([[1, 2, 3]] * ROWS, DecodeOptions(max_new_tokens=24, temperature=1.0,
                                                                               ignore_eos=True, seed=5))
  seqs = [r.token_ids for r in res]
  names = sorted({n for n, _ in calls})
  assert len(calls) > 6, names  # the rounds really were recorded
  seen = {}
  for name, ident in calls:
    assert ident not in seen, f"{name} reuses the key of an earlier {seen[ident]} call"
    seen[ident] = name
  assert _repeated_4grams(seqs) == 0, seqs
  if mode.startswith("ssd"):
    assert res[0].stats.extra["backups_used"][mode.split("-")[1]] >= 2


def test_rows_and_depths_of_one_draft_call_draw_apart(uniform):
  """One key per call is split per row and per depth inside the draft's programs: on the uniform draft, rows with
  the same text draft different tokens, and a branch's tokens differ from depth to depth."""
  cfg, params = uniform
  b, k, f = 4, 4, 3
  toks, lens = pad_prompts([[1, 2, 3]] * b, bucket=8)
  cache = KVCache.init(cfg, b, 256)
  _, cache = prefill(params, jnp.asarray(toks), jnp.asarray(lens), cache, cfg)
  last2, lengths = jnp.asarray([[3, 4]] * b, jnp.int32), jnp.asarray([5] * b, jnp.int32)
  one = jnp.float32(1.0)
  drafted, _, cache = draft_propose(params, cache, last2, lengths, jax.random.key(1), one, one, one, cfg=cfg, k=k)
  drafted = np.asarray(drafted)
  assert len({tuple(r) for r in drafted}) == b, drafted
  _, _, tree_t, _, _, _ = draft_tree(params, cache, last2, jnp.asarray(drafted), lengths, jax.random.key(2), one, one,
                                     one, cfg=cfg, k=k, fan_out=(f,) * (k + 1))
  tree_t = np.asarray(tree_t)  # [B, N, K]
  assert _repeated_4grams(tree_t.reshape(-1, k).tolist()) == 0
  for d in range(1, k):
    assert (tree_t[..., d] != tree_t[..., 0]).mean() > 0.8
