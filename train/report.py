"""Progress lines, the comparison table (the paper's Fig. 12 and 13) and the PNG chart for
training runs (``inceptionn train``, ``inceptionn demo``, ``inceptionn bench train``)."""
from __future__ import annotations

import statistics
import sys
import time

PARTS = ("compute", "communicate", "sum", "codec")
STYLES = ("o-", "s--", "^-", "D--", "v-", "x--", "*-")  # WA and INC overlap: tell them apart


class Progress:
    """Turns launcher events into lines on stderr. On a terminal one status line is rewritten
    in place (iterations); epoch results and milestones are permanent lines either way."""

    def __init__(self, stream=None, prefix: str = "", quiet: bool = False):
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.prefix = prefix
        self.quiet = quiet
        self._status = False
        self.started = time.monotonic()

    def _clock(self) -> str:
        s = int(time.monotonic() - self.started)
        return f"{s // 60:d}:{s % 60:02d}"

    def line(self, msg: str) -> None:
        if self.quiet:
            return
        self._clear()
        print(f"{self.prefix}[{self._clock()}] {msg}", file=self.stream, flush=True)

    def status(self, msg: str) -> None:
        if self.quiet or not self.tty:
            return
        text = f"{self.prefix}[{self._clock()}] {msg}"
        self.stream.write("\r" + text[:150].ljust(self._status or 0))
        self.stream.flush()
        self._status = len(text[:150])

    def _clear(self) -> None:
        if self._status:
            self.stream.write("\r" + " " * self._status + "\r")
            self._status = False

    def event(self, cfg, ev: dict) -> None:
        kind = ev.get("event")
        name = cfg.name
        if kind == "status":
            self.line(f"{name}: {ev['message']}")
        elif kind == "ready" and ev.get("rank") == 0:
            self.line(f"{name}: {ev['world']} workers, {ev['dataset']}, {ev['n_train']} train / {ev['n_test']} test, "
                      f"{ev['iters_per_epoch']} iterations per epoch, {ev['n_params']:,} parameters")
        elif kind == "iter":
            self.status(f"{name}: epoch {ev['epoch']}, iteration {ev['iter']}/{ev['iters']}, loss {ev['loss']:.3f}")
        elif kind == "epoch":
            self.line(f"{name}: epoch {ev['epoch']}/{ev['epochs']}: test accuracy {100 * ev['accuracy']:.2f}%, "
                      f"training loss {ev['loss']:.3f}, {ev['train_seconds']:.1f} s training so far")

    def result(self, r) -> None:
        t = r.times
        self.line(f"{r.name}: done, final accuracy {100 * r.final_accuracy:.2f}%, {1000 * t['iteration']:.0f} ms per "
                  f"iteration ({1000 * t['communicate']:.0f} communicating), replicas "
                  f"{'identical' if r.replicas_identical else 'DIFFER'}")


def _ms(x: float) -> str:
    return f"{1000 * x:.1f}"


def _mb(x: float) -> str:
    return f"{x / 1e6:.2f}"


def _by_name(results) -> dict[str, list]:
    groups: dict[str, list] = {}
    for r in results:
        groups.setdefault(r.name, []).append(r)
    return groups


def comparison_rows(results, baseline: str = "WA", accuracy_runs=None) -> list[dict]:
    """Per configuration: mean breakdown (over runs, e.g. seeds), reduction and speedup against
    ``baseline``'s runs, accuracy mean and spread (of ``accuracy_runs`` of the same name when
    given: the demo times short runs on shaped links and trains whole runs over seeds apart)."""
    groups = _by_name(results)
    trained = _by_name(accuracy_runs) if accuracy_runs is not None else groups
    base = groups.get(baseline)
    base_comm = statistics.mean(r.times["communicate"] for r in base) if base else None
    base_iter = statistics.mean(r.times["iteration"] for r in base) if base else None
    rows = []
    for name, runs in groups.items():
        row = {"name": name, "runs": len(runs),
               **{k: statistics.mean(r.times[k] for r in runs) for k in PARTS + ("iteration",)}}
        row["exchange"] = row["communicate"] + row["sum"] + row["codec"]
        row["comm_reduction"] = (1 - row["communicate"] / base_comm) if base_comm else None
        row["speedup"] = (base_iter / row["iteration"]) if base_iter else None
        accs = [r.final_accuracy for r in trained.get(name, runs)]
        row["accuracy_runs"] = len(accs)
        row["accuracy"] = statistics.mean(accs)
        row["accuracy_min"], row["accuracy_max"] = min(accs), max(accs)
        row["accuracy_std"] = statistics.stdev(accs) if len(accs) > 1 else 0.0
        row["wire_per_iteration"] = statistics.mean(r.bytes["wire_per_iteration"] for r in runs)
        nic = [r.bytes["nicd"] for r in runs if r.bytes.get("nicd")]
        row["nic_ratio"] = statistics.mean(n["ratio"] for n in nic) if nic else None
        row["replicas_identical"] = all(r.replicas_identical for r in runs)
        row["seeds"] = [r.config["seed"] for r in trained.get(name, runs)]
        rows.append(row)
    return rows


