"""Test drafts whose head is a shuffled, non-prefix subset of the vocabulary.

A trained draft's head holds the most frequent tokens (training/head_vocab.choose_head_vocab), never the first ones:
a test draft with a prefix head (`init_params`' arange) leaves every map between head rows and token ids (the q
compacted for the pipe and scattered back, `to_token_ids`, the fork's exclusion) right by accident. These heads are
neither a prefix nor in order, and leave a token out, so a row taken for a token id, or a token outside the head
given draft mass, changes which tokens are drafted or the q the verifier is handed.
"""
import dataclasses
import os

import jax.numpy as jnp
import numpy as np

# For V = 4: token 1 lies outside the head (only the verifier's residual emits it), the rows are out of order.
V4_HEAD = (3, 0, 2)


def head_tables(head_ids, vocab_size: int):
  """Returns (head_ids [V_out], vocab_map [V]) as int32 arrays: the row of each token id, row 0 for unknown ones."""
  ids = np.asarray(head_ids, np.int32)
  assert len(set(ids.tolist())) == len(ids) and ids.tolist() != list(range(len(ids))), "not a shuffled head"
  vocab_map = np.zeros(vocab_size, np.int32)
  vocab_map[ids] = np.arange(len(ids), dtype=np.int32)
  return ids, vocab_map


def restrict_head(cfg, params, head_ids):
  """Returns (cfg, params) of a standalone draft: the model `params` (full vocabulary) with its embedding and LM head
  cut to the rows of `head_ids`, in that order."""
  assert cfg.head_vocab is None
  ids, vocab_map = head_tables(head_ids, cfg.vocab_size)
  dcfg = dataclasses.replace(cfg, head_vocab=len(ids), name=cfg.name + "-head")
  dp = dict(params, embed=jnp.asarray(params["embed"])[ids], head_ids=jnp.asarray(ids),
            vocab_map=jnp.asarray(vocab_map))
  if not cfg.tie_embeddings:
    dp["lm_head"] = jnp.asarray(params["lm_head"])[:, ids]
  return dcfg, dp


# SSD_JAX_TEST_HEAD=real (scripts/dev/mutation_run.py --head real) gives the law tests' V=4 pair a real draft's sizes:
# SmolLM2's vocabulary of 49152 ids and a head of 16384 rows (checkpoints/draft-smollm2's config), shuffled, holding
# the live tokens at rows whose order is not their ids'. The pair's laws stay tractable: every logit but the four
# live ids' is about -1e4 (`concentrate`), so both models' mass lies on LIVE, spread over the id range (two above
# int16's 32767, three above the head's size), and the numpy laws and chi-square cells run over LIVE alone.
HEAD_KIND = os.environ.get("SSD_JAX_TEST_HEAD", "tiny")
if HEAD_KIND not in ("tiny", "real"):
  raise ValueError(f"SSD_JAX_TEST_HEAD={HEAD_KIND!r}: use tiny or real")
REAL = HEAD_KIND == "real"
REAL_VOCAB, REAL_HEAD_ROWS = 49152, 16384
REAL_LIVE = (41234, 777, 28001, 49151)
LIVE = REAL_LIVE if REAL else (0, 1, 2, 3)  # the V=4 pair's token t is LIVE[t]
_LIVE_ROWS = (1500, 7000, 12000)  # rows of V4_HEAD's tokens 3, 0, 2 in the real head (ids descending)


def real_head_ids() -> np.ndarray:
  """Returns the real-sized head: 16384 token ids in a shuffled order, V4_HEAD's tokens (as LIVE ids) at _LIVE_ROWS,
  LIVE[1] left out."""
  rng = np.random.default_rng(47)
  others = rng.permutation(np.setdiff1d(np.arange(REAL_VOCAB), REAL_LIVE))
  ids = others[:REAL_HEAD_ROWS].astype(np.int32)
  for row, t in zip(_LIVE_ROWS, V4_HEAD):
    ids[row] = REAL_LIVE[t]
  return ids


