"""Load benchmark of the OpenAI-compatible server (scripts/serve.py): concurrent streaming clients on localhost.

  python scripts/serve_bench.py                                   # starts the default server, 1/2/4/8 clients
  python scripts/serve_bench.py --concurrency 1,4,16 --requests 32 --max-tokens 128 --out-dir serve-bench
  python scripts/serve_bench.py --url http://127.0.0.1:8000       # a server already running (no decode.py beside)
  python scripts/serve_bench.py --server-args "--draft none --max-batch 4"

For each concurrency level C, C clients (threads) each send a streaming chat completion, wait for its end and send the
next, until --requests requests are answered (or --time-limit seconds pass: no new request starts after it), after
an unmeasured warm-up in which the same clients send every prompt once (the server compiles each new batch shape on
first use: seconds each). Prompts come from --datasets (MT-Bench and GSM8K by default; never the held-out sets) or
--prompts FILE.jsonl, in turn.
Per request: time to first token (TTFT, from sending to the first text), inter-token latency (ITL, the mean gap
between its tokens after the first: (end - first text) / (tokens - 1)) and end-to-end latency; per level:
completion tokens per second of wall time, and their medians and 90th percentiles. Beside each level (unless --url
or --no-decode), decode.py's own batch throughput on the same prompts at --batch-size C, run after the server
stopped: the server's cost of HTTP, streaming and queueing. Output: a markdown table (stdout and --out-dir/
serve_bench.md), every figure as JSON (--out-dir/serve_bench.json) and, with matplotlib, a plot (serve_bench.png).
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

import numpy as np

from ..cli_util import fail

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--url", default=None, help="a running server's base URL (default: start scripts/serve.py)")
  p.add_argument("--server-args", default="", help="more options for the server it starts (one string)")
  p.add_argument("--concurrency", default="1,2,4,8", help="comma-separated numbers of clients in flight")
  p.add_argument("--requests", type=int, default=16, help="requests answered per level (at least the level's C)")
  p.add_argument("--time-limit", type=float, default=300.0, help="seconds per level after which no request starts")
  p.add_argument("--max-tokens", type=int, default=64)
  p.add_argument("--temperature", type=float, default=0.0)
  p.add_argument("--datasets", default="mtbench,gsm8k")
  p.add_argument("--prompts", default=None, help='a JSONL file of {"prompt": ...} objects instead of --datasets')
  p.add_argument("--num-prompts", type=int, default=8, help="prompts per dataset")
  p.add_argument("--no-decode", action="store_true", help="skip decode.py's batch throughput beside each level")
  p.add_argument("--out-dir", default=None)
  args = p.parse_args(argv)
  try:
    args.levels = [int(c) for c in args.concurrency.split(",")]
  except ValueError:
    fail(f"--concurrency takes comma-separated integers, got {args.concurrency!r}")
  if not args.levels or min(args.levels) < 1:
    fail("--concurrency: every level must be >= 1")
  for name, lo in (("requests", 1), ("max_tokens", 1), ("num_prompts", 1)):
    if getattr(args, name) < lo:
      fail(f"--{name.replace('_', '-')} must be >= {lo}")
  if args.time_limit <= 0 or not np.isfinite(args.temperature) or args.temperature < 0:
    fail("--time-limit must be > 0 and --temperature a finite number >= 0")
  return args


def load_prompts(args) -> list[str]:
  """Returns --prompts' prompts (decode.py's reader and its one-line errors), else --datasets'."""
  from ..data.datasets import DataError, load_prompt_file, load_prompts as from_set
  try:
    if args.prompts:
      return load_prompt_file(args.prompts)
    return [p for name in args.datasets.split(",") for p in from_set(name.strip(), args.num_prompts)]
  except DataError as e:
    fail(str(e))


# ------------------------------------------------------------------------------------------------------ the server

def start_server(server_args: str, max_batch: int):
  """Starts scripts/serve.py on a free port; returns (process, base URL) once it answers /v1/models."""
  extra = shlex.split(server_args)
  if "--max-batch" not in extra:
    extra += ["--max-batch", str(max_batch)]
  log = tempfile.TemporaryFile("w+")
  # Its log (at info: the line naming the port, then a line per request) goes to a file nobody reads but this.
  proc = subprocess.Popen([sys.executable, os.path.join(REPO, "scripts", "serve.py"), "--port", "0", *extra],
                          stdout=log, stderr=subprocess.STDOUT, text=True)
  deadline, url = time.monotonic() + 600, None
  while time.monotonic() < deadline:
    log.seek(0)
    text = log.read()
    m = re.search(r"serving .* on (http://\S+)/v1 ", text)
    if m and url is None:
      url = m.group(1)
    if url is not None and served_model(url, timeout=5) is not None:
      return proc, url
    if proc.poll() is not None:
      fail(f"the server exited (code {proc.returncode}): {text.strip().splitlines()[-1] if text.strip() else ''}")
    time.sleep(0.2)
  proc.kill()
  fail("the server did not start within 600 s")


