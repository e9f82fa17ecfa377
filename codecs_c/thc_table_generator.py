"""THC's non-uniform lookup table, computed offline as the paper describes (THC NSDI'24, Sec. 5.2
and Appendix B), and the script that writes the shipped tables to ``thc_table_generated.py``.

The problem: pick ``2^b`` quantization levels among the ``g+1`` evenly spaced grid points on
``[-t_p, t_p]`` (``t_p = Phi^-1(1 - p/2)``), both end points included, minimising the expected
squared error of *unbiased* stochastic quantization of a standard normal variable truncated to
``[-t_p, t_p]``. For a fixed set of levels the best unbiased rounding sends a value ``a`` between
two neighbouring levels ``l < u`` to one of them (probability ``(a-l)/(u-l)`` for ``u``), with
variance ``(a-l)(u-a)``; so the objective is a sum over consecutive level pairs of

    c(l, u) = integral_l^u (a - l)(u - a) phi(a) da

and the exact optimum over all ``C(g-1, 2^b-2)`` tables follows from a shortest path over the
grid (dynamic programming, ``O(2^b g^2)``), where the paper used a specialised ILP solver. Tied
optima (mirror images) are broken by a rule that no CPU's rounding can change: ``canonical_table``. The
truncated normal's normalising constant does not change the argmin and is left out. Levels are
returned as grid indices: ``T[0] = 0 < T[1] < ... < T[2^b-1] = g``.

Run ``python -m inceptionn.codecs.thc_table_generator`` (or this file) to regenerate
``thc_table_generated.py``;
the tests check that the shipped file equals a fresh computation.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path
from statistics import NormalDist

import numpy as np

# The (b, g, p) grid shipped in thc_table_generated.py. Other combinations are computed on demand with the
# same function (a few milliseconds for b <= 4).
SHIPPED_BITS = (2, 3, 4)  # b = 1 is always (0, g)
SHIPPED_MAX_GRANULARITY = 64
SHIPPED_P = tuple(2.0**-k for k in range(4, 11))  # 1/16 ... 1/1024: exact binary fractions

GENERATED = "thc_table_generated.py"   # the file main() writes

_GL_NODES, _GL_WEIGHTS = np.polynomial.legendre.leggauss(24)  # exact for the polynomial part


# t_p is rounded to this grid: NormalDist's inverse CDF calls the C library's log, which glibc
# picks per CPU (FMA or not) and may round differently in the last bit; the header's range M and
# the codec_id the ranks compare are computed from t_p, so every host must get the same float.
_T_P_GRID = 2.0**-40


def t_p(p: float) -> float:
    """The truncation threshold: ``Phi^-1(1 - p/2)`` (a p fraction of N(0,1) lies outside),
    rounded to a multiple of 2^-40 so that it does not depend on the CPU."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    return round(NormalDist().inv_cdf(1.0 - p / 2.0) / _T_P_GRID) * _T_P_GRID


def interval_costs(g: int, p: float) -> np.ndarray:
    """``cost[i, j]`` = expected unbiased-rounding variance contributed by ``a`` between grid
    points ``i < j`` (weighted by the normal pdf); ``inf`` where ``j <= i``."""
    t = t_p(p)
    grid = -t + 2.0 * t * np.arange(g + 1) / g
    lo = grid[:, None]
    hi = grid[None, :]
    half = (hi - lo) / 2.0
    mid = (hi + lo) / 2.0
    cost = np.zeros((g + 1, g + 1))
    for node, weight in zip(_GL_NODES, _GL_WEIGHTS):
        a = mid + half * node
        cost += weight * (a - lo) * (hi - a) * np.exp(-0.5 * a * a)
    cost *= half / math.sqrt(2.0 * math.pi)
    cost[np.tril_indices(g + 1)] = np.inf
    return cost


