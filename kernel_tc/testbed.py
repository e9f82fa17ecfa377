"""A multi-host testbed made of network namespaces, Mininet-style.

    inc-<name>-h1  eth0 198.18.0.1 --veth-- h1 \\
    inc-<name>-h2  eth0 198.18.0.2 --veth-- h2  }- br0   (all in namespace inc-<name>-sw)
    ...                                        /

Every link is shaped in both directions: on the host's eth0 (host -> switch) and on the
switch port hN (switch -> host). Each host's eth0 merges what it receives (GRO on, as a real NIC's
is by default; a veth's is off): the soft NIC's segment trains arrive merged, one queue pass each. Hosts have loopback up, one address in the testbed prefix
and no default route, so they reach each other and nothing else.

Nothing is created in the root namespace and no state file is kept: every namespace of a
testbed starts with ``inc-<name>-``, so ``down`` finds everything by prefix, also after a
crashed run, and ``attach``/``status`` read the topology back from the kernel.

    from inceptionn.kernel_tc.testbed import Testbed
    with Testbed(hosts=4, rate="100mbit", mtu=9000) as tb:
        h1, h2 = tb.hosts[0], tb.hosts[1]
        server = h2.popen(["iperf3", "-s", "-1"])
        h1.run(["ping", "-c1", h2.ip], check=True)

With ``ipv6=True`` every host also gets an address on 2001:2::/64 (``Host.ip6``, e.g.
2001:2::1 for h1; RFC 5180's benchmarking prefix 2001:2::/48, the IPv6 twin of 198.18.0.0/15),
without duplicate address detection or router solicitations, so it is usable at once. Off by
default: programs that pick any address of a host (OpenMPI) would start using IPv6 too.
"""
from __future__ import annotations

import ipaddress
import re
import subprocess
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from inceptionn.errors import UserError

from . import link
from . import netns as ns
from .units import format_rate, parse_rate

NS_PREFIX = "inc-"
DEFAULT_NAME = "tb"
DEFAULT_PREFIX = "198.18.0.0/24"
# RFC 2544 benchmarking range: testbed traffic can never reach a real network by accident.
BENCHMARK_NET = ipaddress.ip_network("198.18.0.0/15")
# RFC 5180 benchmarking prefix: the same for IPv6. The flat testbed uses its first /64, the
# routed one a /64 per host.
BENCHMARK_NET6 = ipaddress.ip_network("2001:2::/48")
DEFAULT_PREFIX6 = ipaddress.ip_network("2001:2::/64")
# Test addresses are usable at once (no DAD wait) and hosts send no router solicitations.
_IPV6_SYSCTLS = [f"net.ipv6.conf.{dev}.{key}={value}" for dev in ("all", "default")
                 for key, value in (("accept_dad", 0), ("router_solicitations", 0))]
IFA_F_NODAD = 0x02  # linux/if_addr.h
HOST_IFNAME = "eth0"
BRIDGE = "br0"

_NAME_RE = re.compile(r"[A-Za-z0-9_]{1,24}")  # no '-': it separates name and role in ns names
_HOST_NS_RE = re.compile(r"h(\d+)")


def _prefix(name: str) -> str:
    return f"{NS_PREFIX}{name}-"


def switch_netns(name: str) -> str:
    return f"{_prefix(name)}sw"


def host_netns(name: str, i: int) -> str:
    return f"{_prefix(name)}h{i}"


def check_name(name: str) -> str:
    if not _NAME_RE.fullmatch(name or ""):
        raise UserError(f"bad testbed name {name!r}: use 1-24 letters, digits or '_'")
    return name


