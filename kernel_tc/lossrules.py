"""Random packet loss with iptables ``-m statistic``, for kernels without netem.

One DROP rule per place the interface's egress traffic passes through netfilter, each tagged
with the comment ``inceptionn-link:IFACE`` so that clearing removes exactly these rules and
nothing a user or the soft-NIC daemon installed.

Where the drop happens matters:
- routed traffic (FORWARD ``-o IFACE``) and bridged traffic leaving a bridge port (FORWARD
  ``-m physdev --physdev-out IFACE``) vanish silently, as on a wire;
- traffic the namespace itself sends (OUTPUT ``-o IFACE``) is refused to the sending socket
  (EPERM): ping counts it lost, TCP simply tries again. For loss that looks like a wire,
  shape the switch side of a link (a bridge port), as the testbed makes possible.

pyroute2 cannot program xtables, so this module runs the ``iptables`` tool inside the namespace.
"""
from __future__ import annotations

import shlex
import shutil
import subprocess

from inceptionn.errors import UserError

from . import netns as ns

COMMENT_PREFIX = "inceptionn-link:"


def comment(ifname: str) -> str:
    return f"{COMMENT_PREFIX}{ifname}"


def _iptables(netns: str | None, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    if shutil.which("iptables") is None:
        raise UserError("loss emulation without netem needs the iptables tool, which is not installed")
    # -w: wait for the xtables lock instead of failing when another tool holds it
    proc = ns.run(netns, ["iptables", "-w", *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        msg = (proc.stderr.strip().splitlines() or ["failed"])[-1]
        raise UserError(f"iptables {' '.join(args)}: {msg}")
    return proc


def _specs(ifname: str, bridge_port: bool) -> list[tuple[str, list[str]]]:
    """(chain, match arguments) for each netfilter place IFACE's egress traffic crosses."""
    if bridge_port:
        return [("FORWARD", ["-m", "physdev", "--physdev-out", ifname, "--physdev-is-bridged"])]
    return [("OUTPUT", ["-o", ifname]), ("FORWARD", ["-o", ifname])]


def _bridge_nf_enabled(netns: str | None) -> bool:
    proc = ns.run(netns, ["cat", "/proc/sys/net/bridge/bridge-nf-call-iptables"], capture_output=True, text=True)
    return proc.returncode == 0 and proc.stdout.strip() == "1"


def add(netns: str | None, ifname: str, percent: float, *, bridge_port: bool = False) -> None:
    """Drop ``percent`` % of the packets leaving ``ifname``, chosen at random."""
    if bridge_port and not _bridge_nf_enabled(netns):
        raise UserError(
            f"{ifname} is a bridge port but bridged traffic bypasses iptables here "
            "(net.bridge.bridge-nf-call-iptables is 0 in that namespace); cannot emulate loss on it"
        )
    probability = f"{percent / 100:.8f}"
    for chain, match in _specs(ifname, bridge_port):
        # -I: ahead of other rules, so accepting rules cannot exempt traffic from the loss
        _iptables(netns, "-I", chain, *match, "-m", "statistic", "--mode", "random",
                  "--probability", probability, "-m", "comment", "--comment", comment(ifname), "-j", "DROP")


def list_rules(netns: str | None, ifname: str | None = None) -> list[list[str]]:
    """Our rules (as ``iptables -S`` argument lists) for ``ifname``, or for every interface."""
    if shutil.which("iptables") is None:
        return []
    proc = _iptables(netns, "-S", check=False)
    if proc.returncode != 0:
        return []
    found = []
    for line in proc.stdout.splitlines():
        args = shlex.split(line)
        if not args or args[0] != "-A" or "--comment" not in args:
            continue
        tag = args[args.index("--comment") + 1]
        wanted = (tag == comment(ifname)) if ifname is not None else tag.startswith(COMMENT_PREFIX)
        if wanted:
            found.append(args)
    return found


def probability_percent(rule: list[str]) -> float | None:
    """The loss percentage a rule from list_rules() applies, as the kernel reports it."""
    if "--probability" not in rule:
        return None
    return float(rule[rule.index("--probability") + 1]) * 100


def remove(netns: str | None, ifname: str | None = None) -> int:
    """Delete our rules for ``ifname`` (or all of ours); returns how many were removed."""
    rules = list_rules(netns, ifname)
    for rule in rules:
        _iptables(netns, "-D", *rule[1:])
    return len(rules)
