"""Bulk extraction of the one-line record families (DeepSpeed ``[Rank N] time (ms) |`` and
``MemAllocated=`` lines, iteration lines, PipelineEngine ``steps:`` lines, Megatron memory
reports): one literal-anchored bytes pattern per family over a stretch, into numpy columns with
line offsets and stream keys.  A record is taken only in a form the line path reads the same way;
names are read once per form (the line without its digits), values a form at a time.
"""

from __future__ import annotations

import re
import warnings
from itertools import repeat
from typing import Any

import numpy as np

from analysis.parse.lines import COMPOSE, MAX_LINE_CHARS, TIME_STAMP, norm_key, split_prefix
from analysis.parse.rules import INT_FIELDS, ITER_FIELDS

DIGITS = b"0123456789"
WORD = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
PRINTABLE = bytes(range(0x20, 0x7F)) + b"\t"
MISSING = object()
PREFIXES_RE = re.compile(
    b"(?:" + COMPOSE.encode() + b")?(?:" + TIME_STAMP.encode() + b")?"
    rb"(?:\s{0,4}\d{1,5}:\s|\[\d{1,9},\d{1,6}\]<std(?:out|err)>:|\[(?:default\d+|rank\d+)\]:\s?"
    rb"|[A-Za-z0-9][A-Za-z0-9_.-]{0,62}:\s){0,4}"
)
"""``docker compose``'s prefix, a collector's time stamp and launcher prefixes at the start of a
line, as ``lines.split_prefix`` reads them (which then says how many of them really are
prefixes)."""

NUM = rb"-?\d++(?:\.\d++)?+"
"""A plain decimal: ``float()`` reads it as ``lines.to_float`` does."""
DS_RE = re.compile(rb"\[Rank (\d{1,9})\] time \(ms\) \|([^\n]*)\n")
"""A DeepSpeed ``wall_clock_breakdown`` line: rank, the rest of the line (``DS_FORM``)."""
DS_FORM = re.compile(rb"(?: [A-Za-z_]+: +[-+.eE]* *\|)* [A-Za-z_]+: +[-+.eE]*[ \t]*\r?\Z")
"""The form (the text without its digits) of the ``name: value`` pieces of a DeepSpeed line
that is read in bulk (each value then a number ``float()`` reads, each name without digits)."""
DS_PLAIN = re.compile(rb"(?: [A-Za-z_]+: +[-+.]* *\|)* [A-Za-z_]+: +[-+.]*[ \t]*\r?\Z")
"""A ``DS_FORM`` of plain decimals (no exponent): its values are read by ``_plain_values``."""
IT_RE = re.compile(rb"iteration( +\d{1,18}/ *\d{1,18} *)\|([^\n]*)\n")
"""A Megatron iteration line from ``iteration``: `` number/ total `` and the rest of the line
(``IT_FORM``)."""
IT_FORM = re.compile(rb"(?: *[A-Za-z][A-Za-z _/().,%'-]*: +[-+.eE]* *\|)+[ \t]*\r?\Z")
"""The form of the ``| key: value |`` pieces of an iteration line that is read in bulk."""
STEPS_RE = re.compile(
    rb"steps: (\d{1,18}) loss: (" + NUM + rb") iter time \(s\): (" + NUM + rb")"
    rb"((?: samples/sec: " + NUM + rb")?)([ \t]*\r?)\n"
)
"""A PipelineEngine step line: step, loss, seconds, `` samples/sec: S`` (maybe absent)."""
MEM_RE = re.compile(
    rb"\[Rank (\d{1,9})\] \(after (\d{1,18}) iterations\) memory \(MB\) \|([^\n]*)\n"
)
"""A Megatron memory report of one rank after some iterations: rank, iterations, the rest of
the line (``MEM_FORM``)."""
_MEM_NAME = rb"(?:max )?(?:allocated|reserved)"
MEM_FORM = re.compile(
    rb"(?: " + _MEM_NAME + rb": +[-+.]* *\|)* " + _MEM_NAME + rb": +[-+.]*[ \t]*\|?[ \t]*\r?\Z"
)
"""The form of a memory report's ``name: value`` pieces read in bulk (plain decimals)."""
ALLOC_RE = re.compile(
    rb"\[Rank (\d{1,9})\] MemAllocated=(" + NUM + rb")GB MaxMemAllocated=(" + NUM + rb")GB"
    rb"([^\n]*)\n"
)
"""DeepSpeed's ``see_memory_usage``-style ``MemAllocated=..GB MaxMemAllocated=..GB`` line."""
_ALLOC_NOT = (
    b"# run outcome",
    b"iteration",
    b"steps:",
    b"time (ms)",
    b"across ranks",
    b"memory (MB)",
)
"""Texts that send a line to an earlier branch of ``Core._dispatch`` than ``MemAllocated=``."""
MEM_FIELDS = {
    "allocated": "allocated_mb",
    "max allocated": "max_allocated_mb",
    "reserved": "reserved_mb",
    "max reserved": "max_reserved_mb",
}


