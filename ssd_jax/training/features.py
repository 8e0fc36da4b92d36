"""The target's features over the target-answer corpora, computed once and cached on local disk for EAGLE training.

Every corpus shard written by scripts/make_target_corpus.py (a stream of prompt-and-answer examples: `ids`, `mask`)
gets a companion under `root/<corpus name>/`:

  shard_NNNNN.feats.npy   float16 [N, n_feat * d]: the target's residual stream after its feature layers at every
                          token of the shard (model.forward with feature_layers), each example run on its own (no
                          attention across examples), exactly as the target computes them when it decodes
  shard_NNNNN.meta.npz    ids [N], mask [N] (1 = answer token), starts [E] (where each example, or each piece of
                          one longer than 1,024 tokens, begins), feature_layers, target name

The meta file is written last, after an atomic rename of the features, so a shard with a meta file is complete and an
interrupted run resumes at the first shard without one. Nothing here is committed: it is ~3.5 KB a token (8 GB for
the 2.35M tokens of the committed corpora) and a target pass recomputes it (~700 tokens/s on 2 CPU cores).
"""
from __future__ import annotations

import functools
import glob
import os
import re
import time

import jax
import jax.numpy as jnp
import numpy as np

from ..models import model
from ..models.config import ModelConfig
from ..kernels import causal_mask_info
from ..models.kv_cache import KVCache
from .draft_data import example_starts

START_ID = 1  # <|im_start|>: examples begin at one (draft_data.example_starts)
_SHARD = re.compile(r"shard_(\d{5})\.npz")


@functools.partial(jax.jit, static_argnames=("cfg", "feature_layers"))
def target_features(params, tokens, cfg: ModelConfig, feature_layers: tuple):
  """Returns the features float16 [B, T, n_feat * d] of whole sequences [B, T] (no LM head: the corpus's next
  token is already the target's greedy choice at every answer position, which is all the draft is trained on)."""
  b, t = tokens.shape
  cache = KVCache.init(cfg, b, t, params["embed"].dtype)
  pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
  _, _, feats = model.hidden_states(params, tokens, pos, cache, pos, causal_mask_info(pos), cfg,
                                    feature_layers=feature_layers)
  return feats.astype(jnp.float16)


def corpus_shards(corpus_dir: str) -> list[tuple[int, str]]:
  """Returns [(shard number, path)] of a corpus directory's complete shards, in order."""
  out = []
  for f in sorted(glob.glob(os.path.join(corpus_dir, "shard_*.npz"))):
    m = _SHARD.fullmatch(os.path.basename(f))
    if m:
      out.append((int(m.group(1)), f))
  return out


def example_pieces(ids: np.ndarray, mask: np.ndarray, max_len: int) -> list[tuple[int, int]]:
  """Returns [(start, end)] of the stream's examples, those longer than max_len cut into max_len pieces."""
  starts = example_starts(ids, mask, START_ID)
  bounds = np.append(starts, len(ids))
  return [(lo, min(int(b), lo + max_len)) for a, b in zip(bounds[:-1], bounds[1:]) for lo in range(int(a), int(b),
                                                                                                   max_len)]


