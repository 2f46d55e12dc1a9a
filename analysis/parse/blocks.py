"""Bulk extraction of Megatron timer blocks (``(min, max) time``, ``max time`` and ``times
across ranks (ms):`` blocks): records of many lines, each the header and the lines of its
stream up to the stream's next other line, which closes it (``Core._continue_block``).

A block is taken when it is printed in one piece in a form that is read for certain as the
line path reads it (other streams' lines may come between its lines); its values are read a
form (the body without its digits) at a time.  Any other block is left where it is, and the
bulk step ends at its header, so the line path reads it.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from analysis.parse.extract import DIGITS, floats, floats_text, matches
from analysis.parse.lines import MAX_LINE_CHARS, split_prefix, to_float
from analysis.parse.rules import TIMER_LINE_RE, TIMER_NAME_RE, TIMER_RANK_RE

_NUM = rb"-?\d+(?:\.\d+)?"
"""A plain decimal: ``float()`` reads it as ``lines.to_float`` does."""
HEAD_RE = re.compile(rb" across ranks \(ms\):[ \t]*\r?\n")
"""A Megatron timer block's header, after its kind, to its newline."""
KINDS = (b"(min, max) time", b"max time", b"times")
_NAME = rb"[A-Za-z_][A-Za-z0-9_-]*(?: [A-Za-z0-9_-]+)*"
_PAIR_LINE = rb"[ \t]+" + _NAME + rb" \.+: (?:\(" + _NUM + rb", " + _NUM + rb"\)|" + _NUM + rb")"
_PAIR_VALUES = re.compile(
    rb"[ \t]+(" + _NAME + rb") \.+: (?:\((" + _NUM + rb"), (" + _NUM + rb")\)|(" + _NUM + rb"))"
)
_RANK_NAME = rb" {1,3}" + _NAME + rb":"
_RANK_LINE = rb"[ \t]+rank +\d{1,9}: *" + _NUM
_RANK_NAMES = re.compile(rb"\n {1,3}(" + _NAME + rb"):[ \t]*\r?\n")


class Block:
    """A Megatron timer block read whole."""

    __slots__ = ("body", "close", "end", "key", "names", "nums", "shape", "spans", "start")

    def __init__(
        self,
        start: int,
        body: int,
        end: int,
        close: int,
        key: str,
        names: tuple[str, ...],
        shape: tuple[int, ...],
        nums: list[float],
        spans: list[tuple[int, int]],
    ) -> None:
        self.spans = spans
        """Its lines past the header: (start, end) of each run of them."""
        self.start, self.body, self.end, self.close = start, body, end, close
        """Header start, body start, body end, start of the stream's line that closes it."""
        self.key = key
        """Its stream."""
        self.names, self.shape, self.nums = names, shape, nums
        """Timer names, 2 for a (min, max) pair or 0 for one value each, the values flat."""


