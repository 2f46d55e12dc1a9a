"""The bulk scanner's byte-level pieces: keyword anchors, the patterns of DeepSpeed, memory and
iteration lines, value readers, and the line step of the line path. See ``analysis.parse.scan``.
"""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass
from itertools import compress, repeat
from typing import Any

import numpy as np

from analysis.parse.keywords import Keywords
from analysis.parse.machine import Core

CHUNK_BYTES = 8 << 20
"""Bytes read at a time (whole lines are handed on; the rest waits for the next read)."""
SEG_START, SEG_MIN, SEG_MAX = 1 << 18, 1 << 14, 4 << 20
"""Bytes the bulk path looks at in one step: it grows while no line needs the line path and
shrinks when one soon does."""
SPARSE_LINES, SPARSE_BYTES = 1000, 8 << 20
"""A bulk step of at least SEG_START bytes that took fewer lines per MB than this (a timer
block counts its lines, a DeepSpeed, iteration or memory line one) hands the next SPARSE_BYTES
to the line path (whose keyword jumps are cheaper over chatter)."""
SHORT_LINES, SHORT_BYTES = 4, 64 << 10
"""What the line path reads after the second bulk step in a row that took fewer than
SHORT_LINES lines and stopped in the first quarter of what it looked at (a look costs about
what the line path pays for 10-30 lines); doubled for each more, up to SPARSE_BYTES."""

DIGITS = b"0123456789"


# -- the line path ---------------------------------------------------------------------------


def line_end(block: bytes, s: int, end: int) -> int:
    e = block.find(b"\n", s, end)
    return end if e < 0 else e


def line_step(
    core: Core,
    kw: Keywords,
    block: bytes,
    pos: int,
    end: int,
    lineno: int,
    look_here: bool = False,
) -> tuple[int, int]:
    """Feed the next line of ``block[pos:end]`` that can matter (``Core.active``, keywords,
    streams with an open timer block); skip the lines before it.  Returns (pos, lineno) after
    the fed line, or (end, lineno at end) when none is left.  ``look_here``: the line at
    ``pos`` most likely holds a keyword (a bulk step ended there): look for one in it first,
    before the keywords are looked for through the rest of the chunk."""
    if core.active:
        e = line_end(block, pos, end)
        core.feed(lineno, block[pos:e].decode("utf-8", "replace"))
        return e + 1, lineno + 1
    if core.timer_keys:  # lines of those streams continue or close the block: each line
        e = line_end(block, pos, end)
        line = block[pos:e].decode("utf-8", "replace")
        if kw.has(line, core.run.pipe_iterations):
            core.feed(lineno, line)
        elif core.stream_key(line) in core.timer_keys:
            core.feed(lineno, line, dispatch=False)
        return e + 1, lineno + 1
    hit = -1
    if look_here:
        hit = kw.first(block, pos, line_end(block, pos, end), core.run.pipe_iterations, True)
    if hit < 0:
        hit = kw.first(block, pos, end, core.run.pipe_iterations)
    if hit < 0:
        return end, lineno + block.count(b"\n", pos, end)
    s = block.rfind(b"\n", pos, hit) + 1 or pos
    lineno += block.count(b"\n", pos, s)
    e = line_end(block, s, end)
    core.feed(lineno, block[s:e].decode("utf-8", "replace"))
    return e + 1, lineno + 1


# -- the bulk path ---------------------------------------------------------------------------

