"""cffi build of the soft NIC's C data path into ``inceptionn.daemon._datapath``: the NFQUEUE
loop, the flow table and the packet transforms, linked with the codec and libnetfilter_queue."""
import os

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CODECS = os.path.join(ROOT, "codecs_c")


def rel(*parts):
    return os.path.relpath(os.path.join(*parts), ROOT)


# Each header's declarations for cffi sit beside it in NAME.cdef, as for the codecs; constants
# and array lengths are "...", so the C compiler supplies them from the headers.
CDEF_FILES = [os.path.join(HERE, f"nicd_{name}.cdef") for name in ("packet", "flows", "pmtu", "conntrack", "queue")]
CDEF = "\n".join(open(f).read() for f in CDEF_FILES)

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "inceptionn.daemon._datapath",
    '#include "nicd_packet.h"\n#include "nicd_flows.h"\n#include "nicd_pmtu.h"\n#include "nicd_conntrack.h"\n#include "nicd_queue.h"',
    # the queue loop's files: nicd_queue_int.h says which job each has
    sources=[rel(HERE, s) for s in ("nicd_packet.c", "nicd_flows.c", "nicd_pmtu.c", "nicd_conntrack.c", "nicd_queue.c",
                                    "nicd_egress.c", "nicd_ingress.c", "nicd_handshake.c", "nicd_gso.c")]
    + [rel(CODECS, s) for s in ("inceptionn_codec.c", "inceptionn_codec_avx2.c")],
    include_dirs=[rel(HERE), rel(CODECS), rel(ROOT, "inceptionn")],   # the codec includes inceptionn_contract.h
    libraries=["netfilter_queue", "nfnetlink", "pthread"],
    extra_compile_args=["-O3", "-std=gnu11", "-Wall", "-Wextra", "-fno-strict-aliasing", "-ffp-contract=off"],  # as the codecs
    # NICD_PROFILE=1 in the build's environment: the queue threads time their phases (docs/perf.md)
    define_macros=[("NICD_PROFILE", "1")] if os.environ.get("NICD_PROFILE") == "1" else [],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
