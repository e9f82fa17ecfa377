"""Emulate a slow or lossy link on one interface's egress: rate, delay, jitter, loss.

Layout of what gets installed (handles chosen so that ``clear`` and ``show`` recognise ours):

    root htb 1ce0: (default class 1ce0:1)    <- the rate
      class htb 1ce0:1 rate R burst B
        qdisc netem 1ce1:                     <- delay/jitter/loss, only where netem exists

Without a rate, netem (if needed) is the root qdisc, handle 1ce0:. Without netem in the kernel
(this project's CI kernel), delay and jitter are refused with a clear message, and loss is done
by iptables ``-m statistic`` rules (see lossrules.py).

Setting a link replaces whatever shaping the interface had: the arguments of one call are the
whole configuration. Everything ``show`` reports is read back from the kernel.
"""
from __future__ import annotations

import ctypes
import errno
import functools
import math
import os
import re
from dataclasses import asdict, dataclass

from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl.tcmsg import common as tc_common

from inceptionn.errors import UserError

from . import lossrules
from . import netns as ns
from .units import format_percent, format_rate, format_time, parse_percent, parse_rate, parse_time

ROOT_HANDLE = 0x1CE00000   # "1ce0:"
RATE_CLASS = 0x1CE00001    # "1ce0:1"
NETEM_HANDLE = 0x1CE10000  # "1ce1:"
TC_H_ROOT = 0xFFFFFFFF

# Rate burst: the bytes a class may send back to back after it was idle. It must cover the
# lateness of the qdisc watchdog and softirq (HZ=250 here, a busy 2-core host): tokens earned
# while a late timer kept the class waiting are kept only up to the burst. Measured with
# iperf3 between testbed hosts at 1 Gbit, MTU 1500: a burst of 1 frame gives 90.1% of the
# rate, 10 frames 94.7%, 5 ms of traffic 95.5%, which is all TCP can get (1448 payload bytes
# per 1514-byte frame). Bigger bursts gain nothing and make the link burstier (at 10 Mbit,
# 20-50 ms bursts even cost ~1% as queues and iperf3's measuring window stretch). At least two
# frames, so jumbo frames pass smoothly at low rates.
BURST_TIME_S = 0.005
BURST_MIN_FRAMES = 2
# Headers the qdisc layer charges per GSO segment (Ethernet + IPv4 + TCP with options).
_SEGMENT_HEADERS = 14 + 20 + 60


@dataclass
class LinkState:
    """What the kernel says is configured on an interface."""

    ifname: str
    netns: str | None
    root_qdisc: str | None          # kind of the root qdisc, None for the device default
    managed: bool                   # root qdisc is one inceptionn installed
    rate_bps: int | None = None     # bit/s
    burst_bytes: int | None = None
    quantum_bytes: int | None = None
    delay_us: int | None = None
    jitter_us: int | None = None
    loss_percent: float | None = None
    loss_method: str | None = None  # "netem" or "iptables-statistic"
    loss_rules: int = 0             # number of iptables rules carrying the loss

    def to_dict(self) -> dict:
        d = asdict(self)
        d["rate"] = format_rate(self.rate_bps) if self.rate_bps else None
        return d

    def describe(self) -> str:
        where = f" (netns {self.netns})" if self.netns else ""
        lines = [f"interface: {self.ifname}{where}"]
        if self.rate_bps:
            lines.append(f"rate: {format_rate(self.rate_bps)} (htb, burst {self.burst_bytes} bytes, "
                         f"quantum {self.quantum_bytes} bytes)")
        else:
            lines.append("rate: unlimited")
        lines.append(f"delay: {format_time(self.delay_us)}" if self.delay_us else "delay: none")
        if self.jitter_us:
            lines.append(f"jitter: {format_time(self.jitter_us)}")
        if self.loss_percent:
            how = ("netem" if self.loss_method == "netem"
                   else f"iptables -m statistic, {self.loss_rules} rule{'s' if self.loss_rules != 1 else ''}")
            lines.append(f"loss: {format_percent(self.loss_percent)} ({how})")
        else:
            lines.append("loss: none")
        if self.root_qdisc and not self.managed:
            lines.append(f"note: root qdisc {self.root_qdisc} was not installed by inceptionn")
        return "\n".join(lines)


