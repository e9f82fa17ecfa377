"""The tagging contract and the other facts every part shares as Python sees them: the values of
inceptionn/inceptionn_contract.h, read through
the cffi binding built from that header (the C code includes the same file), so there is one
definition of each.

TOS_TAGGED       0x28  a gradient socket's packets (DSCP 10) whose sender scales them itself and
                       predicts the receiver's decode (the paper's codec mode; the collective)
TOS_SCALED       0x24  a gradient socket's raw float32 packets (DSCP 9): the soft NIC scales
                       each packet (codec 2); the shim's default
TOS_COMPRESSED   0x2c  on the wire: payload compressed by the soft NIC (DSCP 11)
TOS_HELLO        0x30  on SYN / SYN-ACK: "soft NIC here" (DSCP 12)
RULE_COMMENT           the soft NIC's queue rules: RULE_COMMENT + "-<queue base>"
FAILCLOSED_COMMENT     its persistent drops of compressed packets
QUEUE_BASE       7100  the first NFQUEUE number of a daemon
ERROR_BOUND_MIN, ERROR_BOUND_MAX, DEFAULT_ERROR_BOUND   -30, -1, -10: the INCEPTIONN codec's
                       error-bound exponents k (bound 2^k), their default (inceptionn.limits)
MAX_HEADROOM       24  the per-block scaling's largest headroom (inceptionn.limits)
NICD_SOCKET            the soft NIC's stats socket
"""
from __future__ import annotations

from ._policy import ffi, lib

TOS_TAGGED: int = lib.INCEPTIONN_TOS_TAGGED
TOS_SCALED: int = lib.INCEPTIONN_TOS_SCALED
TOS_COMPRESSED: int = lib.INCEPTIONN_TOS_COMPRESSED
TOS_HELLO: int = lib.INCEPTIONN_TOS_HELLO
RULE_COMMENT: str = ffi.string(lib.INCEPTIONN_RULE_COMMENT).decode()
FAILCLOSED_COMMENT: str = ffi.string(lib.INCEPTIONN_FAILCLOSED_COMMENT).decode()
QUEUE_BASE: int = lib.INCEPTIONN_QUEUE_BASE
ERROR_BOUND_MIN: int = lib.INCEPTIONN_ERROR_BOUND_MIN
ERROR_BOUND_MAX: int = lib.INCEPTIONN_ERROR_BOUND_MAX
DEFAULT_ERROR_BOUND: int = lib.INCEPTIONN_DEFAULT_ERROR_BOUND
MAX_HEADROOM: int = lib.INCEPTIONN_MAX_HEADROOM
NICD_SOCKET: str = ffi.string(lib.INCEPTIONN_NICD_SOCKET).decode()
