"""Weight-only int8 (or GGUF blocks) against the unquantized model: greedy agreement and perplexity on benchmark
prompts.

  PYTHONPATH=. python scripts/experiments/int8_eval.py --per-set 4 --new-tokens 32 [--json-out int8.json]
  PYTHONPATH=. python scripts/experiments/int8_eval.py --weights gguf  # the SmolLM2 target in GGUF blocks (blocks.py)

For the SmolLM2 target (in float32, the CPU's default dtype: its GGUF weights are Q4_1/Q8_0 dequantized) and for
the bfloat16 tiny model of `api.load_tiny`, over the first --per-set prompts of each benchmark set (HumanEval, GSM8K,
AlpacaEval, MT-Bench; never the held-out sets). Reports: teacher-forced top-1 agreement (on the unquantized model's
greedy answer, the fraction of positions where the int8 model's argmax is the same token), free-running greedy
agreement (tokens before the first divergence, of --new-tokens), and perplexity of the prompt text (no chat
template) under each model. With --weights gguf the blocks dequantize to exactly the float32 model's weights, so
full forwards (teacher-forced, perplexity) agree by construction; what can differ is the few-row kernel's summation
order in decoding, which the free-running greedy figure measures.
"""
from __future__ import annotations

import argparse
import json

import jax.numpy as jnp
import numpy as np

from ssd_jax import api
from ssd_jax.data import datasets
from ssd_jax.decode import ARDecoder, DecodeOptions
from ssd_jax.models import blocks, checkpoints, model, quant


def nll(params, cfg, ids) -> tuple[float, int]:
  """Returns (summed negative log-likelihood of ids[1:] given their prefixes, count) from one full forward."""
  logits = np.asarray(model.forward_full(params, jnp.asarray([ids]), cfg)[0, :-1], np.float64)
  logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
  return float((logz - logits[np.arange(len(ids) - 1), ids[1:]]).sum()), len(ids) - 1


def compare(name, cfg, params, tok, prompts, new_tokens, qparams=None) -> dict:
  """Returns the agreement and perplexity figures of params against qparams (default: their int8 form) over
  `prompts`."""
  qparams = quant.quantize_params(params, "int8") if qparams is None else qparams
  room = cfg.max_seq_len - new_tokens  # the tiny model's 512-token context: long prompts keep their end
  chat = [tok.encode(tok.chat_prompt(p))[-room:] for p in prompts]
  opts = DecodeOptions(max_new_tokens=new_tokens, ignore_eos=True)
  full = [r.token_ids for r in ARDecoder(cfg, params).generate(chat, opts)]
  q8 = [r.token_ids for r in ARDecoder(cfg, qparams).generate(chat, opts)]
  tf_agree, run = [], []
  for c, f, q in zip(chat, full, q8):
    seq = jnp.asarray([c + f])
    a = np.asarray(model.forward_full(params, seq, cfg)[0, len(c) - 1:-1]).argmax(-1)
    b = np.asarray(model.forward_full(qparams, seq, cfg)[0, len(c) - 1:-1]).argmax(-1)
    tf_agree.append(float(np.mean(a == b)))
    run.append(next((i for i, (x, y) in enumerate(zip(f, q)) if x != y), len(f)))
  ppl = {}
  for tag, p in (("full", params), ("int8", qparams)):
    tot = [nll(p, cfg, tok.encode(text)[:cfg.max_seq_len]) for text in prompts]
    ppl[tag] = float(np.exp(sum(t[0] for t in tot) / sum(t[1] for t in tot)))
  wbytes = blocks.nbytes
  return {"model": name, "dtype": str(params["embed"].dtype), "prompts": len(prompts), "new_tokens": new_tokens,
          "teacher_forced_top1_agreement": float(np.mean(tf_agree)),
          "greedy_tokens_before_divergence": float(np.mean(run)),
          "greedy_identical_answers": int(sum(r == new_tokens for r in run)),
          "ppl_full": ppl["full"], "ppl_int8": ppl["int8"], "ppl_change_pct": 100 * (ppl["int8"] / ppl["full"] - 1),
          "weight_mb_full": wbytes(params) / 1e6, "weight_mb_int8": wbytes(qparams) / 1e6}


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--per-set", type=int, default=4, help="prompts from each benchmark set")
  ap.add_argument("--new-tokens", type=int, default=32)
  ap.add_argument("--target", default=checkpoints.TARGET_NAME)
  ap.add_argument("--weights", default="int8", choices=["int8", "gguf"],
                  help="int8: weight-only int8 (and the bfloat16 tiny model too); gguf: the target's GGUF blocks")
  ap.add_argument("--json-out")
  args = ap.parse_args()
  if args.per_set < 1 or args.new_tokens < 1:
    ap.error("--per-set and --new-tokens must be >= 1")
  prompts = [p for s in ("humaneval", "gsm8k", "alpaca", "mtbench") for p in datasets.load_prompts(s, args.per_set)]
  cfg, params, tok = checkpoints.load_model(args.target)
  qparams = checkpoints.load_model(args.target, keep_blocks=True)[1] if args.weights == "gguf" else None
  rows = [compare(args.target, cfg, params, tok, prompts, args.new_tokens, qparams)]
  if args.weights == "int8":
    tiny = api.load_tiny(dtype="bfloat16")
    rows.append(compare("tiny-target (load_tiny)", tiny.target.cfg, tiny.target.params, tiny.tokenizer, prompts,
                        args.new_tokens))
  print("| model | dtype | teacher-forced top-1 agreement | greedy tokens before divergence (identical answers) "
        f"| perplexity full -> {args.weights} | weights MB full -> {args.weights} |\n|---|---|---|---|---|---|")
  for r in rows:
    print(f"| {r['model']} | {r['dtype']} | {100 * r['teacher_forced_top1_agreement']:.1f}% | "
          f"{r['greedy_tokens_before_divergence']:.1f} of {r['new_tokens']} ({r['greedy_identical_answers']}/"
          f"{r['prompts']}) | {r['ppl_full']:.3f} -> {r['ppl_int8']:.3f} ({r['ppl_change_pct']:+.2f}%) | "
          f"{r['weight_mb_full']:.2f} -> {r['weight_mb_int8']:.2f} |")
  if args.json_out:
    with open(args.json_out, "w") as f:
      json.dump(rows, f, indent=1)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
