#!/usr/bin/env python
"""Teacher-forced acceptance statistics of a draft against the target, on the target's own greedy answers.

  python scripts/eval_draft.py --num-prompts 8 --max-new-tokens 128

For each benchmark prompt set (HumanEval, GSM8K, AlpacaEval, MT-Bench) the target answers the first N prompts
greedily; then, at every answer position, with both models reading the same text:
  greedy alpha  = P(draft argmax == target argmax)
  alpha at T=1  = E[sum_x min(p(x), q(x))], the probability that speculative sampling accepts a draft token
and the expected tokens per target forward for K = 2..8 under the i.i.d. model (1 - alpha^(K+1)) / (1 - alpha).
Greedy SD and SSD rounds are also replayed exactly from the draft's rank of each target token
(ssd_jax.theory.acceptance): tokens per target forward, acceptance per drafted token, and the SSD cache hit rate at
--fan-out, for K = 1..8; the figures `scripts/bench.py` measures at temperature 0, without running the decoders.
--fan-out-strategy geometric spends the same budget (K+1) F as the draft's calibration file allocates it (Theorem 12),
so the two can be compared. It also reports the draft's cost per token against the target's: one compiled decode step of
each at batch 1 after a 300-token cache, timed interleaved (median ms), and the weight-matrix multiply-accumulates per
token.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from ssd_jax import settings
from ssd_jax.cli_util import braces, fail, run_main
from ssd_jax.decode.options import FAN_OUT_STRATEGIES
from ssd_jax.models.config import is_eagle
from ssd_jax.theory.timing_model import expected_tokens


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--draft", default="default-draft")
  p.add_argument("--datasets", default="humaneval,gsm8k,alpaca,mtbench")
  p.add_argument("--num-prompts", type=int, default=8)
  p.add_argument("--max-new-tokens", type=int, default=128)
  p.add_argument("--fan-out", type=int, default=3, help="fan-out F for the replayed SSD cache hit rate")
  p.add_argument("--fan-out-strategy", choices=FAN_OUT_STRATEGIES, default="uniform",
                 help="F at every acceptance length, or the budget (K+1) F spread by the draft's calibration")
  p.add_argument("--draft-weights", default="auto", metavar=braces(settings.DRAFT_WEIGHTS),
                 help="the draft's format as decoding loads it (auto: q8_0 on a CPU; full; q8_0)")
  p.add_argument("--json-out")
  p.add_argument("--answers", help="a JSON file of the target's answers: read when it holds these prompts and "
                                   "settings, else written, so several drafts are scored on the same answers")
  return p.parse_args(argv)


def main(argv=None):
  args = parse_args(argv)
  if min(args.num_prompts, args.max_new_tokens, args.fan_out) < 1:
    fail("--num-prompts, --max-new-tokens and --fan-out must be >= 1")
  settings.check_choice("draft weights", args.draft_weights, settings.DRAFT_WEIGHTS)
  from ssd_jax.data import datasets
  from ssd_jax.theory import acceptance

  pipe, dcfg, dparams, fan_outs = load_pair(args)
  tcfg, tparams = pipe.target.cfg, pipe.target.params
  eagle = is_eagle(dcfg)
  stats = make_stats(tcfg, dcfg)
  cached = read_answers(args.answers)
  cost = step_cost(tcfg, tparams, dcfg, dparams, eagle)

  def replay(answer_ranks):
    return {k: {**acceptance.summarize([acceptance.replay_greedy_rounds(r, k, f) for r in answer_ranks], k),
                "fan_out": list(f)} for k, f in fan_outs.items()}

  report, pooled_ranks = {}, []
  for name in [d for d in args.datasets.split(",") if d]:
    prompts = datasets.load_prompts(name, args.num_prompts)
    answers = target_answers(pipe, name, prompts, args, cached)
    if eagle:
      report[name] = eagle_set_report(pipe, tparams, tcfg, dparams, dcfg, prompts, answers, fan_outs)
      r = report[name]
      print(f"[eval] {name}: greedy agreement by depth {r['agreement_by_depth'][:4]}, SSD replay K=2 per-token "
            f"acceptance {r['replayed_ssd'][2]['per_token_acceptance']:.3f} over {r['positions']} positions",
            file=sys.stderr, flush=True)
      continue
    report[name], ranks = set_report(pipe, stats, tparams, dparams, prompts, answers, replay)
    pooled_ranks += ranks
    print(f"[eval] {name}: greedy alpha {report[name]['alpha_greedy']:.3f}, T=1 alpha {report[name]['alpha_t1']:.3f} "
          f"over {report[name]['positions']} positions", file=sys.stderr, flush=True)
  names = list(report)
  if eagle:
    return print_eagle(report, names, cost, args, fan_outs)
  return print_standalone(report, names, {"replayed_greedy": replay(pooled_ranks)}, cost, args, fan_outs)


def load_pair(args):
  """Returns (the target's pipeline, the draft's config and params (an EAGLE draft's with the target attached), the
  fan-out at every K = 1..8)."""
  from ssd_jax import api
  from ssd_jax.models import checkpoints, draft_weights

  pipe = api.load(draft=None)
  dcfg, dparams, _ = checkpoints.load_model(args.draft)
  fan_outs = {k: (args.fan_out,) * (k + 1) for k in range(1, 9)}
  if args.fan_out_strategy == "geometric":
    from ssd_jax.theory.fan_out import calibrated_geometric
    calib = os.path.join(checkpoints.resolve_model_dir(args.draft), "fan_out_calibration.json")
    try:
      fan_outs = {k: calibrated_geometric(calib, k, (k + 1) * args.fan_out, 0.0) for k in fan_outs}
    except ValueError as e:
      fail(str(e))
  if dcfg.vocab_size != pipe.target.cfg.vocab_size:
    fail("draft and target vocabularies differ")
  if is_eagle(dcfg):
    from ssd_jax.models import eagle
    dparams = eagle.attach_target(dparams, pipe.target.params)
  return pipe, dcfg, draft_weights.quantize_draft(dcfg, dparams, args.draft_weights), fan_outs


def make_stats(tcfg, dcfg):
  """Returns a jitted stats(target params, draft params, tokens [1, T]) -> (greedy agreement, sum min(p, q), the
  draft's rank of the target's token), each [1, T]."""
  import jax
  import jax.numpy as jnp

  from ssd_jax.models import model

  @jax.jit
  def stats(tp, dp, tokens):
    lt = model.forward_full(tp, tokens, tcfg)
    ld = model.forward_full(dp, tokens, dcfg)
    p = jax.nn.softmax(lt, -1)
    q = model.scatter_to_vocab(dp, jax.nn.softmax(ld, -1), dcfg)
    t_tok = jnp.argmax(lt, -1)
    greedy = t_tok == model.to_token_ids(dp, jnp.argmax(ld, -1), dcfg)
    # The draft's rank of the target's token (0 = its argmax); tokens outside a reduced head rank last.
    q_t = jnp.take_along_axis(q, t_tok[..., None], -1)
    rank = jnp.where(q_t[..., 0] > 0, (q > q_t).sum(-1), dcfg.vocab_size)
    return greedy, jnp.minimum(p, q).sum(-1), rank

  return stats


def read_answers(path: str | None) -> dict:
  """Returns the --answers file's cached answers by prompt set ({} when there is none yet)."""
  if not (path and os.path.exists(path)):
    return {}
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError) as e:
    fail(f"cannot read --answers {path}: {e}")


