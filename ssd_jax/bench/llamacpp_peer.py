"""The benchmark's second peer: llama.cpp's own benchmark, `llama-bench`, on the same GGUF and the same cores.

`bench.py --peer llamacpp` runs `llama-bench -m GGUF -p 0 -n N -t THREADS -o json` (token generation, "tgN") beside
our modes, THREADS being the cores our run may use (its affinity: under `taskset -c 0` that is one), and with
`--verify-cost` also `-p 1,2,3,5,9 -n 0 -d PREFIX`: one forward of T new tokens after a PREFIX-token cache (the
depth fill is not timed), as our verify-cost table measures. The binary comes from `--peer-bin`, else $LLAMA_BENCH,
else `llama-bench` on the PATH; scripts/dev/build_llamacpp.sh builds it. Optional: nothing else needs it.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess

VERIFY_TOKENS = (1, 2, 3, 5, 9)


class LlamaBenchError(RuntimeError):
  """llama-bench is missing, failed, or printed something other than its JSON report (a one-line message)."""


def find_binary(explicit: str | None = None) -> str:
  """Returns the llama-bench to run: `explicit` (--peer-bin), else $LLAMA_BENCH, else `llama-bench` on the PATH."""
  how = "build it with scripts/dev/build_llamacpp.sh and pass --peer-bin PATH or set LLAMA_BENCH"
  path = explicit or os.environ.get("LLAMA_BENCH")
  if not path:
    found = shutil.which("llama-bench")
    if found is None:
      raise LlamaBenchError(f"--peer llamacpp needs llama.cpp's llama-bench: {how}")
    return found
  source = "--peer-bin" if explicit else "$LLAMA_BENCH"
  if not os.path.isfile(path):
    raise LlamaBenchError(f"llama-bench not found at {path} ({source}); {how}")
  if not os.access(path, os.X_OK):
    raise LlamaBenchError(f"{path} ({source}) is not executable")
  return path


def usable_cores() -> int:
  """Returns how many cores this process may run on (its affinity, so `taskset -c 0` gives 1)."""
  if hasattr(os, "sched_getaffinity"):
    return len(os.sched_getaffinity(0))
  return os.cpu_count() or 1


def generation_command(binary: str, gguf: str, threads: int, n_gen: int, repetitions: int = 5) -> list[str]:
  """Returns the argv of llama-bench's token-generation test: n_gen tokens, one at a time, no prompt."""
  _check(threads, n_gen, repetitions)
  return [binary, "-m", gguf, "-p", "0", "-n", str(n_gen), "-t", str(threads), "-r", str(repetitions), "-o", "json"]


def forward_command(binary: str, gguf: str, threads: int, tokens=VERIFY_TOKENS, depth: int = 0,
                    repetitions: int = 5) -> list[str]:
  """Returns the argv of llama-bench's prompt tests for `tokens`: one forward of T tokens each, after a `depth`-token
  cache (filled untimed), i.e. the cost of a verify of T - 1 draft tokens."""
  _check(threads, min(tokens), repetitions)
  return [binary, "-m", gguf, "-p", ",".join(str(t) for t in tokens), "-n", "0", "-d", str(depth), "-t",
          str(threads), "-r", str(repetitions), "-o", "json"]


def _check(threads: int, tokens: int, repetitions: int) -> None:
  if threads < 1 or tokens < 1 or repetitions < 1:
    raise ValueError(f"threads ({threads}), tokens ({tokens}) and repetitions ({repetitions}) must be >= 1")