class BlockExtractor:
    """The timer blocks of one file; ``host`` (``analysis.parse.bulk.Bulk``) gives stream keys
    and finds a stream's next line."""

    def __init__(self, host: Any) -> None:
        self.host = host
        self.body_res: dict[tuple[bytes, bytes], re.Pattern[bytes]] = {}
        """(launcher prefix, block kind) -> the pattern of such a block's body."""
        self.names: dict[tuple[str, ...], tuple[str, ...]] = {}
        """Timer names, one tuple for equal ones."""

    def timer_blocks(
        self, block: bytes, pos: int, T: int, nl: np.ndarray, its: dict[int, str]
    ) -> tuple[int, list[Block], bool]:
        """Megatron timer blocks of [pos, T) printed in one piece (the header, then each line of
        the block, its stream's lines one after another), closed by the stream's next line
        before T.  Returns (T, the blocks, whether T moved to a block open at T); T moves to
        the header of the first block not read (the line path reads it).  ``its``: the start
        of each iteration line of [pos, T) the bulk path reads -> its stream (such a line
        closes a block of its stream)."""
        heads = []
        for m in HEAD_RE.finditer(block, pos, T):
            q = m.start()
            kind = next((k for k in KINDS if block.startswith(k, q - len(k), q)), None)
            if kind is None:
                break  # (the line path reads it)
            heads.append((q - len(kind), m.end(), kind))
        if not heads:
            return T, [], False
        at = np.array([h[0] for h in heads], dtype=np.int64)
        hs_l = self.host.extract.starts(block, pos, nl, at).tolist()
        # Most blocks are of one stream and kind: one search reads their bodies.
        prefix0, kind0 = block[hs_l[0] : heads[0][0]], heads[0][2]
        fixed = len(prefix0) + len(kind0) + len(b" across ranks (ms):")
        ws, we, (tails, _b) = matches(self._rx(prefix0, kind0, True), block, pos, T, fixed)
        j = np.minimum(np.searchsorted(ws, hs_l), max(len(ws) - 1, 0))
        hit = (ws[j] == hs_l) if len(ws) else np.zeros(len(hs_l), dtype=bool)
        lens = np.fromiter(map(len, tails), dtype=np.int64, count=len(tails))
        body_l = (ws + fixed + lens)[j].tolist() if len(ws) else [0] * len(hs_l)
        end_l = we[j].tolist() if len(ws) else [0] * len(hs_l)
        found: list[Any] = []
        stop, is_open = T, False
        for i, (hs, (q, head_end, kind)) in enumerate(zip(hs_l, heads, strict=True)):
            prefix = block[hs:q]
            key = self.host.extract.head_key(prefix, b"(")
            if key is None:
                stop = hs
                break
            close = -3
            if hit[i] and kind == kind0 and prefix == prefix0:  # (printed in one piece)
                body, end = body_l[i], end_l[i]
                close = end if its.get(end) == key else self._close(block, key, kind, end, T)
            if close == -3 or (close == -2 and prefix):  # (other streams' lines among it)
                b = self._rx(prefix, kind, False).match(block, head_end, T)
                if b is None:
                    stop, is_open = hs, head_end >= T
                    break
                body, end = b.start(), b.end()
                close = end if its.get(end) == key else self._close(block, key, kind, end, T)
            if close < 0:
                stop, is_open = hs, close == -1
                break
            if (
                end - hs > MAX_LINE_CHARS
                and max(map(len, block[hs:end].split(b"\n"))) > MAX_LINE_CHARS
            ):
                stop = hs
                break
            spans = self._own_lines(block, key, prefix, body, end)
            if spans is None:
                stop = hs
                break
            found.append((hs, body, end, close, key, kind, prefix, spans))
        out = self._values(block, found)
        if len(out) < len(found):
            return found[len(out)][0], out, False
        return stop, out, is_open

    def _rx(self, prefix: bytes, kind: bytes, whole: bool) -> re.Pattern[bytes]:
        """The pattern of a block body of a stream (``prefix``) and ``kind``, other streams' lines
        among its lines; ``whole``: from the header, the body a group, printed in one piece."""
        rx = self.body_res.get((prefix, kind + b"+" * whole))
        if rx is None:
            p = re.escape(prefix)
            # (Lines of other streams may come between its lines.  Each line ends at its
            # newline, whatever way it matched: possessive repeats match what greedy ones do,
            # without keeping a way back.)
            o = rb"(?:(?!" + p + rb")[^\n]*\n)*" if prefix and not whole else b""
            if kind == b"times":
                line = (
                    rb"(?:"
                    + o
                    + p
                    + _RANK_NAME
                    + rb"[ \t]*\r?\n(?:"
                    + o
                    + p
                    + _RANK_LINE
                    + rb"[ \t]*\r?\n)++)++"
                )
            else:
                line = rb"(?:" + o + p + _PAIR_LINE + rb"[ \t]*\r?\n)++"
            if whole:
                line = p + re.escape(kind) + rb" across ranks \(ms\):([ \t]*\r?\n)(" + line + rb")"
            rx = self.body_res[(prefix, kind + b"+" * whole)] = re.compile(line)
        return rx

    def _close(self, block: bytes, key: str, kind: bytes, end: int, T: int) -> int:
        """Where the line that closes a block whose body ends at ``end`` starts (the stream's
        next line); -1 when none before T, -2 when that line continues the block."""
        if end >= T:
            return -1
        ce = block.find(b"\n", end, T)
        if ce < 0:
            return -1
        if self.host.line_key(block, end, ce)[0] == key:
            close = end
        else:
            nxt = self.host.next_of_stream(block, key, end, T)
            if nxt is None:
                return -1
            close, ce = nxt[0], nxt[1]
        if ce - close > MAX_LINE_CHARS:
            return -2
        line = block[close:ce].rstrip()
        if line.endswith(b"|") and b"\x1b" not in line:
            return close  # (no line of a timer block ends so)
        return -2 if _continues(block[close:ce], kind) else close

    def _own_lines(
        self, block: bytes, key: str, prefix: bytes, body: int, end: int
    ) -> list[tuple[int, int]] | None:
        """The spans of the block's own lines in [body, end) (other streams' lines may come
        between them); None when a line between them is of its stream after all."""
        text = block[body:end]
        n = text.count(b"\n")
        if not prefix or text.count(b"\n" + prefix) + text.startswith(prefix) == n:
            return [(body, end)]
        spans: list[tuple[int, int]] = []
        q = body
        while q < end:
            e = block.find(b"\n", q, end) + 1
            if block.startswith(prefix, q, e):
                if spans and spans[-1][1] == q:
                    spans[-1] = (spans[-1][0], e)
                else:
                    spans.append((q, e))
            elif self.host.line_key(block, q, e - 1)[0] == key:
                return None
            q = e
        return spans

    def _values(self, block: bytes, found: list[Any]) -> list[Block]:
        """The blocks of ``found`` with their names and values, read a form (the body without
        its digits) at a time; up to the first the line path must read (a name twice)."""
        if not found:
            return []
        bodies = [
            block[f[7][0][0] : f[7][0][1]]
            if len(f[7]) == 1
            else b"".join(block[a:b] for a, b in f[7])
            for f in found
        ]
        prefixes = [f[6] for f in found]
        if prefixes.count(prefixes[0]) == len(prefixes):
            p = prefixes[0]
            if p:
                bodies = [(b"\n" + x).replace(b"\n" + p, b"\n")[1:] for x in bodies]
        else:
            bodies = [
                (b"\n" + x).replace(b"\n" + p, b"\n")[1:] if p else x
                for x, p in zip(bodies, prefixes, strict=True)
            ]
        kinds = [f[5] for f in found]
        forms = b"\x00".join(bodies).translate(None, DIGITS).split(b"\x00")
        if kinds.count(kinds[0]) != len(kinds):
            forms = [k + b"\n" + x for k, x in zip(kinds, forms, strict=True)]
        groups: dict[bytes, list[int]] = {}
        for i, f in enumerate(forms):
            groups.setdefault(f, []).append(i)
        got: list[tuple[tuple[str, ...], tuple[int, ...], list[float]] | None] = [None] * len(found)
        for idx in groups.values():
            kind = found[idx[0]][5]
            mine = [bodies[i] for i in idx]
            rows = (self._rank_rows if kind == b"times" else self._pair_rows)(mine)
            if rows is None:  # a digit in a name, a name twice: block by block
                rows = []
                for x in mine:
                    one = (self._rank_rows if kind == b"times" else self._pair_rows)([x])
                    rows.append(one[0] if one else None)
            for i, r in zip(idx, rows, strict=True):
                got[i] = r
        out = []
        for f, g in zip(found, got, strict=True):
            if g is None:
                break
            names = self.names.setdefault(g[0], g[0])
            out.append(Block(f[0], f[1], f[2], f[3], f[4], names, g[1], g[2], f[7]))
        return out

    @staticmethod
    def _pair_rows(bodies: list[bytes]) -> list[Any] | None:
        """(names, shape, values) of bodies of one form of ``name ....: (min, max)`` lines, or
        None when their names differ or one repeats."""
        first = _PAIR_VALUES.findall(bodies[0])
        n = len(first)
        names = tuple(v[0].decode() for v in first)
        shape = tuple(0 if v[3] else 2 for v in first)
        if len(bodies) > 1 and len(set(names)) == n and not _digits_in(first):
            # The same form: the same names when none holds a digit (the digits of the
            # bodies are those of their values).
            joined = b"".join(bodies)
            if all(shape):  # (pairs only: found by their literal text)
                toks = [x for pair in _PAIRS.findall(joined) for x in pair]
            else:
                toks = _PAIR_NUMS.findall(joined)
            w = sum(max(k, 1) for k in shape)
            if len(toks) == w * len(bodies):
                digits = len(joined) - len(joined.translate(None, DIGITS))
                text = b" ".join(toks)
                if len(text.translate(None, b"-. ")) == digits:
                    nums = floats(toks)
                    if nums is not None:
                        return [(names, shape, r) for r in nums.reshape(len(bodies), w).tolist()]
        vals = _PAIR_VALUES.findall(b"".join(bodies))
        names = tuple(v[0].decode() for v in vals[:n])
        if len(set(names)) != n or n * len(bodies) != len(vals):
            return None
        every = b"".join(v[0] for v in vals)
        if len(every.translate(None, DIGITS)) != len(every) and len(bodies) > 1:
            return None
        shape = tuple(0 if v[3] else 2 for v in vals[:n])
        toks = [x for v in vals for x in ((v[3],) if v[3] else (v[1], v[2]))]
        nums = floats(toks)
        if nums is None:
            return None
        w = len(toks) // len(bodies)
        return [(names, shape, r) for r in nums.reshape(len(bodies), w).tolist()]

    @staticmethod
    def _rank_rows(bodies: list[bytes]) -> list[Any] | None:
        """(names, shape, values) of ``times across ranks`` bodies of one form (a name line,
        then a line per rank): each name's (min, max) over its ranks."""
        first = b"\n" + bodies[0]
        heads = list(_RANK_NAMES.finditer(first))
        printed = [h.group(1).decode() for h in heads]
        if not printed:
            return None
        counts = [
            len(
                _RANK_VALUE.findall(
                    first, h.end() - 1, heads[i + 1].start() if i + 1 < len(heads) else len(first)
                )
            )
            for i, h in enumerate(heads)
        ]
        total = sum(counts)
        got = _rank_values(bodies, total) if len(bodies) > 1 else None
        if got is None:
            if len(bodies) > 1:
                every = b"".join(_RANK_NAMES.findall(b"\n" + b"\n".join(bodies)))
                if len(every.translate(None, DIGITS)) != len(every):
                    return None
            toks = _RANK_VALUE.findall(b"\n" + b"\n".join(bodies))
            if len(toks) != total * len(bodies):
                return None
            got = floats(toks)
            if got is None:
                return None
        vals = got.reshape(len(bodies), total)
        # The columns of each name, in the order printed (a name printed twice: both runs).
        cols: dict[str, list[int]] = {}
        at = 0
        for name, k in zip(printed, counts, strict=True):
            cols.setdefault(name, []).extend(range(at, at + k))
            at += k
        out = np.empty((len(bodies), 2 * len(cols)))
        for j, c in enumerate(cols.values()):
            mine = vals[:, c]
            out[:, 2 * j], out[:, 2 * j + 1] = mine.min(axis=1), mine.max(axis=1)
        rows = out.tolist()
        for r in np.flatnonzero((vals == 0).any(axis=1)).tolist():
            # (min and max of zeros of both signs as Python's keep them: the first)
            row: list[float] = []
            for c in cols.values():
                lo_v = hi_v = float(vals[r, c[0]])
                for v in vals[r, c[1:]].tolist():
                    lo_v, hi_v = min(lo_v, v), max(hi_v, v)
                row += [lo_v, hi_v]
            rows[r] = row
        names = tuple(cols)
        shape = (2,) * len(names)
        return [(names, shape, r) for r in rows]


