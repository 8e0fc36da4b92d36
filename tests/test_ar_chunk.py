"""AR in chunks of n steps a call (DecodeOptions.ar_chunk, steps.ar_chunk): the same tokens as one step a call,
greedy and sampled, at batch 1 and on ragged batches whose rows stop mid-chunk; one call a chunk."""
import numpy as np
import pytest

from ssd_jax.decode import ARDecoder, DecodeOptions
from ssd_jax.decode.base import Programs, run_lookaheads

import cache_writes
from pairs import cut_at_first

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11], [12, 13, 14, 15]]
SETTINGS = {"greedy": dict(temperature=0.0), "sampled": dict(temperature=0.8, top_p=0.9, seed=11)}


@pytest.fixture(scope="module")
def dec(tiny_pair):
  return ARDecoder(*tiny_pair)


def _run(dec, prompts, n, **opts):
  return [r.token_ids for r in dec.generate(prompts, DecodeOptions(ar_chunk=n, **opts))]


@pytest.mark.parametrize("setting", sorted(SETTINGS))
@pytest.mark.parametrize("rows", [1, 4])
def test_chunks_give_the_unfused_tokens(dec, setting, rows):
  """max_new_tokens 11 is a multiple of none of the chunks past the first token (10 = 3*3+1 = 4*2+2)."""
  prompts, opts = PROMPTS[:rows], dict(max_new_tokens=11, ignore_eos=True, **SETTINGS[setting])
  ref = _run(dec, prompts, 1, **opts)
  assert all(len(r) == 11 for r in ref)
  for n in (2, 3, 4, 8):
    assert _run(dec, prompts, n, **opts) == ref, n


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_rows_stopping_mid_chunk(dec, setting):
  """Two stop ids taken from the unfused text (each at its first occurrence in a row, one in row 0's) end rows at
  different places, some strictly inside a chunk of 3 and some inside a chunk of 4; every row is the free text cut at its first stop id, in one call a step and in chunks of 3 and 4, and each
  row's target_forwards counts its own tokens, not the steps its chunks ran past its stop."""
  opts = dict(max_new_tokens=10, ignore_eos=True, **SETTINGS[setting])
  free = _run(dec, PROMPTS, 1, **opts)
  # Candidate stop ids: a token at its first occurrence in a row, past the prefill's. Take a pair, one of row 0's,
  # that ends rows strictly inside a chunk of 3 and inside a chunk of 4 (tokens past the prefill's not a multiple).
  firsts = lambda r: [t for j, t in enumerate(free[r]) if j >= 1 and t not in free[r][:j]]  # noqa: E731
  inside = lambda want, n: any(len(w) < 10 and (len(w) - 1) % n for w in want)  # noqa: E731
  pairs = [(a, b) for a in firsts(0) for r in (1, 2, 3) for b in firsts(r) if a != b]
  stops = next(p for p in pairs if inside([cut_at_first(r, p) for r in free], 3)
               and inside([cut_at_first(r, p) for r in free], 4))
  want = [cut_at_first(r, stops) for r in free]
  assert want[0][-1] == stops[0] and len({len(r) for r in want}) > 1, want
  opts.update(ignore_eos=False, eos_id=stops)
  for n in (1, 3, 4):
    res = dec.generate(PROMPTS, DecodeOptions(ar_chunk=n, **opts))
    assert [r.token_ids for r in res] == want, n
    assert [r.stats.target_forwards for r in res] == [len(r) for r in want], n


def test_one_call_a_chunk_and_streamed_in_chunks(dec, monkeypatch):
  """9 new tokens in chunks of 4: the prefill's token, then two ar_chunk calls and no single-step verify; the
  first row streams as chunks; target_forwards still counts one forward a token."""
  names = []
  call = Programs.__call__

  def counting(self, fn, *args, **static):
    names.append(getattr(fn, "__name__", ""))
    return call(self, fn, *args, **static)

  monkeypatch.setattr(Programs, "__call__", counting)
  pieces = []
  res = dec.generate(PROMPTS[:2], DecodeOptions(max_new_tokens=9, ignore_eos=True, ar_chunk=4),
                     stream=lambda row, ids: pieces.append(list(ids)))
  assert names.count("ar_chunk") == 2 and "verify" not in names, names
  assert [len(p) for p in pieces] == [1, 4, 4] and sum(pieces, []) == res[0].token_ids
  assert [r.stats.target_forwards for r in res] == [9, 9]
  # 10 tokens: the prefill's, two chunks of 4, and one step left: a chunk of 4 whose last 3 steps no row keeps.
  names.clear()
  res = dec.generate(PROMPTS[:2], DecodeOptions(max_new_tokens=10, ignore_eos=True, ar_chunk=4))
  assert names.count("ar_chunk") == 3 and [len(r.token_ids) for r in res] == [10, 10]
  assert [r.stats.target_forwards for r in res] == [10, 10]  # tokens, not the 13 steps the chunks ran


def test_a_chunked_run_writes_within_its_lookahead(dec, monkeypatch):
  """Every slot a run in chunks of 8 writes lies within its lookahead past the text (run_lookaheads: what cache_slots
  and the memory check size caches with): at 10 new tokens a row's last chunk runs 6 steps past its end."""
  last = cache_writes.record_caches(monkeypatch)
  dec.generate(cache_writes.prompts(dec.tcfg.vocab_size), DecodeOptions(max_new_tokens=10, ignore_eos=True, ar_chunk=8))
  past = cache_writes.slots_past_text(last, 10)
  assert 0 < past[0] <= run_lookaheads(0, ar_chunk=8)[0], past


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "4"])
def test_ar_chunk_checked(bad):
  with pytest.raises(ValueError, match="ar_chunk"):
    DecodeOptions(ar_chunk=bad)
  assert DecodeOptions(ar_chunk=np.int64(3)).ar_chunk == 3
