"""cffi build of the soft NIC's C data path into ``inceptionn.daemon._datapath``: the NFQUEUE
loop, the flow table and the packet transforms, linked with the codec and libnetfilter_queue."""
import os

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CODECS = os.path.join(ROOT, "codecs_c")


def rel(*parts):
    return os.path.relpath(os.path.join(*parts), ROOT)


def counter_names():
    """The enum nicd_counter names, in order, read from the header (one source of truth)."""
    names, inside = [], False
    with open(os.path.join(HERE, "nicd_queue.h")) as f:
        for line in f:
            if "enum nicd_counter" in line:
                inside = True
            elif inside and "NICD_NCOUNTERS" in line:
                return names
            elif inside:
                for part in line.split("/*")[0].split(","):
                    part = part.strip()
                    if part.startswith("NICD_C_"):
                        names.append(part)
    raise RuntimeError("enum nicd_counter not found")


CDEF = """
enum { NICD_HDR_LEN = 10, NICD_MAX_PACKET = 65535, NICD_MAX_VERDICT = 65531, NICD_OPT_LEN = 16,
       NICD_NONCE_LEN = 6 };
struct nicd_pkt {
    const uint8_t *ip; size_t len; size_t ihl; size_t thl; size_t payload_off; size_t payload_len;
    uint32_t saddr, daddr; uint16_t sport, dport; uint32_t seq, ack; uint8_t tcp_flags; uint8_t tos;
};
struct nicd_hello_opt {
    uint8_t version, role, codec, tos_compressed, orig_tos; int8_t error_bound; uint8_t nonce[6];
};
int nicd_find_option(const struct nicd_pkt *p, struct nicd_hello_opt *o);
ptrdiff_t nicd_add_option(const struct nicd_pkt *p, const struct nicd_hello_opt *o, uint8_t tos,
                          uint8_t *out, size_t cap);
ptrdiff_t nicd_strip_option(const struct nicd_pkt *p, size_t off, uint8_t tos, uint8_t *out, size_t cap);
int nicd_parse(const uint8_t *buf, size_t caplen, struct nicd_pkt *p);
ptrdiff_t nicd_compress(const struct nicd_pkt *p, uint32_t stream_off, int error_bound,
                        uint8_t tos, uint8_t *out, size_t cap, float *scratch, uint64_t *tiers);
ptrdiff_t nicd_compress_gso(const struct nicd_pkt *p, uint32_t stream_off, int error_bound,
                            uint8_t tos, size_t mtu, uint8_t *out, size_t cap, size_t *seg_len,
                            int *nsegs, int max_segs, float *scratch, uint8_t *stream, size_t stream_cap,
                            uint64_t *tiers);
ptrdiff_t nicd_restore(const struct nicd_pkt *p, uint8_t tos, uint8_t *out, size_t cap, float *scratch);
uint16_t nicd_tcp_checksum(const uint8_t *ip, size_t len);
uint32_t nicd_crc32c(uint32_t crc, const uint8_t *buf, size_t len);
const char *nicd_strerror(int result);

int nicd_flows_init(uint32_t capacity, uint32_t idle_timeout_s);
void nicd_flows_free(void);
uint32_t nicd_flows_expire(uint32_t *active, uint32_t *hellos);

struct nicd_config {
    uint16_t egress_queue, ingress_queue;
    uint8_t tos_tagged, tos_compressed, tos_hello;
    int error_bound;
    uint32_t queue_maxlen;
    int accept_only;
    int gso;
    volatile int stop;
    volatile int ready;
};
struct nicd_stats { volatile uint64_t c[%d]; };
int nicd_run(struct nicd_config *cfg, struct nicd_stats *st, char *err, size_t errlen);
""" % len(counter_names())

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "inceptionn.daemon._datapath",
    '#include "nicd_packet.h"\n#include "nicd_flows.h"\n#include "nicd_queue.h"',
    sources=[rel(HERE, s) for s in ("nicd_packet.c", "nicd_flows.c", "nicd_queue.c")]
    + [rel(CODECS, s) for s in ("inceptionn_codec.c", "inceptionn_codec_avx2.c")],
    include_dirs=[rel(HERE), rel(CODECS)],
    libraries=["netfilter_queue", "nfnetlink", "pthread"],
    extra_compile_args=["-O3", "-std=gnu11", "-Wall", "-Wextra", "-fno-strict-aliasing"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
