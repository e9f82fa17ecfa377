"""Parse and print rates, times and percentages the way tc(8) writes them.

Rates: a bare number is bit/s; ``bit``, ``kbit``, ``mbit``, ``gbit``, ``tbit`` are decimal
multiples of bits, ``kibit``/``mibit``/... binary ones; ``bps``, ``kbps``, ``mbps``, ... are
*bytes* per second (tc's convention, easy to trip over). Times: a bare number is microseconds;
``s``, ``ms``, ``us`` (and tc's ``sec``/``msec``/``usec`` spellings). Percentages: ``0.5%`` or a
bare ``0.5``, both meaning half a percent, as in tc-netem.

Every function raises ``UserError`` with a one-line message on bad input, so the CLI can print
it as is.
"""
from __future__ import annotations

import math
import re

from inceptionn.errors import UserError

_NUMBER = re.compile(r"^\s*([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*([A-Za-z%]*)\s*$")

# Multipliers to bit/s. Lower-cased keys: tc matches units case-insensitively.
_RATE_UNITS = {
    "": 1, "bit": 1,
    "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12,
    "kibit": 2**10, "mibit": 2**20, "gibit": 2**30, "tibit": 2**40,
    "bps": 8,
    "kbps": 8 * 10**3, "mbps": 8 * 10**6, "gbps": 8 * 10**9, "tbps": 8 * 10**12,
    "kibps": 8 * 2**10, "mibps": 8 * 2**20, "gibps": 8 * 2**30, "tibps": 8 * 2**40,
}

# Multipliers to microseconds.
_TIME_UNITS = {
    "": 1,
    "us": 1, "usec": 1, "usecs": 1,
    "ms": 1000, "msec": 1000, "msecs": 1000,
    "s": 10**6, "sec": 10**6, "secs": 10**6,
}

# Printing uses the largest unit the value reaches.
_RATE_PRINT = [("tbit", 10**12), ("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3), ("bit", 1)]
_TIME_PRINT = [("s", 10**6), ("ms", 1000), ("us", 1)]


def _split(text: str, what: str) -> tuple[float, str]:
    match = _NUMBER.match(str(text))
    if not match:
        raise UserError(f"bad {what} {text!r}: expected a number with an optional unit")
    value = float(match.group(1))
    if not math.isfinite(value):
        raise UserError(f"bad {what} {text!r}: not a finite number")
    return value, match.group(2).lower()


def parse_rate(text: str) -> int:
    """'100mbit' -> 100_000_000 (bit/s). Zero and negative rates are errors."""
    value, unit = _split(text, "rate")
    if unit not in _RATE_UNITS:
        raise UserError(
            f"bad rate {text!r}: unknown unit {unit!r} (use bit, kbit, mbit, gbit, tbit, or bps, kbps, "
            "mbps, gbps for bytes/s; a bare number is bit/s)"
        )
    if value <= 0:
        raise UserError(f"bad rate {text!r}: must be greater than zero")
    bits = round(value * _RATE_UNITS[unit])
    if bits < 8:  # below one byte per second the kernel cannot express it
        raise UserError(f"bad rate {text!r}: must be at least 8bit (one byte per second)")
    return bits


def parse_time(text: str) -> int:
    """'2ms' -> 2000 (microseconds). Negative times are errors; zero is allowed."""
    value, unit = _split(text, "time")
    if unit not in _TIME_UNITS:
        raise UserError(f"bad time {text!r}: unknown unit {unit!r} (use s, ms or us; a bare number is us)")
    if value < 0:
        raise UserError(f"bad time {text!r}: must not be negative")
    return round(value * _TIME_UNITS[unit])


def parse_percent(text: str) -> float:
    """'0.5%' or '0.5' -> 0.5 (percent). Must lie in [0, 100]."""
    value, unit = _split(text, "percentage")
    if unit not in ("", "%"):
        raise UserError(f"bad percentage {text!r}: unknown unit {unit!r} (write e.g. 0.5%)")
    if value < 0 or value > 100:
        raise UserError(f"bad percentage {text!r}: must lie between 0% and 100%")
    return value


def format_rate(bits_per_second: int | float) -> str:
    """100_000_000 -> '100mbit', 1_500_000 -> '1.5mbit' (largest unit, up to 3 decimals)."""
    bits = float(bits_per_second)
    for name, mult in _RATE_PRINT:
        if bits >= mult:
            return f"{bits / mult:.3f}".rstrip("0").rstrip(".") + name
    return f"{bits:g}bit"


def format_time(microseconds: int | float) -> str:
    """2000 -> '2ms', 1500 -> '1.5ms'."""
    us = float(microseconds)
    for name, mult in _TIME_PRINT:
        if us >= mult:
            return f"{us / mult:.3f}".rstrip("0").rstrip(".") + name
    return f"{us:g}us"


def format_percent(percent: float) -> str:
    """0.5 -> '0.5%'."""
    return f"{percent:.4f}".rstrip("0").rstrip(".") + "%"
