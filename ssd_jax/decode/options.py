"""What a decode run does, each options object checked once, where it is built; and the context check.

No JAX here: scripts check their options before they choose the CPU's devices.

DecodeOptions (every mode): how many tokens, how they are sampled, where a row stops.
SpecOptions (SD, SSD): K drafts per round (or 'auto': chosen per batch, auto_k.py) and SSD's tree shape (fan-out), backup, Saguaro sampling and placement.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from ..models.config import ModelConfig, check_same_vocabulary
from ..theory.fan_out import geometric_from, parse_fan_out
from ..settings import SSD_PLACEMENTS, check_choice
from .auto_k import AUTO, K_MAX
from ..models.config import is_eagle

FAN_OUT_STRATEGIES = ("uniform", "geometric")
BACKUPS = ("auto", "neural", "fast", "ngram")  # backup.py; 'auto': Theorem 17 from the run's measured statistics
PLACEMENTS = tuple(p for p in SSD_PLACEMENTS if p != "auto")  # where SSD's draft runs, 'auto' resolved


@dataclasses.dataclass(frozen=True)
class DecodeOptions:
  max_new_tokens: int = 128
  temperature: float = 0.0      # 0 = greedy
  top_p: float = 1.0
  seed: int = 0
  ignore_eos: bool = False      # produce exactly max_new_tokens
  # The token id, or ids, that end a row: Llama 3 stops on several (<|eot_id|>, <|end_of_text|>, <|eom_id|>).
  # Stored as a sorted tuple (hashable, the same for every way of giving the same set).
  eos_id: int | Sequence[int] | None = None
  # AR: target steps per call (steps.ar_chunk), the host's work per call paid once per chunk; streaming then gets
  # chunks. The same tokens for every value; 1 = a call per token. SD and SSD do not read it.
  ar_chunk: int = 4
  # SD with a colocated draft that reads tokens: rounds per call (sd_chunk.py: verify and the next chain n times in
  # one program). The same tokens for every value; 1 = a call per round. AR and SSD do not read it.
  sd_chunk: int = 8

  def __post_init__(self):
    if self.max_new_tokens < 1:
      raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
    if not np.isfinite(self.temperature) or self.temperature < 0:
      raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
    if not np.isfinite(self.top_p) or not 0 < self.top_p <= 1:
      raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
    if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)) or not -2**63 <= self.seed < 2**63:
      raise ValueError(f"seed must be an integer in [-2^63, 2^63) (JAX makes keys from 64 bits), got {self.seed!r}")
    for name, what in (("ar_chunk", "AR steps per call"), ("sd_chunk", "SD rounds per call")):
      v = getattr(self, name)
      if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
        raise ValueError(f"{name} ({what}) must be an integer >= 1, got {v!r}")
      object.__setattr__(self, name, int(v))
    e = self.eos_id.tolist() if isinstance(self.eos_id, np.ndarray) else self.eos_id
    ids = () if e is None else (e,) if isinstance(e, (int, np.integer, str)) or not np.iterable(e) else tuple(e)
    if any(isinstance(i, bool) or not isinstance(i, (int, np.integer)) or i < 0 for i in ids):
      raise ValueError(f"eos_id must be a token id >= 0 or a collection of them, got {self.eos_id!r}")
    object.__setattr__(self, "eos_id", tuple(sorted({int(i) for i in ids})))

  @property
  def stop_ids(self) -> frozenset[int]:
    """The token ids that end a row (none when ignoring EOS)."""
    return frozenset(() if self.ignore_eos else self.eos_id)

  def cut_at_stop(self, tokens: Sequence[int]) -> tuple[list[int], bool]:
    """Returns (tokens up to and including the first stop id of any kind, whether one was there).

    The speculative decoders commit each round through this, so a round that accepted several tokens ends exactly
    where AR, checking `stop_ids` one token at a time, would have stopped."""
    stops = self.stop_ids
    for j, t in enumerate(tokens):
      if int(t) in stops:
        return [int(x) for x in tokens[: j + 1]], True
    return [int(x) for x in tokens], False


def _counts(fan_out, k: int, what: str) -> tuple[int, ...]:
  """Returns K+1 fan-out counts from an int F (uniform), a string 'F' / 'F0,...,FK' or a sequence, checked."""
  if isinstance(fan_out, (int, np.integer, str)):
    return parse_fan_out(str(fan_out), k)
  counts = tuple(int(x) for x in fan_out)
  if len(counts) != k + 1 or min(counts) < 0 or sum(counts) < 1:
    raise ValueError(f"{what} needs K+1 = {k + 1} non-negative counts with a positive sum, got {counts}")
  return counts


@dataclasses.dataclass(frozen=True)
class SpecOptions:
  """A speculative run's settings (SD reads only k), normalised and checked when built; hashable.

  fan_out: SSD's bonus-token guesses cached per acceptance length 0..K: an int F, 'F' or 'F0,...,FK', or K+1 counts;
  stored as K+1 counts. fan_out_miss: the same after a cache miss (the tree keeps its size: same total); None =
  fan_out. fan_out_strategy 'geometric' spreads the budget sum(fan_out) = F*(K+1) of a single F over the acceptance
  lengths by Theorem 12, from the draft's calibration at the run's temperature (`fan_outs`). backup: the speculator
  on a cache miss ('neural', 'fast', 'ngram', or 'auto': Theorem 17 from measured statistics). saguaro_c < 1
  down-weights the draft's top tokens (Saguaro sampling). placement: SSD's draft on its own JAX device of this process
  ('devices') or in a child process on its own CPU cores ('processes'). draft_timeout: seconds the target waits for
  a draft process's reply before it finishes the run without it (its start and compiles get at least 600).
  """
  k: int | str = AUTO  # the one K default: chosen per batch (auto_k.choose_k; a decoder takes a fixed K, with_k)
  fan_out: tuple[int, ...] | int | str = 3
  fan_out_miss: tuple[int, ...] | int | str | None = None
  fan_out_strategy: str = "uniform"
  backup: str = "neural"
  saguaro_c: float = 1.0
  placement: str = "devices"
  draft_timeout: float = 60.0

  def __post_init__(self):
    if self.k == AUTO:
      # K is chosen per batch (auto_k.choose_k); fan-outs stay a single F until it is (with_k).
      for name in ("fan_out", "fan_out_miss"):
        f = getattr(self, name)
        if f is not None and not isinstance(f, (int, np.integer)) and not (isinstance(f, str) and "," not in f):
          raise ValueError(f"k='auto' takes a single {name.replace('_', '-')} F (per-length counts need a K)")
      f = _counts(self.fan_out, 1, "a fan-out")[0]
      f_miss = f if self.fan_out_miss is None else _counts(self.fan_out_miss, 1, "a fan-out after a miss")[0]
      if f_miss != f:
        raise ValueError(f"fan-out after a miss {f_miss} must have the same total as after a hit {f}")
      self._check_rest()
      object.__setattr__(self, "fan_out", f)
      object.__setattr__(self, "fan_out_miss", f_miss)
      object.__setattr__(self, "saguaro_c", float(self.saguaro_c))
      return
    if isinstance(self.k, bool) or not isinstance(self.k, (int, np.integer)) or self.k < 1:
      raise ValueError(f"K (draft tokens per round) must be an integer >= 1 or 'auto', got {self.k!r}")
    k = int(self.k)
    f = _counts(self.fan_out, k, "a fan-out")
    f_miss = f if self.fan_out_miss is None else _counts(self.fan_out_miss, k, "a fan-out after a miss")
    if sum(f_miss) != sum(f):
      raise ValueError(f"fan-out after a miss {f_miss} must have the same total as after a hit {f}")
    if self.fan_out_strategy == "geometric" and len(set(f)) != 1:
      raise ValueError("geometric fan-out takes a single fan-out F (the budget is F*(K+1))")
    self._check_rest()
    for name, value in (("k", k), ("fan_out", f), ("fan_out_miss", f_miss), ("saguaro_c", float(self.saguaro_c))):
      object.__setattr__(self, name, value)

  def _check_rest(self):
    check_choice("fan-out strategy", self.fan_out_strategy, FAN_OUT_STRATEGIES)
    check_choice("backup", self.backup, BACKUPS)
    if not 0 < self.saguaro_c <= 1:
      raise ValueError(f"Saguaro C must be in (0, 1], got {self.saguaro_c}")
    check_choice("SSD placement", self.placement, PLACEMENTS)  # resolved: settings.SSD_PLACEMENTS less 'auto'
    if isinstance(self.draft_timeout, bool) or not isinstance(self.draft_timeout, (int, float)) \
        or not 0 < self.draft_timeout < float("inf"):
      raise ValueError(f"draft timeout must be a number of seconds > 0, got {self.draft_timeout!r}")

  @property
  def auto(self) -> bool:
    """Whether K is still to be chosen per batch (k='auto')."""
    return self.k == AUTO

  def fixed(self, who: str) -> "SpecOptions":
    """Returns these settings when K is fixed; raises ValueError naming `who` (a decoder runs one K) when it is
    'auto', which only a Pipeline resolves per batch."""
    if self.auto:
      raise ValueError(f"{who} runs one K: give SpecOptions(k=...) (k='auto' is chosen per batch by a Pipeline: "
                       "spec.with_k(pipe.choose_k(rows, temperature)))")
    return self

  def with_k(self, k: int) -> "SpecOptions":
    """Returns these settings with K fixed to `k` (the choice for k='auto'; a single fan-out F spread over K+1)."""
    if not self.auto:
      raise ValueError(f"K is already fixed ({self.k})")
    return dataclasses.replace(self, k=k)  # every other setting as given (the draft's timeout too)

  def fan_outs(self, calibration: dict | None, temperature: float) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Returns the tree's (fan-out after a hit, after a miss) for a run at `temperature`.

    calibration: the draft's {temperature: (a_p, r)} (fan_out.read_calibration); geometric fan-out needs it.
    """
    if self.fan_out_strategy == "uniform":
      return self.fan_out, self.fan_out_miss
    if calibration is None:
      raise ValueError("geometric fan-out needs the draft's calibration (scripts/calibrate_fan_out.py)")
    f = geometric_from(calibration, self.k, sum(self.fan_out), temperature)
    return f, (f if self.fan_out_miss == self.fan_out else self.fan_out_miss)

  @property
  def widest(self) -> int:
    """Returns the most guesses any acceptance length can get (the budget itself under geometric fan-out)."""
    if self.auto:
      return max(self.fan_out, self.fan_out_miss) * (K_MAX + 1 if self.fan_out_strategy == "geometric" else 1)
    if self.fan_out_strategy == "geometric":
      return sum(self.fan_out)
    return max(max(self.fan_out), max(self.fan_out_miss))


