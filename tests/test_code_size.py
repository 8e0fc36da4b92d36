"""The size rules of issue 32's bar: no module of the package over 400 lines (a module that is one concept, named
with its reason, up to 600), no function over 80 lines in the package or the scripts (a script's argument parsing,
`parse_args`, excepted: one line a flag). And layers that point one way: the library's core imports nothing from its
benchmark, no test module imports another (shared helpers live in the plain modules of tests/, shared fixtures in
tests/conftest.py), and no test imports or loads a script (a product command's code is ssd_jax/cli/; a test runs a
script as a command, tests/commands.py)."""
import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 400, 80
# The cap protects readability, not a number: a module that is one concept may grow past it rather than be cut in two,
# when it is named here with the reason, up to WHOLE_CONCEPT_LINES (past that, it is more than one concept).
WHOLE_CONCEPT_LINES = 600
WHOLE_CONCEPTS = {
  "ssd_jax/api.py": "the Pipeline a user imports: loading, choosing the mode and K, generate; read top to bottom",
  "ssd_jax/decode/steps.py": "the jitted decode steps the AR, SD and SSD loops share, over one cache layout",
  "ssd_jax/bench/plan.py": "the benchmark's plan and arithmetic over its JSON: variants, sweeps, ratios, predictions",
}


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
  """Over 400 lines only a module named in WHOLE_CONCEPTS (with its reason), and none over 600."""
  long = []
  for p in _sources("ssd_jax"):
    with open(p) as f:
      n = sum(1 for _ in f)
    rel = os.path.relpath(p, ROOT)
    if n > (WHOLE_CONCEPT_LINES if rel in WHOLE_CONCEPTS else MAX_MODULE_LINES):
      long.append(f"{rel} ({n} lines)")
  assert long == []
  assert [m for m in WHOLE_CONCEPTS if not os.path.isfile(os.path.join(ROOT, m))] == []  # no stale names


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


def imports_of_test_modules(path: str) -> list[str]:
  """Returns 'path:line name' for every import in `path` (nested ones too) of a test module: a `test_*` module that
  is a file of tests/."""
  tests = {f[:-3] for f in os.listdir(os.path.join(ROOT, "tests")) if f.startswith("test_") and f.endswith(".py")}
  with open(path) as f:
    tree = ast.parse(f.read())
  found = []
  for node in ast.walk(tree):
    names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
             [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
    found += [f"{os.path.relpath(path, ROOT)}:{node.lineno} {n}" for n in names if n.split(".")[0] in tests]
  return found


def test_no_test_module_imports_another():
  """A test module's helpers are imported from a helper module (tests/pairs.py, tests/law_stats.py, ...), never from
  another test module: importing one runs its module-level code and pulls its fixtures into a second namespace, and
  a helper's home should not depend on which test happened to write it first."""
  assert [x for p in _sources("tests") for x in imports_of_test_modules(p)] == []


def test_the_check_finds_a_test_module_import(tmp_path):
  src = tmp_path / "test_x.py"
  src.write_text("import os\nimport test_sd\nfrom pairs import PROMPTS\n\n\n"
                 "def f():\n  from test_sd_chain import sd_pair\n")
  rel = os.path.relpath(str(src), ROOT)
  assert imports_of_test_modules(str(src)) == [f"{rel}:2 test_sd", f"{rel}:7 test_sd_chain"]


# What runs a file as a module: importlib's file loaders, runpy, imp.
SCRIPT_LOADERS = {"spec_from_file_location", "SourceFileLoader", "SourcelessFileLoader", "exec_module", "load_source",
                  "run_path"}


def script_loads(path: str) -> list[str]:
  """Returns 'path:line what' for every way `path` takes a script's code into its own process: an import of a name
  that is a script of scripts/ (its folder put on sys.path) or of `scripts`, or a loader that runs a file as a module
  (SCRIPT_LOADERS). Running a script as a command (a subprocess) is neither."""
  scripts = {os.path.basename(p)[:-3] for p in _sources("scripts")} | {"scripts"}
  with open(path) as f:
    tree = ast.parse(f.read())
  rel, found = os.path.relpath(path, ROOT), []
  for node in ast.walk(tree):
    names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
             [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
    found += [(node.lineno, f"import {n}") for n in names if n.split(".")[0] in scripts]
    loader = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
    if loader in SCRIPT_LOADERS:
      found.append((node.lineno, loader))
  return [f"{rel}:{line} {what}" for line, what in sorted(found)]


def test_no_test_imports_or_loads_a_script():
  """Tests import the package, never a script: a product command's code is a module of ssd_jax/cli/ (the script calls
  its main), and a test runs a script as a command (tests/commands.py). A script loaded by path ties the test to the
  file's private names and keeps code the library should own where no user can import it."""
  assert [x for p in _sources("tests") for x in script_loads(p)] == []


def test_the_check_finds_a_script_load(tmp_path):
  src = tmp_path / "test_x.py"
  src.write_text("import importlib.util\nimport runpy\nimport decode\nfrom pairs import PROMPTS\n"
                 "from ssd_jax.cli import bench\n\n\ndef f():\n"
                 "  spec = importlib.util.spec_from_file_location('b', 'scripts/bench.py')\n"
                 "  runpy.run_path('scripts/plan.py')\n  from mutation_run import MUTATIONS\n")
  rel = os.path.relpath(str(src), ROOT)
  assert script_loads(str(src)) == [f"{rel}:3 import decode", f"{rel}:9 spec_from_file_location", f"{rel}:10 run_path",
                                    f"{rel}:11 import mutation_run"]
