"""The bulk scanner's byte-level pieces: keyword anchors, the patterns of DeepSpeed, memory and
iteration lines, value readers, and the line step of the line path. See ``analysis.parse.scan``.
"""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass
from itertools import chain, compress, repeat
from typing import TYPE_CHECKING, Any

import numpy as np

from analysis.parse.keywords import Keywords
from analysis.parse.lines import MAX_LINE_CHARS

if TYPE_CHECKING:  # pragma: no cover
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
_IS_DIGIT = np.zeros(256, dtype=bool)
_IS_DIGIT[48:58] = True
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
    if ((buf[at + 7] == 0x5D) & _IS_DIGIT[d6]).all():  # (ranks of one digit)
        width = np.ones(len(at), dtype=np.int64)
        rank = d6.astype(np.int64) - 48
    else:
        digits = buf[at[:, None] + 6 + np.arange(8)]
        width = np.argmin(_IS_DIGIT[digits], axis=1)  # (0: none, or 8 or more)
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


class BareBlocks:
    """Timer blocks of one stream that one learned pattern read at once
    (``BlockPattern.read_bare``, ``read_keyed``), column-wise, in file order."""

    def __init__(
        self,
        hs: np.ndarray,
        body: np.ndarray,
        end: np.ndarray,
        close: np.ndarray,
        pattern: BlockPattern | None,
        nums: np.ndarray,
    ) -> None:
        self.hs, self.body, self.end, self.close = hs, body, end, close
        """Header starts, body starts (past the header's newline), body ends, closes (the
        start of the stream's line that closes it: the body's end, or past other streams'
        lines)."""
        self.pattern = pattern
        """The pattern that read them: their stream key and their ``flat`` names and shape."""
        self.nums = nums
        """One row of the flat values each."""

    @classmethod
    def empty(cls) -> BareBlocks:
        """None."""
        none = np.zeros(0, dtype=np.int64)
        return cls(none, none, none, none, None, np.zeros((0, 0)))

    def __len__(self) -> int:
        return len(self.hs)

    def select(self, which: np.ndarray) -> BareBlocks:
        """The blocks at ``which`` (a mask)."""
        return BareBlocks(
            self.hs[which],
            self.body[which],
            self.end[which],
            self.close[which],
            self.pattern,
            self.nums[which],
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
_NUMBER = rb"([-\d.eE+]+)"


def line_pattern(raw: bytes, spans: list[tuple[int, int]], offset: int) -> bytes:
    """A line as a pattern: its text, with the numbers at ``spans`` (of its content, which
    starts at ``offset``) as groups."""
    out, q = [], 0
    for a, b in spans:
        out += [re.escape(raw[q : offset + a]), _NUMBER]
        q = offset + b
    out.append(re.escape(raw[q:]))
    return b"".join(out)


_TIMER_TAIL = b"0123456789.eE+-(), \t\r\n\x0b\x0c\x1c\x1d\x1e\x1f"
"""The ASCII bytes of what ``TIMER_LINE_RE`` matches after the ``: `` that ends its name (the
last in the line: no colon follows), as bytes or as text (whose ``\\s`` and ``\\d`` match
more, all of it outside ASCII but these)."""
_NOT_ASCII = bytes(range(0x80, 0x100))
_CLOSES_FOR_CERTAIN = frozenset(range(0x21, 0x7F)) - frozenset(b"0123456789.eE+-):")
"""Last bytes of a line that no line of a timer block ends with: ``TIMER_LINE_RE`` and
``TIMER_RANK_RE`` end in a number (a digit or one of ``.eE+-``) or ``)``, and
``TIMER_NAME_RE`` in ``:``, each then only whitespace (a line whose last byte is whitespace
or not ASCII is looked at in full)."""
_HOST_LABEL_RE = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,62}")
"""A host label (``PREFIXES_RE``'s, not all digits) ``read_keyed`` looks for at line
starts."""
_TAG_LABEL_RE = re.compile(r"default\d+|rank\d+")
"""Labels of another launcher prefix form (``[rank3]:``) than a host's."""
_CLOSES = np.zeros(256, dtype=bool)
_CLOSES[list(_CLOSES_FOR_CERTAIN)] = True
_SPACE = np.zeros(256, dtype=bool)
_SPACE[list(b" \t\n\r\x0b\x0c")] = True
_SPACE_OR_DIGIT = _SPACE | _IS_DIGIT
_PREFIX_START = _SPACE_OR_DIGIT.copy()
_PREFIX_START[list(b"[ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")] = True
"""Bytes a launcher prefix (``PREFIXES_RE``) can start with: whitespace (``\\s``), a digit, a
letter, ``[``."""
START, END, GROUPS = re.Match.start, re.Match.end, re.Match.groups
"""A match's start, end and groups, as functions of it (``map`` over matches)."""


