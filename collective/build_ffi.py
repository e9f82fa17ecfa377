"""cffi build of the ring engine (collective/ring_engine.c, docs/collectives.md "The ring engine")
into ``inceptionn.collective._engine``, with the C it calls (wire format v2 and the INCEPTIONN
codec; THC, 3LC and TernGrad through collective/ring_codecs.c): the same C the MPI library links, so Python runs the ring the library runs.

Declarations come from ring_engine.cdef beside the header, as for the codecs."""
import os

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CODECS = os.path.join(ROOT, "codecs_c")

ffibuilder = FFI()
ffibuilder.cdef(open(os.path.join(HERE, "ring_engine.cdef")).read())
ffibuilder.set_source(
    "inceptionn.collective._engine",
    '#include "ring_engine.h"',
    sources=[os.path.relpath(p, ROOT) for p in
             (os.path.join(HERE, "ring_engine.c"), os.path.join(HERE, "ring_codecs.c"), *(os.path.join(CODECS, f) for f in
              ("blockscale_codec.c", "inceptionn_codec.c", "inceptionn_codec_avx2.c", "thc_codec.c", "threelc_codec.c", "terngrad_codec.c")))],
    include_dirs=[os.path.relpath(HERE, ROOT), os.path.relpath(CODECS, ROOT)],
    # -ffp-contract=off: the same roundings as the codecs' module and the MPI library
    extra_compile_args=["-O3", "-std=gnu11", "-Wall", "-Wextra", "-fno-strict-aliasing", "-ffp-contract=off"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
