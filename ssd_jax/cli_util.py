"""Shared plumbing of the command-line scripts: one clear line and a non-zero exit on bad input."""
from __future__ import annotations

import math
import os
import sys


def split_cpu(n: int) -> None:
  """On a machine with only a CPU, splits it into n JAX devices (target mesh + the draft's own device).

  Must run before JAX is imported (this module imports no JAX); does nothing on GPU/TPU platforms or when the user
  already set the flag.
  """
  if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={n}").strip()


def _intel_cpu() -> bool:
  try:
    with open("/proc/cpuinfo") as f:
      return any(line.startswith("vendor_id") and "GenuineIntel" in line for line in f)
  except OSError:
    return False


def compile_cache() -> str | None:
  """Keeps XLA's compiled programs on disk (JAX's persistent compilation cache) for the scripts, so a second run of
  the same command loads them instead of compiling again; returns the directory, or None when off.

  Under SSD_JAX_CACHE (default ~/.cache/ssd-jax)/xla. A cache the user configured (JAX_COMPILATION_CACHE_DIR) is
  left as it is; SSD_JAX_NO_COMPILE_CACHE=1 turns it off. Off by default on Intel CPUs, whose cached XLA:CPU
  programs current XLA rejects on reload (SSD_JAX_COMPILE_CACHE=1 turns it on there). Set through the environment,
  so child processes (the split SSD placement's draft process, the tests' script runs) share it.
  """
  if os.environ.get("SSD_JAX_NO_COMPILE_CACHE"):
    return None
  if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    if not os.environ.get("SSD_JAX_COMPILE_CACHE") and _intel_cpu():
      # XLA:CPU rejects its own cached programs on many Intel hosts (LLVM tuning flags taken for missing CPU
      # features, openxla/xla#44565): every load fails with an error line and recompiles. Off there unless asked.
      return None
    root = os.environ.get("SSD_JAX_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "ssd-jax"))
    os.environ["JAX_COMPILATION_CACHE_DIR"] = os.path.join(root, "xla")
    # Small programs too: a decoder's many short compiles add up to most of a script's start-up.
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
  if "jax" in sys.modules:  # imported already: the environment was read, so set the options directly
    import jax
    jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
    jax.config.update("jax_persistent_cache_min_compile_time_secs",
                      float(os.environ.get("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "1")))
    jax.config.update("jax_persistent_cache_min_entry_size_bytes",
                      int(os.environ.get("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")))
  return os.environ["JAX_COMPILATION_CACHE_DIR"]


class UsageError(Exception):
  """Bad user input: reported as one line, without a traceback."""


def fail(msg: str):
  raise UsageError(msg)


def warn(msg: str) -> None:
  """Prints one warning line on stderr (input that is accepted but does nothing)."""
  print(f"warning: {msg}", file=sys.stderr, flush=True)


def check_sampling(temperature: float, top_p: float = 1.0) -> None:
  """Fails unless --temperature is finite and >= 0 and --top-p in (0, 1] (NaN fails both tests)."""
  if not (math.isfinite(temperature) and temperature >= 0):
    fail(f"--temperature must be a finite number >= 0 (0 = greedy), got {temperature}")
  if not 0 < top_p <= 1:
    fail(f"--top-p must be in (0, 1], got {top_p}")


def k_value(text) -> int | str:
  """Returns --k as 'auto' (chosen per batch, ssd_jax/decode/auto_k.py) or an integer >= 1; fails in one line."""
  if text == "auto":
    return text
  try:
    k = int(text)
  except ValueError:
    k = 0
  if k < 1:
    fail(f"--k must be an integer >= 1 or 'auto', got {text!r}")
  return k


def check_seed(seed: int) -> None:
  """Fails unless --seed fits the 64-bit integer JAX makes its keys from."""
  if not -2**63 <= seed < 2**63:
    fail(f"--seed must be in [-2^63, 2^63), got {seed}")


def check_output_file(path: str, flag: str) -> None:
  """Fails unless `path` can be written, before any work is done; an existing file is left as it is."""
  if os.path.isdir(path):
    fail(f"{flag} {path} is a directory; give a file name")
  parent = os.path.dirname(os.path.abspath(path))
  if not os.path.isdir(parent):
    fail(f"{flag} {path}: the directory {parent} does not exist")
  existed = os.path.exists(path)
  try:
    with open(path, "a", encoding="utf-8"):
      pass
  except OSError as e:
    fail(f"{flag} {path} cannot be written ({e.strerror})")
  if not existed:
    os.remove(path)


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


def speculation_memory(draft_cfg, batch: int, k: int, fan_out, max_prompt: int, max_new: int,
                       scores: bool = False) -> dict:
  """Returns an estimate of the bytes SSD's draft side needs beyond its weights, by part, and their "total".

  The parts follow decode/steps.py `draft_tree` (float32 throughout; N = sum(fan_out) branches, V the draft's output
  rows, S its cache slots): the speculation cache's q [B, N, K, V], three times (the tree being served, the one being
  drafted and the drafting loop's own copy), one tree step's logits and probabilities (3 x [B, N, V]), the draft's KV
  cache with the tree's scratch slots (2 x layers x [B, S, G, D]) and, with `scores` (the reference attention, which
  materialises them), one layer's attention scores [B, H, N, S]. Checked against scripts/ssd_memory.py on the
  shipped pair: peak RSS at B=4 K=4 F=48 exceeds F=3's by 867 MiB; these parts differ by 858 MiB.
  """
  from .decode.steps import tree_lookahead
  from .kv_cache import round_slots

  n, v = sum(fan_out), draft_cfg.out_vocab
  s = round_slots(max_prompt + max_new + tree_lookahead(k, tuple(fan_out)), 128)
  parts = {"tree_q": 3 * batch * n * k * v * 4, "tree_step": 3 * batch * n * v * 4,
           "draft_kv": 2 * draft_cfg.n_layers * batch * s * draft_cfg.n_kv_heads * draft_cfg.head_dim * 4,
           "attention_scores": batch * draft_cfg.n_heads * n * s * 4 if scores else 0}
  return dict(parts, total=sum(parts.values()))


def check_speculation_memory(draft_cfg, batch: int, k: int, fan_out, max_prompt: int, max_new: int,
                             available: int | None, scores: bool = False) -> None:
  """Fails, with the estimate and what to lower, when SSD's speculation cache (`speculation_memory`) cannot fit in
  the `available` bytes (None: unknown, no check)."""
  est = speculation_memory(draft_cfg, batch, k, fan_out, max_prompt, max_new, scores)
  if available is not None and est["total"] > available:
    gib = 2.0**30
    spec = str(fan_out[0]) if len(set(fan_out)) == 1 else ",".join(map(str, fan_out))
    fail(f"--k {k} with fan-out {spec} ({sum(fan_out)} branches of {k} tokens, batch {batch}) needs an estimated "
         f"{est['total'] / gib:.1f} GiB for SSD's speculation cache (of it the draft's distributions, "
         f"B x N x K x {draft_cfg.out_vocab} floats three times, {est['tree_q'] / gib:.1f} GiB), more than the "
         f"{available / gib:.1f} GiB available: lower --fan-out, --k or --batch-size")


def param_bytes(cfg, dtype, weights: str = "full", tp: int = 1) -> int:
  """Returns the bytes of `cfg`'s params on each device of a `tp`-device mesh (split as sharding.param_specs splits
  them), floating params in `dtype`; weights='int8': each layer matrix one byte per weight plus a float32 scale per
  output column (ssd_jax/quant.py), the embedding and head in `dtype`. Index tables are int32. An EAGLE draft (its
  own layer only) is sized as 0: it is a fraction of a target's bytes."""
  import numpy as np

  from .param_decls import param_decls
  from .quant import LAYER_MATRICES
  from .sharding import param_specs

  if getattr(cfg, "kind", None) == "eagle":
    return 0
  item = np.dtype(dtype).itemsize

  def size(dc, spec, int8: bool) -> int:
    dims = [n // tp if i < len(spec) and spec[i] is not None else n for i, n in enumerate(dc.shape)]
    n = int(np.prod(dims, dtype=np.int64))
    return 4 * n if dc.is_table else n + 4 * dims[-1] if int8 else n * item
  decls, specs = param_decls(cfg), param_specs(cfg, tp)
  total = sum(size(decls[k], specs[k], False) for k in decls if k != "layers")
  return total + sum(size(dc, sp[k], weights == "int8" and k in LAYER_MATRICES)
                     for lay, sp in zip(decls["layers"], specs["layers"]) for k, dc in lay.items())


def kv_cache_bytes(cfg, batch: int, slots: int, dtype, tp: int = 1) -> int:
  """Returns a KV cache's bytes on each device of a `tp`-device mesh (split by KV heads where they divide it)."""
  import numpy as np

  g = cfg.n_kv_heads // tp if cfg.n_kv_heads % tp == 0 else cfg.n_kv_heads
  return 2 * cfg.n_layers * batch * slots * g * cfg.head_dim * np.dtype(dtype).itemsize


def check_model_memory(parts: dict, available: int | None, where: str) -> None:
  """Fails, naming the parts (bytes by name) and what to change, when they cannot fit together in the `available`
  bytes of `where` (None: unknown, no check)."""
  total = sum(parts.values())
  size = lambda b: f"{b / 2**30:.2f} GiB" if b >= 2**28 else f"{b / 2**20:.1f} MiB"  # noqa: E731
  if available is not None and total > available:
    fail(f"the run needs an estimated {size(total)} on {where} ("
         + ", ".join(f"{k} {size(v)}" for k, v in parts.items() if v) + f"), more than the {size(available)}"
         " available: use 16-bit params (--dtype bfloat16), --quantize int8, a 16-bit --kv-dtype, more "
         "--target-devices, or a smaller --batch-size / --max-new-tokens")


def run_main(main) -> None:
  """Runs main() with the compilation cache on (`compile_cache`); expected errors end the process with a one-line
  message and exit code 2."""
  compile_cache()
  from .checkpoints import CheckpointError
  from .datasets import DataError

  try:
    code = main()
  except UsageError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  except (CheckpointError, DataError, ValueError) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  except KeyboardInterrupt:
    print("interrupted", file=sys.stderr)
    sys.exit(130)
  sys.exit(code or 0)
