"""Every nicd setting, described once: its name (the TOML key; --name-with-dashes is its flag),
default, range, help text, whether SIGHUP applies it, whether `inceptionn stats` shows it, and the
field of the C struct nicd_config (daemon/nicd_queue.h) it is copied to. NicdConfig and its checks
(config.py), the flags (cli.py), the stats snapshot and the reload (nicd.py) and the copy into C
(datapath.py) are derived from this table.

Light on purpose: the CLI builds nicd's flags from it, so it imports nothing heavier than the
tagging contract's marks."""
from __future__ import annotations

from collections import namedtuple

from ..limits import DEFAULT_ERROR_BOUND, ERROR_BOUND_MAX, ERROR_BOUND_MIN
from ..shim import contract

LOG_LEVELS = ("debug", "info", "warning", "error")
CODECS = ("inceptionn",)  # codecs that are stateless per packet (docs/wire-format.md)

# kind: "list" (of interface names), "mark" (a ToS byte), "int" (lo..hi), "choice" (choices),
# "path", "textfile" ("" or an absolute *.prom path), "switch" (a flag that sets true), "onoff" (true
# or false, on by default: --name and --no-name), "gso" (true, false or "auto")
Setting = namedtuple("Setting", "name default kind help metavar lo hi choices reload stats c_field",
                     defaults=(None, None, None, None, False, False, None))

SETTINGS = (
    Setting("interfaces", (), "list", "interface to manage (repeatable)", "IFACE", stats=True),
    Setting("tos", contract.TOS_TAGGED, "mark", "the gradient mark of senders that scale their values "
            "themselves (the paper's codec; the collective), as a ToS byte", "BYTE", stats=True, c_field="tos_tagged"),
    Setting("tos_scaled", contract.TOS_SCALED, "mark", "the gradient mark of senders of raw float32 values, the "
            "shim's default: each packet is scaled by a power of two", "BYTE", stats=True, c_field="tos_scaled"),
    Setting("tos_compressed", contract.TOS_COMPRESSED, "mark", "the mark of compressed packets on the wire",
            "BYTE", stats=True, c_field="tos_compressed"),
    Setting("tos_hello", contract.TOS_HELLO, "mark", "the mark on SYN / SYN-ACK that says 'soft NIC here'",
            "BYTE", stats=True, c_field="tos_hello"),
    Setting("codec", "inceptionn", "choice", "the codec; inceptionn is the one that works per packet", choices=CODECS,
            stats=True),
    Setting("error_bound", DEFAULT_ERROR_BOUND, "int", f"error bound 2^K, K from {ERROR_BOUND_MIN} to {ERROR_BOUND_MAX}", "K",
            ERROR_BOUND_MIN, ERROR_BOUND_MAX, reload=True, stats=True, c_field="error_bound"),
    Setting("queues", 1, "int", "queue pairs, one thread each; the rules spread flows over them by a hash of "
            "addresses and ports (one host pair's flows too; each flow keeps to one queue)", "N", 1, 64, stats=True),
    Setting("queue_base", contract.QUEUE_BASE, "int",
            "first NFQUEUE number: egress Q..Q+N-1, ingress the next N", "Q", 0, 65535 - 2 * 64, stats=True),
    Setting("queue_maxlen", 4096, "int", "packets each kernel queue holds before it drops", "PACKETS",
            16, 1 << 20, c_field="queue_maxlen"),
    Setting("flow_timeout", 300, "int", "seconds a flow may idle before its state is dropped", "SECONDS",
            1, 86400 * 7),
    Setting("flow_capacity", 65536, "int", "flows the flow table holds", "FLOWS", 64, 1 << 24),
    Setting("flow_owner_cap", 4096, "int", "negotiated flows one owner may hold at once (the local user whose "
            "socket opened them, else the peer host that did); past it new flows stay raw", "FLOWS", 1, 1 << 24),
    Setting("log_level", "info", "choice", "what the daemon logs", choices=LOG_LEVELS, reload=True),
    Setting("socket", contract.NICD_SOCKET, "path", "stats socket", "PATH"),
    Setting("accept_only", False, "switch", "diagnostic: queue tagged packets both ways and accept them "
            "unchanged (measures the queue's own cost; compresses nothing)", c_field="accept_only"),
    Setting("gso", "auto", "gso", "fast path: take TSO/GSO super-packets (up to 64 KB) on egress and send each "
            "as the fewest compressed packets that fit the path MTU; refuse to start without CAP_NET_RAW "
            "(default: gso = \"auto\", on when the daemon has CAP_NET_RAW, else per packet)",
            stats=True, c_field="gso"),
    Setting("trains", True, "onoff", "wire format v3: send each super-packet of a flow whose peer says it "
            "restores trains as one compressed segment train in its verdict (with gso), and take GRO-merged "
            "trains whole on ingress; --no-trains: format v2 only",
            stats=True, c_field="trains"),
    Setting("metrics_textfile", "", "textfile", "write the counters to PATH (*.prom, in node_exporter's textfile "
            "collector directory) every metrics_interval seconds, atomically; removed on stop", "PATH"),
    Setting("metrics_interval", 15, "int", "seconds between two writes of the metrics textfile", "SECONDS", 1, 3600),
)

BY_NAME = {s.name: s for s in SETTINGS}
DEFAULT_SOCKET = BY_NAME["socket"].default


def shown(s: Setting) -> str:
    """The default as the help and the docs write it: marks in hex with their DSCP."""
    if s.kind == "mark":
        return f"{s.default:#04x}, DSCP {s.default >> 2}"
    return str(s.default) if s.default != "" else "none"
