"""Decoders behind one interface: autoregressive (ar), speculative (sd) and speculative speculative (ssd).

steps.py holds the jitted decode steps; rounds.py the one target loop over them (prefill, then speculate / verify /
commit); ar.py, sd.py and ssd.py the decoders that plug a draft side into it;
speculator.py the draft side SD and SSD talk to (draft.py its model calls, draft_process.py its own process).
The options import no JAX (scripts check them before choosing the CPU's devices); the decoders load on first use.
"""
from .options import DecodeOptions, SpecOptions

__all__ = ["ARDecoder", "DecodeOptions", "DecodeResult", "EveryRow", "SDDecoder", "SSDDecoder", "SpecOptions"]
_LAZY = {"ARDecoder": "ar", "DecodeResult": "base", "EveryRow": "base", "SDDecoder": "sd", "SSDDecoder": "ssd"}


def __getattr__(name):
  if name in _LAZY:
    import importlib
    return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