def line_end(block: bytes, s: int, end: int) -> int:
    """Where the line at ``s`` ends (its newline, or ``end``)."""
    e = block.find(b"\n", s, end)
    return end if e < 0 else e


def is_printable(line: bytes) -> bool:
    """Printable ASCII (and tabs), a trailing carriage return allowed."""
    return not line.translate(None, PRINTABLE) or not line.rstrip(b"\r").translate(None, PRINTABLE)


_POWERS = 10.0 ** np.arange(16)
"""Powers of ten that a double holds exactly."""


def floats(tokens: list[bytes]) -> np.ndarray | None:
    """``float()`` of each token (without blanks) as float64, or None when one is not a finite
    number."""
    return floats_text(b" ".join(tokens), len(tokens)) if tokens else np.zeros(0)


def floats_text(text: bytes, n: int) -> np.ndarray | None:
    """``float()`` of the ``n`` tokens of ``text`` (numbers between blanks) as float64, or None
    when it holds another count of tokens or one that is not a finite number."""
    if not text.translate(None, b"0123456789. \t\r\n"):
        vals = _fixed_point(text, n)
        if vals is not None:
            return vals
    toks = text.split()
    if len(toks) != n:
        return None
    try:
        vals = np.fromiter(map(float, toks), dtype=float, count=n)
    except ValueError:
        return None
    return vals if np.isfinite(vals).all() else None


_NOT_VALUES = bytes(c for c in range(128) if chr(c).isalpha()) + b"_:|"


def _plain_values(joined: bytes, n: int, k: int) -> np.ndarray | None:
    """The values of ``n`` DeepSpeed line bodies of one ``DS_PLAIN`` form (``k`` names each),
    joined by newlines, as an (n, k) array: the names, colons and bars deleted leave the
    values between blanks; None when a line does not hold k of them (a digit in a name, a
    value without one) or one does not read."""
    text = joined.translate(None, _NOT_VALUES)
    a = np.frombuffer(text, dtype=np.uint8)
    starts = _tokens(a)[0]
    if len(starts) != n * k:
        return None
    if (np.searchsorted(starts, np.flatnonzero(a == 0x0A)) != k * np.arange(1, n)).any():
        return None
    vals = floats_text(text, n * k)
    return None if vals is None else vals.reshape(n, k)


def matches(
    rx: re.Pattern[bytes], block: bytes, pos: int, T: int
) -> tuple[np.ndarray, np.ndarray, list[list[bytes]]]:
    """Where each match of ``rx`` in [pos, T) starts and ends, and the values of each of its
    groups, from one ``split`` (no object per match): every byte of a match that is not in a
    group is of its fixed text, as long in each as in the first."""
    parts = rx.split(block[pos:T])
    k = rx.groups
    n = (len(parts) - 1) // (k + 1)
    if not n:
        none = np.zeros(0, dtype=np.int64)
        return none, none, [[] for _ in range(k)]
    lens = np.fromiter(map(len, parts), dtype=np.int64, count=len(parts))
    first = rx.match(block, pos + len(parts[0]), T)
    assert first is not None
    fixed = first.end() - first.start() - int(lens[1 : k + 1].sum())
    gaps = lens[0 :: k + 1][:n]
    width = fixed + lens[:-1].reshape(n, k + 1)[:, 1:].sum(axis=1)
    ends = pos + np.cumsum(gaps + width)
    return ends - width, ends, [parts[g :: k + 1] for g in range(1, k + 1)]


