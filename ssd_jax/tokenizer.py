"""The SmolLM2 tokenizer, rebuilt from GGUF metadata, and the chat template."""
from __future__ import annotations

from typing import Sequence

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
IM_START, IM_END, ENDOFTEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"


def tokenizer_from_gguf_meta(meta: dict) -> Tokenizer:
  """Returns a byte-level BPE tokenizer built from GGUF `tokenizer.ggml.*` metadata (the 'smollm' pre-tokenizer)."""
  toks = list(meta["tokenizer.ggml.tokens"])
  merges = list(meta["tokenizer.ggml.merges"])
  types = list(meta["tokenizer.ggml.token_type"])
  pre = meta.get("tokenizer.ggml.pre", "smollm")
  tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(toks)},
                             merges=[tuple(m.split(" ", 1)) for m in merges]))
  split_digits = [pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated")] if pre == "smollm" else []
  tok.pre_tokenizer = pre_tokenizers.Sequence(split_digits + [
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
  tok.decoder = decoders.ByteLevel()
  tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, y in zip(toks, types) if y == 3])
  return tok


def byte_level_tokenizer() -> Tokenizer:
  """Returns a 259-token byte-level tokenizer (the chat specials at ids 0-2, then the 256 bytes, no merges).

  For tiny random models (tests, `scripts/bench.py --tiny`): any text encodes, one token per byte.
  """
  specials = [ENDOFTEXT, IM_START, IM_END]
  vocab = {t: i for i, t in enumerate(specials + sorted(pre_tokenizers.ByteLevel.alphabet()))}
  tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  tok.decoder = decoders.ByteLevel()
  tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
  return tok


class TextTokenizer:
  """Thin wrapper: encode/decode plus the chat template and the end-of-turn id."""

  def __init__(self, tok: Tokenizer):
    self.tok = tok
    self.eos_id = tok.token_to_id(IM_END)
    if self.eos_id is None:
      raise ValueError(f"tokenizer has no {IM_END} token")

  @classmethod
  def from_file(cls, path: str) -> "TextTokenizer":
    return cls(Tokenizer.from_file(path))

  def save(self, path: str) -> None:
    self.tok.save(path)

  @property
  def vocab_size(self) -> int:
    return self.tok.get_vocab_size()

  def encode(self, text: str) -> list[int]:
    return self.tok.encode(text, add_special_tokens=False).ids

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    return [e.ids for e in self.tok.encode_batch(list(texts), add_special_tokens=False)]

  def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
    return self.tok.decode(list(ids), skip_special_tokens=skip_special)

  def chat_prompt(self, message: str, system: str = DEFAULT_SYSTEM) -> str:
    return chat_template([("user", message)], system=system, add_generation_prompt=True)


def chat_template(turns: Sequence[tuple[str, str]], system: str | None = DEFAULT_SYSTEM,
                  add_generation_prompt: bool = True) -> str:
  """Returns the SmolLM2 chat text for (role, content) turns, ending with an open assistant turn if asked."""
  parts = []
  if system is not None and (not turns or turns[0][0] != "system"):
    parts.append(f"{IM_START}system\n{system}{IM_END}\n")
  for role, content in turns:
    parts.append(f"{IM_START}{role}\n{content}{IM_END}\n")
  if add_generation_prompt:
    parts.append(f"{IM_START}assistant\n")
  return "".join(parts)
