"""Finding a script of scripts/ (the product), scripts/dev/ (developers' tools) or scripts/experiments/ (one-off
measurements), and loading one as a module, for the tests that call its functions directly."""
import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT_DIRS = ("scripts", os.path.join("scripts", "dev"), os.path.join("scripts", "experiments"))


def script_path(filename: str) -> str:
  """Returns the path of `filename` in the one folder of SCRIPT_DIRS that holds it."""
  found = [p for p in (os.path.join(ROOT, d, filename) for d in SCRIPT_DIRS) if os.path.isfile(p)]
  if len(found) != 1:
    raise FileNotFoundError(f"{filename}: {len(found)} copies in {', '.join(SCRIPT_DIRS)} (one expected)")
  return found[0]


def load_script(filename: str, name: str):
  """Returns the script `filename` (script_path) imported as module `name` (registered in sys.modules: dataclasses
  look it up)."""
  spec = importlib.util.spec_from_file_location(name, script_path(filename))
  mod = importlib.util.module_from_spec(spec)
  sys.modules[name] = mod
  spec.loader.exec_module(mod)
  return mod
