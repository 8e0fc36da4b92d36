"""The benchmark's peer: the same target and draft through Hugging Face transformers on PyTorch.

Modes: 'hf-ar' (generate) and 'hf-sd' (assisted generation with our draft as the assistant, K draft tokens per round,
constant schedule, no confidence cut-off: the same algorithm as our SD). Needs the optional `peer` extra
(`pip install -e ".[peer]"`: torch, transformers, accelerate); nothing else in the project imports torch.

Following ../shared/docs/models_and_data.md: the target is loaded from the same GGUF file (transformers dequantizes
it), prompts go in as token ids from our tokenizer (transformers' GGUF tokenizer ignores the "smollm" digit split),
and every call passes an all-ones attention mask (the pad id is also <|im_end|>, which would otherwise be masked).
"""
from __future__ import annotations

import os
import time

PEER_MODES = ("hf-ar", "hf-sd")


class PeerUnavailable(RuntimeError):
  """torch / transformers are not installed."""


def _require():
  try:
    import torch
    import transformers
  except ImportError as e:
    raise PeerUnavailable(f"the transformers peer needs the 'peer' extra: pip install -e \".[peer]\" ({e})") from e
  return torch, transformers


class _FirstTokenClock:
  """A generate() streamer that records when the first new tokens arrive (the end of prefill) and how many.

  Assisted generation has no separate prefill: its first round (draft prefill, target prefill + verify) may commit
  several tokens at once; they count with the prefill, as our first token does.
  """

  def __init__(self):
    self.calls = 0
    self.first_token_at = None
    self.first_tokens = 0

  def put(self, value):
    self.calls += 1
    if self.calls == 2:  # the first put() is the prompt itself
      self.first_token_at = time.perf_counter()
      self.first_tokens = int(value.numel())

  def end(self):
    pass


class HFPeer:
  """A transformers target (from a GGUF file or a Hugging Face directory) and an exported draft, ready to decode."""

  def __init__(self, target: str, draft_dir: str | None, threads: int | None = None):
    torch, transformers = _require()
    self.torch = torch
    if threads:
      torch.set_num_threads(threads)
    auto = transformers.AutoModelForCausalLM
    if target.endswith(".gguf"):
      self.target = auto.from_pretrained(os.path.dirname(os.path.abspath(target)), gguf_file=os.path.basename(target),
                                         dtype=torch.float32)
    else:
      self.target = auto.from_pretrained(target, dtype=torch.float32)
    self.draft = auto.from_pretrained(draft_dir, dtype=torch.float32) if draft_dir else None
    for m in (self.target, self.draft):
      if m is not None:
        m.eval()
    self.forwards = 0
    self.target.register_forward_hook(self._count)

  def _count(self, module, args, output):
    self.forwards += 1

  def generate(self, ids: list[int], mode: str, max_new_tokens: int, temperature: float = 0.0, seed: int = 0,
               k: int = 2, eos_id: int | None = None) -> tuple[list[int], dict]:
    """Returns (new token ids, stats with the keys of RequestStats.to_dict) for one prompt of token ids.

    k: draft tokens per round of hf-sd (constant schedule, no confidence cut-off, as our SD). eos_id None decodes
    exactly max_new_tokens (our ignore_eos: EOS may appear and decoding goes on).
    """
    torch = self.torch
    if mode not in PEER_MODES:
      raise ValueError(f"unknown peer mode {mode!r}; choose from {', '.join(PEER_MODES)}")
    if mode == "hf-sd" and self.draft is None:
      raise ValueError("hf-sd needs a draft")
    for m in (self.target, self.draft):
      if m is not None:  # generate() fills unset fields from the model's own config: set them there
        m.generation_config.eos_token_id = eos_id
        m.generation_config.pad_token_id = eos_id if eos_id is not None else 0
    inp = torch.tensor([list(ids)], dtype=torch.long)
    kw = dict(attention_mask=torch.ones_like(inp), max_new_tokens=max_new_tokens, do_sample=temperature > 0)
    if temperature > 0:
      kw.update(temperature=temperature, top_k=0, top_p=1.0)
      torch.manual_seed(seed)
    if mode == "hf-sd":
      g = self.draft.generation_config
      g.num_assistant_tokens, g.num_assistant_tokens_schedule, g.assistant_confidence_threshold = k, "constant", 0.0
      kw["assistant_model"] = self.draft
    clock = _FirstTokenClock()
    self.forwards = 0
    with torch.inference_mode():
      t0 = time.perf_counter()
      out = self.target.generate(inp, streamer=clock, **kw)
      t1 = time.perf_counter()
    new = out[0, inp.shape[1]:].tolist()
    t_first = clock.first_token_at or t1
    decode_s = t1 - t_first
    decode_tokens = max(len(new) - clock.first_tokens, 0)
    stats = {"mode": mode, "new_tokens": len(new), "target_forwards": self.forwards,
             "tokens_per_target_forward": round(len(new) / max(self.forwards, 1), 4),
             "prefill_seconds": round(t_first - t0, 4), "decode_seconds": round(decode_s, 4),
             "decode_tokens": decode_tokens,
             "tokens_per_second": round(decode_tokens / decode_s, 3) if decode_s > 0 else 0.0}
    if mode == "hf-sd":
      stats["k"] = k
    return new, stats
