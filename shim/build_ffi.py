"""cffi build of the tagging contract and the policy parser into ``inceptionn.shim._policy``: the
same C (tag_policy.c, inceptionn_contract.h) that the LD_PRELOAD library runs, so Python checks a
policy exactly as the library will and reads the marks from the header the C code includes.

Declarations come from the .cdef file beside each header, as for the codecs."""
import os

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
HEADERS = ("inceptionn_contract", "tag_policy")

ffibuilder = FFI()
ffibuilder.cdef("\n".join(open(os.path.join(HERE, f"{h}.cdef")).read() for h in HEADERS))
ffibuilder.set_source(
    "inceptionn.shim._policy",
    "\n".join(f'#include "{h}.h"' for h in HEADERS),
    sources=[os.path.relpath(os.path.join(HERE, "tag_policy.c"), ROOT)],
    include_dirs=[os.path.relpath(HERE, ROOT)],
    extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