def _batches(pieces, bucket: int, tokens_per_batch: int, fixed_rows: bool = False):
  """Yields (padded length, rows, [piece indices]) with pieces of similar length together (longest first); rows is
  a power of two (or, with fixed_rows, always tokens_per_batch // length), so a few compiled programs serve every
  shard with little padding."""
  order = sorted(range(len(pieces)), key=lambda i: -(pieces[i][1] - pieces[i][0]))
  i = 0
  while i < len(order):
    n = pieces[order[i]][1] - pieces[order[i]][0]
    t = -(-n // bucket) * bucket
    members = order[i:i + max(1, tokens_per_batch // t)]
    yield t, max(1, tokens_per_batch // t) if fixed_rows else 1 << (len(members) - 1).bit_length(), members
    i += len(members)


def shard_features(params, cfg: ModelConfig, ids: np.ndarray, mask: np.ndarray, feature_layers: tuple,
                   max_len: int = 1024, bucket: int = 64, tokens_per_batch: int = 4096, fixed_rows: bool = False):
  """Returns (features float16 [N, n_feat * d], starts [E]) for one shard's stream.

  The defaults suit a CPU; an accelerator wants few, large batches of one shape (bucket = max_len,
  tokens_per_batch = 64 * max_len, fixed_rows), since each new shape is a compilation."""
  pieces = example_pieces(ids, mask, max_len)
  feats = np.zeros((len(ids), len(feature_layers) * cfg.d_model), np.float16)
  for t, rows, members in _batches(pieces, bucket, tokens_per_batch, fixed_rows):
    tok = np.zeros((rows, t), np.int32)
    for r, i in enumerate(members):
      lo, hi = pieces[i]
      tok[r, : hi - lo] = ids[lo:hi]
    f = np.asarray(target_features(params, jnp.asarray(tok), cfg, feature_layers))
    for r, i in enumerate(members):
      lo, hi = pieces[i]
      feats[lo:hi] = f[r, : hi - lo]
  return feats, np.asarray([p[0] for p in pieces], np.int64)


def feature_dir(root: str, corpus_dir: str) -> str:
  return os.path.join(root, os.path.basename(os.path.normpath(corpus_dir)))


def missing_shards(root: str, corpus_dirs, feature_layers=None) -> list[tuple[str, int, str]]:
  """Returns [(corpus dir, shard number, shard path)] whose features are not cached yet."""
  out = []
  for c in corpus_dirs:
    for n, path in corpus_shards(c):
      meta = os.path.join(feature_dir(root, c), f"shard_{n:05d}.meta.npz")
      if not os.path.exists(meta):
        out.append((c, n, path))
      elif feature_layers is not None and tuple(np.load(meta)["feature_layers"]) != tuple(feature_layers):
        raise ValueError(f"{meta} holds features of target layers {tuple(np.load(meta)['feature_layers'])}, not "
                         f"{tuple(feature_layers)}: use another --features-dir or delete it")
  return out


def build(root: str, corpus_dirs, params, cfg: ModelConfig, feature_layers: tuple, target_name: str,
          log=print) -> int:
  """Computes the features of every shard not cached yet; returns the number of shards computed."""
  todo = missing_shards(root, corpus_dirs, feature_layers)
  total = sum(len(np.load(p)["ids"]) for _, _, p in todo)
  done_tokens, t0 = 0, time.perf_counter()
  for c, n, path in todo:
    z = np.load(path)
    ids, mask = z["ids"], z["mask"]
    feats, starts = shard_features(params, cfg, ids, mask, feature_layers)
    if not np.isfinite(feats).all():
      raise FloatingPointError(f"non-finite target features in {path} (float16 overflow?)")
    out = feature_dir(root, c)
    os.makedirs(out, exist_ok=True)
    tmp = os.path.join(out, f"shard_{n:05d}.feats.tmp.npy")
    np.save(tmp, feats)
    os.replace(tmp, os.path.join(out, f"shard_{n:05d}.feats.npy"))
    tmp = os.path.join(out, f"shard_{n:05d}.meta.tmp.npz")
    np.savez(tmp, ids=ids, mask=mask, starts=starts, feature_layers=np.asarray(feature_layers, np.int32), target=np.asarray(target_name))
    os.replace(tmp, os.path.join(out, f"shard_{n:05d}.meta.npz"))
    done_tokens += len(ids)
    rate = done_tokens / (time.perf_counter() - t0)
    log(f"features: {os.path.basename(os.path.normpath(c))} shard {n}: {done_tokens:,}/{total:,} tokens, "
        f"{rate:.0f} tokens/s, ~{(total - done_tokens) / max(rate, 1e-9) / 60:.0f} min left")
  return len(todo)


def in_memory(corpus_dirs, params, cfg: ModelConfig, feature_layers: tuple, log=print, **batching) -> list:
  """Returns [(shard number, feats, ids, mask, starts)] of every shard of `corpus_dirs`, computed now and kept in
  memory (nothing written): for a machine whose target pass is fast (an accelerator), where a disk cache is not
  worth it. `batching` goes to shard_features."""
  out, done, t0 = [], 0, time.perf_counter()
  for c in corpus_dirs:
    for n, path in corpus_shards(c):
      z = np.load(path)
      feats, starts = shard_features(params, cfg, z["ids"], z["mask"], feature_layers, **batching)
      if not np.isfinite(feats).all():
        raise FloatingPointError(f"non-finite target features in {path} (float16 overflow?)")
      out.append((n, feats, z["ids"], z["mask"], starts))
      done += len(z["ids"])
    log(f"features in memory: {os.path.basename(os.path.normpath(c))} done, {done:,} tokens, "
        f"{done / (time.perf_counter() - t0):.0f} tokens/s")
  return out
