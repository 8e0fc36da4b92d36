"""Tokenizers and chat templates: a model directory's own files (tokenizer.json, tokenizer_config.json,
generation_config.json), or the SmolLM2 tokenizer rebuilt from GGUF metadata with its built-in ChatML template."""
from __future__ import annotations

import json
import os
from typing import Sequence

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
IM_START, IM_END, ENDOFTEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"


class TokenizerError(ValueError):
  """A model's tokenizer files (or GGUF tokenizer metadata) are missing, unsupported or contradict each other."""


# The split regexes of the byte-level BPE families a GGUF names in `tokenizer.ggml.pre` (llama.cpp writes the name of
# the regex the model's tokenizer.json used). None: ByteLevel's own GPT-2 regex. Llama 3 groups digits by three,
# Qwen2/Qwen3 split them one by one; SmolLM2 isolates digits and then applies the GPT-2 regex.
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                 r"\s*[\r\n]+|\s+(?!\S)|\s+")
_GGUF_SPLITS = {"gpt-2": None, "gpt2": None, "llama-bpe": _LLAMA3_SPLIT, "llama3": _LLAMA3_SPLIT,
                "qwen2": _LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")}


def _gguf_pre_tokenizer(pre: str):
  if pre == "smollm":
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
  if pre not in _GGUF_SPLITS:
    raise TokenizerError(f"GGUF pre-tokenizer {pre!r} is not supported (known: smollm, {', '.join(_GGUF_SPLITS)}); "
                         "load the model's Hugging Face directory, whose tokenizer.json says how it splits text")
  if _GGUF_SPLITS[pre] is None:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(_GGUF_SPLITS[pre]), behavior="isolated"),
                                  pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def tokenizer_from_gguf_meta(meta: dict) -> Tokenizer:
  """Returns a byte-level BPE tokenizer built from GGUF `tokenizer.ggml.*` metadata (pre-tokenizer 'smollm' when the
  file names none); control tokens (type 3) are special, user-defined ones (type 4, Qwen3's <think>) added text."""
  model = meta.get("tokenizer.ggml.model", "gpt2")
  if model != "gpt2":
    raise TokenizerError(f"GGUF tokenizer model {model!r} is not supported (only byte-level BPE, 'gpt2'); load the "
                         "model's Hugging Face directory (tokenizer.json) instead")
  toks = list(meta["tokenizer.ggml.tokens"])
  merges = list(meta["tokenizer.ggml.merges"])
  types = list(meta["tokenizer.ggml.token_type"])
  tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(toks)},
                             merges=[tuple(m.split(" ", 1)) for m in merges]))
  pre = meta.get("tokenizer.ggml.pre", "smollm")
  tok.pre_tokenizer = _gguf_pre_tokenizer(pre)
  if pre == "qwen2":
    tok.normalizer = normalizers.NFC()  # as Qwen's tokenizer.json
  tok.decoder = decoders.ByteLevel()
  tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, y in zip(toks, types) if y == 3])
  tok.add_tokens([AddedToken(t, special=False, normalized=False) for t, y in zip(toks, types) if y == 4])
  return tok


