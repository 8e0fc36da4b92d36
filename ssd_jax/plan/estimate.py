"""Step times from bytes, FLOPs, tensor-parallel collectives and launch latency, and from them AR, SD and SSD tokens
a second through the project's timing model (ssd_jax/theory/timing_model.py).

A decode step reads every weight once and each row's KV prefix once (memory-bound at small batch), multiplies
rows x weights (compute-bound only at large batch x T), all-reduces the residual stream twice a layer over the
target mesh (Megatron-style splits, which is what the sharding rules give), gathers the vocabulary-split logits,
and pays a fixed cost per kernel and per step. The 1B draft's step is mostly that fixed cost: the reason SSD pays.
"""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from ..models.config import ModelConfig
from ..decode.draft import CACHE_DTYPE as DRAFT_CACHE_DTYPE
from ..theory.timing_model import expected_tokens, ssd_speedup
from .devices import Device
from .memory import kv_bytes_per_token, param_bytes

# Kernels a layer launches in a decode step (norms, q/k/v, RoPE, cache writes, attention, o, residuals, gate/up,
# activation, down): an assumption, printed; fitted through launch_us from a GPU calibration run.
KERNELS_PER_LAYER = 12


def _embed_bytes(cfg: ModelConfig, tp: int, itemsize: float) -> float:
  rows = cfg.embed_rows // tp if cfg.embed_rows % tp == 0 else cfg.embed_rows
  return rows * cfg.d_model * itemsize


def weight_read_bytes(cfg: ModelConfig, tp: int, dtype: str) -> float:
  """Returns the weight bytes a step reads on each device: all of them but an untied embedding table (only the
  looked-up rows are read)."""
  total = param_bytes(cfg, tp, dtype)
  if not cfg.tie_embeddings:
    total -= _embed_bytes(cfg, tp, 2 if dtype == "int8" else jnp.dtype(dtype).itemsize)  # int8 keeps it bfloat16
  return float(total)


def step_parts(cfg: ModelConfig, tp: int, dev: Device, dtype: str, batch: int, rows: int, context: int,
               cache_dtype) -> dict:
  """Returns the seconds of one forward of `rows` new tokens per sequence after `context` cached ones, by part:
  memory, compute, collectives, fixed (launch + step) and their total (max(memory, compute) + the rest)."""
  wbytes = weight_read_bytes(cfg, tp, dtype)
  elems = weight_read_bytes(cfg, tp, "float32") / 4
  heads = cfg.n_heads // tp if cfg.n_heads % tp == 0 else cfg.n_heads
  kv = batch * context * kv_bytes_per_token(cfg, tp, cache_dtype)
  logits = batch * rows * cfg.out_vocab * 4
  t_mem = (wbytes + kv + logits) / (dev.hbm_gbs * 1e9 * dev.bw_eff)
  flops = 2 * batch * rows * elems + 4 * batch * rows * context * heads * cfg.head_dim
  t_flops = flops / (dev.tflops * 1e12 * dev.flops_eff)
  t_coll = 0.0
  if tp > 1:
    msg = batch * rows * cfg.d_model * 2  # a bfloat16 residual stream
    ring = 2 * (tp - 1) / tp
    n = 2 * cfg.n_layers + 1  # two a layer, one after the vocabulary-split embedding lookup
    t_coll = n * (dev.allreduce_us * 1e-6 + ring * msg / (dev.link_gbs * 1e9))
    t_coll += dev.allreduce_us * 1e-6 + (tp - 1) / tp * logits / (dev.link_gbs * 1e9)  # gather the logits
  t_fixed = (KERNELS_PER_LAYER * cfg.n_layers * dev.launch_us + dev.step_us) * 1e-6
  return {"memory": t_mem, "compute": t_flops, "collectives": t_coll, "fixed": t_fixed,
          "total": max(t_mem, t_flops) + t_coll + t_fixed}


@dataclasses.dataclass(frozen=True)
class Setting:
  """A decoding setting to estimate: batch, context (cached tokens), SD's K, SSD's K and fan-out, SSD's hit rate."""
  batch: int = 1
  context: int = 640   # the paper's 128 prompt tokens + 512 output tokens, at the end of the answer
  sd_k: int = 6
  k: int = 7
  fan_out: tuple = (3,) * 8
  p_hit: float = 0.9