_PAIRS = re.compile(rb": \((" + _NUM + rb"), (" + _NUM + rb")\)")
"""The numbers of ``name ....: (min, max)`` lines, in order."""
_PAIR_NUMS = re.compile(rb"(?<=[:,] )\(?(" + _NUM + rb")")
"""The numbers of ``name ....: (min, max)`` and ``name ....: value`` lines, in order."""


def _digits_in(found: list[tuple[bytes, ...]]) -> bool:
    """Whether a name of ``_PAIR_VALUES``' matches holds a digit."""
    every = b"".join(v[0] for v in found)
    return len(every.translate(None, DIGITS)) != len(every)


_RANK_VALUE = re.compile(rb"\n[ \t]+rank +\d{1,9}: *(" + _NUM + rb")")
_RANK_FULL = re.compile(_RANK_LINE + rb"[ \t]*\r?")
"""A rank line of a ``times across ranks`` body, without its newline."""


def _rank_values(bodies: list[bytes], total: int) -> np.ndarray | None:
    """The ``total`` rank values of each of ``bodies`` (of one form, each line ending in a
    newline), (bodies, total), found with numpy over their bytes: one form has the same lines,
    so the rank lines of the first body are those of each, and a value is the text after its
    line's colon.  None when they are not read so for certain: a digit in a name line (a name
    may differ), a line taken for a rank line that holds no value (``_RANK_VALUE`` reads
    them then)."""
    lines = bodies[0].split(b"\n")
    if lines.pop():
        return None
    is_rank = np.array([_RANK_FULL.fullmatch(x) is not None for x in lines], dtype=bool)
    if int(is_rank.sum()) != total or not total:
        return None
    joined = b"".join(bodies)
    a = np.frombuffer(joined, dtype=np.uint8)
    nl = np.flatnonzero(a == 0x0A)
    if len(nl) != len(lines) * len(bodies) or nl[-1] != len(a) - 1:
        return None
    starts = np.concatenate([[0], nl[:-1] + 1])
    rank = np.tile(is_rank, len(bodies))
    names = b"".join(
        map(joined.__getitem__, map(slice, starts[~rank].tolist(), nl[~rank].tolist()))
    )
    if len(names.translate(None, DIGITS)) != len(names):
        return None
    ends = nl[rank]
    colons = np.flatnonzero(a == 0x3A)
    c = colons[np.searchsorted(colons, ends) - 1]
    if (c < starts[rank]).any() or (c + 1 >= ends).any():
        return None
    # The bytes after each rank line's colon and the newlines: the values, one per line.
    delta = np.zeros(len(a) + 1, dtype=np.int8)
    delta[c + 1] = 1
    delta[ends] = -1
    keep = np.cumsum(delta[:-1], dtype=np.int8).view(bool)
    keep[nl] = True
    text = a[keep].tobytes()
    got = floats_text(text, total * len(bodies))
    return None if got is None else got.reshape(len(bodies), total)


def _continues(line: bytes, kind: bytes) -> bool:
    """Whether the line path reads ``line`` (a line of the block's stream) as one more line
    of an open block of ``kind`` (``Core._continue_block``)."""
    # Text each pattern needs (the bulk path sees no NUL or escape byte, which the line path
    # removes): ``name ....: value`` holds " ." or " :", a rank line "rank", a name line ends
    # in ":".  Most lines that close a block hold none of them: no decoding for those.
    if kind != b"times":
        if b" :" not in line and b" ." not in line:
            return False
    elif b"rank" not in line and not line.rstrip().endswith(b":"):
        return False
    raw = line.decode("utf-8", "replace")[:MAX_LINE_CHARS].rstrip("\r\n").replace("\x00", "")
    text = split_prefix(raw)[1]
    if kind != b"times":
        tm = TIMER_LINE_RE.match(text)
        return tm is not None and to_float(tm.group(2)) is not None
    return TIMER_RANK_RE.match(text) is not None or TIMER_NAME_RE.match(text) is not None
