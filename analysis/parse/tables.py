"""Records of one frozen dataclass kept as typed columns (``analysis.parse.columns``), and the
sequence behaviour every column table shares (``Rows``); the record types and their tables
are in ``analysis.parse.records``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import fields
from typing import Any, ClassVar, Generic, TypeVar, overload

import numpy as np

from analysis.parse.columns import Column, json_text

R = TypeVar("R")


class Rows(Sequence[R], Generic[R]):
    """Sequence behaviour shared by the column tables: rows read back as records, equality
    with any sequence of records, ``+`` gives a list."""

    def _row(self, i: int) -> R:
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError

    @overload
    def __getitem__(self, i: int) -> R: ...
    @overload
    def __getitem__(self, i: slice) -> list[R]: ...
    def __getitem__(self, i: int | slice) -> R | list[R]:
        if isinstance(i, slice):
            return [self._row(k) for k in range(*i.indices(len(self)))]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"{type(self).__name__} index out of range")
        return self._row(i)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, str):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __add__(self, other: Iterable[Any]) -> list[Any]:
        return [*self, *other]

    def __radd__(self, other: Iterable[Any]) -> list[Any]:
        return [*other, *self]


class RecordTable(Rows[R]):
    """Records of one frozen dataclass kept as typed columns (``analysis.parse.columns``): a few
    bytes per record instead of a Python object.  Reads give the records back, exactly."""

    record: ClassVar[type]
    """The dataclass stored."""
    ints: ClassVar[frozenset[str]] = frozenset()
    """Fields holding ints."""
    strs: ClassVar[frozenset[str]] = frozenset()
    """Fields holding a few distinct strings (stored as an index)."""

    def __init__(self, items: Iterable[R] = ()) -> None:
        self._names = [f.name for f in fields(self.record)]
        self._cols = {
            n: Column("i" if n in self.ints or n in self.strs else "f") for n in self._names
        }
        self._codes: dict[str, list[Any]] = {n: [] for n in self.strs}
        self._index: dict[str, dict[Any, int]] = {n: {} for n in self.strs}
        self.extend(items)

    def code(self, name: str, value: Any) -> int | None:
        """Index of a string field's value (added when new)."""
        if value is None:
            return None
        idx = self._index[name]
        i = idx.get(value)
        if i is None:
            i = idx[value] = len(self._codes[name])
            self._codes[name].append(value)
        return i

    def append(self, rec: R) -> None:
        """Add one record."""
        cols = self._cols
        for n in self._names:
            v = getattr(rec, n)
            cols[n].append(self.code(n, v) if n in self.strs else v)

    def extend(self, items: Iterable[R]) -> None:
        """Add records."""
        if isinstance(items, RecordTable) and type(items) is type(self):
            for n in self._names:
                if n in self.strs:
                    codes = items._codes[n]
                    self._cols[n].extend(
                        None if c is None else self.code(n, codes[c]) for c in items._cols[n]
                    )
                else:
                    self._cols[n].concat(items._cols[n])
            return
        for rec in items:
            self.append(rec)

    def add_columns(self, n: int, values: dict[str, Any]) -> None:
        """Add ``n`` records given column-wise: a field -> float array (NaN is None) or int
        array, or one value for all; fields not given are None."""
        for name in self._names:
            col = self._cols[name]
            v = values.get(name)
            if isinstance(v, np.ndarray):
                if col.kind == "f":
                    col.add_floats(v)
                else:
                    col.add_ints(v)
            elif isinstance(v, list):
                col.extend(self.code(name, x) for x in v) if name in self.strs else col.extend(v)
            else:
                if name in self.strs:
                    v = self.code(name, v)
                col.add_const(v, n)

    def column(self, name: str) -> Column:
        """The typed column of one field (read it, do not change it)."""
        return self._cols[name]

    def take(self, order: np.ndarray) -> RecordTable[R]:
        """A new table of the records at ``order`` (indices)."""
        out = type(self)()
        out._cols = {n: c.take(order) for n, c in self._cols.items()}
        out._codes = {n: list(v) for n, v in self._codes.items()}
        out._index = {n: dict(v) for n, v in self._index.items()}
        return out

    def __len__(self) -> int:
        return len(self._cols[self._names[0]])

    def _row(self, i: int) -> R:
        vals = []
        for n in self._names:
            v = self._cols[n][i]
            vals.append(self._codes[n][v] if n in self.strs and v is not None else v)
        return self.record(*vals)

    def __iter__(self) -> Iterator[R]:
        its = [
            map(_decoder(self._codes[n]), self._cols[n]) if n in self.strs else iter(self._cols[n])
            for n in self._names
        ]
        return map(self.record, *its)

    def json_blocks(self, sep: str, size: int = 1 << 12) -> Iterator[str]:
        """The records as JSON objects (as ``json`` writes ``asdict`` of each) joined by
        ``sep``, ``size`` at a time, from the texts of whole columns (no dict per record)."""
        parts = ["{" + json_key(self._names[0])]
        parts += [", " + json_key(n) for n in self._names[1:]] + ["}" + sep]
        readers = [self._text_reader(n) for n in self._names]
        width = 2 * len(parts) - 1
        for s in range(0, len(self), size):
            columns = [r(s, s + size) for r in readers]
            pieces = np.empty(len(columns[0]) * width, dtype=object)
            json_rows(pieces, np.arange(0, len(pieces), width), parts, columns)
            yield "".join(pieces.tolist())[: -len(sep) or None]

    def _text_reader(self, name: str) -> Callable[[int, int], np.ndarray]:
        """``Column.text_reader`` of a field; a string field's texts from its strings'."""
        if name not in self.strs:
            return self._cols[name].text_reader()
        texts = np.array([*map(json_text, self._codes[name]), "null"], dtype=object)
        codes = self._cols[name].ints(fill=len(texts) - 1)
        return lambda start, stop: texts[codes[start:stop]]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self)} records, {self.nbytes} bytes)"

    @property
    def nbytes(self) -> int:
        """Bytes of the stored values."""
        return sum(c.nbytes for c in self._cols.values())


def json_key(name: str) -> str:
    """``"name": ``."""
    return json.dumps(name) + ": "


def json_rows(pieces: np.ndarray, at: np.ndarray, parts: list[str], columns: list[Any]) -> None:
    """Place rows ``parts[0], columns[0][i], parts[1], ..., parts[-1]`` in ``pieces`` (an
    object array joined later), row ``i`` from ``at[i]`` on."""
    for j, part in enumerate(parts):
        pieces[at + 2 * j] = part
    for j, column in enumerate(columns):
        pieces[at + 2 * j + 1] = column


def _decoder(codes: list[Any]) -> Callable[[int | None], Any]:
    return lambda c: None if c is None else codes[c]