def served_model(url: str, timeout: float = 10) -> str | None:
  """Returns the model a server at `url` serves (GET /v1/models), or None when none answers there."""
  try:
    with urllib.request.urlopen(url + "/v1/models", timeout=timeout) as r:
      return json.loads(r.read())["data"][0]["id"]
  except (OSError, ValueError, KeyError, IndexError):
    return None


# ------------------------------------------------------------------------------------------------------ the clients

def one_request(url: str, model: str, prompt: str, max_tokens: int, temperature: float) -> dict:
  """Sends one streaming chat completion; returns its timings (seconds from sending), tokens and any error."""
  u = urllib.parse.urlsplit(url)
  body = json.dumps({"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                     "temperature": temperature, "stream": True, "stream_options": {"include_usage": True}})
  conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
  t0 = time.perf_counter()
  first = last = info = None
  tokens, error = 0, None
  try:
    conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
      return {"error": f"HTTP {r.status}: {r.read()[:200]!r}", "start": t0}
    for raw in r:
      line = raw.decode().strip()
      if not line.startswith("data: ") or line == "data: [DONE]":
        continue
      chunk = json.loads(line[6:])
      if chunk.get("choices") and chunk["choices"][0].get("delta", {}).get("content"):
        last = time.perf_counter()
        first = first or last
      if chunk.get("usage"):
        tokens = chunk["usage"]["completion_tokens"]
      info = chunk.get("ssd_jax", info)
  except (OSError, ValueError) as e:
    error = f"{type(e).__name__}: {e}"
  finally:
    conn.close()
  end = time.perf_counter()
  out = {"start": t0, "end": end, "tokens": tokens, "e2e": end - t0, "error": error, "info": info}
  if first is not None:
    out["ttft"] = first - t0
    out["itl"] = (last - first) / (tokens - 1) if tokens > 1 else None
  return out


def run_level(url: str, model: str, prompts: list[str], c: int, n: int, time_limit: float, max_tokens: int,
              temperature: float) -> dict:
  """C clients in a closed loop until n requests are answered or time_limit passes; returns the level's figures."""
  results, lock, next_i = [], threading.Lock(), [0]
  t_start = time.perf_counter()

  def client():
    while True:
      with lock:
        i = next_i[0]
        if i >= n or time.perf_counter() - t_start > time_limit:
          return
        next_i[0] += 1
      res = one_request(url, model, prompts[i % len(prompts)], max_tokens, temperature)
      with lock:
        results.append(res)

  threads = [threading.Thread(target=client) for _ in range(c)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  ok = [r for r in results if r["error"] is None and "ttft" in r]
  wall = (max(r["end"] for r in ok) - min(r["start"] for r in ok)) if ok else float("nan")
  tokens = sum(r["tokens"] for r in ok)

  def pct(key):
    xs = [r[key] for r in ok if r.get(key) is not None]
    return (round(float(np.median(xs)) * 1e3, 1), round(float(np.percentile(xs, 90)) * 1e3, 1)) if xs else (None, None)

  batches = [(r["info"] or {}).get("batch_rows") for r in ok]
  modes = sorted({f"{r['info']['mode']} K={r['info']['k']}" for r in ok if r["info"]})
  return {"concurrency": c, "requests": len(results), "errors": [r["error"] for r in results if r["error"]],
          "mean_batch_rows": round(float(np.mean([b for b in batches if b])), 2) if any(batches) else None,
          "modes": modes,
          "completion_tokens": tokens, "wall_s": round(wall, 3), "tok_s": round(tokens / wall, 2) if ok else None,
          "ttft_ms": pct("ttft"), "itl_ms": pct("itl"), "e2e_ms": pct("e2e")}


# --------------------------------------------------------------------------------------- decode.py, batch by batch

def decode_throughput(prompts: list[str], c: int, max_tokens: int, temperature: float, model_flags: list[str]):
  """decode.py's tokens per second on `prompts` in batches of c: new tokens over the batches' prefill + decode
  seconds (its own figures; loading and compiling left out)."""
  with tempfile.TemporaryDirectory() as d:
    src, out = os.path.join(d, "prompts.jsonl"), os.path.join(d, "out.jsonl")
    with open(src, "w", encoding="utf-8") as f:
      f.writelines(json.dumps({"prompt": p}) + "\n" for p in prompts)
    r = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "decode.py"), "--prompts", src,
                        "--batch-size", str(c), "--max-new-tokens", str(max_tokens), "--temperature",
                        str(temperature), "--json-out", out, *model_flags], capture_output=True, text=True)
    if r.returncode != 0:
      return None, (r.stderr.strip().splitlines() or ["?"])[-1]
    with open(out, encoding="utf-8") as f:
      rows = [json.loads(line) for line in f if line.strip()]
  tokens = seconds = 0.0
  for i in range(0, len(rows), c):
    batch = rows[i:i + c]
    tokens += sum(row["stats"]["new_tokens"] for row in batch)
    seconds += max(row["stats"]["prefill_seconds"] + row["stats"]["decode_seconds"] for row in batch)
  return round(tokens / seconds, 2), None


MODEL_FLAGS = ("--target", "--draft", "--draft-head-vocab", "--quantize", "--dtype", "--kv-dtype", "--draft-weights",
               "--attention", "--ssd-placement", "--target-devices", "--draft-devices")


