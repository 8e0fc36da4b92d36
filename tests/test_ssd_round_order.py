"""SSD's round as the accelerator path needs it, proven by the order of what the host does (any backend: forced CPU
devices here, the draft on its own device).

The host's log of one run: each verify's dispatch, each host wait on a verify's result (`fetch`), each dispatch of
the draft's tree, each wait on the speculation cache the tree built (`cache`) and each message to the draft side.
It must show, round by round: the tree for round r+1 dispatched before the host waits for verify r (the draft works
while the target verifies); on a hit nothing between verify r's result and verify r+1's dispatch but the cache and
its lookup (no message to the draft side, no draft work: the outcome goes to the draft after the dispatch); on a miss
the outcome goes to the draft side and its backup is drafted before the next verify.
"""
import jax
import numpy as np
import pytest

from ssd_jax.decode import ARDecoder, DecodeOptions, SpecOptions, SSDDecoder, loop, rounds
from ssd_jax.decode.draft import DraftModel

from pairs import PROMPTS, perturbed


def _logged_run(monkeypatch, dec, prompts, opts):
  """Runs dec.generate(prompts, opts); returns (results, the host's log: a list of event names)."""
  log = []
  verify, init, tree = rounds.TargetSide.verify, rounds.TargetSide.__init__, DraftModel.tree
  link = dec.draft
  send, cache = link.send, link.cache

  def logged_init(self, *a, **kw):
    init(self, *a, **kw)
    fetch = self.fetch
    self.fetch = lambda x: (log.append("fetch"), fetch(x))[1]

  monkeypatch.setattr(rounds.TargetSide, "__init__", logged_init)
  monkeypatch.setattr(rounds.TargetSide, "verify", lambda self, *a: (log.append("verify"), verify(self, *a))[1])
  monkeypatch.setattr(DraftModel, "tree", lambda self, *a: (log.append("tree"), tree(self, *a))[1])
  monkeypatch.setattr(link, "send", lambda call, arg=None: (log.append(f"send:{call}"), send(call, arg))[1])
  monkeypatch.setattr(link, "cache", lambda: (log.append("cache"), cache())[1])
  return dec.generate(prompts, opts), log


def _rounds_of(log):
  """Splits the log at each verify's dispatch: [(events before the host's first wait on it, events from that wait
  to the next verify's dispatch)], one per verify."""
  at = [i for i, e in enumerate(log) if e == "verify"] + [len(log)]
  out = []
  for a, b in zip(at, at[1:]):
    seg = log[a + 1:b]
    w = seg.index("fetch")
    out.append((seg[:w], seg[w:]))
  return out


@pytest.mark.parametrize("k,f,batch,eps", [(2, 2, 1, 0.06), (1, 3, 4, 0.03)])
def test_the_draft_drafts_during_the_verify_and_a_hit_waits_on_nothing_but_the_cache(tiny_pair, monkeypatch, k, f,
                                                                                      batch, eps):
  cfg, tp = tiny_pair
  dp = perturbed(tp, eps, 1)  # rounds that every row hits, and rounds that some row misses
  prompts = PROMPTS[:batch]
  opts = DecodeOptions(max_new_tokens=24, ignore_eos=True)
  dec = SSDDecoder(cfg, tp, cfg, dp, SpecOptions(k=k, fan_out=f, placement="devices"))
  assert dec.ddev.id not in dec.tdevs
  ar = [r.token_ids for r in ARDecoder(cfg, tp).generate(prompts, opts)]
  res, log = _logged_run(monkeypatch, dec, prompts, opts)
  assert [r.token_ids for r in res] == ar
  assert log[-1] == "send:stats"
  log = log[:-1]
  per_round = _rounds_of(log)
  hits = misses = 0
  for r, (before_wait, after) in enumerate(per_round):
    # The tree for the next round is dispatched after this verify's dispatch and before the host waits for it.
    assert "tree" in before_wait, f"round {r + 1}: {before_wait}"
    last = r == len(per_round) - 1
    if last:  # every row done: the outcome goes to the draft side, which drafts nothing more
      assert after == ["fetch", "fetch", "cache", "send:outcome"], after
    elif "send:outcome" not in after:  # a hit: the result, the cache, the next dispatch
      hits += 1
      assert after == ["fetch", "fetch", "cache"], f"round {r + 1}: {after}"
    else:  # a miss: the outcome goes first, and the backup drafts before the next verify
      misses += 1
      assert after == ["fetch", "fetch", "cache", "send:outcome"], f"round {r + 1}: {after}"
  assert hits and misses
  # After a hit's dispatch the outcome reaches the draft side, then its next tree: nothing else is dispatched first.
  for r, (before_wait, _) in enumerate(per_round[1:], 2):
    assert before_wait[-1] == "tree", f"round {r}: {before_wait}"
  if batch == 1:  # every round the log calls a hit, the draft side counted as one (and no more)
    ex = res[0].stats.extra
    assert ex["cache_hit_rate"] == pytest.approx(hits / (len(per_round) - 1), abs=1e-3)