DS_LIT = b"[Rank "
DS_AFTER = b"] time (ms) |"
"""A DeepSpeed ``[Rank N] time (ms) |`` line: the text around its rank (``ds_heads``)."""
DS_OFFSETS = 16
"""Offsets of ``[Rank`` in a line (the launcher prefixes' widths) the bulk path looks at."""
DS_PROBES = 4
"""Bulk steps that search their text for a DeepSpeed line while none was seen."""
IS_DIGIT = np.zeros(256, dtype=bool)
IS_DIGIT[48:58] = True
MEM_LIT = b"memory (MB) |"
MEM_BULK_RE = re.compile(rb"\[Rank (\d+)\] \(after (\d+) iterations\) memory \(MB\) \|([^\n]*)\n")
"""A memory report of one rank after some iterations (Megatron's ``report_memory`` on every
rank), as ``BulkReaders.mem_bulk`` reads a segment of them."""
MEM_BULK_HEAD = b"[Rank ] (after  iterations) memory (MB) |"
"""Its text up to the values, without digits: how its shape starts (``Bulk.mem_shapes``)."""
MEM_BULK_MIN = 64
"""Reports in a segment below which the line-by-line reader reads them."""
"""A memory report (its text up to the end of the line: ``find_all(..., to_eol=True)``)."""
MEM_HEAD_RE = re.compile(rb"(?:\[Rank (\d+)\] )?(?:\(after (\d+) iterations\) )?\Z")
IT_RE = re.compile(rb"iteration +(\d+)/ *(\d+) *\|")
# The line path's own patterns, on bytes (the same on printable ASCII, which is all the bulk
# path takes).
HEAD_LIT = b"across ranks (ms):"
HEADS = {
    b"(min, max) time across ranks (ms):": "(min, max) time",
    b"max time across ranks (ms):": "max time",
    b"times across ranks (ms):": "times",
}
NAME_RE = re.compile(rb"[A-Za-z_]+\Z")
# Launcher prefixes at the start of a line, as ``_lines.split_prefix`` reads them (which then
# says how many of them really are prefixes).
PREFIXES_RE = re.compile(
    rb"(?:\s{0,4}\d{1,5}:\s|\[\d{1,9},\d{1,6}\]<std(?:out|err)>:|\[(?:default\d+|rank\d+)\]:\s?"
    rb"|[A-Za-z0-9][A-Za-z0-9_.-]{0,62}:\s){0,4}"
)
MEM_FIELDS = {
    b"allocated": "allocated_mb",
    b"max allocated": "max_allocated_mb",
    b"reserved": "reserved_mb",
    b"max reserved": "max_reserved_mb",
}
MISSING = object()


def find_all(block: bytes, lit: bytes, pos: int, end: int, to_eol: bool = False) -> Any:
    """(start, end) of each occurrence of ``lit`` in [pos, end), as ``re.finditer`` of the
    literal gives them (``to_eol``: of ``lit[^\n]*\n``), by ``bytes.find``: a sparse
    literal is found several times faster than by a regular expression."""
    find = block.find
    n = len(lit)
    p = find(lit, pos, end)
    while p >= 0:
        if to_eol:
            e = find(b"\n", p + n, end)
            if e < 0:
                return
            yield p, e + 1
            p = find(lit, e + 1, end)
        else:
            yield p, p + n
            p = find(lit, p + n, end)


def byte_pairs(body: bytes) -> tuple[list[bytes], list[bytes]] | None:
    """Names (stripped) and value tokens of ``name: value | ...``, every piece one colon."""
    names, values = [], []
    for piece in body.split(b"|"):
        if piece.count(b":") != 1:
            return None
        k, _, v = piece.partition(b":")
        names.append(k.strip())
        values.append(v)
    return names, values


def finite_float(token: bytes) -> float | None:
    try:
        x = float(token)
    except ValueError:
        return None
    return x if math.isfinite(x) else None