TINY_LIVE = (0, 1, 2, 3)
# Rows a law test draws: a decode at the real sizes costs 10-30x the tiny pair's a row on 2 cores, so 500 there
# (w >= 0.45 at 64 cells: the bugs the variant is for emit ids of law zero or swap whole laws; the tiny pair's 3000
# rows carry the fine power).
LAW_ROWS = 500 if REAL else 3000


def concentrate(params, live=LIVE, big: float = 1e4):
  """Returns untied float32 `params` (vocabulary V) whose law lies on `live`: the last channel of the residual stream
  is a constant 1 (every embedding row holds it, no block writes it), and the LM head reads it with weight -big for
  every other id (0 elsewhere), so their logits are -big times a positive normed value (below -1e3 here: exp of
  that is 0 in float64)."""
  v = params["lm_head"].shape[1]
  dead = np.ones(v, bool)
  dead[list(live)] = False
  head = jnp.asarray(params["lm_head"]).at[:, dead].set(0.0).at[-1, dead].set(-big).at[-1, list(live)].set(0.0)
  layers = [dict(lp, wo=lp["wo"].at[:, -1].set(0.0), w_down=lp["w_down"].at[:, -1].set(0.0))
            for lp in params["layers"]]
  return dict(params, embed=jnp.asarray(params["embed"]).at[:, -1].set(1.0), layers=layers, lm_head=head,
              final_norm=jnp.asarray(params["final_norm"]).at[-1].set(1.0))


def outside_head_rare(params, weight: float = 8.0):
  """Returns `concentrate`d params whose logit of LIVE[1] (the live id outside the test heads) is lowered by `weight`
  times the constant channel's normed value. A draft puts no mass on that id, so after a rejection the residual
  max(0, p - q) emits it with about the target's mass there over the mass rejected, a bonus no speculation cache can
  hold: with the target's mass on it cut from about 45% to 5% (weight 8, the real EAGLE pair) the residual still
  emits it, and the cache serves most rounds."""
  return dict(params, lm_head=jnp.asarray(params["lm_head"]).at[-1, LIVE[1]].add(-weight))


def concentrate_eagle(params):
  """An EAGLE draft's params whose law lies on LIVE (its head is a `concentrate`d target's): fc copies the last
  feature layer's constant channel, the layer never writes it. Identity under the tiny head."""
  if not REAL:
    return params
  fc = jnp.asarray(params["fc"]).at[:, -1].set(0.0).at[-1, -1].set(1.0)
  lp = dict(params["layer"], wo=params["layer"]["wo"].at[:, -1].set(0.0),
            w_down=params["layer"]["w_down"].at[:, -1].set(0.0))
  return dict(params, fc=fc, layer=lp, final_norm=jnp.asarray(params["final_norm"]).at[-1].set(1.0))


def live(tokens):
  """The V=4 pair's tokens as this head kind's ids (a prompt)."""
  return [LIVE[t] for t in tokens]


def cells(token_rows, n: int = 3, start: int = 0, ids=None) -> np.ndarray:
  """Counts [5] * n of the rows' tokens start..start+n by index in `ids` (LIVE); index 4 counts any id outside."""
  ids = LIVE if ids is None else ids
  index = {t: i for i, t in enumerate(ids)}
  counts = np.zeros((len(ids) + 1,) * n)
  for row in token_rows:
    counts[tuple(index.get(int(t), len(ids)) for t in row[start:start + n])] += 1
  return counts


def padded(law) -> np.ndarray:
  """A law over LIVE ** n with a zero cell appended on every axis (ids outside LIVE: see `cells`)."""
  return np.pad(np.asarray(law), [(0, 1)] * np.ndim(law))


def generate(dec, prompts, opts, chunk: int = 500):
  """dec.generate(prompts, opts); under the real head in batches of `chunk` rows (seed + 7919 * batch), which keeps
  the [B, K + 1, 49152] laws a few hundred MB."""
  if not REAL:
    return dec.generate(prompts, opts)
  out = []
  for i in range(0, len(prompts), chunk):
    out += dec.generate(prompts[i:i + chunk], dataclasses.replace(opts, seed=opts.seed + 7919 * (i // chunk)))
  return out