@dataclass
class Host:
    """One testbed host: a namespace with one interface on the testbed network."""

    name: str          # "h1"
    netns: str         # "inc-tb-h1"
    ifname: str        # interface inside the namespace
    ip: str
    prefixlen: int
    mtu: int
    rate_bps: int | None  # shaping of this host's link (both directions), None if unshaped
    switch_port: str   # the link's other end, inside the switch namespace
    ip6: str | None = None  # its IPv6 address (prefix length 64) on a testbed built with ipv6=True

    def command(self, argv: Sequence[str], *, hostname: str | None = None) -> list[str]:
        """argv that runs ``argv`` inside this host (see netns.command for ``hostname``)."""
        return ns.command(self.netns, argv, hostname=hostname)

    def popen(self, argv: Sequence[str], *, hostname: str | None = None, **kwargs) -> subprocess.Popen:
        return ns.popen(self.netns, argv, hostname=hostname, **kwargs)

    def run(self, argv: Sequence[str], *, hostname: str | None = None, **kwargs) -> subprocess.CompletedProcess:
        return ns.run(self.netns, argv, hostname=hostname, **kwargs)

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "netns": self.netns,
            "interface": self.ifname,
            "address": self.ip,
            "prefixlen": self.prefixlen,
            "mtu": self.mtu,
            "rate": format_rate(self.rate_bps) if self.rate_bps else None,
            "rate_bps": self.rate_bps,
            "switch_port": self.switch_port,
            **({"address6": self.ip6} if self.ip6 else {}),  # only on an ipv6=True testbed
        }