def parse_report(text: str) -> list[dict]:
  """Returns one record per test of llama-bench's `-o json` report: {test, n_prompt, n_gen, n_depth, threads,
  tokens_per_second, stddev_tokens_per_second, ms (mean wall time of one repetition), samples_ms}."""
  start = text.find("[")
  try:
    tests = json.loads(text[start:]) if start >= 0 else None
  except json.JSONDecodeError as e:
    raise LlamaBenchError(f"llama-bench's report is not valid JSON ({e})") from e
  if not isinstance(tests, list) or not tests:
    raise LlamaBenchError("llama-bench printed no test results (expected a JSON list from -o json)")
  out = []
  for t in tests:
    try:
      n_prompt, n_gen, depth = int(t["n_prompt"]), int(t["n_gen"]), int(t.get("n_depth", 0))
      name = (f"pp{n_prompt}" if n_prompt else f"tg{n_gen}") + (f" @ d{depth}" if depth else "")
      out.append({"test": name, "n_prompt": n_prompt, "n_gen": n_gen, "n_depth": depth,
                  "threads": int(t["n_threads"]), "tokens_per_second": float(t["avg_ts"]),
                  "stddev_tokens_per_second": float(t["stddev_ts"]), "ms": float(t["avg_ns"]) / 1e6,
                  "samples_ms": [float(s) / 1e6 for s in t.get("samples_ns", [])]})
    except (KeyError, TypeError, ValueError) as e:
      raise LlamaBenchError(f"llama-bench's report lacks a field or value: {e!r}") from e
  return out


def about(text: str) -> dict:
  """Returns what llama-bench reports of itself and the model (build, CPU, model type and size) from its JSON."""
  first = json.loads(text[text.find("["):])[0]
  return {k: first.get(k) for k in ("build_commit", "build_number", "cpu_info", "backends", "model_type",
                                    "model_size", "model_n_params")}


def run(argv: list[str], timeout: float = 1800) -> str:
  """Runs llama-bench and returns its stdout; raises LlamaBenchError with one line when it cannot run or fails."""
  try:
    res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
  except FileNotFoundError as e:
    raise LlamaBenchError(f"llama-bench not found: {argv[0]}") from e
  except PermissionError as e:
    raise LlamaBenchError(f"cannot run {argv[0]}: {e.strerror}") from e
  except subprocess.TimeoutExpired as e:
    raise LlamaBenchError(f"llama-bench ran past {timeout:.0f} s: {' '.join(argv)}") from e
  if res.returncode != 0:
    lines = [x for x in (res.stderr or res.stdout).strip().splitlines() if x.strip()]
    last = lines[-1].strip() if lines else "no output"
    raise LlamaBenchError(f"llama-bench failed (exit {res.returncode}): {last}")
  return res.stdout


def measure(binary: str, gguf: str, n_gen: int, threads: int | None = None, verify_depth: int | None = None,
            repetitions: int = 5) -> dict:
  """Runs llama-bench's generation test (and, given verify_depth, its T-token forwards) on `threads` (default: the
  usable cores); returns {command, threads, about, generation: record, forwards: [records] or None}."""
  threads = threads or usable_cores()
  cmd = generation_command(binary, gguf, threads, n_gen, repetitions)
  text = run(cmd)
  gen = parse_report(text)
  result = {"command": cmd, "threads": threads, "about": about(text), "generation": gen[0], "forwards": None}
  if verify_depth is not None:
    fcmd = forward_command(binary, gguf, threads, depth=verify_depth, repetitions=repetitions)
    result["forward_command"] = fcmd
    result["forwards"] = parse_report(run(fcmd))
  return result


def markdown(peer: dict, ours: dict[str, float]) -> str:
  """Returns the lines set under bench.md's table: llama.cpp's generation tok/s and ours/llama.cpp per variant
  (`ours`: {variant label: tok/s over all prompts})."""
  g = peer["generation"]
  a = peer["about"]
  lines = [f"llama.cpp {g['test']} (llama-bench, {g['threads']} thread{'s' * (g['threads'] != 1)}, build "
           f"{a.get('build_number')}, {a.get('model_type')}): {g['tokens_per_second']:.2f} tok/s "
           f"(+- {g['stddev_tokens_per_second']:.2f})", "", "| variant | tok/s | ours / llama.cpp |", "|---|---|---|"]
  for label, tps in ours.items():
    lines.append(f"| {label} | {tps:.2f} | {tps / g['tokens_per_second']:.2f}x |")
  return "\n".join(lines)


def forward_lines(forwards: list[dict]) -> list[str]:
  """Returns a markdown table of llama.cpp's T-token forward cost in ms and against T = 1."""
  one = next((f["ms"] for f in forwards if f["n_prompt"] == 1), None)
  lines = ["| llama.cpp test | ms | cost / T=1 |", "|---|---|---|"]
  for f in forwards:
    lines.append(f"| {f['test']} | {f['ms']:.1f} | " + (f"{f['ms'] / one:.2f}x |" if one else "- |"))
  return lines