def burst_and_quantum(rate_bps: int, mtu: int, gso_max_size: int = 65536) -> tuple[int, int]:
    """HTB burst and quantum (bytes) for this rate and MTU.

    burst: BURST_TIME_S of traffic, at least BURST_MIN_FRAMES Ethernet frames of this MTU.
    A GSO super-packet larger than the burst is still sent whole; HTB lets the class go into
    debt for it, so the long-run rate holds. quantum: one GSO super-packet with the headers of
    each segment, the most HTB is ever handed at once, so a class (if a later user adds
    siblings) is served whole packets per round.
    """
    frame = mtu + 14
    burst = max(math.ceil(rate_bps / 8 * BURST_TIME_S), BURST_MIN_FRAMES * frame)
    segments = math.ceil(gso_max_size / max(mtu - 40, 1))
    quantum = max(frame, gso_max_size + segments * _SEGMENT_HEADERS)
    return burst, quantum


# --- netem availability ----------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def netem_available() -> bool:
    """Whether the kernel has the netem qdisc.

    Probed in a child process inside a throwaway network namespace (on its loopback), so a
    missing netem is known before anything on the real interface changes.
    """
    pid = os.fork()
    if pid == 0:  # child: never returns
        code = 3
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.unshare(0x40000000) != 0:  # CLONE_NEWNET
                os._exit(4)
            from pyroute2 import IPRoute
            with IPRoute() as ipr:
                ipr.tc("add", "netem", 1, 0x10000, delay=1000)
            code = 0
        except NetlinkError as exc:
            code = 3 if exc.code in (errno.ENOENT, errno.EOPNOTSUPP, errno.EINVAL) else 4
        except BaseException:
            code = 4
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code == 4:  # the probe itself failed (e.g. not root); let the real request decide
        return True
    return code == 0


NETEM_MISSING = ("this kernel has no netem qdisc (CONFIG_NET_SCH_NETEM), so {what} cannot be emulated; "
                 "--rate and --loss still work")


# --- guards for the command line ----------------------------------------------------------------

# PROC_NET_INIT_INO (include/linux/proc_ns.h): the root network namespace's fixed inode on
# recent kernels; older ones number it like any other namespace.
INIT_NET_INO = 0xEFFFFFF9


def is_root_netns(netns: str | None) -> bool:
    """Whether ``netns`` (a name under /run/netns; None: this process's namespace) is the
    machine's root network namespace, the one holding its real NICs: PID 1's namespace, or where
    PID 1 is not visible (a sandbox, no privileges) the one with the kernel's fixed inode."""
    try:
        mine = os.stat(f"/run/netns/{netns}" if netns else "/proc/self/ns/net")
    except FileNotFoundError:  # no such namespace: shape() says so in its own words
        return False
    try:
        init = os.stat("/proc/1/ns/net")
    except PermissionError:
        return mine.st_ino == INIT_NET_INO
    return (mine.st_dev, mine.st_ino) == (init.st_dev, init.st_ino)


_BYTE_PREFIXES = {"": "", "k": "kilo", "m": "mega", "g": "giga", "t": "tera",
                  "ki": "kibi", "mi": "mebi", "gi": "gibi", "ti": "tebi"}


