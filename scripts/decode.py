#!/usr/bin/env python
"""Decode prompts with the embedded default models or your own; `python scripts/decode.py --help` lists the options.
The command's code is ssd_jax/cli/decode.py."""
from ssd_jax.cli.decode import main
from ssd_jax.cli_util import run_main

if __name__ == "__main__":
  run_main(main)
