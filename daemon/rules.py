"""The netfilter rules that feed nicd's queues, installed on start and removed on stop.

iptables (nf_tables backend through the xtables compat layer): this kernel has no native nft
`queue` statement. Every rule carries the comment below, so a cleanup finds exactly ours, also
after a crash.

Egress (mangle POSTROUTING, -o IFACE), may fail open (--queue-bypass):
  tagged TCP SYN (DSCP of `tos`)  -> egress queue: remember the ISN, mark "soft NIC here"
  tagged TCP, IP length >= 100    -> egress queue: compress (pure ACKs and tiny segments,
                                     which could never shrink, never cost a queue round trip)
  any TCP SYN-ACK                 -> egress queue: answer a peer's hello
Ingress (mangle PREROUTING, -i IFACE):
  compressed TCP (`tos_compressed`) -> ingress queue, NO bypass: fail closed, TCP retransmits
  SYN / SYN-ACK with `tos_hello`    -> ingress queue, bypass: without us the flow stays raw
"""
from __future__ import annotations

import logging
import shutil
import subprocess

from ..errors import UserError
from .config import NicdConfig

COMMENT = "inceptionn-nicd"
# Smallest tagged IP packet worth a queue round trip: 20 (IP) + up to 60 (TCP) + 20 bytes of
# payload; below that the 10-byte shim header and tag words leave nothing to gain.
MIN_QUEUED_LENGTH = 100
log = logging.getLogger("inceptionn.nicd")


def _iptables(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    exe = shutil.which("iptables")
    if exe is None:
        raise UserError("iptables is not installed (apt-get install iptables)")
    r = subprocess.run([exe, "-w", "5", *args], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise UserError(f"iptables {' '.join(args)}: {r.stderr.strip() or 'failed'}")
    return r


def _queue_target(queues: range, bypass: bool) -> list[str]:
    target = ["-j", "NFQUEUE"]
    if len(queues) == 1:
        target += ["--queue-num", str(queues[0])]
    else:
        target += ["--queue-balance", f"{queues[0]}:{queues[-1]}"]
    return target + (["--queue-bypass"] if bypass else [])


def rule_specs(cfg: NicdConfig) -> list[list[str]]:
    """The rules as iptables arguments after the chain name, in insertion order."""
    dscp = lambda tos: ["-m", "dscp", "--dscp", str(tos >> 2)]  # noqa: E731
    tag = ["-m", "comment", "--comment", COMMENT]
    specs = []
    for ifname in cfg.interfaces:
        out = ["POSTROUTING", "-o", ifname, "-p", "tcp"]
        inn = ["PREROUTING", "-i", ifname, "-p", "tcp"]
        if cfg.accept_only:  # the same tagged packets through a queue each way, nothing else
            specs += [out + dscp(cfg.tos) + tag + _queue_target(cfg.egress_queues, True),
                      inn + dscp(cfg.tos) + tag + _queue_target(cfg.ingress_queues, True)]
            continue
        specs += [
            out + ["--tcp-flags", "SYN,ACK", "SYN"] + dscp(cfg.tos) + tag + _queue_target(cfg.egress_queues, True),
            out + ["-m", "length", "--length", f"{MIN_QUEUED_LENGTH}:65535"] + dscp(cfg.tos) + tag
            + _queue_target(cfg.egress_queues, True),
            out + ["--tcp-flags", "SYN,ACK", "SYN,ACK"] + tag + _queue_target(cfg.egress_queues, True),
            inn + dscp(cfg.tos_compressed) + tag + _queue_target(cfg.ingress_queues, False),
            inn + ["--tcp-flags", "SYN", "SYN"] + dscp(cfg.tos_hello) + tag + _queue_target(cfg.ingress_queues, True),
        ]
    return specs


def install(cfg: NicdConfig) -> None:
    """Insert our rules at the top of the mangle chains, after removing stale ones."""
    removed = remove_all()
    if removed:
        log.warning("removed %d stale nicd rule(s) left by an earlier run", removed)
    specs = rule_specs(cfg)
    try:
        for spec in specs:
            chain, rest = spec[0], spec[1:]
            # -A keeps our rules in order; a packet matching two of them (a tagged SYN-ACK)
            # goes to the same queue either way.
            _iptables("-t", "mangle", "-A", chain, *rest)
    except UserError:
        remove_all()
        raise
    log.info("installed %d netfilter rules on %s", len(specs), ", ".join(cfg.interfaces))


def list_ours() -> list[str]:
    r = _iptables("-t", "mangle", "-S", check=False)
    if r.returncode != 0:
        return []
    return [line for line in r.stdout.splitlines() if line.startswith("-A ") and f"--comment {COMMENT}" in line]


def remove_all() -> int:
    """Delete every rule carrying our comment; returns how many. Safe to call any time."""
    n = 0
    for line in list_ours():
        args = line.split()
        args[0] = "-D"
        if _iptables("-t", "mangle", *args, check=False).returncode == 0:
            n += 1
    return n
