"""Compiling every program of a round for real devices (a libtpu topology's, or this host's forced CPU devices) and
reading the compiler's per-device memory: at full depth, or at two depths and extrapolated linearly in the layers.

Nothing runs: a TPU topology compiles on a CPU-only host with libtpu installed (the `tpu` extra).
"""
from __future__ import annotations

import dataclasses
import time

import jax

from ..models.config import ModelConfig
from .programs import Layout, Program, round_programs

MEMORY_FIELDS = ("argument", "output", "alias", "temp", "code")


def tpu_devices(topology: str) -> list:
  """Returns the devices of a TPU topology ('v5e:2x4') to compile for, without a TPU; a clear error without libtpu."""
  from jax.experimental import topologies
  try:
    return list(topologies.get_topology_desc(platform="tpu", topology_name=topology).devices)
  except Exception as e:  # no libtpu, an unknown shape, libtpu held by another process
    why = str(e).splitlines()[0][:160]
    todo = ("another process holds libtpu: wait for it, or set ALLOW_MULTIPLE_LIBTPU_LOAD=1" if "lockfile" in why
            else "compiling for TPU needs libtpu: pip install -e '.[tpu]'")
    raise RuntimeError(f"cannot make TPU topology {topology!r} ({why}); {todo}") from None


def _cache_sharding_kept(prog: Program, exe) -> bool:
  """Whether the compiled program returns the KV cache with the sharding it was given (else every call reshards)."""
  if prog.cache_in is None:
    return True
  cache = prog.args[prog.cache_in]
  out = jax.tree.leaves(exe.output_shardings)[-len(jax.tree.leaves(cache)):]
  return all(o.is_equivalent_to(a.sharding, len(a.shape)) for o, a in zip(out, jax.tree.leaves(cache)))


def compile_one(prog: Program) -> dict:
  """Returns {name, side, seconds, bytes per device by MEMORY_FIELDS, peak, sharding_ok} or {name, side, error}."""
  t0 = time.perf_counter()
  try:
    with jax.set_mesh(prog.mesh):  # as Programs lowers (decode/base.py): a Pallas call splits itself over it
      exe = prog.fn.lower(*prog.args, **prog.static).compile()
  except Exception as e:
    return {"name": prog.name, "side": prog.side, "model": prog.model,
            "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
  secs = time.perf_counter() - t0
  m = exe.memory_analysis()
  mem = {f: int(getattr(m, f"{f}_size_in_bytes" if f != "code" else "generated_code_size_in_bytes"))
         for f in MEMORY_FIELDS}
  peak = mem["argument"] + mem["output"] - mem["alias"] + mem["temp"] + mem["code"]
  return {"name": prog.name, "side": prog.side, "model": prog.model, "seconds": secs, **mem, "peak": peak,
          "sharding_ok": _cache_sharding_kept(prog, exe)}


def _at_depth(cfg: ModelConfig, layers: int) -> ModelConfig:
  return dataclasses.replace(cfg, n_layers=min(layers, cfg.n_layers))


def _extrapolate(a: dict, b: dict, la: int, lb: int, full: int) -> dict:
  """Returns the record at `full` layers from records at la < lb layers: bytes linear in the layers (stated);
  seconds are the two compiles' sum, not extrapolated (on a shared machine they are too noisy to difference)."""
  if a is b:  # compiled once
    return a
  if "error" in a or "error" in b or la == lb:
    return dict(b if "error" not in b else a, depth=lb)
  out = dict(b, depth=full, extrapolated_from=(la, lb))
  for f in MEMORY_FIELDS + ("peak",):
    out[f] = b[f] + (b[f] - a[f]) * (full - lb) / (lb - la)
  out["seconds"] = a["seconds"] + b["seconds"]
  out["sharding_ok"] = a["sharding_ok"] and b["sharding_ok"]
  return out


def compile_round(tcfg: ModelConfig, dcfg: ModelConfig, layout: Layout, depths: tuple | None, log=None,
                  **shapes) -> list[dict]:
  """Returns one record per program of the round (round_programs' shapes and settings in `shapes`), compiled at
  full depth (depths None) or at the two depths given and extrapolated to each side's full depth."""
  if depths is None:
    runs = [(tcfg.n_layers, dcfg.n_layers)]
  else:
    runs = [(_at_depth(tcfg, d).n_layers, _at_depth(dcfg, d).n_layers) for d in sorted(depths)]
  by_depth = []
  for i, (lt, ld) in enumerate(runs):
    recs = []
    for j, prog in enumerate(round_programs(_at_depth(tcfg, lt), _at_depth(dcfg, ld), layout, **shapes)):
      if i and not prog.layered:  # sampling, lookup, ...: the same program at any depth, compiled once
        recs.append(by_depth[0][j])
        continue
      rec = dict(compile_one(prog), depth=(lt if prog.model == "target" else ld) if prog.layered else "-")
      if log:
        log(rec)
      recs.append(rec)
    by_depth.append(recs)
  if len(by_depth) == 1:
    return by_depth[0]
  (lt_a, ld_a), (lt_b, ld_b) = runs
  return [_extrapolate(a, b, *((lt_a, lt_b, tcfg.n_layers) if a["model"] == "target" else (ld_a, ld_b, dcfg.n_layers)))
          for a, b in zip(*by_depth)]
