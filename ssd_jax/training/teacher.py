"""The distillation teacher computed once: the target's top-k over the draft's head, cached on disk by content."""
from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np

from ..models.config import ModelConfig
from .draft_step import teacher_probs


class TeacherCache:
  """The target's top-k next-token distribution over the draft's head, per position of a fixed set of windows.

  Distillation otherwise runs the 135M-parameter target on every batch (most of a CPU train step), again for every
  pass over the same windows. The cache computes it once, in resumable chunks of `chunk` windows, each written
  atomically under `root/<key of head, target and k>/chunk_<key of its windows>.npz`. Chunks are addressed by their
  content: a changed corpus never reads a stale chunk, and a grown one (make_windows over more shards appends
  windows) reuses every chunk it shares and computes only the new ones. Rows are head indices (uint16 up to 65,536
  of them), probabilities float16.
  """

  def __init__(self, root: str, windows: np.ndarray, head_ids: np.ndarray | None, target_name: str, k: int,
               chunk: int = 64):
    import hashlib

    if k < 1:
      raise ValueError(f"teacher top-k must be >= 1, got {k}")

    def key(*parts) -> str:
      h = hashlib.sha1()
      for part in parts:
        if isinstance(part, str):
          h.update(part.encode())
        else:
          h.update(str(part.shape).encode())
          h.update(part.tobytes())
      return h.hexdigest()[:16]

    self.dir = os.path.join(root, key(np.asarray([] if head_ids is None else head_ids, np.int64),
                                      f"{target_name}|{k}"))
    self.windows, self.head_ids, self.k, self.chunk = windows, head_ids, k, chunk
    self.n_chunks = -(-len(windows) // chunk)
    self._keys = [key(np.ascontiguousarray(self._chunk_windows(c), np.int32)) for c in range(self.n_chunks)]

  def _chunk_windows(self, c: int) -> np.ndarray:
    return self.windows[c * self.chunk:(c + 1) * self.chunk]

  def _path(self, c: int) -> str:
    return os.path.join(self.dir, f"chunk_{self._keys[c]}.npz")

  def missing(self) -> list[int]:
    return [c for c in range(self.n_chunks) if not os.path.exists(self._path(c))]

  def missing_windows(self) -> int:
    return sum(len(self._chunk_windows(c)) for c in self.missing())

  def build(self, target_params, target_cfg: ModelConfig, progress=None, sub_batch: int = 4) -> None:
    """Computes the chunks not yet on disk; `progress(n_windows_done)` is called after each chunk."""
    os.makedirs(self.dir, exist_ok=True)
    head = None if self.head_ids is None else jnp.asarray(self.head_ids)
    k = self.k

    @jax.jit
    def top(tp, toks):
      p = teacher_probs(tp, target_cfg, head, toks)
      vals, rows = jax.lax.top_k(p, k)
      return rows.astype(jnp.uint16 if p.shape[-1] <= 65536 else jnp.int32), vals.astype(jnp.float16)

    for c in self.missing():
      w = self._chunk_windows(c)
      outs = [top(target_params, jnp.asarray(w[i:i + sub_batch])) for i in range(0, len(w), sub_batch)]
      rows = np.concatenate([np.asarray(o[0]) for o in outs])
      probs = np.concatenate([np.asarray(o[1]) for o in outs])
      tmp = self._path(c)[:-4] + ".tmp.npz"
      np.savez(tmp, rows=rows, probs=probs)
      os.replace(tmp, self._path(c))
      if progress is not None:
        progress(len(w))

  def load(self) -> tuple[np.ndarray, np.ndarray]:
    """Returns (rows [W, T, k] uint16 (int32 above 65,536 head rows), probs [W, T, k] float16) for all windows;
    every chunk must be built."""
    if self.missing():
      raise RuntimeError(f"teacher cache {self.dir} is incomplete: build() it first")
    zs = [np.load(self._path(c)) for c in range(self.n_chunks)]
    return np.concatenate([z["rows"] for z in zs]), np.concatenate([z["probs"] for z in zs])
