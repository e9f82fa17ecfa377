"""cffi (API mode, out of line) build of the C codecs into ``inceptionn.codecs._native``.

setup.py names this file in ``cffi_modules``; ``pip install`` compiles it. Paths are relative to
the repository root, where setuptools runs.
"""
import glob
import os

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# Each C codec is three files side by side: NAME_codec.h (public header), NAME_codec*.c and
# NAME_codec.cdef (the declarations cffi exposes). A new codec is picked up without editing this.
CDEF_FILES = sorted(glob.glob(os.path.join(HERE, "*_codec.cdef")))
CDEF = "\n".join(open(f).read() for f in CDEF_FILES)
HEADERS = [os.path.basename(f)[: -len(".cdef")] + ".h" for f in CDEF_FILES]

# "_*.c" is cffi's own generated file when this script runs by hand.
SOURCES = sorted(os.path.basename(f) for f in glob.glob(os.path.join(HERE, "[!_]*.c")))

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "inceptionn.codecs._native",
    "\n".join(f'#include "{h}"' for h in HEADERS),
    sources=[os.path.relpath(os.path.join(HERE, s), ROOT) for s in SOURCES],
    include_dirs=[os.path.relpath(HERE, ROOT)],
    # -ffp-contract=off: no fused multiply-add where the source has a multiply and an add, even
    # when CFLAGS ask for a newer CPU, so a value rounds the same on every host
    extra_compile_args=["-O3", "-std=gnu11", "-Wall", "-Wextra", "-fno-strict-aliasing", "-ffp-contract=off"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
