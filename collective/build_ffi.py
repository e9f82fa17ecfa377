"""cffi build of the ring engine (collective/ring_engine.c, docs/collectives.md "The ring engine")
into ``inceptionn.collective._engine``, with every C codec and the codec table
(codecs_c/codec_table.h): the same C the MPI library links, so Python runs the ring the library
runs.

Declarations come from ring_engine.cdef beside the header and the codecs' own (codecs_c/build_ffi.py)."""
import importlib.util
import os

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def codec_build():
    """codecs_c/build_ffi.py: the codecs' C files, declarations and flags, listed there once."""
    spec = importlib.util.spec_from_file_location("codec_build", os.path.join(ROOT, "codecs_c", "build_ffi.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


codecs = codec_build()

# The MPI library's C, paths from the repository root: setup.py builds it once per MPI ABI, a test
# (tests/test_codec_table.py) with a codec of its own.
PMPI_SOURCES = ["collective/pmpi_allreduce.c", "collective/pmpi_settings.c", "collective/pmpi_ring.c",
                "collective/pmpi_comm.c", "collective/pmpi_choice.c", "collective/pmpi_result_check.c",
                "collective/pmpi_abi.c", "collective/ring_engine.c",
                "collective/ring_handshake.c", "collective/nicd_bound.c", *codecs.SOURCES]
PMPI_INCLUDE = ["collective", *codecs.INCLUDE_DIRS, "shim"]
PMPI_DEPENDS = ["collective/pmpi_allreduce.h", "collective/pmpi_internal.h", "collective/ring_engine.h", "collective/ring_handshake.h",
                "collective/nicd_bound.h", *codecs.HEADER_FILES,
                "shim/log_line.h"]
PMPI_LIBRARIES = ["crypto", "m"]      # libcrypto: the ring handshake's HMAC-SHA256
# -ffp-contract=off: the same roundings on every host, as the codecs
PMPI_CFLAGS = ["-O3", "-std=gnu11", "-Wall", "-Wextra", "-fvisibility=hidden", "-pthread", "-ffp-contract=off"]

ffibuilder = FFI()
ffibuilder.cdef(codecs.CDEF + "\n" + open(os.path.join(HERE, "ring_engine.cdef")).read())
ffibuilder.set_source(
    "inceptionn.collective._engine",
    '#include "ring_engine.h"\n' + "\n".join(f'#include "{h}"' for h in codecs.HEADERS),
    sources=[os.path.relpath(os.path.join(HERE, "ring_engine.c"), ROOT), *codecs.SOURCES],
    include_dirs=[os.path.relpath(HERE, ROOT), *codecs.INCLUDE_DIRS],
    extra_compile_args=codecs.CFLAGS,   # the same roundings as the codecs' module and the MPI library
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
