#!/usr/bin/env python
"""Measure decoding speed: AR, SD and SSD (and optionally transformers' and llama.cpp's) in one run;
`python scripts/bench.py --help` lists the options. The command's code is ssd_jax/cli/bench.py."""
from ssd_jax.cli.bench import main
from ssd_jax.cli_util import run_main

if __name__ == "__main__":
  run_main(main)
