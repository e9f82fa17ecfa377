"""``inceptionn link`` and ``inceptionn testbed``: link emulation and the namespace testbed."""
from __future__ import annotations

import argparse
import errno
import functools
import json
import os
import sys

from inceptionn.errors import UserError

from .units import parse_percent, parse_rate, parse_time

# link, netns and testbed import pyroute2 (~0.2 s): imported in the commands, not here, so that
# `inceptionn --help` stays fast.


def _privileged(func):
    """Turn 'not allowed' from the kernel into one clear line instead of a traceback."""
    @functools.wraps(func)
    def run(args):
        from pyroute2.netlink.exceptions import NetlinkError

        try:
            return func(args)
        except PermissionError as exc:
            reason = exc.strerror or str(exc)
        except NetlinkError as exc:
            if exc.code != errno.EPERM:
                raise
            reason = "operation not permitted"
        raise UserError(f"{reason}: namespaces, links and qdiscs need root "
                        "(CAP_NET_ADMIN and CAP_SYS_ADMIN)")
    return run


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def register(subparsers) -> None:
    _register_link(subparsers)
    _register_testbed(subparsers)


# --- link ----------------------------------------------------------------------------------------

def _register_link(subparsers) -> None:
    p = subparsers.add_parser(
        "link",
        help="emulate a slow/lossy link on an interface's egress (rate, delay, loss)",
        description=(
            "Shape the egress of IFACE: --rate with an HTB qdisc, --delay/--jitter with netem, "
            "--loss with netem or, on kernels without netem, an iptables -m statistic DROP rule. "
            "One call sets the whole configuration and replaces the previous one. Units as tc "
            "writes them: rates in bit, kbit, mbit, gbit (bare number = bit/s; kbps, mbps... are "
            "BYTES per second), times in s, ms, us (bare number = us), loss in percent. An interface "
            "of the machine's root network namespace (a real NIC) is only shaped with --force."
        ),
        epilog=(
            "examples:\n"
            "  inceptionn link eth0 --netns inc-tb-h1 --rate 100mbit --loss 0.5%\n"
            "  inceptionn link eth0 --netns inc-tb-h1 --show --json\n"
            "  inceptionn link eth0 --netns inc-tb-h1 --clear"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("iface", metavar="IFACE", help="interface whose outgoing traffic is shaped")
    p.add_argument("--netns", metavar="NS", help="named network namespace holding IFACE (default: this one)")
    p.add_argument("--rate", help="rate limit, e.g. 100mbit (default: none)")
    p.add_argument("--delay", help="added one-way delay, e.g. 2ms (needs netem; default: none)")
    p.add_argument("--jitter", help="delay variation, e.g. 1ms (needs netem and --delay; default: none)")
    p.add_argument("--loss", help="random loss, e.g. 0.5%% (default: none)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--show", action="store_true", help="print the shaping as read back from the kernel")
    mode.add_argument("--clear", action="store_true", help="remove the shaping inceptionn installed on IFACE")
    p.add_argument("--json", action="store_true", help="with --show (or when setting): print JSON")
    p.add_argument("--force", action="store_true",
                   help="shape IFACE even if it is in the root network namespace (a real NIC: this "
                   "machine's own traffic, remote sessions included, goes through the shaping)")
    p.set_defaults(func=cmd_link)


def _parsed(parse, text):
    # Values are parsed here, not by argparse `type=`, so a bad one is a UserError: one line,
    # exit code 2, instead of argparse's usage dump.
    return None if text is None else parse(text)


def _int(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise UserError(f"bad {what} {text!r}: expected a whole number") from None


def _warn(msg: str | None) -> None:
    if msg:
        print(f"inceptionn: warning: {msg}", file=sys.stderr, flush=True)


@_privileged
def cmd_link(args) -> int:
    from . import link as link_mod

    rate = _parsed(parse_rate, args.rate)
    delay = _parsed(parse_time, args.delay)
    jitter = _parsed(parse_time, args.jitter)
    loss = _parsed(parse_percent, args.loss)
    settings = [rate, delay, jitter, loss]
    if args.show or args.clear:
        if any(v is not None for v in settings):
            raise UserError("--show and --clear take no --rate/--delay/--jitter/--loss")
    if args.clear:
        removed = link_mod.clear(args.iface, netns=args.netns)
        print(f"{args.iface}: shaping removed" if removed else f"{args.iface}: no inceptionn shaping to remove")
        return 0
    if args.show:
        state = link_mod.show(args.iface, netns=args.netns)
    else:
        if all(v is None for v in settings):
            raise UserError("nothing to do: give --rate, --delay, --jitter or --loss, or --show / --clear")
        if not args.force and link_mod.is_root_netns(args.netns):
            where = f"namespace {args.netns!r} is" if args.netns else f"{args.iface} is in"
            raise UserError(f"{where} the machine's root network namespace: shaping a real NIC slows this "
                            "host's own traffic, remote sessions included; use an interface of a testbed "
                            "namespace (--netns NS), or add --force")
        state = link_mod.shape(args.iface, netns=args.netns, rate=rate, delay=delay,
                               jitter=jitter, loss=loss)
        _warn(link_mod.bytes_rate_warning("--rate", args.rate))  # once done: a refusal stays one line
    print(json.dumps(state.to_dict(), indent=2) if args.json else state.describe())
    return 0


# --- testbed -------------------------------------------------------------------------------------

def _register_testbed(subparsers) -> None:
    p = subparsers.add_parser(
        "testbed",
        help="multi-host testbed of network namespaces joined by shaped links",
        description=(
            "N host namespaces (inc-NAME-h1..hN) joined through a Linux bridge in a switch "
            "namespace (inc-NAME-sw), each link shaped in both directions, addresses from "
            "198.18.0.0/15 (host i gets the i-th address of --prefix)."
        ),
    )
    p.defer(_add_testbed_actions)  # their defaults come from testbed.py, which imports pyroute2


def _add_testbed_actions(p) -> None:
    from . import testbed as tb_mod

    sub = p.add_subparsers(dest="testbed_command", metavar="ACTION")
    sub.required = True

    up = sub.add_parser("up", help="create a testbed",
                        description="Create a testbed. Fails if one of that name exists.")
    up.add_argument("--hosts", required=True, metavar="N", help="number of hosts")
    up.add_argument("--rate", help="rate of every link, both directions (default: unshaped)")
    up.add_argument("--mtu", default="1500", help="MTU of every link (default 1500)")
    up.add_argument("--prefix", default=tb_mod.DEFAULT_PREFIX,
                    help=f"IPv4 prefix inside 198.18.0.0/15 (default {tb_mod.DEFAULT_PREFIX})")
    up.add_argument("--name", default=tb_mod.DEFAULT_NAME,
                    help=f"testbed name, part of every namespace name (default {tb_mod.DEFAULT_NAME})")
    up.add_argument("--ipv6", action="store_true",
                    help="also give every host an IPv6 address on 2001:2::/64 (RFC 5180 benchmarking prefix; "
                         "off by default: MPI would use every address a host has)")
    up.add_argument("--json", action="store_true", help="print the hosts as JSON")
    up.set_defaults(func=cmd_testbed_up)

    down = sub.add_parser("down", help="remove a testbed (also after a crash)",
                          description="Remove every namespace named inc-NAME-*, with their links, "
                                      "qdiscs and iptables rules, after stopping the processes "
                                      "running in them. Succeeds when there is nothing to remove.")
    down.add_argument("--name", default=tb_mod.DEFAULT_NAME, help=f"testbed name (default {tb_mod.DEFAULT_NAME})")
    down.add_argument("--all", action="store_true", help="remove every inceptionn testbed (inc-*-* namespaces)")
    down.set_defaults(func=cmd_testbed_down)

    status = sub.add_parser("status", help="show running testbeds, read from the kernel",
                            description="Show the testbeds that are up (hosts, namespaces, addresses, MTU, "
                                        "link rate), read back from the kernel.")
    status.add_argument("--name", help="only this testbed (default: all of them)")
    status.add_argument("--json", action="store_true", help="print JSON")
    status.set_defaults(func=cmd_testbed_status)

    ex = sub.add_parser("exec", help="run a command inside a testbed host",
                        description="Run CMD inside host HOST (h1, h2, ... or sw for the switch). "
                                    "The exit code is the command's.",
                        usage="inceptionn testbed exec [-h] [--name NAME] [--uts] HOST -- CMD...")
    ex.add_argument("--name", default=tb_mod.DEFAULT_NAME, help=f"testbed name (default {tb_mod.DEFAULT_NAME})")
    ex.add_argument("--uts", action="store_true", help="give the command its own UTS namespace, hostname HOST")
    ex.add_argument("host", metavar="HOST")
    ex.add_argument("cmd", nargs=argparse.REMAINDER, metavar="CMD")
    ex.set_defaults(func=cmd_testbed_exec)


@_privileged
def cmd_testbed_up(args) -> int:
    from . import link as link_mod
    from . import testbed as tb_mod

    bed = tb_mod.Testbed(hosts=_int(args.hosts, "--hosts"), rate=_parsed(parse_rate, args.rate),
                         mtu=_int(args.mtu, "--mtu"), prefix=args.prefix,
                         name=args.name, progress=_progress, ipv6=args.ipv6)
    _warn(link_mod.bytes_rate_warning("--rate", args.rate))  # after the checks: an error stays one line
    bed.up()
    if args.json:
        print(json.dumps(bed.to_dict(), indent=2))
    else:
        _print_testbed(bed)
    return 0


@_privileged
def cmd_testbed_down(args) -> int:
    from . import testbed as tb_mod

    names = tb_mod.list_testbeds() if args.all else [tb_mod.check_name(args.name)]
    removed = []
    for name in names:
        removed += tb_mod.teardown(name, progress=_progress)
    if removed:
        print(f"removed {len(removed)} namespaces: {' '.join(removed)}")
    else:
        print("no testbed to remove" if args.all else f"no testbed {args.name!r} to remove")
    return 0


@_privileged
def cmd_testbed_status(args) -> int:
    from . import netns as ns
    from . import testbed as tb_mod

    names = [tb_mod.check_name(args.name)] if args.name else tb_mod.list_testbeds()
    beds = [tb_mod.Testbed.attach(n) for n in names if ns.list_netns(f"{tb_mod.NS_PREFIX}{n}-")]
    if args.json:
        print(json.dumps({"testbeds": [b.to_dict() for b in beds]}, indent=2))
        return 0
    if not beds:
        print("no testbed is up")
    for b in beds:
        _print_testbed(b)
    return 0


@_privileged
def cmd_testbed_exec(args) -> int:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise UserError("no command given: inceptionn testbed exec HOST -- CMD...")
    from . import netns as ns
    from . import testbed as tb_mod

    if args.host == "sw":
        netns_name = tb_mod.switch_netns(tb_mod.check_name(args.name))
        if not ns.exists(netns_name):
            raise UserError(f"no testbed {args.name!r} is up")
    else:
        netns_name = tb_mod.Testbed.attach(args.name).host(args.host).netns
    argv = ns.command(netns_name, cmd, hostname=args.host if args.uts else None)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvp(argv[0], argv)  # replaces this process: signals and exit code are the command's
    except OSError as exc:
        raise UserError(f"cannot run {argv[0]}: {exc.strerror}") from None


def _print_testbed(bed) -> None:
    print(f"testbed {bed.name}: switch {bed.switch}, prefix {bed.network}")
    print(f"  {'host':<6} {'netns':<18} {'iface':<6} {'address':<16} {'mtu':>6}  rate")
    for h in bed.hosts:
        d = h.to_dict()
        print(f"  {h.name:<6} {h.netns:<18} {h.ifname:<6} {str(h.ip):<16} {str(h.mtu):>6}  {d['rate'] or 'unlimited'}"
              + (f"  {h.ip6}" if h.ip6 else ""))
