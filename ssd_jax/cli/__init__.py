"""The product commands' code: each module is one command of scripts/ (`decode`: scripts/decode.py, `bench`:
scripts/bench.py), with `main(argv=None)`, which returns the exit code or raises the library's one-line errors, and
a module docstring that is the command's --help text. The script calls main through cli_util.run_main (the compile
cache, one line and exit code 2 on bad input, 130 on Ctrl-C). Tests import these modules, never a script. No module
here imports JAX at import time: a command chooses the CPU's device count (cli_util.split_cpu) first."""