def spans_text(a: np.ndarray, s: np.ndarray, e: np.ndarray) -> bytes:
    """The bytes of ``a`` in the spans [s, e), in order, each followed by the byte at its end
    (a separator)."""
    if not len(s):
        return b""
    # Spans in order: a mask of runs of bytes out and in (no index per byte).
    runs = np.empty(2 * len(s) + 1, dtype=np.int64)
    runs[0], runs[-1] = s[0], len(a) - e[-1] - 1
    runs[1::2], runs[2:-1:2] = e - s + 1, s[1:] - e[:-1] - 1
    inside = np.zeros(len(runs), dtype=bool)
    inside[1::2] = True
    if (runs >= 0).all():
        return a[np.repeat(inside, runs)].tobytes()
    lens = e - s + 1
    at = np.repeat(s - np.cumsum(lens) + lens, lens) + np.arange(int(lens.sum()))
    return a[at].tobytes()


def piece_values(joined: bytes, n: int, k: int, cols: list[int]) -> np.ndarray | None:
    """The values of pieces ``cols`` of ``n`` lines joined by newlines, each of ``k``
    ``name: value`` pieces between bars, names without colons: (n, len(cols)) as ``float()``
    reads them; None when a value is not one finite number or a name holds a digit."""
    a = np.frombuffer(joined + b"\n", dtype=np.uint8)
    colon = np.flatnonzero(a == 0x3A)
    if len(colon) != n * k:
        return None
    stops = np.flatnonzero((a == 0x7C) | (a == 0x0A))
    ends = stops[np.searchsorted(stops, colon)]
    # The values of a piece are of one form (integers, decimals, ...): read a form at a time.
    first = spans_text(a, colon[:k] + 1, ends[:k]).replace(b"|", b" ").split()
    if len(first) != k:
        return None
    forms: dict[bytes, list[int]] = {}
    for c, tok in enumerate(first):
        forms.setdefault(tok.translate(None, DIGITS), []).append(c)
    out = np.empty((n, k))
    digits = 0
    for part in forms.values():
        sel = np.zeros(k, dtype=bool)
        sel[part] = True
        sel = np.tile(sel, n)
        text = spans_text(a, colon[sel] + 1, ends[sel]).replace(b"|", b" ")
        digits += len(text) - len(text.translate(None, DIGITS))
        vals = floats_text(text, n * len(part))
        if vals is None:
            return None
        out[:, part] = vals.reshape(n, len(part))
    if digits != len(joined) - len(joined.translate(None, DIGITS)):
        return None  # (a digit outside the values)
    return out[:, cols]


def piece_rows(
    texts: list[bytes], joined: bytes, k: int, cols: list[int]
) -> tuple[np.ndarray, np.ndarray]:
    """``piece_values`` of each of ``texts`` (``joined``: joined by newlines; all at once,
    else one by one): the values (NaN in a row not read) and which rows were read."""
    vals = piece_values(joined, len(texts), k, cols)
    if vals is not None:
        return vals, np.ones(len(texts), dtype=bool)
    rows = [piece_values(x, 1, k, cols) for x in texts]
    good = np.array([r is not None for r in rows], dtype=bool)
    vals = np.full((len(texts), len(cols)), np.nan)
    if good.any():
        vals[good] = np.concatenate([r for r in rows if r is not None])
    return vals, good


def int_tokens(tokens: list[bytes]) -> np.ndarray:
    """The integers of ``tokens`` (digits, at most 18 each) as int64."""
    return np.fromstring(b" ".join(tokens), dtype=np.int64, sep=" ")