def format_table(results, baseline: str = "WA", accuracy_runs=None) -> str:
    rows = comparison_rows(results, baseline, accuracy_runs)
    multi = any(r["accuracy_runs"] > 1 for r in rows)
    head = (f"{'config':<24}{'iteration':>10}{'compute':>9}{'comm':>9}{'sum':>7}{'codec':>7}"
            f"{'comm vs ' + baseline:>12}{'speedup':>9}{'wire/iter':>11}{'NIC ratio':>10}"
            f"{'accuracy':>{18 if multi else 10}}")
    lines = [head, f"{'':<24}{'ms':>10}{'ms':>9}{'ms':>9}{'ms':>7}{'ms':>7}{'':>12}{'':>9}{'MB':>11}"]
    for r in rows:
        is_base = r["name"] == baseline
        red = f"{-100 * r['comm_reduction']:+.1f}%" if r["comm_reduction"] is not None and not is_base else "-"
        sp = f"{r['speedup']:.2f}x" if r["speedup"] is not None else "-"
        ratio = f"{r['nic_ratio']:.2f}x" if r["nic_ratio"] else "-"
        acc = f"{100 * r['accuracy']:.2f}%"
        if multi:
            acc += f" ±{100 * r['accuracy_std']:.2f}" if r["accuracy_runs"] > 1 else "      "
        flag = "" if r["replicas_identical"] else "  replicas differ!"
        lines.append(f"{r['name']:<24}{_ms(r['iteration']):>10}{_ms(r['compute']):>9}{_ms(r['communicate']):>9}"
                     f"{_ms(r['sum']):>7}{_ms(r['codec']):>7}{red:>12}{sp:>9}{_mb(r['wire_per_iteration']):>11}"
                     f"{ratio:>10}{acc:>{18 if multi else 10}}{flag}")
    return "\n".join(lines)


def table_notes(baseline: str = "WA") -> str:
    return (f"Per iteration, mean over workers (first iteration, which opens the connections, left out): compute = "
            f"forward, backward and update; comm = time in the exchange outside summing and the codec (network, "
            f"waiting for peers); sum = adding gradients; codec = scaling, error feedback and app-level codec work. "
            f"comm vs {baseline} = change in communication time; speedup = {baseline}'s iteration time / this one's; "
            f"wire/iter = bytes every host's link carried per iteration (headers included); NIC ratio = tagged "
            f"payload before / after the soft NICs.")


def write_chart(results, path: str, title: str, baseline: str = "WA", accuracy_runs=None) -> str:
    """Stacked time breakdown per configuration (Fig. 12) with the speedup on top, and test
    accuracy per epoch (of ``accuracy_runs`` when given); PNG through matplotlib's Agg backend
    (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = comparison_rows(results, baseline, accuracy_runs)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.8), gridspec_kw={"width_ratios": [1.1, 1]})
    names = [r["name"] for r in rows]
    colors = {"compute": "#4c72b0", "communicate": "#dd8452", "sum": "#55a868", "codec": "#8172b3"}
    bottom = [0.0] * len(rows)
    for part in PARTS:
        vals = [1000 * r[part] for r in rows]
        if not any(vals):
            continue
        ax1.bar(names, vals, bottom=bottom, label=part, color=colors[part])
        bottom = [b + v for b, v in zip(bottom, vals)]
    for i, r in enumerate(rows):
        label = f"{r['speedup']:.2f}x" if r["speedup"] is not None else ""
        if r["comm_reduction"] is not None and r["name"] != baseline:
            label += f"\ncomm {-100 * r['comm_reduction']:+.0f}%"
        ax1.annotate(label, (i, bottom[i]), ha="center", va="bottom", fontsize=8, xytext=(0, 2),
                     textcoords="offset points")
    ax1.set_ylabel("time per iteration (ms)")
    has_base = any(r["name"] == baseline for r in rows)
    ax1.set_title("time per iteration" + (f"; speedup vs {baseline}" if has_base else ""))
    ax1.set_ylim(0, max(bottom or [1]) * 1.25)
    ax1.legend(fontsize=8)
    ax1.tick_params(axis="x", labelsize=8, rotation=15)
    by_name = _by_name(results if accuracy_runs is None else accuracy_runs)
    for name, runs in by_name.items():
        n = min(len(r.accuracy) for r in runs)
        if not n:
            continue
        curve = [100 * statistics.mean(r.accuracy[e] for r in runs) for e in range(n)]
        style = STYLES[len(ax2.lines) % len(STYLES)]
        ax2.plot(range(1, n + 1), curve, style, ms=4, label=name, alpha=0.85)
    from matplotlib.ticker import MaxNLocator

    ax2.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax2.set_xlabel("epoch")
    ax2.set_ylabel("test accuracy (%)")
    ax2.set_title("test accuracy" + (" (mean over seeds)" if any(len(v) > 1 for v in by_name.values()) else ""))
    ax2.grid(alpha=0.3)
    ax2.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
