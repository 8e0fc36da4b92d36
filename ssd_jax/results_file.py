"""decode.py's --json-out: one JSON object a prompt, written (and flushed) the moment its batch finishes, so that an
interrupted run keeps every finished answer, and `--resume` finishes the rest.

Each line is {"prompt", "token_ids", "text", "stats", "settings"}: `settings` are the options that decide the answer
(the models, weights, mode, K, sampling, lengths; not where or how fast it runs), so that a resumed run refuses a
file written with other settings instead of mixing two runs' answers. No JAX here.
"""
from __future__ import annotations

import collections
import json
import os

from .cli_util import fail

# decode.py's options that do not change an answer: where and how fast it runs, where its output goes.
NOT_SETTINGS = frozenset({"prompt", "prompts", "json_out", "resume", "stream", "coordinator", "num_processes",
                          "process_id", "target_devices", "draft_devices", "ssd_placement", "ar_chunk", "sd_chunk",
                          "draft_timeout"})


def settings_of(args) -> dict:
  """Returns the answer-deciding settings of decode.py's parsed `args` (JSON values)."""
  return {k: v for k, v in sorted(vars(args).items()) if k not in NOT_SETTINGS}


def _read(path: str) -> list[dict]:
  """Returns the file's whole lines as objects; a last line cut short (a run killed mid-write) is dropped."""
  rows = []
  with open(path, encoding="utf-8") as f:
    lines = f.read().split("\n")
  for n, line in enumerate(lines, 1):
    if not line.strip():
      continue
    try:
      row = json.loads(line)
    except json.JSONDecodeError:
      if n == len(lines):  # no newline after it: cut short
        break
      fail(f"--resume: line {n} of {path} is not JSON; it was not written by decode.py --json-out")
    if not isinstance(row, dict) or "prompt" not in row:
      fail(f"--resume: line {n} of {path} has no prompt; it was not written by decode.py --json-out")
    rows.append(row)
  return rows


class ResultsFile:
  """The --json-out file of one run, read (with --resume) and checked when built, before any model loads. `todo`
  lists the prompts' indices still to answer (all of them, unless resuming); `open` starts the file, `write` adds
  one finished answer."""

  def __init__(self, path: str, settings: dict, prompts: list[str], resume: bool):
    self.path, self.settings, self.written = path, settings, 0
    done = []
    if resume and os.path.exists(path):
      done = _read(path)
      for row in done:
        theirs = row.get("settings")
        if theirs != settings:
          diff = sorted(k for k in set(settings) | set(theirs or {}) if (theirs or {}).get(k) != settings.get(k))
          flags = ", ".join("--" + d.replace("_", "-") for d in diff)
          fail(f"--resume: {path} was written with other settings ({flags} differ); give those settings again or "
               "another --json-out")
    left = collections.Counter(row["prompt"] for row in done)
    self.todo = []
    for i, p in enumerate(prompts):
      if left[p] > 0:
        left[p] -= 1
      else:
        self.todo.append(i)
    self.answered_before = len(prompts) - len(self.todo)
    self._done, self._f = done, None

  def open(self) -> None:
    """Starts writing: the whole lines read are written back (a line cut short is dropped; without --resume, none),
    then each answer is appended as it comes."""
    with open(self.path, "w", encoding="utf-8") as f:
      for row in self._done:
        f.write(json.dumps(row, ensure_ascii=False) + "\n")
    self._f = open(self.path, "a", encoding="utf-8")

  def write(self, generation) -> None:
    """Appends one finished answer (api.Generation) and flushes it to the file."""
    self._f.write(json.dumps(dict(generation.to_dict(), settings=self.settings), ensure_ascii=False) + "\n")
    self._f.flush()
    self.written += 1

  def close(self) -> None:
    if self._f is not None:
      self._f.close()
