"""scripts/bench.py's peers (ssd_jax/cli/bench.py): llama.cpp's llama-bench on the target's GGUF (--peer llamacpp:
checked before loading, run beside our figures, and its forwards with --verify-cost) and transformers (--peer hf:
the pair loaded there)."""
from __future__ import annotations

import os
import sys

from ..cli_util import fail


_GGUF_TARGETS = ("smollm2-135m-instruct", "smollm2", "target", "default")


def target_gguf(args) -> str | None:
  """Returns the GGUF file the target is read from (--target FILE.gguf or the SmolLM2 target's), else None."""
  if args.tiny:
    return None
  if args.target.endswith(".gguf"):
    return args.target
  if args.target in _GGUF_TARGETS:
    from ..models import checkpoints
    return checkpoints.locate_smollm2_gguf()
  return None


def check_llamacpp(args) -> None:
  """--peer llamacpp: fails unless the target comes from a GGUF, decoding is batch 1 and llama-bench is found (its
  path goes to args.peer_bin)."""
  from ..bench import llamacpp_peer
  if args.tiny or not (args.target.endswith(".gguf") or args.target in _GGUF_TARGETS):
    fail("--peer llamacpp needs a GGUF target: the default SmolLM2 target or --target FILE.gguf")
  if args.batch_size != 1 or args.sweep == "batch":
    fail("--peer llamacpp compares batch-1 decoding (llama-bench's token generation): use --batch-size 1")
  try:
    args.peer_bin = llamacpp_peer.find_binary(args.peer_bin)
  except llamacpp_peer.LlamaBenchError as e:
    fail(str(e))


def llamacpp_beside(result, args, variants) -> str:
  """Runs llama-bench's token generation on the target's GGUF, pinned as our AR ran (--baseline-cores), with one
  thread per usable core; stores it with ours / llama.cpp per variant in result['llamacpp'] and returns its lines."""
  from ..bench import llamacpp_peer
  saved = os.sched_getaffinity(0)
  if args.baseline_cores == "target":
    from ..decode.draft_process import set_process_affinity, split_cores
    set_process_affinity(split_cores()[0])
  try:
    print(f"[bench] llama.cpp: llama-bench tg{args.max_new_tokens} on {llamacpp_peer.usable_cores()} thread(s)",
          file=sys.stderr, flush=True)
    peer = llamacpp_peer.measure(args.peer_bin, target_gguf(args), args.max_new_tokens)
  except llamacpp_peer.LlamaBenchError as e:
    fail(str(e))
  finally:
    if args.baseline_cores == "target":
      set_process_affinity(saved)
  ours = {v.label: result["summary"]["by_variant"][v.label]["all"]["tokens_per_second"] for v in variants}
  peer["ours_over_llamacpp"] = {k: t / peer["generation"]["tokens_per_second"] for k, t in ours.items()}
  result["llamacpp"] = peer
  return llamacpp_peer.markdown(peer, ours)


def llamacpp_forwards(args, prefix: int = 300) -> dict:
  """--verify-cost --peer llamacpp: prints and returns llama-bench's forward of T = 1, 2, 3, 5, 9 tokens after a
  `prefix`-token cache (as verify_cost_table measures ours), one thread per usable core."""
  from ..bench import llamacpp_peer
  threads = llamacpp_peer.usable_cores()
  cmd = llamacpp_peer.forward_command(args.peer_bin, target_gguf(args), threads, depth=prefix)
  try:
    forwards = llamacpp_peer.parse_report(llamacpp_peer.run(cmd))
  except llamacpp_peer.LlamaBenchError as e:
    fail(str(e))
  print(f"llama.cpp on the same GGUF, {threads} thread(s): {' '.join(cmd)}")
  print("\n".join(llamacpp_peer.forward_lines(forwards)))
  return {"command": cmd, "threads": threads, "forwards": forwards}


def load_peer(pipe, args, work_dir: str):
  """Returns (HFPeer, description): the target from its GGUF (or an export), the draft exported to work_dir."""
  from ..bench import hf_export
  from ..bench.hf_peer import HFPeer

  eos = pipe.tokenizer.eos_id
  draft_dir = None
  info = None
  if pipe.draft is not None:
    draft_dir = os.path.join(work_dir, "hf-draft")
    info = hf_export.export_llama(pipe.draft.params, pipe.draft.cfg, draft_dir, tokenizer=pipe.tokenizer.tok,
                                  eos_id=eos)
    if not info["greedy_exact"]:
      print(f"[bench] warning: the exported draft's greedy argmax may leave its vocabulary ({info})", file=sys.stderr)
  src = target_gguf(args)
  if src is None:
    src = args.target if (not args.tiny and os.path.isdir(args.target)
                          and any(f.endswith(".safetensors") for f in os.listdir(args.target))) else None
    if src is None:  # an ssd-jax checkpoint or the tiny pair: transformers reads the exported copy
      src = os.path.join(work_dir, "hf-target")
      hf_export.export_llama(pipe.target.params, pipe.target.cfg, src, tokenizer=pipe.tokenizer.tok, eos_id=eos)
  print(f"[bench] peer: loading the target from {src} and the draft from {draft_dir} in transformers",
        file=sys.stderr, flush=True)
  peer = HFPeer(src, draft_dir, threads=args.peer_threads)
  return peer, {"target_source": src, "draft_dir": draft_dir, "draft_export": info, "schedule": "constant",
                "torch_threads": peer.torch.get_num_threads()}