# Tables whose objectives lie within this relative distance of the best count as tied. The
# problem is symmetric (grid and pdf), so an asymmetric optimum always has a mirror image with the
# same objective; floating point sees the two a few ulps apart, in an order set by the CPU's exp,
# the BLAS behind the quadrature nodes and the summation order. Measured over the shipped grid:
# tied tables differ by at most 1.1e-15 (relative), distinct ones by at least 2.4e-5, so 1e-9
# separates them with many orders of magnitude to spare (tests/test_codec_thc.py checks this).
TIE_TOLERANCE = 1e-9


def canonical_table(cost: np.ndarray, levels: int) -> tuple[int, ...]:
    """Among the tables of ``levels`` levels from grid point 0 to the last whose objective (sum of
    ``cost`` over consecutive levels) is within ``TIE_TOLERANCE`` of the minimum, the
    lexicographically largest: the same on every machine, and for (4, 30, 1/32) the table the THC
    paper publishes. ``tail[k][i]`` is the cheapest way from grid point ``i`` to the last in ``k``
    intervals (a shortest path); the table is then chosen greedily, level by level, as the
    largest next point from which a near-optimal completion still exists."""
    g = cost.shape[0] - 1
    tail = [np.full(g + 1, np.inf)]
    tail[0][g] = 0.0
    for _ in range(levels - 1):
        tail.append(np.min(cost + tail[-1][None, :], axis=1))
    bound = tail[levels - 1][0] * (1.0 + TIE_TOLERANCE)
    table, spent = [0], 0.0
    for left in range(levels - 2, -1, -1):      # intervals still to place after this one
        here = table[-1]
        ok = np.nonzero(spent + cost[here] + tail[left] <= bound)[0]
        table.append(int(ok[-1]))
        spent += cost[here, table[-1]]
    assert table[-1] == g and all(a < b for a, b in zip(table, table[1:])), table
    return tuple(table)


def optimal_table(bits: int, g: int, p: float) -> tuple[int, ...]:
    """The optimal ``T_{b,g,p}`` as grid indices (exact up to ``TIE_TOLERANCE``, by dynamic
    programming; ties broken the same way on every machine, see ``canonical_table``)."""
    _check(bits, g)
    levels = 1 << bits
    if levels == 2:
        return (0, g)
    return canonical_table(interval_costs(g, p), levels)


def expected_variance(table, g: int, p: float) -> float:
    """Objective value of ``table`` (in units of the standard normal, pdf-weighted)."""
    cost = interval_costs(g, p)
    return float(sum(cost[a, b] for a, b in zip(table, table[1:])))


def uniform_table(bits: int) -> tuple[int, ...]:
    """Uniform THC: ``T`` is the identity and ``g = 2^b - 1``."""
    return tuple(range(1 << bits))


def _check(bits: int, g: int) -> None:
    if not 1 <= bits <= 8:
        raise ValueError(f"bits must be in 1..8, got {bits}")
    if not (1 << bits) - 1 <= g <= 255:
        raise ValueError(f"granularity must be in {(1 << bits) - 1}..255 for {bits} bits, got {g}")


def shipped_tables() -> dict[tuple[int, int, float], tuple[int, ...]]:
    out = {}
    for bits in SHIPPED_BITS:
        for g in range((1 << bits) - 1, SHIPPED_MAX_GRANULARITY + 1):
            for p in SHIPPED_P:
                out[(bits, g, p)] = optimal_table(bits, g, p)
    return out


def render(tables) -> str:
    lines = [
        "# Generated by codecs_c/thc_table_generator.py: do not edit; regenerate with",
        "# python -m inceptionn.codecs.thc_table_generator",
        '"""THC non-uniform lookup tables T_{b,g,p}, computed offline by the dynamic program of',
        "thc_table_generator.py.",
        "",
        "Key (bits, granularity, p) -> table of 2^bits grid indices, 0 = T[0] < ... < T[-1] = g.",
        '"""',
        "",
        "TABLES = {",
    ]
    for (bits, g, p), table in tables.items():
        lines.append(f"    ({bits}, {g}, {p!r}): {table!r},")
    lines.append("}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    path = Path(argv[0]) if argv else Path(__file__).with_name(GENERATED)
    path.write_text(render(shipped_tables()))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