def ds_group_values(
    names: tuple[str, ...], shape: tuple[int, ...], flat: list[float]
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    j = 0
    for name, k in zip(names, shape, strict=True):
        out[name] = tuple(flat[j : j + k]) if k else flat[j]
        j += max(k, 1)
    return out


PRINTABLE = bytes(range(0x20, 0x7F)) + b"\t"


def is_printable(line: bytes) -> bool:
    """Printable ASCII (and tabs), a trailing carriage return allowed."""
    return not line.translate(None, PRINTABLE) or not line.rstrip(b"\r").translate(None, PRINTABLE)


WORD = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
_GLUE_AT_RE = re.compile(rb"iteration\s+\d+\s*/\s*\d+")


def other_glue(text: bytes, rel: int) -> bool:
    """Whether the line path's ``GLUE_RE`` matches ``text`` anywhere but at ``rel``."""
    j = text.find(b"iteration")
    while j >= 0:
        if j != rel and (j == 0 or text[j - 1] not in WORD) and _GLUE_AT_RE.match(text, j):
            return True
        j = text.find(b"iteration", j + 9)
    return False


def ds_values(bodies: list[bytes], k: int) -> np.ndarray | None:
    """Values of DeepSpeed line bodies of one known shape (k names), as a (lines x k) array;
    None when one does not convert."""
    parts = b"|".join(bodies).replace(b":", b"|").split(b"|")
    if len(parts) != 2 * k * len(bodies):
        return None
    names = b"".join(parts[0::2])
    if len(names.translate(None, DIGITS)) != len(names):
        return None
    try:
        vals = np.array(list(map(float, parts[1::2])), dtype=float)
    except ValueError:
        return None
    if not np.isfinite(vals).all():
        return None
    return vals.reshape(len(bodies), k)


# A piece of a DeepSpeed line's shape (its text without digits) whose value is a plain
# decimal with spaces around it: deleting the names, colons and bars leaves the values, space
# separated, for np.fromstring (which reads them exactly as float() does).  A digit in a name
# would be a number too many, a value without a digit one too few: ``ds_values_fast``
# counts them.
FAST_PIECE_RE = re.compile(rb" [A-Za-z_]+: +-?\.? *\Z")
FAST_MEM_PIECE_RE = re.compile(rb" [A-Za-z_][A-Za-z_ ]*: +-?\.? *\Z")
"""The same for a piece of a memory report's shape (its names hold spaces)."""
_NOT_VALUES = bytes(c for c in range(256) if chr(c).isalpha() and c < 128) + b"_:|"


def ds_values_fast(bodies: list[bytes], k: int) -> np.ndarray | None:
    """``ds_values`` for shapes of plain decimals (``FAST_PIECE_RE``), in a few C passes."""
    vals = values_fast(b"\n".join(bodies), np.full(len(bodies), k, dtype=np.int64))
    return None if vals is None else vals.reshape(len(bodies), k)


def values_fast(joined: bytes, counts: np.ndarray) -> np.ndarray | None:
    """The values of DeepSpeed line bodies of shapes of plain decimals, joined by newlines,
    ``counts[i]`` of them in line i, in the order printed; None when one does not convert or a
    line does not hold its count."""
    text = joined.translate(None, _NOT_VALUES)
    # The bytes left are printable ASCII, tabs, a CR and the newlines between lines.
    a = np.frombuffer(text, dtype=np.uint8)
    blank = a <= 0x20
    first = ~blank
    first[1:] &= blank[:-1]
    starts = np.flatnonzero(first)
    ends_at = np.cumsum(counts)
    if len(starts) != ends_at[-1]:
        return None
    # Each line holds its count: lines of one shape may differ in where their digits are (a
    # digit in a name, a value without one), and their counts even out over the lines.
    # (Line i holds its count when the numbers before its newline are those of lines 0..i.)
    if (np.searchsorted(starts, np.flatnonzero(a == 0x0A)) != ends_at[:-1]).any():
        return None
    vals = _fixed_point(text, a, blank, starts)
    if vals is None:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            try:
                vals = np.fromstring(text, dtype=float, sep=" ")
            except (ValueError, DeprecationWarning):
                return None
        if len(vals) != len(starts) or not np.isfinite(vals).all():
            return None
    return vals


_POWERS = 10.0 ** np.arange(16)
"""Powers of ten that a double holds exactly."""


def _fixed_point(
    text: bytes, a: np.ndarray, blank: np.ndarray, starts: np.ndarray
) -> np.ndarray | None:
    """The numbers of ``text`` (``a``: its bytes; ``blank``: where they are whitespace;
    ``starts``: where each number starts) when each is digits with one dot among them, at
    most 15 digits: read as integers without the dot, each divided by the power of ten of
    its decimals, which gives the double nearest the decimal, as ``float()`` does (both
    numbers are exact, and IEEE division rounds correctly); None otherwise.  The integers
    are read about four times faster than the decimals."""
    if text.translate(None, b"0123456789. \t\r\n"):
        return None  # a sign, a vertical tab: read as decimals
    dots = np.flatnonzero(a == 0x2E)
    if len(dots) != len(starts):
        return None
    last = ~blank
    last[:-1] &= blank[1:]
    ends = np.flatnonzero(last)  # the last byte of each number
    # One dot in each number: the i-th dot inside the i-th number.
    if (dots < starts).any() or (dots > ends).any() or (ends - starts > 15).any():
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            ints = np.fromstring(text.translate(None, b"."), dtype=np.int64, sep=" ")
        except (ValueError, DeprecationWarning):
            return None
    if len(ints) != len(starts):
        return None  # a number that was only a dot
    return ints / _POWERS[ends - dots]


def word_array(block: bytes) -> np.ndarray:
    """Every 8 bytes of ``block`` from each offset, as a little-endian word (a view: an
    offset past ``len(block) - 8`` has none)."""
    return np.ndarray((len(block) - 7,), dtype="<u8", buffer=block, strides=(1,))


def line_starts(pos: int, nl: np.ndarray) -> np.ndarray:
    """Where each line from ``pos`` starts (``nl``: the newline that ends each)."""
    starts = np.empty_like(nl)
    if len(nl):
        starts[0] = pos
        starts[1:] = nl[:-1] + 1
    return starts


_TRAILING = np.zeros(256, dtype=bool)
_TRAILING[list(b" \t\r\x0b\x0c")] = True
"""The bytes ``bytes.rstrip()`` takes off a line's end before its newline."""


def lines_ending(
    block: bytes, pos: int, nl: np.ndarray, tail: bytes
) -> tuple[list[int], list[int]]:
    """Start and newline of each line from ``pos`` (``nl``: its newlines) that ends in ``tail``
    before trailing whitespace (``bytes.rstrip``'s), found by a look at the last bytes of each
    line instead of a search of the text: an iteration line of the bulk path ends in ``|``, a
    timer block's header in ``across ranks (ms):``."""
    if not len(nl):
        return [], []
    buf = np.frombuffer(block, dtype=np.uint8)
    starts = line_starts(pos, nl)
    last = nl - 1
    live = last >= starts
    byte = np.where(live, buf[np.maximum(last, 0)], 0)
    # Step back over trailing whitespace, line by line for the few that hold much.
    for _ in range(4):
        ws = np.flatnonzero(live & _TRAILING[byte])
        if not len(ws):
            break
        last[ws] -= 1
        live[ws] = last[ws] >= starts[ws]
        byte[ws] = np.where(live[ws], buf[np.maximum(last[ws], 0)], 0)
    else:
        for i in np.flatnonzero(live & _TRAILING[byte]).tolist():
            text = block[int(starts[i]) : int(nl[i])].rstrip()
            last[i] = starts[i] + len(text) - 1
            byte[i] = text[-1] if text else 0
    pick = np.flatnonzero(byte == tail[-1])
    for j in range(2, len(tail) + 1):
        at = last[pick] - (j - 1)
        pick = pick[at >= starts[pick]]
        pick = pick[buf[last[pick] - (j - 1)] == tail[-j]]
    return starts[pick].tolist(), nl[pick].tolist()


def _word(text: bytes, n: int = 8) -> np.uint64:
    """The first ``n`` bytes of ``text`` as a little-endian word (``ds_heads``)."""
    return np.uint64(int.from_bytes(text[:n], "little"))


_DS_W = (_word(DS_LIT, 6), _word(DS_AFTER), _word(DS_AFTER[5:]))
_LOW6 = np.uint64((1 << 48) - 1)


def ds_heads(
    block: bytes, starts: np.ndarray, nl: np.ndarray, offsets: list[int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The DeepSpeed ``[Rank N] time (ms) |`` lines among those at ``starts`` (``nl``: their
    newlines) whose ``[Rank`` is at one of ``offsets`` from the line start (the first such when more
    are, as a search of the line finds it): (their indices in ``nl``, where ``[Rank`` is,
    the rank (at most 7 digits), where the text after ``|`` starts).  A look at a few bytes
    of every line: no search of the text."""
    none = np.zeros(0, dtype=np.int64)
    if not len(nl) or not offsets or len(block) < 32:
        return none, none, none, none
    buf = np.frombuffer(block, dtype=np.uint8)
    words = word_array(block)
    top = len(block) - 8
    lines, ats = [], []
    for w in offsets:
        at = starts + w
        hit = np.flatnonzero((words[np.minimum(at, top)] & _LOW6) == _DS_W[0])
        at = at[hit]
        ok = at + len(b"[Rank 0] time (ms) |") <= nl[hit]  # (and so no word past the end)
        lines.append(hit[ok])
        ats.append(at[ok])
    idx, at = np.concatenate(lines), np.concatenate(ats)
    if len(offsets) > 1:  # one per line: the first
        order = np.lexsort((at, idx))
        idx, at = idx[order], at[order]
        first = np.ones(len(idx), dtype=bool)
        first[1:] = idx[1:] != idx[:-1]
        idx, at = idx[first], at[first]
    d6 = buf[at + 6]
    if ((buf[at + 7] == 0x5D) & IS_DIGIT[d6]).all():  # (ranks of one digit)
        width = np.ones(len(at), dtype=np.int64)
        rank = d6.astype(np.int64) - 48
    else:
        digits = buf[at[:, None] + 6 + np.arange(8)]
        width = np.argmin(IS_DIGIT[digits], axis=1)  # (0: none, or 8 or more)
        rank = digits[:, 0].astype(np.int64) - 48
        for j in range(1, int(width.max(initial=1))):
            more = width > j
            rank[more] = rank[more] * 10 + digits[more, j] - 48
    q = at + 6 + width  # where "] time (ms) |" is
    ok = (width > 0) & (q + len(DS_AFTER) <= nl[idx])
    q = np.where(ok, q, at)
    ok &= (words[q] == _DS_W[1]) & (words[q + 5] == _DS_W[2])
    if not ok.all():
        idx, at, q, rank = idx[ok], at[ok], q[ok], rank[ok]
    return idx, at, rank, q + len(DS_AFTER)


def same_text(block: bytes, starts: np.ndarray, ends: Any) -> bytes | None:
    """The text of ``block`` from each start to its end when it is the same for all (each
    followed by at least 8 bytes, when it is shorter: compared 8 bytes at a time), else
    None."""
    raw = block[int(starts[0]) : int(ends[0])]
    w = len(raw)
    if not (np.asarray(ends) - starts == w).all():
        return None
    if w == 0:
        return raw
    if w <= 8:
        mask = np.uint64((1 << (8 * w)) - 1)
        same = (
            (word_array(block)[starts] & mask) == np.uint64(int.from_bytes(raw, "little"))
        ).all()
    else:
        got = np.frombuffer(block, dtype=np.uint8)[starts[:, None] + np.arange(w)]
        same = (got == np.frombuffer(raw, dtype=np.uint8)).all()
    return raw if same else None


class MemLines:
    """Megatron memory reports of a segment, column-wise: starts, ends, rank and iteration
    after which each was printed (None where not printed), values (NaN where not printed)."""

    def __init__(
        self,
        ls: np.ndarray,
        le: np.ndarray,
        rank: list[int | None],
        after: list[int | None],
        values: dict[str, np.ndarray],
    ) -> None:
        self.ls, self.le, self.rank, self.after, self.values = ls, le, rank, after, values

    @classmethod
    def of(cls, rows: list[tuple[int, int, int | None, int | None, dict[str, float]]]) -> MemLines:
        """From (start, end, rank, after, values) a report each."""
        return cls(
            np.array([x[0] for x in rows], dtype=np.int64),
            np.array([x[1] for x in rows], dtype=np.int64),
            [x[2] for x in rows],
            [x[3] for x in rows],
            {
                f: np.array([x[4].get(f, np.nan) for x in rows], dtype=float)
                for f in MEM_FIELDS.values()
            },
        )

    def __len__(self) -> int:
        return len(self.ls)

    def select(self, mask: np.ndarray) -> MemLines:
        """The reports where ``mask`` holds."""
        if mask.all():
            return self
        keep = mask.tolist()
        return MemLines(
            self.ls[mask],
            self.le[mask],
            list(compress(self.rank, keep)),
            list(compress(self.after, keep)),
            {f: v[mask] for f, v in self.values.items()},
        )


class ItLines:
    """Megatron iteration lines of a segment in file order (``BulkReaders.iteration_lines``):
    their values as one table when all are of one learned pattern, else each line's own."""

    def __init__(
        self,
        ls: np.ndarray,
        le: np.ndarray,
        number: np.ndarray,
        total: np.ndarray,
        keys: list[str],
        names: tuple[str, ...] | None = None,
        table: np.ndarray | None = None,
        ints: tuple[bool, ...] = (),
        fields: list[tuple[tuple[str, ...], tuple[Any, ...]]] | None = None,
    ) -> None:
        self.ls, self.le, self.number, self.total = ls, le, number, total
        """Starts, ends (after the newline), iteration numbers and totals."""
        self.keys = keys
        """Stream key of each line."""
        self.names, self.table, self.ints = names, table, ints
        """One pattern: its field names, the (lines x fields) values, which fields are ints."""
        self.fields = fields
        """Else each line's (names, values)."""

    @classmethod
    def of_rows(
        cls, rows: list[tuple[int, int, int, int, tuple[tuple[str, ...], tuple[Any, ...]], str]]
    ) -> ItLines:
        """From (start, end, number, total, (names, values), stream) rows."""
        cols = list(zip(*rows, strict=True)) if rows else [()] * 6
        return cls(
            *(np.array(c, dtype=np.int64) for c in cols[:4]),
            keys=list(cols[5]),
            fields=list(cols[4]),
        )

    def rows(self) -> list[tuple[int, int, int, int, tuple[tuple[str, ...], tuple[Any, ...]], str]]:
        """The lines as ``of_rows`` takes them."""
        if self.fields is not None:
            fields = self.fields
        else:
            assert self.names is not None and self.table is not None
            cols = [
                c.astype(np.int64).tolist() if i else c.tolist()
                for c, i in zip(self.table.T, self.ints, strict=True)
            ]
            vals = zip(*cols, strict=True) if cols else ((),) * len(self)
            fields = list(zip(repeat(self.names), vals))
        return list(
            zip(
                self.ls.tolist(),
                self.le.tolist(),
                self.number.tolist(),
                self.total.tolist(),
                fields,
                self.keys,
                strict=True,
            )
        )

    def __len__(self) -> int:
        return len(self.ls)

    def select(self, which: np.ndarray) -> ItLines:
        """The lines at ``which`` (a mask or indices)."""
        idx = np.flatnonzero(which) if which.dtype == bool else which
        pick = idx.tolist()
        return ItLines(
            self.ls[idx],
            self.le[idx],
            self.number[idx],
            self.total[idx],
            list(map(self.keys.__getitem__, pick)),
            self.names,
            None if self.table is None else self.table[idx],
            self.ints,
            None if self.fields is None else list(map(self.fields.__getitem__, pick)),
        )


class StepLines:
    """PipelineEngine step lines of a segment in file order (``BulkReaders.steps_lines``),
    column-wise; a value ``to_float`` gives None for is NaN."""

    def __init__(
        self,
        ls: np.ndarray,
        le: np.ndarray,
        keys: list[str],
        step: np.ndarray,
        loss: np.ndarray,
        iter_ms: np.ndarray,
        samples_per_s: np.ndarray,
    ) -> None:
        self.ls, self.le = ls, le
        """Starts and ends (after the newline)."""
        self.keys = keys
        """Stream key of each line."""
        self.step, self.loss, self.iter_ms, self.samples_per_s = step, loss, iter_ms, samples_per_s
        """The step numbers (int64) and the values (float64)."""

    @classmethod
    def of_rows(cls, rows: list[tuple[Any, ...]]) -> StepLines:
        """From (start, end, stream, step, loss, iter ms, samples/s) rows (None: NaN)."""
        cols = list(zip(*rows, strict=True)) if rows else [()] * 7

        def floats(c: tuple[Any, ...]) -> np.ndarray:
            return np.array([np.nan if v is None else v for v in c], dtype=float)

        return cls(
            np.array(cols[0], dtype=np.int64),
            np.array(cols[1], dtype=np.int64),
            list(cols[2]),
            np.array(cols[3], dtype=np.int64),
            floats(cols[4]),
            floats(cols[5]),
            floats(cols[6]),
        )

    def __len__(self) -> int:
        return len(self.ls)

    def select(self, which: np.ndarray) -> StepLines:
        """The lines at ``which`` (a mask)."""
        if which.all():
            return self
        return StepLines(
            self.ls[which],
            self.le[which],
            list(compress(self.keys, which.tolist())),
            self.step[which],
            self.loss[which],
            self.iter_ms[which],
            self.samples_per_s[which],
        )


class DSLines:
    """DeepSpeed lines of a segment: starts, ends, ranks, which are taken, values by group."""

    def __init__(self, n: int) -> None:
        self.ls = np.zeros(n, dtype=np.int64)
        self.le = np.zeros(n, dtype=np.int64)
        self.rank = np.zeros(n, dtype=np.int64)
        self.keep = np.zeros(n, dtype=bool)
        self.keys: list[str | None] = []
        """Stream key of each line (None: not only launcher prefixes)."""
        self.groups: list[tuple[tuple[str, ...], np.ndarray, np.ndarray]] = []

    def __len__(self) -> int:
        return len(self.ls)


VALUE = rb"( *[-+.0-9eE]+ *)"
"""A value of an iteration line's learned pattern: the bytes of a number; ``float()`` then
reads it or the line is not taken (the numbers it reads are those this pattern's tokens can
be, as the line path's ``_VALUE_PIPE_RE`` then ``to_float`` read them), one pass of the
regular expression engine per byte."""


@dataclass
class IterPattern:
    """A Megatron iteration line shape as a pattern (``BulkShapes.learn_iteration``)."""

    rx: re.Pattern[bytes]
    """From ``iteration`` to the end of the line; groups: spaces, number, spaces, total,
    spaces, one value per piece, trailing spaces."""
    fields: list[tuple[int, str, str, float]]
    """(piece, Iteration field, "int" | "float", factor) as ``BulkShapes.it_shape`` found."""
    fast: re.Pattern[bytes]
    """The same pattern with groups only for the number, the total and the values of
    ``fields``' pieces (in piece order): what ``_iteration_patterns`` reads."""
    pieces: tuple[int, ...]
    """The pieces ``fast`` has a group of, in order."""
    whole: re.Pattern[bytes]
    """``fast`` with a group of the whole match first (``findall`` then gives its length)."""


ALLOC_AFTER = 4
"""DeepSpeed's ``MemAllocated=`` lines are read in bulk too (``Bulk.alloc``) once the run
holds this many DeepSpeed memory lines."""
STEPS_LIT = b"steps:"
"""What DeepSpeed's PipelineEngine step line holds (``BulkReaders.steps_lines``)."""
ALLOC_LIT = b"MemAllocated="
ALLOC_NOT = (
    b"# run outcome",
    b"iteration",
    b"steps:",
    b"time (ms)",
    b"across ranks (ms)",
    b"memory (MB)",
)
"""Texts that send a line to an earlier branch of ``Core._dispatch`` than the one of
``MemAllocated=``: such a line is left to the line path."""
MEMALLOC_RE = re.compile(rb"MemAllocated=([\d.]+)\s*GB.*?MaxMemAllocated=([\d.]+)\s*GB")
RANK_RE = re.compile(rb"\[Rank (\d+)\]")
"""``analysis.parse.rules``' patterns of the same names, on bytes (the same on printable
ASCII, which is all the bulk path takes)."""
OPEN = object()
"""A timer block that does not close in the bytes looked at."""
LONG = object()
"""A timer block with an over-long line (the line path truncates it, and counts it)."""
