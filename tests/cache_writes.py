"""What a decode writes into its KV caches, for the tests of the lookahead (decode.base.run_lookaheads: the slots a
run may write past a row's text, which cache_slots and the memory check size caches with): each side's caches after a
run, and how far past the text their written slots reach."""
import numpy as np

from ssd_jax.decode.base import Programs
from ssd_jax.models.kv_cache import KVCache

PROMPT = 64  # tokens in every prompt of `prompts`: a prefill writes exactly these slots (a bucket with no padding)
TARGET_PROGRAMS = ("verify", "ar_chunk")  # and sd_chunk's first cache; the draft's programs return the others


def prompts(vocab: int, rows: int = 4, seed: int = 0) -> list[list[int]]:
  """Returns `rows` random prompts of PROMPT tokens."""
  return np.random.default_rng(seed).integers(0, vocab, (rows, PROMPT)).tolist()


def record_caches(monkeypatch) -> dict:
  """Patches Programs.__call__ to keep the last KV cache each program returned, by (program name, position among
  its caches: sd_chunk returns the target's, then the draft's); returns that dict, filled as decodes run."""
  last = {}
  call = Programs.__call__

  def recording(self, fn, *args, **static):
    out = call(self, fn, *args, **static)
    caches = [x for x in (out if isinstance(out, tuple) else (out,)) if isinstance(x, KVCache)]
    for i, c in enumerate(caches):
      last[getattr(fn, "__name__", ""), i] = c
    return out

  monkeypatch.setattr(Programs, "__call__", recording)
  return last


def slots_past_text(last: dict, max_new_tokens: int) -> dict[int, int]:
  """Returns {side: the most slots written past PROMPT + max_new_tokens in any row}, side 0 the target, 1 the draft,
  over the caches in `last` still alive after a run of `prompts` (each side's last; every earlier one was donated
  to the next call). A cache starts as zeros: a written slot holds a nonzero key."""
  past = {}
  for (name, i), cache in last.items():
    if cache.k[0].is_deleted():
      continue
    side = 0 if name in TARGET_PROGRAMS or (name, i) == ("sd_chunk", 0) else 1
    written = np.flatnonzero(np.abs(np.asarray(cache.k[0])).sum(axis=(0, 2, 3)) > 0)
    past[side] = max(past.get(side, 0), int(written.max()) + 1 - PROMPT - max_new_tokens)
  return past
