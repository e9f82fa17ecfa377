"""cffi (API mode, out of line) build of the C codecs into ``inceptionn.codecs._native``, and the
one list of the codecs' C files that every build of them uses (collective/build_ffi.py, setup.py's
MPI library; the Makefile's CODEC_SRC is the same rule as a wildcard).

setup.py names this file in ``cffi_modules``; ``pip install`` compiles it. Paths are relative to
the repository root, where setuptools runs.
"""
import glob
import os

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# Each C codec is three files side by side: NAME_codec.h (public header), NAME_codec*.c and
# NAME_codec.cdef (the declarations cffi exposes); codec_table.{h,c,cdef} is the table of them
# (codec_list.h names them). A new codec is picked up without editing this.
CDEF_FILES = [os.path.join(HERE, "codec_table.cdef"), *sorted(glob.glob(os.path.join(HERE, "*_codec.cdef")))]
CDEF = "\n".join(open(f).read() for f in CDEF_FILES)
HEADERS = [os.path.basename(f)[: -len(".cdef")] + ".h" for f in CDEF_FILES]

# "_*.c" is cffi's own generated file when this script runs by hand.
SOURCES = [os.path.relpath(f, ROOT) for f in sorted(glob.glob(os.path.join(HERE, "[!_]*.c")))]
INCLUDE = os.path.relpath(HERE, ROOT)
# the facts every part shares (the error-bound range and default), which the codecs include too
CONTRACT = os.path.join("inceptionn", "inceptionn_contract.h")
INCLUDE_DIRS = [INCLUDE, os.path.dirname(CONTRACT)]
HEADER_FILES = [os.path.relpath(f, ROOT) for f in sorted(glob.glob(os.path.join(HERE, "*.h")))] + [CONTRACT]

# -ffp-contract=off: no fused multiply-add where the source has a multiply and an add, even when
# CFLAGS ask for a newer CPU, so a value rounds the same on every host (every build of the codecs)
CFLAGS = ["-O3", "-std=gnu11", "-Wall", "-Wextra", "-fno-strict-aliasing", "-ffp-contract=off"]

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "inceptionn.codecs._native",
    "\n".join(f'#include "{h}"' for h in HEADERS),
    sources=SOURCES,
    include_dirs=INCLUDE_DIRS,
    extra_compile_args=CFLAGS,
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
