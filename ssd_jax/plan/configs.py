"""The models the plan knows by name: the paper's (ssd_jax.models.named_configs, with Llama 3's RoPE scaling and Qwen3's
q/k norms) and the embedded SmolLM2 target; any ssd-jax checkpoint directory too."""
from __future__ import annotations

from ..models.config import SMOLLM2_135M, ModelConfig
from ..models.named_configs import NAMED_CONFIGS

CONFIGS = {**NAMED_CONFIGS, SMOLLM2_135M.name: SMOLLM2_135M}
ALIASES = {"smollm2-135m": SMOLLM2_135M.name}


def named(name: str) -> ModelConfig:
  """Returns the config called `name` (case-insensitive), or that of an ssd-jax checkpoint directory."""
  key = ALIASES.get(name.lower(), name.lower())
  if key in CONFIGS:
    return CONFIGS[key]
  import os
  if os.path.isfile(os.path.join(name, "config.json")):
    from ..models.checkpoints import read_config
    return read_config(name)
  raise ValueError(f"unknown model {name!r}: choose one of {', '.join(CONFIGS)} or an ssd-jax checkpoint directory")
