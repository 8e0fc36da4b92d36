"""Builds tests/fixtures/families/: tiny random models of the paper's families and transformers' own numbers for them.

Needs the `peer` extra (torch, transformers); the tests that read the fixtures (tests/test_families.py) do not.

Each family gets a Hugging Face directory with the published config.json keys of its real model (numbers shrunk) and
weights as transformers saves them (16-bit and sharded for some, as the real ones are), and `reference.npz`:
transformers' float32 logits for a prompt at positions 0.. and at positions spread up to 30000 (past Llama 3's
original context of 8192, where its scaling matters most), and its greedy continuation. `rope.npz` holds transformers' RoPE
numbers at real sizes (head_dim 128 and 64, factors 8 and 32), where tiny models cannot reach.

  PYTHONPATH=. python scripts/dev/make_family_fixtures.py            # (re)writes the fixtures
  PYTHONPATH=. python scripts/dev/make_family_fixtures.py --check    # rebuilds in a temp dir and compares
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import sys
import tempfile

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))  # the repository, two folders up
OUT = os.path.join(ROOT, "tests", "fixtures", "families")
PROMPT_LEN, NEW_TOKENS = 12, 12
# Positions spread to distances up to 30000: RoPE only sees differences, and these reach every band of Llama 3's
# scaling (a tiny model's contiguous prompt would barely turn its long waves), past its original context of 8192.
SPREAD_POSITIONS = np.array([0, 1, 2, 700, 701, 5000, 9000, 9001, 17000, 25000, 30000, 30001])
LLAMA3 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
          "rope_type": "llama3"}
_LLAMA_KEYS = {"attention_bias": False, "attention_dropout": 0.0, "hidden_act": "silu", "initializer_range": 0.02,
               "mlp_bias": False, "model_type": "llama", "pretraining_tp": 1, "rms_norm_eps": 1e-05,
               "rope_theta": 500000.0, "use_cache": True, "max_position_embeddings": 131072,
               "architectures": ["LlamaForCausalLM"], "bos_token_id": 0, "eos_token_id": [1, 2, 3]}
_QWEN_KEYS = {"attention_dropout": 0.0, "hidden_act": "silu", "initializer_range": 0.02, "rms_norm_eps": 1e-06,
              "rope_theta": 1000000.0, "rope_scaling": None, "use_cache": True, "use_sliding_window": False,
              "bos_token_id": 0, "eos_token_id": 1}
EMBED_SCALE = 0.1
_TINY = {"vocab_size": 128, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2}

# name: (config.json, dtype on disk, max shard size or None)
FAMILIES = {
    # Llama-3.1-8B's keys: llama3 scaling, factor 8, untied, no head_dim key (d / heads).
    "llama3_1": ({**_LLAMA_KEYS, **_TINY, "rope_scaling": LLAMA3, "tie_word_embeddings": False}, "bfloat16", None),
    # Llama-3.2-1B's keys: factor 32, tied, head_dim stated.
    "llama3_2": ({**_LLAMA_KEYS, **_TINY, "rope_scaling": {**LLAMA3, "factor": 32.0}, "tie_word_embeddings": True,
                  "head_dim": 8}, "float32", None),
    # Qwen2.5's keys: q/k/v biases, a switched-off sliding window, GQA 4/1; float16, sharded.
    "qwen2": ({**_QWEN_KEYS, **_TINY, "num_key_value_heads": 1, "model_type": "qwen2", "sliding_window": 32768,
               "max_window_layers": 2, "max_position_embeddings": 32768, "tie_word_embeddings": False,
               "architectures": ["Qwen2ForCausalLM"]}, "float16", "20KB"),
    # Qwen3-0.6B's keys: q/k norms, head_dim 16 != 32 / 4, tied; bfloat16, sharded.
    "qwen3": ({**_QWEN_KEYS, **_TINY, "model_type": "qwen3", "head_dim": 16, "attention_bias": False,
               "sliding_window": None, "max_window_layers": 2, "max_position_embeddings": 40960,
               "tie_word_embeddings": True, "architectures": ["Qwen3ForCausalLM"]}, "bfloat16", "20KB"),
    # Mistral's keys (v0.1's window of 4096, Nemo's head_dim 16 != 32 / 4): a Llama whose context the window caps.
    "mistral": ({**_LLAMA_KEYS, **_TINY, "model_type": "mistral", "architectures": ["MistralForCausalLM"],
                 "sliding_window": 4096, "head_dim": 16, "rope_theta": 1000000.0, "max_position_embeddings": 32768,
                 "tie_word_embeddings": False}, "bfloat16", None),
}
# Real sizes for rope.npz: (name, head_dim, theta, llama3 factor or None).
ROPE_CASES = [("llama3_1_8b", 128, 500000.0, 8.0), ("llama3_2_1b", 64, 500000.0, 32.0),
              ("head128_factor32", 128, 500000.0, 32.0), ("qwen3", 128, 1000000.0, None)]
ROPE_POSITIONS = np.array([0, 1, 8191, 8192, 8193, 16384, 65536, 99999, 100000, 131071])


def randomize(model, seed: int) -> None:
  """Gives the model weights large enough that its logits have clear greedy margins (transformers' 0.02 init gives
  nearly flat ones): matrices N(0, 1/in), embeddings N(0, EMBED_SCALE^2), norm weights and biases around 1 and 0."""
  import torch
  g = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
      if name.endswith("norm.weight"):
        p.copy_(1 + 0.2 * noise)
      elif name.endswith(".bias"):
        p.copy_(0.3 * noise)
      elif "embed_tokens" in name:  # small enough that a tied head does not just repeat the last token
        p.copy_(EMBED_SCALE * noise)
      else:
        p.copy_(noise / p.shape[1] ** 0.5)


def reference(model, prompt: np.ndarray) -> dict:
  """Returns transformers' float32 logits near and far, and its greedy continuation (with each step's margin)."""
  import torch
  ids = torch.as_tensor(prompt)[None]
  with torch.no_grad():
    near = model(ids).logits[0].numpy()
    far = model(ids, position_ids=torch.as_tensor(SPREAD_POSITIONS)[None]).logits[0].numpy()
    seq, margins = ids, []
    for _ in range(NEW_TOKENS):
      last = model(seq).logits[0, -1]
      top2 = torch.topk(last, 2).values
      margins.append(float(top2[0] - top2[1]))
      seq = torch.cat([seq, last.argmax()[None, None]], dim=1)
  return {"prompt": prompt, "logits": near, "far_positions": SPREAD_POSITIONS,
          "far_logits": far, "greedy": seq[0, len(prompt):].numpy(), "greedy_margins": np.asarray(margins)}


def build_family(name: str, out_dir: str, seed: int) -> None:
  """Writes out_dir/name/{config.json, *.safetensors[, index]} and reference.npz."""
  import torch
  from transformers import AutoConfig, AutoModelForCausalLM

  config, dtype, shard = FAMILIES[name]
  d = os.path.join(out_dir, name)
  os.makedirs(d, exist_ok=True)
  with open(os.path.join(d, "config.json"), "w") as f:
    json.dump({**config, "torch_dtype": dtype}, f, indent=2, sort_keys=True)
  torch.manual_seed(seed)
  model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(d), dtype=torch.float32)
  randomize(model, seed)
  with tempfile.TemporaryDirectory() as tmp:
    model.to(getattr(torch, dtype)).save_pretrained(tmp, max_shard_size=shard or "1GB")
    for fn in glob.glob(os.path.join(tmp, "*.safetensors")) + glob.glob(os.path.join(tmp, "*.index.json")):
      shutil.copy(fn, d)
  # The reference is what transformers computes from the directory as a user would load it (16-bit weights widened).
  model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
  prompt = np.random.default_rng(seed).integers(0, config["vocab_size"], PROMPT_LEN).astype(np.int32)
  ref = reference(model, prompt)
  if ref["greedy_margins"].min() < 1e-3:
    raise SystemExit(f"{name}: a greedy step has margin {ref['greedy_margins'].min():.2e}; pick another seed")
  np.savez_compressed(os.path.join(d, "reference.npz"), **ref)


def build_rope(out_dir: str) -> None:
  """Writes rope.npz: per case, transformers' base and scaled inverse frequencies, its angles (inv_freq times the
  position, as its rotary embedding's forward computes them) and cos, at ROPE_POSITIONS."""
  import torch
  from transformers import LlamaConfig
  from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

  out = {"positions": ROPE_POSITIONS}
  for name, head_dim, theta, factor in ROPE_CASES:
    def rotary(params):
      return LlamaRotaryEmbedding(LlamaConfig(hidden_size=head_dim * 8, num_attention_heads=8, head_dim=head_dim,
                                              max_position_embeddings=131072, rope_parameters=params))
    base = rotary({"rope_type": "default", "rope_theta": theta})
    rot = rotary({**LLAMA3, "factor": factor, "rope_theta": theta}) if factor else base
    pos = torch.as_tensor(ROPE_POSITIONS)[None]
    x = torch.zeros(1, len(ROPE_POSITIONS), head_dim)
    with torch.no_grad():
      cos, _ = rot(x, pos)
      angles = (rot.inv_freq[None, :, None].float() @ pos[:, None, :].float()).transpose(1, 2)[0]
    out.update({f"{name}/base_inv_freq": base.inv_freq.numpy(), f"{name}/inv_freq": rot.inv_freq.numpy(),
                f"{name}/angles": angles.numpy(), f"{name}/cos": cos[0, :, : head_dim // 2].numpy(),
                f"{name}/meta": np.array([head_dim, theta, factor or 0.0])})
  np.savez_compressed(os.path.join(out_dir, "rope.npz"), **out)


def build_all(out_dir: str) -> None:
  os.makedirs(out_dir, exist_ok=True)
  for i, name in enumerate(FAMILIES):
    build_family(name, out_dir, seed=41 + i)
  build_rope(out_dir)


def compare(a_dir: str, b_dir: str) -> list[str]:
  """Returns the differences between two fixture trees (arrays compared by value, JSON by content)."""
  sys.path.insert(0, ROOT)
  from ssd_jax.models.model_files import read_safetensors

  diffs = []
  rel = lambda root: sorted(os.path.relpath(p, root) for p in glob.glob(os.path.join(root, "**", "*"), recursive=True)
                            if os.path.isfile(p))  # noqa: E731
  if rel(a_dir) != rel(b_dir):
    return [f"file lists differ: {sorted(set(rel(a_dir)) ^ set(rel(b_dir)))}"]
  for r in rel(a_dir):
    a, b = os.path.join(a_dir, r), os.path.join(b_dir, r)
    if r.endswith(".json"):
      same = json.load(open(a)) == json.load(open(b))
    elif r.endswith(".safetensors"):
      ta, tb = read_safetensors(a), read_safetensors(b)
      same = ta.keys() == tb.keys() and all(np.array_equal(ta[k], tb[k]) for k in ta)
    else:
      na, nb = np.load(a), np.load(b)
      same = set(na.files) == set(nb.files) and all(np.array_equal(na[k], nb[k]) for k in na.files)
    if not same:
      diffs.append(r)
  return diffs


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--out", default=OUT)
  p.add_argument("--check", action="store_true", help="rebuild in a temporary directory and compare with --out")
  args = p.parse_args()
  if not args.check:
    build_all(args.out)
    print(f"wrote {args.out}")
    return
  with tempfile.TemporaryDirectory() as tmp:
    build_all(tmp)
    diffs = compare(args.out, tmp)
  print("fixtures reproduced exactly" if not diffs else f"fixtures differ: {diffs}")
  sys.exit(1 if diffs else 0)


if __name__ == "__main__":
  main()
