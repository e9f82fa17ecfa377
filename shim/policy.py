"""The tagging policy: which TCP sockets of a program get the gradient ToS.

The same grammar as the preload library (shim/inceptionn_tag.c, which checks it again when it
loads); the tests hold the two to the same canonical form and the same reasons. Terms, comma
separated, spaces around a term allowed:

    all | none | port=N[-M] | lport=N[-M] | rport=N[-M] | net=ADDR[/LEN]     selectors (any matches)
    tos=V (default 0x28)    override=keep|allow (default keep)              options, at most once

``tos`` is a multiple of 4 from 4 to 252, but not DSCP 11 (0x2c) or 12 (0x30): those are the soft
NIC's own marks on the wire (compressed data, handshake).

    >>> parse_policy("port=23000-23099").canonical
    'port=23000-23099,tos=0x28,override=keep'
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field

from inceptionn.errors import UserError

DEFAULT_TOS = 0x28
# The soft NIC's DSCPs on the wire (daemon/config.py defaults): refused as a program's mark.
WIRE_DSCPS = {11: "compressed data", 12: "its handshake"}
MAX_POLICY = 4096
MAX_TERMS = 32
SELECTORS = ("all", "none", "port", "lport", "rport", "net")
_UINT = re.compile(r"[0-9]+")
_HEX = re.compile(r"0[xX][0-9a-fA-F]{1,2}")


class PolicyError(UserError):
    """A policy string the shim would refuse; str() is the reason alone."""


@dataclass(frozen=True)
class Term:
    kind: str                      # one of SELECTORS
    lo: int = 0                    # port terms
    hi: int = 0
    network: ipaddress.IPv4Network | ipaddress.IPv6Network | None = None

    def __str__(self) -> str:
        if self.kind in ("all", "none"):
            return self.kind
        if self.kind == "net":
            return f"net={_addr_str(self.network.network_address)}/{self.network.prefixlen}"
        return f"{self.kind}={self.lo}" if self.lo == self.hi else f"{self.kind}={self.lo}-{self.hi}"


@dataclass(frozen=True)
class Policy:
    terms: tuple[Term, ...]
    tos: int = DEFAULT_TOS
    keep: bool = True
    text: str = field(default="", compare=False)

    @property
    def canonical(self) -> str:
        terms = ",".join(str(t) for t in self.terms)
        return f"{terms},tos=0x{self.tos:02x},override={'keep' if self.keep else 'allow'}"

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


def _addr_str(addr) -> str:
    """The address as glibc's inet_ntop writes it (IPv4-mapped and -compatible IPv6 addresses
    end in a dotted quad), so both parsers print the same canonical form."""
    if addr.version == 6:
        w = [int.from_bytes(addr.packed[i:i + 2], "big") for i in range(0, 16, 2)]
        dotted = str(ipaddress.IPv4Address(addr.packed[12:]))
        if w[:5] == [0] * 5 and w[5] == 0xFFFF:
            return f"::ffff:{dotted}"
        if w[:6] == [0] * 6 and w[6] != 0:
            return f"::{dotted}"
    return str(addr)


def _range(value: str | None) -> tuple[int, int] | None:
    if value is None:
        return None
    lo_s, dash, hi_s = value.partition("-")
    if not dash:
        hi_s = lo_s
    if not (_UINT.fullmatch(lo_s) and _UINT.fullmatch(hi_s) and len(lo_s) <= 5 and len(hi_s) <= 5):
        return None
    lo, hi = int(lo_s), int(hi_s)
    return (lo, hi) if 1 <= lo <= hi <= 65535 else None


def _net(term: str, value: str | None):
    bad = PolicyError(f"bad network '{term}': not an IPv4 or IPv6 address")
    if value is None:
        raise bad
    addr_s, slash, plen_s = value.rpartition("/") if "/" in value else (value, "", "")
    try:
        if "%" in addr_s or not addr_s:
            raise ValueError
        addr = ipaddress.IPv6Address(addr_s) if ":" in addr_s else ipaddress.IPv4Address(addr_s)
    except ValueError:
        raise bad from None
    maxp = addr.max_prefixlen
    plen = maxp
    if slash:
        if not (_UINT.fullmatch(plen_s) and len(plen_s) <= 3 and int(plen_s) <= maxp):
            raise PolicyError(f"bad network '{term}': prefix length must be 0-{maxp}")
        plen = int(plen_s)
    net = ipaddress.ip_network(f"{addr}/{plen}", strict=False)
    if net.network_address != addr:
        raise PolicyError(f"bad network '{term}': host bits set (did you mean {_addr_str(net.network_address)}/{plen}?)")
    return net


def _tos(value: str | None) -> int | None:
    if value is None:
        return None
    if _HEX.fullmatch(value):
        x = int(value, 16)
    elif _UINT.fullmatch(value) and len(value) <= 3:
        x = int(value)
    else:
        return None
    return x if 4 <= x <= 252 and x % 4 == 0 else None


def parse_policy(text: str) -> Policy:
    """Parse and check a policy; raises PolicyError with the same reason the C library gives."""
    if len(text) > MAX_POLICY:
        raise PolicyError(f"policy too long ({len(text)} characters, at most {MAX_POLICY})")
    for i, ch in enumerate(text):
        if not " " <= ch <= "~":
            raise PolicyError(f"non-printable or non-ASCII character at position {i}")
    if not text.strip(" "):
        raise PolicyError("empty policy")
    terms: list[Term] = []
    tos = keep = None
    for raw in text.split(","):
        term = raw.strip(" ")
        if not term:
            raise PolicyError("empty term (two commas in a row, or a comma at an end)")
        key, eq, value = term.partition("=")
        value = value if eq else None
        if key in ("all", "none"):
            if eq:
                raise PolicyError(f"'{key}' takes no value")
            terms.append(Term(key))
        elif key in ("port", "lport", "rport"):
            rng = _range(value)
            if rng is None:
                raise PolicyError(f"bad port range '{term}': use N or N-M with 1 <= N <= M <= 65535")
            terms.append(Term(key, *rng))
        elif key == "net":
            terms.append(Term("net", network=_net(term, value)))
        elif key == "tos":
            if tos is not None:
                raise PolicyError("'tos' given twice")
            tos = _tos(value)
            if tos is None:
                raise PolicyError(f"bad tos '{term}': use a multiple of 4 from 4 to 252 "
                                  "(the low 2 bits are ECN), e.g. tos=0x28")
            if tos >> 2 in WIRE_DSCPS:
                raise PolicyError(f"bad tos '{term}': DSCP {tos >> 2} is the soft NIC's own mark for "
                                  f"{WIRE_DSCPS[tos >> 2]} on the wire; pick another, e.g. tos=0x28")
        elif key == "override":
            if keep is not None:
                raise PolicyError("'override' given twice")
            if value not in ("keep", "allow"):
                raise PolicyError(f"bad override '{term}': use keep or allow")
            keep = value == "keep"
        else:
            raise PolicyError(f"unknown term '{term}' (expected all, none, port=, lport=, rport=, net=, tos=, override=)")
        if len(terms) > MAX_TERMS:
            raise PolicyError(f"too many selectors (at most {MAX_TERMS})")
    if not terms:
        raise PolicyError("no selector: give all, none, port=, lport=, rport= or net=")
    kinds = [t.kind for t in terms]
    if "none" in kinds and len(terms) > 1:
        raise PolicyError("'none' cannot be combined with other selectors")
    if "all" in kinds and len(terms) > 1:
        raise PolicyError("'all' cannot be combined with other selectors (it already covers every TCP socket)")
    return Policy(tuple(terms), DEFAULT_TOS if tos is None else tos, True if keep is None else keep, text)


def check_policy(text: str) -> Policy:
    """parse_policy for the CLI: the error names the policy, as the library's does."""
    try:
        return parse_policy(text)
    except PolicyError as exc:
        shown = text if len(text) <= 200 else text[:200] + "..."
        shown = "".join(c if " " <= c <= "~" else "?" for c in shown)
        raise UserError(f"bad tag policy '{shown}': {exc}") from None


# --- INCEPTIONN_TAG_LOG ---------------------------------------------------------------------------

def check_log(value: str) -> str:
    """Validate an INCEPTIONN_TAG_LOG value as the library does: 0, 1, 2, /PATH or LEVEL:/PATH."""
    if value == "" or (value[:1] in "012" and len(value) == 1):
        return value
    path = value[2:] if value[:1] in "012" and value[1:2] == ":" else value
    if not path.startswith("/") or len(path) >= 1024:
        raise UserError(f"bad tag log '{value}': use 0, 1, 2, an absolute file path, or LEVEL:PATH")
    return value
