"""What load() settles before it reads a weight, once for the API and the scripts: the settings (LoadSettings), the
weight format ('auto' resolved), the draft (which file or directory, its tokenizer against the target's), the
devices and SSD's placement, and whether the models (and a run's caches) fit in memory.

    plan = prepare(target, draft, ...)     # fails here, in a second, on what would fail later
    plan.check_memory(Run(...))            # optional: a run's caches too (load() checks the params)
    pipe = api.load_prepared(plan)         # reads the weights

api.load() is prepare(), check_memory() and load_prepared(); scripts/decode.py calls the three itself, with its run.
"""
from __future__ import annotations

import dataclasses
import os

from . import defaults
from .decode.auto_k import K_MAX
from .decode.options import SpecOptions
from .models import checkpoints, drafts
from .models.config import is_eagle
from .settings import LoadSettings, check_mode


def resolve_weights(weights: str, target: str, target_devices: int = 1) -> str:
  """Returns the weight format `weights` names, 'auto' resolved: a GGUF target's own blocks on one CPU device (the
  SmolLM2 target reads 97 MB a token instead of 538 and decodes about 3x faster, docs/benchmarks.md), else 'full'."""
  if weights != "auto":
    return weights
  import jax
  gguf = target in checkpoints.TARGET_NAMES or str(target).endswith(".gguf")
  return "gguf" if gguf and target_devices == 1 and jax.default_backend() == "cpu" else "full"


def draft_dir(draft: str | None = "default") -> str | None:
  """Returns the absolute path (a checkpoint directory, a Hugging Face directory or a GGUF file) `load(draft=...)`
  reads the draft from, or None when it loads none
  ('default' without the shipped draft, or None); raises CheckpointError for a named draft that is not there."""
  if draft is None:
    return None
  path = checkpoints.resolve_model_dir("default-draft" if draft == "default" else draft)
  if drafts.model_format(path) is not None:
    return os.path.abspath(path)
  if draft != "default":
    raise checkpoints.CheckpointError(f"draft checkpoint not found at {path}")
  return None


@dataclasses.dataclass(frozen=True)
class Run:
  """The shape of a planned run, for its memory check: the mode, rows decoded together, the longest prompt in
  tokens (an upper bound will do: `for_texts`), max_new_tokens and the speculation settings (k='auto' is sized at
  the largest K it may choose)."""
  mode: str
  batch: int
  max_prompt: int
  max_new_tokens: int
  spec: SpecOptions = SpecOptions()
  sd_chunk: int = 8  # SD's rounds a call (DecodeOptions.sd_chunk): its caches' lookahead grows with it

  @staticmethod
  def for_texts(mode: str, prompts: list[str], batch_size: int, max_new_tokens: int, spec: SpecOptions,
                sd_chunk: int = 8) -> "Run":
    """Returns the Run of text prompts before they are tokenized: a token is at least a UTF-8 byte (byte-level BPE),
    and the chat template adds at most 128."""
    return Run(mode, min(batch_size, len(prompts)), max(len(p.encode("utf-8")) for p in prompts) + 128,
               max_new_tokens, spec, sd_chunk)

  @property
  def k(self) -> int:
    return 0 if self.mode == "ar" else K_MAX if self.spec.auto else self.spec.k

  @property
  def fan_out(self) -> tuple:
    """The widest tree the run may build (k='auto': a single F at every length up to K_MAX)."""
    return (self.spec.fan_out,) * (K_MAX + 1) if self.spec.auto else self.spec.fan_out


