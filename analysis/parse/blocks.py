"""Bulk extraction of Megatron timer blocks (``(min, max) time``, ``max time`` and ``times
across ranks (ms):``): a header and its stream's lines up to the stream's next other line, other
streams' lines maybe among them.  Blocks of the stretch's first stream and kind printed in one
piece are found by one pattern and closed with array operations; the others one by one.  Values
are read a form (the body without its digits) at a time; a block not read so for certain ends the
step at its header, for the line path.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from analysis.parse.extract import (
    DIGITS,
    NUM,
    PREFIXES_RE,
    Extractors,
    floats_text,
    line_end,
    matches,
    spans_text,
)
from analysis.parse.lines import MAX_LINE_CHARS, TIME_STAMP, split_prefix, to_float
from analysis.parse.rules import TIMER_LINE_RE, TIMER_NAME_RE, TIMER_RANK_RE

HEAD_RE = re.compile(rb" across ranks \(ms\):([ \t]*\r?\n)")
"""A Megatron timer block's header, after its kind, to its newline."""
_ACROSS = b" across ranks (ms):"
KINDS = (b"(min, max) time", b"max time", b"times")
"""The kinds of block, as their headers name them."""
_NAME = rb"[A-Za-z_][A-Za-z0-9_-]*+(?: [A-Za-z0-9_-]++)*+"
_PAIR_LINE = rb"[ \t]++" + _NAME + rb" \.++: (?:\(" + NUM + rb", " + NUM + rb"\)|" + NUM + rb")"
_PAIR_VALUES = re.compile(
    rb"[ \t]+(" + _NAME + rb") \.+: (?:\((" + NUM + rb"), (" + NUM + rb")\)|(" + NUM + rb"))"
)
_RANK_NAME = rb" {1,3}+" + _NAME + rb":"
_RANK_LINE = rb"[ \t]++rank ++\d{1,9}+: *+" + NUM


class Blocks:
    """Megatron timer blocks read whole, in file order, as columns."""

    def __init__(self) -> None:
        none = np.zeros(0, dtype=np.int64)
        self.start, self.body, self.end, self.close = none, none, none, none
        """Header start, body start, body end, start of the stream's line that closes it."""
        self.keys: list[str] = []
        """Stream of each."""
        self.own_s, self.own_e = none, none
        """Their lines past the header: (start, end) of each run of them."""
        self.groups: list[tuple[tuple[str, ...], tuple[int, ...], np.ndarray, np.ndarray]] = []
        """(timer names, 2 for a (min, max) pair or 0 for one value each, the blocks, their
        values: blocks x numbers), by names and shape in the order of their first block."""

    def __len__(self) -> int:
        return len(self.start)

    def head(self, n: int) -> Blocks:
        """The first ``n`` blocks."""
        if n >= len(self):
            return self
        out = Blocks()
        out.start, out.body, out.end, out.close = (
            self.start[:n], self.body[:n], self.end[:n], self.close[:n]
        )  # fmt: skip
        out.keys = self.keys[:n]
        mine = self.own_s < self.start[n]
        out.own_s, out.own_e = self.own_s[mine], self.own_e[mine]
        for names, shape, idx, vals in self.groups:
            k = idx < n
            if k.any():
                out.groups.append((names, shape, idx[k], vals[k]))
        return out


