"""The file reader of ``analysis.parse``: feeds a log to the line state machine (``_Core``),
handling the frequent line kinds of a training phase in bulk.

Two paths, one result:

- the line path: every line that can matter goes through ``_Core.feed``.  Until training starts,
  after it ends and while a multi-line block is open, that is every line; during training it is
  the lines holding a keyword (found with ``bytes.find`` over whole chunks, anchored on a rare
  byte of each keyword), and the lines of a stream whose Megatron timer block is open.
- the bulk path (``_Bulk``), during training while no block is open: over a segment of the
  chunk, regular expressions find the frequent lines (DeepSpeed ``[Rank N] time (ms) | k: v``
  lines, Megatron iteration lines, ``memory (MB) |`` reports, Megatron timer blocks with the
  lines of their stream), their values are converted column-wise, and they are added to the
  run's typed columns in one step.  Every other line of the segment is scanned for keywords;
  the first one that holds one ends the segment there and goes to the line path, as does
  anything the bulk path does not recognise in its exact form (a glued, wrapped, non-ASCII or
  otherwise unusual line, a counter going back, the final iteration).  The form of each new
  kind of line ("shape": the line with its digits removed) is checked once against the line
  path itself before the bulk path takes lines of that shape.

``tests/test_parse_engine.py`` checks that both paths give the same runs.
"""

from __future__ import annotations

import math
import re
import warnings
from array import array
from dataclasses import dataclass
from itertools import repeat
from operator import itemgetter, methodcaller
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from analysis._lines import MAX_LINE_CHARS, split_prefix

if TYPE_CHECKING:  # pragma: no cover
    from analysis.parse_machine import _Core

CHUNK_BYTES = 8 << 20
"""Bytes read at a time (whole lines are handed on; the rest waits for the next read)."""
SEG_START, SEG_MIN, SEG_MAX = 1 << 18, 1 << 14, 4 << 20
"""Bytes the bulk path looks at in one step: it grows while no line needs the line path and
shrinks when one soon does."""
SPARSE_RECORDS, SPARSE_BYTES = 1000, 8 << 20
"""A bulk step of at least SEG_START bytes that took fewer records per MB than this hands the
next SPARSE_BYTES to the line path (whose keyword jumps are cheaper over chatter)."""

_DIGITS = b"0123456789"


# -- keywords: the line path's scan --------------------------------------------------------

# Bytes that are rare in log text, rarest first: a keyword is found by its first byte in this
# list (one memchr-speed pass per byte), then checked at that position.  A keyword with none
# of them is searched for whole.
_RARE = "|#*KM)TE"


def build_anchors(
    keywords: tuple[str, ...],
) -> tuple[tuple[bytes, tuple[tuple[bytes, int], ...]], ...]:
    """(anchor, ((keyword, offset of the anchor in it), ...)) for every keyword."""
    by_anchor: dict[bytes, list[tuple[bytes, int]]] = {}
    whole: list[bytes] = []
    for kw in keywords:
        anchor = next((c for c in _RARE if c in kw), None)
        if anchor is None:
            whole.append(kw.encode())
        else:
            by_anchor.setdefault(anchor.encode(), []).append((kw.encode(), kw.index(anchor)))
    out = [(a, tuple(checks)) for a, checks in by_anchor.items()]
    # Keywords searched whole that share a part are found by one search of it ("exits" and
    # "ssh exited" by "xit"): each multi-byte pass over a chunk costs ~1 ms/MB.
    shared: dict[bytes, list[bytes]] = {}
    for kw in whole:
        part = b"xit" if b"xit" in kw else kw
        shared.setdefault(part, []).append(kw)
    for part, kws in shared.items():
        if kws == [part]:
            out.append((part, ()))
        else:
            out.append((part, tuple((kw, kw.index(part)) for kw in kws)))
    return tuple(out)


def _next_hit(
    block: bytes, anchor: bytes, checks: tuple[tuple[bytes, int], ...], pos: int, end: int
) -> int:
    """Position of the next keyword hit of one anchor in [pos, end), or -1."""
    find = block.find
    p = find(anchor, pos, end)
    if not checks or (len(checks) == 1 and checks[0][1] == 0 and checks[0][0] == anchor):
        return p
    startswith = block.startswith
    while p >= 0:
        for kw, off in checks:
            if p >= off and startswith(kw, p - off):
                return p
        p = find(anchor, p + 1, end)
    return -1


class Keywords:
    """The keyword scan: the first line holding a keyword in a range of a chunk."""

    def __init__(self, keywords: tuple[str, ...], iteration_keyword: str = "iteration") -> None:
        self.keywords = keywords
        self.pipe_keywords = tuple(k for k in keywords if k != iteration_keyword)
        self.anchors = build_anchors(keywords)
        self.pipe_anchors = build_anchors(self.pipe_keywords)
        self._cache: list[Any] = [None, -1, None, [], 0]

    def has(self, line: str, pipe_iterations: bool) -> bool:
        """Whether a line holds a keyword."""
        return any(k in line for k in (self.pipe_keywords if pipe_iterations else self.keywords))

    def first(
        self, block: bytes, pos: int, end: int, pipe_iterations: bool, once: bool = False
    ) -> int:
        """Position of the first keyword in ``block[pos:end]``, or -1.  The next hit of each
        anchor is remembered for the same buffer, so that successive calls over one chunk
        search each byte about once (``once``: a buffer searched only once, not remembered)."""
        anchors = self.pipe_anchors if pipe_iterations else self.anchors
        if once:
            best = -1
            for anchor, checks in anchors:
                p = _next_hit(block, anchor, checks, pos, end if best < 0 else best)
                if p >= 0 and (best < 0 or p < best):
                    best = p
            return best
        cache = self._cache
        if cache[0] is not block or cache[1] != end or cache[2] is not anchors:
            cache = self._cache = [block, end, anchors, [-2] * len(anchors), pos]
        elif pos < cache[4]:  # going back: forget
            cache[3] = [-2] * len(anchors)
        cache[4] = pos
        nxt = cache[3]
        best = -1
        for i, (anchor, checks) in enumerate(anchors):
            p = nxt[i]
            if p < pos and p != -1:
                p = nxt[i] = _next_hit(block, anchor, checks, pos, end)
            if p >= 0 and (best < 0 or p < best):
                best = p
        return best


# -- the line path ---------------------------------------------------------------------------


def _line_end(block: bytes, s: int, end: int) -> int:
    e = block.find(b"\n", s, end)
    return end if e < 0 else e


def line_step(
    core: _Core, kw: Keywords, block: bytes, pos: int, end: int, lineno: int
) -> tuple[int, int]:
    """Feed the next line of ``block[pos:end]`` that can matter (``_Core.active``, keywords,
    streams with an open timer block); skip the lines before it.  Returns (pos, lineno) after
    the fed line, or (end, lineno at end) when none is left."""
    if core.active:
        e = _line_end(block, pos, end)
        core.feed(lineno, block[pos:e].decode("utf-8", "replace"))
        return e + 1, lineno + 1
    if core.timer_keys:  # lines of those streams continue or close the block: each line
        e = _line_end(block, pos, end)
        line = block[pos:e].decode("utf-8", "replace")
        if kw.has(line, core.run.pipe_iterations):
            core.feed(lineno, line)
        elif core.stream_key(line) in core.timer_keys:
            core.feed(lineno, line, dispatch=False)
        return e + 1, lineno + 1
    hit = kw.first(block, pos, end, core.run.pipe_iterations)
    if hit < 0:
        return end, lineno + block.count(b"\n", pos, end)
    s = block.rfind(b"\n", pos, hit) + 1 or pos
    lineno += block.count(b"\n", pos, s)
    e = _line_end(block, s, end)
    core.feed(lineno, block[s:e].decode("utf-8", "replace"))
    return e + 1, lineno + 1


