"""Mutation run: plants each classic speculative-sampling bug in a copy of the package and checks the tests catch it.

Each mutation replaces one exact piece of text in one file of a temporary copy of ssd_jax/ and tests/ (the working
tree is never touched) and runs the tests named for it: the run passes when every mutation makes at least one of
them fail and the same tests all pass on the unmutated copy. The list is tests/mutations.py; tests/test_mutations.py
checks, in the fast suite, that every mutation's text still occurs exactly once, so it cannot go stale silently.

  python scripts/dev/mutation_run.py                 # baseline + every mutation (most of an hour on 2 busy cores)
  python scripts/dev/mutation_run.py --only NAME...  # some of them; --list names them
  python scripts/dev/mutation_run.py --json-out F    # also write the table as JSON
  python scripts/dev/mutation_run.py --param-dtype bfloat16 --only NAME...  # the tests' V=4 pair in bfloat16
  python scripts/dev/mutation_run.py --head real -x  # the law tests' pair at a real draft's sizes, first failure only

--param-dtype sets SSD_JAX_TEST_PARAM_DTYPE for the tests: the law tests' tiny pair (tests/pairs.py v4_pair) is
cast to it; tests that build their own models keep float32. --head real sets SSD_JAX_TEST_HEAD=real: the law tests'
pairs (SD/SSD/AR, EAGLE, SSD's fast backups aside, the draft in its own process) get 49152 ids and a shuffled
16384-row head with their mass on four ids spread over the range (tests/draft_heads.py); other tests are unchanged.
Mutations marked for the real head only (an id narrowed to int16) are left out of a tiny run unless --only names
them, and their survival there does not fail it. The JSON file is rewritten after every row.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))  # the repository, two folders up
sys.path.insert(0, os.path.join(ROOT, "tests"))  # the list: a plain module of tests/
from mutations import MUTATIONS, Mutation  # noqa: E402

from ssd_jax.cli_util import compile_cache_reloads  # noqa: E402 - imports no JAX


def copy_tree(dest: str) -> None:
  """Copies what the tests need (the package, the tests, the scripts some tests run, pytest's settings) into dest."""
  ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
  for d in ("ssd_jax", "tests", "scripts"):
    shutil.copytree(os.path.join(ROOT, d), os.path.join(dest, d), ignore=ignore)
  shutil.copy(os.path.join(ROOT, "pyproject.toml"), dest)


def apply(dest: str, m: Mutation) -> None:
  path = os.path.join(dest, m.file)
  text = open(path).read()
  if text.count(m.old) != 1:
    raise SystemExit(f"mutation {m.name}: its text occurs {text.count(m.old)} times in {m.file}, not once")
  open(path, "w").write(text.replace(m.old, m.new))


def run_tests(dest: str, tests, param_dtype: str = "float32", head: str = "tiny",
              exitfirst: bool = False) -> tuple[int, list[str], float]:
  """Returns (pytest's exit code, the failed test ids, seconds) for `tests` run in the copy at dest, the law tests'
  pair in `param_dtype` at `head` size (SSD_JAX_TEST_HEAD); `exitfirst`: stop at the first failure."""
  env = dict(os.environ, PYTHONPATH=dest, PYTHONDONTWRITEBYTECODE="1", SSD_JAX_TEST_PARAM_DTYPE=param_dtype,
             SSD_JAX_TEST_HEAD=head)
  t0 = time.perf_counter()
  out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", *(["-x"] if exitfirst
                        else []), *tests], cwd=dest, env=env, capture_output=True, text=True)
  failed = sorted(set(re.findall(r"^(?:FAILED|ERROR) (\S+)", out.stdout, re.M)))
  if out.returncode not in (0, 1):  # collection error, usage error, crash: no test verdict
    failed = failed or [f"pytest exit {out.returncode}: {out.stdout.strip().splitlines()[-1:]}"]
  return out.returncode, failed, time.perf_counter() - t0


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--only", nargs="+", metavar="NAME", help="run these mutations only")
  ap.add_argument("--list", action="store_true", help="list the mutations and exit")
  ap.add_argument("--no-baseline", action="store_true", help="skip the run on the unmutated copy")
  ap.add_argument("--json-out", help="write the table here as JSON")
  ap.add_argument("--param-dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                  help="the floating params of the law tests' tiny pair (SSD_JAX_TEST_PARAM_DTYPE)")
  ap.add_argument("--head", default="tiny", choices=["tiny", "real"],
                  help="the law tests' pair: V=4 (tiny) or 49152 ids with a 16384-row head (SSD_JAX_TEST_HEAD)")
  ap.add_argument("-x", "--exitfirst", action="store_true",
                  help="stop each mutant's tests at its first failure (the unmutated copy runs them all)")
  args = ap.parse_args(argv)
  if args.list:
    for m in MUTATIONS:
      print(f"{m.name:38s} {m.file}: {m.bug}")
    return 0
  chosen = MUTATIONS
  if args.only:
    unknown = set(args.only) - {m.name for m in MUTATIONS}
    if unknown:
      print(f"unknown mutation(s): {', '.join(sorted(unknown))} (--list names them)", file=sys.stderr)
      return 2
    chosen = [m for m in MUTATIONS if m.name in args.only]
  else:
    chosen = [m for m in MUTATIONS if args.head in m.heads]
  t_start = time.perf_counter()
  rows, ok = [], True
  settings = dict(param_dtype=args.param_dtype, head=args.head)

  def record(row: dict, counts: bool) -> None:
    nonlocal ok
    rows.append(row)
    ok &= row["ok"] or not counts
    if args.json_out:  # rewritten after every row: a long run's rows so far survive it being stopped
      with open(args.json_out, "w") as f:
        json.dump({"ok": ok, **settings, "seconds": round(time.perf_counter() - t_start, 1), "rows": rows}, f,
                  indent=1)

  # One persistent compilation cache for the whole run (tests/conftest.py would give each pytest run a cold one):
  # a mutant compiles afresh only the programs its change touches (the cache key is the program itself). The
  # unmutated copy then the 80 mutants: 1157 s instead of 1817 on the 2-core AMD EPYC VM, every one still caught.
  shared = None
  if "JAX_COMPILATION_CACHE_DIR" not in os.environ and compile_cache_reloads():
    shared = tempfile.TemporaryDirectory(prefix="mutation-xla-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = shared.name
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  if not args.no_baseline:
    tests = list(dict.fromkeys(t for m in chosen for t in m.tests))
    with tempfile.TemporaryDirectory(prefix="mutation-base-") as d:
      copy_tree(d)
      rc, failed, s = run_tests(d, tests, **settings)
    print(f"{'(unmutated)':38s} {'passes' if rc == 0 else 'FAILS'} in {s:.0f}s {' '.join(failed)}", flush=True)
    record({"name": "(unmutated)", "caught_by": failed, "ok": rc == 0, "seconds": round(s, 1)}, True)
  for m in chosen:
    with tempfile.TemporaryDirectory(prefix=f"mutation-{m.name}-") as d:
      copy_tree(d)
      apply(d, m)
      rc, failed, s = run_tests(d, m.tests, **settings, exitfirst=args.exitfirst)
    caught = rc != 0 and bool(failed)
    expected = args.head in m.heads
    verdict = "caught" if caught else "SURVIVED" if expected else f"survived (caught only at {'/'.join(m.heads)})"
    print(f"{m.name:38s} {verdict} in {s:.0f}s by {' '.join(failed) or '-'}", flush=True)
    record({"name": m.name, "file": m.file, "bug": m.bug, "caught_by": failed, "ok": caught, "expected": expected,
            "seconds": round(s, 1)}, expected)
  total = time.perf_counter() - t_start
  others = sum(1 for r in rows if r.get("expected") is False and not r["ok"])
  note = f" ({others} survived, as expected at this head)" if others else ""
  print(f"{'all caught' if ok else 'NOT ALL CAUGHT'}{note}; {len(chosen)} mutations in {total:.0f}s")
  return 0 if ok else 1

if __name__ == "__main__":
  sys.exit(main())