def step_cost(tcfg, tparams, dcfg, dparams, eagle_draft: bool) -> dict:
  """Returns the draft's and the target's decode-step time (interleaved) and multiply-accumulates per token."""
  from ssd_jax.bench.step_cost import compiled_eagle_step, compiled_step, interleaved_ms, macs_per_token
  draft_step = compiled_eagle_step(dcfg, dparams) if eagle_draft else compiled_step(dcfg, dparams)
  step_ms = interleaved_ms({"target": compiled_step(tcfg, tparams), "draft": draft_step})
  if eagle_draft:
    from ssd_jax.models import eagle
    d_macs = eagle.macs_per_token(dcfg, fused=False)
  else:
    d_macs = macs_per_token(dcfg)
  return {"target_step_ms": step_ms["target"], "draft_step_ms": step_ms["draft"],
          "draft_over_target_time": step_ms["draft"] / step_ms["target"],
          "target_macs_per_token": macs_per_token(tcfg), "draft_macs_per_token": d_macs,
          "draft_over_target_macs": d_macs / macs_per_token(tcfg)}


def target_answers(pipe, name: str, prompts, args, cached: dict) -> list:
  """Returns the target's greedy answers to `prompts`: from the --answers file when it holds these prompts and
  settings, else generated (and written to the file)."""
  entry = cached.get(name, {})
  if entry.get("prompts") == prompts and entry.get("max_new_tokens") == args.max_new_tokens:
    print(f"[eval] {name}: the target's answers from {args.answers}", file=sys.stderr)
    return entry["answers"]
  answers = [g.token_ids for g in pipe.generate(prompts, mode="ar", max_new_tokens=args.max_new_tokens,
                                                batch_size=4)]
  cached[name] = {"prompts": prompts, "max_new_tokens": args.max_new_tokens, "answers": answers}
  if args.answers:
    with open(args.answers, "w") as f:
      json.dump(cached, f)
  return answers


