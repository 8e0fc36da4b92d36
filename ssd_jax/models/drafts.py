"""Drafts off the shelf: any model of the supported families (a Hugging Face safetensors directory, a GGUF file or
our Orbax format) that shares the target's tokenizer runs as the standalone draft kind, a plain causal LM.

Shared tokenizer: checked before any weight is read (`check_shared_tokenizer`): the vocabulary sizes, and where both
sides ship a tokenizer, the token string of every id; a mismatch is one line naming the first differing id.

Reduced head (`draft_head_vocab=N`, `--draft-head-vocab N`): the draft proposes only N tokens, chosen at load by
`choose_head`: the special and end-of-sequence tokens always, then the most frequent others. The frequencies are
`head_counts` (one count per token id, e.g. from tokenizing your own corpus) when given; otherwise the tokenizer's
own order stands for them: BPE vocabularies number their tokens in merge order (BPE merges the most frequent pair
first) and SentencePiece sorts its pieces by score, so lower ids are the more frequent tokens. Ties go to the lower
id: the choice is deterministic. The head's rows are in that order (most frequent first), stored as our
head_ids / vocab_map (model.py), so the decoders' head-row/token-id mapping applies unchanged; the input embedding
keeps every row (`ModelConfig.full_embed`), so the draft still reads every token. Exactness is unchanged: the
draft's law is over token ids and zero outside its head.
"""
from __future__ import annotations

import dataclasses
import glob
import os

import numpy as np

from .config import ModelConfig, check_same_vocabulary, is_eagle
from .families import CheckpointError


def model_format(path: str) -> str | None:
  """Returns 'gguf', 'hf' (a safetensors directory), 'ours' (an Orbax checkpoint) or None for what `path` holds."""
  if os.path.isfile(path) and path.endswith(".gguf"):
    return "gguf"
  if os.path.isdir(path) and glob.glob(os.path.join(path, "*.safetensors")):
    return "hf"
  if os.path.exists(os.path.join(path, "config.json")):
    return "ours"
  return None


def read_vocab(path: str):
  """Returns (config, raw tokenizers.Tokenizer or None) of a model file or directory without reading its weights."""
  from tokenizers import Tokenizer

  from . import checkpoints, model_files
  from .tokenizer import tokenizer_from_gguf_meta

  kind = model_format(path)
  if kind == "gguf":
    cfg, meta = model_files.gguf_header(path)
    return cfg, tokenizer_from_gguf_meta(meta) if "tokenizer.ggml.tokens" in meta else None
  if kind is None:
    raise CheckpointError(f"no model at {path} (expected a GGUF file, a Hugging Face safetensors directory or an "
                          f"ssd-jax checkpoint)")
  cfg = model_files.hf_config(path)[0] if kind == "hf" else checkpoints.read_config(path)
  tok_path = os.path.join(path, "tokenizer.json")
  return cfg, Tokenizer.from_file(tok_path) if os.path.exists(tok_path) else None


def _strings(tok) -> list:
  """Returns the token string of each id of a tokenizers.Tokenizer (None for ids it leaves out)."""
  vocab = tok.get_vocab(with_added_tokens=True)
  out = [None] * (max(vocab.values()) + 1 if vocab else 0)
  for s, i in vocab.items():
    out[i] = s
  return out


def check_shared_tokenizer(draft_cfg, draft_tok, target_cfg, target_tok, where: str) -> None:
  """Raises CheckpointError (one line, the first mismatch) unless the draft at `where` shares the target's
  vocabulary: the same vocab_size and, when both have a tokenizer, the same token string for every id."""
  check_same_vocabulary(draft_cfg, target_cfg, where, CheckpointError)
  if draft_tok is None or target_tok is None:
    return
  d, t = _strings(draft_tok), _strings(target_tok)
  n = max(len(d), len(t))
  d, t = d + [None] * (n - len(d)), t + [None] * (n - len(t))
  bad = next((i for i in range(n) if d[i] != t[i]), None)
  if bad is not None:
    raise CheckpointError(f"draft {where} has token {d[bad]!r} at id {bad} where the target has {t[bad]!r}; a draft "
                          f"must share the target's tokenizer")


