"""The one memory sizer: the bytes of params (in the dtype and weight format they will have), KV caches (with the
slots a run's caches get, `run_slots`) and SSD's speculation cache, on each device; and whether a run fits before
anything is loaded, against the memory free where each part lives. preflight.py applies the check to a LoadPlan (each
failure is one line, ValueError, naming the parts and what to change); scripts/plan.py sizes the paper's pairs with
the same functions (plan/memory.py), and tests/test_plan.py checks them against a real run's arrays."""
from __future__ import annotations

import os

import numpy as np

from .models.config import is_eagle

GIB = 2.0**30


def available_memory(device=None) -> int | None:
  """Returns the bytes free for new arrays: `device`'s (a JAX device with memory statistics, e.g. a GPU) or, without
  one, the host's (MemAvailable); None when unknown."""
  if device is not None:
    stats = device.memory_stats() or {}
    if "bytes_limit" in stats:
      return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
  try:
    with open("/proc/meminfo") as f:
      for line in f:
        if line.startswith("MemAvailable:"):
          return int(line.split()[1]) * 1024
  except (OSError, ValueError, IndexError):
    pass
  try:
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
  except (ValueError, OSError, AttributeError):
    return None


def run_slots(max_prompt: int, max_new: int, k: int, fan_out=None, sd_chunk: int = 1,
              ar_chunk: int = 4) -> tuple[int, int]:
  """Returns the cache slots of (the target's, the draft's) KV cache of a run: the decoders' own lookaheads
  (decode.base.run_lookaheads) on top of the text, rounded by decode.base.cache_slots as the decoders round them."""
  from .decode.base import cache_slots, run_lookaheads

  return tuple(cache_slots(max_prompt, max_new, lookahead=a)
               for a in run_lookaheads(k, fan_out, sd_chunk, ar_chunk))


def spec_cache_bytes(draft_cfg, batch: int, k: int, fan_out) -> int:
  """Returns one speculation cache's bytes, as steps.draft_tree returns it (candidates, branch labels, K tokens and
  their float32 distributions over the head rows per branch, the glue distributions): what lives on the draft's
  device between rounds."""
  n, v = sum(fan_out), draft_cfg.out_vocab
  return 4 * (batch * n + n + batch * n * k + batch * n * k * v + batch * (k + 1) * v)


def speculation_memory(draft_cfg, batch: int, k: int, fan_out, max_prompt: int, max_new: int,
                       scores: bool = False) -> dict:
  """Returns an estimate of the bytes SSD's draft side needs beyond its weights, by part, and their "total".

  The parts follow decode/steps.py `draft_tree` (float32 throughout; N = sum(fan_out) branches, V the draft's output
  rows, S its cache slots): the speculation cache (`spec_cache_bytes`, its q [B, N, K, V] the bulk), three times (the
  tree being served, the one being drafted and the drafting loop's own copy), one tree step's logits and
  probabilities (3 x [B, N, V]), the draft's KV cache with the tree's scratch slots (`run_slots`) and, with `scores`
  (the reference attention, which materialises them), one layer's attention scores [B, H, N, S]. Checked against
  scripts/experiments/ssd_memory.py on the shipped pair: peak RSS at B=4 K=4 F=48 exceeds F=3's by 867 MiB; these parts
  differ by 858 MiB.
  """
  from .decode.draft import CACHE_DTYPE

  n, v = sum(fan_out), draft_cfg.out_vocab
  s = run_slots(max_prompt, max_new, k, fan_out)[1]
  parts = {"tree_q": 3 * spec_cache_bytes(draft_cfg, batch, k, fan_out), "tree_step": 3 * batch * n * v * 4,
           "draft_kv": kv_cache_bytes(draft_cfg, batch, s, CACHE_DTYPE),
           "attention_scores": batch * draft_cfg.n_heads * n * s * 4 if scores else 0}
  return dict(parts, total=sum(parts.values()))


def check_speculation_memory(draft_cfg, batch: int, k: int, fan_out, max_prompt: int, max_new: int,
                             available: int | None, scores: bool = False) -> None:
  """Raises ValueError, with the estimate and what to lower, when SSD's speculation cache (`speculation_memory`)
  cannot fit in the `available` bytes (None: unknown, no check)."""
  est = speculation_memory(draft_cfg, batch, k, fan_out, max_prompt, max_new, scores)
  if available is not None and est["total"] > available:
    spec = str(fan_out[0]) if len(set(fan_out)) == 1 else ",".join(map(str, fan_out))
    raise ValueError(f"K={k} with fan-out {spec} ({sum(fan_out)} branches of {k} tokens, batch {batch}) needs an "
                     f"estimated {est['total'] / GIB:.1f} GiB for SSD's speculation cache (of it the draft's "
                     f"distributions, B x N x K x {draft_cfg.out_vocab} floats three times, {est['tree_q'] / GIB:.1f} "
                     f"GiB), more than the {available / GIB:.1f} GiB available: lower the fan-out, K or the batch size")


