"""One request's answer, built from its row's tokens as the batch commits them.

A row may run past its request (the batch runs to its longest request's max_tokens, and a row is not freed when its
request stops): `Reply` keeps the tokens up to the request's own end, the first of its max_tokens, one of the model's
stop ids and the token that completes one of its stop strings, and gives out only text that stays: never the start
of what may become a stop string, nor half of a character whose bytes span two tokens.
"""
from __future__ import annotations

from typing import Sequence


class Reply:
  """The text of one request so far. `finish` is None while it goes on, then "stop" (a stop id or string) or
  "length" (max_tokens); `ids` are the tokens it kept (usage counts them), `text` the text given out."""

  def __init__(self, tokenizer, max_tokens: int, stop: Sequence[str] = (), stop_ids: Sequence[int] = ()):
    """tokenizer: a TextTokenizer (reply_text: the text of generated ids, stop ids and special tokens left out)."""
    self.tokenizer, self.max_tokens, self.stop = tokenizer, max_tokens, tuple(stop)
    self.stop_ids = frozenset(int(i) for i in stop_ids)
    self.ids: list[int] = []
    self.text = ""
    self.finish: str | None = None

  def add(self, new_ids: Sequence[int]) -> str:
    """Returns the text the request may be sent now that its row committed `new_ids` (maybe ""); sets `finish` when
    the request ends here, after which more tokens change nothing."""
    if self.finish is not None:
      return ""
    before = len(self.ids)
    for t in new_ids:
      self.ids.append(int(t))
      if int(t) in self.stop_ids:
        self.finish = "stop"
      elif len(self.ids) >= self.max_tokens:
        self.finish = "length"
      if self.finish is not None:
        break
    full = self.tokenizer.reply_text(self.ids)
    cut = self._stop_at(full)
    if cut is not None:
      self.finish = "stop"
      self._keep_to_stop(before)
      full = full[:cut]
    elif self.finish is None:
      full = full[:self._settled(full)]
    # Text already given out stays (a tokenizer whose earlier text changed later would otherwise resend it).
    new = full[len(self.text):] if full.startswith(self.text) else ""
    self.text += new
    return new

  def end(self) -> str:
    """Returns the text still held back when the row ended without finishing the request (it cannot: the batch
    runs each row to max_tokens or a stop id; kept for safety) and finishes it as "length"."""
    if self.finish is not None:
      return ""
    self.finish = "length"
    full = self.tokenizer.reply_text(self.ids)
    new = full[len(self.text):] if full.startswith(self.text) else ""
    self.text += new
    return new

  def _stop_at(self, full: str) -> int | None:
    """Returns where the first stop string in `full` begins (none can begin in text already given out), or None."""
    found = [i for i in (full.find(s, len(self.text)) for s in self.stop) if i >= 0]
    return min(found) if found else None

  def _keep_to_stop(self, before: int) -> None:
    """Cuts `ids` after the token that completed the first stop string (one of those added past `before`)."""
    for j in range(before + 1, len(self.ids) + 1):
      if self._stop_at(self.tokenizer.reply_text(self.ids[:j])) is not None:
        del self.ids[j:]
        return

  def _settled(self, full: str) -> int:
    """Returns how much of `full` can be given out while the request goes on: all but a trailing incomplete
    character (U+FFFD: its other bytes are in the next token) and the longest tail that begins a stop string."""
    end = len(full.rstrip("\ufffd"))
    held = 0
    for s in self.stop:
      for n in range(min(len(s) - 1, end), held, -1):
        if full.endswith(s[:n], 0, end):
          held = n
          break
    return end - held
