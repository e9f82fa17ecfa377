"""Ranges of settings that several entry points check (nicd's config file and flags, training
jobs, the codec itself), kept in one place so they accept and say the same."""
from __future__ import annotations

# Error-bound exponents k of the INCEPTIONN codec (the bound is 2^k). The C codec's own limits,
# INC_MIN/MAX_ERROR_BOUND in codecs_c/inceptionn_codec.h; tests/test_cli.py checks they agree.
ERROR_BOUND_MIN, ERROR_BOUND_MAX = -30, -1


def error_bound_problem(k) -> str | None:
    """Why ``k`` is not a usable error-bound exponent (for an error line), or None if it is."""
    if isinstance(k, bool) or not isinstance(k, int) or not ERROR_BOUND_MIN <= k <= ERROR_BOUND_MAX:
        return (f"must be an integer exponent from {ERROR_BOUND_MIN} to {ERROR_BOUND_MAX} "
                f"(bound 2^k), got {k!r}")
    return None
