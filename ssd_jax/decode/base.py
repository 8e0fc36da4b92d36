"""What every decoder shares: options, results, batching of ragged prompts, cache sizing, jitted prefill."""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from .. import model
from ..config import ModelConfig
from ..kv_cache import KVCache, round_slots
from ..metrics import RequestStats


@dataclasses.dataclass(frozen=True)
class DecodeOptions:
  max_new_tokens: int = 128
  temperature: float = 0.0      # 0 = greedy
  top_p: float = 1.0
  seed: int = 0
  ignore_eos: bool = False      # produce exactly max_new_tokens
  eos_id: int | None = None

  def validate(self):
    if self.max_new_tokens < 1:
      raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
    if self.temperature < 0:
      raise ValueError(f"temperature must be >= 0, got {self.temperature}")
    if not 0 < self.top_p <= 1:
      raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


@dataclasses.dataclass
class DecodeResult:
  token_ids: list[int]          # new tokens (EOS included when it was produced)
  stats: RequestStats


PROMPT_BUCKET = 64


def pad_prompts(prompts: Sequence[Sequence[int]], bucket: int = PROMPT_BUCKET):
  """Returns (tokens [B, T_pad] int32, lengths [B] int32), right-padded, T_pad a multiple of `bucket`."""
  if not prompts:
    raise ValueError("no prompts given")
  lens = [len(p) for p in prompts]
  if min(lens) < 1:
    raise ValueError("empty prompt: every prompt needs at least one token")
  t = round_slots(max(lens), bucket)
  out = np.zeros((len(prompts), t), np.int32)
  for i, p in enumerate(prompts):
    out[i, : len(p)] = p
  return out, np.asarray(lens, np.int32)


def cache_slots(cfg: ModelConfig, max_prompt: int, max_new: int, lookahead: int = 0) -> int:
  """Returns the cache size for a batch, checking it fits the model's context; lookahead = extra scratch slots."""
  need = max_prompt + max_new + lookahead
  if max_prompt + max_new > cfg.max_seq_len:
    raise ValueError(f"prompt ({max_prompt} tokens) + max_new_tokens ({max_new}) exceeds the model's context of "
                     f"{cfg.max_seq_len} tokens; shorten the prompt or lower max_new_tokens")
  return round_slots(max(need, max_prompt + PROMPT_BUCKET), 128)


@functools.partial(jax.jit, static_argnames=("cfg", "attn_impl"), donate_argnames=("cache",))
def prefill(params, tokens, lengths, cache: KVCache, cfg: ModelConfig, attn_impl: str = "ref"):
  """Returns (logits at each row's last prompt token [B, V_out], cache holding the prompts, lengths set).

  Static: cfg, attn_impl and the shapes (tokens are padded to a bucket, so a few programs serve all prompts).
  """
  cache = cache.replace(lengths=jnp.zeros_like(lengths))
  logits, cache = model.forward_causal(params, tokens, cache, cfg, logit_index=(lengths - 1)[:, None],
                                       attn_impl=attn_impl)
  return logits[:, 0], cache.replace(lengths=lengths)


def batched(seq: Sequence, n: int):
  for i in range(0, len(seq), n):
    yield seq[i:i + n]


StreamFn = Callable[[int, list[int]], None]  # (row, new token ids) for the first request of a batch


class Programs:
  """Ahead-of-time compiled programs, keyed by the shapes and static arguments of each call.

  Compilation happens outside the timed decode loop, its time is reported separately (`compile_seconds`), and a
  decode loop that would need a new program shows up as a new key (tests count them).
  """

  def __init__(self):
    self._compiled = {}
    self.compile_seconds = 0.0
    self.compiles = 0

  def __call__(self, fn, *args, **static):
    return self.compile_only(fn, *args, **static)(*args)

  def compile_only(self, fn, *args, **static):
    """Returns the compiled program for these argument shapes, compiling it on first use."""
    leaves = jax.tree.leaves(args)
    # Placement is part of the key: the same function compiled for the target's and the draft's device differs.
    key = (fn, jax.tree.structure(args),
           tuple((np.shape(x), str(jnp.result_type(x)), str(getattr(x, "sharding", None))) for x in leaves),
           tuple(sorted(static.items())))
    exe = self._compiled.get(key)
    if exe is None:
      import time
      t = time.perf_counter()
      exe = fn.lower(*args, **static).compile()
      self.compile_seconds += time.perf_counter() - t
      self.compiles += 1
      self._compiled[key] = exe
    return exe