class BlockExtractor:
    """The timer blocks of one file; ``extract`` gives the stream keys of record heads."""

    def __init__(self, extract: Extractors) -> None:
        self.extract = extract
        self.body_res: dict[tuple[bytes, bytes], re.Pattern[bytes]] = {}
        """(launcher prefix, block kind) -> the pattern of such a block's body."""
        self.stream_res: dict[str, re.Pattern[bytes]] = {}
        """Stream key -> a newline and the launcher prefix of a line of that stream."""
        self.prefix_runs: dict[bytes, tuple[str, int]] = {}
        """Prefix runs as ``PREFIXES_RE`` matches them -> (key, length that is prefixes)."""

    # -- streams ------------------------------------------------------------------------------

    def line_key(self, block: bytes, s: int, e: int) -> str:
        """Stream key of the line ``block[s:e]``."""
        m = PREFIXES_RE.match(block, s, e)
        raw = m.group(0) if m else b""
        got = self.prefix_runs.get(raw)
        if got is None:
            k, rest = split_prefix(raw.decode("ascii"))
            got = (k, len(raw) - len(rest))
            if len(self.prefix_runs) < 65536:  # (a time stamp makes each line's its own)
                self.prefix_runs[raw] = got
        c = s + got[1]
        if c < e and (block[c] >= 0x7F or (block[c] < 0x20 and block[c] != 0x09)):
            line = block[s:e].decode("utf-8", "replace")[:MAX_LINE_CHARS].rstrip("\r\n")
            return split_prefix(line.replace("\x00", ""))[0]
        return got[0]

    def stream_re(self, key: str) -> re.Pattern[bytes]:
        """A newline and the outermost prefix (``docker compose``'s or a launcher's, maybe after
        a time stamp) of a line of stream ``key`` (not empty), or of another stream with the
        same first label."""
        pat = self.stream_res.get(key)
        if pat is None:
            label = re.escape(key.split("|")[0].encode())
            forms = (
                rb"\s{0,4}%s:\s",
                rb"\[%s\]:",
                rb"\[\d{1,9},%s\]<std(?:out|err)>:",
                rb"%s +\| ",
            )
            pat = self.stream_res[key] = re.compile(
                rb"\n(?:"
                + TIME_STAMP.encode()
                + rb")?(?:"
                + b"|".join(f % label for f in forms)
                + rb")"
            )
        return pat

    def next_of_stream(self, block: bytes, key: str, q: int, end: int) -> tuple[int, int] | None:
        """The next line at or after ``q`` (a line start) of stream ``key``: (start, end);
        None if none before ``end``."""
        if key:
            pat, p = self.stream_re(key), q - 1
            while (m := pat.search(block, p, end)) is not None:
                s = m.start() + 1
                p = block.find(b"\n", s, end)
                if p < 0:
                    return None
                if self.line_key(block, s, p) == key:
                    return s, p
            return None
        s = q
        while s < end:
            e = line_end(block, s, end)
            if e >= end:
                return None
            if self.line_key(block, s, e) == "":
                return s, e
            s = e + 1
        return None

    # -- the blocks ---------------------------------------------------------------------------

    def timer_blocks(
        self, block: bytes, pos: int, T: int, nl: np.ndarray, its: Any
    ) -> tuple[int, Blocks, bool]:
        """Megatron timer blocks of [pos, T) printed in one piece (the header, then each line of
        the block, its stream's lines one after another), closed by the stream's next line
        before T.  Returns (T, the blocks, whether T moved to a block open at T); T moves to
        the header of the first block not read (the line path reads it).  ``its``: the
        iteration lines of [pos, T) the bulk path reads (``extract.Lines``; such a line closes
        a block of its stream)."""
        # Most blocks are of one stream and kind, printed in one piece: one search reads
        # their bodies (and, when it finds every header, their headers), and an iteration
        # line of the stream right after one closes it.
        first = HEAD_RE.search(block, pos, T)
        if first is None:
            return T, Blocks(), False
        q0, k0 = _kinds(block, pos, np.array([first.start()]))
        h0 = block.rfind(b"\n", pos, first.start()) + 1 or pos
        p0, k0 = block[h0 : int(q0[0])] if len(q0) else b"", k0[0] if k0 else b"times"
        fixed = len(p0) + len(k0) + len(_ACROSS)
        ws, we, (tails, texts) = matches(self._rx(p0, k0, True), block, pos, T)
        lens = np.fromiter(map(len, tails), dtype=np.int64, count=len(tails))
        a = np.frombuffer(block, dtype=np.uint8)
        if len(ws) == block.count(_ACROSS, pos, T) and (a[np.maximum(ws - 1, 0)] == 10).all():
            hs, at, hend, kinds = ws, ws + len(p0), ws + fixed + lens, [k0] * len(ws)
        else:
            at, hend, _nl = matches(HEAD_RE, block, pos, T)
            at, kinds = _kinds(block, pos, at)
            hend = hend[: len(at)]
            hs = self.extract.starts(block, pos, nl, at)
        n = len(at)
        if not n:
            return T, Blocks(), False
        key0 = self.extract.head_key(p0, b"(")
        hit = np.zeros(n, dtype=bool)
        body, end, close = (np.full(n, -3, dtype=np.int64) for _ in range(3))
        if len(ws) and key0 is not None:
            j = np.minimum(np.searchsorted(ws, hs), len(ws) - 1)
            hit = ws[j] == hs
            body, end = (ws + fixed + lens)[j], we[j]
            close = np.full(n, -3, dtype=np.int64)
            if len(its):
                k = np.minimum(np.searchsorted(its.ls, end), len(its) - 1)
                mine = np.array([x == key0 for x in its.keys], dtype=bool)
                by_it = hit & (its.ls[k] == end) & mine[k]
                close[by_it] = end[by_it]
                # Else the stream's next iteration line, when no line of the stream comes
                # before it: its pattern finds none, the line after the block is another's.
                ls = its.ls[mine]
                if key0 and len(ls):
                    k = np.searchsorted(ls, end)
                    nxt = ls[np.minimum(k, len(ls) - 1)].tolist()
                    pat, key_of = self.stream_re(key0), self.line_key
                    tried = failed = 0
                    for i in np.flatnonzero(hit & ~by_it & (k < len(ls))).tolist():
                        e, tried = int(end[i]), tried + 1
                        if pat.search(block, e - 1, nxt[i]) is None and (
                            key_of(block, e, block.find(b"\n", e, T)) != key0
                        ):
                            close[i] = nxt[i]
                        elif (failed := failed + 1) * 2 > tried:
                            break  # (the stream prints other lines between: one by one)
        its_at = dict(zip(its.ls.tolist(), its.keys, strict=True))
        fast = (close >= 0) & (end - hs <= MAX_LINE_CHARS)
        slow: dict[int, tuple[int, int, int, str, bytes, list[tuple[int, int]]]] = {}
        stop, is_open = T, False
        for i in np.flatnonzero(~fast).tolist():
            h, q, kind = int(hs[i]), int(at[i]), kinds[i]
            prefix = block[h:q]
            key = self.extract.head_key(prefix, b"(")
            if key is None:
                stop = h
                break
            c, b, e = int(close[i]), int(body[i]), int(end[i])
            if hit[i] and c < 0:
                c = self._close(block, key, kind, e, T)
            if c == -3 or (c == -2 and prefix):  # (other streams' lines among it)
                m = self._rx(prefix, kind, False).match(block, int(hend[i]), T)
                if m is None:
                    stop, is_open = h, bool(hend[i] >= T)
                    break
                b, e = m.start(), m.end()
                c = e if its_at.get(e) == key else self._close(block, key, kind, e, T)
            if c < 0:
                stop, is_open = h, c == -1
                break
            if e - h > MAX_LINE_CHARS and max(map(len, block[h:e].split(b"\n"))) > MAX_LINE_CHARS:
                stop = h
                break
            spans = self._own_lines(block, key, prefix, b, e)
            if spans is None:
                stop = h
                break
            slow[i] = (b, e, c, key, prefix, spans)
        else:
            i = n
        if not i:
            return stop, Blocks(), is_open
        out = Blocks()
        out.start, out.body, out.end, out.close = hs[:i], body[:i], end[:i], close[:i]
        out.keys = [key0] * i  # type: ignore[list-item]
        own = ~fast[:i]
        out.own_s, out.own_e = out.body[~own], out.end[~own]
        texts = list(map(texts.__getitem__, j[:i].tolist())) if hit.any() else [b""] * i
        prefixes, kinds = [p0] * i, kinds[:i]
        for r, (b, e, c, key, prefix, spans) in slow.items():
            out.body[r], out.end[r], out.close[r] = b, e, c
            out.keys[r], prefixes[r] = key, prefix
            texts[r] = b"".join(block[x:y] for x, y in spans)
        if slow:
            every = [x for s in slow.values() for x in s[5]]
            out.own_s = np.concatenate([out.own_s, [x[0] for x in every]]).astype(np.int64)
            out.own_e = np.concatenate([out.own_e, [x[1] for x in every]]).astype(np.int64)
        ok, out.groups = self._values(texts, kinds, prefixes)
        if ok < i:
            return int(hs[ok]), out.head(ok), False
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
                    + rb"[ \t]*+\r?\n(?:"
                    + o
                    + p
                    + _RANK_LINE
                    + rb"[ \t]*+\r?\n)++)++"
                )
            else:
                line = rb"(?:" + o + p + _PAIR_LINE + rb"[ \t]*+\r?\n)++"
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
        if self.line_key(block, end, ce) == key:
            close = end
        else:
            nxt = self.next_of_stream(block, key, end, T)
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
            elif self.line_key(block, q, e - 1) == key:
                return None
            q = e
        return spans

    @staticmethod
    def _values(
        texts: list[bytes], kinds: list[bytes], prefixes: list[bytes]
    ) -> tuple[int, list[tuple[tuple[str, ...], tuple[int, ...], np.ndarray, np.ndarray]]]:
        """The names and values of the blocks with these bodies, read a form (the body without
        its digits) at a time: how many are read before the first the line path must read (a
        name twice), and their groups (``Blocks.groups``)."""
        # One prefix: kept on each line (the readers skip it), else taken off each line.
        prefix = prefixes[0] if prefixes.count(prefixes[0]) == len(prefixes) else b""
        if not prefix:
            texts = [
                (b"\n" + x).replace(b"\n" + p, b"\n")[1:] if p else x
                for x, p in zip(texts, prefixes, strict=True)
            ]
        forms = b"\x00".join(texts).translate(None, DIGITS).split(b"\x00")
        if kinds.count(kinds[0]) != len(kinds):
            forms = [k + b"\n" + x for k, x in zip(kinds, forms, strict=True)]
        by_form: dict[bytes, list[int]] = {}
        for i, f in enumerate(forms):
            by_form.setdefault(f, []).append(i)
        ok = len(texts)
        got: dict[tuple[Any, ...], list[tuple[list[int], np.ndarray]]] = {}
        for idx in by_form.values():
            rows = _rank_rows if kinds[idx[0]] == b"times" else _pair_rows
            mine = list(map(texts.__getitem__, idx))
            r = rows(mine, prefix)
            if r is not None:
                got.setdefault(r[:2], []).append((idx, r[2]))
                continue
            for i, x in zip(idx, mine, strict=True):  # a digit in a name: block by block
                r = rows([x], prefix)
                if r is None:
                    ok = min(ok, i)
                else:
                    got.setdefault(r[:2], []).append(([i], r[2]))
        out = []
        for (names, shape), parts in got.items():
            idx = np.concatenate([np.asarray(x, dtype=np.int64) for x, _ in parts])
            vals = np.concatenate([v for _, v in parts])
            order = np.argsort(idx, kind="stable")
            idx, vals = idx[order], vals[order]
            k = idx < ok
            if k.any():
                out.append((names, shape, idx[k], vals[k]))
        out.sort(key=lambda g: int(g[2][0]))
        return ok, out


