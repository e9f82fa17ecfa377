"""``inceptionn bench nic``: the soft NIC's goodput over emulated links, side by side.

For each link (rate x MTU) a fresh 2-host testbed runs both daemons; every round sends the same
stream of real gradient values twice: untagged (never queued: the link without the soft NIC)
and tagged (compressed by the soft NICs, in the daemon's default mode, gso: TSO super-packets in,
MTU-sized compressed packets out; ``--no-gso`` measures the per-packet path instead). Reported: goodput of each, the compression ratio the
daemons measured, the ideal (link rate x ratio) and how close the soft NIC gets to it, and the
daemons' CPU. On an unshaped link: the data path's own ceiling beside an accept-only queue and
no queue at all. With ``--flood PPS`` a third host sends the receiver spoofed hello SYNs
(bench/synflood.py: random testbed sources, to the stream's port) during an extra tagged
transfer each round: goodput under the flood beside the quiet one, and what the receiver's
daemon counted. With --both the tagged stream runs per packet (nicd --no-gso) and then with
nicd --gso on both hosts (docs/wire-format.md), side by side; for every mode the data packets
that reached the receiver (an iptables counter on its wire side, before its daemon) are reported
per MB of original payload.
``--queues 1,2`` runs the --gso stream once per queue count in every round, in turn (nicd --queues N
on both hosts: N queue pairs, one thread each; nicd's rules spread flows over them by a hash of
addresses and ports, so one host pair's streams spread too, each on one queue: docs/perf.md) and
``--streams M`` sends M parallel streams in every transfer. Each daemon's CPU time (all its threads, from
/proc/<pid>/stat) is reported per GB of original payload at each end: what a host with cores of
its own would pay, since here both ends share the machine's cores.
"""
from __future__ import annotations

HELP = "soft NIC goodput over emulated links, with and without the daemons"

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack

import numpy as np

from ..collective.scaling import scaled_copy
from ..daemon.config import NicdConfig
from ..daemon.launch import nicd, read_stats
from ..errors import UserError
from ..limits import DEFAULT_ERROR_BOUND
from ..kernel_tc.testbed import Testbed
from ..kernel_tc.units import parse_rate
from ..procs import cpu_seconds
from ..shim.contract import TOS_SCALED, TOS_TAGGED
from .cli import emit

PORT = 5201
SYN_FRAME_BITS = (76 + 14) * 8  # a flood SYN (bench/synflood.py) as the link's shaper counts it


def log(msg: str) -> None:
    print(f"[bench nic] {msg}", file=sys.stderr, flush=True)