def drive_block(
    core: _Core, kw: Keywords, bulk: _Bulk | None, block: bytes, lineno: int, end: int = -1
) -> int:
    """Feed the whole lines of ``block``; return the line number after it.  Where the last
    bulk step found few records (a log of mostly NCCL chatter), the line path, which jumps
    from keyword to keyword, reads the next ``SPARSE_BYTES``.  ``end``: where the whole
    lines end (default: the end of ``block``)."""
    end = len(block) if end < 0 else end
    pos = 0
    while pos < end:
        if bulk is not None and not core.active and not core.timer_keys and bulk.line_budget <= 0:
            pos, lineno, _rare = bulk.advance(block, pos, end, lineno)
            if pos >= end:
                break
        start = pos
        pos, lineno = line_step(core, kw, block, pos, end, lineno)
        if bulk is None:
            continue
        # Keyword lines of a sparse stretch: feed them here until the budget is spent.
        budget = bulk.line_budget - (pos - start)
        while budget > 0 and pos < end and not core.active and not core.timer_keys:
            start = pos
            pos, lineno = line_step(core, kw, block, pos, end, lineno)
            budget -= pos - start
        bulk.line_budget = budget
    return lineno


def drive_file(core: _Core, kw: Keywords, fh: BinaryIO, bulk: bool = True) -> None:
    """Feed a whole file, ``CHUNK_BYTES`` at a time; an over-long line's tail is skipped."""
    fast = _Bulk(core, kw) if bulk else None
    lineno = 1
    carry = b""
    skipping = False  # inside the tail of an over-long line
    while True:
        data = fh.read(CHUNK_BYTES)
        if not data:
            break
        if skipping:
            nl = data.find(b"\n")
            if nl < 0:
                continue
            core.feed(lineno, carry.decode("utf-8", "replace"))  # counted as truncated there
            lineno += 1
            carry, skipping = b"", False
            data = data[nl + 1 :]
        buf = carry + data if carry else data
        cut = buf.rfind(b"\n")
        if cut < 0:
            carry = buf
            if len(carry) > MAX_LINE_CHARS * 4:
                carry, skipping = carry[: MAX_LINE_CHARS * 4], True
            continue
        lineno = drive_block(core, kw, fast, buf, lineno, cut + 1)
        carry = buf[cut + 1 :]
    if carry:
        core.feed(lineno, carry.decode("utf-8", "replace"))


# -- the bulk path ---------------------------------------------------------------------------

_DS_RE = re.compile(rb"\[Rank (\d+)\] time \(ms\) \|([^\n]*)\n")
_MEM_RE = re.compile(rb"memory \(MB\) \|([^\n]*)\n")
_MEM_HEAD_RE = re.compile(rb"(?:\[Rank (\d+)\] )?(?:\(after (\d+) iterations\) )?\Z")
_IT_RE = re.compile(rb"iteration +(\d+)/ *(\d+) *\|")
# The line path's own patterns, on bytes (the same on printable ASCII, which is all the bulk
# path takes).
_HEAD_RE = re.compile(rb"across ranks \(ms\):")
_HEADS = {
    b"(min, max) time across ranks (ms):": "(min, max) time",
    b"max time across ranks (ms):": "max time",
    b"times across ranks (ms):": "times",
}
_NAME_RE = re.compile(rb"[A-Za-z_]+\Z")
# Launcher prefixes at the start of a line, as ``_lines.split_prefix`` reads them (which then
# says how many of them really are prefixes).
_PREFIXES_RE = re.compile(
    rb"(?:\s{0,4}\d{1,5}:\s|\[(?:default\d+|rank\d+)\]:\s?|[A-Za-z0-9][A-Za-z0-9_.-]{0,62}:\s){0,4}"
)
_MEM_FIELDS = {
    b"allocated": "allocated_mb",
    b"max allocated": "max_allocated_mb",
    b"reserved": "reserved_mb",
    b"max reserved": "max_reserved_mb",
}
_MISSING = object()


def _pairs(body: bytes) -> tuple[list[bytes], list[bytes]] | None:
    """Names (stripped) and value tokens of ``name: value | ...``, every piece one colon."""
    names, values = [], []
    for piece in body.split(b"|"):
        if piece.count(b":") != 1:
            return None
        k, _, v = piece.partition(b":")
        names.append(k.strip())
        values.append(v)
    return names, values


def _finite(token: bytes) -> float | None:
    try:
        x = float(token)
    except ValueError:
        return None
    return x if math.isfinite(x) else None