def kept_tokens(text_tok, vocab_size: int) -> list[int]:
  """Returns the ids a reduced head always keeps: the tokenizer's special tokens and end-of-sequence ids (sorted)."""
  if text_tok is None:
    return []
  ids = set(text_tok.eos_ids)
  ids |= {i for i, t in text_tok.tok.get_added_tokens_decoder().items() if t.special}
  return sorted(i for i in ids if 0 <= i < vocab_size)


def choose_head(vocab_size: int, n: int, counts=None, keep=()) -> np.ndarray:
  """Returns the head's token ids [n] int32, row by row: `keep` (in id order), then the most frequent other tokens
  by `counts` [vocab_size] (None: lower ids first), ties to the lower id."""
  keep = sorted(int(i) for i in keep)
  if not len(keep) < n <= vocab_size:
    raise ValueError(f"the draft's head size (draft_head_vocab, --draft-head-vocab) must be in ({len(keep)}, "
                     f"{vocab_size}]: more than the {len(keep)} special and end-of-sequence tokens it always keeps, "
                     f"at most the vocabulary; got {n}")
  if counts is None:
    order = np.arange(vocab_size)
  else:
    counts = np.asarray(counts, np.float64)
    if counts.shape != (vocab_size,):
      raise ValueError(f"draft_head_counts must hold one count per token id ({vocab_size}), got shape {counts.shape}")
    order = np.argsort(-counts, kind="stable")
  rest = order[~np.isin(order, keep)]
  return np.concatenate([np.asarray(keep, np.int64), rest])[:n].astype(np.int32)


def reduce_head(cfg: ModelConfig, params: dict, head_ids):
  """Returns (cfg, params) of a full-vocabulary draft whose LM head keeps only the rows of `head_ids` (in that
  order): head_ids / vocab_map added, the embedding kept whole (cfg.full_embed), the head an untied lm_head."""
  import jax
  import jax.numpy as jnp

  if cfg.head_vocab is not None:
    raise ValueError(f"draft_head_vocab cuts a full-vocabulary draft; {cfg.name!r} already has a head of "
                     f"{cfg.head_vocab} tokens")
  ids = np.asarray(head_ids, np.int32)
  vocab_map = np.zeros(cfg.vocab_size, np.int32)
  vocab_map[ids] = np.arange(len(ids), dtype=np.int32)
  dev = next(iter(params["embed"].devices())) if hasattr(params["embed"], "devices") else None
  put = lambda x: jax.device_put(x, dev)  # noqa: E731
  head = params["embed"][ids].T if cfg.tie_embeddings else params["lm_head"][:, ids]
  out = dict(params, lm_head=put(jnp.asarray(head)), head_ids=put(ids), vocab_map=put(vocab_map))
  new = dataclasses.replace(cfg, head_vocab=len(ids), full_embed=True, tie_embeddings=False,
                            name=f"{cfg.name}-head{len(ids)}")
  return new, out


def load_draft(path: str, target_cfg: ModelConfig, target_tok=None, head_vocab: int | None = None, head_counts=None,
               dtype: str | None = "auto", mesh=None):
  """Returns (cfg, params) of the standalone draft at `path` (any format load_model reads) for a target of
  `target_cfg` with `target_tok` (a TextTokenizer, or None: only the vocabulary size is checked): its tokenizer
  checked first, its head cut to `head_vocab` tokens (choose_head with `head_counts`) when given."""
  from . import checkpoints

  dcfg, dtok = read_vocab(path)
  if is_eagle(dcfg):
    raise ValueError(f"{path} is an EAGLE draft; it reads the target's features and is loaded by api.load")
  check_shared_tokenizer(dcfg, dtok, target_cfg, None if target_tok is None else target_tok.tok, path)
  cfg, params, _ = checkpoints.load_model(path, dtype, mesh=mesh)
  if head_vocab is None:
    return cfg, params
  head = choose_head(target_cfg.vocab_size, head_vocab, head_counts, kept_tokens(target_tok, target_cfg.vocab_size))
  return reduce_head(cfg, params, head)
