"""SD in chunks of n rounds a call (DecodeOptions.sd_chunk, sd_chunk.py): the same tokens as a call per round,
greedy and sampled, at batch 1 and on ragged batches whose rows stop mid-chunk; one call a chunk; greedy equals AR."""
import pytest

from ssd_jax.decode import ARDecoder, DecodeOptions, SDDecoder, SpecOptions
from ssd_jax.decode import sd_chunk
from ssd_jax.decode.base import Programs, run_lookaheads

import cache_writes

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11], [12, 13, 14, 15]]
SETTINGS = {"greedy": dict(temperature=0.0), "sampled": dict(temperature=0.8, top_p=0.9, seed=11)}


def _dec(pair, k):
  cfg, tp, dp = pair
  return SDDecoder(cfg, tp, cfg, dp, SpecOptions(k=k))


def _run(dec, prompts, n, **opts):
  return [r.token_ids for r in dec.generate(prompts, DecodeOptions(sd_chunk=n, **opts))]


@pytest.mark.parametrize("setting", sorted(SETTINGS))
@pytest.mark.parametrize("rows,k", [(1, 2), (4, 1), (4, 3)])
def test_chunks_give_the_unfused_tokens(sd_pair, setting, rows, k):
  dec = _dec(sd_pair, k)
  prompts, opts = PROMPTS[:rows], dict(max_new_tokens=13, ignore_eos=True, **SETTINGS[setting])
  ref = _run(dec, prompts, 1, **opts)
  assert all(len(r) == 13 for r in ref)
  for n in (2, 3, 4):
    assert _run(dec, prompts, n, **opts) == ref, n
  if setting == "greedy":
    ar = [r.token_ids for r in ARDecoder(sd_pair[0], sd_pair[1]).generate(prompts, DecodeOptions(**opts))]
    assert ref == ar


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_rows_stopping_mid_chunk(sd_pair, setting):
  """Stop ids taken from the unfused text end rows at different places inside chunks; the others run on to
  max_new_tokens or their own stop."""
  dec = _dec(sd_pair, 2)
  opts = dict(max_new_tokens=16, ignore_eos=True, **SETTINGS[setting])
  free = _run(dec, PROMPTS, 1, **opts)
  stops = (free[0][3], free[3][6])
  opts.update(ignore_eos=False, eos_id=stops)
  ref = _run(dec, PROMPTS, 1, **opts)
  assert len({len(r) for r in ref}) > 1, ref
  for n in (3, 4):
    assert _run(dec, PROMPTS, n, **opts) == ref, n


def test_one_call_a_chunk(sd_pair, monkeypatch):
  """Rounds run as sd_chunk calls (no separate verify or chain call after the first chain), n at a time until no
  row needs n more tokens, then fewer (n/2, .., 1): the schedule replayed from each round's committed tokens; one
  program runs every size; target_forwards counts a forward a round."""
  cfg, tp, _ = sd_pair
  dec = SDDecoder(cfg, tp, cfg, tp, SpecOptions(k=2))  # the target as its own draft: 3 tokens every round
  calls = []
  call = Programs.__call__

  def counting(self, fn, *args, **static):
    name = getattr(fn, "__name__", "")
    calls.append((name, int(args[-1]) if name == "sd_chunk" else None))
    return call(self, fn, *args, **static)

  monkeypatch.setattr(Programs, "__call__", counting)
  pieces = []  # each round's committed tokens (the first: the prefill's token)
  res = dec.generate(PROMPTS[:1], DecodeOptions(max_new_tokens=16, ignore_eos=True, sd_chunk=4),
                     stream=lambda row, new: pieces.append(len(new)))
  names = [c[0] for c in calls]
  assert "verify" not in names and names.count("chain_after") == 1, names
  sizes = [n for name, n in calls if name == "sd_chunk"]
  # Replay the schedule: each call runs the largest of 4, 2, 1 rounds that the row's tokens still to come allow
  # (a round commits at least one token), and commits one piece a round until the row is done.
  made, at = pieces[0], 1
  for j, n in enumerate(sizes):
    left = 16 - made
    assert n == max(s for s in (4, 2, 1) if s <= left), (j, left, sizes)
    took = pieces[at:at + n]
    assert len(took) == n or j == len(sizes) - 1, (j, sizes, pieces)
    made, at = made + sum(took), at + len(took)
  # 1 + 4 rounds of 3 = 13 tokens, then 3 to come: a chunk of 2 rounds, the row done in its first.
  assert made == 16 and at == len(pieces) and sizes == [4, 2], (sizes, pieces)
  assert sum(getattr(key[0], "__name__", "") == "sd_chunk" for key in dec.programs._compiled) == 1  # one program
  rounds = res[0].stats.extra["rounds"]
  assert rounds == len(pieces) - 1 and res[0].stats.target_forwards == rounds + 1  # the prefill's, then a round