def _group_values(
    names: tuple[str, ...], shape: tuple[int, ...], flat: list[float]
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    j = 0
    for name, k in zip(names, shape, strict=True):
        out[name] = tuple(flat[j : j + k]) if k else flat[j]
        j += max(k, 1)
    return out


_PRINTABLE = bytes(range(0x20, 0x7F)) + b"\t"


def _printable(line: bytes) -> bool:
    """Printable ASCII (and tabs), a trailing carriage return allowed."""
    return not line.translate(None, _PRINTABLE) or not line.rstrip(b"\r").translate(
        None, _PRINTABLE
    )


_WORD = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
_GLUE_AT_RE = re.compile(rb"iteration\s+\d+\s*/\s*\d+")


def _other_glue(text: bytes, rel: int) -> bool:
    """Whether the line path's ``_GLUE_RE`` matches ``text`` anywhere but at ``rel``."""
    j = text.find(b"iteration")
    while j >= 0:
        if j != rel and (j == 0 or text[j - 1] not in _WORD) and _GLUE_AT_RE.match(text, j):
            return True
        j = text.find(b"iteration", j + 9)
    return False


def _ds_values(bodies: list[bytes], k: int) -> np.ndarray | None:
    """Values of DeepSpeed line bodies of one known shape (k names), as a (lines x k) array;
    None when one does not convert."""
    parts = b"|".join(bodies).replace(b":", b"|").split(b"|")
    if len(parts) != 2 * k * len(bodies):
        return None
    names = b"".join(parts[0::2])
    if len(names.translate(None, _DIGITS)) != len(names):
        return None
    try:
        vals = np.array(list(map(float, parts[1::2])), dtype=float)
    except ValueError:
        return None
    if not np.isfinite(vals).all():
        return None
    return vals.reshape(len(bodies), k)


# A DeepSpeed ``name: value`` piece whose value is a plain decimal with spaces around it:
# deleting the names, colons and bars leaves the values, space separated, for np.fromstring
# (which reads them exactly as float() does); a digit in a name would be a value too many.
_FAST_PIECE_RE = re.compile(rb" [A-Za-z_]+: +-?[0-9]+(?:\.[0-9]+)? *\Z")
_NOT_VALUES = bytes(c for c in range(256) if chr(c).isalpha() and c < 128) + b"_:|"


def _ds_values_fast(bodies: list[bytes], k: int) -> np.ndarray | None:
    """``_ds_values`` for shapes of plain decimals (``_FAST_PIECE_RE``), in two C passes."""
    text = b" | ".join(bodies).translate(None, _NOT_VALUES)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            vals = np.fromstring(text, dtype=float, sep=" ")
        except (ValueError, DeprecationWarning):
            return None
    if len(vals) != k * len(bodies) or not np.isfinite(vals).all():
        return None
    return vals.reshape(len(bodies), k)


class _DSLines:
    """DeepSpeed lines of a segment: starts, ends, ranks, which are taken, values by group."""

    def __init__(self, n: int) -> None:
        self.ls = np.zeros(n, dtype=np.int64)
        self.le = np.zeros(n, dtype=np.int64)
        self.rank = np.zeros(n, dtype=np.int64)
        self.keep = np.zeros(n, dtype=bool)
        self.keys: list[str | None] = []
        """Stream key of each line (None: not only launcher prefixes)."""
        self.groups: list[tuple[tuple[str, ...], np.ndarray, np.ndarray]] = []


_VALUE = rb"( *[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)? *)"


@dataclass
class _IterPattern:
    """A Megatron iteration line shape as a pattern (``_Bulk._learn_iteration``)."""

    rx: re.Pattern[bytes]
    """From ``iteration`` to the end of the line; groups: spaces, number, spaces, total,
    spaces, one value per piece, trailing spaces."""
    fields: list[tuple[int, str, str, float]]
    """(piece, Iteration field, "int" | "float", factor) as ``_Bulk._it_shape`` found."""
    const: int
    """Bytes of a match outside its groups."""


_BULK_KEYWORDS = ("|", "(ms)", "(s)", "iteration")
"""The keywords lines read in bulk can hold."""
_OPEN = object()
"""A timer block that does not close in the bytes looked at."""
_LONG = object()
"""A timer block with an over-long line (the line path truncates it, and counts it)."""
_NUMBER = rb"([-\d.eE+]+)"


def _pattern(raw: bytes, spans: list[tuple[int, int]], offset: int) -> bytes:
    """A line as a pattern: its text, with the numbers at ``spans`` (of its content, which
    starts at ``offset``) as groups."""
    out, q = [], 0
    for a, b in spans:
        out += [re.escape(raw[q : offset + a]), _NUMBER]
        q = offset + b
    out.append(re.escape(raw[q:]))
    return b"".join(out)


class _BlockPattern:
    """A Megatron timer block as printed in one piece: the header line and each timer line
    of its stream, with the numbers as groups.  ``read`` checks the line after it too."""

    def __init__(
        self, rx: re.Pattern[bytes], kind: str, recipe: list[tuple[str, str | None]], key: str
    ) -> None:
        self.rx = rx
        self.kind = kind
        self.recipe = recipe
        self.key = key

    def read(self, bulk: _Bulk, block: bytes, ls: int, T: int) -> Any:
        m = self.rx.match(block, ls, T)
        if m is None:
            return None
        nums = [_finite(g) for g in m.groups()]
        if None in nums:
            return None
        values: dict[str, Any] = {}
        j = 0
        for how, name in self.recipe:
            if how == "pair":
                values[name] = (nums[j], nums[j + 1])  # type: ignore[index]
                j += 2
            elif how == "one":
                values[name] = nums[j]  # type: ignore[index]
                j += 1
            elif how == "rank":
                v = nums[j]
                lo, hi = values.get(name, (v, v))  # type: ignore[arg-type]
                values[name] = (min(lo, v), max(hi, v))  # type: ignore[type-var]
                j += 1
        # The lines of the block, then the line that closes it.
        mine = []
        q = block.find(b"\n", ls) + 1
        while q < m.end():
            nl = block.find(b"\n", q)
            mine.append((q, nl + 1))
            q = nl + 1
        name = next((n for how, n in reversed(self.recipe) if how == "name"), None)
        while q < T:
            le = _line_end(block, q, T)
            if le >= T:
                return _OPEN
            if le - q > MAX_LINE_CHARS:
                return _LONG
            k2, cs = bulk._line_key(block, q, le)
            s = q
            if k2 != self.key:
                nxt = bulk._next_of_stream(block, self.key, le + 1, T)
                if nxt is None:
                    return _OPEN
                s, le, cs = nxt
                if le - s > MAX_LINE_CHARS:
                    return _LONG
            probe = dict(values)
            if bulk._body_step(block, s, le, cs, self.kind, name, probe) is not None:
                return None  # the block goes on: read it line by line
            return s, values, mine, self.key
        return _OPEN


class _Bulk:
    """The bulk path over one file (module doc)."""

    def __init__(self, core: _Core, kw: Keywords) -> None:
        self.core = core
        self.kw = kw
        self.ranks: dict[bytes, int] = {}
        self.rare = Keywords(tuple(k for k in kw.keywords if k not in _BULK_KEYWORDS))
        self.seg = SEG_START
        self.line_budget = 0  # bytes the line path reads before the bulk path tries again
        self.sparse = 0  # bulk steps in a row that found few records
        self.taken = 0  # records the last bulk step took
        self.open_at_limit = False  # the last look ended in an open timer block
        # Launcher prefixes as printed -> stream key, or None when not only prefixes.  The
        # contents they are checked with ("[Rank", a timer header) are never read as one.
        self.prefixes: dict[bytes, str | None] = {}
        # Shapes (a line with its digits removed) -> names, or None: not taken in bulk.
        self.ds_shapes: dict[bytes, tuple[str, ...] | None] = {}
        self.ds_fast: set[bytes] = set()  # shapes whose values _ds_values_fast reads
        self.mem_shapes: dict[bytes, tuple[str, ...] | None] = {}
        # -> [(piece, Iteration field, "int" | "float", factor)], or None.
        self.it_shapes: dict[bytes, list[tuple[int, str, str, float]] | None] = {}
        self.it_tmpls: list[_IterPattern] = []
        self.it_heads: dict[bytes, bool] = {}  # text before "iteration" -> takeable
        self.stream_res: dict[str, re.Pattern[bytes]] = {}
        # Prefix runs as matched by _PREFIXES_RE -> (key, length that really is prefixes).
        self.prefix_runs: dict[bytes, tuple[str, int]] = {}
        self.timer_res: tuple[re.Pattern[bytes], ...] | None = None
        self.str_timer_res: tuple[Any, ...] = ()
        self.body_res: dict[bytes, re.Pattern[bytes]] = {}
        # A timer block's header line as printed -> patterns of whole blocks seen after it.
        self.block_tmpls: dict[bytes, list[_BlockPattern]] = {}

    # -- checks against the line path -------------------------------------------------------

    def _key(self, raw: bytes, content: bytes) -> str | None:
        key = self.prefixes.get(raw, _MISSING)
        if key is _MISSING:
            key = None
            if b"\x1b" not in raw and b"\x00" not in raw:
                text = (raw + content).decode("utf-8", "replace")
                k, rest = split_prefix(text)
                if rest == content.decode("utf-8", "replace"):
                    key = k
            self.prefixes[raw] = key
        return key  # type: ignore[return-value]

    def _probe(self, line: str) -> _Core:
        """A fresh state machine in its training phase that has read ``line``."""
        from analysis.parse_machine import _Core

        core = _Core(self.core.source)
        core.run.training = True
        core.feed(1, line)
        return core

    def _ds_shape(self, shape: bytes, body: bytes, rank: int) -> tuple[str, ...] | None:
        """Names of a new DeepSpeed line shape, when the line path reads it the same way."""
        result = None
        pairs = _pairs(body)
        if pairs is not None and len(self.ds_shapes) < 4096:
            names, tokens = pairs
            vals = [_finite(t) for t in tokens]
            if (
                all(_NAME_RE.match(n) for n in names)
                and len(set(names)) == len(names)
                and None not in vals
                and not any(w in body for w in (b"iteration", b"steps", b"iter", b"outcome"))
                and _printable(body)
            ):
                want = dict(zip((n.decode() for n in names), vals, strict=True))
                core = self._probe(f"[Rank {rank}] time (ms) |" + body.decode())
                blocks = list(core.run.ds_blocks.table)
                if len(blocks) == 1 and not core.run.problems and not core.run.iterations:
                    b = blocks[0]
                    if b.values_ms == want and b.rank == rank and b.line == 1:
                        result = tuple(want)
                        if all(_FAST_PIECE_RE.match(p) for p in body.split(b"|")):
                            self.ds_fast.add(shape)
        self.ds_shapes[shape] = result
        return result

    def _mem_shape(self, shape: bytes, text: bytes) -> tuple[str, ...] | None:
        """Names of a new memory report shape, when the line path reads it the same way."""
        result = None
        head, _, body = text.partition(b"memory (MB) |")
        m = _MEM_HEAD_RE.match(head)
        pairs = _pairs(body)
        if m is not None and pairs is not None and len(self.mem_shapes) < 4096:
            names, tokens = pairs
            vals = [_finite(t) for t in tokens]
            if all(n in _MEM_FIELDS for n in names) and len(set(names)) == len(names):
                core = self._probe(text.decode())
                mem = list(core.run.memory)
                want = {_MEM_FIELDS[n]: v for n, v in zip(names, vals, strict=True)}
                if (
                    None not in vals
                    and len(mem) == 1
                    and not core.run.problems
                    and not core.run.iterations
                    and mem[0].rank == (int(m.group(1)) if m.group(1) else None)
                    and mem[0].after_iteration == (int(m.group(2)) if m.group(2) else None)
                    and mem[0].kind == "megatron"
                    and all(getattr(mem[0], f) == want.get(f) for f in _MEM_FIELDS.values())
                ):
                    result = tuple(n.decode() for n in names)
        self.mem_shapes[shape] = result
        return result

    def _it_shape(
        self, shape: bytes, text: bytes, rest: bytes
    ) -> list[tuple[int, str, str, float]] | None:
        """Which piece of a new iteration line shape feeds which Iteration field, found by
        giving each piece its own value and reading the line path's record."""
        result = None
        pieces = rest.split(b"|")
        middle = pieces[1:-1]
        if (
            len(self.it_shapes) < 4096
            and pieces[0] == b""
            and pieces[-1].strip() == b""
            and all(p.count(b":") == 1 for p in middle)
        ):
            names = [p.partition(b":")[0] for p in middle]
            toks = [p.partition(b":")[2] for p in middle]
            if not any(d in n for n in names for d in _DIGITS) and all(
                _finite(t) is not None for t in toks
            ):
                head = text[: len(text) - len(rest)].decode()
                probe = [1000 + 7 * i for i in range(len(names))]
                line = (
                    head
                    + "|"
                    + "|".join(f"{n.decode()}: {v}" for n, v in zip(names, probe, strict=True))
                    + "|"
                )
                core = self._probe(line)
                real = self._probe(text.decode())
                fields = self._mapping(core, probe)
                if fields is not None and len(real.run.iterations) == 1 and not real.run.problems:
                    cols = self._iter_values(fields, [rest])
                    it = real.run.iterations[0]
                    mapped = {f for _i, f, _k, _x in fields}
                    same = cols is not None and all(
                        getattr(it, f) == (int(c[0]) if kind == "int" else float(c[0]))
                        and type(getattr(it, f)) is (int if kind == "int" else float)
                        for (_i, f, kind, _x), c in zip(fields, cols, strict=True)
                    )
                    others = all(
                        getattr(it, f) is None
                        for f in type(it).__dataclass_fields__
                        if f not in mapped
                        and f not in ("iteration", "train_iters", "line", "source")
                    )
                    m = _IT_RE.search(text)
                    if (
                        same
                        and others
                        and m
                        and (it.iteration, it.train_iters) == (int(m.group(1)), int(m.group(2)))
                    ):
                        result = fields
                        self._learn_iteration(text[m.start() :], rest, fields)
        self.it_shapes[shape] = result
        return result

    def _learn_iteration(
        self, text: bytes, rest: bytes, fields: list[tuple[int, str, str, float]]
    ) -> None:
        """Keep a pattern of an iteration line shape the line path reads as ``fields``: the
        keys as printed, the numbers as groups (``re.split`` then reads all such lines)."""
        if len(self.it_tmpls) >= 4 or any(t.rx.match(text + b"\n") for t in self.it_tmpls):
            return
        pat = rb"iteration( +)(\d+)/( *)(\d+)( *)\|"
        for piece in rest.split(b"|")[1:-1]:
            pat += re.escape(piece.partition(b":")[0] + b":") + _VALUE + rb"\|"
        rx = re.compile(pat + rb"([ \t]*\r?)\n")
        m = rx.match(text + b"\n")
        if m is None:  # a value not in plain decimals: such lines are read one by one
            return
        const = m.end() - sum(len(g) for g in m.groups())
        self.it_tmpls.append(_IterPattern(rx, fields, const))

    @staticmethod
    def _mapping(core: _Core, probe: list[int]) -> list[tuple[int, str, str, float]] | None:
        its = list(core.run.iterations)
        if len(its) != 1 or core.run.problems:
            return None
        it = its[0]
        fields = []
        for f in type(it).__dataclass_fields__:
            v = getattr(it, f)
            if f in ("iteration", "train_iters", "line", "source") or v is None:
                continue
            hit = None
            for i, base in enumerate(probe):
                if v == base and type(v) in (int, float):
                    hit = (i + 1, f, "int" if type(v) is int else "float", 1.0)
                elif type(v) is float and v == base * 1000.0:
                    hit = (i + 1, f, "float", 1000.0)
            if hit is None:
                return None
            fields.append(hit)
        return fields

    @staticmethod
    def _iter_values(
        fields: list[tuple[int, str, str, float]], rests: list[bytes]
    ) -> list[np.ndarray] | None:
        """Column values of iteration lines of one shape, or None if one does not convert."""
        flat = b"|".join(rests).split(b"|")
        width = len(flat) // len(rests)
        if width * len(rests) != len(flat):
            return None
        cols = []
        value = itemgetter(2)
        colon = methodcaller("partition", b":")
        for i, _f, kind, factor in fields:
            try:
                vals = np.array(
                    list(map(float, map(value, map(colon, flat[i::width])))), dtype=float
                )
            except ValueError:
                return None
            if not np.isfinite(vals).all():
                return None
            if kind == "int":
                if (vals != np.floor(vals)).any() or np.abs(vals).max(initial=0) >= 2**53:
                    return None
            elif factor != 1.0:
                vals = vals * factor
            cols.append(vals)
        return cols

    # -- streams ----------------------------------------------------------------------------

    def _line_key(self, block: bytes, s: int, e: int) -> tuple[str, int]:
        """Stream key of the line ``block[s:e]`` and where its content starts (-1 when the
        content does not start with plain ASCII: then only the key is known)."""
        m = _PREFIXES_RE.match(block, s, e)
        raw = m.group(0) if m else b""
        got = self.prefix_runs.get(raw)
        if got is None:
            k, rest = split_prefix(raw.decode("ascii"))
            got = self.prefix_runs[raw] = (k, len(raw) - len(rest))
        c = s + got[1]
        if c < e and (block[c] >= 0x7F or (block[c] < 0x20 and block[c] != 0x09)):
            line = block[s:e].decode("utf-8", "replace")[:MAX_LINE_CHARS].rstrip("\r\n")
            return split_prefix(line.replace("\x00", ""))[0], -1
        return got[0], c

    def _body_re(self, raw: bytes) -> re.Pattern[bytes]:
        """A Megatron timer line of a stream printed with the launcher prefixes ``raw``: the
        line path's ``_TIMER_LINE_RE`` on the content, in one match from the line start."""
        pat = self.body_res.get(raw)
        if pat is None:
            from analysis.parse_rules import _TIMER_LINE_RE

            inner = _TIMER_LINE_RE.pattern.removeprefix("^").removesuffix("$").encode()
            pat = self.body_res[raw] = re.compile(re.escape(raw) + b"(?:" + inner + rb")\n")
        return pat

    def _next_of_stream(
        self, block: bytes, key: str, q: int, end: int
    ) -> tuple[int, int, int] | None:
        """The next line at or after ``q`` (a line start) of stream ``key``: (start, end,
        start of its content, or -1 when not plain ASCII); None if none before ``end``."""
        if key:
            pat = self.stream_res.get(key)
            if pat is None:
                label = re.escape(key.split("|")[0].encode())
                pat = self.stream_res[key] = re.compile(
                    rb"\n(?:\s{0,4}" + label + rb":\s|\[" + label + rb"\]:)"
                )
            p = q - 1
            while True:
                m = pat.search(block, p, end)
                if m is None:
                    return None
                s = m.start() + 1
                e = _line_end(block, s, end)
                if e >= end:
                    return None
                k, c = self._line_key(block, s, e)
                if k == key:
                    return s, e, c
                p = e
        s = q
        while s < end:
            e = _line_end(block, s, end)
            if e >= end:
                return None
            k, c = self._line_key(block, s, e)
            if k == "":
                return s, e, c
            s = e + 1
        return None

    # -- one segment ------------------------------------------------------------------------

    def advance(self, block: bytes, pos: int, end: int, lineno: int) -> tuple[int, int, bool]:
        """Take the lines from ``pos`` (a line start) in bulk up to the first one the line
        path must read.  Returns (position, line number there, whether the line there must be
        read by the line path)."""
        seg_end = min(end, pos + self.seg)
        if seg_end < end:
            nl = block.find(b"\n", seg_end - 1, end)
            seg_end = end if nl < 0 else nl + 1
        hard = min(end, pos + 4 * self.seg)  # how far a timer block may make it grow
        if hard < end:
            nl = block.find(b"\n", hard - 1, end)
            hard = end if nl < 0 else nl + 1
        for bad in (b"\x00", b"\x1b"):  # the line path rewrites such lines: it reads them
            p = block.find(bad, pos, hard)
            if p >= 0:
                hard = block.rfind(b"\n", pos, p) + 1 or pos
        # A keyword no line read in bulk holds (an error, a launcher exit, DeepSpeed's memory
        # line): the line path reads that line, so the bulk step ends there.
        p = self.rare.first(block, pos, hard, self.core.run.pipe_iterations)
        if 0 <= p < hard:
            hard = block.rfind(b"\n", pos, p) + 1 or pos
        limit = min(seg_end, hard)
        self.taken = 0
        T: int | None = pos
        while limit > pos:
            T = self._segment(block, pos, limit, lineno, can_grow=limit < hard)
            if T is not None:
                break
            # A timer block open at the limit: look at twice as much.
            grown = min(hard, pos + 2 * (limit - pos))
            nl = block.find(b"\n", grown - 1, hard)
            limit = hard if nl < 0 else nl + 1
            seg_end = max(seg_end, limit)
        assert T is not None
        if T - pos >= SEG_START and self.taken * 1e6 < SPARSE_RECORDS * (T - pos):
            # Sparse again and again: look less and less often (up to 8 x SPARSE_BYTES).
            self.line_budget = SPARSE_BYTES << min(self.sparse, 3)
            self.sparse += 1
            self.seg = SEG_START // 8  # the next look is a small one again
        elif T - pos >= SEG_START:
            self.sparse = 0
        if pos >= T:
            self.seg = max(SEG_MIN, self.seg // 2)
            return pos, lineno, True
        self.seg = min(SEG_MAX, self.seg * 2) if seg_end <= T else max(SEG_MIN, self.seg // 2)
        return T, self.lineno_at, seg_end > T

    def _segment(
        self, block: bytes, pos: int, limit: int, lineno: int, can_grow: bool = False
    ) -> int | None:
        """Read [pos, limit) in bulk up to the first line for the line path; add what was read
        to the run; return where it stopped (``self.lineno_at``: the line number there)."""
        run = self.core.run
        T = limit
        ds = self._ds_lines(block, pos, T)
        mem = self._mem_lines(block, pos, T)
        its = self._iteration_lines(block, pos, T)
        self.open_at_limit = False
        T, blocks, headers, bodies = self._timer_blocks(block, pos, T)
        if self.open_at_limit and can_grow:
            return None  # look at more bytes (nothing was added)
        if bodies:  # lines a timer block took are not read as anything else
            taken = {s for s, _e in bodies}
            ds.keep &= np.array([ls not in taken for ls in ds.ls.tolist()], dtype=bool)
            mem = [x for x in mem if x[0] not in taken]
            its = [x for x in its if x[0] not in taken]

        # The first line the line path must read: one holding a keyword among the others.
        k = ds.keep
        others = [(x[0], x[1]) for x in mem] + [(x[0], x[1]) for x in its] + headers + bodies
        span_s = np.concatenate([ds.ls[k], np.array([x[0] for x in others], dtype=np.int64)])
        span_e = np.concatenate([ds.le[k], np.array([x[1] for x in others], dtype=np.int64)])
        R = self._first_keyword(block, pos, T, span_s, span_e)
        if R is not None:
            T = min(T, R)

        # Iteration numbers must go up; a repeat changes nothing; the final iteration, or a
        # counter going back, is for the line path.
        new_its = []
        top = run.max_iter
        repeated = False
        for x in its:
            if x[0] >= T:
                break
            number, total = x[2], x[3]
            if top < number < total:
                new_its.append(x)
                top = number
            elif number == top and top >= 0:
                repeated = True
            else:
                T = x[0]
                break
        # Timer blocks must close before T.
        changed = True
        while changed:
            changed = False
            for b in blocks:
                if b[0] < T < b[1]:
                    T, changed = b[0], True
        if pos >= T:
            return pos
        new_its = [x for x in new_its if x[0] < T]
        blocks = [b for b in blocks if b[0] < T]
        mem = [x for x in mem if x[0] < T]
        ds.keep &= ds.ls < T

        self.taken = len(new_its) + int(ds.keep.sum()) + len(mem) + len(blocks)
        nl = (
            np.flatnonzero(np.frombuffer(block, dtype=np.uint8, count=T - pos, offset=pos) == 10)
            + pos
        )

        def lines_at(starts: Any) -> np.ndarray:
            return lineno + np.searchsorted(nl, np.asarray(starts, dtype=np.int64))

        it_pos = np.array([x[0] for x in new_its], dtype=np.int64)
        it_num = np.array([x[2] for x in new_its], dtype=np.int64)
        # Per stream (launcher prefix): iteration lines printed before the segment, and the
        # numbers of those of the segment (timer blocks are placed among their own stream's).
        before = {k: len(v) for k, v in run.iter_numbers.items()}
        last_of = {k: int(v[-1]) for k, v in run.iter_numbers.items() if len(v)}
        it_ids: dict[str, int] = {}
        it_sid = np.fromiter(
            (it_ids.setdefault(x[5], len(it_ids)) for x in new_its),
            dtype=np.int64,
            count=len(new_its),
        )
        last_before = run.last_iter
        if new_its:
            cols: dict[str, Any] = {}
            for f in {f for x in new_its for f in x[4]}:
                vals = [x[4].get(f) for x in new_its]
                if f in run.iterations.ints:
                    cols[f] = np.array(vals, dtype=np.int64) if None not in vals else vals
                else:
                    cols[f] = np.array([np.nan if v is None else v for v in vals], dtype=float)
            cols["iteration"] = it_num
            cols["train_iters"] = np.array([x[3] for x in new_its], dtype=np.int64)
            cols["line"] = lines_at(it_pos)
            cols["source"] = self.core.source
            run.iterations.add_columns(len(new_its), cols)
            run.iter_index.add_increasing(it_num)
            for key, sid in it_ids.items():
                mine = it_sid == sid
                run.iter_numbers.setdefault(key, array("q")).extend(it_num[mine].tolist())
                run.begin_training(key, int(cols["line"][np.argmax(mine)]))
            run.last_iter = int(it_num[-1])
            run.max_iter = max(run.max_iter, int(it_num[-1]))
            run.train_iters = int(new_its[-1][3])
            run.training = True
        if new_its or repeated:
            run.pipe_iterations = True
        if ds.keep.any():
            n_iter = np.zeros(len(ds.ls), dtype=np.int64)
            stream = np.zeros(len(ds.ls), dtype=np.int64)
            ds_ids: dict[str | None, int] = {}
            ds_sid = np.fromiter(
                (ds_ids.setdefault(k, len(ds_ids)) for k in ds.keys),
                dtype=np.int64,
                count=len(ds.keys),
            )
            for key, sid in ds_ids.items():
                if key is None:
                    continue
                rows = np.flatnonzero(ds_sid == sid)
                its_of = it_pos[it_sid == it_ids[key]] if key in it_ids else it_pos[:0]
                n_iter[rows] = before.get(key, 0) + np.searchsorted(its_of, ds.ls[rows])
                stream[rows] = run.ds_blocks.stream_id(key)
                if ds.keep[rows].any():
                    run.content_streams.add(key)
            line_all = lines_at(ds.ls)
            for names, idx, vals in ds.groups:
                sel = ds.keep[idx]
                if sel.any():
                    rows = idx[sel]
                    run.ds_blocks.add_rows(
                        names,
                        vals[sel],
                        ds.rank[rows],
                        line_all[rows],
                        n_iter[rows],
                        len(run.steps),
                        stream[rows],
                    )
        if mem:
            cols_m: dict[str, Any] = {"kind": "megatron", "line": lines_at([x[0] for x in mem])}
            for f, i in (("rank", 2), ("after_iteration", 3)):
                values = [x[i] for x in mem]
                cols_m[f] = np.array(values, dtype=np.int64) if None not in values else values
            for f in _MEM_FIELDS.values():
                cols_m[f] = np.array([x[4].get(f, np.nan) for x in mem], dtype=float)
            run.memory.add_columns(len(mem), cols_m)
        if blocks:
            # The line path keeps a state per stream, created on its first block: the order
            # in which open blocks are closed at the end of the file.
            from analysis.parse_rules import _Stream

            for b in blocks:
                if b[3] not in self.core.streams:
                    self.core.streams[b[3]] = _Stream(key=b[3])
            self._add_blocks(
                blocks,
                lines_at([b[0] for b in blocks]),
                (it_pos, it_num, it_sid, it_ids),
                last_of,
                last_before,
            )
        self.lineno_at = lineno + int(np.searchsorted(nl, T))
        return T

    def _ds_lines(self, block: bytes, pos: int, T: int) -> _DSLines:
        """DeepSpeed ``[Rank N] time (ms) |`` lines of [pos, T) whose form the bulk path
        knows, converted (``re.split`` and maps: no Python step per line but a few)."""
        parts = _DS_RE.split(memoryview(block)[pos:T])
        n = (len(parts) - 1) // 3
        out = _DSLines(n)
        if not n:
            return out
        gaps, ranks, bodies = parts[0::3], parts[1::3], parts[2::3]
        raws = list(map(itemgetter(2), map(methodcaller("rpartition", b"\n"), gaps[:-1])))
        gl = np.fromiter(map(len, gaps), dtype=np.int64, count=n + 1)
        ml = 20 + np.fromiter(map(len, ranks), dtype=np.int64, count=n)
        ml += np.fromiter(map(len, bodies), dtype=np.int64, count=n)
        start = pos + np.cumsum(gl[:n]) + np.concatenate([[0], np.cumsum(ml[:-1])])
        out.ls = start - np.fromiter(map(len, raws), dtype=np.int64, count=n)
        out.le = start + ml
        keys = list(map(self.prefixes.get, raws, repeat(_MISSING)))
        if _MISSING in keys:
            keys = [
                self._key(r, b"[Rank") if k is _MISSING else k
                for r, k in zip(raws, keys, strict=True)
            ]
        out.keys = keys  # type: ignore[assignment]
        out.keep = out.le - out.ls <= MAX_LINE_CHARS
        if None in keys:
            out.keep &= np.array([k is not None for k in keys], dtype=bool)
        shapes = list(map(bytes.translate, bodies, repeat(None), repeat(_DIGITS)))
        names = list(map(self.ds_shapes.get, shapes, repeat(_MISSING)))
        if _MISSING in names:
            for i, nm in enumerate(names):
                if nm is _MISSING:
                    nm = self.ds_shapes.get(shapes[i], _MISSING)
                    names[i] = (
                        self._ds_shape(shapes[i], bodies[i], int(ranks[i]))
                        if nm is _MISSING
                        else nm
                    )
        ids = {nm: i for i, nm in enumerate(dict.fromkeys(names))}
        gid = np.array(list(map(ids.__getitem__, names)), dtype=np.int64)
        rank_of = self.ranks
        if len(rank_of) > 4096:
            rank_of.clear()
        for r in set(ranks).difference(rank_of):
            rank_of[r] = int(r)
        out.rank = np.array(list(map(rank_of.__getitem__, ranks)), dtype=np.int64)
        for nm, g in ids.items():
            idx = np.flatnonzero(gid == g)
            if nm is None:
                out.keep[idx] = False
                continue
            mine = [bodies[i] for i in idx.tolist()]
            fast = set(map(shapes.__getitem__, idx.tolist())) <= self.ds_fast
            vals = _ds_values_fast(mine, len(nm)) if fast else _ds_values(mine, len(nm))
            if vals is None:  # a value does not convert: look line by line
                rows = [_ds_values([bodies[i]], len(nm)) for i in idx.tolist()]
                good = np.array([r is not None for r in rows], dtype=bool)
                out.keep[idx[~good]] = False
                idx = idx[good]
                vals = np.vstack([r for r in rows if r is not None]) if good.any() else None
            if vals is not None:
                out.groups.append((nm, idx, vals))
        return out

    def _mem_lines(
        self, block: bytes, pos: int, T: int
    ) -> list[tuple[int, int, int | None, int | None, dict[str, float]]]:
        """Megatron ``memory (MB) |`` reports of [pos, T) the bulk path knows: (start, end,
        rank, after iteration, values)."""
        out = []
        for m in _MEM_RE.finditer(block, pos, T):
            e = m.end()
            ls = block.rfind(b"\n", pos, m.start()) + 1 or pos
            if e - ls > MAX_LINE_CHARS:
                continue
            _key, c = self._line_key(block, ls, e - 1)
            if c < 0:
                continue
            text = block[c : e - 1].rstrip(b"\r\n")
            if not _printable(text):
                continue
            shape = text.translate(None, _DIGITS)
            names = self.mem_shapes.get(shape, _MISSING)
            if names is _MISSING:
                names = self._mem_shape(shape, text)
            if names is None:
                continue
            head, _, body = text.partition(b"memory (MB) |")
            hm = _MEM_HEAD_RE.match(head)
            pairs = _pairs(body)
            if hm is None or pairs is None:
                continue
            vals = [_finite(t) for t in pairs[1]]
            if None in vals:
                continue
            got = {_MEM_FIELDS[n]: v for n, v in zip(pairs[0], vals, strict=True)}
            rank = int(hm.group(1)) if hm.group(1) else None
            after = int(hm.group(2)) if hm.group(2) else None
            out.append((ls, e, rank, after, got))  # type: ignore[arg-type]
        return out

    def _iteration_lines(
        self, block: bytes, pos: int, T: int
    ) -> list[tuple[int, int, int, int, dict[str, Any], str]]:
        """Megatron iteration lines of [pos, T) the bulk path knows: (start, end, number,
        total, field values, stream)."""
        out, taken = self._iteration_patterns(block, pos, T)
        found: list[tuple[int, int, int, int, bytes, list[tuple[int, str, str, float]], str]] = []
        for m in _IT_RE.finditer(block, pos, T):
            st = m.start()
            if taken and (block.rfind(b"\n", pos, st) + 1 or pos) in taken:
                continue
            if st > pos and block[st - 1] in _WORD:  # (?<![\w-]) of the line path
                continue
            ls = block.rfind(b"\n", pos, st) + 1 or pos
            e = block.find(b"\n", m.end(), T)
            if e < 0 or e - ls > MAX_LINE_CHARS:
                continue
            key, c = self._line_key(block, ls, e)
            if c < 0 or c > st:
                continue
            text = block[c:e]
            if text[-1:] == b"\r":
                text = text.rstrip(b"\r\n")
            if not _printable(text):
                continue
            rel = st - c
            head = text[:rel]
            if (
                b"|" in head
                or b"iteration" in head
                or b"time (ms)" in head
                or b"memory (MB)" in head
                or b"# run outcome" in text
                or not text.rstrip().endswith(b"|")
                or _other_glue(text, rel)
            ):
                continue
            rest = text[rel + m.end() - st - 1 :]
            shape = rest.translate(None, _DIGITS)
            fields = self.it_shapes.get(shape, _MISSING)
            if fields is _MISSING:
                fields = self._it_shape(shape, text, rest)
            if fields is None:
                continue
            found.append((ls, e + 1, int(m.group(1)), int(m.group(2)), rest, fields, key))  # type: ignore[arg-type]
        by_shape: dict[int, list[int]] = {}
        for i, x in enumerate(found):
            by_shape.setdefault(id(x[5]), []).append(i)
        keep = [True] * len(found)
        got: list[dict[str, Any]] = [{} for _ in found]
        for idx in by_shape.values():
            fields = found[idx[0]][5]
            vals = self._iter_values(fields, [found[i][4] for i in idx])
            if vals is None:  # a value does not convert: look line by line
                for i in idx:
                    one = self._iter_values(fields, [found[i][4]])
                    if one is None:
                        keep[i] = False
                        continue
                    for (_p, f, kd, _x), v in zip(fields, one, strict=True):
                        got[i][f] = int(v[0]) if kd == "int" else float(v[0])
                continue
            for (_p, f, kd, _x), v in zip(fields, vals, strict=True):
                conv = v.astype(np.int64).tolist() if kd == "int" else v.tolist()
                for i, value in zip(idx, conv, strict=True):
                    got[i][f] = value
        out += [(x[0], x[1], x[2], x[3], got[i], x[6]) for i, x in enumerate(found) if keep[i]]
        if taken and found:
            out.sort(key=lambda x: x[0])
        return out

    def _iteration_patterns(
        self, block: bytes, pos: int, T: int
    ) -> tuple[list[tuple[int, int, int, int, dict[str, Any], str]], set[int]]:
        """Iteration lines of the learned patterns, read by ``re.split`` (no Python step per
        line but a few maps), as ``_iteration_lines`` gives them; their starts."""
        out: list[tuple[int, int, int, int, dict[str, Any], str]] = []
        taken: set[int] = set()
        if not self.it_tmpls:
            return out, taken
        seg = memoryview(block)[pos:T]
        for tp in self.it_tmpls:
            parts = tp.rx.split(seg)
            G = tp.rx.groups
            n = (len(parts) - 1) // (G + 1)
            if not n:
                continue
            gaps = parts[0 :: G + 1]
            heads = list(map(itemgetter(2), map(methodcaller("rpartition", b"\n"), gaps[:-1])))
            glen = np.fromiter(map(len, gaps), dtype=np.int64, count=n + 1)
            mlen = np.full(n, tp.const, dtype=np.int64)
            for j in range(1, G + 1):
                mlen += np.fromiter(map(len, parts[j :: G + 1]), dtype=np.int64, count=n)
            start = pos + np.cumsum(glen[:n]) + np.concatenate([[0], np.cumsum(mlen[:-1])])
            hlen = np.fromiter(map(len, heads), dtype=np.int64, count=n)
            ls = start - hlen
            ok = np.array(list(map(self._it_head, heads, (ls == pos).tolist())), dtype=bool)
            ok &= hlen + mlen <= MAX_LINE_CHARS
            if not ok.any():
                continue
            cols = []
            for piece, f, kind, factor in tp.fields:
                toks = parts[5 + piece :: G + 1]
                try:
                    vals = np.array(list(map(float, toks)), dtype=float)
                except ValueError:
                    vals = np.full(n, np.nan)
                bad = ~np.isfinite(vals)
                if kind == "int":
                    bad |= (vals != np.floor(vals)) | (np.abs(vals) >= 2**53)
                elif factor != 1.0:
                    vals = vals * factor
                ok &= ~bad
                cols.append((f, kind, vals))
            sel = np.flatnonzero(ok)
            if taken:
                sel = sel[[int(x) not in taken for x in ls[sel].tolist()]]
            numbers = np.array(list(map(int, parts[2 :: G + 1])), dtype=np.int64)[sel].tolist()
            totals = np.array(list(map(int, parts[4 :: G + 1])), dtype=np.int64)[sel].tolist()
            names = [f for f, _k, _v in cols]
            values = [
                v[sel].astype(np.int64).tolist() if kind == "int" else v[sel].tolist()
                for _f, kind, v in cols
            ]
            starts, ends = ls[sel].tolist(), (start + mlen)[sel].tolist()
            keys = list(map(self._head_key, map(heads.__getitem__, sel.tolist())))
            rows = zip(*values, strict=True) if values else ((),) * len(starts)
            for a, b, num, tot, row, key in zip(
                starts, ends, numbers, totals, rows, keys, strict=True
            ):
                out.append((a, b, num, tot, dict(zip(names, row, strict=True)), key))
            taken.update(starts)
        out.sort(key=lambda x: x[0])
        return out, taken

    def _head_key(self, head: bytes) -> str:
        """Stream key of an iteration line whose text before ``iteration`` is ``head`` (one
        ``_it_head`` took), as ``_line_key`` finds it."""
        m = _PREFIXES_RE.match(head)
        raw = m.group(0) if m else b""
        got = self.prefix_runs.get(raw)
        if got is None:
            k, rest = split_prefix(raw.decode("ascii"))
            got = self.prefix_runs[raw] = (k, len(raw) - len(rest))
        return got[0]

    def _it_head(self, head: bytes, at_start: bool) -> bool:
        """Whether a line whose text before ``iteration`` is ``head`` is read in bulk (its
        prefixes valid, nothing in it that makes the line path read it otherwise)."""
        got = self.it_heads.get(head)
        if got is None:
            got = False
            if (not head or head[-1] not in _WORD) and b"\n" not in head:
                m = _PREFIXES_RE.match(head)
                raw = m.group(0) if m else b""
                _k, rest = split_prefix(raw.decode("ascii"))
                text = head[len(raw) - len(rest) :]
                got = (
                    _printable(text)
                    and (not text or 0x20 <= text[0] < 0x7F)
                    and not any(
                        w in text
                        for w in (
                            b"|",
                            b"iteration",
                            b"time (ms)",
                            b"memory (MB)",
                            b"# run outcome",
                        )
                    )
                )
            if len(self.it_heads) < 4096:
                self.it_heads[head] = got
        return got

    def _timer_blocks(
        self, block: bytes, pos: int, T: int
    ) -> tuple[
        int,
        list[tuple[int, int, dict[str, Any], str]],
        list[tuple[int, int]],
        list[tuple[int, int]],
    ]:
        """Megatron timer blocks of [pos, T): the header, then the lines of its stream while
        they are timer lines; the first other line of the stream closes it.  Returns (T, the
        blocks as (header start, close, values, stream), header lines, body lines); T moves to
        the header of a block that does not close before it.  A block printed in one piece
        like one read before is read by one match of that block's pattern."""
        blocks: list[tuple[int, int, dict[str, Any], str]] = []
        headers: list[tuple[int, int]] = []
        bodies: list[tuple[int, int]] = []
        for m in _HEAD_RE.finditer(block, pos, T):
            ls = block.rfind(b"\n", pos, m.start()) + 1 or pos
            e = block.find(b"\n", m.end(), T)
            if e < 0:
                self.open_at_limit = True
                return ls, blocks, headers, bodies
            got = None
            for tmpl in self.block_tmpls.get(block[ls : e + 1], ()):
                got = tmpl.read(self, block, ls, T)
                if got is not None:
                    break
            if got is None:
                key, c = self._line_key(block, ls, e)
                if c < 0:
                    continue
                text = block[c:e].rstrip()
                kind = _HEADS.get(text) if _printable(text) else None
                if kind is None or e - ls > MAX_LINE_CHARS:
                    continue
                got = self._read_block(block, ls, e, c, key, kind, T)
            if got is _OPEN or got is _LONG:  # not closed here: the line path reads it
                self.open_at_limit = got is _OPEN
                return ls, blocks, headers, bodies
            close, values, mine, key = got  # type: ignore[misc]
            blocks.append((ls, close, values, key))
            headers.append((ls, e + 1))
            bodies.extend(mine)
        return T, blocks, headers, bodies

    def _read_block(
        self, block: bytes, ls: int, e: int, c: int, key: str, kind: str, T: int
    ) -> Any:
        """One timer block line by line: (close, values, body lines, stream), or _OPEN."""
        values: dict[str, Any] = {}
        name: str | None = None
        q = e + 1
        mine: list[tuple[int, int]] = []
        recipe: list[tuple[bytes, str, str | None]] = []  # for a pattern of the block
        while q < T:
            le = _line_end(block, q, T)
            if le >= T:
                return _OPEN
            if le - q > MAX_LINE_CHARS:  # truncated by the line path: it reads this block
                return _LONG
            k2, cs = self._line_key(block, q, le)
            s = q
            if k2 != key:
                nxt = self._next_of_stream(block, key, le + 1, T)
                if nxt is None:
                    return _OPEN
                s, le, cs = nxt
                if le - s > MAX_LINE_CHARS:
                    return _LONG
                recipe = []  # not in one piece
            step = self._body_step(block, s, le, cs, kind, name, values)
            if step is None:
                if recipe is not None and mine and mine[-1][1] == s and len(recipe) == len(mine):
                    self._learn(block, ls, c, kind, recipe, mine)
                return s, values, mine, key
            name, what = step
            if what is not None:
                recipe.append(what)
            mine.append((s, le + 1))
            q = le + 1
        return _OPEN

    def _body_step(
        self,
        block: bytes,
        s: int,
        le: int,
        cs: int,
        kind: str,
        name: str | None,
        values: dict[str, Any],
    ) -> tuple[str | None, tuple[bytes, str, str | None] | None] | None:
        """Read one line of a timer block's stream as ``_Core._continue_block`` does: None
        when it closes the block, else (current name, how the line reads for a pattern)."""
        if self.timer_res is None:
            from analysis._lines import to_float
            from analysis.parse_rules import _TIMER_LINE_RE, _TIMER_NAME_RE, _TIMER_RANK_RE

            self.str_timer_res = (_TIMER_LINE_RE, _TIMER_NAME_RE, _TIMER_RANK_RE, to_float)
            self.timer_res = tuple(
                re.compile(r.pattern.encode())
                for r in (_TIMER_LINE_RE, _TIMER_NAME_RE, _TIMER_RANK_RE)
            )
        body: bytes | str = block[cs:le] if cs >= 0 else b"\x00"
        if body[-1:] == b"\r":
            body = body.rstrip(b"\r\n")  # type: ignore[arg-type]
        plain = _printable(body)  # type: ignore[arg-type]
        if plain:
            (line_re, name_re, rank_re), num, dec = self.timer_res, _finite, bytes.decode
        else:  # read as the line path does
            body = split_prefix(
                block[s:le].decode("utf-8", "replace")[:MAX_LINE_CHARS].rstrip("\r\n")
            )[1]
            line_re, name_re, rank_re, num = self.str_timer_res  # type: ignore[assignment]
            dec = str  # type: ignore[assignment]
        raw = block[s:le] if plain else b"\x00"
        tm = line_re.match(body)
        if tm and kind != "times":
            a = num(tm.group(2))
            b = num(tm.group(3)) if tm.group(3) else None
            if a is not None:
                n = dec(tm.group(1).strip())
                values[n] = (a, b) if b is not None else a
                spans = [tm.span(2)] + ([tm.span(3)] if b is not None else [])
                return name, (_pattern(raw, spans, cs - s), "pair" if b is not None else "one", n)
        if kind == "times":
            r = rank_re.match(body)
            if r and name is not None:
                v = num(r.group(2))
                if v is None:
                    return name, (b"\x00", "skip", name)
                lo, hi = values.get(name, (v, v))
                values[name] = (min(lo, v), max(hi, v))
                return name, (_pattern(raw, [r.span(2)], cs - s), "rank", name)
            nm = name_re.match(body)
            if nm:
                n = dec(nm.group(1).strip())
                return n, (re.escape(raw), "name", n)
        return None

    def _learn(
        self,
        block: bytes,
        ls: int,
        c: int,
        kind: str,
        recipe: list[tuple[bytes, str, str | None]],
        mine: list[tuple[int, int]],
    ) -> None:
        """Keep a pattern of a block read line by line that was printed in one piece."""
        e = mine[0][0] - 1
        head = block[ls : e + 1]
        known = self.block_tmpls.setdefault(head, [])
        if len(known) >= 8 or any(p == b"\x00" or how == "skip" for p, how, _n in recipe):
            return
        if not _printable(head.rstrip(b"\n")):
            return
        pattern = re.escape(head) + b"".join(p + b"\n" for p, _h, _n in recipe)
        known.append(
            _BlockPattern(
                re.compile(pattern),
                kind,
                [(h, n) for _p, h, n in recipe],
                self._line_key(block, ls, e)[0],
            )
        )

    def _add_blocks(
        self,
        blocks: list[tuple[int, int, dict[str, Any], str]],
        hlines: np.ndarray,
        its: tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, int]],
        last_of: dict[str, int],
        last_before: int | None,
    ) -> None:
        """Add Megatron timer blocks: the iteration is the last one of the block's stream
        read when it closed, else the last one of the run (``_Core._last_iter``)."""
        from analysis.records import TimerBlock, _shape

        it_pos, it_num, it_sid, it_ids = its
        table = self.core.run.megatron_blocks
        closes = np.array([b[1] for b in blocks], dtype=np.int64)
        k_before = np.searchsorted(it_pos, closes).tolist()
        by_group: dict[tuple[Any, ...], list[tuple[list[float], int | None, int]]] = {}
        for (_ls, close, values, key), hl, kb in zip(
            blocks, hlines.tolist(), k_before, strict=True
        ):
            if values:
                it = int(it_num[kb - 1]) if kb > 0 else last_before
                if key in it_ids:
                    mine = it_sid == it_ids[key]
                    j = int(np.searchsorted(it_pos[mine], close))
                    if j > 0:
                        it = int(it_num[mine][j - 1])
                    elif key in last_of:
                        it = last_of[key]
                elif key in last_of:
                    it = last_of[key]
                flat = [x for v in values.values() for x in (v if isinstance(v, tuple) else (v,))]
                by_group.setdefault((tuple(values), _shape(values)), []).append((flat, it, hl))
        for (names, shape), rows in by_group.items():
            if any(r[1] is None for r in rows):
                for flat, it, hl in rows:
                    table.append(
                        TimerBlock("megatron", _group_values(names, shape, flat), None, it, hl)
                    )
                continue
            table.add_rows(
                table.group("megatron", names, shape),
                np.array([r[0] for r in rows], dtype=float),
                None,
                np.array([r[1] for r in rows], dtype=np.int64),
                np.array([r[2] for r in rows], dtype=np.int64),
            )

    def _first_keyword(
        self, block: bytes, pos: int, T: int, span_s: np.ndarray, span_e: np.ndarray
    ) -> int | None:
        """Start of the first line in [pos, T) outside the lines taken (starts, ends) that
        holds a keyword."""
        order = np.argsort(span_s, kind="stable")
        s, e = span_s[order], span_e[order]
        inside = s < T
        s, e = s[inside], np.minimum(e[inside], T)
        covered = np.maximum.accumulate(e) if len(e) else e
        starts = np.concatenate([[pos], covered]).astype(np.int64)
        ends = np.concatenate([s, [T]]).astype(np.int64)
        gap = ends > starts
        starts_l, ends_l = starts[gap].tolist(), ends[gap].tolist()
        if not starts_l:
            return None
        gaps = b"".join(map(block.__getitem__, map(slice, starts_l, ends_l)))
        hit = self.kw.first(gaps, 0, len(gaps), self.core.run.pipe_iterations, once=True)
        if hit < 0:
            return None
        offsets = np.cumsum(np.concatenate([[0], ends[gap] - starts[gap]]))
        g = int(np.searchsorted(offsets, hit, side="right")) - 1
        p = starts_l[g] + hit - int(offsets[g])
        return block.rfind(b"\n", pos, p) + 1 or pos
