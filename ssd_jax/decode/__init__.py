"""Decoders behind one interface: autoregressive (ar), speculative (sd) and speculative speculative (ssd)."""
from .base import DecodeOptions, DecodeResult
from .ar import ARDecoder

__all__ = ["ARDecoder", "DecodeOptions", "DecodeResult"]
