"""Typed columns of optional numbers: what the parser keeps per record, in compact arrays.

A ``Column`` holds ints or floats, each possibly None, and gives back exactly what was put in
(same value, same type, ``-0.0`` stays ``-0.0``).  It picks the smallest exact storage:

- a run of one repeated value (``loss scale: 1.0`` on every line) is one value and a count;
- ints: a signed array of 1, 2, 4 or 8 bytes, widened when a value does not fit; with
  ``delta=True`` (line numbers, iteration numbers) the differences are stored instead;
- floats: a printed decimal such as ``230.93`` is stored as the integer 23093 with the column's
  scale 10**2, in 1 to 8 bytes, only when dividing back gives the very same double (checked for
  every value); else 8-byte doubles;
- anything else (ints beyond 64 bits, a NaN, an int in a float column) keeps the Python objects.

None is stored as the array type's smallest value (ints, scaled floats) or NaN (doubles).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from analysis.parse.encoding import (
    CODES,
    MAX,
    MIN,
    as_bytes,
    code_for,
    diff_from,
    json_text,
    present_range,
    repeat_value,
    running_sum,
    scale_of,
)

_PIECE = 1 << 18
"""Values ``concat`` reads at a time."""


class Column:
    """A column of optional ints (``kind="i"``) or floats (``kind="f"``) (module doc)."""

    __slots__ = (
        "_arr",
        "_const",
        "_delta",
        "_last",
        "_list",
        "_n",
        "_pend",
        "_prefix",
        "_scale",
        "kind",
    )

    def __init__(self, kind: str, values: Iterable[Any] = (), delta: bool = False) -> None:
        if kind not in ("i", "f"):
            raise ValueError(f"kind({kind!r}) must be 'i' or 'f'")
        self.kind = kind
        self._delta = delta and kind == "i"
        self._arr: array[Any] | None = None
        self._list: list[Any] | None = None
        self._const: Any = None
        self._n = 0
        self._scale = -1  # floats: decimals of the scaled ints, -1 = doubles
        self._last = 0  # delta mode: the last value
        self._prefix: np.ndarray | None = None  # delta mode: cached running sums
        self._pend: list[Any] = []  # values appended, not yet stored
        for v in values:
            self.append(v)

    # -- size -------------------------------------------------------------------------------

    def __len__(self) -> int:
        if self._arr is not None:
            return len(self._arr) + len(self._pend)
        if self._list is not None:
            return len(self._list) + len(self._pend)
        return self._n + len(self._pend)

    @property
    def nbytes(self) -> int:
        """Bytes of the stored values (not counting the fixed size of the objects)."""
        if self._pend:
            self._sync()
        if self._arr is not None:
            return len(self._arr) * self._arr.itemsize
        if self._list is not None:
            return 8 * len(self._list) + sum(32 for x in self._list if x is not None)
        return 0

    @property
    def storage(self) -> str:
        """How the values are stored, in words (``const``, ``int16``, ``x100 int16``, ...)."""
        if self._pend:
            self._sync()
        if self._list is not None:
            return "objects"
        if self._arr is None:
            return "const"
        width = f"int{8 * self._arr.itemsize}" if self._arr.typecode in CODES else "float64"
        if self._delta:
            width = "delta " + width
        return f"x1e{self._scale} {width}" if self._scale > 0 else width

    # -- reading ----------------------------------------------------------------------------

    def _decode(self, x: Any) -> Any:
        arr = self._arr
        assert arr is not None
        if self.kind == "f":
            if self._scale < 0:
                return None if x != x else x
            if x == MIN[arr.typecode]:
                return None
            return x / 10.0**self._scale if self._scale else float(x)
        return None if x == MIN[arr.typecode] else x

    def __getitem__(self, i: int) -> Any:
        if self._pend:
            self._sync()
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("column index out of range")
        if self._list is not None:
            return self._list[i]
        if self._arr is None:
            return self._const
        if self._delta:
            if self._prefix is None or len(self._prefix) != n:
                self._prefix = np.cumsum(
                    np.frombuffer(self._arr, dtype=self._arr.typecode), dtype=np.int64
                )
            return int(self._prefix[i])
        return self._decode(self._arr[i])

    def __iter__(self) -> Iterator[Any]:
        if self._pend:
            self._sync()
        if self._list is not None:
            return iter(self._list)
        if self._arr is None:
            return (
                iter([self._const] * self._n)
                if self._n < 4096
                else repeat_value(self._const, self._n)
            )
        if self._delta:
            return running_sum(self._arr)
        if self.kind == "i":
            low = MIN[self._arr.typecode]
            return (None if x == low else x for x in self._arr)
        if self._scale < 0:
            return (None if x != x else x for x in self._arr)
        low = MIN[self._arr.typecode]
        f = 10.0**self._scale
        if self._scale == 0:
            return (None if x == low else float(x) for x in self._arr)
        return (None if x == low else x / f for x in self._arr)

    def pieces(self, size: int) -> Iterator[Callable[[np.ndarray], list[Any]]]:
        """For each ``size`` values in order, a function that gives the values at some
        positions of that piece (``at``, ascending), as ``self[i]`` gives them: only those are
        converted, and a delta column's running sums are taken a piece at a time."""
        if self._pend:
            self._sync()
        n = len(self)
        if self._list is not None:
            for a in range(0, n, size):
                yield lambda at, p=self._list[a : a + size]: [p[j] for j in at.tolist()]
            return
        if self._arr is None:
            for _a in range(0, n, size):
                yield lambda at, c=self._const: [c] * len(at)
            return
        raw = np.frombuffer(self._arr, dtype=self._arr.typecode)
        total = 0
        for a in range(0, n, size):
            part = raw[a : a + size]
            if self._delta:
                sums = np.cumsum(part, dtype=np.int64) + total
                total = int(sums[-1])
                yield lambda at, v=sums: v[at].tolist()
            else:
                yield lambda at, p=part: list(map(self._decode, p[at].tolist()))

    def floats(self) -> np.ndarray:
        """The values as float64 (None as NaN); ints exact up to 2**53."""
        if self._pend:
            self._sync()
        n = len(self)
        if self._list is not None:
            return np.array([math.nan if x is None else float(x) for x in self._list], dtype=float)
        if self._arr is None:
            fill = math.nan if self._const is None else float(self._const)
            return np.full(n, fill, dtype=float)
        raw = np.frombuffer(self._arr, dtype=self._arr.typecode)
        if self._delta:
            return np.cumsum(raw, dtype=np.int64).astype(float)
        return self._floats_of(raw.copy() if self._arr.typecode == "d" else raw)

    def _floats_of(self, raw: np.ndarray) -> np.ndarray:
        """Stored values (of a plain array: doubles, or ints with ``MIN`` for None, scaled)
        as float64."""
        assert self._arr is not None
        if self._arr.typecode == "d":
            return raw
        out = raw.astype(float)
        out[raw == MIN[self._arr.typecode]] = math.nan
        if self._scale > 0:
            out /= 10.0**self._scale
        return out

    def floats_at(self, rows: np.ndarray) -> np.ndarray:
        """``floats()[rows]``, converting only those values (a plain stored array is indexed
        first: no float64 copy of the whole column)."""
        if self._pend:
            self._sync()
        if self._list is not None or self._arr is None or self._delta:
            return self.floats()[rows]
        return self._floats_of(np.frombuffer(self._arr, dtype=self._arr.typecode)[rows])

    def rows_equal(self, value: int) -> np.ndarray:
        """Positions (int64, ascending) of the values equal to the int ``value``, read from the
        stored array as it is (no int64 copy of the whole column)."""
        if self._pend:
            self._sync()
        if self.kind == "i" and self._list is None and self._arr is None:  # one value repeated
            return np.arange(len(self) if self._const == value else 0, dtype=np.int64)
        if self.kind != "i" or self._list is not None or self._arr is None or self._delta:
            return np.flatnonzero(self.ints(fill=value - 1) == value)
        code = self._arr.typecode
        if not MIN[code] < value <= MAX[code]:
            return np.zeros(0, dtype=np.int64)
        return np.flatnonzero(np.frombuffer(self._arr, dtype=code) == value)

    def ints(self, fill: int = 0) -> np.ndarray:
        """The values as int64, None as ``fill`` (int columns only)."""
        if self._pend:
            self._sync()
        if self.kind != "i":
            raise TypeError("ints() of a float column")
        n = len(self)
        if self._list is not None:
            return np.array([fill if x is None else x for x in self._list], dtype=np.int64)
        if self._arr is None:
            return np.full(n, fill if self._const is None else self._const, dtype=np.int64)
        raw = np.frombuffer(self._arr, dtype=self._arr.typecode)
        if self._delta:
            return np.cumsum(raw, dtype=np.int64)
        out = raw.astype(np.int64)
        out[raw == MIN[self._arr.typecode]] = fill
        return out

    def small_ints(self, fill: int = 0) -> np.ndarray:
        """``ints(fill)``, in the stored array's width when it holds no None (a copy of it),
        else as int32 when the values fit: no int64 copy of a long column where none is
        needed."""
        if self._pend:
            self._sync()
        if self.kind != "i":
            raise TypeError("small_ints() of a float column")
        n = len(self)
        if self._list is None and self._arr is None:  # one value repeated (or none at all)
            c = fill if self._const is None else self._const
            return np.full(n, c, dtype=code_for(c, c) or "q")
        if self._list is None and self._arr is not None and n:
            code = self._arr.typecode
            raw = np.frombuffer(self._arr, dtype=code)
            if not self._delta and int(raw.min()) != MIN[code]:
                return raw.copy()
            if self._delta:  # running sums a piece at a time, kept as int32 while they fit
                out = np.empty(n, dtype=np.int32)
                total = 0
                for a in range(0, n, _PIECE):
                    part = np.cumsum(raw[a : a + _PIECE], dtype=np.int64) + total
                    if part.min() < -(2**31) or part.max() >= 2**31:
                        return self.ints(fill)
                    out[a : a + len(part)] = part
                    total = int(part[-1])
                return out
        values = self.ints(fill)
        if len(values) and values.min() >= -(2**31) and values.max() < 2**31:
            return values.astype(np.int32)
        return values

    def json_texts(self, size: int = 4096) -> Iterator[list[str]]:
        """The values as JSON texts (``null``, ``repr`` of the int or float), ``size`` at a
        time, converted column-wise; a float that is not finite raises ``ValueError``."""
        if self._pend:
            self._sync()
        n = len(self)
        if self._list is not None or self._arr is None:
            values = self._list if self._list is not None else None
            const = json_text(self._const) if values is None and n else ""
            for s in range(0, n, size):
                if values is None:
                    yield [const] * min(size, n - s)
                else:
                    yield [json_text(v) for v in values[s : s + size]]
            return
        text = int.__repr__ if self.kind == "i" else float.__repr__
        for vals, none in self._pieces(size):
            if self._arr is not None and self._arr.typecode == "d" and np.isinf(vals).any():
                bad = float(vals[np.isinf(vals)][0])
                raise ValueError(f"out of range float value in the JSON output: {bad!r}")
            texts = list(map(text, vals.tolist()))
            if none.any():
                for i in np.flatnonzero(none).tolist():
                    texts[i] = "null"
            yield texts

    def _pieces(self, size: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """The values of array storage, ``size`` at a time: (int64 or float64 values, None
        mask); a None's value is 0 (ints) or NaN (floats)."""
        assert self._arr is not None and not self._pend
        code = self._arr.typecode
        raw = np.frombuffer(self._arr, dtype=code)
        total = 0
        for s in range(0, len(raw), size):
            part = raw[s : s + size]
            if self._delta:
                vals = np.cumsum(part, dtype=np.int64) + total
                total = int(vals[-1])
                yield vals, np.zeros(len(vals), dtype=bool)
            elif code == "d":
                yield part, np.isnan(part)
            else:
                none = part == MIN[code]
                if self.kind == "i":
                    yield np.where(none, 0, part).astype(np.int64), none
                    continue
                vals = part.astype(float)
                if self._scale > 0:
                    vals /= 10.0**self._scale
                vals[none] = math.nan
                yield vals, none

    # -- writing ----------------------------------------------------------------------------

    def append(self, v: Any) -> None:
        """Add one value (None, an int for ``kind="i"``, a float for ``kind="f"``); values
        are gathered and stored a few hundred at a time."""
        pend = self._pend
        pend.append(v)
        if len(pend) >= 256:
            self._sync()

    def _sync(self) -> None:
        """Store the gathered values."""
        vals = self._pend
        if not vals:
            return
        self._pend = []
        if self.kind == "f":
            if all(type(v) is float and v == v for v in vals):
                self.extend_floats(np.array(vals, dtype=float))
                return
        elif all(type(v) is int for v in vals) and MIN["q"] < min(vals) and max(vals) <= MAX["q"]:
            self.extend_ints(np.array(vals, dtype=np.int64))
            return
        for v in vals:
            self._append_one(v)

    def _append_one(self, v: Any) -> None:
        arr = self._arr
        if arr is not None:
            if self._put(arr, v):
                return
            self._widen([v])
            return
        if self._list is not None:
            self._list.append(v)
            return
        if self._n == 0:
            self._const, self._n = v, 1
        elif v is self._const or (
            type(v) is type(self._const)
            and v == self._const
            and (v != 0 or math.copysign(1, v) == math.copysign(1, self._const))
        ):
            self._n += 1
        else:
            self._widen([v])

    def _put(self, arr: array[Any], v: Any) -> bool:
        """Append ``v`` to the array if it is exactly representable there."""
        code = arr.typecode
        if self.kind == "i":
            if type(v) is not int:
                if v is None and not self._delta:
                    arr.append(MIN[code])
                    return True
                return False
            if self._delta:
                d = v - self._last
                if MIN[code] < d <= MAX[code] and -(2**62) < v < 2**62:
                    arr.append(d)
                    self._last = v
                    return True
                return False
            if MIN[code] < v <= MAX[code]:
                arr.append(v)
                return True
            return False
        if v is None:
            arr.append(math.nan if code == "d" else MIN[code])
            return True
        if type(v) is not float or v != v:
            return False
        if code == "d":
            arr.append(v)
            return True
        f = 10.0**self._scale
        x = v * f
        if not -9e18 < x < 9e18:
            return False
        s = round(x)
        if MIN[code] < s <= MAX[code] and s / f == v and (s != 0 or math.copysign(1, v) > 0):
            arr.append(s)
            return True
        return False

    def _current(self) -> tuple[np.ndarray, np.ndarray]:
        """Current values as (float64 or int64 array, None mask), from array or const storage."""
        if self._pend:
            self._sync()
        n = len(self)
        if self._arr is None:
            none = np.full(n, self._const is None)
            if self.kind == "f":
                return np.full(n, math.nan if self._const is None else self._const), none
            return np.full(n, 0 if self._const is None else self._const, dtype=np.int64), none
        raw = np.frombuffer(self._arr, dtype=self._arr.typecode)
        if self._delta:
            return np.cumsum(raw, dtype=np.int64), np.zeros(n, dtype=bool)
        if self._arr.typecode == "d":
            return raw.copy(), np.isnan(raw)
        none = raw == MIN[self._arr.typecode]
        if self.kind == "i":
            return raw.astype(np.int64), none
        out = raw.astype(float)
        if self._scale > 0:
            out /= 10.0**self._scale
        out[none] = math.nan
        return out, none

    def _fits(self, v: Any) -> bool:
        """Whether ``v`` (not None) can live in an array of this column."""
        if self.kind == "i":
            return type(v) is int and MIN["q"] < v <= MAX["q"]
        return type(v) is float and v == v

    def _widen(self, new: list[Any]) -> None:
        """Rebuild the storage so that it holds the current values and ``new``."""
        if self._pend:
            self._sync()
        if self._list is not None:
            self._list.extend(new)
            return
        const_ok = self._arr is not None or self._const is None or self._fits(self._const)
        if not const_ok or not all(v is None or self._fits(v) for v in new):
            values = [*self, *new]
            self._reset()
            self._list = values
            return
        cur, none = self._current()
        if self._delta and (None in new or none.any()):
            self._delta = False  # a None: plain values from now on
        if self.kind == "i":
            add = np.array([0 if v is None else v for v in new], dtype=np.int64)
        else:
            add = np.array([math.nan if v is None else v for v in new], dtype=float)
        vals = np.concatenate([cur, add])
        mask = np.concatenate([none, np.array([v is None for v in new], dtype=bool)])
        self._reset()
        self._store_np(vals, mask)

    def _reset(self) -> None:
        self._arr, self._list, self._prefix = None, None, None
        self._n, self._const, self._scale, self._last = 0, None, -1, 0

    def _store_np(self, vals: np.ndarray, none: np.ndarray) -> None:
        """Store values (None where ``none``) in the most compact exact array (column empty);
        ints may come in any signed width (no int64 copy of an int32 array is made)."""
        if self.kind == "i":
            if self._delta and len(vals) and not -(2**62) < vals.min() <= vals.max() < 2**62:
                self._delta = False  # differences could overflow: plain values
            if self._delta:  # the differences, a piece at a time (no int64 copy of them all)
                if self._store_deltas(
                    lambda: (vals[a : a + _PIECE] for a in range(0, len(vals), _PIECE))
                ):
                    return
                self._delta = False  # differences too large: plain values
            lo, hi = present_range(vals, none, _PIECE)
            code = code_for(lo, hi)
            assert code is not None  # values are int64 or narrower here
            self._arr = array(code)
            for a in range(0, len(vals), _PIECE):  # (no whole-length copy in between)
                out = vals[a : a + _PIECE].astype(code)
                out[none[a : a + _PIECE]] = MIN[code]
                self._arr.frombytes(as_bytes(out))
            return
        present = vals[~none] if none.any() else vals
        d = scale_of(present)
        if d is not None:
            scaled = np.rint(present * 10.0**d)
            code = code_for(int(scaled.min(initial=0)), int(scaled.max(initial=0)))
            if code is not None:
                out = np.full(len(vals), MIN[code], dtype=code)
                out[~none] = scaled.astype(code)
                self._arr = array(code)
                self._arr.frombytes(as_bytes(out))
                self._scale = d
                return
        self._arr = array("d")
        self._arr.frombytes(as_bytes(np.where(none, math.nan, vals).astype(float)))

    def extend(self, values: Iterable[Any]) -> None:
        """Add several values."""
        for v in values:
            self.append(v)

    def extend_const(self, v: Any, n: int) -> None:
        """Add ``n`` copies of ``v``."""
        if self._pend:
            self._sync()
        if n <= 0:
            return
        if self._arr is None and self._list is None:
            c = self._const
            if (
                self._n == 0
                or v is c
                or (
                    type(v) is type(c)
                    and v == c
                    and (v != 0 or math.copysign(1, v) == math.copysign(1, c))
                )
            ):
                self._const = v if self._n == 0 else c
                self._n += n
                return
        if v is None and self._arr is not None and not self._delta:
            code = self._arr.typecode
            self._arr.extend(array(code, [math.nan if code == "d" else MIN[code]]) * n)
            return
        if self.kind == "f" and type(v) is float and v == v:
            self.extend_floats(np.full(n, v))
        elif self.kind == "i" and type(v) is int and MIN["q"] < v <= MAX["q"]:
            self.extend_ints(np.full(n, v, dtype=np.int64))
        else:
            for _ in range(n):
                self.append(v)

    def extend_floats(self, values: array[float] | np.ndarray) -> None:
        """Add finite doubles in bulk (``kind="f"``; NaN is taken as None)."""
        if self._pend:
            self._sync()
        v = np.asarray(values, dtype=float)
        if not len(v):
            return
        negzero = bool((np.signbit(v) & (v == 0)).any())
        if self._arr is None and self._list is None and not negzero:
            first = float(v[0])
            if first == first and (v == first).all():
                if self._n == 0:
                    self._const, self._n = first, len(v)
                    return
                c = self._const
                if (
                    type(c) is float
                    and c == first
                    and math.copysign(1, c) == math.copysign(1, first)
                ):
                    self._n += len(v)
                    return
        arr = self._arr
        if arr is not None and not negzero and not np.isnan(v).any():
            if arr.typecode == "d":
                arr.frombytes(as_bytes(v))
                return
            f = 10.0**self._scale
            with np.errstate(over="ignore"):  # (a value past the doubles: inf, not stored so)
                scaled = np.rint(v * f)
            code = arr.typecode
            if scaled.min() > MIN[code] and scaled.max() <= MAX[code] and (scaled / f == v).all():
                arr.frombytes(as_bytes(scaled.astype(code)))
                return
        if self._list is None and (
            self._arr is not None or self._const is None or self._fits(self._const)
        ):
            cur, none = self._current()
            vals = np.concatenate([cur.astype(float), v])
            mask = np.concatenate([none, np.isnan(v)])
            self._reset()
            self._store_np(vals, mask)
            return
        self._widen([None if x != x else x for x in v.tolist()])

    def extend_ints(self, values: Sequence[int] | np.ndarray) -> None:
        """Add ints in bulk (``kind="i"``, no None)."""
        if self._pend:
            self._sync()
        v = np.asarray(values, dtype=np.int64)
        if not len(v):
            return
        if (
            self._arr is None
            and self._list is None
            and (self._n == 0 or type(self._const) is int)
            and (v == v[0]).all()
            and (self._n == 0 or int(v[0]) == self._const)
        ):
            self._const = int(v[0])
            self._n += len(v)
            return
        arr = self._arr
        if arr is not None:
            code = arr.typecode
            if self._delta:
                if min(v.min(), self._last) > -(2**62) and max(v.max(), self._last) < 2**62:
                    d = diff_from(v, self._last)
                    if d.min() > MIN[code] and d.max() <= MAX[code]:
                        arr.frombytes(as_bytes(d.astype(code)))
                        self._last = int(v[-1])
                        self._prefix = None
                        return
            elif v.min() > MIN[code] and v.max() <= MAX[code]:
                arr.frombytes(as_bytes(v.astype(code)))
                return
        if (
            self._list is None
            and (self._arr is not None or self._const is None or self._fits(self._const))
            and v.min() > MIN["q"]
        ):
            if len(self):
                cur, none = self._current()
                vals = np.concatenate([cur, v])
                mask = np.concatenate([none, np.zeros(len(v), dtype=bool)])
            else:  # empty: the values as given (no copy)
                vals, mask = v, np.zeros(len(v), dtype=bool)
            delta = self._delta
            self._reset()
            self._delta = delta and not mask.any()
            self._store_np(vals, mask)
            return
        self._widen(v.tolist())

    def extend_ints_masked(self, values: np.ndarray, none: np.ndarray) -> None:
        """Add ints in bulk, None where ``none`` is true (``kind="i"``): into an empty column
        in one step (no Python value per element), else a piece at a time."""
        none = np.asarray(none, dtype=bool)
        if not none.any():
            self.extend_ints(values)
            return
        if self._pend:
            self._sync()
        if not len(self):
            self._reset()
            self._delta = False  # (a delta column holds no None)
            vals = np.asarray(values)
            if vals.dtype.kind != "i":  # (signed ints are stored from their own width)
                vals = vals.astype(np.int64)
            self._store_np(vals, none)
            return
        if self._list is None and (
            self._arr is not None or self._const is None or self._fits(self._const)
        ):
            v = np.asarray(values, dtype=np.int64)
            arr = self._arr
            if arr is not None and not self._delta:  # appended as they are when they fit
                code = arr.typecode
                present = v[~none]
                if not len(present) or (present.min() > MIN[code] and present.max() <= MAX[code]):
                    arr.frombytes(as_bytes(np.where(none, MIN[code], v).astype(code)))
                    return
            cur, cur_none = self._current()  # else stored anew, plain (a None: no deltas)
            vals, mask = np.concatenate([cur, v]), np.concatenate([cur_none, none])
            del cur, cur_none
            self._reset()
            self._delta = False
            self._store_np(vals, mask)
            return
        for a in range(0, len(values), _PIECE):
            vals, marks = values[a : a + _PIECE].tolist(), none[a : a + _PIECE].tolist()
            self.extend(None if m else int(v) for v, m in zip(vals, marks, strict=True))

    def clear(self) -> None:
        """Drop every value (the storage goes with them); the kind stays."""
        self._pend = []
        self._reset()

    def take(self, order: np.ndarray) -> Column:
        """A new column with the values at ``order`` (indices), exactly."""
        if self._pend:
            self._sync()
        out = Column(self.kind, delta=self._delta)
        if self._list is not None:
            out._list = [self._list[i] for i in order.tolist()]
        elif self._arr is None:
            out._const, out._n = self._const, len(order)
        elif self._delta:
            full = self.small_ints()  # the running sums, once

            def taken() -> Iterator[np.ndarray]:
                return (full[order[a : a + _PIECE]] for a in range(0, len(order), _PIECE))

            # (int32 values: their differences fit 64 bits; else the checks of ``_store_np``)
            if full.dtype != np.int32 or not out._store_deltas(taken):
                out._store_np(full[order], np.zeros(len(order), dtype=bool))
        else:
            raw = np.frombuffer(self._arr, dtype=self._arr.typecode)
            out._arr = array(self._arr.typecode)
            for a in range(0, len(order), _PIECE):  # (no whole-length copy in between)
                out._arr.frombytes(as_bytes(raw[order[a : a + _PIECE]]))
            out._scale = self._scale
        return out

    def _store_deltas(self, pieces: Callable[[], Iterator[np.ndarray]]) -> bool:
        """Store (empty delta column) the differences of the values ``pieces()`` gives, in
        order, a piece at a time (two passes: their range, then the bytes; no whole-length
        copy); False when one needs more than 8 bytes."""
        lo = hi = before = 0
        for part in pieces():
            d = diff_from(part, before)
            lo, hi, before = min(lo, int(d.min())), max(hi, int(d.max())), int(part[-1])
        code = code_for(lo, hi)
        if code is None:
            return False
        self._arr = array(code)
        before = 0
        for part in pieces():
            self._arr.frombytes(as_bytes(diff_from(part, before).astype(code)))
            before = int(part[-1])
        self._last = before
        return True

    def concat(self, other: Column) -> None:
        """Append every value of ``other`` (same kind)."""
        if self._pend:
            self._sync()
        if other._pend:
            other._sync()
        if not len(self) and self.kind == other.kind and self._delta == other._delta:
            # Empty: take a copy of the other's storage (the same values, exactly).
            self._arr = None if other._arr is None else array(other._arr.typecode, other._arr)
            self._list = None if other._list is None else list(other._list)
            self._const, self._n = other._const, other._n
            self._scale, self._last, self._prefix = other._scale, other._last, None
            return
        if self._try_join_deltas(other):
            return
        plain = other._list is None and (
            other._arr is not None or other._const is None or other._fits(other._const)
        )
        if not plain or other.kind != self.kind:
            self.extend(other)
        elif other._arr is None:
            self.extend_const(other._const, other._n)
        else:
            for vals, none in other._pieces(_PIECE):  # a piece at a time: no whole-length copy
                if self.kind == "f":
                    self.extend_floats(vals)  # None travels as NaN
                else:
                    self.extend_ints_masked(vals, none)

    def _try_join_deltas(self, other: Column) -> bool:
        """``concat`` of two delta columns by their differences (no running sums): only the
        first difference of ``other`` changes; False when that does not fit."""
        mine, theirs = self._arr, other._arr
        if not (self._delta and other._delta and mine is not None and theirs is not None):
            return False
        code = mine.typecode
        if not len(theirs) or CODES.index(theirs.typecode) > CODES.index(code):
            return False
        raw = np.frombuffer(theirs, dtype=theirs.typecode)
        first = int(raw[0]) - self._last  # other's first value minus this one's last
        if not (MIN[code] < first <= MAX[code]) or not -(2**62) < other._last < 2**62:
            return False
        diffs = raw.astype(code)
        diffs[0] = first
        mine.frombytes(as_bytes(diffs))
        self._last = other._last
        self._prefix = None
        return True
