"""cffi build of the soft NIC's C data path into ``inceptionn.daemon._datapath``: the NFQUEUE
loop, the flow table and the packet transforms, linked with the codec and libnetfilter_queue."""
import os

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CODECS = os.path.join(ROOT, "codecs_c")


def rel(*parts):
    return os.path.relpath(os.path.join(*parts), ROOT)


def counter_docs():
    """The enum nicd_counter names, in order, each with its comment in the header ("" if none;
    a comment running over several lines joined): one source of truth for the counters and
    what they mean."""
    docs, inside, open_comment = [], False, False
    with open(os.path.join(HERE, "nicd_queue.h")) as f:
        for line in f:
            if "enum nicd_counter" in line:
                inside = True
            elif inside and "NICD_NCOUNTERS" in line:
                return [(name, " ".join(words).strip()) for name, words in docs]
            elif inside:
                code, _, comment = line.partition("/*")
                if open_comment and docs:  # a continuation line of the last comment
                    code, comment = "", line
                comment, closed, _ = comment.partition("*/")
                for part in code.split(","):
                    part = part.strip()
                    if part.startswith("NICD_C_"):
                        docs.append((part, []))
                if (comment.strip() or open_comment) and docs:
                    docs[-1][1].append(comment.strip())
                open_comment = bool(comment.strip() or open_comment) and not closed
    raise RuntimeError("enum nicd_counter not found")


def counter_names():
    """The enum nicd_counter names, in order, read from the header."""
    return [name for name, _ in counter_docs()]


# Each header's declarations for cffi sit beside it in NAME.cdef, as for the codecs; constants
# and array lengths are "...", so the C compiler supplies them from the headers.
CDEF_FILES = [os.path.join(HERE, f"nicd_{name}.cdef") for name in ("packet", "flows", "queue")]
CDEF = "\n".join(open(f).read() for f in CDEF_FILES)

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "inceptionn.daemon._datapath",
    '#include "nicd_packet.h"\n#include "nicd_flows.h"\n#include "nicd_queue.h"',
    sources=[rel(HERE, s) for s in ("nicd_packet.c", "nicd_flows.c", "nicd_queue.c")]
    + [rel(CODECS, s) for s in ("inceptionn_codec.c", "inceptionn_codec_avx2.c")],
    include_dirs=[rel(HERE), rel(CODECS)],
    libraries=["netfilter_queue", "nfnetlink", "pthread"],
    extra_compile_args=["-O3", "-std=gnu11", "-Wall", "-Wextra", "-fno-strict-aliasing", "-ffp-contract=off"],  # as the codecs
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
