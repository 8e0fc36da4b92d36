"""Per-request statistics returned by the API and written by `scripts/decode.py --json-out`."""
from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class RequestStats:
  mode: str
  new_tokens: int = 0
  target_forwards: int = 0      # target forward passes that produced this request's tokens (prefill included)
  prefill_seconds: float = 0.0
  decode_seconds: float = 0.0   # wall time from the end of prefill until this request's last token
  extra: dict = dataclasses.field(default_factory=dict)

  @property
  def tokens_per_target_forward(self) -> float:
    return self.new_tokens / self.target_forwards if self.target_forwards else 0.0

  @property
  def tokens_per_second(self) -> float:
    """Tokens produced after prefill per second of decode time (the first token comes from prefill)."""
    return max(self.new_tokens - 1, 0) / self.decode_seconds if self.decode_seconds > 0 else 0.0

  def to_dict(self) -> dict[str, Any]:
    d = {"mode": self.mode, "new_tokens": self.new_tokens, "target_forwards": self.target_forwards,
         "tokens_per_target_forward": round(self.tokens_per_target_forward, 4),
         "prefill_seconds": round(self.prefill_seconds, 4), "decode_seconds": round(self.decode_seconds, 4),
         "tokens_per_second": round(self.tokens_per_second, 3)}
    d.update(self.extra)
    return d