@dataclasses.dataclass
class LoadPlan:
  """A load, checked and resolved, before any weight is read (`prepare`)."""
  target: str
  settings: LoadSettings  # weights resolved
  placement: object       # sharding.Placement
  draft: str | None       # the draft's path (None: no draft)
  draft_cfg: object       # its config, read without its weights (None: no draft)
  draft_head_vocab: int | None = None

  def mode_and_placement(self) -> tuple[str, str]:
    """Returns (default mode, SSD placement with 'auto' resolved), as the Pipeline will (defaults.resolve): the
    fastest mode `bench.py --calibrate` measured for this load on this machine (`measured_modes`), else the backend's
    table. decode.py decides from it before any weight is read (under AR it loads no draft)."""
    return defaults.resolve(self.draft is not None, self.placement, self.settings.ssd_placement,
                            self.measured_modes())

  def measured_modes_path(self) -> str:
    """Where `bench.py --calibrate` keeps each mode's speed for this load (api.Pipeline.measured_modes_path), keyed by
    what a plan knows before any weight is read: the target and the draft, the weight formats ('auto' resolved),
    the attention, the dtypes, the target's devices and a cut draft head (the step costs themselves are keyed by
    the loaded params' formats, which a plan does not have)."""
    from .decode import auto_k

    s = self.settings
    where = lambda p: os.path.abspath(p) if p is not None and os.path.exists(p) else str(p)  # noqa: E731
    return auto_k.costs_path("modes of a load", where(self.target), where(self.draft), s.weights, s.draft_weights,
                             s.attn_impl, s.kv_dtype, s.dtype, str(s.target_devices), str(self.draft_head_vocab))

  def measured_modes(self) -> dict | None:
    """Returns each mode's tokens a second that `bench.py --calibrate` measured for this load here, or None."""
    from .decode import auto_k

    return auto_k.load_modes(self.measured_modes_path()) if self.draft is not None else None

  def without_draft(self) -> "LoadPlan":
    """Returns this plan with no draft (a run that will only decode AR reads none)."""
    return dataclasses.replace(self, draft=None, draft_cfg=None, draft_head_vocab=None)

  def target_source(self) -> str:
    """Returns what the target is read from (checkpoints.model_source): in its blocks, a GGUF file (the SmolLM2
    target's own), else its path (the named target: its float32 conversion, made on first use)."""
    return checkpoints.model_source(self.target, self.settings.weights == "gguf")

  def check_memory(self, run: Run | None = None) -> None:
    """Raises ValueError (one line) when the params cannot fit where they go; with a `run`, then also when they
    cannot fit with its KV caches and SSD's speculation cache. The memory_check module has the sizes."""
    from .memory_check import fits
    fits(self, None)  # the params alone: the line load() gives
    if run is not None:
      check_mode(run.mode, self.draft is not None)
      fits(self, run)


def prepare(target: str = checkpoints.TARGET_NAME, draft: str | None = "default", attn_impl: str = "auto",
            target_devices: int = 1, draft_devices: int = 1, ssd_placement: str = "auto", dtype: str = "auto",
            weights: str = "auto", draft_head_vocab: int | None = None, kv_dtype: str = "auto",
            draft_weights: str = "auto") -> LoadPlan:
  """Returns the LoadPlan of load() with these arguments (see load), or raises what load() would raise before it
  reads a weight: a bad setting, too few devices, a draft that is not there, of another vocabulary, or a head cut
  it cannot take."""
  from .sharding import make_placement

  from .models.draft_weights import resolve as resolve_draft_weights

  s = LoadSettings(attn_impl, ssd_placement, kv_dtype, weights, dtype, target_devices, draft_devices, draft_weights)
  s = dataclasses.replace(s, weights=resolve_weights(weights, target, target_devices),
                          draft_weights=resolve_draft_weights(draft_weights))
  placement = make_placement(target_devices, draft_devices)
  path = draft_dir(draft)
  if path is None and draft_head_vocab is not None:
    raise ValueError("draft_head_vocab cuts a draft's head, but no draft is loaded")
  plan = LoadPlan(target, s, placement, path, None, draft_head_vocab)
  source = plan.target_source()  # refuses blocks of what is not a GGUF
  if path is not None:  # a draft of another vocabulary is refused before any weight is read
    dcfg, dtok = drafts.read_vocab(path)
    plan.draft_cfg = dcfg
    if not is_eagle(dcfg):
      drafts.check_shared_tokenizer(dcfg, dtok, *drafts.read_vocab(source), path)
    elif draft_head_vocab is not None:
      raise ValueError("draft_head_vocab cuts a standalone draft's head; an EAGLE draft comes with its own")
  return plan
