"""The C files of the codecs as every build lists them (codecs_c/build_ffi.py), for tests that
compile the codecs into a program of their own."""
from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def codec_build():
    spec = importlib.util.spec_from_file_location("codec_build", ROOT / "codecs_c" / "build_ffi.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def codec_sources() -> list[str]:
    """The codecs' C files, relative to the repository root."""
    return list(codec_build().SOURCES)
