"""The size rules of issue 32's bar: no module of the package over 400 lines, no function over 80 lines in the
package or the scripts (a script's argument parsing, `parse_args`, excepted: one line a flag)."""
import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 400, 80


def _sources(*dirs):
  for d in dirs:
    for base, _, files in os.walk(os.path.join(ROOT, d)):
      for f in sorted(files):
        if f.endswith(".py"):
          yield os.path.join(base, f)


def long_functions(path: str, limit: int = MAX_FUNCTION_LINES) -> list[str]:
  """Returns 'path:line name (n lines)' for every function (nested ones too) longer than `limit` lines."""
  with open(path) as f:
    tree = ast.parse(f.read())
  return [f"{os.path.relpath(path, ROOT)}:{n.lineno} {n.name} ({n.end_lineno - n.lineno + 1} lines)"
          for n in ast.walk(tree)
          if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name != "parse_args"
          and n.end_lineno - n.lineno + 1 > limit]


def test_no_function_over_80_lines():
  assert [x for p in _sources("ssd_jax", "scripts") for x in long_functions(p)] == []


def test_no_package_module_over_400_lines():
  long = []
  for p in _sources("ssd_jax"):
    with open(p) as f:
      n = sum(1 for _ in f)
    if n > MAX_MODULE_LINES:
      long.append(f"{os.path.relpath(p, ROOT)} ({n} lines)")
  assert long == []


def test_the_check_finds_a_long_function(tmp_path):
  src = tmp_path / "long.py"
  src.write_text("def f():\n" + "  x = 1\n" * 80 + "\n\ndef parse_args():\n" + "  y = 2\n" * 90)
  assert long_functions(str(src)) == [f"{os.path.relpath(str(src), ROOT)}:1 f (81 lines)"]


def test_the_library_core_does_not_import_its_benchmark():
  """Layers point one way: decode/ and models/ (the library's core) import nothing from bench/ (which measures them)."""
  import ast
  import pathlib
  root = pathlib.Path(__file__).resolve().parent.parent / "ssd_jax"
  bad = []
  for pkg in ("decode", "models", "kernels"):
    for path in (root / pkg).rglob("*.py"):
      for node in ast.walk(ast.parse(path.read_text())):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                 [("." * node.level) + (node.module or "")] if isinstance(node, ast.ImportFrom) else [])
        bad += [f"{path.relative_to(root)}: {n}" for n in names if "bench" in n.split(".")]
  assert not bad, bad