def test_the_round_parts_add_up_to_the_targets_idle_time(tiny_pair, perturbed_draft):
  """bench.py prints SSD's round by part: the parts are the target's whole idle time, and on this run of hits and
  misses the waits on a miss's backup are there."""
  cfg, tp = tiny_pair
  dec = SSDDecoder(cfg, tp, cfg, perturbed_draft, SpecOptions(k=2, fan_out=3, placement="devices"))
  ex = dec.generate(PROMPTS[:2], DecodeOptions(max_new_tokens=24, ignore_eos=True))[0].stats.extra
  parts = ex["round_parts_seconds"]
  assert set(parts) == set(loop.ROUND_PARTS)
  assert min(parts.values()) >= 0 and parts["backup_wait"] > 0 and parts["lookup"] > 0
  assert sum(parts.values()) == pytest.approx(ex["target_idle_seconds"], abs=2e-3)
  assert 0 < ex["hit_rounds"] < ex["loop_rounds"]
  assert np.isfinite(ex["draft_tree_seconds"])


@pytest.mark.parametrize("where", ["host", "device"])
def test_the_target_picks_each_rows_own_branch_from_the_cache(tiny_pair, where):
  """A hit's q comes from each row's own branch of the cache, whether the cache's laws arrived as host arrays (a
  draft process) or stay on the draft's device; at temperature 0 the verify gets zeros (it reads tokens only)."""
  from ssd_jax.decode.base import pad_prompts
  from ssd_jax.decode.speculator import SpecCache, cached_tokens, find

  cfg, tp = tiny_pair
  dec = SSDDecoder(cfg, tp, cfg, tp, SpecOptions(k=2, fan_out=2, placement="devices"))
  b, n, k = 3, 6, 2
  tokens, lengths = pad_prompts(PROMPTS[:b])
  rng = np.random.default_rng(0)
  q = rng.random((b, n, k, cfg.vocab_size)).astype(np.float32)
  cache = SpecCache(cand=rng.integers(0, 64, (b, n)).astype(np.int32), branch_j=np.repeat(np.arange(3), 2),
                    tokens=rng.integers(0, 64, (b, n, k)).astype(np.int32),
                    q=q if where == "host" else jax.device_put(q, dec.ddev))
  acc = cache.branch_j[[1, 4, 3]]  # each row's outcome is a different branch: 1, 4 and 3
  bonus = cache.cand[np.arange(b), [1, 4, 3]]
  hit, branch = find(cache, acc, bonus)
  assert hit.all() and branch.tolist() == [1, 4, 3]
  target = rounds.TargetSide(dec, tokens, lengths, DecodeOptions(max_new_tokens=4, temperature=1.0))
  tok, got = target.from_cache(cache, branch, cached_tokens(cache, branch))
  np.testing.assert_array_equal(np.asarray(tok), cache.tokens[np.arange(b), [1, 4, 3]])
  np.testing.assert_array_equal(np.asarray(got), q[np.arange(b), [1, 4, 3]])
  greedy = rounds.TargetSide(dec, tokens, lengths, DecodeOptions(max_new_tokens=4))
  _, zq = greedy.from_cache(SpecCache(cache.cand, cache.branch_j, cache.tokens), branch, tok)
  assert not np.asarray(zq).any() and zq.shape == (b, k, cfg.vocab_size)
