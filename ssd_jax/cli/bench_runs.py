"""scripts/bench.py's runs (ssd_jax/cli/bench.py): the pipeline it measures, each batch decoded by one variant (ours or
the transformers peer's) with the K it ran noted, the warm-up and the timed runs in interleaved order."""
from __future__ import annotations

import os
import sys
import time

from ..cli_util import fail


def load_pipe(args, modes):
  """Returns the pipeline the bench measures (the tiny pair with --tiny), with a draft when a mode needs one."""
  from .. import api
  spec = any(m in ("sd", "ssd") for m in modes) or args.peer == "hf"
  if args.tiny:
    pipe = api.load_tiny(seed=args.seed, target_devices=args.target_devices, draft_devices=args.draft_devices,
                         kv_dtype=args.kv_dtype)
    pipe.attn_impl = args.attention
  else:
    pipe = api.load(args.target, draft=args.draft if spec else None, attn_impl=args.attention,
                    target_devices=args.target_devices, draft_devices=args.draft_devices,
                    ssd_placement=args.ssd_placement, dtype=args.dtype, weights=args.quantize,
                    draft_head_vocab=args.draft_head_vocab, kv_dtype=args.kv_dtype, draft_weights=args.draft_weights)
  if spec and pipe.draft is None:
    fail("modes sd/ssd and the peer's hf-sd need a draft: none found (checkpoints/draft-smollm2 or --draft PATH)")
  return pipe


def spec_options(o: dict):
  """Returns a variant's SpecOptions (raises ValueError on bad settings)."""
  from ..decode import SpecOptions
  return SpecOptions(k=o["k"], fan_out=o["fan_out"], fan_out_miss=o["fan_out_miss"], backup=o["backup"],
                     saguaro_c=o["saguaro_c"], placement=o["ssd_placement"],
                     draft_timeout=o.get("draft_timeout", SpecOptions.draft_timeout))


class Runner:
  """Decodes one batch of token-id prompts with one variant, ours or the peer's; returns rows and compile time."""

  def __init__(self, pipe, peer, args):
    self.pipe, self.peer, self.args = pipe, peer, args
    self.auto_k = {}  # label -> [{batch, prefix, k, predicted_sd_over_ar}] per batch run of SD or with k='auto'

  def __call__(self, variant, ids):
    cores = variant.opts.get("cores", "all")
    if cores != "all" or (self.args.baseline_cores == "target" and variant.mode != "ssd"):
      from ..decode.draft_process import set_process_affinity, split_cores
      saved = os.sched_getaffinity(0)
      # --sweep cores: the first N usable cores; else --baseline-cores target: the cores SSD's target gets.
      set_process_affinity(sorted(saved)[:int(cores)] if cores != "all" else split_cores()[0])
      try:
        return self._run(variant, ids)
      finally:
        set_process_affinity(saved)
    return self._run(variant, ids)

  def _run(self, variant, ids):
    o = variant.opts
    if variant.mode.startswith("hf-"):
      rows = []
      for p in ids:
        k = (self.choose(variant, [p]) or 1) if o["k"] == "auto" else o["k"]
        toks, stats = self.peer.generate(p, variant.mode, self.args.max_new_tokens, o["temperature"], self.args.seed,
                                         k=k)
        rows.append({"token_ids": toks, "stats": stats})
      return rows, 0.0
    spec, mode = spec_options(o), variant.mode
    if spec.auto and mode != "ar":  # as generate_ids resolves it for a mode asked for by name
      spec = spec.with_k(self.choose(variant, ids))
    elif mode in ("ar", "sd") and self.pipe.draft is not None:
      self.note_k(variant, ids, 0 if mode == "ar" else spec.k)
    dec = self.pipe.decoder(mode, spec)
    before = dec.programs.compile_seconds
    res = self.pipe.generate_ids(ids, mode=mode, batch_size=len(ids), spec=spec,
                                 max_new_tokens=self.args.max_new_tokens, temperature=o["temperature"],
                                 seed=self.args.seed, ignore_eos=True, ar_chunk=o["ar_chunk"],
                                 sd_chunk=o["sd_chunk"])
    return [{"token_ids": r.token_ids, "stats": r.stats.to_dict()} for r in res], dec.programs.compile_seconds - before

  def choose(self, variant, ids) -> int:
    """Returns k='auto''s K for this batch (as generate_ids chooses it), noted (note_k)."""
    from ..decode import auto_k
    prefix = auto_k.run_prefix([len(p) for p in ids], self.args.max_new_tokens)
    # A variant names its mode, as `decode.py --mode` does: k=auto picks its best K >= 1 (api.generate_ids).
    return self.note_k(variant, ids, self.pipe.choose_k(len(ids), variant.opts["temperature"], prefix, at_least=1))

  def note_k(self, variant, ids, k: int) -> int:
    """Notes in self.auto_k[label] the K an AR (0), SD or k='auto' batch runs, with the cost model's expected SD
    speedup over AR and the table's AR step and verify at its batch and prefix (None without measured costs): the
    by-batch table sets them beside the run's. Returns k."""
    from ..decode import auto_k
    temperature, b = variant.opts["temperature"], len(ids)
    prefix = auto_k.run_prefix([len(p) for p in ids], self.args.max_new_tokens)
    costs, a = self.pipe.auto_k_inputs(temperature)
    ar_ms, verify_ms, _ = costs.at(b, prefix) if costs is not None else (None, {}, None)
    note = {"batch": b, "prefix": prefix, "k": k, "acceptance": a,
            "predicted_sd_over_ar": None if costs is None else auto_k.sd_speedup(costs, b, k, a, prefix),
            "table_ar_ms": ar_ms, "table_verify_ms": verify_ms.get(k + 1) if k else None}
    self.auto_k.setdefault(variant.label, []).append(note)
    return k


