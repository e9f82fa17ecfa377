"""Ranges of settings that several entry points check (nicd's config file and flags, training
jobs, the codec itself), kept in one place so they accept and say the same."""
from __future__ import annotations

# Error-bound exponents k of the INCEPTIONN codec (the bound is 2^k) and their default, from
# inceptionn/inceptionn_contract.h, which the C codec includes too.
from .shim.contract import DEFAULT_ERROR_BOUND, ERROR_BOUND_MAX, ERROR_BOUND_MIN  # noqa: E402, F401
# The largest headroom of the per-block scaling (inceptionn_contract.h, the C scaling's too).
from .shim.contract import MAX_HEADROOM  # noqa: E402, F401


def error_bound_problem(k) -> str | None:
    """Why ``k`` is not a usable error-bound exponent (for an error line), or None if it is."""
    if isinstance(k, bool) or not isinstance(k, int) or not ERROR_BOUND_MIN <= k <= ERROR_BOUND_MAX:
        return (f"must be an integer exponent from {ERROR_BOUND_MIN} to {ERROR_BOUND_MAX} "
                f"(bound 2^k), got {k!r}")
    return None


def headroom_problem(h) -> str | None:
    """Why ``h`` is not a usable headroom of the per-block scaling (for an error line), or None."""
    if isinstance(h, bool) or not isinstance(h, int) or not 0 <= h <= MAX_HEADROOM:
        return (f"must be an integer in 0..{MAX_HEADROOM} (the bits of precision each block of the scaled wire "
                f"gives up for compression; 0 the most precise), got {h!r}")
    return None