class Testbed:
    """N hosts joined through a bridge, each link shaped to ``rate`` in both directions.

    Use as a context manager (``down`` runs on exit, also when the block raised), or call
    ``up()`` and ``down()`` yourself. ``Testbed.attach(name)`` describes one already running.
    """

    def __init__(self, hosts: int = 2, rate: str | int | None = None, mtu: int = 1500,
                 prefix: str = DEFAULT_PREFIX, name: str = DEFAULT_NAME,
                 progress: Callable[[str], None] | None = None, ipv6: bool = False):
        self.name = check_name(name)
        self.ipv6 = bool(ipv6)
        self.n_hosts = int(hosts)
        if self.n_hosts < 1:
            raise UserError(f"--hosts must be at least 1, not {self.n_hosts}")
        self.rate_bps = (rate if isinstance(rate, int) else parse_rate(rate)) if rate is not None else None
        if self.rate_bps is not None and self.rate_bps <= 0:
            raise UserError("bad rate: must be greater than zero")
        self.mtu = int(mtu)
        if not 68 <= self.mtu <= 65535:
            raise UserError(f"bad MTU {self.mtu}: must lie between 68 and 65535")
        self.network = _check_prefix(prefix, self.n_hosts)
        self.progress = progress or (lambda msg: None)
        self.hosts: list[Host] = []
        self.switch = switch_netns(self.name)

    # --- lifecycle ---------------------------------------------------------------------------

    def up(self) -> "Testbed":
        existing = ns.list_netns(_prefix(self.name))
        if existing:
            down_cmd = "inceptionn testbed down" + ("" if self.name == DEFAULT_NAME else f" --name {self.name}")
            raise UserError(f"testbed {self.name!r} already exists ({', '.join(existing)}); "
                            f"run `{down_cmd}` first")
        started = time.monotonic()
        self._created: list[str] = []
        try:
            self._build()
        except BaseException:
            self.progress(f"testbed {self.name}: setup failed, removing what was created")
            # only what this call made: a concurrent `up` of the same name keeps its own
            for netns_name in reversed(self._created):
                try:
                    ns.delete(netns_name)
                except Exception:  # report the first failure, not a follow-up of it
                    pass
            self.hosts = []
            raise
        self.progress(f"testbed {self.name}: {self.n_hosts} hosts up on {self.network}, "
                      f"rate {format_rate(self.rate_bps) if self.rate_bps else 'unlimited'}, "
                      f"mtu {self.mtu} ({time.monotonic() - started:.1f}s)")
        return self

    def down(self) -> list[str]:
        """Remove every namespace of this testbed (and with them links, qdiscs, rules)."""
        self.hosts = []
        return teardown(self.name)

    def __enter__(self) -> "Testbed":
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()

    def _build(self) -> None:
        self.progress(f"testbed {self.name}: creating switch {self.switch}")
        self._create_ns(self.switch)
        with ns.ipr(self.switch) as sw:
            sw.link("set", index=sw.link_lookup(ifname="lo")[0], state="up")
            sw.link("add", ifname=BRIDGE, kind="bridge")
            bridge = sw.link_lookup(ifname=BRIDGE)[0]
            for i in range(1, self.n_hosts + 1):
                self.progress(f"testbed {self.name}: host h{i}/{self.n_hosts}")
                self.hosts.append(self._add_host(sw, bridge, i))
            sw.link("set", index=bridge, mtu=self.mtu, state="up")

    def _create_ns(self, netns_name: str) -> None:
        ns.create(netns_name)
        self._created.append(netns_name)
        if self.ipv6:  # before its links exist: "default" is what they start with
            ns.run(netns_name, ["sysctl", "-q", "-w", *_IPV6_SYSCTLS], check=True)

    def _add_host(self, sw, bridge: int, i: int) -> Host:
        host_ns = host_netns(self.name, i)
        port = f"h{i}"
        ip = str(self.network.network_address + i)
        ip6 = str(DEFAULT_PREFIX6.network_address + i) if self.ipv6 else None
        self._create_ns(host_ns)
        # created inside the switch namespace with the peer born in the host: nothing ever
        # appears in the root namespace, even for a moment
        sw.link("add", ifname=port, kind="veth", peer={"ifname": HOST_IFNAME, "net_ns_fd": host_ns})
        port_index = sw.link_lookup(ifname=port)[0]
        sw.link("set", index=port_index, mtu=self.mtu, master=bridge, state="up")
        with ns.ipr(host_ns) as h:
            h.link("set", index=h.link_lookup(ifname="lo")[0], state="up")
            eth = h.link_lookup(ifname=HOST_IFNAME)[0]
            h.link("set", index=eth, mtu=self.mtu, state="up")
            h.addr("add", index=eth, address=ip, prefixlen=self.network.prefixlen)
            if ip6:
                h.addr("add", index=eth, address=ip6, prefixlen=64, flags=IFA_F_NODAD)
        _gro_on(host_ns)
        if self.rate_bps:
            link.shape(HOST_IFNAME, netns=host_ns, rate=self.rate_bps)
            link.shape(port, netns=self.switch, rate=self.rate_bps)
        return Host(name=f"h{i}", netns=host_ns, ifname=HOST_IFNAME, ip=ip,
                    prefixlen=self.network.prefixlen, mtu=self.mtu, rate_bps=self.rate_bps,
                    switch_port=port, ip6=ip6)

    # --- lookup --------------------------------------------------------------------------------

    def host(self, name: str) -> Host:
        for h in self.hosts:
            if h.name == name or h.netns == name:
                return h
        raise UserError(f"testbed {self.name!r} has no host {name!r} "
                        f"(hosts: {', '.join(h.name for h in self.hosts) or 'none'})")

    @classmethod
    def attach(cls, name: str = DEFAULT_NAME) -> "Testbed":
        """Describe a running testbed from what the kernel holds (no state file)."""
        check_name(name)
        names = ns.list_netns(_prefix(name))
        if not names:
            raise UserError(f"no testbed {name!r} is up (start one with `inceptionn testbed up`)")
        tb = cls.__new__(cls)
        tb.name, tb.switch, tb.progress, tb.hosts = name, switch_netns(name), (lambda m: None), []
        tb.router = None
        for netns_name in names:
            role = netns_name[len(_prefix(name)):]
            if _HOST_NS_RE.fullmatch(role):
                tb.hosts.append(_read_host(netns_name, role))
        tb.n_hosts = len(tb.hosts)
        tb.mtu = tb.hosts[0].mtu if tb.hosts else None
        tb.rate_bps = tb.hosts[0].rate_bps if tb.hosts else None
        first = tb.hosts[0] if tb.hosts else None
        tb.network = ipaddress.ip_network(f"{first.ip}/{first.prefixlen}", strict=False) if first and first.ip else None
        tb.ipv6 = any(h.ip6 for h in tb.hosts)
        return tb

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "switch": self.switch,
            "prefix": str(self.network) if self.network else None,
            "hosts": [h.to_dict() for h in self.hosts],
        }


