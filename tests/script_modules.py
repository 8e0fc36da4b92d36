"""Loading a script of scripts/ as a module, for the tests that call its functions directly."""
import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_script(filename: str, name: str):
  """Returns scripts/`filename` imported as module `name` (registered in sys.modules: dataclasses look it up)."""
  spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "scripts", filename))
  mod = importlib.util.module_from_spec(spec)
  sys.modules[name] = mod
  spec.loader.exec_module(mod)
  return mod
