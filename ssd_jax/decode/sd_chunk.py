"""SD in chunks of n rounds a call: verify, then the next chain, n times in one program (DecodeOptions.sd_chunk).

An SD round is two programs, the target's verify and the draft's chain after its outcome, and on a CPU, where a
GGUF target step costs a few milliseconds, the host's work around two calls a round is a large share of it. When
the draft is colocated and reads tokens only (SD's `ChainDraft` in this process, a standalone draft: an EAGLE draft
reads the verify's features through its own call), `sd_chunk` runs n rounds as one `fori_loop`: round i verifies
the speculation in hand with the key the unfused loop gives round r + i (`fold(verify_root, r + i)`), then drafts
the next one from the outcome on the device (`chain_after`, key `fold(draft_root, r + i + 1)`), so the tokens are
those of n unfused rounds. The host then commits the n outcomes in order. Every row active at the chunk's start
takes all n rounds: a row that its book ends mid-chunk (a stop id, max_new_tokens) writes past its text into its
own caches, which a done row never reads again (`base.chunk_lookahead` sizes them for it). Near the end, a chunk
is the largest of n, n/2, .., 1 rounds no more than the most tokens an active row still needs (each round commits at
least one token a row), so the last tokens do not pay for many rounds past every row's end (a row that commits
several tokens a round is done before a chunk of as many rounds as its tokens to come would end). The number of
rounds is an argument of the one program, not a program each.
"""
from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from ..models.config import ModelConfig
from ..models.kv_cache import KVCache
from .loop import RoundTimes
from .speculator import ChainDraft, Speculation
from .steps import chain_after, verify


@functools.partial(jax.jit, static_argnames=("size", "tcfg", "dcfg", "k", "attn_impl", "tplatform", "dplatform",
                                             "saguaro_top"), donate_argnames=("tcache", "dcache"))
def sd_chunk(tparams, tcache: KVCache, dparams, dcache: KVCache, window, lengths, bonus_prev, drafts, q, active,
             vkeys, dkeys, temperature, top_p, dtemperature, dtop_p, saguaro_c, n, size: int, tcfg: ModelConfig,
             dcfg: ModelConfig, k: int, attn_impl: str = "auto", tplatform: str | None = None,
             dplatform: str | None = None, saguaro_top: int = 0):
  """Returns (drafts [size, B, K], accept_len [size, B], bonus [size, B]: the n rounds' speculations and outcomes in
  the first n entries; the last bonus [B]; the next speculation's tokens [B, K] and q [B, K, V]; tcache, dcache,
  window, lengths: the draft's committed tail after the last outcome).

  bonus_prev: x_L of each row (the last round's bonus) on entry; drafts, q: the speculation drafted after it;
  window, lengths: the draft's committed tail before that speculation's outcome (chain_after's); vkeys, dkeys
  [size]: round i's verify key and the key of the chain drafted after its outcome (`chunk_keys`). n (an int32
  scalar, 1 <= n <= size) is an argument, not a static: one program runs every chunk of up to `size` rounds.
  Static: size and the two sides' settings.
  """
  b = bonus_prev.shape[0]
  vst = dict(cfg=tcfg, attn_impl=attn_impl, platform=tplatform)
  dst = dict(cfg=dcfg, k=k, attn_impl=attn_impl, platform=dplatform, saguaro_top=saguaro_top)

  def body(i, carry):
    tcache, dcache, window, lengths, prev, drafts, q, out = carry
    acc, bonus, tcache = verify(tparams, tcache, prev, drafts, q, active, vkeys[i], temperature, top_p, **vst)[:3]
    out = (out[0].at[i].set(drafts), out[1].at[i].set(acc), out[2].at[i].set(bonus))
    nd, nq, dcache, window, lengths = chain_after(dparams, dcache, None, window, lengths, drafts, acc, bonus, active,
                                                  dkeys[i], dtemperature, dtop_p, saguaro_c, **dst)
    return tcache, dcache, window, lengths, bonus, nd, nq, out

  out = (jnp.zeros((size, b, k), jnp.int32), jnp.zeros((size, b), jnp.int32), jnp.zeros((size, b), jnp.int32))
  carry = (tcache, dcache, window, lengths, bonus_prev, drafts, q, out)
  tcache, dcache, window, lengths, last, drafts, q, out = jax.lax.fori_loop(0, n, body, carry)
  return out + (last, drafts, q, tcache, dcache, window, lengths)


