"""Every load setting's allowed values and its one check, importable without JAX (scripts check their flags before
they choose the CPU's devices).

Each setting is checked by one function here, whoever takes it: `LoadSettings` (load() and a Pipeline build it before
any weight is read), and the modules that use a value (the attention, the KV cache, the placement) call the same
check, so a bad value reads the same line wherever it is caught. Scripts take these tuples for their --help and print
the check's line (no second list of allowed values, no second message).
"""
from __future__ import annotations

import dataclasses

MODES = ("ar", "sd", "ssd")
SSD_PLACEMENTS = ("auto", "devices", "processes")  # 'auto': by where it runs (defaults.auto_ssd_placement)
ATTN_IMPLS = ("auto", "ref", "cpu", "pallas")  # kernels/masked_attention
DTYPES = ("auto", "float32", "bfloat16", "float16")  # the params' (checkpoints.param_dtype)
KV_DTYPES = ("auto", "float32", "bfloat16", "float16")  # the target KV cache's; 'auto': the params'
WEIGHT_FORMATS = ("full", "int8")  # what quant.quantize_params makes
WEIGHTS = ("auto",) + WEIGHT_FORMATS + ("gguf",)  # gguf: a GGUF target's own blocks (blocks.py)
DRAFT_WEIGHTS = ("auto", "full", "q8_0")  # the draft's (models/draft_weights.py); 'auto': q8_0 on a CPU


def check_choice(what: str, value, allowed: tuple) -> None:
  """Raises ValueError, one line naming the choices, unless `value` is one of `allowed`."""
  if value not in allowed:
    raise ValueError(f"unknown {what} {value!r}; choose one of {', '.join(allowed)}")


def check_devices(target_devices: int, draft_devices: int) -> None:
  """Raises ValueError unless the target gets one device or more and the draft 0 (the target's first) or 1."""
  if target_devices < 1 or draft_devices < 0:
    raise ValueError("need at least one target device (and a non-negative number of draft devices)")
  if draft_devices > 1:
    raise ValueError("the draft runs on one device; draft data parallelism is not implemented")


def check_mode(mode: str, has_draft: bool | None = None) -> None:
  """Raises ValueError for an unknown mode, or (has_draft False) for a speculative mode without a draft."""
  check_choice("mode", mode, MODES)
  if mode != "ar" and has_draft is False:
    raise ValueError(f"mode {mode!r} needs a draft, and none is loaded: pass one (load(draft=PATH), decode.py "
                     "--draft PATH) or train one with scripts/train_draft.py")


def check_batch_size(batch_size: int) -> None:
  if batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}")


@dataclasses.dataclass(frozen=True)
class LoadSettings:
  """A pipeline's settings, checked once where they are built: load() builds them before it reads any weight, and a
  Pipeline built directly builds them too. Each bad value is one line (unknown ones name the choices)."""
  attn_impl: str = "auto"
  ssd_placement: str = "auto"
  kv_dtype: str = "auto"
  weights: str = "full"
  dtype: str = "auto"
  target_devices: int = 1
  draft_devices: int = 1
  draft_weights: str = "auto"

  def __post_init__(self):
    for what, value, allowed in (("attention implementation", self.attn_impl, ATTN_IMPLS),
                                 ("SSD placement", self.ssd_placement, SSD_PLACEMENTS),
                                 ("KV cache dtype", self.kv_dtype, KV_DTYPES), ("weights", self.weights, WEIGHTS),
                                 ("dtype", self.dtype, DTYPES),
                                 ("draft weights", self.draft_weights, DRAFT_WEIGHTS)):
      check_choice(what, value, allowed)
    check_devices(self.target_devices, self.draft_devices)
    if self.weights == "gguf" and self.target_devices != 1:
      raise ValueError("weights='gguf' runs the target on one device; use target_devices=1")
