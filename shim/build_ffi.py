"""cffi build of the tagging contract and the policy parser into ``inceptionn.shim._policy``: the
same C (tag_policy.c, inceptionn_contract.h) that the LD_PRELOAD library runs, so Python checks a
policy exactly as the library will and reads the marks from the header the C code includes.

Declarations come from the .cdef file beside each header, as for the codecs."""
import os

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CONTRACT = os.path.join(ROOT, "inceptionn")     # inceptionn_contract.h, the facts every part shares
HEADERS = ((CONTRACT, "inceptionn_contract"), (HERE, "tag_policy"))

ffibuilder = FFI()
ffibuilder.cdef("\n".join(open(os.path.join(d, f"{h}.cdef")).read() for d, h in HEADERS))
ffibuilder.set_source(
    "inceptionn.shim._policy",
    "\n".join(f'#include "{h}.h"' for _, h in HEADERS),
    sources=[os.path.relpath(os.path.join(HERE, "tag_policy.c"), ROOT)],
    include_dirs=[os.path.relpath(HERE, ROOT), os.path.relpath(CONTRACT, ROOT)],
    extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