@functools.partial(jax.jit, static_argnames=("n",))
def chunk_keys(vroot, droot, rnd, n: int):
  """Returns the keys of rounds rnd+1..rnd+n as the unfused loop gives them (`steps.fold`): round r's verify key
  fold_in(vroot, r) [n] and the key of the chain drafted after its outcome, fold_in(droot, r + 1) [n]."""
  r = rnd + 1 + jnp.arange(n)
  return jax.vmap(jax.random.fold_in, (None, 0))(vroot, r), jax.vmap(jax.random.fold_in, (None, 0))(droot, r + 1)


def fusable(dec, link) -> bool:
  """Whether a run's rounds can be chunked: SD's chain draft in this process, a draft that reads tokens only."""
  side = getattr(link, "side", None)
  return (not getattr(link, "remote", True) and isinstance(side, ChainDraft) and not dec.feature_layers
          and side.model.hist is None and dec.head is None and dec.k > 0)


class SDChunks:
  """The round loop's strategy for SD in chunks of n rounds a call (rounds.run_rounds): the target's side
  (rounds.TargetSide) runs sd_chunk with SD's chain (speculator.ChainDraft), read and handed back through the chain's
  public methods (fused_inputs, took_rounds). The chains run inside the calls: their time is in `verify`; `idle` is
  the commit's alone (SD's draft_seconds, idle less commit, is then 0)."""

  name = "sd_chunk"

  def __init__(self, target, link, n: int):
    self.target, self.link, self.chain, self.n = target, link, link.side, n
    self.sizes = tuple(sorted({max(n >> i, 1) for i in range(n.bit_length())}, reverse=True))  # n, n/2, .., 1
    t = target
    self.st = dict(tcfg=t.dec.tcfg, attn_impl=t.st["attn_impl"], tplatform=t.st["platform"],
                   **self.chain.fused_statics())
    self._active = None  # the placed active rows, with the done flags they were placed for
    self.times = RoundTimes()

  def _args(self, last, tokens, q, active, rnd: int, n: int, blank: int = 0):
    t = self.target
    chain, sampling, root = self.chain.fused_inputs(blank)
    keys = chunk_keys(t.verify_root, root, rnd, n=self.n)
    return (t.dec.tparams, t.cache, *chain, last, tokens, q, active, *keys, t.temp, t.top_p, *sampling, np.int32(n))

  def compile(self) -> None:
    """Compiles the chunk program (one for every chunk of up to n rounds) before the clock starts."""
    t, rep, k = self.target, self.target.rep, self.st["k"]
    b = t.tokens.shape[0]
    z = rep(jnp.zeros((b,), jnp.int32))
    spec = rep(jnp.zeros((b, k), jnp.int32)), rep(jnp.zeros((b, k, t.dec.tcfg.vocab_size)))
    t.programs.compile_only(sd_chunk, *self._args(z, *spec, z > 0, 0, self.n, blank=b), size=self.n, **self.st)

  def close(self) -> None:
    pass

  def begin(self, s) -> None:
    self.link.send("first", s.first)  # the first chain (key 1), from the committed text on the host
    self.spec = self.link.receive()
    s.go = self.spec is not None

  def advance(self, s) -> None:
    """Runs one chunk: n rounds, n the largest size no more than the most tokens a live row still needs (each round
    commits at least one token a row), then commits their outcomes in order."""
    t, tm, book, rnd = self.target, self.times, s.book, s.committed
    t0 = time.perf_counter()
    left = max(book.opts.max_new_tokens - len(book.out[i]) for i in np.flatnonzero(~book.done))
    n = next(size for size in self.sizes if size <= left)
    if self._active is None or not np.array_equal(self._active[0], book.done):
      self._active = (book.done.copy(), t.rep(~book.done))
    *out, s.last, tok, q, t.cache, dcache, w, lens = t.programs(
        sd_chunk, *self._args(s.last, self.spec.tokens, self.spec.q, self._active[1], rnd, n), stable=4,
        size=self.n, **self.st)
    self.chain.took_rounds(dcache, w, lens, rnd + n)
    drafts, acc, bonus = (np.asarray(t.fetch(x)) for x in out)
    t1 = time.perf_counter()
    for i in range(n):
      book.commit(acc[i], bonus[i], drafts[i], t1, s.stream)
    s.committed, tm.rounds, tm.calls = rnd + n, rnd + n, tm.calls + 1
    self.spec = None if book.done.all() else Speculation(tok, q)
    s.go = self.spec is not None
    tm.verify += t1 - t0
    tm.commit += time.perf_counter() - t1
    tm.idle = tm.commit
