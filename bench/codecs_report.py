"""The report of ``inceptionn bench codecs``: the rows as JSON, the table and the notes that say
how each column was measured (bench/codecs.py measures)."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .codecs import Row

LAST_EPOCHS = 5      # test accuracy swings from epoch to epoch: also report the mean of the last 5


def build_rows(rows: list[Row], qual: dict, times: dict, train: dict | None) -> list[dict]:
    out = []
    memcpy = times["memcpy"]
    base = None
    base_last = None
    if train:
        base = train["runs"]["baseline"]["final_accuracy"]
        base_last = train["runs"]["baseline"]["mean_last_epochs"]
        base_err = train["runs"]["baseline"]["error"]
    out.append({"id": "float32", "label": "float32, no compression", "codec": None, "unit": "-",
                "paper": "", "ratio": 1.0, "bits_per_value": 32.0, "nmse": 0.0, "ef_sum_nmse": None,
                "encode": memcpy, "decode": memcpy, "accuracy": base, "accuracy_last_epochs": base_last,
                "accuracy_from": "baseline" if train else None,
                "training_error": base_err if train else None,
                "note": "memcpy of the same bytes in the same rounds"})
    for row in rows:
        q = qual[row.id]
        rid = row.train_as or row.id
        acc = src = err = last = None
        if train and rid in train["runs"]:
            run = train["runs"][rid]
            acc, last, src, err = run["final_accuracy"], run["mean_last_epochs"], rid, run["error"]
        out.append({"id": row.id, "label": row.label, "codec": row.codec, "params": row.params, "unit": row.unit,
                    "error_feedback": row.ef, "scaled": row.scaled, "paper": row.paper,
                    "ratio": q["ratio"], "bits_per_value": q["bits_per_value"], "wire_bytes": q["wire_bytes"],
                    "agreement_bytes": q["agreement_bytes"], "nmse": q["nmse"],
                    "nmse_sequence": q.get("nmse_sequence"), "ef_sum_nmse": q.get("ef_sum_nmse"),
                    "encode": times[f"encode {row.id}"], "decode": times[f"decode {row.id}"],
                    "accuracy": acc, "accuracy_last_epochs": last, "accuracy_from": src, "training_error": err,
                    "note": row.note})
    return out


def _gbps(t: dict) -> str:
    return f"{t['gbps']:.2f} [{t['min_gbps']:.2f}-{t['max_gbps']:.2f}]"


def _nm(v) -> str:
    if v is None:
        return "-"
    return f"{v:.3g}" if v >= 1e-3 or v == 0 else f"{v:.2e}"


def format_table(report: dict) -> str:
    train = report.get("training")
    head = (f"{'codec, settings':<28}{'unit':<9}{'ratio':>8}  {'paper':<31}{'bits/val':>8}{'NMSE':>10}"
            f"{'EF sum':>10}  {'encode GB/s':<18}{'decode GB/s':<18}"
            + (f"{'accuracy':>9}{'last ' + str(LAST_EPOCHS):>8}" if train else ""))
    lines = [head, "-" * len(head)]
    for r in report["rows"]:
        if train is None:
            acc = ""
        elif r.get("training_error"):
            acc = f"{'diverged' if 'diverged' in r['training_error'] else 'failed':>9}{'':>8}"
        elif r["accuracy"] is None:
            acc = f"{'n/a':>9}{'':>8}"
        else:
            mark = "*" if r["accuracy_from"] not in (r["id"], "baseline") else ""
            acc = f"{100 * r['accuracy']:.2f}%{mark}".rjust(9) + f"{100 * r['accuracy_last_epochs']:.2f}%".rjust(8)
        lines.append(f"{r['label']:<28}{r['unit']:<9}{r['ratio']:>7.2f}x  {r['paper']:<31}{r['bits_per_value']:>8.3f}"
                     f"{_nm(r['nmse']):>10}{_nm(r['ef_sum_nmse']):>10}  {_gbps(r['encode']):<18}{_gbps(r['decode']):<18}"
                     f"{acc}")
    return "\n".join(lines)


def print_report(report: dict) -> None:
    g = report["gradients"]
    print(f"Gradient codecs on real gradients: {g['captures']} gradients of the HDC model on {g['dataset']} "
          f"({g['params']:,} parameters each, {g['values']:,} float32 values, {g['bytes'] / 1e6:.1f} MB), "
          f"captured over its first two epochs")
    print(f"CPU: {report['cpu']}; one thread; GB/s of float32 input, median of {report['rounds']} interleaved rounds "
          f"[min-max]; load average {report['load_average'][0]:.1f} at the start, "
          f"{report['load_average_end'][0]:.1f} at the end ({os.cpu_count()} cores)\n")
    print(format_table(report))
    print()
    print("ratio: float32 bytes / bytes out, everything counted: headers, scalers, bitmaps, THC's table and power-of-two "
          "padding, INCEPTIONN scaled's exponent floats (wire format v2: one per 256 values), and 8 bytes per value "
          "agreed among workers before sending (THC: the norm).")
    print("unit: value = per value over whole gradients; tensor = each layer's weight and bias on its own (10 per "
          "gradient); gradient = the whole 789,010-value gradient as one vector.")
    print("NMSE: ||decoded - g||^2 / ||g||^2 of one round trip, summed over the captures; for EF rows each capture "
          "encoded with nothing accumulated, as a first step would be. EF sum: the rows with error feedback run it over the captures in order (3LC: "
          "one accumulation buffer per tensor; THC: its e = x - RHT^-1(own quantized)); NMSE of the sum of all "
          "decoded steps against the sum of the gradients (what is still pending in the residual).")
    print("GB/s: as the row runs (encode with error feedback for EF rows; INCEPTIONN scaled: the wire transform and "
          "the codec, and back), C paths through the Python API; decode of the blobs the row produced; float32 row: "
          "memcpy.")
    ring = report.get("summed_ring")
    if ring:
        c, t = ring["codec_seconds"], ring["call_cpu_seconds"]
        print(f"Summed in the ring ({ring['row']}, the C engine Group.allreduce runs, summed without decoding, error "
              f"feedback on): {ring['ranks']} ranks as threads on this host, {ring['values']:,} values per call, "
              f"{ring['calls']} calls; per call and rank: codec + sum {1e3 * c['median']:.1f} ms "
              f"[{1e3 * c['min']:.1f}-{1e3 * c['max']:.1f}] (the engine's stats, wall), whole call "
              f"{1e3 * t['median']:.1f} ms [{1e3 * t['min']:.1f}-{1e3 * t['max']:.1f}] thread CPU; NMSE of the sum "
              f"{ring['nmse']:.4f}.")
    train = report.get("training")
    if train:
        print(f"accuracy: final test accuracy of the HDC trained data-parallel with the INC ring on {train['hosts']} "
              f"testbed hosts ({train['rate'] or 'unshaped'} links), {train['epochs']} epoch(s) = "
              f"{train['iterations'] or '?'} iterations on {train['dataset']}, seed {train['seed']}; the codec runs inside "
              f"the collective (compress=<codec>, built with its defaults: the settings of that row); float32 row = "
              f"the uncompressed ring; last {LAST_EPOCHS}: mean test accuracy of the last {LAST_EPOCHS} epochs (it swings by "
              f"several points from epoch to epoch on this small test set). * = the run of the row it differs from only losslessly (packing, ZRE). n/a: "
              f"the training worker builds each codec with its default settings only.")
        for run in train["runs"].values():
            if run["error"]:
                print(f"training run {run['name']} failed: {run['error']}")
    else:
        print("accuracy: not run (add --train-epochs E: one data-parallel training run per codec on a testbed).")