def wait_established(host, port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = host.run(["ss", "-Htn", "state", "established", f"( sport = :{port} )"], capture_output=True, text=True)
        if r.stdout.strip():
            return
        time.sleep(0.01)
    raise UserError(f"no connection on port {port} after {timeout:.0f} s")


def transfer(sender, receiver, path: str, reps: int, tos: int, timeout: float, on_connected=None,
             streams: int = 1, keep: str | None = None, ipv6: bool = False) -> dict:
    """``streams`` parallel streams sender -> receiver (ports PORT, PORT + 1, ...): their bytes
    summed, over the longest of their times; ``on_connected()`` runs once the first is up.
    ``keep``: a file the (single) receiver writes what arrived to. ``ipv6``: to the receiver's
    IPv6 address (the ToS becomes the traffic class)."""
    peer = [sys.executable, "-m", "inceptionn.bench.stream_peer"]
    addr = receiver.ip6 if ipv6 else receiver.ip
    rxs, txs = [], []
    try:
        for i in range(streams):
            rxs.append(receiver.popen(peer + ["recv", addr, str(PORT + i)] + ([keep] if keep else []),
                                      stdout=subprocess.PIPE, text=True))
            if rxs[-1].stdout.readline().strip() != "ready":
                raise UserError("benchmark receiver did not start")
        for i in range(streams):
            txs.append(sender.popen(peer + ["send", addr, str(PORT + i), path, str(reps), hex(tos)]))
        if on_connected:
            wait_established(receiver, PORT)
            on_connected()
        if any(tx.wait(timeout=timeout) != 0 for tx in txs):
            raise UserError("benchmark sender failed")
        results = [json.loads(rx.communicate(timeout=timeout)[0]) for rx in rxs]
        return {"bytes": sum(r["bytes"] for r in results), "seconds": max(r["seconds"] for r in results)}
    finally:
        for p in txs + rxs:
            if p.poll() is None:
                p.kill()
                p.wait()


WIRE_COMMENT = "bnic-wire"


def count_wire(receiver, sender) -> None:
    """A rule that only counts: data packets from ``sender`` as they reach ``receiver``'s
    interface (nicd puts its queue rules behind such rules)."""
    receiver.run(["iptables", "-w", "5", "-t", "raw", "-A", "PREROUTING", "-i", receiver.ifname, "-s", sender.ip,
                  "-p", "tcp", "-m", "length", "--length", "100:65535", "-m", "comment", "--comment", WIRE_COMMENT],
                 check=True)


def wire_packets(receiver) -> int:
    r = receiver.run(["iptables-save", "-c", "-t", "raw"], capture_output=True, text=True, check=True)
    for line in r.stdout.splitlines():
        if WIRE_COMMENT in line:
            return int(line[1:].split(":")[0])  # "[packets:bytes] -A ..."
    raise UserError(f"the wire counter in {receiver.name} is gone")


def timed_transfer(sender, receiver, path, reps, tos, timeout, res, mode, streams=1) -> dict:
    """A transfer whose Gbit/s and wire packets go to res[mode + "_gbps"], res[mode + "_packets"]."""
    p0 = wire_packets(receiver)
    t = transfer(sender, receiver, path, reps, tos, timeout, streams=streams)
    res[mode + "_gbps"].append(8 * t["bytes"] / t["seconds"] / 1e9)
    res[mode + "_packets"] += wire_packets(receiver) - p0
    res[mode + "_bytes"] += t["bytes"]
    return t


def flood_transfer(attacker, sender, receiver, path: str, reps: int, pps: float, timeout: float) -> tuple[dict, int]:
    """A tagged transfer while ``attacker`` floods the receiver's port with spoofed hellos,
    from the moment the connection is up (one opened during a flood gets the kernel's SYN
    cookies, which clamp its MSS and window: that measures the kernel, not the soft NIC);
    returns its result and how many SYNs were sent."""
    f = attacker.popen([sys.executable, "-m", "inceptionn.bench.synflood", "--dst", receiver.ip, "--dport", str(PORT),
                        "--until-killed", "--wait-go", "--rate", str(pps), "--exclude", sender.ip,
                        "--exclude", attacker.ip],
                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def go():
        f.stdin.write("go\n")
        f.stdin.flush()
    try:
        if f.stdout.readline().strip() != "ready":
            raise UserError(f"the SYN flood did not start: {f.stderr.read().strip()}")
        result = transfer(sender, receiver, path, reps, TOS_TAGGED, timeout, on_connected=go)
        f.terminate()
        out, _ = f.communicate(timeout=30)
        return result, int(out.split()[-1])  # "flooding", then "sent N"
    finally:
        if f.poll() is None:
            f.kill()
            f.wait()


def measure_gso(h1, h2, socks, path, reps, rounds, error_bound, timeout, queues, streams, rate_bps, label,
                first_round=0, trains=None) -> dict:
    """Rounds of the tagged stream with nicd --gso --queues ``queues`` on both hosts (``trains``:
    True --trains, False --no-trains, None the daemon's default): goodput, wire packets, and each
    daemon's CPU (all its threads, /proc/<pid>/stat) per wall second and per GB."""
    res = {"queues": queues, "trains": NicdConfig().trains if trains is None else trains}
    acc = {"gso_gbps": [], "gso_packets": 0, "gso_bytes": 0}
    with ExitStack() as g:
        gd = [g.enter_context(nicd(h, s, error_bound, gso=True, queues=queues, trains=trains))
              for h, s in zip((h1, h2), socks)]
        cpu0, busy = [cpu_seconds(d.pid) for d in gd], 0.0
        for r in range(rounds):
            t0 = time.perf_counter()
            timed_transfer(h1, h2, path, reps, TOS_TAGGED, timeout, acc, "gso", streams)
            busy += time.perf_counter() - t0
            log(f"{label} gso{' --trains' if res['trains'] else ' --no-trains'} {queues} queue(s) round {first_round + r + 1}: soft NIC "
                f"{acc['gso_gbps'][-1]:.3f} Gbit/s, "
                f"load {os.getloadavg()[0]:.1f}")
        cpu = [cpu_seconds(d.pid) - c for d, c in zip(gd, cpu0)]
        g1, g2 = read_stats(socks[0]), read_stats(socks[1])
        per_queue = [q["counters"]["egress_packets"] for q in stats_queues(socks[0])]
    res["gbps"], res["packets"], res["bytes"] = acc["gso_gbps"], acc["gso_packets"], acc["gso_bytes"]
    res["orig_bytes"], res["wire_bytes"] = g1["egress_orig_bytes"], g1["egress_wire_bytes"]
    res["super_packets"] = g1["gso_super_packets"] + g1["egress_trains"]
    res["trains_sent"] = g1["egress_trains"]
    res["send_errors"] = g1["gso_send_errors"]
    res["drops"] = {k: v for k, v in g2.items() if k.startswith("drop_") and v}
    res["sender_queue_packets"] = per_queue  # how the streams spread over the sender's queues
    res["spread"] = [per_queue]  # ... per daemon start (merge_gso keeps each)
    res["cpu_seconds"], res["busy_seconds"] = cpu, busy
    res["load"] = [os.getloadavg()[0]]
    return summarize_gso(res, rate_bps)


def summarize_gso(res: dict, rate_bps) -> dict:
    """The figures derived from a gso run's sums: median goodput, ratio, CPU per wall second and
    per GB of original payload, share of the ideal."""
    res["gbps_median"] = statistics.median(res["gbps"])
    res["ratio"] = res["orig_bytes"] / max(1, res["wire_bytes"])
    res["sender_cpu"], res["receiver_cpu"] = (c / res["busy_seconds"] for c in res["cpu_seconds"])
    # what a host with cores of its own pays: daemon CPU seconds per GB of original payload
    res["sender_s_per_gb"], res["receiver_s_per_gb"] = (c / (res["bytes"] / 1e9) for c in res["cpu_seconds"])
    if rate_bps:
        res["of_ideal"] = res["gbps_median"] / (rate_bps / 1e9 * res["ratio"])
    return res


def merge_gso(runs: list[dict], rate_bps) -> dict:
    """One gso queue count's rounds, each run with daemons of its own (measure_gso, 1 round),
    as one result: lists joined, counts and CPU seconds summed."""
    m = {"queues": runs[0]["queues"], "trains": runs[0]["trains"], "gbps": [], "spread": [], "load": [], "drops": {}}
    for r in runs:
        m["gbps"] += r["gbps"]
        m["spread"] += r["spread"]
        m["load"] += r["load"]
        for k, v in r["drops"].items():
            m["drops"][k] = m["drops"].get(k, 0) + v
        for k in ("packets", "bytes", "orig_bytes", "wire_bytes", "super_packets", "trains_sent", "send_errors",
                  "busy_seconds"):
            m[k] = m.get(k, 0) + r[k]
        m["cpu_seconds"] = [a + b for a, b in zip(m.get("cpu_seconds", [0.0, 0.0]), r["cpu_seconds"])]
    m["sender_queue_packets"] = [sum(col) for col in zip(*m["spread"])]
    return summarize_gso(m, rate_bps)


# The soft NIC's two codec modes, picked by the sender's mark (docs/wire-format.md, "Marks").
MODES = (("paper", TOS_TAGGED), ("scaled", TOS_SCALED))


def measure_modes(h1, h2, socks, path, error_bound, timeout, workdir, label) -> list[dict]:
    """The stream once in each codec mode, per-packet and with gso, each received into a file:
    goodput, the ratio the sender's daemon counted, and the NMSE of what arrived."""
    x = np.fromfile(path, np.float32).astype(np.float64)
    out, rows = os.path.join(workdir, "modes.bin"), []
    for gso in (False, True):
        with ExitStack() as st:
            for h, s in zip((h1, h2), socks):
                st.enter_context(nicd(h, s, error_bound, gso=gso))
            for mode, tos in MODES:
                s0 = read_stats(socks[0])
                t = transfer(h1, h2, path, 1, tos, timeout, keep=out)
                s1 = read_stats(socks[0])
                got = np.fromfile(out, np.float32).astype(np.float64)
                if got.size != x.size:
                    raise UserError(f"{label}: {got.size} of {x.size} values arrived in the {mode} mode")
                orig = s1["egress_orig_bytes"] - s0["egress_orig_bytes"]
                raw = s1["egress_raw_bytes"] - s0["egress_raw_bytes"]
                wire = s1["egress_wire_bytes"] - s0["egress_wire_bytes"]
                rows.append({"mode": mode, "tos": tos, "gso": gso, "gbps": 8 * t["bytes"] / t["seconds"] / 1e9,
                             "ratio": (orig + raw) / max(1, wire + raw),
                             "nmse": float(np.sum((got - x) ** 2) / np.sum(x ** 2))})
                log(f"{label} {mode} mode{' gso' if gso else ''}: ratio {rows[-1]['ratio']:.2f}x, "
                    f"NMSE {rows[-1]['nmse']:.4f}")
    return rows


def stats_queues(sock: str) -> list[dict]:
    from ..daemon.stats import read
    return read(sock)["queues"]


def measure_link(rate: str | None, mtu: int, path: str, nbytes: int, reps: int, rounds: int,
                 error_bound: int, workdir: str, accept_only_too: bool, flood_pps: float = 0,
                 path_gso: bool = True, gso: bool = False, queues: tuple = (1,), streams: int = 1,
                 modes: bool = False, ipv6: bool = False, trains: bool = False) -> dict:
    """``path_gso``: the tagged stream's daemons run gso (the default) or per packet; ``gso``:
    then the gso runs over ``queues`` follow, beside the per-packet figures (--both); ``modes``:
    raw input, sent once in each codec mode (the paper's mark and the scaled one); ``ipv6``: each
    round also sends the untagged and tagged streams over IPv6, through the same daemons; ``trains``:
    then rounds of the gso stream without and with --trains in turn, each with daemons of its own
    (wire format v2 against v3, side by side; GRO on at the receiver's veth for both)."""
    label = f"{rate or 'unshaped'} MTU {mtu}"
    log(f"{label}: testbed up, {rounds} rounds of {nbytes * reps / 1e6:.0f} MB untagged + tagged"
        + (f" + tagged under a {flood_pps:.0f} SYN/s flood" if flood_pps else "") + " ...")
    res = {"rate": rate, "mtu": mtu, "bytes": nbytes * reps, "raw_gbps": [], "nic_gbps": [], "accept_only_gbps": [],
           "flood_gbps": [], "flood_pps": flood_pps, "flood_sent": 0, "gso_gbps": [],
           "path": "gso" if path_gso else "per-packet", "raw6_gbps": [], "nic6_gbps": []}
    for mode in ("raw", "nic", "gso"):
        res[mode + "_packets"] = res[mode + "_bytes"] = 0
    rate_bps = parse_rate(rate) if rate else None
    timeout = 600
    # a name of its own per run: benchmarks started side by side (or one left behind) do not collide
    with Testbed(hosts=3 if flood_pps else 2, rate=rate, mtu=mtu, name=f"bnic{os.getpid()}", ipv6=ipv6) as tb, \
            ExitStack() as stack:
        h1, h2 = tb.hosts[:2]
        count_wire(h2, h1)
        socks = [os.path.join(workdir, f"{h.name}.sock") for h in (h1, h2)]
        daemons = [stack.enter_context(nicd(h, s, error_bound, gso=path_gso)) for h, s in zip((h1, h2), socks)]
        cpu0 = [cpu_seconds(d.pid) for d in daemons]
        busy = 0.0
        for r in range(rounds):
            timed_transfer(h1, h2, path, reps, 0, timeout, res, "raw", streams)
            t0 = time.perf_counter()
            timed_transfer(h1, h2, path, reps, TOS_TAGGED, timeout, res, "nic", streams)
            busy += time.perf_counter() - t0
            log(f"{label} round {r + 1}: untagged {res['raw_gbps'][-1]:.3f} Gbit/s, soft NIC ({res['path']}) "
                f"{res['nic_gbps'][-1]:.3f} Gbit/s")
            if ipv6:  # the same streams over IPv6, right after: the two families side by side
                c6 = [cpu_seconds(d.pid) for d in daemons]
                for mode, tos in (("raw6", 0), ("nic6", TOS_TAGGED)):
                    b0 = read_stats(socks[0])
                    t = transfer(h1, h2, path, reps, tos, timeout, streams=streams, ipv6=True)
                    res[mode + "_gbps"].append(8 * t["bytes"] / t["seconds"] / 1e9)
                    b1 = read_stats(socks[0])
                    for k in ("egress_orig_bytes", "egress_wire_bytes", "egress_compressed"):
                        res[f"{mode}_{k}"] = res.get(f"{mode}_{k}", 0) + b1[k] - b0[k]
                cpu0 = [c0 + cpu_seconds(d.pid) - c for d, c0, c in zip(daemons, cpu0, c6)]  # CPU: IPv4 runs only
                log(f"{label} round {r + 1}, IPv6: untagged {res['raw6_gbps'][-1]:.3f} Gbit/s, soft NIC "
                    f"({res['path']}) {res['nic6_gbps'][-1]:.3f} Gbit/s")
            if flood_pps:
                if r == 0:
                    before_flood, before_flood_tx = read_stats(socks[1]), read_stats(socks[0])
                fl, sent = flood_transfer(tb.hosts[2], h1, h2, path, reps, flood_pps, timeout)
                res["flood_gbps"].append(8 * fl["bytes"] / fl["seconds"] / 1e9)
                res["flood_sent"] += sent
                log(f"{label} round {r + 1}: soft NIC under the flood {res['flood_gbps'][-1]:.3f} Gbit/s ({sent} SYNs)")
        cpu = [cpu_seconds(d.pid) - c for d, c in zip(daemons, cpu0)]
        s1, s2 = read_stats(socks[0]), read_stats(socks[1])
        if flood_pps:
            res["flood_counted"] = {k: s2[k] - before_flood[k] for k in ("hello_received", "hello_evicted",
                                                                        "hello_sent", "flows_negotiated")}
            # tagged data the sender had to send raw for want of a negotiated flow: 0 if no flood
            # SYN ever cost the measured flows their negotiation
            res["flood_counted"]["sender_raw_not_negotiated"] = (s1["egress_raw_not_negotiated"]
                                                                 - before_flood_tx["egress_raw_not_negotiated"])
        stack.close()  # stop the daemons (and their rules) before the accept-only and gso runs
        if modes:
            res["modes"] = measure_modes(h1, h2, socks, path, error_bound, timeout, workdir, label)
        if gso:
            # round by round, the queue counts in turn (daemons started afresh each time): on a
            # shared machine the load moves between rounds, and so it hits every queue count alike
            runs = {q: [] for q in queues}
            for r in range(rounds):
                for q in queues:
                    runs[q].append(measure_gso(h1, h2, socks, path, reps, 1, error_bound, timeout, q, streams,
                                               rate_bps, label, first_round=r))
            res["gso_runs"] = [merge_gso(runs[q], rate_bps) for q in queues]
            first = res["gso_runs"][0]  # the figures of the first queue count, as before --queues
            res["gso_gbps"], res["gso_packets"], res["gso_bytes"] = first["gbps"], first["packets"], first["bytes"]
            res["gso"] = first["gbps_median"]
            for k in ("ratio", "super_packets", "send_errors", "drops", "sender_cpu", "receiver_cpu",
                      "sender_s_per_gb", "receiver_s_per_gb", "of_ideal"):
                if k in first:
                    res["gso_" + k] = first[k]
        if trains:
            ab = {False: [], True: []}
            for r in range(rounds):
                for t in (False, True):
                    ab[t].append(measure_gso(h1, h2, socks, path, reps, 1, error_bound, timeout, 1, streams,
                                             rate_bps, label, first_round=r, trains=t))
            res["trains_ab"] = {"v2": merge_gso(ab[False], rate_bps), "v3": merge_gso(ab[True], rate_bps)}
        if accept_only_too:
            with ExitStack() as acc:
                for h, s in zip((h1, h2), socks):
                    acc.enter_context(nicd(h, s, error_bound, accept_only=True, gso=False))
                for r in range(rounds):
                    a = transfer(h1, h2, path, reps, TOS_TAGGED, timeout)
                    res["accept_only_gbps"].append(8 * a["bytes"] / a["seconds"] / 1e9)
                    log(f"{label} accept-only round {r + 1}: {res['accept_only_gbps'][-1]:.3f} Gbit/s")
    if not flood_pps:  # (the flood's transfers ran in the same window)
        res["sender_s_per_gb"], res["receiver_s_per_gb"] = (c / (res["nic_bytes"] / 1e9) for c in cpu)
    res["ratio"] = s1["egress_orig_bytes"] / max(1, s1["egress_wire_bytes"])
    res["compressed_share"] = s1["egress_orig_bytes"] / max(1, s1["egress_orig_bytes"] + s1["egress_raw_bytes"])
    res["restored_packets"] = s2["ingress_restored"]
    res["super_packets"] = s1["gso_super_packets"] + s1["egress_trains"]  # 0 per packet
    res["drops"] = {k: v for k, v in s2.items() if k.startswith("drop_") and v}
    res["sender_cpu"] = cpu[0] / busy if busy else 0.0   # fraction of one core while tagged runs
    res["receiver_cpu"] = cpu[1] / busy if busy else 0.0
    for mode in ("raw", "nic", "gso"):  # data packets on the receiver's wire per MB of payload
        res[mode + "_packets_per_mb"] = res[mode + "_packets"] / (res[mode + "_bytes"] / 1e6) if res[mode + "_bytes"] else None
    res["raw"] = statistics.median(res["raw_gbps"])
    res["nic"] = statistics.median(res["nic_gbps"])
    if ipv6:
        res["raw6"], res["nic6"] = statistics.median(res["raw6_gbps"]), statistics.median(res["nic6_gbps"])
        res["ratio6"] = res["nic6_egress_orig_bytes"] / max(1, res["nic6_egress_wire_bytes"])
    res["accept_only"] = statistics.median(res["accept_only_gbps"]) if res["accept_only_gbps"] else None
    res["flood"] = statistics.median(res["flood_gbps"]) if res["flood_gbps"] else None
    if rate_bps:
        res["rate_gbps"] = rate_bps / 1e9
        res["ideal_gbps"] = rate_bps / 1e9 * res["ratio"]
        res["of_ideal"] = res["nic"] / res["ideal_gbps"]
    return res


def span(v: list) -> str:
    return f"[{min(v):.3f}-{max(v):.3f}]"


def link_label(x: dict) -> str:
    return f"{x['rate'] or 'unshaped'} MTU {x['mtu']}"


def per_gb(x: dict) -> str:
    """Daemon CPU seconds per GB of original payload, sender / receiver."""
    return f"{x['sender_s_per_gb']:.2f}/{x['receiver_s_per_gb']:.2f}" if "sender_s_per_gb" in x else "-"


def print_report(r: dict) -> None:
    print(f"Soft NIC goodput: {r['values']:,} real gradient values ({r['input']}, HDC on {r['dataset']}), "
          f"error bound 2^{r['error_bound']}; soft NIC {r['path']} (nicd --{'gso' if r['path'] == 'gso' else 'no-gso'}); "
          f"median of {r['rounds']} rounds [min-max]; Gbit/s of original payload")
    print(f"{'link':<22}{'untagged':>16}{'soft NIC':>20}{'ratio':>8}{'ideal':>8}{'of ideal':>9}{'CPU tx/rx':>12}"
          f"{'CPU s/GB tx/rx':>16}")
    for x in r["links"]:
        if not x.get("rate"):
            continue
        print(f"{link_label(x):<22}{x['raw']:>7.3f}{span(x['raw_gbps']):>9}"
              f"{x['nic']:>8.3f}{span(x['nic_gbps']):>12}{x['ratio']:>7.2f}x{x['ideal_gbps']:>8.3f}"
              f"{100 * x['of_ideal']:>8.0f}%{100 * x['sender_cpu']:>6.0f}/{100 * x['receiver_cpu']:.0f}%"
              f"{per_gb(x):>16}")
    ceil = [x for x in r["links"] if not x.get("rate")]
    if ceil:
        print("\nData path ceiling, unshaped veth (Gbit/s of original payload):")
        print(f"{'MTU':<8}{'no queue':>10}{'accept-only':>13}{'soft NIC':>10}{'ratio':>8}{'CPU tx/rx':>12}"
              f"{'CPU s/GB tx/rx':>16}")
        for x in ceil:
            acc = f"{x['accept_only']:.2f}" if x["accept_only"] is not None else "-"
            print(f"{x['mtu']:<8}{x['raw']:>10.2f}{acc:>13}{x['nic']:>10.2f}{x['ratio']:>7.2f}x"
                  f"{100 * x['sender_cpu']:>6.0f}/{100 * x['receiver_cpu']:.0f}%{per_gb(x):>16}")
    print("\nuntagged = the same stream with ToS 0, which no rule queues (the link without the soft NIC); "
          "ideal = link rate x the compression ratio the daemons measured; CPU = daemon CPU time / wall "
          "time of the tagged runs (100% = one core). Targets: 80% of ideal at 100 Mbit, 60% at 1 Gbit "
          "(MTU 9000), ceiling >= 4 Gbit/s.")


def print_gso_report(r: dict) -> None:
    links = [x for x in r["links"] if x.get("gso_runs")]
    if not links:
        return
    v3 = links[0]["gso_runs"][0].get("trains")
    print(f"\nGSO fast path (nicd --gso on both hosts, wire format {'v3, trains' if v3 else 'v2'}, "
          f"{r.get('streams', 1)} stream(s)) beside the per-packet soft NIC; "
          "Gbit/s of original payload, median [min-max]; data packets on the receiver's wire per MB of payload:")
    print(f"{'link':<22}{'soft NIC':>20}{'q':>3}{'--gso':>20}{'ratio':>8}{'of ideal':>9}{'CPU tx/rx':>12}"
          f"{'CPU s/GB tx/rx':>16}{'pkt/MB MSS':>12}{'per-packet':>11}{'--gso':>7}  packets per sender queue")
    for x in links:
        for g in x["gso_runs"]:
            ideal = f"{100 * g['of_ideal']:.0f}%" if g.get("of_ideal") else "-"
            per_mb = g["packets"] / (g["bytes"] / 1e6)
            print(f"{link_label(x):<22}{x['nic']:>7.3f}{span(x['nic_gbps']):>13}"
                  f"{g['queues']:>3}{g['gbps_median']:>7.3f}{span(g['gbps']):>13}{g['ratio']:>7.2f}x{ideal:>9}"
                  f"{100 * g['sender_cpu']:>6.0f}/{100 * g['receiver_cpu']:.0f}%"
                  f"{g['sender_s_per_gb']:>11.2f}/{g['receiver_s_per_gb']:.2f}"
                  f"{1e6 / (x['mtu'] - 52):>12.0f}{x['nic_packets_per_mb']:>11.0f}{per_mb:>7.0f}  "
                  + ", ".join("/".join(str(n) for n in per_queue) for per_queue in g["spread"])
                  + f"  (load {', '.join(f'{v:.1f}' for v in g['load'])})")
    print("q = queue pairs (threads) of each daemon (--queues); nicd's rules spread flows over them by a hash of "
          "addresses and ports, each flow on one queue (docs/perf.md); the queue counts run in turn, round by round, "
          "each round with daemons of its own: packets per sender queue of each round, and the load average after it. "
          "pkt/MB = data packets from the sender counted on the receiver's interface (before its daemon) per MB "
          "of original payload; MSS = what the untagged stream takes on a real wire, one per MSS (a veth carries "
          "untagged super-packets whole, so they are not counted). CPU = each daemon's CPU time (all threads) / wall "
          "time of the --gso runs, and per GB of original payload. Both ends, their daemons and the kernel share "
          "the machine's cores here.")


def print_ipv6_report(r: dict) -> None:
    links = [x for x in r["links"] if x.get("nic6_gbps")]
    if not links:
        return
    print(f"\nIPv4 beside IPv6 (--ipv6: each round sends both, through the same daemons, soft NIC {r['path']}); "
          "Gbit/s of original payload, median [min-max]:")
    print(f"{'link':<22}{'untagged v4':>20}{'untagged v6':>20}{'soft NIC v4':>20}{'soft NIC v6':>20}{'v6/v4':>7}"
          f"{'ratio v6':>9}")
    for x in links:
        print(f"{link_label(x):<22}"
              f"{x['raw']:>7.3f}{span(x['raw_gbps']):>13}{x['raw6']:>7.3f}{span(x['raw6_gbps']):>13}"
              f"{x['nic']:>7.3f}{span(x['nic_gbps']):>13}{x['nic6']:>7.3f}{span(x['nic6_gbps']):>13}"
              f"{x['nic6'] / x['nic']:>7.2f}{x['ratio6']:>8.2f}x")
    print("v6/v4 = soft NIC goodput over IPv6 / over IPv4 (medians); ratio v6 = original / wire payload bytes "
          "the sender's daemon counted during the IPv6 tagged streams. The ratio above counts both families' "
          "streams; CPU and wire packets only the IPv4 ones.")


def print_flood_report(r: dict) -> None:
    links = [x for x in r["links"] if x.get("flood") is not None]
    if not links:
        return
    print(f"\nUnder a flood of spoofed hello SYNs ({links[0]['flood_pps']:.0f}/s from a third host, random "
          "sources, to the stream's port); Gbit/s of original payload, median [min-max]:")
    print(f"{'link':<22}{'quiet':>16}{'flood':>20}{'flood/quiet':>13}{'link share':>12}{'SYNs sent':>11}"
          f"{'counted':>9}{'evicted':>9}{'raw tx':>8}")

    def share(x):  # of the receiver's link the flood takes: what it leaves the stream at best
        return f"{100 * x['flood_pps'] * SYN_FRAME_BITS / (x['rate_gbps'] * 1e9):.1f}%" if x.get("rate_gbps") else "-"
    for x in links:
        c = x["flood_counted"]
        print(f"{link_label(x):<22}{x['nic']:>7.3f}{span(x['nic_gbps']):>9}"
              f"{x['flood']:>8.3f}{span(x['flood_gbps']):>12}{100 * x['flood'] / x['nic']:>12.0f}%"
              f"{share(x):>12}{x['flood_sent']:>11}{c['hello_received']:>9}{c['hello_evicted']:>9}{c['sender_raw_not_negotiated']:>8}")
    print("link share = the flood's part of the receiver's link (76-byte hello SYNs in Ethernet frames): "
          "flood/quiet near 100% minus it means the soft NIC itself lost nothing to the flood. "
          "counted = hellos the receiver's daemon took (the rest were lost on the link or its queue); raw tx = "
          "tagged packets the sender sent raw for want of negotiation (0: the flood cost no flow its "
          "negotiation). The flood shares the link and, here, the CPU with the data path. The issue's "
          "target: flood within 10% of quiet.")


def run(args) -> int:
    if os.geteuid() != 0:
        raise UserError("bench nic builds network namespaces: run it as root")
    if args.rounds < 1:
        raise UserError("--rounds must be at least 1")
    if not 0 <= args.flood <= 1e6:
        raise UserError(f"--flood takes a rate from 0 to 1000000 SYNs per second, got {args.flood:g}")
    try:
        queues = tuple(int(q) for q in args.queues.split(","))
    except ValueError:
        raise UserError(f"--queues takes queue counts such as 1,2, got {args.queues!r}") from None
    if not all(1 <= q <= 64 for q in queues) or not 1 <= args.streams <= 64:
        raise UserError("--queues and --streams take 1 to 64")
    links = []
    for item in args.links.split(","):
        try:
            rate, mtu = item.strip().split("@")
            links.append((None if rate == "unshaped" else rate, int(mtu)))
            if rate != "unshaped":
                parse_rate(rate)
        except ValueError:
            raise UserError(f"--links takes RATE@MTU items such as 100mbit@9000 or unshaped@9000, got {item!r}") from None
    from ..train.data import load_dataset
    from ..train.gradients import gradient_sample

    dataset = load_dataset(args.data, seed=args.seed)
    log(f"capturing real gradients (HDC on {dataset.name}) ...")
    x = gradient_sample(args.captures, data=dataset, seed=args.seed)
    if args.input == "scaled":
        x, _ = scaled_copy(x, 4, 65536)
    path_gso = not (args.no_gso or args.both)  # --both: per packet first, then the gso runs
    report = {"dataset": dataset.name, "values": int(x.size), "input": args.input, "error_bound": args.error_bound,
              "rounds": args.rounds, "streams": args.streams, "path": "gso" if path_gso else "per-packet",
              "links": []}
    with tempfile.TemporaryDirectory(prefix="inceptionn-bench-nic-") as tmp:
        path = os.path.join(tmp, "stream.bin")
        x.astype(np.float32).tofile(path)
        for rate, mtu in links:
            reps = max(1, round(args.megabytes * 1e6 / x.nbytes * (parse_rate(rate) / 1e8 if rate else 10)))
            reps = min(reps, 40)
            report["links"].append(measure_link(rate, mtu, path, x.nbytes, reps, args.rounds, args.error_bound,
                                                tmp, accept_only_too=rate is None, flood_pps=args.flood,
                                                path_gso=path_gso, gso=args.both, queues=queues,
                                                streams=args.streams, modes=args.input == "raw",
                                                ipv6=args.ipv6, trains=args.trains))
    return emit(report, args.json, print_report, print_gso_report, print_ipv6_report, print_flood_report,
                print_modes_report, print_trains_report)


def print_trains_report(r: dict) -> None:
    links = [x for x in r["links"] if x.get("trains_ab")]
    if not links:
        return
    print("\nWire format v2 (gso: compressed packets by the raw socket) against v3 (--trains: one segment train "
          "per super-packet in its verdict, GRO-merged at the receiver), rounds in turn, daemons started afresh each:")
    print(f"{'link':<22}{'format':>7}{'Gbit/s median [min-max]':>28}{'ratio':>8}{'CPU s/GB tx/rx':>16}"
          f"{'pkt/MB':>8}{'load':>12}")
    for x in links:
        for name, g in x["trains_ab"].items():
            print(f"{link_label(x):<22}{name:>7}{g['gbps_median']:>11.2f} {span(g['gbps']):>16}{g['ratio']:>7.2f}x"
                  f"{g['sender_s_per_gb']:>8.2f} / {g['receiver_s_per_gb']:<5.2f}"
                  f"{g['packets'] / (g['bytes'] / 1e6):>8.0f}{min(g['load']):>6.1f}-{max(g['load']):<5.1f}")


def print_modes_report(r: dict) -> None:
    links = [x for x in r["links"] if x.get("modes")]
    if not links:
        return
    print(f"\nCodec modes on raw gradients (one pass of the stream each, error bound 2^{r['error_bound']}): "
          "the paper's (the sender's mark 0x28) beside per-packet scaled (0x24, the shim's default)")
    print(f"{'link':<22}{'path':<12}{'mode':<8}{'Gbit/s':>8}{'ratio':>8}{'NMSE':>9}")
    for x in links:
        for m in x["modes"]:
            print(f"{link_label(x):<22}{'gso' if m['gso'] else 'per packet':<12}"
                  f"{m['mode']:<8}{m['gbps']:>8.3f}{m['ratio']:>7.2f}x{m['nmse']:>9.4f}")
    print("NMSE = sum((received - sent)^2) / sum(sent^2) over the whole stream; ratio = original / wire "
          "payload bytes of the tagged packets, as the sender's daemon counted them.")


def add_arguments(p) -> None:
    p.add_argument("--links", default="100mbit@1500,100mbit@9000,1gbit@1500,1gbit@9000,unshaped@1500,unshaped@9000",
                   help="comma-separated RATE@MTU (RATE 'unshaped' for the ceiling); default: 100 Mbit and "
                   "1 Gbit at MTU 1500 and 9000, and unshaped")
    p.add_argument("--error-bound", type=int, default=DEFAULT_ERROR_BOUND,
                   help=f"error bound exponent (default {DEFAULT_ERROR_BOUND})")
    p.add_argument("--flood", type=float, default=0, metavar="PPS",
                   help="also measure each link while a third host sends PPS spoofed hello SYNs per second "
                   "to the receiver (e.g. 20000; default 0: no flood)")
    path = p.add_mutually_exclusive_group()
    path.add_argument("--no-gso", action="store_true",
                      help="measure the per-packet path (nicd --no-gso) instead of the daemons' default, gso")
    path.add_argument("--both", action="store_true",
                      help="per packet first, then every link again with nicd --gso, side by side")
    p.add_argument("--queues", default="1", metavar="N[,N...]",
                   help="with --both: run the --gso stream once per queue count in every round, in turn, each "
                   "daemon with --queues N (default 1)")
    p.add_argument("--trains", action="store_true",
                   help="also run the gso stream without and with nicd --trains (wire format v3) in turn, every "
                        "round, and report the two side by side")
    p.add_argument("--streams", type=int, default=1, metavar="M",
                   help="parallel streams per transfer (default 1; all between the same two hosts: with --queues N "
                   "nicd spreads them over its queues by a hash of their ports, each stream on one queue)")
    p.add_argument("--input", choices=["scaled", "raw"], default="scaled",
                   help="gradients as the collective sends them (scaled per 64K bucket, default) or raw; "
                   "raw also sends the stream once in each codec mode (paper's, per-packet scaled) and "
                   "reports ratio and NMSE side by side")
    p.add_argument("--ipv6", action="store_true",
                   help="also send every round's streams over IPv6 (2001:2::/64) and report both families "
                   "side by side")
    p.add_argument("--megabytes", type=float, default=50,
                   help="stream size at 100 Mbit (scaled up with the rate; default 50)")
    p.add_argument("--rounds", type=int, default=3, help="rounds per link (default 3)")
    p.add_argument("--captures", type=int, default=8, help="gradients captured (default 8, 25 MB)")
    p.add_argument("--data", metavar="PATH", help="MNIST to train on (default: digits)")
    p.add_argument("--seed", type=int, default=0, help="seed of the data split and the captured gradients (default 0)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(func=run)
