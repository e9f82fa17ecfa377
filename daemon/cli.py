"""``inceptionn nicd`` and ``inceptionn stats``."""
import json


def _int_auto(text: str) -> int:
    return int(text, 0)  # accepts 0x28 as well as 40


def register(sub) -> None:
    p = sub.add_parser("nicd", help="run the soft NIC daemon (compress tagged gradient packets)",
                       description="Run the soft NIC: compress TCP packets marked with the gradient "
                       "ToS on the way out of the configured interfaces, restore them on the way in. "
                       "Settings come from --config (default /etc/inceptionn/nicd.toml if present), "
                       "flags override them. SIGTERM/SIGINT stop it and remove its queue rules; a drop of "
                       "compressed packets stays, so none reaches an application while it is down, "
                       "until --uninstall. SIGHUP reloads error_bound and log_level.")
    p.add_argument("--config", metavar="PATH", help="TOML config file (default /etc/inceptionn/nicd.toml if present)")
    p.add_argument("-i", "--interface", action="append", metavar="IFACE", help="interface to manage (repeatable)")
    p.add_argument("--tos", type=_int_auto, help="the gradient mark as a ToS byte (default 0x28, DSCP 10)")
    p.add_argument("--codec", help="codec (default inceptionn)")
    p.add_argument("--error-bound", type=int, help="error bound exponent k, bound 2^k (default -10)")
    p.add_argument("--queues", type=int, help="queue pairs / threads (default 1)")
    p.add_argument("--queue-base", type=int, help="first NFQUEUE number (default 7100)")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    p.add_argument("--socket", help="stats socket (default /run/inceptionn/nicd.sock)")
    p.add_argument("--accept-only", action="store_true",
                   help="diagnostic: queue tagged packets both ways and accept them unchanged "
                   "(measures the queue's own cost; compresses nothing)")
    once = p.add_mutually_exclusive_group()
    once.add_argument("--cleanup", action="store_true",
                      help="remove the queue rules of every nicd that no longer runs (after a stop or a crash) "
                      "and a stale socket, keep the drop of compressed packets, then exit")
    once.add_argument("--uninstall", action="store_true",
                      help="remove every nicd rule, the drop of compressed packets included, and a stale "
                      "socket, then exit (refused while nicd runs)")
    p.set_defaults(func=lambda a: __import__("inceptionn.daemon.nicd", fromlist=["run"]).run(a))

    s = sub.add_parser("stats", help="live counters of the running soft NIC daemon")
    s.add_argument("--socket", default="/run/inceptionn/nicd.sock", help="the daemon's stats socket")
    s.add_argument("--json", action="store_true", help="print the raw counters as JSON")
    s.set_defaults(func=_stats)


def _stats(args) -> int:
    from .stats import format_stats, read

    data = read(args.socket)
    print(json.dumps(data, indent=2) if args.json else format_stats(data))
    return 0
