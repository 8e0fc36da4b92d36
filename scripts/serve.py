#!/usr/bin/env python
"""Serve a target (and draft) over HTTP in the OpenAI API's shape (docs/serving.md); needs the `serve` extra.

  pip install -e ".[serve]"
  python scripts/serve.py                         # the embedded default pair on 127.0.0.1:8000
  python scripts/serve.py --port 8080 --max-batch 4 --draft none

Then any OpenAI client: base_url http://127.0.0.1:8000/v1, any API key, model "smollm2-135m-instruct" (GET /v1/models
names it). Requests may add ssd-jax's own fields: mode (ar, sd, ssd), k, fan_out. Up to --max-batch requests run
together: AR requests join a running batch between its steps and leave it as they end (continuous batching); SD and
SSD requests run in batches of their own (docs/serving.md). Before serving, the shapes most requests meet compile
(--no-warm-up: on first use instead). SIGTERM or Ctrl-C stops taking requests, lets those in flight finish (up to
--shutdown-timeout seconds) and exits.
"""
from __future__ import annotations

import argparse
import importlib.util
import logging
import socket
import warnings

from ssd_jax.cli_util import (add_model_arguments, check_model_args, fail, follow_measured_cores, prepare_model,
                              run_main, split_cpu)


def make_parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--host", default="127.0.0.1", help="the address to listen on (default: this machine only)")
  p.add_argument("--port", type=int, default=8000, help="0: any free port (the log names it)")
  p.add_argument("--max-batch", type=int, default=8, help="requests run together in one batch, at most")
  p.add_argument("--max-queue", type=int, default=64,
                 help="requests waiting for a batch, at most; past it a request gets 429 with Retry-After")
  p.add_argument("--default-max-tokens", type=int, default=256,
                 help="max_tokens of a request that gives none (within the context)")
  p.add_argument("--shutdown-timeout", type=float, default=60.0,
                 help="seconds the answers in flight get to finish after SIGTERM or Ctrl-C")
  p.add_argument("--batching", default="continuous", choices=["continuous", "static"],
                 help="continuous: AR requests join a running batch between its steps (default); static: each batch "
                      "runs to its end before the next starts")
  p.add_argument("--no-warm-up", dest="warm_up", action="store_false",
                 help="skip compiling the batch shapes before serving (they then compile on first use)")
  p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
  add_model_arguments(p)
  return p


def parse_args(argv=None):
  return make_parser().parse_args(argv)


def check_args(args) -> None:
  """Fails, before JAX or a model is loaded, on bad flags and a missing `serve` extra."""
  check_model_args(args)
  for name, lo in (("max_batch", 1), ("max_queue", 1), ("default_max_tokens", 1), ("port", 0)):
    if getattr(args, name) < lo:
      fail(f"--{name.replace('_', '-')} must be >= {lo}, got {getattr(args, name)}")
  if args.port > 65535:
    fail(f"--port must be <= 65535, got {args.port}")
  if args.shutdown_timeout <= 0:
    fail(f"--shutdown-timeout must be > 0, got {args.shutdown_timeout}")
  missing = [m for m in ("starlette", "uvicorn") if importlib.util.find_spec(m) is None]
  if missing:
    fail(f"serving needs {' and '.join(missing)}: pip install -e \".[serve]\"")


def server_log(level: str) -> logging.Logger:
  """Returns the server's logger (ssd_jax.serve), writing to stderr as uvicorn does, whatever the libraries that
  load the models do to the root logger (absl's handler, say)."""
  log = logging.getLogger("ssd_jax.serve")
  handler = logging.StreamHandler()
  handler.setFormatter(logging.Formatter("%(levelname)s:     %(message)s"))
  log.addHandler(handler)
  log.setLevel(level.upper())
  log.propagate = False
  return log


def listen(host: str, port: int) -> socket.socket:
  """Returns a socket listening on host:port, bound before the model loads so that a port in use fails at once."""
  try:
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    return socket.create_server((host, port), family=family)
  except OSError as e:
    fail(f"cannot listen on {host}:{port} ({e.strerror or e})")


def main(argv=None):
  args = parse_args(argv)
  check_args(args)
  sock = listen(args.host, args.port)
  split_cpu(max(2, args.target_devices + args.draft_devices))
  from ssd_jax import api
  from ssd_jax.serve.app import create_app, make_server, model_id
  from ssd_jax.serve.engine import Engine

  follow_measured_cores()  # before the plan counts the usable cores (SSD's placement, the default mode)
  plan = prepare_model(args, None if args.draft == "none" else args.draft, args.draft_head_vocab)
  plan.check_memory()
  log = server_log(args.log_level)
  pipe = api.load_prepared(plan)
  # The engine logs a lost draft side in one line itself, and reports each batch's mode and K in its answers.
  warnings.filterwarnings("ignore", category=api.DraftLostWarning)
  warnings.filterwarnings("ignore", category=api.SlowerThanAR)
  engine = Engine(pipe, args.max_batch, args.max_queue, args.default_max_tokens,
                  spec_settings={"draft_timeout": args.draft_timeout}, batching=args.batching)
  if args.warm_up:
    log.info("compiling the batch shapes of up to %d requests and a lone request's (--no-warm-up skips it)",
             args.max_batch)
    log.info("compiled in %.0f s", engine.warm())
  host, port = sock.getsockname()[:2]
  log.info(
      "serving %s on http://%s:%d/v1 (default mode %s, draft %s; Ctrl-C or SIGTERM stops it)", model_id(pipe),
      f"[{host}]" if ":" in host else host, port, pipe.default_mode, pipe.draft.path if pipe.draft else "none")
  make_server(create_app(engine), args.host, port, args.log_level, args.shutdown_timeout).run(sockets=[sock])
  return 0


if __name__ == "__main__":
  run_main(main)
