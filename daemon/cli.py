"""``inceptionn nicd`` and ``inceptionn stats``. Light on purpose: the daemon's modules are
imported only when it runs (see inceptionn/cli.py)."""
import argparse
import json
import sys
import time



def _whole_number(text: str) -> int:
    """40 or 0x28 (marks are usually written in hex)."""
    try:
        return int(text, 10)
    except ValueError:
        pass
    try:
        return int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number such as 40 or 0x28, got {text!r}") from None


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0.1 <= value <= 86400:
        raise argparse.ArgumentTypeError(f"expected seconds from 0.1 to 86400, got {text!r}")
    return value


def register(sub) -> None:
    p = sub.add_parser("nicd", help="run the soft NIC daemon (compress tagged gradient packets)",
                       description="Run the soft NIC: compress TCP packets marked with the gradient "
                       "ToS on the way out of the configured interfaces, restore them on the way in. "
                       "Settings come from --config (default /etc/inceptionn/nicd.toml if present), "
                       "flags override them. SIGTERM/SIGINT stop it and remove its queue rules; a drop of "
                       "compressed packets stays, so none reaches an application while it is down, "
                       "until --uninstall. SIGHUP reloads error_bound and log_level. Its rules exist in "
                       "iptables and ip6tables alike (IPv4 only, said in one line, where ip6tables or the "
                       "kernel's IPv6 is missing); --cleanup and --uninstall remove both.")
    p.add_argument("--config", metavar="PATH", help="TOML config file (default /etc/inceptionn/nicd.toml if present)")
    p.defer(_add_setting_flags)  # from settings.py, which reads the marks through cffi
    p.add_argument("--check", action="store_true",
                   help="validate the config file and flags, print the effective config and exit "
                   "(0: the daemon would start with it; needs no root)")
    p.add_argument("--json", action="store_true", help="with --check: print the config as JSON")
    once = p.add_mutually_exclusive_group()
    once.add_argument("--cleanup", action="store_true",
                      help="remove the queue rules of every nicd that no longer runs (after a stop or a crash) "
                      "and a stale socket, keep the drop of compressed packets, then exit")
    once.add_argument("--uninstall", action="store_true",
                      help="remove every nicd rule, the drop of compressed packets included, and a stale "
                      "socket, then exit (refused while nicd runs)")
    p.set_defaults(func=_nicd)

    s = sub.add_parser("stats", help="live counters of the running soft NIC daemon",
                       description="Print the counters of a running nicd, read from its stats socket: "
                       "totals, and one line per queue pair where the daemon reports them; or every counter as "
                       "JSON, OpenMetrics or Prometheus text (--format).")
    s.defer(_add_socket_flag)
    s.add_argument("--json", action="store_true",
                   help="print the raw counters as JSON (with --watch: one document per line); "
                   "the same as --format json")
    s.add_argument("--format", choices=("text", "json", "openmetrics", "prometheus"),
                   help="text (default), json, openmetrics (OpenMetrics 1.0 text: every counter per queue "
                   "pair, inceptionn_nicd_..._total) or prometheus (the same in the Prometheus text format "
                   "0.0.4 that node_exporter's textfile collector and promtool read)")
    s.add_argument("--watch", type=_seconds, metavar="SECONDS",
                   help="print again every SECONDS until Ctrl-C (default: once)")
    s.set_defaults(func=_stats)


def _add_setting_flags(p) -> None:
    """A flag for every setting (settings.SETTINGS), its default in its help."""
    from .settings import SETTINGS, shown

    for s in SETTINGS:
        flag = "--" + s.name.replace("_", "-")
        if s.kind == "list":
            p.add_argument("-i", "--interface", action="append", metavar=s.metavar, help=s.help)
        elif s.kind == "switch":
            p.add_argument(flag, action="store_true", help=s.help)
        elif s.kind == "onoff":  # None: not given, the file or the default decides
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=None,
                           help=f"{s.help} (default {'on' if s.default else 'off'})")
        elif s.kind == "gso":
            gso = p.add_mutually_exclusive_group()
            gso.add_argument(flag, action="store_true", help=s.help)
            gso.add_argument("--no-" + s.name, action="store_true",
                             help="compress packet by packet, as the kernel segments them (gso = false)")
        else:
            kw = {"choices": s.choices} if s.kind == "choice" else {"metavar": s.metavar}
            if s.kind in ("int", "mark"):
                kw["type"] = _whole_number
            p.add_argument(flag, help=f"{s.help} (default {shown(s)})", **kw)


def _add_socket_flag(p) -> None:
    from .settings import DEFAULT_SOCKET

    p.add_argument("--socket", default=DEFAULT_SOCKET, metavar="PATH",
                   help=f"the daemon's stats socket (default {DEFAULT_SOCKET})")


def _nicd(args) -> int:
    from ..errors import UserError

    if args.check:
        if args.cleanup or args.uninstall:
            raise UserError(f"--check and --{'cleanup' if args.cleanup else 'uninstall'} cannot be combined")
        return _check(args)
    if args.json:
        raise UserError("--json goes with --check (the running daemon's counters: inceptionn stats --json)")
    from .nicd import run

    return run(args)


def _check(args) -> int:
    """Suricata's -T for nicd: what the daemon would run with, or the one line why not."""
    import dataclasses
    from pathlib import Path

    from . import config

    path = config.file_in_use(Path(args.config) if args.config else None)
    overrides = config.overrides_from(args)
    cfg = config.load(path, overrides)
    config.check_interfaces(cfg)
    if args.json:
        print(json.dumps(dataclasses.asdict(cfg), indent=2))
    else:
        flags = " + flags" if any(v is not None for v in overrides.values()) else ""
        print(f"# effective nicd config: {path or 'defaults'}{flags}\n{config.to_toml(cfg)}")
    return 0


def _stats(args) -> int:
    from ..errors import UserError
    from .stats import format_stats, read

    fmt = args.format or ("json" if args.json else "text")
    if args.json and fmt != "json":
        raise UserError(f"--json and --format {fmt} cannot be combined")

    def show(data) -> str:
        if fmt == "json":
            return json.dumps(data, indent=None if args.watch else 2)
        if fmt == "text":
            return format_stats(data)
        from .metrics import exposition

        return exposition(data, fmt).rstrip("\n")

    data = read(args.socket)  # a wrong path or no daemon at all: one error line, exit 2
    if args.watch is None:
        print(show(data))
        return 0
    redraw = sys.stdout.isatty() and fmt == "text"
    try:
        while True:
            if data is not None:
                if redraw:  # like watch(1): clear, a header, the counters
                    sys.stdout.write("\033[H\033[2J")
                if fmt == "text":
                    print(f"every {args.watch:g} s: inceptionn stats, {time.strftime('%H:%M:%S')}")
                print(show(data), flush=True)
            time.sleep(args.watch)
            try:
                data = read(args.socket)
            except UserError as exc:  # e.g. the daemon restarting: say so and keep watching
                print(f"inceptionn stats: {exc}", file=sys.stderr, flush=True)
                data = None
    except KeyboardInterrupt:  # the way to leave --watch: not an error
        return 0