def step_times(tcfg: ModelConfig, dcfg: ModelConfig, tp: int, dev: Device, dtype: str, s: Setting) -> dict:
  """Returns the seconds of each program of a round: AR step, verify (SD's and SSD's K), the draft's chain of K
  (SD's proposal, SSD's neural backup), glue, one tree step, and one round's draft<->target transfers."""
  tcache = jnp.bfloat16 if dtype == "int8" else jnp.dtype(dtype)
  t = lambda rows: step_parts(tcfg, tp, dev, dtype, s.batch, rows, s.context, tcache)["total"]  # noqa: E731
  d = lambda rows: step_parts(dcfg, 1, dev, dtype, s.batch, rows, s.context, DRAFT_CACHE_DTYPE)["total"]  # noqa: E731
  n = sum(s.fan_out)
  q_bytes = s.batch * s.k * tcfg.vocab_size * 4
  return {"ar": t(1), "verify_sd": t(s.sd_k + 1), "verify": t(s.k + 1),
          "chain_sd": d(2) + (s.sd_k - 1) * d(1), "chain": d(2) + (s.k - 1) * d(1), "draft_step": d(1),
          "glue": d(s.k + 2), "tree_step": d(n),
          "transfer": 2 * dev.transfer_us * 1e-6 + q_bytes / (dev.link_gbs * 1e9)}


def tokens_per_second(times: dict, a: float, s: Setting) -> dict:
  """Returns AR, SD and SSD tokens a second (all rows) at per-token acceptance `a` from `step_times`: SD's round is
  a chain then a verify; SSD's (Theorem 7, batch form) overlaps glue + K tree steps with the verify on a hit and
  runs the neural backup (the chain) first on a miss."""
  b = s.batch
  sd = b * expected_tokens(a, s.sd_k) / (times["verify_sd"] + times["chain_sd"])
  unit = times["verify"] + times["transfer"]
  t_primary = (times["glue"] + s.k * times["tree_step"]) / unit
  e = expected_tokens(a, s.k)
  ssd = b * ssd_speedup(s.p_hit, e, e, t_primary, times["chain"] / unit, b) / unit
  return {"ar": b / times["ar"], "sd": sd, "ssd": ssd, "ssd_primary_over_verify": t_primary}


def acceptance_for_sd(times: dict, s: Setting, sd_target: float, scale: float = 1.0) -> float | None:
  """Returns the per-token acceptance at which SD's estimate (x scale) meets `sd_target` tok/s, None if none in
  [0, 1) does (bisection: SD's rate grows with the acceptance)."""
  f = lambda a: tokens_per_second(times, a, s)["sd"] * scale - sd_target  # noqa: E731
  lo, hi = 0.0, 0.999
  if f(lo) > 0 or f(hi) < 0:
    return None
  for _ in range(50):
    mid = (lo + hi) / 2
    lo, hi = (mid, hi) if f(mid) < 0 else (lo, mid)
  return (lo + hi) / 2


def fit_device(dev: Device, points: list) -> Device:
  """Returns `dev` with bw_eff and launch_us fitted (least squares) to measured steps.

  points: (seconds, weight+KV bytes read, kernels launched) per measured step, from one device; the model
  seconds = bytes / (peak x bw_eff) + kernels x launch_us + step_us is linear in (1 / bw_eff, launch_us).
  """
  if len(points) < 2:
    raise ValueError("a calibration needs at least two measured steps of different sizes")
  a = np.asarray([[b / (dev.hbm_gbs * 1e9), k * 1e-6] for _, b, k in points])
  y = np.asarray([sec - dev.step_us * 1e-6 for sec, _, _ in points])
  (inv_eff, launch), *_ = np.linalg.lstsq(a, y, rcond=None)
  if inv_eff <= 0 or launch < 0:
    raise ValueError(f"the calibration does not fit the model (1/efficiency {inv_eff:.3g}, launch {launch:.3g} us)")
  return dataclasses.replace(dev, bw_eff=float(min(1.0, 1 / inv_eff)), launch_us=float(launch))


def calibrate(dev: Device, data: dict, configs: dict) -> Device:
  """Returns `dev` fitted to a calibration run's one-token steps (scripts/dev/plan_calibrate.py writes the JSON): for
  each model it timed (its config in the file, else configs[name]), its AR step at its context, one device."""
  points = []
  from ..models.config import ModelConfig
  for name, m in data.get("models", {}).items():
    if "ar_step_s" not in m or (name not in configs and "config" not in m):
      continue
    cfg = ModelConfig.from_dict(m["config"]) if "config" in m else configs[name]
    dtype = data.get("dtype", "bfloat16")
    kv = m.get("batch", 1) * m.get("context", 0) * kv_bytes_per_token(cfg, 1, jnp.dtype(dtype))
    points.append((m["ar_step_s"], weight_read_bytes(cfg, 1, dtype) + kv, KERNELS_PER_LAYER * cfg.n_layers))
  return fit_device(dev, points)
