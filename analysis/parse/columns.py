"""Typed columns of optional numbers (``Column``): one field of every record, in numpy arrays
that give back exactly what was put in (docs/parsing.md, "How the records are kept")."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

_BATCH = 4096
"""Values added one at a time that wait before they are stored as an array."""

_INTS = (np.int8, np.int16, np.int32, np.int64)

_MAX_SCALE = 6
"""Most decimals a float column is kept to as ints."""

_TEXT_TABLE = 1 << 18
"""Most texts ``json_texts`` formats ahead, for a column of a short range of ints."""


def none_of(dtype: np.dtype) -> Any:
    """The stored value that means None."""
    return math.nan if dtype.kind == "f" else None if dtype.kind == "O" else np.iinfo(dtype).min


def _int_type(lo: int, hi: int) -> type:
    """The narrowest signed int type holding [lo, hi] above its smallest value (None)."""
    return next(t for t in _INTS if np.iinfo(t).min < lo and hi <= np.iinfo(t).max)


def _scaled(values: np.ndarray, d: int) -> np.ndarray | None:
    """``values`` (float64, NaN = None) as ints ``k`` (the narrowest type, int32 at most)
    with ``k / 10**d`` giving each value back exactly (None as the type's smallest), or None
    when one is not such a decimal."""
    with np.errstate(invalid="ignore", over="ignore"):
        k = np.rint(values * 10.0**d)
        none = np.isnan(values)
        ok = (k / 10.0**d == values) | none
        ok &= (np.abs(k) < 2**31 - 1) | none
    if not ok.all() or (np.signbit(values) & (values == 0)).any():
        return None
    k[none] = 0
    t = _int_type(int(k.min()), int(k.max()))
    out = k.astype(t)
    out[none] = none_of(out.dtype)
    return out


def json_text(v: Any) -> str:
    """One value as JSON, as ``json`` writes it (a float that is not finite raises)."""
    if v is None:
        return "null"
    if type(v) is float:
        if not math.isfinite(v):
            raise ValueError(f"out of range float value in the JSON output: {v!r}")
        return float.__repr__(v)
    if type(v) is int:
        return int.__repr__(v)
    return json.dumps(v, allow_nan=False, default=str)


class Column:
    """A column of optional ints or floats (module doc)."""

    __slots__ = ("_objs", "_parts", "_scale", "_tail", "kind")

    def __init__(self, kind: str, values: Iterable[Any] = ()) -> None:
        if kind not in ("i", "f"):
            raise ValueError(f"kind({kind!r}) must be 'i' or 'f'")
        self.kind = kind
        self._parts: list[np.ndarray] = []  # the stored arrays, in order
        self._scale: int | None = None  # floats kept as ints k / 10**scale, else float64
        self._tail: list[Any] = []  # values added one at a time, not yet stored
        self._objs = False  # the values in object arrays: one no other array holds came
        self.extend(values)

    # -- writing ----------------------------------------------------------------------------

    def _fits(self, v: Any) -> bool:
        """Whether an array holds ``v`` exactly."""
        if v is None:
            return True
        if self.kind == "f":
            return type(v) is float and math.isfinite(v)
        return type(v) is int and -(2**63) < v < 2**63

    def append(self, v: Any) -> None:
        """Add one value."""
        if not self._objs and not self._fits(v):
            self._parts, self._tail, self._scale, self._objs = [], list(self), None, True
        self._tail.append(v)
        if len(self._tail) >= _BATCH:
            self._store_tail()

    def extend(self, values: Iterable[Any]) -> None:
        """Add several values."""
        for v in values:
            self.append(v)

    def _store_tail(self) -> None:
        tail, self._tail = self._tail, []
        if not tail:
            return
        if self._objs:
            self._parts.append(np.empty(len(tail), dtype=object))
            self._parts[-1][:] = tail
            self._merge()
            return
        if self.kind == "f":
            self._add_floats(np.array([math.nan if v is None else v for v in tail]))
            return
        present = [v for v in tail if v is not None] or [0]
        t = _int_type(min(present), max(present))
        self._add(np.array([np.iinfo(t).min if v is None else v for v in tail], dtype=t))

    def _add(self, arr: np.ndarray, merge: bool = True) -> None:
        """Store an int array (ints, or decimals as ``k``; None as the type's smallest value),
        widening the column's; ``merge=False`` leaves it apart (joined when the column is read)."""
        if self._parts and self._parts[0].dtype != arr.dtype:
            wide = np.promote_types(self._parts[0].dtype, arr.dtype)
            self._parts = [_widened(p, wide) for p in self._parts]
            arr = _widened(arr, wide)
        self._parts.append(arr)
        if merge:
            self._merge()

    def _merge(self) -> None:
        """Join the last two stored arrays while the one before is not longer than the last:
        a few arrays of falling lengths (each value copied a few times), not thousands of
        small ones left to join when the column is read."""
        parts = self._parts
        while len(parts) > 1 and len(parts[-2]) <= len(parts[-1]):
            last = parts.pop()
            parts[-1] = np.concatenate([parts[-1], last])

    def _add_floats(self, v: np.ndarray) -> None:
        """Store finite floats (NaN = None): as scaled ints while the column can (the fewest
        decimals that hold them and the stored values), else as float64."""
        if not len(v):
            return
        lowest = 0 if not self._parts else self._scale
        for d in range(lowest, _MAX_SCALE + 1) if lowest is not None else ():
            k = _scaled(v, d)
            if k is not None and self._parts and d != self._scale:  # the stored values too
                parts = [_scaled(self._decode(p), d) for p in self._parts]
                if any(p is None for p in parts):
                    continue
                self._parts = []
                for p in parts:
                    self._add(p)  # type: ignore[arg-type]
            if k is not None:
                self._scale = d
                self._add(k)
                return
        if self._scale is not None:  # float64 from now on
            self._parts = [self._decode(p) for p in self._parts]
            self._scale = None
        self._parts.append(v)
        self._merge()

    def add_floats(self, values: np.ndarray) -> None:
        """Add floats in bulk (``kind="f"``; NaN is None)."""
        v = np.array(values, dtype=np.float64)  # (a copy: the caller's array may be a view)
        if self._objs or np.isinf(v).any():
            self.extend(None if x != x else x for x in v.tolist())
            return
        self._store_tail()
        self._add_floats(v)

    def add_ints(
        self, values: np.ndarray, none: np.ndarray | None = None, copy: bool = True
    ) -> None:
        """Add ints in bulk (``kind="i"``), None where ``none`` is true; ``copy=False``:
        ``values`` may be kept and changed (the caller lets it go)."""
        v = np.asarray(values)
        if v.dtype.kind != "i":
            v = v.astype(np.int64)
        if not len(v):
            return
        some = None if none is None else ~none  # (min and max of those: no copy of them)
        info = np.iinfo(v.dtype)
        lo = int(v.min(where=some, initial=info.max)) if some is not None else int(v.min())
        hi = int(v.max(where=some, initial=info.min)) if some is not None else int(v.max())
        lo, hi = (lo, hi) if lo <= hi else (0, 0)
        if self._objs or lo == -(2**63):
            marks = [False] * len(v) if none is None else none.tolist()
            self.extend(None if m else x for x, m in zip(v.tolist(), marks, strict=True))
            return
        self._store_tail()
        t = _int_type(lo, hi)
        arr = v.astype(t, copy=copy)
        if none is not None:
            arr[none] = np.iinfo(t).min
        self._add(arr)

    def add_const(self, v: Any, n: int) -> None:
        """Add ``n`` copies of ``v``."""
        if self._objs or not self._fits(v) or n < 16:
            self.extend([v] * max(n, 0))
        elif self.kind == "f":
            self.add_floats(np.full(n, math.nan if v is None else v))
        else:
            self.add_ints(np.full(n, 0 if v is None else v, dtype=np.int64), np.full(n, v is None))

    def concat(self, other: Column) -> None:
        """Append every value of ``other`` (same kind)."""
        if self._objs or other._objs or other.kind != self.kind:
            self.extend(other)
            return
        self._store_tail()
        if not self._parts:
            self._scale = other._scale
        for p in other._parts:  # (arrays are never changed in place: shared, not copied)
            if self._scale == other._scale:
                self._add(p, merge=False)
            else:
                self._add_floats(other._decode(p))
        self._tail = list(other._tail)

    def take(self, order: np.ndarray) -> Column:
        """A new column with the values at ``order`` (indices)."""
        return self._holding(self._stored()[order])

    def inserted(self, keep: slice, at: np.ndarray, rows: np.ndarray) -> Column:
        """A new column: the values in ``keep`` with those at ``rows`` put before the places
        ``at`` among them (``np.insert``: one new array, no index per value)."""
        a = self._stored()
        return self._holding(np.insert(a[keep], at, a[rows]))

    def _holding(self, stored: np.ndarray) -> Column:
        """A new column of this one's kind and form holding ``stored``."""
        out = Column(self.kind)
        out._parts, out._scale, out._objs = [stored], self._scale, self._objs
        return out

    # -- reading ----------------------------------------------------------------------------

    def _stored(self) -> np.ndarray:
        """The stored values as one array (not to be changed)."""
        self._store_tail()
        if len(self._parts) != 1:
            self._parts = [np.concatenate(self._parts) if self._parts else np.zeros(0, np.int8)]
        return self._parts[0]

    def _decode(self, raw: np.ndarray) -> np.ndarray:
        """Stored values as the column reads them: floats as float64 (None as NaN), ints as
        stored (None as their type's smallest value)."""
        if self._scale is None:
            return raw
        out = raw / 10.0**self._scale
        out[raw == none_of(raw.dtype)] = math.nan
        return out

    def array(self) -> np.ndarray:
        """The values of an int column as stored (narrowest type, None as its smallest)."""
        if self.kind != "i":
            raise TypeError("array() of a float column")
        return self._stored()

    def none_mask(self) -> np.ndarray:
        """Where the values are None."""
        a = self._stored()
        return np.isnan(a) if a.dtype.kind == "f" else a == none_of(a.dtype)

    def __len__(self) -> int:
        return sum(map(len, self._parts)) + len(self._tail)

    @property
    def nbytes(self) -> int:
        """Bytes of the stored values."""
        return sum(p.nbytes for p in self._parts) + 8 * len(self._tail)

    def _python(self, raw: np.ndarray) -> list[Any]:
        """Stored values as Python values."""
        vals = self._decode(raw).tolist()
        if raw.dtype.kind == "O":
            return vals
        if self.kind == "f":
            return [None if x != x else x for x in vals]
        none = none_of(raw.dtype)
        return [None if x == none else x for x in vals]

    def at(self, rows: np.ndarray) -> list[Any]:
        """The values at ``rows`` (indices), as Python values."""
        return self._python(self._stored()[rows])

    def __getitem__(self, i: int) -> Any:
        n = len(self)
        if not -n <= i < n:
            raise IndexError("column index out of range")
        return self._python(self._stored()[i : (i + 1) or None])[0]

    def __iter__(self) -> Iterator[Any]:
        a = self._stored()
        return (v for s in range(0, len(a), 1 << 16) for v in self._python(a[s : s + (1 << 16)]))

    def floats(self, rows: np.ndarray | None = None) -> np.ndarray:
        """The values (at ``rows``, when given) as a new float64 array (None as NaN); ints
        exact up to 2**53."""
        raw = self._stored() if rows is None else self._stored()[rows]
        out = self._decode(raw).astype(np.float64)  # (a copy)
        if self.kind == "i":
            out[raw == none_of(raw.dtype)] = math.nan
        return out

    def ints(self, fill: int = 0) -> np.ndarray:
        """The values of an int column as int64, None as ``fill`` (``OverflowError`` when one
        does not fit 64 bits)."""
        if self.kind != "i":
            raise TypeError("ints() of a float column")
        a = self._stored()
        if self._objs:
            return np.array([fill if v is None else v for v in a.tolist()], dtype=np.int64)
        out = a.astype(np.int64)
        out[a == none_of(a.dtype)] = fill
        return out

    def _texts(self, raw: np.ndarray) -> np.ndarray:
        """Stored values as JSON texts (an object array)."""
        if self._objs:
            return np.array([json_text(v) for v in raw.tolist()], dtype=object)
        vals = self._decode(raw)
        texts = np.empty(len(raw), dtype=object)
        texts[:] = list(map(int.__repr__ if self.kind == "i" else float.__repr__, vals.tolist()))
        texts[vals != vals if vals.dtype.kind == "f" else raw == none_of(raw.dtype)] = "null"
        return texts

    def json_texts(self, size: int = 4096) -> Iterator[list[str]]:
        """The values as JSON texts (``null``, ``repr`` of the int or float), ``size`` at a
        time; a float that is not finite raises ``ValueError``."""
        texts = self.text_reader()
        for s in range(0, len(self), size):
            yield texts(s, s + size).tolist()

    def text_reader(self) -> Callable[[int, int], np.ndarray]:
        """A function giving the JSON texts of the values ``start:stop`` as an object array
        (``json_texts``), read from the stored arrays as they are (not joined: no copy of the
        column).  Values stored as ints (ints, printed decimals) of a range at most a quarter
        of the column and ``_TEXT_TABLE`` (timer values to 2 decimals, ranks) are taken from a
        table of the texts of that range, each formatted once; other stored ints, a block at a
        time, from the texts of its distinct values while they are at most half of a block."""
        self._store_tail()
        parts = self._parts
        starts = np.cumsum([0, *map(len, parts)]).tolist()

        def stored(start: int, stop: int) -> np.ndarray:
            got = [
                p[max(start - at, 0) : stop - at]
                for p, at in zip(parts, starts, strict=False)
                if at < stop and start < at + len(p)
            ]
            return got[0] if len(got) == 1 else np.concatenate(got or [np.zeros(0, np.int8)])

        if parts and parts[0].dtype.kind == "i":
            none = none_of(parts[0].dtype)
            top = np.iinfo(parts[0].dtype).max
            lo = min(int(p.min(where=p != none, initial=top)) for p in parts)
            hi = max(int(p.max(where=p != none, initial=none)) for p in parts)
            if 0 <= hi - lo < min(len(self) // 4, _TEXT_TABLE):
                table = np.append(
                    self._texts((np.arange(hi - lo + 1) + lo).astype(parts[0].dtype)), "null"
                )

                def from_table(start: int, stop: int) -> np.ndarray:
                    raw = stored(start, stop)
                    at = raw.astype(np.int64) - lo
                    at[raw == none] = len(table) - 1
                    return table[at]

                return from_table

        repeats = True  # until a block of this column has few repeats

        def by_value(start: int, stop: int) -> np.ndarray:
            nonlocal repeats
            raw = stored(start, stop)
            if repeats and raw.dtype.kind == "i" and len(raw) > 64:
                distinct, at = np.unique(raw, return_inverse=True)
                if len(distinct) <= len(raw) // 2:  # each distinct value formatted once
                    return self._texts(distinct)[at]
                repeats = False
            return self._texts(raw)

        return by_value


def _widened(arr: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """An int array in a wider type, its None values kept None."""
    out = arr.astype(dtype)
    out[arr == none_of(arr.dtype)] = none_of(dtype)
    return out