def _tokens(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each run of bytes above blank in ``a`` starts and where its last byte is."""
    blank = a <= 0x20
    first, last = ~blank, ~blank
    first[1:] &= blank[:-1]
    last[:-1] &= blank[1:]
    return np.flatnonzero(first), np.flatnonzero(last)


def _ints(text: bytes) -> np.ndarray | None:
    """The integers between blanks of ``text`` as int64; None when one does not read whole."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            return np.fromstring(text, dtype=np.int64, sep=" ")
        except (ValueError, DeprecationWarning):
            return None


def _fixed_point(text: bytes, n: int) -> np.ndarray | None:
    """The ``n`` numbers of ``text`` (unsigned decimals between blanks) when each is digits with
    one dot among them, at most 15 digits: read as integers without the dot, each divided by
    the power of ten of its decimals, which gives the double nearest the decimal, as
    ``float()`` does (both numbers are exact, and IEEE division rounds correctly); else None."""
    a = np.frombuffer(text, dtype=np.uint8)
    starts, ends = _tokens(a)
    dots = np.flatnonzero(a == 0x2E)
    if len(starts) != n:
        return None
    if not len(dots) and (ends - starts < 18).all():  # integers: converted exactly or rounded
        ints = _ints(text)  # to nearest as float() does
        return ints.astype(float) if ints is not None and len(ints) == n else None
    if len(dots) != n or (dots < starts).any() or (dots > ends).any():
        return None
    if (ends - starts > 15).any() or (ends == starts).any():  # (or a dot alone)
        return None
    ints = _ints(text.translate(None, b"."))
    return ints / _POWERS[ends - dots] if ints is not None and len(ints) == n else None


def iteration_fields(names: list[str]) -> list[tuple[int, str, bool, float]] | None:
    """Which piece of an iteration line with these keys gives which ``Iteration`` field, as
    ``Core._iteration_text`` reads them: (piece, field, int or not, factor to ms); None when
    the line path reads such a line otherwise (a unit to read from the value, a record it
    takes for hard-wrapped, timers glued after it)."""
    got: dict[str, tuple[int, str, bool, float]] = {}
    elapsed = False
    for i, raw in enumerate(names):
        k = norm_key(raw)
        if "time (ms)" in raw or "#" in raw:
            return None
        if k in ITER_FIELDS:
            name = ITER_FIELDS[k]
            if name == "lm_loss" and k == "loss" and "lm_loss" in got:
                continue
            got[name] = (i, name, name in INT_FIELDS, 1.0)
        elif k == "approx flops per gpu":
            return None
        elif k.startswith(("elapsed", "iteration time", "step time", "time per iteration")):
            if "(ms)" in k or k.endswith(" ms") or k == "elapsed ms":
                got["elapsed_ms"] = (i, "elapsed_ms", False, 1.0)
            elif "(s)" in k or k.endswith((" s", " sec", "(sec)")):
                got["elapsed_ms"] = (i, "elapsed_ms", False, 1000.0)
            else:
                return None
        if re.search(r"elapsed|iteration[ _]time|step[ _]time|time[ _]per[ _]iteration", raw, re.I):
            elapsed = True
    return list(got.values()) if elapsed else None


class Lines:
    """Records of one family in a stretch, in file order: line starts, line ends (past the
    newline), stream keys, and value columns (float64, NaN where a record has none)."""

    def __init__(
        self,
        ls: Any,
        le: Any,
        keys: list[Any],
        cols: dict[str, np.ndarray],
        ints: frozenset[str] = frozenset(),
    ) -> None:
        self.ls = np.asarray(ls, dtype=np.int64)
        self.le = np.asarray(le, dtype=np.int64)
        self.keys = keys
        """Stream key of each record."""
        self.cols = cols
        """Field -> values."""
        self.ints = ints
        """The fields of ``cols`` that hold integers (as float64, NaN where none)."""
        self.keep = np.ones(len(self.ls), dtype=bool)
        """Which records are taken (DeepSpeed lines; the other families are selected)."""
        self.groups: list[tuple[tuple[str, ...], np.ndarray, np.ndarray]] = []
        """DeepSpeed lines' values by names: (names, rows, rows x names values)."""

    @classmethod
    def empty(cls) -> Lines:
        """None."""
        return cls([], [], [], {})

    def __len__(self) -> int:
        return len(self.ls)

    def select(self, which: np.ndarray) -> Lines:
        """The records at ``which`` (a mask or indices)."""
        idx = np.flatnonzero(which) if which.dtype == bool else which
        if len(idx) == len(self.ls):
            return self
        return Lines(
            self.ls[idx],
            self.le[idx],
            list(map(self.keys.__getitem__, idx.tolist())),
            {f: v[idx] for f, v in self.cols.items()},
            self.ints,
        )


def by_form(bodies: list[bytes]) -> list[tuple[bytes, np.ndarray, list[bytes], bytes]]:
    """``bodies`` (texts without newlines) by form, the text without its digits, in the order
    of each form's first body: (form, indices, the bodies, the bodies joined by newlines)."""
    joined = b"\n".join(bodies)
    forms = joined.translate(None, DIGITS).split(b"\n")
    ids = {f: i for i, f in enumerate(dict.fromkeys(forms))}
    if len(ids) == 1:
        return [(forms[0], np.arange(len(forms)), bodies, joined)]
    gid = np.fromiter(map(ids.__getitem__, forms), dtype=np.int64, count=len(forms))
    out = []
    for f, g in ids.items():
        idx = np.flatnonzero(gid == g)
        mine = list(map(bodies.__getitem__, idx.tolist()))
        out.append((f, idx, mine, b"\n".join(mine)))
    return out


class Extractors:
    """The per-family extractors of one file."""

    def __init__(self) -> None:
        self.ds_names: dict[bytes, tuple[str, ...] | None] = {}
        """A DeepSpeed line's form (its body without digits) -> its names (None: not taken)."""
        self.it_fields: dict[bytes, list[tuple[int, str, bool, float]] | None] = {}
        """An iteration line's form -> ``iteration_fields`` of its keys."""
        self.heads: dict[bytes, dict[bytes, str | None]] = {}
        """Record anchor -> text before a record -> its stream key (None: the line path
        reads such a line)."""

    # -- stream keys --------------------------------------------------------------------------

    def head_key(self, head: bytes, anchor: bytes) -> str | None:
        """Stream key of a line whose text before ``anchor`` (where the record starts) is
        ``head``: launcher prefixes alone, or for an iteration line launcher prefixes then
        printable text the line path reads past (a time stamp); None otherwise."""
        cache = self.heads.setdefault(anchor, {})
        key = cache.get(head, MISSING)
        if key is MISSING:
            key = None
            if not is_printable(head) or b"\r" in head:
                pass
            elif anchor != b"iteration":
                k, rest = split_prefix(head.decode("ascii") + anchor.decode())
                key = k if rest == anchor.decode() else None
            elif not head or head[-1] not in WORD:
                m = PREFIXES_RE.match(head)
                raw = m.group(0) if m else b""
                k, rest = split_prefix(raw.decode("ascii"))
                text = head[len(raw) - len(rest) :]
                if (not text or 0x20 <= text[0] < 0x7F) and not any(
                    w in text for w in (b"|", b"iteration", b"time (ms)", b"memory (MB)", b"#")
                ):
                    key = k
            if len(cache) < 65536:
                cache[head] = key
        return key  # type: ignore[return-value]

    @staticmethod
    def starts(block: bytes, pos: int, nl: np.ndarray, at: np.ndarray) -> np.ndarray:
        """The start of the line of each position ``at`` (``nl``: the newlines from ``pos``)."""
        j = np.searchsorted(nl, at) - 1
        return np.where(j >= 0, nl[np.maximum(j, 0)] + 1, pos)

    def keys(self, block: bytes, ls: np.ndarray, at: np.ndarray, anchor: bytes) -> list[Any]:
        """``head_key`` of each line's text from ``ls`` to ``at``."""
        width = at - ls
        w = int(width[0]) if len(width) else -1
        if 0 <= w <= 8 and (width == w).all() and int(ls.max()) + 8 <= len(block):
            # Launcher prefixes of one width (" 7: ", "63: " of 64 ranks): told apart as words.
            if w == 0:
                return [self.head_key(b"", anchor)] * len(ls)
            words = np.ndarray((len(block) - 7,), dtype="<u8", buffer=block, strides=(1,))
            got_w, which = np.unique(words[ls] & np.uint64((1 << (8 * w)) - 1), return_inverse=True)
            of = [self.head_key(int(g).to_bytes(8, "little")[:w], anchor) for g in got_w.tolist()]
            return list(map(of.__getitem__, which.tolist()))
        heads = list(map(block.__getitem__, map(slice, ls.tolist(), at.tolist())))
        got = list(map(self.heads.setdefault(anchor, {}).get, heads, repeat(MISSING)))
        if MISSING in got:
            got = [
                self.head_key(h, anchor) if k is MISSING else k
                for h, k in zip(heads, got, strict=True)
            ]
        return got

    def found(
        self,
        rx: re.Pattern[bytes],
        anchor: bytes,
        block: bytes,
        pos: int,
        T: int,
        nl: np.ndarray,
    ) -> tuple[Lines, list[list[bytes]]]:
        """The lines of [pos, T) that ``rx`` matches (``matches``), with their stream keys
        (``anchor``: the text where a record starts), those the line path reads otherwise
        not kept; and the texts of the pattern's groups."""
        at, le, groups = matches(rx, block, pos, T)
        if not len(at):
            return Lines.empty(), groups
        ls = self.starts(block, pos, nl, at)
        out = Lines(ls, le, self.keys(block, ls, at, anchor), {})
        out.keep = out.le - out.ls <= MAX_LINE_CHARS
        if None in out.keys:
            out.keep &= np.array([k is not None for k in out.keys], dtype=bool)
        return out, groups

    # -- the families ---------------------------------------------------------------------------

    def ds_lines(self, block: bytes, pos: int, T: int, nl: np.ndarray) -> Lines:
        """DeepSpeed ``[Rank N] time (ms) | name: value | ...`` lines of [pos, T); values by
        names in ``groups``, ``keep`` where taken."""
        out, (ranks, bodies) = self.found(DS_RE, b"[Rank", block, pos, T, nl)
        if not len(out):
            return out
        out.cols["rank"] = int_tokens(ranks)
        for form, idx, mine, joined in by_form(bodies):
            names = self.ds_names.get(form, MISSING)
            if names is MISSING:
                names = self._ds_names(mine[0])
                if len(self.ds_names) < 4096:
                    self.ds_names[form] = names
            if names is None:
                out.keep[idx] = False
                continue
            k = len(names)
            if DS_PLAIN.match(form):
                plain = _plain_values(joined, len(mine), k)
                if plain is not None:
                    out.groups.append((names, idx, plain))
                    continue
            vals, good = piece_rows(mine, joined, k, list(range(k)))  # (one by one where need be)
            out.keep[idx[~good]] = False
            if good.any():
                out.groups.append((names, idx[good], vals[good]))
        return out

    @staticmethod
    def _ds_names(body: bytes) -> tuple[str, ...] | None:
        """The names of a DeepSpeed line's body, or None when the line path reads the line as
        something else (a name twice, a word of another record) or it is not of ``DS_FORM``."""
        if any(w in body for w in (b"iteration", b"steps", b"iter", b"outcome")):
            return None
        if not DS_FORM.match(body.translate(None, DIGITS)):
            return None
        names = tuple(p.partition(b":")[0].strip().decode() for p in body.split(b"|"))
        ok = len(set(names)) == len(names) and not any(map(str.isdigit, "".join(names)))
        return names if ok else None

    def iteration_lines(self, block: bytes, pos: int, T: int, nl: np.ndarray) -> Lines:
        """Megatron ``iteration N/ M | key: value | ... |`` lines of [pos, T)."""
        out, (counters, rests) = self.found(IT_RE, b"iteration", block, pos, T, nl)
        n = len(out)
        if not n:
            return out
        keep = out.keep
        ints: set[str] = set()
        for form, idx, mine, joined in by_form(rests):
            fields = self.it_fields.get(form, MISSING)
            if fields is MISSING:
                rest = mine[0]
                fields = None
                if IT_FORM.match(form):
                    fields = iteration_fields(
                        [p.partition(b":")[0].decode() for p in rest.split(b"|")[:-1]]
                    )
                if len(self.it_fields) < 4096:
                    self.it_fields[form] = fields
            if fields is None:
                keep[idx] = False
                continue
            k, pieces = form.count(b":"), sorted(f[0] for f in fields)
            vals, good = piece_rows(mine, joined, k, pieces)
            keep[idx[~good]] = False
            for piece, f, is_int, factor in fields:
                v = vals[:, pieces.index(piece)]
                bad = ~np.isfinite(v)
                if is_int:
                    bad |= (v != np.floor(v)) | (np.abs(v) >= 2**53)
                    ints.add(f)
                elif factor != 1.0:
                    v = v * factor
                keep[idx[bad]] = False
                out.cols.setdefault(f, np.full(n, np.nan))[idx] = v
        both = int_tokens([b" ".join(counters).replace(b"/", b" ")]).reshape(n, 2)
        out.cols["iteration"], out.cols["train_iters"] = both.T.copy()
        out.ints = frozenset(ints)
        return out.select(keep)

    def steps_lines(self, block: bytes, pos: int, T: int, nl: np.ndarray) -> Lines:
        """PipelineEngine ``steps: N loss: L iter time (s): T samples/sec: S`` lines of
        [pos, T)."""
        out, groups = self.found(STEPS_RE, b"steps:", block, pos, T, nl)
        if not len(out):
            return out
        step, loss, secs, sps, _end = groups
        per_s = np.full(len(out), np.nan)
        given = np.flatnonzero(np.fromiter(map(len, sps), dtype=np.int64, count=len(out)))
        if len(given):
            per_s[given] = floats([sps[i][len(b" samples/sec: ") :] for i in given.tolist()])
        out.cols = {"step": int_tokens(step), "loss": floats(loss), "iter_ms": floats(secs) * 1e3}
        out.cols["samples_per_s"] = per_s
        return out.select(out.keep)

    def mem_lines(self, block: bytes, pos: int, T: int, nl: np.ndarray) -> Lines:
        """Megatron ``[Rank N] (after K iterations) memory (MB) | ...`` reports of [pos, T)."""
        out, (ranks, afters, bodies) = self.found(MEM_RE, b"[Rank", block, pos, T, nl)
        if not len(out):
            return out
        out.cols = {f: np.full(len(out), np.nan) for f in MEM_FIELDS.values()}
        for form, idx, mine, _ in by_form(bodies):
            first = mine[0].split(b"|")
            names = [x for x in (p.partition(b":")[0].strip().decode() for p in first) if x]
            vals = None
            if MEM_FORM.match(form) and len(set(names)) == len(names):
                text = b"\n".join(x.rstrip().rstrip(b"|") for x in mine)
                vals = _plain_values(text, len(idx), len(names))
            if vals is None:
                out.keep[idx] = False
                continue
            for j, name in enumerate(names):
                out.cols[MEM_FIELDS[name]][idx] = vals[:, j]
        out.cols["rank"] = int_tokens(ranks)
        out.cols["after_iteration"] = int_tokens(afters)
        return out.select(out.keep)

    def alloc_lines(self, block: bytes, pos: int, T: int, nl: np.ndarray) -> Lines:
        """DeepSpeed ``[Rank N] MemAllocated=..GB MaxMemAllocated=..GB ...`` lines of [pos, T)."""
        out, groups = self.found(ALLOC_RE, b"[Rank", block, pos, T, nl)
        if not len(out):
            return out
        rank, a, top, rests = groups
        out.keep &= np.array(
            [is_printable(r) and not any(w in r for w in _ALLOC_NOT) for r in rests], dtype=bool
        )
        out.cols = {
            "rank": np.array(list(map(int, rank)), dtype=np.int64),
            "allocated_mb": np.array(list(map(float, a))) * 1024.0,
            "max_allocated_mb": np.array(list(map(float, top))) * 1024.0,
        }
        return out.select(out.keep)
