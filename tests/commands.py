"""Running a script of scripts/ (the product), scripts/dev/ (developers' tools) or scripts/experiments/ (one-off
measurements) as a user does: a command in its own process, on this checkout's package. No test imports or loads a
script (tests/test_code_size.py): the product commands' code is ssd_jax/cli/, which tests import."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT_DIRS = ("scripts", os.path.join("scripts", "dev"), os.path.join("scripts", "experiments"))


def script_path(filename: str) -> str:
  """Returns the path of `filename` in the one folder of SCRIPT_DIRS that holds it."""
  found = [p for p in (os.path.join(ROOT, d, filename) for d in SCRIPT_DIRS) if os.path.isfile(p)]
  if len(found) != 1:
    raise FileNotFoundError(f"{filename}: {len(found)} copies in {', '.join(SCRIPT_DIRS)} (one expected)")
  return found[0]


def run_script(filename: str, *args: str, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
  """Runs the script `filename` (script_path) with `args` from the repository root, on this checkout's package (its
  folder first on PYTHONPATH, whatever ssd_jax is installed), and returns the finished process, its output as text."""
  env = dict(os.environ if env is None else env)
  env["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
  return subprocess.run([sys.executable, script_path(filename), *args], capture_output=True, text=True,
                        timeout=timeout, cwd=ROOT, env=env)
