"""Randomness: no two rounds, rows, depths or roles of a run draw from the same key.

Two checks. Every compiled call that takes a key is recorded (Programs.__call__): no two calls of a run may get the
same key (for first_tokens, the same key and step: it folds the step in itself). And with a target
and draft whose law is uniform whatever the text (all weights zero), every token is a function of its key alone, so a
key reused inside a program (one key for all rows, for every depth of the tree) shows up as repeated tokens.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ssd_jax.models import model
from ssd_jax.models.config import tiny_config
from ssd_jax.decode import ARDecoder, DecodeOptions, SDDecoder, SpecOptions, SSDDecoder
from ssd_jax.decode.base import Programs, pad_prompts
from ssd_jax.decode.steps import draft_propose, draft_tree, prefill
from ssd_jax.models.kv_cache import KVCache

V, ROWS = 64, 6
STEP_FOLDED = ("first_tokens",)  # programs given the run's key and a step (first_tokens: step 0)


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
      for k in keys:  # a call given several keys (a chunk's rounds: [n]) records each
        for kk in k.reshape(-1):
          ident = np.asarray(jax.random.key_data(kk)).tobytes() + (bytes([step % 256, step // 256])
                                                                    if name in STEP_FOLDED else b"")
          calls.append((name, ident))
    return call(self, fn, *args, **static)

  monkeypatch.setattr(Programs, "__call__", recording)
  return calls


def _repeated_4grams(seqs) -> int:
  grams = [tuple(s[i:i + 4]) for s in seqs for i in range(len(s) - 3)]
  return len(grams) - len(set(grams))


def constant_draft(v: int, spread: float = 0.5):
  """Returns (cfg, params) of a draft whose law is one fixed, non-uniform q whatever the text: all its layers are
  zero and every token embeds alike, so its logits are the column sums of a random LM head. Against the uniform
  target, draft s is accepted with probability min(1, (1/V) / q(s)): partial acceptance, and the verifier's uniforms
  and residual draws decide the text."""
  cfg = tiny_config(vocab_size=v, tie_embeddings=False)
  params = jax.tree.map(jnp.zeros_like, model.init_params(jax.random.key(0), cfg))
  params["embed"] = jnp.ones_like(params["embed"])
  head = jax.random.normal(jax.random.key(1), (v,)) * spread
  params["lm_head"] = jnp.zeros_like(params["lm_head"]).at[0].set(head)
  params["final_norm"] = jnp.ones_like(params["final_norm"])
  return cfg, params


DECODERS = {
    "ar": lambda cfg, p, dc, dp: ARDecoder(cfg, p),
    "sd": lambda cfg, p, dc, dp: SDDecoder(cfg, p, dc, dp, SpecOptions(k=4)),
    "sd-1": lambda cfg, p, dc, dp: SDDecoder(cfg, p, dc, dp, SpecOptions(k=4)),  # a call a round (sd_chunk=1)
    "ssd-neural": lambda cfg, p, dc, dp: SSDDecoder(cfg, p, dc, dp, SpecOptions(k=4, fan_out=8, backup="neural")),
    "ssd-fast": lambda cfg, p, dc, dp: SSDDecoder(cfg, p, dc, dp, SpecOptions(k=4, fan_out=8, backup="fast")),
}


@pytest.mark.parametrize("draft", ["uniform", "constant"])
@pytest.mark.parametrize("mode", sorted(DECODERS))
def test_every_round_and_role_gets_its_own_key(uniform, monkeypatch, mode, draft):
  """Per run: each call's key differs from every other call's (rounds, draft vs verifier, tree vs backup), and the
  emitted text, a function of the keys alone here, repeats no 4-gram across rows and positions (by chance: about
  5e-4 for these ~130 4-grams of 64 tokens; 3e-3 with the constant draft's q, flatter than 2:1 mostly). With the
  uniform draft every draft is accepted; with the constant one about 3 in 4, so the verifier's uniforms and
  residual draws shape the text too."""
  cfg, params = uniform
  if draft == "uniform":
    dcfg, dp = cfg, params
  elif mode == "ar":
    pytest.skip("AR has no draft")
  else:
    dcfg, dp = constant_draft(V)
  calls = _record(monkeypatch)
  res = DECODERS[mode](cfg, params, dcfg, dp).generate([[1, 2, 3]] * ROWS, DecodeOptions(
      max_new_tokens=24, temperature=1.0, ignore_eos=True, seed=5, sd_chunk=1 if mode == "sd-1" else 4))
  if draft == "constant" and mode != "ssd-fast":
    assert 0.3 < np.mean([r.stats.extra["acceptance_rate"] for r in res]) < 0.95
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
  drafted, _, cache = draft_propose(params, cache, None, last2, lengths, jax.random.key(1), one, one, one, cfg=cfg, k=k)
  drafted = np.asarray(drafted)
  assert len({tuple(r) for r in drafted}) == b, drafted
  _, _, tree_t, _, _, _ = draft_tree(params, cache, None, last2, jnp.asarray(drafted), lengths, jax.random.key(2), one, one,
                                     one, cfg=cfg, k=k, fan_out=(f,) * (k + 1))
  tree_t = np.asarray(tree_t)  # [B, N, K]
  assert _repeated_4grams(tree_t.reshape(-1, k).tolist()) == 0
  for d in range(1, k):
    assert (tree_t[..., d] != tree_t[..., 0]).mean() > 0.8


def test_verify_draws_each_rows_uniforms_and_its_bonus_apart():
  """steps.verify on 20000 identical rows, against the exact law of (accept_len, bonus) in numpy: the uniform V=4
  target (p = 1/4 everywhere), K = 4 drafts of token 0 with q(0) = 0.55 (each accepted with probability 5/11) and
  residual [0, 0, 1/3, 2/3] after a rejection. Uniforms shared by the rows make every row's outcome the same;
  uniforms and the bonus's Gumbel noise from one key share random bits (JAX's counter-based bits: the same flat index
  of two draws from one key gets the same bits; K = V makes position j's uniform token j's noise), so a rejection at
  position 2, which needs a large u_2, makes token 2 the bonus about half the time instead of a third. The 12 cells
  of nonzero probability at 1e-4 detect w >= 0.055 with power 0.99; those two bugs give w > 1 and w ~ 0.12."""
  from ssd_jax.decode.steps import verify
  from law_stats import chi2_pvalue, detectable_w
  v = k = 4
  b = 20_000
  cfg = tiny_config(vocab_size=v)
  params = jax.tree.map(jnp.zeros_like, model.init_params(jax.random.key(0), cfg))
  q_row = np.asarray([0.55, 0.25, 0.15, 0.05])
  cache = KVCache.init(cfg, b, 16)
  cache = cache.replace(lengths=jnp.full((b,), 3, jnp.int32))
  drafts = jnp.zeros((b, k), jnp.int32)
  q = jnp.broadcast_to(jnp.asarray(q_row, jnp.float32), (b, k, v))
  acc, bonus, _ = verify(params, cache, jnp.ones((b,), jnp.int32), drafts, q, jnp.ones((b,), bool),
                         jax.random.key(9), jnp.float32(1.0), jnp.float32(1.0), cfg=cfg)
  a = 0.25 / 0.55
  resid = np.maximum(0.25 - q_row, 0)
  law = np.zeros((k + 1, v))
  for j in range(k):
    law[j] = a ** j * (1 - a) * resid / resid.sum()
  law[k] = a ** k / v
  counts = np.zeros((k + 1, v))
  np.add.at(counts, (np.asarray(acc), np.asarray(bonus)), 1)
  assert detectable_w(b, int((law > 0).sum())) < 0.055
  assert chi2_pvalue(counts.ravel(), law.ravel()) > 1e-4, (counts / b).round(3)