def _read_host(netns_name: str, role: str) -> Host:
    ip, prefixlen, mtu, ip6 = None, None, None, None
    with ns.ipr(netns_name) as h:
        found = h.link_lookup(ifname=HOST_IFNAME)
        if found:
            mtu = h.get_links(found[0])[0].get_attr("IFLA_MTU")
            for addr in h.get_addr(index=found[0], family=2):
                ip, prefixlen = addr.get_attr("IFA_ADDRESS"), addr["prefixlen"]
            for addr in h.get_addr(index=found[0], family=10):  # the testbed's, not the link-local one
                if ipaddress.ip_address(addr.get_attr("IFA_ADDRESS")) in BENCHMARK_NET6:
                    ip6 = addr.get_attr("IFA_ADDRESS")
    rate = link.show(HOST_IFNAME, netns=netns_name).rate_bps if found else None
    return Host(name=role, netns=netns_name, ifname=HOST_IFNAME, ip=ip, prefixlen=prefixlen,
                mtu=mtu, rate_bps=rate, switch_port=role, ip6=ip6)


def _check_prefix(prefix: str, hosts: int) -> ipaddress.IPv4Network:
    try:
        net = ipaddress.ip_network(prefix, strict=True)
    except ValueError as exc:
        raise UserError(f"bad prefix {prefix!r}: {exc}") from None
    if net.version != 4 or not net.subnet_of(BENCHMARK_NET):
        raise UserError(f"bad prefix {prefix}: testbed addresses must come from {BENCHMARK_NET} "
                        "(reserved for benchmarking, so no real network is ever reached)")
    if hosts > net.num_addresses - 2:
        raise UserError(f"prefix {prefix} has room for {max(net.num_addresses - 2, 0)} hosts, not {hosts}")
    return net


def list_testbeds() -> list[str]:
    """Names of the testbeds that have at least one namespace."""
    names = []
    for netns_name in ns.list_netns(NS_PREFIX):
        rest = netns_name[len(NS_PREFIX):]
        if "-" in rest:
            name = rest.rsplit("-", 1)[0]
            if _NAME_RE.fullmatch(name) and name not in names:
                names.append(name)
    return names


def teardown(name: str = DEFAULT_NAME, progress: Callable[[str], None] | None = None) -> list[str]:
    """Remove every namespace of testbed ``name``; returns their names. Idempotent."""
    check_name(name)
    removed = []
    # hosts first: each takes its veth pair with it, so the switch dies with an empty bridge
    names = sorted(ns.list_netns(_prefix(name)), key=lambda n: n.endswith("-sw"))
    for netns_name in names:
        if progress:
            progress(f"removing {netns_name}")
        ns.delete(netns_name)
        removed.append(netns_name)
    return removed


ROUTER_ROLE = "r1"


def router_netns(name: str) -> str:
    return f"{_prefix(name)}{ROUTER_ROLE}"


