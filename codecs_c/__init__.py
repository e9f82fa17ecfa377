"""Gradient codecs. ``get_codec(name, **params)`` is the one way in.

A codec is one file here plus one line in ``_REGISTRY``.
"""
from __future__ import annotations

from .base import Codec
from .memory import ErrorFeedback

_REGISTRY = {
    "inceptionn": ("inceptionn", "InceptionnCodec"),
    "terngrad": ("terngrad", "TernGradCodec"),
    "3lc": ("threelc", "ThreeLCCodec"),
    "thc": ("thc", "THCCodec"),
    "fft": ("fft", "FFTCodec"),
}


def available_codecs() -> list[str]:
    return sorted(_REGISTRY)


def get_codec(name: str, **params) -> Codec:
    """Build a codec by name, e.g. ``get_codec("inceptionn", error_bound=-10)``."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown codec {name!r}; available: {', '.join(available_codecs())}")
    module, cls = _REGISTRY[name]
    from importlib import import_module

    return getattr(import_module(f"{__name__}.{module}"), cls)(**params)


__all__ = ["Codec", "ErrorFeedback", "available_codecs", "get_codec"]