def bytes_rate_warning(flag: str, text: str | None) -> str | None:
    """A warning when a rate is written in tc's bytes-per-second units (100mbps is 100 megaBYTES
    per second, 800mbit), the usual slip for megabits; None for bit units and no rate."""
    m = re.fullmatch(r"\s*([0-9.eE+-]+)\s*([kmgt]?i?)bps\s*", text or "", re.IGNORECASE)
    if not m:
        return None
    number, prefix = m.group(1), m.group(2).lower()
    return (f"{flag} {text.strip()} means {_BYTE_PREFIXES.get(prefix, prefix)}bytes per second "
            f"({format_rate(parse_rate(text))}), tc's convention; for {_BYTE_PREFIXES.get(prefix, prefix)}bits per second write "
            f"{number}{prefix}bit")


# --- kernel access helpers -------------------------------------------------------------------

def _link(ipr, ifname: str, netns: str | None):
    found = ipr.link_lookup(ifname=ifname)
    if not found:
        where = f"network namespace {netns!r}" if netns else "this network namespace"
        raise UserError(f"no interface {ifname!r} in {where}")
    return ipr.get_links(found[0])[0]


def _is_bridge_port(ipr, link) -> bool:
    master = link.get_attr("IFLA_MASTER")
    if not master:
        return False
    parent = ipr.get_links(master)[0]
    return parent.get_nested("IFLA_LINKINFO", "IFLA_INFO_KIND") == "bridge"


def _root_qdisc(ipr, index: int):
    for q in ipr.get_qdiscs(index):
        if q["parent"] == TC_H_ROOT:
            return q
    return None


def _ticks_to_us(ticks: int) -> float:
    return ticks / tc_common.tick_in_usec


def _as_rate(rate) -> int | None:
    if rate is None or isinstance(rate, int):
        if rate is not None and rate <= 0:
            raise UserError(f"bad rate {rate!r}: must be greater than zero")
        return rate
    return parse_rate(rate)


def _as_time(value) -> int | None:
    if value is None or isinstance(value, int):
        if value is not None and value < 0:
            raise UserError(f"bad time {value!r}: must not be negative")
        return value
    return parse_time(value)


def _as_percent(value) -> float | None:
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return parse_percent(repr(float(value)))
    return parse_percent(value)


# --- the three operations ---------------------------------------------------------------------

def shape(ifname: str, *, netns: str | None = None, rate=None, delay=None, jitter=None, loss=None) -> LinkState:
    """Make ``ifname``'s egress a link of this rate/delay/jitter/loss (replacing old settings).

    rate: bit/s (int) or a tc string like "100mbit"; delay, jitter: microseconds (int) or
    "2ms"; loss: percent (number) or "0.5%". None leaves that aspect off.
    """
    rate_bps = _as_rate(rate)
    delay_us = _as_time(delay) or 0
    jitter_us = _as_time(jitter) or 0
    loss_pct = _as_percent(loss) or 0.0
    if jitter_us and not delay_us:
        raise UserError("--jitter needs --delay (jitter varies the delay around its mean)")
    if jitter_us > delay_us:
        raise UserError("--jitter must not exceed --delay (a packet cannot leave before it was sent)")
    if not (rate_bps or delay_us or loss_pct):
        raise UserError("nothing to set: give --rate, --delay or --loss (or --clear to remove shaping)")

    with ns.ipr(netns) as ipr:
        link = _link(ipr, ifname, netns)
        index = link["index"]
        # decided before touching the interface, so a refusal leaves it as it was
        if delay_us and not netem_available():
            raise UserError(NETEM_MISSING.format(what="--delay/--jitter"))
        want_netem = bool(delay_us) or (bool(loss_pct) and netem_available())
        bridge_port = _is_bridge_port(ipr, link)

        _clear(ipr, index, ifname, netns, only_ours=False)
        try:
            netem_args = dict(delay=delay_us, jitter=jitter_us, loss=loss_pct if want_netem else 0)
            if rate_bps:
                mtu = link.get_attr("IFLA_MTU") or 1500
                gso = link.get_attr("IFLA_GSO_MAX_SIZE") or 65536
                burst, quantum = burst_and_quantum(rate_bps, mtu, gso)
                ipr.tc("add", "htb", index, ROOT_HANDLE, default=RATE_CLASS & 0xFFFF)
                ipr.tc("add-class", "htb", index, RATE_CLASS, parent=ROOT_HANDLE, rate=rate_bps // 8,
                       burst=burst, cburst=burst, quantum=quantum, mtu=mtu + 14)
                if want_netem:
                    ipr.tc("add", "netem", index, NETEM_HANDLE, parent=RATE_CLASS, **netem_args)
            elif want_netem:
                ipr.tc("add", "netem", index, ROOT_HANDLE, **netem_args)
            if loss_pct and not want_netem:
                lossrules.add(netns, ifname, loss_pct, bridge_port=bridge_port)
        except NetlinkError as exc:
            _clear(ipr, index, ifname, netns, only_ours=True)
            raise UserError(f"{ifname}: the kernel refused the shaping: {exc.args[-1]}") from None
        except BaseException:
            _clear(ipr, index, ifname, netns, only_ours=True)
            raise
    return show(ifname, netns=netns)