def _kinds(block: bytes, pos: int, q: np.ndarray) -> tuple[np.ndarray, list[bytes]]:
    """Where the kind of each header found at ``q`` starts, and the kind, up to the first
    header of no known kind (the line path reads it)."""
    a = np.frombuffer(block, dtype=np.uint8)
    which = np.full(len(q), len(KINDS))
    for i, k in reversed(list(enumerate(KINDS))):
        ok = q - len(k) >= pos
        for t, c in enumerate(k):
            ok &= a[np.maximum(q - len(k) + t, 0)] == c
        which[ok] = i
    n = int(np.argmax(which == len(KINDS))) if (which == len(KINDS)).any() else len(q)
    kinds = list(map(KINDS.__getitem__, which[:n].tolist()))
    lens = np.array([len(k) for k in KINDS], dtype=np.int64)
    return q[:n] - lens[which[:n]], kinds


def _pair_rows(bodies: list[bytes], prefix: bytes) -> tuple[Any, Any, np.ndarray] | None:
    """(names, shape, values) of bodies of one form of ``name ....: (min, max)`` lines, each
    line after ``prefix`` (a value is the text after its line's last colon), or None when a
    name repeats or, in more than one body, holds a digit (the names may then differ)."""
    first = _PAIR_VALUES.findall(b"\n".join(x[len(prefix) :] for x in bodies[0].split(b"\n")))
    names = tuple(v[0].decode() for v in first)
    shape = tuple(0 if v[3] else 2 for v in first)
    if len(set(names)) != len(names) or (len(bodies) > 1 and any(map(str.isdigit, "".join(names)))):
        return None
    joined = b"".join(bodies)
    a = np.frombuffer(joined, dtype=np.uint8)
    nl = np.flatnonzero(a == 0x0A)
    text = _after_colons(a, np.concatenate([[0], nl[:-1] + 1]), nl)
    if text is None:
        return None
    text = text.translate(_PARENS)
    digits = len(joined) - len(joined.translate(None, DIGITS))
    digits -= (len(prefix) - len(prefix.translate(None, DIGITS))) * len(nl)
    if len(bodies) > 1 and len(text) - len(text.translate(None, DIGITS)) != digits:
        return None
    w = sum(max(k, 1) for k in shape)
    nums = floats_text(text, w * len(bodies))
    return None if nums is None else (names, shape, nums.reshape(len(bodies), w))


