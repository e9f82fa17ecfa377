"""Side-by-side timing for benchmarks on a shared, noisy machine: every variant runs once per
round, rounds repeat, and each variant reports its median with the min-max spread."""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field


@dataclass
class Timing:
    name: str
    nbytes: int  # bytes of input one call processes
    seconds: list[float] = field(default_factory=list)

    @property
    def median_gbps(self) -> float:
        return self.nbytes / statistics.median(self.seconds) / 1e9

    @property
    def spread_gbps(self) -> tuple[float, float]:
        return self.nbytes / max(self.seconds) / 1e9, self.nbytes / min(self.seconds) / 1e9


def interleaved(variants: dict, rounds: int, progress=None) -> dict[str, Timing]:
    """variants: name -> (callable, nbytes). Returns name -> Timing after ``rounds`` rounds."""
    out = {name: Timing(name, nbytes) for name, (_, nbytes) in variants.items()}
    for r in range(rounds):
        for name, (fn, _) in variants.items():
            t0 = time.perf_counter()
            fn()
            out[name].seconds.append(time.perf_counter() - t0)
        if progress:
            progress(f"round {r + 1}/{rounds}")
    return out


def cpu_name() -> str:
    """The CPU's model name, for a report's header ("unknown" where /proc/cpuinfo says none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"