def clear(ifname: str, *, netns: str | None = None) -> bool:
    """Remove the shaping inceptionn installed on ``ifname``; True if there was any."""
    with ns.ipr(netns) as ipr:
        link = _link(ipr, ifname, netns)
        return _clear(ipr, link["index"], ifname, netns, only_ours=True)


def _clear(ipr, index: int, ifname: str, netns: str | None, *, only_ours: bool) -> bool:
    removed = lossrules.remove(netns, ifname) > 0
    root = _root_qdisc(ipr, index)
    # handle 0 is the device's built-in default (noqueue, pfifo_fast, mq): nothing to delete
    if root is not None and root["handle"] != 0 and (root["handle"] == ROOT_HANDLE or not only_ours):
        try:
            ipr.tc("del", index=index, handle=root["handle"], parent=TC_H_ROOT)
            removed = True
        except NetlinkError as exc:
            if exc.code not in (errno.ENOENT, errno.EINVAL):
                raise
    return removed


def show(ifname: str, *, netns: str | None = None) -> LinkState:
    """Read back the shaping of ``ifname`` from the kernel."""
    with ns.ipr(netns) as ipr:
        link = _link(ipr, ifname, netns)
        index = link["index"]
        root = _root_qdisc(ipr, index)
        state = LinkState(ifname=ifname, netns=netns, root_qdisc=None, managed=False)
        if root is not None and root["handle"] != 0:
            state.root_qdisc = root.get_attr("TCA_KIND")
            state.managed = root["handle"] == ROOT_HANDLE
        if state.managed:
            netem = None
            if state.root_qdisc == "htb":
                for cls in ipr.get_classes(index):
                    if cls["handle"] != RATE_CLASS:
                        continue
                    opts = cls.get_attr("TCA_OPTIONS")
                    parms = opts.get_attr("TCA_HTB_PARMS")
                    rate_Bps = opts.get_attr("TCA_HTB_RATE64") or parms["rate"]
                    state.rate_bps = rate_Bps * 8
                    state.burst_bytes = round(_ticks_to_us(parms["buffer"]) * rate_Bps / 1e6)
                    state.quantum_bytes = parms["quantum"]
                for q in ipr.get_qdiscs(index):
                    if q["handle"] == NETEM_HANDLE:
                        netem = q
            elif state.root_qdisc == "netem":
                netem = root
            if netem is not None:
                opts = netem.get_attr("TCA_OPTIONS")
                state.delay_us = round(_ticks_to_us(opts["delay"])) or None
                state.jitter_us = round(_ticks_to_us(opts["jitter"])) or None
                if opts["loss"]:
                    state.loss_percent = opts["loss"] / 0xFFFFFFFF * 100
                    state.loss_method = "netem"
    rules = lossrules.list_rules(netns, ifname)
    if rules and state.loss_method is None:
        state.loss_percent = lossrules.probability_percent(rules[0])
        state.loss_method = "iptables-statistic"
        state.loss_rules = len(rules)
    return state
