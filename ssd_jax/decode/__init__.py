"""Decoders behind one interface: autoregressive (ar), speculative (sd) and speculative speculative (ssd).

steps.py holds the jitted decode steps every loop is made of; ar.py, sd.py and ssd.py are the three loops over them;
speculator.py the draft side SD and SSD talk to (draft.py its model calls, draft_process.py its own process).
"""
from .ar import ARDecoder
from .base import DecodeResult
from .options import DecodeOptions, SpecOptions
from .sd import SDDecoder
from .ssd import SSDDecoder

__all__ = ["ARDecoder", "DecodeOptions", "DecodeResult", "SDDecoder", "SSDDecoder", "SpecOptions"]