def text_tokenizer_from_gguf(meta: dict) -> "TextTokenizer":
  """Returns the TextTokenizer a GGUF carries: its tokenizer, `tokenizer.chat_template`, BOS before raw text when
  `add_bos_token`, and the end-of-sequence set of its eos, eot and eom ids (llama.cpp stops on all three)."""
  tok = tokenizer_from_gguf_meta(meta)
  toks = meta["tokenizer.ggml.tokens"]
  ids = {k: int(meta[f"tokenizer.ggml.{k}_token_id"]) for k in ("bos", "eos", "eot", "eom", "unknown", "padding")
         if f"tokenizer.ggml.{k}_token_id" in meta}
  if any(not 0 <= i < len(toks) for i in ids.values()):
    raise TokenizerError(f"GGUF special token ids {ids} reach past its {len(toks)} tokens")
  special = {f"{k}_token": toks[ids[g]] for k, g in (("bos", "bos"), ("eos", "eos"), ("unk", "unknown"),
                                                     ("pad", "padding")) if g in ids}
  if meta.get("tokenizer.ggml.add_bos_token") and "bos" in ids:
    bos = toks[ids["bos"]]
    tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                                       special_tokens=[(bos, ids["bos"])])
  eos = [ids[k] for k in ("eos", "eot", "eom") if k in ids]
  from .chat_template import TemplateError
  try:
    return TextTokenizer(tok, eos, meta.get("tokenizer.chat_template"), special)
  except TemplateError as e:
    raise TemplateError(f"GGUF tokenizer.chat_template: {e}") from None


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
  """Encode/decode, the chat template and the end-of-sequence ids of a model.

  template: the model's Jinja chat template (ssd_jax/models/chat_template.py), or None for the built-in ChatML one of
  SmolLM2 (`chat_template` below), used when the vocabulary has <|im_start|>/<|im_end|>; without either, only raw
  prompts encode. eos_ids: the ids that end a reply (default: <|im_end|>); eos_id is the one the tokenizer names
  (the end of an assistant turn), kept for callers that write one. special_tokens: bos_token, eos_token, ... as
  strings, the template's variables.
  """

  def __init__(self, tok: Tokenizer, eos_ids: Sequence[int] | None = None, template: str | None = None,
               special_tokens: dict[str, str] | None = None):
    self.tok, self.template = tok, template
    self.special_tokens = dict(special_tokens or {})
    im_end = tok.token_to_id(IM_END)
    named = tok.token_to_id(self.special_tokens.get("eos_token", IM_END))
    ids = set(eos_ids or ()) or ({im_end} - {None})
    if not ids:
      raise ValueError(f"tokenizer has no end-of-sequence token (no {IM_END}, and none was given)")
    self.eos_ids = tuple(sorted(int(i) for i in ids))
    self.eos_id = named if named in ids else self.eos_ids[0]
    if template is not None:
      from .chat_template import compile_template
      compile_template(template)  # a broken template fails at load, not at the first prompt

  @classmethod
  def from_dir(cls, directory: str) -> "TextTokenizer":
    """Returns the tokenizer of a model directory: tokenizer.json, with the chat template and special tokens of
    tokenizer_config.json (or chat_template.jinja) and the EOS set of generation_config.json and config.json."""
    return read_model_tokenizer(directory)

  def save(self, path: str) -> None:
    """Writes tokenizer.json at `path` and, when there is more than the built-in ChatML and <|im_end|>, the chat
    template and special tokens (tokenizer_config.json) and the EOS set (generation_config.json) beside it, so that
    from_dir reads back the same tokenizer (a draft trained for a Llama 3 target keeps its stop ids)."""
    self.tok.save(path)
    directory = os.path.dirname(os.path.abspath(path))
    if self.template is not None or self.special_tokens:
      with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({**self.special_tokens, "chat_template": self.template}, f, indent=1, ensure_ascii=False)
    if self.eos_ids != (self.tok.token_to_id(IM_END),):
      with open(os.path.join(directory, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": list(self.eos_ids)}, f, indent=1)

  @property
  def vocab_size(self) -> int:
    return self.tok.get_vocab_size()

  def encode(self, text: str) -> list[int]:
    return self.tok.encode(text, add_special_tokens=False).ids

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    return [e.ids for e in self.tok.encode_batch(list(texts), add_special_tokens=False)]

  def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
    return self.tok.decode(list(ids), skip_special_tokens=skip_special)

  def reply_text(self, ids: Sequence[int]) -> str:
    """Returns the text of generated ids: special tokens and the end-of-sequence ids (some of which a model may not
    mark special) are not text."""
    return self.decode([i for i in ids if i not in self.eos_ids])

  def writes_chatml(self) -> bool:
    """Returns whether this model's template writes a conversation exactly as SmolLM2's ChatML (`chat_template`),
    the text draft training is written in."""
    turns = [("user", "Hi"), ("assistant", "Hello")]
    try:
      messages = [{"role": r, "content": c} for r, c in turns]
      return self.render_chat(messages, False) == chat_template(turns, add_generation_prompt=False)
    except ValueError:  # no template at all
      return False

  def encode_prompt(self, text: str, chat: bool = True, **template_kwargs) -> list[int]:
    """Returns the ids of a prompt: under the chat template (which writes BOS itself where the model wants one, as
    Llama 3's does), or raw with what tokenizer.json's post-processor adds (Llama 3: BOS; SmolLM2, Qwen3: nothing)."""
    if chat:
      return self.encode(self.chat_prompt(text, **template_kwargs))
    if template_kwargs:
      raise ValueError(f"template options {sorted(template_kwargs)} need the chat template (not a raw prompt)")
    ids = self.tok.encode(text, add_special_tokens=True).ids
    bos_text = self.special_tokens.get("bos_token")
    bos = self.tok.token_to_id(bos_text) if bos_text else None
    if bos is not None and ids[:2] == [bos, bos]:  # the text began with BOS already: one is enough
      ids = ids[1:]
    return ids

  def chat_prompt(self, message: str, system: str | None = None, **template_kwargs) -> str:
    """Returns the text of a one-message conversation with an open assistant turn; system None: the template's
    default (SmolLM2's built-in names SmolLM; Llama 3's and Qwen3's have none or their own)."""
    messages = ([{"role": "system", "content": system}] if system is not None else [])
    return self.render_chat(messages + [{"role": "user", "content": message}], **template_kwargs)

  def render_chat(self, messages: Sequence[dict], add_generation_prompt: bool = True, **template_kwargs) -> str:
    """Returns the text of [{"role", "content"}, ...] under this model's chat template.

    template_kwargs: the template's switches (Qwen3's enable_thinking); one the template never reads is refused
    rather than silently ignored."""
    from .chat_template import TemplateError, render

    unread = [k for k in template_kwargs if self.template is None or k not in self.template]
    if unread:
      raise TemplateError(f"this model's chat template has no {', '.join(sorted(unread))} switch")
    if self.template is not None:
      return render(self.template, list(messages), add_generation_prompt, **{**self.special_tokens, **template_kwargs})
    if self.tok.token_to_id(IM_START) is None or self.tok.token_to_id(IM_END) is None:
      raise TemplateError("this model ships no chat template (tokenizer_config.json has no chat_template); "
                          "give the prompt raw (--raw, chat=False)")
    return chat_template([(m["role"], m["content"]) for m in messages], add_generation_prompt=add_generation_prompt)


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


# ------------------------------------------------------------------------------------ a model directory's own files

def _read_json(path: str) -> dict:
  if not os.path.exists(path):
    return {}
  try:
    with open(path, encoding="utf-8") as f:
      d = json.load(f)
  except (OSError, ValueError) as e:
    raise TokenizerError(f"cannot read {path}: {e}") from None
  if not isinstance(d, dict):
    raise TokenizerError(f"{path} must hold a JSON object")
  return d


def _token_text(value) -> str | None:
  """Returns a special token's text from tokenizer_config.json (a string, or an AddedToken object's content)."""
  return value.get("content") if isinstance(value, dict) else value if isinstance(value, str) else None


def _id_list(value, path: str) -> list[int]:
  """Returns eos_token_id as a list: absent, one id or a list of ids (Llama 3's generation_config lists three)."""
  ids = [] if value is None else value if isinstance(value, list) else [value]
  if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in ids):
    raise TokenizerError(f"{path}: eos_token_id must be a token id or a list of them, got {value!r}")
  return ids


def eos_ids_from_files(directory: str, tok: Tokenizer, eos_token: str | None) -> list[int]:
  """Returns the end-of-sequence set of a model directory: the ids in generation_config.json and config.json
  (`eos_token_id`, one or a list) and the tokenizer's eos_token; any of them ends a reply, as in transformers."""
  ids = []
  for name in ("generation_config.json", "config.json"):  # an ssd-jax config.json has no eos_token_id: nothing
    path = os.path.join(directory, name)
    ids += _id_list(_read_json(path).get("eos_token_id"), path)
  if eos_token is not None:
    eos = tok.token_to_id(eos_token)
    if eos is None:
      raise TokenizerError(f"{directory}: eos_token {eos_token!r} of tokenizer_config.json is not in tokenizer.json")
    ids.append(eos)
  size = tok.get_vocab_size()
  if any(i >= size for i in ids):
    raise TokenizerError(f"{directory}: end-of-sequence ids {sorted(set(ids))} reach past the tokenizer's "
                         f"{size} tokens; the files belong to different models")
  return ids


def read_model_tokenizer(directory: str) -> TextTokenizer:
  """Returns TextTokenizer.from_dir(directory) (see there); raises TokenizerError / TemplateError in one line."""
  from .chat_template import TOKENIZER_CONFIG, TemplateError, read_template

  path = os.path.join(directory, "tokenizer.json")
  if not os.path.exists(path):
    raise TokenizerError(f"{directory} has no tokenizer.json; a model directory needs its tokenizer")
  try:
    tok = Tokenizer.from_file(path)
  except Exception as e:  # the tokenizers package raises its own exception type on bad files
    raise TokenizerError(f"cannot read {path}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
  config = _read_json(os.path.join(directory, TOKENIZER_CONFIG))
  special = {k: _token_text(config.get(k)) for k in ("bos_token", "eos_token", "unk_token", "pad_token")}
  special = {k: v for k, v in special.items() if v is not None}
  template = read_template(directory, config)
  eos = eos_ids_from_files(directory, tok, special.get("eos_token"))
  try:
    return TextTokenizer(tok, eos, template, special)
  except TemplateError as e:
    raise TemplateError(f"{directory}: {e}") from None
  except ValueError as e:
    raise TokenizerError(f"{directory}: {e}") from None
