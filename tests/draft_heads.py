"""Test drafts whose head is a shuffled, non-prefix subset of the vocabulary.

A trained draft's head holds the most frequent tokens (training/head_vocab.choose_head_vocab), never the first ones:
a test draft with a prefix head (`init_params`' arange) leaves every map between head rows and token ids (the q
compacted for the pipe and scattered back, `to_token_ids`, the fork's exclusion) right by accident. These heads are
neither a prefix nor in order, and leave a token out, so a row taken for a token id, or a token outside the head
given draft mass, changes which tokens are drafted or the q the verifier is handed.
"""
import dataclasses

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
