"""cffi (API mode, out of line) build of the C codecs into ``inceptionn.codecs._native``.

setup.py names this file in ``cffi_modules``; ``pip install`` compiles it. Paths are relative to
the repository root, where setuptools runs.
"""
import os

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

CDEF = """
enum { INC_LANES = 8, INC_MAX_GROUP_BYTES = 34, INC_MIN_ERROR_BOUND = -30, INC_MAX_ERROR_BOUND = -1 };
enum { INC_OK = 0, INC_E_ARG = -1, INC_E_SPACE = -2, INC_E_TRUNCATED = -3, INC_E_TRAILING = -4,
       INC_E_PADDING = -5 };
enum { INC_IMPL_AUTO = 0, INC_IMPL_SCALAR = 1, INC_IMPL_AVX2 = 2 };
size_t inc_max_encoded_size(size_t n);
int inc_have_avx2(void);
ptrdiff_t inc_encode(const float *in, size_t n, int k, uint8_t *out, size_t cap, int impl);
int inc_decode(const uint8_t *in, size_t len, float *out, size_t n, size_t *err_at, int impl);
size_t inc_encoded_size(const float *in, size_t n, int k);
void inc_histogram(const float *in, size_t n, int k, uint64_t counts[4]);
int inc_stream_histogram(const uint8_t *in, size_t len, size_t n, uint64_t counts[4]);
const char *inc_strerror(int status);
"""

SOURCES = ["inceptionn_codec.c", "inceptionn_codec_avx2.c"]

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "inceptionn.codecs._native",
    '#include "inceptionn_codec.h"',
    sources=[os.path.relpath(os.path.join(HERE, s), ROOT) for s in SOURCES],
    include_dirs=[os.path.relpath(HERE, ROOT)],
    extra_compile_args=["-O3", "-std=gnu11", "-Wall", "-Wextra", "-fno-strict-aliasing"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