def warm_up(run, variants, first) -> dict:
  """Runs every variant once on the first prompts (compiling every program and touching every buffer before the
  clock matters); returns each one's wall and compile seconds."""
  warmup = {}
  for v in variants:
    t = time.perf_counter()
    _, comp = run(v, first[: v.opts["batch_size"]])
    warmup[v.label] = {"wall_seconds": round(time.perf_counter() - t, 3), "compile_seconds": round(comp, 3)}
    print(f"[bench] warm-up {v.label}: {warmup[v.label]['wall_seconds']:.1f} s (compile {comp:.1f} s)",
          file=sys.stderr, flush=True)
  return warmup


def timed_runs(run, variants, names, ids) -> list:
  """Returns the measured runs' records: every set's prompts in groups of the largest batch, each group run by every
  variant in turn (interleaved, so a slow spell of the machine falls on all of them)."""
  from ..bench import plan
  group = max(v.opts["batch_size"] for v in variants)
  order = [(d, g, v, ids[d][b: b + v.opts["batch_size"]], list(range(b, min(b + v.opts["batch_size"], len(ids[d])))))
           for d in names for g in range(0, len(ids[d]), group) for v in variants
           for b in range(g, min(g + group, len(ids[d])), v.opts["batch_size"])]
  runs = []
  t_start = time.perf_counter()
  for n, (d, _, v, batch, idx) in enumerate(order, 1):
    rows, comp = run(v, batch)
    rec = plan.run_record(d, v, idx, rows, comp)
    runs.append(rec)
    el = time.perf_counter() - t_start
    s0 = rows[0]["stats"]
    extra = (f", hits {s0['cache_hit_rate']:.2f}, target idle {s0['target_idle_seconds']:.2f} s"
             if "cache_hit_rate" in s0 else "")
    tps = rec["decode_tokens"] / rec["decode_seconds"] if rec["decode_seconds"] > 0 else 0.0
    print(f"[bench {n}/{len(order)} {el:.0f}s, eta {el / n * (len(order) - n):.0f}s] {d}{idx} {v.label}: "
          f"{tps:.2f} tok/s, {rec['new_tokens'] / max(rec['target_forwards'], 1):.2f} tok/fwd{extra}",
          file=sys.stderr, flush=True)
  return runs