def test_a_chunk_of_each_size_at_below_and_above_its_bound(sd_pair, monkeypatch):
  """The chunk after the first: 13 of max_new_tokens made (the prefill's token, 4 rounds of 3: the target is its own
  draft), so 1..5 tokens left. A chunk of s rounds runs once s tokens are left, not one token sooner: 1, 2, 4 left
  each sit on a size's bound, 3 and 5 one past (2 and 4), 3 one short of 4. Every run makes the AR tokens
  (greedy: each run's are the first of the longest AR run's)."""
  cfg, tp, _ = sd_pair
  dec, ar = SDDecoder(cfg, tp, cfg, tp, SpecOptions(k=2)), ARDecoder(cfg, tp)
  sizes = []
  call = Programs.__call__

  def counting(self, fn, *args, **static):
    if getattr(fn, "__name__", "") == "sd_chunk":
      sizes.append(int(args[-1]))
    return call(self, fn, *args, **static)

  monkeypatch.setattr(Programs, "__call__", counting)
  ref = ar.generate(PROMPTS[:1], DecodeOptions(max_new_tokens=18, ignore_eos=True))[0].token_ids
  want = {1: 1, 2: 2, 3: 2, 4: 4, 5: 4}  # tokens left -> the largest of 4, 2, 1 rounds no more than that
  for left, n in want.items():
    sizes.clear()
    got = dec.generate(PROMPTS[:1], DecodeOptions(max_new_tokens=13 + left, ignore_eos=True, sd_chunk=4))
    assert sizes[:2] == [4, n], (left, sizes)
    assert got[0].token_ids == ref[:13 + left], left


@pytest.mark.parametrize("n,new", [(1, 6), (4, 14)])
def test_a_run_writes_within_its_lookahead(sd_pair, n, new, monkeypatch):
  """Every slot a run writes, target and draft, lies within its lookahead past the text (run_lookaheads: what
  cache_slots and the memory check size caches with). Rows that end early keep verifying (one round a call, or to
  the end of their chunk); at these lengths a row writes furthest: a round a call, the target's K+2 exactly."""
  last = cache_writes.record_caches(monkeypatch)
  _dec(sd_pair, 2).generate(cache_writes.prompts(sd_pair[0].vocab_size),
                            DecodeOptions(max_new_tokens=new, ignore_eos=True, sd_chunk=n))
  past, ahead = cache_writes.slots_past_text(last, new), run_lookaheads(2, None, n)
  assert sorted(past) == [0, 1] and all(0 < past[s] <= ahead[s] for s in past), (past, ahead)


def test_not_fused_for_a_draft_reading_features(sd_pair):
  """Only SD's colocated chain of a draft that reads tokens is fused: the same decoder and chain, once its draft
  reads target features (an EAGLE draft's feature_layers), is not."""
  dec = _dec(sd_pair, 2)
  assert sd_chunk.fusable(dec, dec.draft)
  dec.feature_layers = (1,)
  assert not sd_chunk.fusable(dec, dec.draft)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "4"])
def test_bad_chunk_refused(bad):
  with pytest.raises(ValueError, match="sd_chunk"):
    DecodeOptions(sd_chunk=bad)
