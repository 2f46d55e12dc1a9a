"""The number encodings a ``Column`` (``analysis.parse.columns``) picks from: the narrowest
signed array code that holds a range of ints, the decimal scale that gives a float column back
exactly, the helpers its stores share, and one value as JSON text.
"""

from __future__ import annotations

import json
import math
from array import array
from collections.abc import Iterator
from typing import Any

import numpy as np

CODES = ("b", "h", "i", "q")


MIN = {"b": -(2**7), "h": -(2**15), "i": -(2**31), "q": -(2**63)}


MAX = {c: -m - 1 for c, m in MIN.items()}


MAX_SCALE = 9
"""Largest number of decimals a float column is scaled by (10**9)."""


EXACT = 2**53
"""Integers up to this are exact doubles."""


def code_for(lo: int, hi: int) -> str | None:
    """Smallest array code holding every int in [lo, hi] (the code's minimum is None)."""
    for code in CODES:
        if MIN[code] < lo and hi <= MAX[code]:
            return code
    return None


def scale_of(values: np.ndarray) -> int | None:
    """Smallest number of decimals d with round(v * 10**d) / 10**d == v for every value."""
    if not len(values):
        return 0
    if not np.isfinite(values).all() or (np.signbit(values) & (values == 0)).any():
        return None
    for d in range(MAX_SCALE + 1):
        f = 10.0**d
        scaled = np.rint(values * f)
        if np.abs(scaled).max() >= EXACT:
            return None
        back = scaled / f
        if (back == values).all() and (np.signbit(back) == np.signbit(values)).all():
            return d
    return None


def as_bytes(values: np.ndarray) -> memoryview:
    """The bytes of an array, for ``array.frombytes`` (no copy when it is contiguous)."""
    return memoryview(np.ascontiguousarray(values)).cast("B")


def present_range(vals: np.ndarray, none: np.ndarray, piece: int) -> tuple[int, int]:
    """(min, max) of 0 and the values not marked None, a piece at a time: no whole-length
    copy of the present values (``piece`` values at a time)."""
    lo = hi = 0
    for a in range(0, len(vals), piece):
        part = vals[a : a + piece][~none[a : a + piece]]
        if len(part):
            lo, hi = min(lo, int(part.min())), max(hi, int(part.max()))
    return lo, hi


def diff_from(values: np.ndarray, before: int) -> np.ndarray:
    """``np.diff(values, prepend=before)`` (int64) without its whole-length concatenation."""
    out = np.empty(len(values), dtype=np.int64)
    if len(values):
        out[0] = int(values[0]) - before
        np.subtract(values[1:], values[:-1], out=out[1:], dtype=np.int64)  # (int32 in: no wrap)
    return out


def repeat_value(value: Any, n: int) -> Iterator[Any]:
    for _ in range(n):
        yield value


def running_sum(diffs: array[int]) -> Iterator[int]:
    total = 0
    for d in diffs:
        total += d
        yield total


def json_text(v: Any) -> str:
    """One value as JSON, as ``json`` writes it (a float that is not finite raises)."""
    if v is None:
        return "null"
    if type(v) is float:
        if v != v or v in (math.inf, -math.inf):
            raise ValueError(f"out of range float value in the JSON output: {v!r}")
        return float.__repr__(v)
    if type(v) is int:
        return int.__repr__(v)
    return json.dumps(v, allow_nan=False, default=str)
