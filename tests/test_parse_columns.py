"""The JSON texts of a float column kept as printed decimals (``columns.decimal_texts``) are
exactly ``repr`` of each float."""

from __future__ import annotations

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from analysis.parse.columns import decimal_texts

_K = st.one_of(st.none(), st.integers(-(2**31) + 1, 2**31 - 1))


@settings(max_examples=500, deadline=None)
@given(st.lists(_K, max_size=40), st.integers(0, 6))
@example([0, 1, -1, 5, 10, 100, 999999, 2**31 - 1, -(2**31) + 1, None], 0)
@example([0, 1, -1, 5, 10, 99, 100, 101, 1000, 123450, -100000, None], 5)
@example([1, 9, 10, 99, 100, 999, 1000, 1001, -1, -99, -100, 12345600], 6)
def test_decimal_texts_are_the_repr_of_each_float(ks: list[int | None], d: int) -> None:
    """Whole numbers ("5.0"), trailing zeros, signs, values below 1e-4 (an exponent), None."""
    want = ["null" if k is None else float.__repr__(k / 10.0**d) for k in ks]
    for dtype in (np.int32, np.int64):  # (None is the type's smallest value)
        none = np.iinfo(dtype).min
        raw = np.array([none if k is None else k for k in ks], dtype=dtype)
        assert decimal_texts(raw, d).tolist() == want
