"""Checks shared by the codec test modules (imported by name: pytest puts tests/ on sys.path)."""
import numpy as np
import pytest

from inceptionn.codecs import get_codec


def assert_decodes_like_reference_or_both_refuse(name: str, blob: bytes, n: int) -> None:
    """Hostile input: the C decoder of codec ``name`` and its numpy reference both refuse ``blob``
    with ValueError, or both decode it to the same bits, and every decoded value is finite."""
    c, r = get_codec(name), get_codec(name, impl="numpy")
    try:
        y = c.decode(blob, n)
    except ValueError:
        with pytest.raises(ValueError):
            r.decode(blob, n)
        return
    np.testing.assert_array_equal(y.view(np.uint32), r.decode(blob, n).view(np.uint32))
    assert np.isfinite(y).all()