def model_flags(server_args: str) -> list[str]:
  """The server's model options, which decode.py takes too (the same pair and weights)."""
  parts, out = shlex.split(server_args), []
  for i, a in enumerate(parts):
    name = a.split("=")[0]
    if name in MODEL_FLAGS:
      out += [a] if "=" in a else parts[i:i + 2]
  return out


# ------------------------------------------------------------------------------------------------------ the report

def table(levels: list[dict]) -> str:
  head = ("| clients | requests | rows a batch | mode | tok/s | decode.py tok/s (batch = clients) | server / decode.py "
          "| TTFT ms p50 / p90 | ITL ms p50 / p90 | end-to-end ms p50 / p90 | errors |")
  rows = [head, "|" + "---|" * 11]
  for lv in levels:
    dec = lv.get("decode_tok_s")
    ratio = f"{lv['tok_s'] / dec:.2f}x" if dec and lv["tok_s"] else "-"
    rows.append(f"| {lv['concurrency']} | {lv['requests']} | {lv['mean_batch_rows']} | {', '.join(lv['modes'])} | "
                f"{lv['tok_s']} | {dec if dec else '-'} | {ratio} | "
                f"{lv['ttft_ms'][0]} / {lv['ttft_ms'][1]} | {lv['itl_ms'][0]} / {lv['itl_ms'][1]} | "
                f"{lv['e2e_ms'][0]} / {lv['e2e_ms'][1]} | {len(lv['errors'])} |")
  return "\n".join(rows)


def plot(levels: list[dict], path: str) -> str | None:
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    return None
  cs = [lv["concurrency"] for lv in levels]
  fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
  a.plot(cs, [lv["tok_s"] for lv in levels], "o-", label="server")
  if any(lv.get("decode_tok_s") for lv in levels):
    a.plot(cs, [lv.get("decode_tok_s") for lv in levels], "s--", label="decode.py, batch = clients")
  a.set(xlabel="concurrent clients", ylabel="completion tokens / s", xscale="log", title="throughput")
  a.legend()
  for key, style, label in (("ttft_ms", "o-", "TTFT p50"), ("itl_ms", "s-", "ITL p50"),
                            ("e2e_ms", "^-", "end-to-end p50")):
    b.plot(cs, [lv[key][0] for lv in levels], style, label=label)
  b.set(xlabel="concurrent clients", ylabel="ms", xscale="log", yscale="log", title="latency")
  b.legend()
  for ax in (a, b):  # the levels themselves as ticks, in plain numbers
    ax.set_xticks(cs, [str(c) for c in cs])
    ax.minorticks_off()
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  return path


def main(argv=None) -> int:
  args = parse_args(argv)
  prompts = load_prompts(args)
  proc = None
  if args.url:
    url = args.url.rstrip("/")
  else:
    print(f"[serve_bench] starting scripts/serve.py {args.server_args}".rstrip(), file=sys.stderr, flush=True)
    proc, url = start_server(args.server_args, max(args.levels))
  model = served_model(url)
  if model is None:
    fail(f"no server answers at {url}/v1/models")
  levels = []
  try:
    for c in args.levels:
      n = max(args.requests, c)
      print(f"[serve_bench] {c} clients, {n} requests", file=sys.stderr, flush=True)
      # Warm-up, off the clock: every prompt once (at least 2c requests) by the same c clients, so that the batch
      # shapes the level runs (its rows, its prompts' padded width) are mostly compiled; a shape first seen later
      # (a batch is whoever waits when it starts) compiles on the clock and shows in the p90s.
      run_level(url, model, prompts, c, max(2 * c, len(prompts)), args.time_limit, args.max_tokens, args.temperature)
      levels.append(run_level(url, model, prompts, c, n, args.time_limit, args.max_tokens, args.temperature))
  finally:
    if proc is not None:
      proc.terminate()
      try:
        proc.wait(60)
      except subprocess.TimeoutExpired:
        proc.kill()
  if proc is not None and not args.no_decode:
    for lv in levels:
      print(f"[serve_bench] decode.py, batches of {lv['concurrency']}", file=sys.stderr, flush=True)
      n = lv["requests"]
      lv["decode_tok_s"], err = decode_throughput([prompts[i % len(prompts)] for i in range(n)], lv["concurrency"],
                                                  args.max_tokens, args.temperature, model_flags(args.server_args))
      if err:
        print(f"[serve_bench] decode.py failed: {err}", file=sys.stderr)
  md = table(levels)
  print(md)
  report = {"url": url, "model": model, "args": {k: v for k, v in vars(args).items() if k != "levels"},
            "levels": levels}
  if args.out_dir:
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "serve_bench.md"), "w") as f:
      f.write(md + "\n")
    with open(os.path.join(args.out_dir, "serve_bench.json"), "w") as f:
      json.dump(report, f, indent=1)
    png = plot(levels, os.path.join(args.out_dir, "serve_bench.png"))
    print(f"plot: {png}" if png else "plot skipped: matplotlib is not installed (pip install -e \".[bench]\")")
  return 1 if any(lv["errors"] for lv in levels) else 0