def _rank_rows(bodies: list[bytes], prefix: bytes) -> tuple[Any, Any, np.ndarray] | None:
    """(names, shape, values) of ``times across ranks`` bodies of one form (a name line, then a
    line per rank): each name's (min, max) over its ranks.  One form has the same lines, so the
    rank lines of the first body are those of each, and a value is the text after its line's
    colon.  None when not read so for certain (a digit in a name line of several bodies: a
    name may differ)."""
    lines = [x[len(prefix) :] for x in bodies[0].split(b"\n")]  # (the last one empty)
    if lines.pop():
        return None
    is_rank = [_RANK_FULL.fullmatch(x) is not None for x in lines]
    total = sum(is_rank)
    joined = b"".join(bodies)
    a = np.frombuffer(joined, dtype=np.uint8)
    nl = np.flatnonzero(a == 0x0A)
    if not total or is_rank[0] or len(nl) != len(lines) * len(bodies) or nl[-1] != len(a) - 1:
        return None
    starts = np.concatenate([[0], nl[:-1] + 1])
    rank = np.tile(np.array(is_rank, dtype=bool), len(bodies))
    names = spans_text(a, starts[~rank] + len(prefix), nl[~rank])
    if len(bodies) > 1 and len(names.translate(None, DIGITS)) != len(names):
        return None
    text = _after_colons(a, starts[rank], nl[rank])
    got = None if text is None else floats_text(text, total * len(bodies))
    if got is None:
        return None
    vals = got.reshape(len(bodies), total)
    # The columns of each name, in the order printed (a name printed twice: both runs).
    cols: dict[str, list[int]] = {}
    of_name: list[int] = []
    column = 0
    for line, r in zip(lines, is_rank, strict=True):
        if r:
            of_name.append(column)
            column += 1
        else:
            of_name = cols.setdefault(line.strip()[:-1].decode(), [])
    out = np.empty((len(bodies), 2 * len(cols)))
    for j, c in enumerate(cols.values()):
        mine = vals[:, c]
        out[:, 2 * j], out[:, 2 * j + 1] = mine.min(axis=1), mine.max(axis=1)
    for r in np.flatnonzero((vals == 0).any(axis=1)).tolist():
        # (min and max of zeros of both signs as Python's keep them: the first)
        row: list[float] = []
        for c in cols.values():
            lo_v = hi_v = float(vals[r, c[0]])
            for v in vals[r, c[1:]].tolist():
                lo_v, hi_v = min(lo_v, v), max(hi_v, v)
            row += [lo_v, hi_v]
        out[r] = row
    return tuple(cols), (2,) * len(cols), out


_PARENS = bytes.maketrans(b"(),", b"   ")
_RANK_FULL = re.compile(_RANK_LINE + rb"[ \t]*\r?")
"""A rank line of a ``times across ranks`` body, without its newline."""


def _after_colons(a: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> bytes | None:
    """The bytes after the last colon of each line [starts, ends) of ``a``, each followed by
    the byte at its end (lines in order); None when a line holds no colon."""
    colons = np.flatnonzero(a == 0x3A)
    at = np.searchsorted(colons, ends) - 1
    if not len(colons) or (at < 0).any() or (colons[at] < starts).any():
        return None
    return spans_text(a, colons[at] + 1, ends)


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