def param_bytes(cfg, dtype, weights: str = "full", tp: int = 1) -> int:
  """Returns the bytes of `cfg`'s params on each device of a `tp`-device mesh (split as sharding.param_specs splits
  them), floating params in `dtype`; weights='int8': each layer matrix one byte per weight plus a float32 scale per
  output column (ssd_jax/models/quant.py), the embedding and head in `dtype`; weights='q8_0' (a standalone draft's
  format, models/draft_weights.py): the layer matrices and the head (a tied embedding or an untied lm_head) in Q8_0
  blocks, 34 bytes per 32 weights, where draft_weights.q8_0_axis says (the draft is on one device, tp=1). Index
  tables are int32. An EAGLE draft (its own layer only) is sized as 0: it is a fraction of a target's bytes."""
  from .models.blocks import QK, block_bytes
  from .models.draft_weights import q8_0_axis
  from .models.param_decls import param_decls
  from .models.quant import LAYER_MATRICES
  from .sharding import param_specs

  if is_eagle(cfg):
    return 0
  item = np.dtype(dtype).itemsize

  def size(dc, spec, name: str) -> int:
    dims = [n // tp if i < len(spec) and spec[i] is not None else n for i, n in enumerate(dc.shape)]
    n = int(np.prod(dims, dtype=np.int64))
    axis = q8_0_axis(cfg, name) if weights == "q8_0" else None
    if dc.is_table:
      return 4 * n
    if weights == "int8" and name in LAYER_MATRICES:
      return n + 4 * dims[-1]
    return block_bytes("Q8_0", n) if axis is not None and dc.shape[axis] % QK == 0 else n * item
  decls, specs = param_decls(cfg), param_specs(cfg, tp)
  total = sum(size(decls[k], specs[k], k) for k in decls if k != "layers")
  return total + sum(size(dc, sp[k], k) for lay, sp in zip(decls["layers"], specs["layers"]) for k, dc in lay.items())


def model_params(path: str, dtype: str = "auto", weights: str = "full", tp: int = 1):
  """Returns (config, the bytes of its params on each device, the embedding's dtype on device) of the model at `path`
  (a GGUF file, an HF directory or an ssd-jax checkpoint) as load_model would place it, from its headers without
  reading a weight; None where they do not tell (an EAGLE draft without its own embedding). weights='gguf': a GGUF's
  Q8_0/Q4_1 matrices at their size in the file, F16/BF16 tensors in param_dtype(dtype, their dtype), the rest
  dequantized (the GGUF is never converted to size it); other `weights` ('full', 'int8', a draft's 'q8_0') as
  param_bytes sizes them."""
  from .models.checkpoints import param_dtype, peek_model

  if str(path).endswith(".gguf"):
    from .models.model_files import gguf_tensors, kept_as_blocks

    cfg, tensors = gguf_tensors(path)
    f32 = param_dtype(dtype, np.float32)
    if weights != "gguf":  # every tensor dequantized to float32, then cast
      return cfg, param_bytes(cfg, f32, weights, tp), f32
    import ml_dtypes
    stored = {"F16": np.float16, "BF16": ml_dtypes.bfloat16}
    dts = {n: param_dtype(dtype, stored.get(kind, np.float32)) for n, kind, _, _ in tensors}
    total = sum(nbytes if kept_as_blocks(kind, shape) else int(np.prod(shape)) * dts[n].itemsize
                for n, kind, shape, nbytes in tensors if n != "rope_freqs.weight")  # rope_freqs: read into the config
    embed = next(t for t in tensors if t[0] == "token_embd.weight")
    return cfg, total, np.dtype(np.float32) if kept_as_blocks(embed[1], embed[2]) else dts[embed[0]]
  peek = peek_model(path)
  if peek is None:
    return None
  dt = param_dtype(dtype, peek[1])
  return peek[0], param_bytes(peek[0], dt, weights, tp), dt


def draft_params(plan):
  """Returns model_params of a LoadPlan's draft as api.load_prepared holds it: in the settings' dtype and draft
  format (draft_weights, 'auto' resolved as quantize_draft resolves it: 'full' or 'q8_0'), its head cut to
  draft_head_vocab where set (drafts.reduce_head: an untied head of those rows beside the whole embedding, with the
  token tables); None where the headers do not tell."""
  import dataclasses

  from .models.draft_weights import resolve

  s, fmt = plan.settings, resolve(plan.settings.draft_weights)
  got = model_params(plan.draft, s.dtype, fmt)
  if got is None or plan.draft_head_vocab is None or is_eagle(got[0]):
    return got
  cfg = dataclasses.replace(got[0], head_vocab=plan.draft_head_vocab, full_embed=True, tie_embeddings=False)
  return cfg, param_bytes(cfg, got[2], fmt), got[2]


def kv_cache_bytes(cfg, batch: int, slots: int, dtype, tp: int = 1) -> int:
  """Returns a KV cache's bytes on each device of a `tp`-device mesh (split by KV heads where they divide it)."""
  g = cfg.n_kv_heads // tp if cfg.n_kv_heads % tp == 0 else cfg.n_kv_heads
  return 2 * cfg.n_layers * batch * slots * g * cfg.head_dim * np.dtype(dtype).itemsize


def check_model_memory(parts: dict, available: int | None, where: str) -> None:
  """Raises ValueError, naming the parts (bytes by name) and what to change, when they cannot fit together in the
  `available` bytes of `where` (None: unknown, no check)."""
  total = sum(parts.values())
  size = lambda b: f"{b / 2**30:.2f} GiB" if b >= 2**28 else f"{b / 2**20:.1f} MiB"  # noqa: E731
  if available is not None and total > available:
    raise ValueError(f"the run needs an estimated {size(total)} on {where} ("
                     + ", ".join(f"{k} {size(v)}" for k, v in parts.items() if v) + f"), more than the "
                     f"{size(available)} available: use 16-bit params (dtype bfloat16), int8 weights (weights int8, "
                     "--quantize int8), a 16-bit kv_dtype, more target_devices, or a smaller batch_size / "
                     "max_new_tokens")


def draft_config(plan, run=None):
  """Returns the config of the draft a run reads (head cut as it will be), or None (no draft, or an AR run)."""
  import dataclasses

  if plan.draft is None or (run is not None and run.mode == "ar"):
    return None
  dcfg = plan.draft_cfg
  if plan.draft_head_vocab is not None and not is_eagle(dcfg):
    dcfg = dataclasses.replace(dcfg, head_vocab=plan.draft_head_vocab)
  return dcfg


def parts(plan, run=None) -> tuple[dict, dict]:
  """Returns the bytes (by part, on each device that holds one) of the target's side and of the draft's side of a
  LoadPlan: the params (the draft's as `draft_params` sizes them), and with a preflight.Run the KV caches and (SSD)
  the speculation cache. A model whose headers do not tell its size (an EAGLE draft's weights) counts as 0."""
  from .models.checkpoints import param_dtype
  from .decode.draft import CACHE_DTYPE

  s, dcfg = plan.settings, draft_config(plan, run)
  target = model_params(plan.target_source(), s.dtype, s.weights, s.target_devices)
  draft = draft_params(plan) if dcfg is not None else None
  t = {"target params": target[1]} if target else {}
  d = {"draft params": draft[1]} if draft else {}
  if run is not None:
    ssd = run.mode == "ssd"
    t_slots, d_slots = run_slots(run.max_prompt, run.max_new_tokens, run.k, run.fan_out if ssd else None,
                                 run.sd_chunk if run.mode == "sd" else 1)
    if target:
      kv = target[2] if s.kv_dtype == "auto" else param_dtype(s.kv_dtype, target[2])
      t["target KV cache"] = kv_cache_bytes(target[0], run.batch, t_slots, kv, s.target_devices)
    if dcfg is not None:
      d["draft KV cache"] = kv_cache_bytes(dcfg, run.batch, d_slots, CACHE_DTYPE)
    if ssd:  # its draft KV cache is counted above
      est = speculation_memory(dcfg, run.batch, run.k, run.fan_out, run.max_prompt, run.max_new_tokens)
      d["speculation cache"] = est["total"] - est["draft_kv"]
  return t, d


def fits(plan, run=None) -> None:
  """Raises ValueError when a LoadPlan's `parts` cannot fit where they go: the host on a CPU (every CPU device is host
  memory), else the target's first device and the draft's own device. An SSD run's speculation cache is first checked
  alone, where the draft runs (the reference attention adds its scores), so that its line says what to lower."""
  import jax

  s, mode, backend = plan.settings, run.mode if run is not None else None, jax.default_backend()
  if mode == "ssd":
    scores = s.attn_impl == "ref" or (s.attn_impl == "auto" and backend != "cpu")
    check_speculation_memory(draft_config(plan, run), run.batch, run.k, run.fan_out, run.max_prompt,
                             run.max_new_tokens,
                             available_memory(None if backend == "cpu" else plan.placement.draft_device), scores)
  t, d = parts(plan, run)
  tp = s.target_devices
  if backend == "cpu":  # one pool: each device's share, times the devices that hold one
    sd = {k: v * (tp if mode == "sd" and k == "draft params" else 1) for k, v in d.items()}
    check_model_memory({**{k: v * tp for k, v in t.items()}, **sd}, available_memory(), "the host")
    return
  together = mode == "sd" or s.draft_devices == 0  # SD's draft is replicated on the target's devices
  check_model_memory({**t, **(d if together else {})},
                     available_memory(plan.placement.target_mesh.devices.flat[0]), "the target's first device")
  if d and not together:
    check_model_memory(d, available_memory(plan.placement.draft_device), "the draft's device")
