"""The tagging policy: which TCP sockets of a program get the gradient ToS.

Parsed by the C parser the preload library itself runs (shim/tag_policy.c, bound here with cffi),
so `inceptionn run` and `inceptionn mpirun` accept exactly the policies the library accepts,
with the same canonical form and the same reasons. Terms, comma separated, spaces around a term
allowed:

    all | none | port=N[-M] | lport=N[-M] | rport=N[-M] | net=ADDR[/LEN]     selectors (any matches)
    tos=V (default 0x24)    override=keep|allow (default keep)              options, at most once

``tos`` is a multiple of 4 from 4 to 252, but not DSCP 11 (0x2c) or 12 (0x30): those are the soft
NIC's own marks on the wire (compressed data, handshake).

    >>> parse_policy("port=23000-23099").canonical
    'port=23000-23099,tos=0x24,override=keep'
    >>> parse_policy("port=23000, tos=0x28").canonical
    'port=23000,tos=0x28,override=keep'
"""
from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass, field

from inceptionn.errors import UserError

from ._policy import ffi, lib

MAX_POLICY = lib.TAG_POLICY_MAX_LEN
MAX_TERMS = lib.TAG_POLICY_MAX_TERMS
# enum tag_kind -> the name a policy writes
KINDS = {lib.TAG_ALL: "all", lib.TAG_NONE: "none", lib.TAG_PORT: "port", lib.TAG_LPORT: "lport",
         lib.TAG_RPORT: "rport", lib.TAG_NET: "net"}


class PolicyError(UserError):
    """A policy string the shim would refuse; str() is the reason alone."""


@dataclass(frozen=True)
class Term:
    kind: str                      # a value of KINDS
    text: str                      # as the canonical form writes it, e.g. "port=23000-23099"
    lo: int = 0                    # port terms
    hi: int = 0
    network: ipaddress.IPv4Network | ipaddress.IPv6Network | None = None

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class Policy:
    terms: tuple[Term, ...]
    tos: int
    keep: bool
    canonical: str                 # parses to itself; what INCEPTIONN_TAG is set to
    text: str = field(default="", compare=False)

    def __str__(self) -> str:
        return self.canonical

    @property
    def selects_all(self) -> bool:
        return any(t.kind == "all" for t in self.terms)

    @property
    def is_none(self) -> bool:
        return any(t.kind == "none" for t in self.terms)

    def nets(self) -> list:
        return [t.network for t in self.terms if t.kind == "net"]

    def port_ranges(self) -> list[tuple[str, int, int]]:
        """(kind, lo, hi) of every port selector."""
        return [(t.kind, t.lo, t.hi) for t in self.terms if t.kind in ("port", "lport", "rport")]


def _text(write, obj, size: int) -> str:
    buf = ffi.new("char[]", size)
    write(obj, buf, size)
    return ffi.string(buf).decode()


def _term(t) -> Term:
    """A Term from a ``struct tag_term *``."""
    kind = KINDS[t.kind]
    network = None
    if kind == "net":
        addr = bytes(ffi.buffer(t.addr))
        network = (ipaddress.IPv4Network((addr[:4], t.plen)) if t.family == socket.AF_INET
                   else ipaddress.IPv6Network((addr, t.plen)))
    return Term(kind, _text(lib.tag_term_text, t, 128), t.lo, t.hi, network)


def parse_policy(text: str) -> Policy:
    """Parse and check a policy; raises PolicyError with the library's reason."""
    # Every character the C parser refuses stays a non-ASCII byte at the same position (all
    # before it are ASCII), so its reason names the position the user sees.
    raw = text.encode("utf-8", "surrogatepass")
    p = ffi.new("struct tag_policy *")
    err = ffi.new("char[]", lib.TAG_ERROR_MAX)
    if lib.tag_policy_parse(raw, len(raw), p, err, len(err)) != 0:
        raise PolicyError(ffi.string(err).decode())
    terms = tuple(_term(p.t + i) for i in range(p.n))
    return Policy(terms, p.tos, bool(p.keep), _text(lib.tag_policy_text, p, lib.TAG_POLICY_TEXT_MAX), text)


def check_policy(text: str) -> Policy:
    """parse_policy for the CLI: the error names the policy, as the library's does."""
    try:
        return parse_policy(text)
    except PolicyError as exc:
        raise UserError(f"bad tag policy '{_shown(text)}': {exc}") from None


def _shown(text: str) -> str:
    """A user's value as an error line may print it: at most 200 characters, printable ASCII."""
    shown = text if len(text) <= 200 else text[:200] + "..."
    return "".join(c if " " <= c <= "~" else "?" for c in shown)


# --- INCEPTIONN_TAG_LOG ---------------------------------------------------------------------------

def check_log(value: str) -> str:
    """Validate an INCEPTIONN_TAG_LOG value as the library does: 0, 1, 2, /PATH or LEVEL:/PATH."""
    raw = value.encode("utf-8", "surrogatepass")
    level, path = ffi.new("int *"), ffi.new("char[]", lib.TAG_LOG_PATH_MAX)
    if lib.tag_log_parse(raw, len(raw), level, path, len(path)) != 0:
        raise UserError(f"bad tag log '{_shown(value)}': use 0, 1, 2, an absolute file path, or LEVEL:PATH")
    return value
