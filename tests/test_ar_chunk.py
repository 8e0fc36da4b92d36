"""AR in chunks of n steps a call (DecodeOptions.ar_chunk, steps.ar_chunk): the same tokens as one step a call,
greedy and sampled, at batch 1 and on ragged batches whose rows stop mid-chunk; one call a chunk."""
import jax
import numpy as np
import pytest

from ssd_jax.decode import ARDecoder, DecodeOptions
from ssd_jax.decode.base import Programs
from ssd_jax.models import model
from ssd_jax.models.config import tiny_config

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11], [12, 13, 14, 15]]
SETTINGS = {"greedy": dict(temperature=0.0), "sampled": dict(temperature=0.8, top_p=0.9, seed=11)}


@pytest.fixture(scope="module")
def dec():
  cfg = tiny_config(vocab_size=64)
  return ARDecoder(cfg, model.init_params(jax.random.key(7), cfg, scale=0.3))


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
  """Stop ids taken from the unfused text end rows at different places inside chunks of 4 (row 0 at its 3rd token:
  in the first chunk, after the prefill's token); the others run on to max_new_tokens 10 or their own stop."""
  opts = dict(max_new_tokens=10, ignore_eos=True, **SETTINGS[setting])
  free = _run(dec, PROMPTS, 1, **opts)
  stops = (free[0][2], free[3][5])
  opts.update(ignore_eos=False, eos_id=stops)
  ref = _run(dec, PROMPTS, 1, **opts)
  assert len(ref[0]) <= 3 and len({len(r) for r in ref}) > 1, ref
  for n in (3, 4):
    assert _run(dec, PROMPTS, n, **opts) == ref, n


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


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "4"])
def test_ar_chunk_checked(bad):
  with pytest.raises(ValueError, match="ar_chunk"):
    DecodeOptions(ar_chunk=bad)
  assert DecodeOptions(ar_chunk=np.int64(3)).ar_chunk == 3
