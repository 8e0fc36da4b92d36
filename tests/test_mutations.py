"""The mutation run's list (tests/mutations.py) stays true to the code (scripts/dev/mutation_run.py runs it; it is too
long for this suite).

Each mutation's text must occur exactly once in its file, and every test it names must exist: an edit that moves
the code would otherwise turn a mutation into a no-op or a run of nothing, silently.
"""
import ast
import os

import pytest
from mutations import MUTATIONS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_mutation_names_are_unique():
  assert len({m.name for m in MUTATIONS}) == len(MUTATIONS)


@pytest.mark.parametrize("m", MUTATIONS, ids=lambda m: m.name)
def test_mutation_text_occurs_once_and_its_tests_exist(m):
  text = open(os.path.join(ROOT, m.file)).read()
  assert text.count(m.old) == 1, f"{m.name}: text found {text.count(m.old)} times in {m.file}"
  assert m.new != m.old
  ast.parse(text.replace(m.old, m.new))  # the mutant still parses: a mutation must fail a test, not an import
  assert m.tests
  for t in m.tests:
    path, _, name = t.partition("::")
    src = open(os.path.join(ROOT, path)).read()
    if name:
      assert f"def {name.split('[')[0]}(" in src, f"{m.name}: no test {t}"


def test_every_mutation_is_caught_by_tests_of_the_fast_suite():
  """The test command leaves out tests marked slow: every mutation must name a test that command runs, or the fast
  suite could not catch it (the mutation run runs the command's selection)."""
  import subprocess
  import sys
  ids = sorted({t for m in MUTATIONS for t in m.tests})
  r = subprocess.run([sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", "-m", "not slow", *ids],
                     capture_output=True, text=True, cwd=ROOT, timeout=600)
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
  fast = [line for line in r.stdout.splitlines() if "::" in line]

  def runs(t):  # a file, a test (all its parameters) or one parameter of it
    return any(f == t or f.startswith(t + ("[" if "::" in t else "::")) for f in fast)

  assert [m.name for m in MUTATIONS if not any(runs(t) for t in m.tests)] == []