def set_report(pipe, stats, tparams, dparams, prompts, answers, replay) -> tuple[dict, list]:
  """Returns (a standalone draft's figures on one prompt set, the draft's rank of every answer token per answer)."""
  import jax.numpy as jnp
  import numpy as np

  g_all, s_all, r_all = [], [], []
  for p, answer in zip(prompts, answers):
    prompt_ids = pipe.encode_prompt(p)
    ids, n = prompt_ids + answer, len(prompt_ids)
    pad = -(-len(ids) // 64) * 64  # bucket lengths so few programs compile
    toks = np.zeros((1, pad), np.int32)
    toks[0, : len(ids)] = ids
    gr, st, rk = (np.asarray(x)[0] for x in stats(tparams, dparams, jnp.asarray(toks)))
    # Position t predicts token t+1: score the positions that predict answer tokens.
    sl = slice(n - 1, len(ids) - 1)
    g_all.append(gr[sl])
    s_all.append(st[sl])
    r_all.append(rk[sl])
  a0 = float(np.concatenate(g_all).mean())
  a1 = float(np.concatenate(s_all).mean())
  return {"positions": int(sum(len(x) for x in g_all)), "alpha_greedy": a0, "alpha_t1": a1,
          "expected_tokens_greedy": {k: expected_tokens(a0, k) for k in range(2, 9)},
          "expected_tokens_t1": {k: expected_tokens(a1, k) for k in range(2, 9)},
          "replayed_greedy": replay(r_all)}, r_all


def print_standalone(report, names, pooled, cost, args, fan_outs) -> int:
  """Prints a standalone draft's table (one row a set, then the mean) and its cost; writes --json-out."""
  import numpy as np
  mean0 = float(np.mean([report[n]["alpha_greedy"] for n in names]))
  mean1 = float(np.mean([report[n]["alpha_t1"] for n in names]))
  print("\n| set | greedy alpha | T=1 alpha | E[tokens/fwd] K=4 greedy | K=8 greedy "
        f"| replayed K=1: tokens/fwd, acceptance, hit rate F={fan_outs[1]} | replayed K=2, F={fan_outs[2]} "
        f"| replayed K=4, F={fan_outs[4]} |")
  print("|---|---|---|---|---|---|---|---|")

  def replayed(r, k):
    x = r["replayed_greedy"][k]
    hit = "-" if x["cache_hit_rate"] is None else f"{x['cache_hit_rate']:.2f}"
    return f"{x['tokens_per_forward']:.2f}, {x['acceptance']:.2f}, {hit}"

  for n in names:
    r = report[n]
    print(f"| {n} | {r['alpha_greedy']:.3f} | {r['alpha_t1']:.3f} | {r['expected_tokens_greedy'][4]:.2f} | "
          f"{r['expected_tokens_greedy'][8]:.2f} | {replayed(r, 1)} | {replayed(r, 2)} | {replayed(r, 4)} |")
  print(f"| mean (replays: pooled) | {mean0:.3f} | {mean1:.3f} | {expected_tokens(mean0, 4):.2f} | "
        f"{expected_tokens(mean0, 8):.2f} | {replayed(pooled, 1)} | {replayed(pooled, 2)} | {replayed(pooled, 4)} |")
  print(f"\ncost per token: draft {cost['draft_step_ms']:.2f} ms / target {cost['target_step_ms']:.2f} ms = "
        f"{cost['draft_over_target_time']:.3f}x (multiply-accumulates {cost['draft_over_target_macs']:.3f}x)")
  if args.json_out:
    with open(args.json_out, "w") as f:
      json.dump({"args": vars(args), "sets": report, "mean_alpha_greedy": mean0, "mean_alpha_t1": mean1,
                 "pooled_replayed_greedy": pooled["replayed_greedy"], "cost": cost}, f, indent=1)
  return 0


EAGLE_DEPTH = 9  # rollout depths 0..8: SD replays up to K=8, SSD replays up to K=4 (depths up to 2K)
SSD_KS = (1, 2, 3, 4)


def eagle_set_report(pipe, tparams, tcfg, dparams, dcfg, prompts, answers, fan_outs) -> dict:
  """Returns an EAGLE draft's figures on one prompt set: agreement and T=1 acceptance by rollout depth, replayed
  greedy SD (K = 1..8) and SSD (K = 1..4) rounds."""
  import numpy as np

  from ssd_jax.theory import acceptance
  from ssd_jax.training.eagle_eval import answer_stats
  r_top = max(max(f) for f in fan_outs.values()) + 1
  tops, t1s, targets = [], [], []
  for p, answer in zip(prompts, answers):
    top, t1, _ = answer_stats(tparams, tcfg, dparams, dcfg, pipe.encode_prompt(p), answer, EAGLE_DEPTH, r_top)
    tops.append(top)
    t1s.append(t1)
    targets.append(np.asarray(answer))
  agree = [float(np.mean(np.concatenate([t[j, :, 0] == y for t, y in zip(tops, targets)])))
           for j in range(EAGLE_DEPTH)]
  t1 = [float(np.mean(np.concatenate([x[j] for x in t1s]))) for j in range(EAGLE_DEPTH)]
  sd = {k: acceptance.summarize([acceptance.replay_eagle_rounds(t, y, k) for t, y in zip(tops, targets)], k)
        for k in range(1, 9)}
  ssd = {k: dict(acceptance.summarize([acceptance.replay_eagle_rounds(t, y, k, fan_outs[k])
                                       for t, y in zip(tops, targets)], k), fan_out=list(fan_outs[k]))
         for k in SSD_KS}
  return {"positions": int(sum(len(y) for y in targets)), "agreement_by_depth": [round(a, 4) for a in agree],
          "t1_acceptance_by_depth": [round(a, 4) for a in t1], "replayed_sd": sd, "replayed_ssd": ssd}


def print_eagle(report, names, cost, args, fan_outs) -> int:
  import numpy as np
  print("\n| set | greedy agreement, depth 0 (fresh target features) / 1 / 2 / 3 / 4 | T=1 depth 0 / 1 | "
        "SD K=2: tokens/fwd, per-token acc. | SD K=4 | SSD K=1: tokens/fwd, acc., hit rate | SSD K=2 | SSD K=3 |")
  print("|---|---|---|---|---|---|---|---|")
  rows = list(names) + ["mean"]
  mean = {"agreement_by_depth": np.mean([report[n]["agreement_by_depth"] for n in names], 0),
          "t1_acceptance_by_depth": np.mean([report[n]["t1_acceptance_by_depth"] for n in names], 0),
          "replayed_sd": {k: {m: float(np.mean([report[n]["replayed_sd"][k][m] for n in names]))
                              for m in ("tokens_per_forward", "per_token_acceptance")} for k in range(1, 9)},
          "replayed_ssd": {k: {m: float(np.mean([report[n]["replayed_ssd"][k][m] for n in names]))
                               for m in ("tokens_per_forward", "per_token_acceptance", "cache_hit_rate")}
                           for k in SSD_KS}}
  for n in rows:
    r = mean if n == "mean" else report[n]
    a, t = r["agreement_by_depth"], r["t1_acceptance_by_depth"]
    sd = lambda k: f"{r['replayed_sd'][k]['tokens_per_forward']:.2f}, {r['replayed_sd'][k]['per_token_acceptance']:.3f}"  # noqa: E731
    ssd = lambda k: (f"{r['replayed_ssd'][k]['tokens_per_forward']:.2f}, "  # noqa: E731
                     f"{r['replayed_ssd'][k]['per_token_acceptance']:.3f}, {r['replayed_ssd'][k]['cache_hit_rate']:.2f}")
    print(f"| {n} | {' / '.join(f'{x:.3f}' for x in a[:5])} | {t[0]:.3f} / {t[1]:.3f} | {sd(2)} | {sd(4)} | "
          f"{ssd(1)} | {ssd(2)} | {ssd(3)} |")
  print(f"\nSSD fan-out: {', '.join(f'K={k}: {list(fan_outs[k])}' for k in SSD_KS)}")
  print(f"cost per token: draft {cost['draft_step_ms']:.2f} ms / target {cost['target_step_ms']:.2f} ms = "
        f"{cost['draft_over_target_time']:.3f}x (multiply-accumulates {cost['draft_over_target_macs']:.3f}x)")
  if args.json_out:
    with open(args.json_out, "w") as f:
      json.dump({"args": vars(args), "kind": "eagle", "sets": report, "mean": jsonable(mean), "cost": cost}, f,
                indent=1)
  return 0


def jsonable(x):
  import numpy as np
  if isinstance(x, dict):
    return {str(k): jsonable(v) for k, v in x.items()}
  if isinstance(x, (np.ndarray, list, tuple)):
    return [jsonable(v) for v in x]
  return float(x) if isinstance(x, (np.floating, float)) else x


if __name__ == "__main__":
  run_main(main)
