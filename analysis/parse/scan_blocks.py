"""Megatron timer blocks printed in one piece, read by one pattern each (``BlockPattern``):
the header line and each timer line of its stream, with the numbers as groups.  A part of the
bulk path (``analysis.parse.scan``).
"""

from __future__ import annotations

import math
import re
from itertools import chain, compress, repeat
from typing import Any

import numpy as np

from analysis.parse.lines import MAX_LINE_CHARS
from analysis.parse.scan_bytes import (
    IS_DIGIT,
    LONG,
    OPEN,
    PREFIXES_RE,
    line_end,
    line_starts,
    word_array,
)

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
_SPACE_OR_DIGIT = _SPACE | IS_DIGIT
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
