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
