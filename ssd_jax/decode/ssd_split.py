"""SSD with the draft in its own process on its own CPU cores: the CPU analogue of the paper's separate draft GPU.

JAX CPU devices in one process share one thread pool, so drafting on "device 1" takes cores from the target's verify
(an SSD round then costs more than an SD round). Here the draft runs in a child process pinned to its own cores, and
the parent process (the target) is pinned to the others for the duration of a `generate` call. The two exchange only
what the algorithm needs, over a socket pair wrapped in a `multiprocessing` Connection (Python's standard, well-kept pickling channel; a
two-process `jax.distributed` run would need both sides to enter the same collective program every round, which
does not fit two different programs running side by side):

  target -> draft, once per round: the verify outcome (accepted length k and bonus token t*) per row, and the verify
                                   time (for the automatic backup choice);
  draft -> target, once per round: the next speculation, K tokens per row and the distributions they were drawn
                                   from (over the draft's head vocabulary when it has one: [B, K, V_head] float32).

The draft side is the same algorithm as `SSDDecoder` (glue + fork + tree drafting, lookup, backups), built from
the same jitted functions; while the target verifies, the child has already dispatched the tree for the speculation
it just served and waits on the pipe, so its drafting overlaps verification on other cores.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import traceback
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from multiprocessing.connection import Connection

from ..backup import ngram_propose, point_mass, random_speculation
from ..config import ModelConfig
from ..kv_cache import KVCache
from .ar import first_tokens
from .base import DecodeOptions, DecodeResult, Programs, SpecBook, StreamFn, cache_slots, pad_prompts, prefill
from .sd import check_pair, draft_propose, verify
from .ssd import (choose_backup, draft_tree, hit_stats, lookup, merge_rows, new_tally, record_round, serve_q,
                  ssd_settings, tree_lookahead)


def set_process_affinity(cores) -> None:
  """Pins every thread of this process (XLA's and OpenMP's pools included) to `cores`; new threads inherit it."""
  cores = set(int(c) for c in cores)
  for tid in os.listdir("/proc/self/task"):
    try:
      os.sched_setaffinity(int(tid), cores)
    except OSError:
      pass  # a thread that just exited


def split_cores(target_cores=None, draft_cores=None) -> tuple[list[int], list[int]]:
  """Returns (target cores, draft cores): by default the usable cores split in two halves, the target first."""
  avail = sorted(os.sched_getaffinity(0))
  if target_cores is None and draft_cores is None:
    if len(avail) < 2:
      raise ValueError(f"the split placement needs at least 2 usable CPU cores, this process has {len(avail)}")
    half = len(avail) // 2
    return avail[:half], avail[half:]
  if target_cores is None or draft_cores is None:
    raise ValueError("give both target_cores and draft_cores, or neither")
  t, d = sorted(set(target_cores)), sorted(set(draft_cores))
  if not t or not d or set(t) & set(d):
    raise ValueError(f"target cores {t} and draft cores {d} must be non-empty and disjoint")
  bad = [c for c in t + d if c not in avail]
  if bad:
    raise ValueError(f"cores {bad} are not usable by this process (usable: {avail})")
  return t, d


class SplitSSDDecoder:
  """SSD with the target in this process and the draft in a child process, each pinned to its own cores."""

  mode = "ssd"

  def __init__(self, target_cfg: ModelConfig, target_params, draft_cfg: ModelConfig, draft_params, k: int = 1,
               fan_out=3, attn_impl: str = "auto", fan_out_miss=None, backup: str = "neural",
               saguaro_c: float = 1.0, target_cores=None, draft_cores=None):
    check_pair(target_cfg, draft_cfg, k)
    self.fan_out, self.fan_out_miss, self.saguaro_top = ssd_settings(k, fan_out, fan_out_miss, backup, saguaro_c,
                                                                     draft_cfg)
    self.target_cores, self.draft_cores = split_cores(target_cores, draft_cores)
    self.tcfg, self.dcfg, self.k, self.attn_impl = target_cfg, draft_cfg, k, attn_impl
    self.backup, self.saguaro_c = backup, float(saguaro_c)
    self.dev = jax.devices()[0]
    self.tparams = jax.device_put(target_params, self.dev)
    self._draft_np = jax.device_get(draft_params)
    # All the target side needs of the draft to expand a served q from its head vocabulary (ssd.serve_q).
    self._head = {} if draft_cfg.head_vocab is None else {"head_ids": np.asarray(self._draft_np["head_ids"])}
    self.programs = Programs()
    self._proc = self._conn = None

  # ------------------------------------------------------------------------------------------------ worker life

  def _start(self):
    if self._proc is not None and self._proc.poll() is None:
      return
    # A fresh interpreter (not multiprocessing's spawn, which re-imports the caller's main module) that reads its
    # JAX/OpenMP settings from the environment: one CPU device, as many OpenMP threads as it has cores.
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "force_host_platform_device_count" not in f]
    env = dict(os.environ, XLA_FLAGS=" ".join(flags + ["--xla_force_host_platform_device_count=1"]),
               OMP_NUM_THREADS=str(len(self.draft_cores)), JAX_PLATFORMS="cpu")
    ours, theirs = socket.socketpair()
    code = "import sys; from ssd_jax.decode.ssd_split import worker_entry; worker_entry(sys.argv[1], sys.argv[2])"
    self._proc = subprocess.Popen([sys.executable, "-c", code, str(theirs.fileno()),
                                   ",".join(map(str, self.draft_cores))], pass_fds=(theirs.fileno(),), env=env)
    theirs.close()
    self._conn = Connection(ours.detach())
    self._call("init", dict(cfg=self.dcfg, params=self._draft_np, k=self.k, fan_out=self.fan_out,
                            fan_out_miss=self.fan_out_miss, backup=self.backup, saguaro_c=self.saguaro_c,
                            saguaro_top=self.saguaro_top, attn_impl=self.attn_impl))

  def _send(self, kind, payload=None):
    self._conn.send((kind, payload))

  def _recv(self):
    if not self._conn.poll(600):
      raise RuntimeError("the draft process did not answer within 600 s")
    try:
      kind, payload = self._conn.recv()
    except (EOFError, ConnectionResetError):
      raise RuntimeError("the draft process exited unexpectedly") from None
    if kind == "error":
      raise RuntimeError(f"draft process failed:\n{payload}")
    return kind, payload

  def _call(self, kind, payload=None):
    self._send(kind, payload)
    return self._recv()

  def close(self):
    """Stops the draft process."""
    if self._proc is not None:
      try:
        self._send("stop")
      except OSError:
        pass
      try:
        self._proc.wait(timeout=10)
      except subprocess.TimeoutExpired:
        self._proc.kill()
      self._conn.close()
      self._proc = self._conn = None

  def __del__(self):
    try:
      self.close()
    except Exception:
      pass

  # ---------------------------------------------------------------------------------------------------- decode

  def generate(self, prompts: Sequence[Sequence[int]], opts: DecodeOptions, stream: StreamFn | None = None
               ) -> list[DecodeResult]:
    opts.validate()
    tcfg, k, run = self.tcfg, self.k, self.programs
    tokens, lengths = pad_prompts(prompts)
    b = len(prompts)
    max_prompt = int(lengths.max())
    if max_prompt + opts.max_new_tokens + k + 1 > tcfg.max_seq_len:
      raise ValueError(f"K={k} needs {k + 1} cache slots past the text; prompt ({max_prompt}) + max_new_tokens "
                       f"({opts.max_new_tokens}) leave too little of the {tcfg.max_seq_len}-token context")
    self._start()
    saved_affinity = os.sched_getaffinity(0)
    set_process_affinity(self.target_cores)
    try:
      # The draft compiles and prefills its side while the target compiles its own programs.
      self._send("prepare", dict(prompts=[list(map(int, p)) for p in prompts], opts=opts))
      put = lambda x: jax.device_put(x, self.dev)  # noqa: E731
      tslots = cache_slots(tcfg, max_prompt, opts.max_new_tokens, lookahead=k + 2)
      tcache = put(KVCache.init(tcfg, b, tslots, jnp.float32))
      key = put(jax.random.key(opts.seed))
      temp, top_p = put(jnp.float32(opts.temperature)), put(jnp.float32(opts.top_p))
      st = dict(cfg=tcfg, attn_impl=self.attn_impl)
      z = put(jnp.zeros((b,), jnp.int32))
      tok_t, len_t = put(jnp.asarray(tokens)), put(jnp.asarray(lengths))
      head = put(self._head)
      run.compile_only(prefill, self.tparams, tok_t, len_t, tcache, **st)
      run.compile_only(first_tokens, self.tparams, put(jnp.zeros((b, tcfg.out_vocab))), key, temp, top_p, cfg=tcfg)
      run.compile_only(verify, self.tparams, tcache, z, put(jnp.zeros((b, k), jnp.int32)),
                       put(jnp.zeros((b, k, tcfg.vocab_size))), put(z > 0), key, temp, top_p, **st)
      if head:
        run.compile_only(serve_q, head, put(jnp.zeros((b, k, self.dcfg.out_vocab))), cfg=self.dcfg)
      _, info = self._recv()  # "ready": the draft's compile time
      draft_compile = info["compile_seconds"]

      t0 = time.perf_counter()
      logits, tcache = run(prefill, self.tparams, tok_t, len_t, tcache, **st)
      first = np.asarray(run(first_tokens, self.tparams, logits, key, temp, top_p, cfg=tcfg))
      t_prefill = time.perf_counter() - t0
      book = SpecBook(prompts, first, opts, k, time.perf_counter())
      if stream is not None:
        stream(0, book.out[0][:])
      verify_root = jax.random.fold_in(key, 0xC0DE)
      bytes_in = bytes_out = 0
      t_idle = t_wait = t_verify = t_commit = 0.0
      rnd = 0
      def stage(r):  # round r's small verify inputs, known once the previous round is committed
        return put(book.state()[0][:, 1]), put(~book.done), jax.random.fold_in(verify_root, r)

      self._send("first", first)
      t_verified = time.perf_counter()
      nxt = stage(1)
      _, spec_msg = self._recv()
      while True:
        spec_np, q_np = spec_msg["tokens"], spec_msg["q"]
        bytes_in += spec_np.nbytes + q_np.nbytes
        spec = put(spec_np)
        q = run(serve_q, head, put(q_np), cfg=self.dcfg) if q_np.shape[-1] != tcfg.vocab_size else put(q_np)
        rnd += 1
        bonus_prev, active, kv = nxt
        t_dispatch = time.perf_counter()
        t_idle += t_dispatch - t_verified
        acc, bonus, tcache = run(verify, self.tparams, tcache, bonus_prev, spec, q, active, kv, temp, top_p, **st)
        acc_np, bonus_np = np.asarray(acc), np.asarray(bonus)
        t_verified = time.perf_counter()
        t_verify += t_verified - t_dispatch
        # The outcome leaves first: the target's own bookkeeping and the next round's small inputs are prepared
        # while the draft looks the outcome up, instead of before it can start.
        self._send("outcome", dict(accept_len=acc_np, bonus=bonus_np, verify_seconds=t_verified - t_dispatch))
        bytes_out += acc_np.nbytes + bonus_np.nbytes
        t_sent = time.perf_counter()
        book.commit(acc_np, bonus_np, spec_np, t_verified, stream)
        nxt = stage(rnd + 1)
        t_commit += time.perf_counter() - t_sent
        kind, spec_msg = self._recv()
        t_wait += time.perf_counter() - t_verified
        if kind == "done":
          draft_stats = spec_msg
          break
    finally:
      set_process_affinity(saved_affinity)

    def extra_of(i):
      s = draft_stats
      return {"fan_out": list(self.fan_out), "fan_out_miss": list(self.fan_out_miss), "backup": self.backup,
              "backups_used": s["backups_used"], **hit_stats(s["hits"], s["hits_by_len"], s["rounds_by_len"], i),
              "target_idle_seconds": round(t_idle, 4), "draft_wait_seconds": round(t_wait, 4),
              "verify_seconds": round(t_verify, 4), "neural_backup_seconds": round(s["neural_s"], 4),
              "draft_tree_seconds": round(s["tree_s"], 4), "speculation_cache_bytes": int(s["cache_bytes"]),
              "target_commit_seconds": round(t_commit, 4),
              "draft_reply_seconds": {k: round(v, 4) for k, v in s["phase_s"].items()},
              "compile_seconds": round(run.compile_seconds + draft_compile, 3),
              "bytes_per_round": {"target_to_draft": round(bytes_out / max(rnd, 1)),
                                  "draft_to_target": round(bytes_in / max(rnd, 1))},
              "placement": {"kind": "processes", "target_cores": self.target_cores,
                            "draft_cores": self.draft_cores}}

    return book.results(self.mode, t_prefill, t0 + t_prefill, extra_of)


# --------------------------------------------------------------------------------------------------- draft side

def worker_entry(fd: str, cores: str):
  """The draft process: pins itself, then serves 'init', 'prepare', 'first', 'outcome' and 'stop' messages."""
  set_process_affinity([int(c) for c in cores.split(",")])
  conn = Connection(int(fd))
  side = None
  while True:
    try:
      kind, payload = conn.recv()
    except (EOFError, KeyboardInterrupt):
      return
    if kind == "stop":
      return
    try:
      if kind == "init":
        side = _DraftSide(**payload)
        conn.send(("ready", None))
      else:
        reply = getattr(side, kind)(payload)
        conn.send(reply)
        side.start_tree()  # after the reply: the target verifies while this drafts
    except Exception:
      conn.send(("error", traceback.format_exc()))


class _DraftSide:
  """The draft's half of SSD: prefill, the first speculation, then per round lookup/backup/serve and the next tree."""

  def __init__(self, cfg, params, k, fan_out, fan_out_miss, backup, saguaro_c, saguaro_top, attn_impl):
    self.cfg, self.k, self.f, self.f_miss = cfg, k, tuple(fan_out), tuple(fan_out_miss)
    self.backup, self.saguaro_top, self.attn_impl = backup, saguaro_top, attn_impl
    self.dev = jax.devices()[0]
    self.params = jax.device_put(params, self.dev)
    self.sag_c = jax.device_put(jnp.float32(saguaro_c), self.dev)
    self.run = Programs()

  def _put(self, x):
    return jax.device_put(x, self.dev)

  def prepare(self, msg):
    prompts, opts = msg["prompts"], msg["opts"]
    cfg, k, run, put = self.cfg, self.k, self.run, self._put
    self.prompts, self.opts = prompts, opts
    tokens, lengths = pad_prompts(prompts)
    b = self.b = len(prompts)
    slots = cache_slots(cfg, int(lengths.max()), opts.max_new_tokens, lookahead=tree_lookahead(k, self.f))
    self.cache = put(KVCache.init(cfg, b, slots))
    self.temp, self.top_p = put(jnp.float32(opts.temperature)), put(jnp.float32(opts.top_p))
    self.draft_root = jax.random.fold_in(jax.random.key(opts.seed), 0x5EED)
    st = dict(cfg=cfg, attn_impl=self.attn_impl)
    sag = dict(saguaro_top=self.saguaro_top)
    z = put(jnp.zeros((b,), jnp.int32))
    z2, zk = put(jnp.zeros((b, 2), jnp.int32)), put(jnp.zeros((b, k), jnp.int32))
    n = sum(self.f)
    tok_d, len_d = put(jnp.asarray(tokens)), put(jnp.asarray(lengths))
    run.compile_only(prefill, self.params, tok_d, len_d, self.cache, **st)
    run.compile_only(draft_propose, self.params, self.cache, z2, z, self._key(0), self.temp, self.top_p, self.sag_c,
                     **st, k=k, **sag)
    run.compile_only(random_speculation, self._key(0), batch=b, k=k, vocab=cfg.vocab_size)
    run.compile_only(point_mass, zk, vocab=cfg.vocab_size)
    for f in {self.f, self.f_miss}:
      run.compile_only(draft_tree, self.params, self.cache, z2, zk, z, self._key(0), self.temp, self.top_p,
                       self.sag_c, **st, k=k, fan_out=f, **sag)
    zq = put(jnp.zeros((b, k, cfg.vocab_size)))
    run.compile_only(lookup, put(jnp.zeros((b, n), jnp.int32)), put(jnp.zeros((n,), jnp.int32)),
                     put(jnp.zeros((b, n, k), jnp.int32)), put(jnp.zeros((b, n, k, cfg.out_vocab))),
                     np.zeros(b, np.int32), np.zeros(b, np.int32))
    run.compile_only(serve_q, self.params, put(jnp.zeros((b, k, cfg.out_vocab))), cfg=cfg)
    run.compile_only(merge_rows, z > 0, zk, zq, zk, zq)
    if cfg.head_vocab is not None:
      run.compile_only(_compact_q, zq, self.params["head_ids"])
    compile_s = run.compile_seconds
    _, self.cache = run(prefill, self.params, tok_d, len_d, self.cache, **st)
    self.cache.lengths.block_until_ready()
    return ("ready", {"compile_seconds": compile_s})

  def _key(self, *idx):
    kk = self.draft_root
    for i in idx:
      kk = jax.random.fold_in(kk, i)
    return self._put(kk)

  def _backup_kind(self):
    return choose_backup(self.backup, self.tally, self.b)

  def _run_backup(self, kind, rnd, hit=None, cached=None):
    t_start = time.perf_counter()
    try:
      return self._backup(kind, rnd, hit, cached)
    finally:
      self.phase_s["backup"] += time.perf_counter() - t_start

  def _backup(self, kind, rnd, hit, cached):
    run, cfg, k = self.run, self.cfg, self.k
    last2, lens = self.book.state()
    t = time.perf_counter()
    if kind == "neural":
      tok, q, self.cache = run(draft_propose, self.params, self.cache, self._put(last2), self._put(lens),
                               self._key(rnd, 2), self.temp, self.top_p, self.sag_c, cfg=cfg,
                               attn_impl=self.attn_impl, k=k, saguaro_top=self.saguaro_top)
      tok.block_until_ready()
      self.tally["neural_s"] += time.perf_counter() - t
    elif kind == "fast":
      tok, q = run(random_speculation, self._key(rnd, 3), batch=self.b, k=k, vocab=cfg.vocab_size)
    else:
      tok = self._put(jnp.asarray([ngram_propose(s, k) for s in self.book.seqs], jnp.int32))
      q = run(point_mass, tok, vocab=cfg.vocab_size)
    self.backups_used[kind] += 1
    if hit is not None:
      tok, q = run(merge_rows, hit, cached[0], cached[1], tok, q)
    return tok, q

  def _serve(self, tok, q, full_q: bool, rnd: int, compact: bool = False):
    """Returns the reply carrying the speculation, and prepares the tree on it, which `start_tree` dispatches once
    the reply is sent (so the target never waits for the tree, even where XLA runs a program synchronously). q travels over the draft's head vocabulary (`compact`: it already is), unless
    `full_q`: a fast backup's q (uniform, or a point mass on an n-gram token) may put mass outside it."""
    t_start = time.perf_counter()
    tok_np = np.asarray(tok)
    if self.cfg.head_vocab is not None and not full_q and not compact:
      q_np = np.asarray(self.run(_compact_q, q, self.params["head_ids"]))
    else:
      q_np = np.asarray(q)
    self.phase_s["serve"] += time.perf_counter() - t_start
    self.pending_tree = (tok, rnd + 1)
    self.spec_np = tok_np
    return ("spec", {"tokens": tok_np, "q": q_np})

  def start_tree(self):
    """Dispatches the tree for the speculation just served, if any."""
    if getattr(self, "pending_tree", None) is None:
      return
    tok, rnd = self.pending_tree
    self.pending_tree = None
    last2, lens = self.book.state()
    fan = self.f if self.served == "hit" else self.f_miss
    self.tree_dispatch = time.perf_counter()
    self.tree = self.run(draft_tree, self.params, self.cache, self._put(last2), tok, self._put(lens),
                         self._key(rnd, 1), self.temp, self.top_p, self.sag_c, cfg=self.cfg,
                         attn_impl=self.attn_impl, k=self.k, fan_out=fan, saguaro_top=self.saguaro_top)
    self.cache = self.tree[-1]

  def first(self, first):
    k = self.k
    self.book = SpecBook(self.prompts, first, self.opts, k, time.perf_counter())
    self.hits = np.zeros(self.b, np.int64)
    self.hits_by_len = np.zeros((self.b, k + 1), np.int64)
    self.rounds_by_len = np.zeros((self.b, k + 1), np.int64)
    self.backups_used = {"neural": 0, "fast": 0, "ngram": 0}
    self.tally = new_tally()
    self.tree_s = 0.0
    # Host time per phase of the draft's reply to an outcome (what the target waits through), summed over rounds.
    self.phase_s = {k: 0.0 for k in ("commit", "tree_wait", "lookup", "backup", "serve")}
    self.cache_bytes = 0  # the speculation cache: candidates, tree tokens and their distributions
    self.rnd = 0
    if self.book.done.all():
      return self._done()
    kind = self._backup_kind()
    tok, q = self._run_backup(kind, 0)
    self.served = kind
    return self._serve(tok, q, kind in ("fast", "ngram"), 0)

  def _done(self):
    return ("done", {"hits": self.hits, "hits_by_len": self.hits_by_len, "rounds_by_len": self.rounds_by_len,
                     "backups_used": dict(self.backups_used), "neural_s": self.tally["neural_s"],
                     "tree_s": self.tree_s, "cache_bytes": self.cache_bytes, "phase_s": dict(self.phase_s)})

  def outcome(self, msg):
    t_recv = time.perf_counter()
    acc, bonus = msg["accept_len"], msg["bonus"]
    self.rnd += 1
    self.tally["verify_s"] += msg["verify_seconds"]
    self.tally["verify_n"] += 1
    live = ~self.book.done
    lens_before = self.book.state()[1]
    self.book.commit(acc, bonus, self.spec_np, time.perf_counter())
    record_round(self.tally, self.served, live, self.book.seqs, lens_before)
    t_in = time.perf_counter()
    cand, branch_j, tree_t, tree_q, _, _ = self.tree
    tree_t.block_until_ready()
    t_tree = time.perf_counter()
    self.phase_s["commit"] += t_in - t_recv
    self.phase_s["tree_wait"] += t_tree - t_in
    self.cache_bytes = max(self.cache_bytes, sum(x.nbytes for x in (cand, tree_t, tree_q)))
    self.tree_s += t_tree - self.tree_dispatch
    if self.book.done.all():
      return self._done()
    # The outcome goes in as host arrays: the compiled call copies them in, one dispatch instead of three.
    hit, c_tok, c_q = self.run(lookup, cand, branch_j, tree_t, tree_q, np.asarray(acc, np.int32),
                               np.asarray(bonus, np.int32))
    hit_np = np.asarray(hit)
    self.phase_s["lookup"] += time.perf_counter() - t_tree
    for i in np.flatnonzero(live & ~self.book.done):
      self.hits[i] += hit_np[i]
      self.rounds_by_len[i, acc[i]] += 1
      self.hits_by_len[i, acc[i]] += hit_np[i]
    if hit_np[~self.book.done].all():  # the cache stores q over the head vocabulary: it travels as it is
      self.served = "hit"
      return self._serve(c_tok, c_q, False, self.rnd, compact=True)
    self.served = self._backup_kind()
    c_q = self.run(serve_q, self.params, c_q, cfg=self.cfg)
    tok, q = self._run_backup(self.served, self.rnd, hit, (c_tok, c_q))
    return self._serve(tok, q, self.served in ("fast", "ngram"), self.rnd)


@jax.jit
def _compact_q(q, head_ids):
  """Returns q restricted to the draft's head vocabulary (where all of a draft distribution's mass lies)."""
  return q[..., head_ids]
