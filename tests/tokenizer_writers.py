"""Tokenizers written for the tests: a byte-level BPE over the 256 bytes with the special tokens a model family
uses, as a Hugging Face tokenizer.json holds it."""
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors


def byte_tokenizer(specials, plain=(), bos: str | None = None, specials_last: bool = False) -> Tokenizer:
  """A byte-level BPE over the 256 bytes with these special tokens first (ids 0..), like the real ones without
  merges; bos: a post-processor that puts it before every raw text, as Llama 3's tokenizer.json does.
  specials_last: the bytes first, then the added tokens (where many tokenizers number their added tokens)."""
  added = list(specials) + list(plain)
  byte_ids = sorted(pre_tokenizers.ByteLevel.alphabet())
  vocab = {t: i for i, t in enumerate(byte_ids + added if specials_last else added + byte_ids)}
  tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  tok.decoder = decoders.ByteLevel()
  tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
  tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in plain])
  if bos is not None:
    tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                                       special_tokens=[(bos, vocab[bos])])
  return tok
