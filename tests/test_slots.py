"""Continuous batching's AR rows (ssd_jax/decode/slots.py): rows join and leave a running batch, and each row's
greedy tokens stay those of its prompt decoded alone, through every grow, shrink and widening of the batch."""
import jax
import pytest

from ssd_jax.decode import ARDecoder, DecodeOptions
from ssd_jax.decode.slots import SlotBatch, rows_for, slots_for


@pytest.fixture(scope="module")
def dec(tiny_pair):
  """The tiny V=64 target's AR decoder (its greedy text varies, where a random tiny model's often repeats a token)."""
  return ARDecoder(*tiny_pair)


def _alone(dec, prompts, n):
  return [dec.generate([p], DecodeOptions(max_new_tokens=n))[0].token_ids for p in prompts]


def test_shapes_come_from_a_few_sizes():
  assert [rows_for(n, 8) for n in range(1, 10)] == [1, 2, 4, 4, 8, 8, 8, 8, 8]
  assert [rows_for(n, 6) for n in (5, 7)] == [6, 6]
  assert [slots_for(t) for t in (1, 128, 129, 300, 513)] == [128, 128, 256, 512, 1024]


def test_rows_that_join_and_leave_keep_their_solo_greedy_tokens(dec):
  """Four prompts (one past a prompt bucket) join a batch of up to 4 rows at different calls and leave at their own
  ends: the batch grows 1 -> 4 rows, shrinks to 1, widens its slots for a row longer than it was made for, and every
  row's tokens equal the prompt's AR tokens alone."""
  prompts = [[5, 6, 7], [9, 10, 11, 12, 13, 14, 15], [(3 * i) % 64 for i in range(100)], [4, 8]]
  want = _alone(dec, prompts, 40)
  ends = {0: 12, 1: 20, 2: 40, 3: 16}  # tokens each row keeps before it leaves
  sb = SlotBatch(dec, 4)
  got, shapes = {}, []

  def take(out):
    for h, ids in out.items():
      got.setdefault(h, []).extend([ids] if isinstance(ids, int) else ids)
      if len(got[h]) >= ends[h]:
        sb.remove(h)

  take(sb.insert([0], prompts[:1], [ends[0]]))
  take(sb.step())
  take(sb.insert([1, 2], prompts[1:3], [ends[1], 10]))  # row 2 asks for 10: it is kept to 40, the slots must widen
  shapes.append((sb.rows, sb.slots))
  take(sb.step())
  take(sb.insert([3], prompts[3:], [ends[3]]))
  shapes.append((sb.rows, sb.slots))
  while sb.live:
    take(sb.step())
    shapes.append((sb.rows, sb.slots))
  assert all(got[h][:ends[h]] == want[h][:ends[h]] for h in ends), (got, want)
  assert shapes[0] == (4, 128) and (1, 128) in shapes and (1, 256) in shapes, shapes


def test_warm_compiles_every_shape_a_mix_of_requests_meets(dec):
  """After warm(), rows joining and leaving in any mix up to max_rows compile nothing more."""
  sb = SlotBatch(dec, 4, min_tokens=100)
  sb.warm((1, 70))
  before = dec.programs.compiles
  sb.insert([0], [[5] * 3], [8])
  sb.step()
  sb.insert([1, 2, 3], [[6] * 70, [7] * 5, [8] * 9], [8, 8, 8])
  sb.step()
  for h in (0, 1, 2):
    sb.remove(h)
  sb.step()
  sb.insert([4], [[9] * 2], [8])
  sb.step()
  assert dec.programs.compiles == before


def test_inserting_past_the_free_rows_is_refused(dec):
  sb = SlotBatch(dec, 2)
  sb.insert(["a"], [[5, 6]], [4])
  with pytest.raises(ValueError, match="2 rows asked for, 1 free"):
    sb.insert(["b", "c"], [[5], [6]], [4, 4])


def test_sampled_rows_that_join_a_running_batch_follow_the_targets_law():
  """The V=4 law pair at T = 1.0, top-p 0.7: 1500 rows inserted, one call, 1500 more join the running batch (it grows
  from 2048 rows to 4096), another call. The first three tokens of all 3000 rows follow the numpy joint law
  (chi-square at 1e-4 over 64 cells), and the rows that joined drew afresh: they repeat the first rows' tokens
  about as often as two independent draws would, not always (a key used again), and so do a row's two calls."""
  import numpy as np

  import numpy_reference as ref
  from draft_heads import LIVE, REAL, live
  from law_stats import assert_rows_follow_their_laws
  from pairs import LAW_PROMPT, v4_pair

  if REAL:
    pytest.skip("the tiny law pair only: 4096 rows of the real head's laws would not fit")
  cfg, tp, _, _ = v4_pair()
  n, t, top_p = 1500, 1.0, 0.7
  sb = SlotBatch(ARDecoder(cfg, tp), 4096, temperature=t, top_p=top_p, seed=11)
  prompt = live(LAW_PROMPT)
  rows = {}
  for h, tok in sb.insert(list(range(n)), [prompt] * n, [4] * n).items():
    rows[h] = [tok]
  for h, ids in sb.step().items():
    rows[h] += ids
  for h, tok in sb.insert(list(range(n, 2 * n)), [prompt] * n, [4] * n).items():
    rows[h] = [tok]
  assert sb.rows == 4096
  for h, ids in sb.step().items():
    rows[h] += ids

  class Row:
    def __init__(self, ids):
      self.token_ids = ids

  seqs = [rows[h][:3] for h in range(2 * n)]
  host = jax.device_get(tp)
  assert_rows_follow_their_laws([Row(s) for s in seqs], [LAW_PROMPT], host, cfg, t, top_p)
  law = ref.joint_law(host, cfg, prompt, 3, t, top_p, support=LIVE)
  same = sum(seqs[i] == seqs[n + i] for i in range(n))
  expect = n * float((np.asarray(law) ** 2).sum())  # two independent draws agree with this probability
  assert same <= expect + 5 * expect ** 0.5 + 5, (same, expect)
  # Each call draws afresh: a first row's second call repeats its first call's tokens about as often as it repeats
  # another row's, not far more often (a call's keys used again).
  again = sum(rows[h][5:9] == rows[h][1:5] for h in range(n))
  other = sum(rows[h][5:9] == rows[(h + 1) % n][1:5] for h in range(n))
  assert again <= 1.5 * other + 20, (again, other)
