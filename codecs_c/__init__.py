"""Gradient codecs. ``get_codec(name, **params)`` is the one way in.

A codec is one file here plus one line in ``_REGISTRY`` (a Python class), or a C codec's one file
(NAME_codec.c with its description, codec_table.h) plus one line in codec_list.h: the table gives
its traits and defaults to the engine, the MPI library and Python, where a C codec without a class
of its own runs as ``table.TableCodec``.
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
    from . import table

    return sorted({*_REGISTRY, *(n for n in table.names() if table.description(n).make != table.ffi.NULL)})


def codec_class(name: str) -> type[Codec]:
    """The class of a registered codec (its traits are class attributes)."""
    from . import table

    if name in _REGISTRY:
        module, cls = _REGISTRY[name]
        from importlib import import_module

        return getattr(import_module(f"{__name__}.{module}"), cls)
    if name in available_codecs():
        return table.codec_class(name)
    raise ValueError(f"unknown codec {name!r}; available: {', '.join(available_codecs())}")


def get_codec(name: str, **params) -> Codec:
    """Build a codec by name, e.g. ``get_codec("inceptionn", error_bound=-10)``."""
    return codec_class(name)(**params)


def codec_parameters(name: str) -> frozenset[str]:
    """The keyword parameters a codec takes, so a caller holding settings for several codecs (an
    error bound, seeds) passes each codec those it has, without knowing codecs by name."""
    import inspect

    return frozenset(inspect.signature(codec_class(name)).parameters)


def applicable(name: str, **settings) -> dict:
    """``settings`` restricted to the parameters of codec ``name``."""
    accepted = codec_parameters(name)
    return {k: v for k, v in settings.items() if k in accepted}


__all__ = ["Codec", "ErrorFeedback", "applicable", "available_codecs", "codec_class", "codec_parameters", "get_codec"]