def check_pair(target_cfg: ModelConfig, draft_cfg: ModelConfig, spec: SpecOptions, tree: bool = True) -> None:
  """Raises ValueError for a draft that cannot speculate for this target with these options (tree: SSD's, whose
  fan-out must fit the draft's head; SD reads only K)."""
  if target_cfg.head_vocab is not None:
    # verify reads p by token id and draws the bonus over p's rows: both need p over the whole vocabulary.
    raise ValueError(f"the target {target_cfg.name!r} has a reduced head ({target_cfg.head_vocab} of "
                     f"{target_cfg.vocab_size} tokens); speculative decoding verifies with a full-vocabulary target")
  check_same_vocabulary(draft_cfg, target_cfg)
  if is_eagle(draft_cfg):
    from ..models.eagle import check_target
    check_target(draft_cfg, target_cfg)
  if tree and spec.widest > draft_cfg.out_vocab - 1:
    raise ValueError(f"fan-out {spec.widest} exceeds the draft's vocabulary")


def slots_past_text(k: int) -> int:
  """Returns the context a run of K draft tokens a round needs past each row's text and max_new_tokens, as
  check_context counts it: K+1 for a speculative round's verify, none for AR (K = 0)."""
  return k + 1 if k else 0


def check_context(context: int, prompt_lens: Sequence[int], max_new_tokens: int, k: int = 0) -> None:
  """Raises ValueError naming the first prompt that, with max_new_tokens (and K+1 slots past the text for a
  speculative round), does not fit a context of `context` tokens."""
  for i, n in enumerate(prompt_lens):
    which = f"prompt {i + 1}" if len(prompt_lens) > 1 else "the prompt"
    if n + max_new_tokens > context:
      raise ValueError(f"{which} has {n} tokens; with max_new_tokens {max_new_tokens} it exceeds the context of "
                       f"{context} tokens; shorten the prompt or lower max_new_tokens")
    if n + max_new_tokens + slots_past_text(k) > context:
      raise ValueError(f"K={k} needs {k + 1} cache slots past the text, but {which} ({n} tokens) + max_new_tokens "
                       f"({max_new_tokens}) leave only {context - n - max_new_tokens} of the {context}-token "
                       f"context; lower K or max_new_tokens")
