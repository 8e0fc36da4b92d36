#!/usr/bin/env python
"""Load benchmark of the OpenAI-compatible server: concurrent streaming clients on localhost (TTFT, inter-token
latency, throughput beside decode.py's); `python scripts/serve_bench.py --help`. The code is ssd_jax/cli/serve_bench.py."""
from ssd_jax.cli.serve_bench import main
from ssd_jax.cli_util import run_main

if __name__ == "__main__":
  run_main(main)