class RoutedTestbed(Testbed):
    """N hosts, each on its own /24, joined by a router namespace that forwards between them:

        inc-<name>-h1  eth0 198.18.1.2/24 --veth-- h1 198.18.1.1 \\
        inc-<name>-h2  eth0 198.18.2.2/24 --veth-- h2 198.18.2.1  }- inc-<name>-r1 (ip_forward)
        ...                                                      /

    For what a network between the hosts does to packets (DSCP rewriting, firewalls, NAT, a
    smaller MTU): rules go on ``tb.router`` (a Host whose ``run``/``popen`` act in the router
    namespace; its ``ifname`` is the port toward h1). Each host routes 198.18.0.0/15 through the
    router and nothing else; links are shaped as in Testbed. ``down`` (by prefix) removes it.

    With ``ipv6=True`` host hN is also 2001:2:0:N::2/64 (``Host.ip6``) behind the router's
    2001:2:0:N::1 (``tb.router.ip6`` is the one toward h1), routes 2001:2::/48 through it, and
    the router forwards IPv6 too."""

    def __init__(self, hosts: int = 2, rate: str | int | None = None, mtu: int = 1500,
                 name: str = DEFAULT_NAME, progress: Callable[[str], None] | None = None, ipv6: bool = False):
        super().__init__(hosts=hosts, rate=rate, mtu=mtu, prefix="198.18.0.0/16", name=name, progress=progress,
                         ipv6=ipv6)
        if self.n_hosts > 250:
            raise UserError(f"a routed testbed has room for 250 hosts, not {self.n_hosts}")
        self.switch = router_netns(self.name)
        self.router: Host | None = None

    def _build(self) -> None:
        self.progress(f"testbed {self.name}: creating router {self.switch}")
        self._create_ns(self.switch)
        ns.run(self.switch, ["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"]
               + (["net.ipv6.conf.all.forwarding=1"] if self.ipv6 else []), check=True)
        with ns.ipr(self.switch) as r:
            r.link("set", index=r.link_lookup(ifname="lo")[0], state="up")
            for i in range(1, self.n_hosts + 1):
                self.progress(f"testbed {self.name}: host h{i}/{self.n_hosts}")
                self.hosts.append(self._add_routed_host(r, i))
        self.router = Host(name=ROUTER_ROLE, netns=self.switch, ifname="h1", ip="198.18.1.1", prefixlen=24,
                           mtu=self.mtu, rate_bps=self.rate_bps, switch_port="h1",
                           ip6=str(_routed_net6(1).network_address + 1) if self.ipv6 else None)

    def _add_routed_host(self, r, i: int) -> Host:
        host_ns = host_netns(self.name, i)
        port, gateway, ip = f"h{i}", f"198.18.{i}.1", f"198.18.{i}.2"
        net6 = _routed_net6(i)
        gateway6, ip6 = (str(net6.network_address + 1), str(net6.network_address + 2)) if self.ipv6 else (None, None)
        self._create_ns(host_ns)
        r.link("add", ifname=port, kind="veth", peer={"ifname": HOST_IFNAME, "net_ns_fd": host_ns})
        port_index = r.link_lookup(ifname=port)[0]
        r.link("set", index=port_index, mtu=self.mtu, state="up")
        r.addr("add", index=port_index, address=gateway, prefixlen=24)
        if gateway6:
            r.addr("add", index=port_index, address=gateway6, prefixlen=64, flags=IFA_F_NODAD)
        with ns.ipr(host_ns) as h:
            h.link("set", index=h.link_lookup(ifname="lo")[0], state="up")
            eth = h.link_lookup(ifname=HOST_IFNAME)[0]
            h.link("set", index=eth, mtu=self.mtu, state="up")
            h.addr("add", index=eth, address=ip, prefixlen=24)
            h.route("add", dst=str(BENCHMARK_NET), gateway=gateway)
            if ip6:
                h.addr("add", index=eth, address=ip6, prefixlen=64, flags=IFA_F_NODAD)
                h.route("add", dst=str(BENCHMARK_NET6), gateway=gateway6, family=10)
        _gro_on(host_ns)
        if self.rate_bps:
            link.shape(HOST_IFNAME, netns=host_ns, rate=self.rate_bps)
            link.shape(port, netns=self.switch, rate=self.rate_bps)
        return Host(name=f"h{i}", netns=host_ns, ifname=HOST_IFNAME, ip=ip, prefixlen=24, mtu=self.mtu,
                    rate_bps=self.rate_bps, switch_port=port, ip6=ip6)


def _gro_on(host_ns: str) -> None:
    """GRO on at the host's eth0 (docs/deploy.md: what a real host needs for segment trains)."""
    try:
        r = ns.run(host_ns, ["ethtool", "-K", HOST_IFNAME, "gro", "on"], capture_output=True, text=True)
        problem = (r.stderr or r.stdout).strip() or "ethtool failed" if r.returncode else None
    except FileNotFoundError:
        problem = "no ethtool (./run.sh installs it)"
    if problem:
        raise UserError(f"cannot turn GRO on in {host_ns}: {problem}")


def _routed_net6(i: int) -> ipaddress.IPv6Network:
    """Host hN's /64 in a routed testbed: 2001:2:0:N::/64."""
    return ipaddress.ip_network(f"2001:2:0:{i:x}::/64")