_VECTOR_VALUES = 32
"""Values of a block of "rank" lines from which ``BlockPattern.read`` reduces them with
NumPy."""


class BlockPattern:
    """A Megatron timer block as printed in one piece: the header line and each timer line
    of its stream, with the numbers as groups.  ``read`` checks the line after it too."""

    def __init__(
        self,
        rx: re.Pattern[bytes],
        kind: str,
        recipe: list[tuple[str, str | None]],
        key: str,
        apart: re.Pattern[bytes] | None = None,
        prefix: bytes = b"",
    ) -> None:
        self.rx = rx
        self.apart = apart
        """The same block with other streams' lines between its lines (``BulkShapes.learn``)."""
        self.prefix = prefix
        """The launcher prefixes its lines start with (those of the other lines do not)."""
        self.not_own = re.compile(b"\n(?!" + re.escape(prefix) + b")") if prefix else None
        """A newline not followed by ``prefix`` (``_own_lines``)."""
        self.kind = kind
        self.recipe = recipe
        self.key = key
        self.name = next((n for how, n in reversed(recipe) if how == "name"), None)
        # A block of only "one" and "pair" lines, every name once: its values in the order
        # read are the block's flat values (``Bulk._add_blocks``), names and shape fixed.
        named = [(how, n) for how, n in recipe if how in ("one", "pair")]
        names = tuple(n for _h, n in named)
        # How the values read are placed: (how, name, first, past the last) over the numbers,
        # one entry for each run of one name's "rank" lines (64 ranks' times of one timer).
        self.plan: list[tuple[str, str | None, int, int]] = []
        j = 0
        for how, n in recipe:
            if how == "name":
                continue
            w = 2 if how == "pair" else 1
            last = self.plan[-1] if self.plan else None
            if how == "rank" and last is not None and last[0] == "rank" and last[1] == n:
                self.plan[-1] = (how, n, last[2], j + 1)
            else:
                self.plan.append((how, n, j, j + w))
            j += w
        self.flat: tuple[tuple[str, ...], tuple[int, ...]] | None = None
        if all(how in ("one", "pair", "name") for how, _n in recipe) and len(set(names)) == len(
            names
        ):
            self.flat = (names, tuple(2 if how == "pair" else 0 for how, _n in named))  # type: ignore[misc]
        # A block of only "rank" lines (``--timing-log-option all``), of many values: each
        # run's (min, max) in two vector reductions (for a few values, NumPy's calls cost more
        # than Python's ``min`` and ``max``).
        self.runs: np.ndarray | None = None
        if (
            self.plan
            and all(how == "rank" for how, *_r in self.plan)
            and self.plan[-1][3] >= _VECTOR_VALUES
        ):
            self.runs = np.array([a for _h, _n, a, _b in self.plan], dtype=np.intp)
        # A stream of one host label (pdsh's ``node1: ``): its lines are those that start with
        # the label, a colon and whitespace (``read_keyed``).
        self.host: bytes | None = None
        if (
            _HOST_LABEL_RE.fullmatch(key)
            and not _TAG_LABEL_RE.fullmatch(key)
            and prefix[:-1] == key.encode() + b":"
            and _SPACE[prefix[-1]]
        ):
            self.host = key.encode() + b":"

    def read(self, bulk: Any, block: bytes, ls: int, T: int) -> Any:
        """(close, values, [span of its body lines], stream, flat) of the block at ``ls``,
        ``OPEN``, ``LONG``, or None when it is not this block printed in one piece.  ``flat``:
        (names, shape, values) when the block's values are those (then ``values`` is None)."""
        m = self.rx.match(block, ls, T)
        apart = m is None
        if apart:
            # Other streams' lines between its lines (a launcher that printed another rank's
            # line inside a long block): each must be of another stream as the line path
            # finds it, and not over-long.
            m = self.apart.match(block, ls, T) if self.apart is not None else None
            if m is None:
                return None
        values: dict[str, Any] | None = None
        flat = None
        nums: Any = None
        if self.runs is not None:
            try:
                arr = np.fromiter(map(float, m.groups()), dtype=float, count=self.rx.groups)
            except ValueError:
                return None
            if not np.isfinite(arr).all():
                return None
            if arr.all():  # (no zero: the one value on which min() and NumPy could differ)
                lo_a = np.minimum.reduceat(arr, self.runs).tolist()
                hi_a = np.maximum.reduceat(arr, self.runs).tolist()
                values = {}
                for (_h, name, _a, _b), lo, hi in zip(self.plan, lo_a, hi_a, strict=True):
                    if name in values:
                        lo0, hi0 = values[name]
                        lo, hi = min(lo0, lo), max(hi0, hi)
                    values[name] = (lo, hi)
            else:
                nums = arr.tolist()
        else:
            try:
                nums = list(map(float, m.groups()))
            except ValueError:
                return None
            if not all(map(math.isfinite, nums)):
                return None
        if nums is None:
            pass
        elif self.flat is not None:
            flat = (*self.flat, nums)
        else:
            values = {}
            for how, name, a, b in self.plan:
                if how == "pair":
                    values[name] = (nums[a], nums[a + 1])
                elif how == "one":
                    values[name] = nums[a]
                elif how == "rank":  # (min, max) over the ranks, the earlier kept on a tie
                    run = nums[a:b]
                    lo, hi = values.get(name, (run[0], run[0]))
                    values[name] = (min(lo, min(run)), max(hi, max(run)))
        # The lines of the block (one span: they follow one another), then the line that
        # closes it.
        q = m.end()
        first = block.find(b"\n", ls) + 1
        mine = [(first, q)] if q > first else []
        if apart:
            mine = self._own_lines(bulk, block, first, q)
            if mine is None:
                return None
        name = self.name
        while q < T:
            le = line_end(block, q, T)
            if le >= T:
                return OPEN
            if le - q > MAX_LINE_CHARS:
                return LONG
            c = block[q] if q < le else 0x20
            if (
                not self.key
                and PREFIXES_RE.match(block, q, le).end() == q
                and (  # type: ignore[union-attr]
                    0x20 <= c < 0x7F or c == 0x09
                )
            ):
                s, cs = q, q  # (a line without prefixes, plain ASCII: the bare stream's next)
            else:
                nxt = bulk.next_of_stream(block, self.key, q, T)  # (q > 0: after the header)
                if nxt is None:
                    return OPEN
                s, le, cs = nxt
            if le - s > MAX_LINE_CHARS:
                return LONG
            # (Whether the line closes the block does not depend on the values read.)  A line
            # that ends in a printable byte no timer line ends with closes it for certain, as
            # does, in a block of another kind than "times", one whose text after its last
            # ``: `` holds a byte that ``TIMER_LINE_RE`` does not match there.
            if (
                (le == s or block[le - 1] not in _CLOSES_FOR_CERTAIN)
                and (
                    self.kind == "times"
                    or not block[s:le]
                    .rpartition(b": ")[2]
                    .translate(None, _TIMER_TAIL)
                    .translate(None, _NOT_ASCII)
                )
                and bulk.readers.body_step(block, s, le, cs, self.kind, name, {}) is not None
            ):
                return None  # the block goes on: read it line by line
            return s, values, mine, self.key, flat
        return OPEN

    def _match_all(
        self, block: bytes, hs: np.ndarray, T: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """This pattern at each header line ``hs``: (matched, the end of each match, its
        values, a row each), None when a value does not convert (``read`` finds which)."""
        ms = list(map(self.rx.match, repeat(block), hs.tolist(), repeat(T)))
        matched = np.array([m is not None for m in ms], dtype=bool)
        hit = list(compress(ms, matched.tolist())) if not matched.all() else ms
        try:
            nums = np.array(list(map(float, chain.from_iterable(map(GROUPS, hit)))), dtype=float)
        except ValueError:
            return None
        q = np.fromiter(map(END, hit), dtype=np.int64, count=len(hit))
        return matched, q, nums.reshape(len(hit), self.rx.groups)

    def read_bare(
        self, block: bytes, hs: np.ndarray, T: int, nl: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``read`` of the blocks of a stream without launcher prefixes at the header lines
        ``hs`` (``nl``: the newlines up to T), in a few passes: (taken, close, values) of
        each, taken when it is this block printed in one piece, of values that convert,
        closed for certain by the line right after it (a line without prefixes that ends in
        a printable byte no timer line ends with), else not (``read`` reads it); the values
        (a row of ``flat``'s numbers each) of those taken."""
        n = len(hs)
        none = (np.zeros(n, dtype=bool), np.zeros(n, dtype=np.int64), np.zeros((n, 0)))
        if self.flat is None or self.key or not n:
            return none
        got = self._match_all(block, hs, T)
        if got is None:
            return none
        matched, q, nums = got
        k = self.rx.groups
        j = np.minimum(np.searchsorted(nl, q), len(nl) - 1)
        le = nl[j]  # (past the last newline: not whole, not taken)
        buf = np.frombuffer(block, dtype=np.uint8)
        c, c1 = buf[np.minimum(q, le)], buf[np.minimum(q + 1, le)]
        # The line at q is the stream's next when it has no launcher prefix: it starts with a
        # byte no prefix starts with, or whitespace and then a byte that is not a digit or
        # whitespace (``PREFIXES_RE``); plain ASCII (``Bulk line_key``).
        good = (
            (le > q)
            & (le - q <= MAX_LINE_CHARS)
            & np.isfinite(nums).all(axis=1)
            & (~_PREFIX_START[c] | (_SPACE[c] & ~_SPACE_OR_DIGIT[c1]))
            & ((c >= 0x20) & (c < 0x7F) | (c == 0x09))
            & _CLOSES[buf[le - 1]]
        )
        if len(q) == n:
            return good, q, nums
        taken = np.zeros(n, dtype=bool)
        close = np.zeros(n, dtype=np.int64)
        values = np.zeros((n, k))
        taken[matched], close[matched], values[matched] = good, q, nums
        return taken, close, values

    def read_keyed(
        self, bulk: Any, block: bytes, hs: np.ndarray, pos: int, T: int, nl: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``read`` of the blocks of a stream of one host label (``host``) at the header lines
        ``hs`` (``nl``: the newlines of [pos, T)), in a few
        passes: (taken, close, end of the body, values) of each, taken when it is this block
        printed in one piece (no other stream's line inside), of values that convert, and
        closed for certain by the stream's next line (the first line after it that starts
        with the label: it ends in a printable byte no timer line ends with, and it is the
        stream's as ``Bulk line_key`` finds), else not (``read`` reads it)."""
        n = len(hs)
        none = (
            np.zeros(n, dtype=bool),
            np.zeros(n, dtype=np.int64),
            np.zeros(n, dtype=np.int64),
            np.zeros((n, 0)),
        )
        host = self.host
        if self.flat is None or host is None or not n or not len(nl):
            return none
        starts = line_starts(pos, nl)
        if int(starts[-1]) > len(block) - max(8, len(host) + 3):
            return none  # (a line too near the end of the text for a look at its start)
        got = self._match_all(block, hs, T)
        if got is None or not len(got[1]):
            return none
        matched, q, nums = got
        k = self.rx.groups
        # The lines that start with the label, a colon and whitespace: the only ones that can
        # be the stream's (``PREFIXES_RE``: a host label starts its line).
        buf = np.frombuffer(block, dtype=np.uint8)
        w = len(host)
        if w <= 8:  # (one word a line)
            word = word_array(block)[starts] & np.uint64((1 << (8 * w)) - 1)
            same = word == np.uint64(int.from_bytes(host, "little"))
        else:
            same = np.ones(len(starts), dtype=bool)
            for i, byte in enumerate(host):
                same &= buf[starts + i] == byte
        own = np.flatnonzero(same & _SPACE[buf[starts + w]])
        j = np.searchsorted(own, np.searchsorted(starts, q))
        found = j < len(own)
        line = own[np.minimum(j, max(len(own) - 1, 0))] if len(own) else j * 0
        s = starts[line] if len(own) else q
        le = nl[line] if len(own) else q
        # Its key is the stream's for certain when the byte after the label's whitespace can
        # start no other launcher prefix (``read_bare``'s test) and is plain ASCII; else as
        # ``Bulk line_key`` finds it.
        top = len(block) - 1
        c, c1 = buf[np.minimum(s + w + 1, top)], buf[np.minimum(s + w + 2, top)]
        sure = (~_PREFIX_START[c] | (_SPACE[c] & ~_SPACE_OR_DIGIT[c1])) & (
            (c >= 0x20) & (c < 0x7F) | (c == 0x09)
        )
        good = found & (le - s <= MAX_LINE_CHARS) & (le > s + w + 1) & np.isfinite(nums).all(axis=1)
        certain = _CLOSES[buf[le - 1]]
        for i in np.flatnonzero(good & ~(sure & certain)).tolist():
            a, e = int(s[i]), int(le[i])
            text = block[a:e]
            # (As ``read``: a block of another kind than "times" is closed for certain by a
            # line whose text after its last ``: `` holds a byte no timer line's does there.)
            if not certain[i] and (
                self.kind == "times"
                or not text.rpartition(b": ")[2]
                .translate(None, _TIMER_TAIL)
                .translate(None, _NOT_ASCII)
            ):
                good[i] = False
                continue
            if not sure[i]:
                good[i] = bulk.kept_key(block, a, e)[0] == self.key
        taken = np.zeros(n, dtype=bool)
        close = np.zeros(n, dtype=np.int64)
        end = np.zeros(n, dtype=np.int64)
        values = np.zeros((n, k))
        taken[matched], close[matched], end[matched], values[matched] = good, s, q, nums
        return taken, close, end, values

    def _own_lines(
        self, bulk: Any, block: bytes, first: int, q: int
    ) -> list[tuple[int, int]] | None:
        """The spans of the block's own lines in [first, q), which ``apart`` matched: the
        lines that start with its prefixes (the pattern takes no other line of its own);
        None when another is of its stream after all, or over-long."""
        mine: list[tuple[int, int]] = []
        key = self.key
        # The other lines: the first if it does not start with the prefixes, then each after a
        # newline not followed by them (the last newline, before q, ends the block's lines).
        starts = [] if block.startswith(self.prefix, first) else [first]
        if self.not_own is not None:
            starts += [m.end() for m in self.not_own.finditer(block, first, q - 1)]
        at = first
        for s in starts:
            e = block.find(b"\n", s, q)
            if e - s > MAX_LINE_CHARS or bulk.line_key(block, s, e)[0] == key:
                return None
            if s > at:
                mine.append((at, s))
            at = e + 1
        if q > at:
            mine.append((at, q))
        return mine
