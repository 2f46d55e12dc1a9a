"""How the bulk scanner reads runs of known lines and timer blocks in one pass each: a collaborator
of ``analysis.parse.scan.Bulk``.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Iterator
from itertools import repeat
from typing import Any

import numpy as np

from analysis.parse.lines import MAX_LINE_CHARS, split_prefix, to_float
from analysis.parse.rules import STEPS_RE, TIMER_LINE_RE, TIMER_NAME_RE, TIMER_RANK_RE
from analysis.parse.scan_blocks import GROUPS, START, BareBlocks, line_pattern
from analysis.parse.scan_bytes import (
    ALLOC_LIT,
    ALLOC_NOT,
    DIGITS,
    DS_LIT,
    DS_PROBES,
    FAST_MEM_PIECE_RE,
    HEAD_LIT,
    HEADS,
    IT_RE,
    LONG,
    MEM_BULK_HEAD,
    MEM_BULK_MIN,
    MEM_BULK_RE,
    MEM_FIELDS,
    MEM_HEAD_RE,
    MEM_LIT,
    MEMALLOC_RE,
    MISSING,
    OPEN,
    PRINTABLE,
    RANK_RE,
    STEPS_LIT,
    WORD,
    DSLines,
    ItLines,
    MemLines,
    StepLines,
    byte_pairs,
    ds_heads,
    ds_values,
    ds_values_fast,
    find_all,
    finite_float,
    is_printable,
    line_end,
    line_starts,
    lines_ending,
    other_glue,
    same_text,
    values_fast,
    word_array,
)

_STEPS_LINE_RE = re.compile(
    rb"steps:[ \t]*(\d+)[ \t]+loss:[ \t]*([^ \t\n]+)[^\n]*?iter time \(s\):[ \t]*([^ \t\n]+)"
    rb"(?:[ \t]+samples/sec:[ \t]*([^ \t\n]+))?"
)
"""``parse_rules.STEPS_RE`` on a line of printable ASCII without carriage returns (its
whitespace then spaces and tabs; ``BulkReaders.steps_fast``)."""
_STEPS_AT_RE = re.compile(rb"steps:")
"""Where ``_STEPS_LINE_RE`` can start."""
_PRINTABLE_NL = PRINTABLE + b"\n"

_BARE_MANY = 16
"""Timer block headers in a step from which they are read at once (``BlockPattern.read_bare``)."""


def _digit_in_a_key(rest: bytes) -> bool:
    """Whether a key of the ``| key: value |`` pieces of an iteration line holds a digit (the
    shape of a line has none: a line of a learned shape may hold one where the line it was
    learned from did not, and the line path reads that key as another)."""
    keys = b"".join(p.partition(b":")[0] for p in rest.split(b"|"))
    return len(keys.translate(None, DIGITS)) != len(keys)


def _lengths(items: list[bytes]) -> np.ndarray:
    """The length of each item (one count when they are all the same, as a rank is)."""
    if items and items.count(items[0]) == len(items):
        return np.full(len(items), len(items[0]), dtype=np.int64)
    return np.fromiter(map(len, items), dtype=np.int64, count=len(items))


class BulkReaders:
    """Block readers of the bulk path (module doc): a collaborator of ``Bulk``
    (``analysis.parse.scan``), whose state they read and update through ``host``."""

    def __init__(self, host: Any) -> None:
        self.host = weakref.proxy(host)
        """The ``analysis.parse.scan.Bulk`` reading the file (a weak reference: no cycle
        keeps it, and what it holds, alive once the file is read)."""

    def split_lines(
        self,
        parts: list[bytes],
        k: int,
        fixed: int,
        block: bytes,
        pos: int,
        nl: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray, list[str | None]]:
        """Starts, ends and stream keys of the lines a ``re.split`` at ``pos`` found: each
        match is ``[Rank``, its ``k`` groups and ``fixed`` bytes more, after the launcher
        prefixes of its line (the key None when the text before it is not only those).
        ``nl``: where the newlines from ``pos`` on are."""
        n = (len(parts) - 1) // (k + 1)
        ml = np.full(n, fixed, dtype=np.int64)
        for g in range(1, k + 1):
            ml += _lengths(parts[g :: k + 1])
        gl = np.fromiter(map(len, parts[0 :: k + 1]), dtype=np.int64, count=n + 1)
        start = pos + np.cumsum(gl[:n]) + np.concatenate([[0], np.cumsum(ml[:-1])])
        before = np.searchsorted(nl, start) - 1  # the newline before each match, or -1
        ls = np.where(before >= 0, nl[before] + 1, pos)
        return ls, start + ml, self.keys_of(block, ls, start)

    def prefix_key(self, raw: bytes) -> str | None:
        """The stream key of the text before a line's ``[Rank`` (None: not only prefixes)."""
        key = self.host.prefixes.get(raw, MISSING)
        return self.host.key(raw, b"[Rank") if key is MISSING else key  # type: ignore[return-value]

    def keys_of(self, block: bytes, ls: np.ndarray, start: np.ndarray) -> list[str | None]:
        """The stream key of the text from each line start to ``[Rank`` (None when it is not
        only launcher prefixes)."""
        # Most often the text before every match is the same (one launcher prefix): one key.
        raw = same_text(block, ls, start)
        if raw is not None:
            return [self.prefix_key(raw)] * len(ls)
        width = start - ls
        w = int(width[0])
        if 0 < w <= 8 and (width == w).all() and len(block) >= 8:
            # Prefixes of one width (" 7: ", "63: " of 64 ranks): told apart as words.
            mask = np.uint64((1 << (8 * w)) - 1)
            # (Each line goes on past its prefix: no word ends past the block.)
            got, which = np.unique(word_array(block)[ls] & mask, return_inverse=True)
            keys_of = [self.prefix_key(int(g).to_bytes(8, "little")[:w]) for g in got.tolist()]
            return list(map(keys_of.__getitem__, which.tolist()))
        raws = list(map(block.__getitem__, map(slice, ls.tolist(), start.tolist())))
        keys = list(map(self.host.prefixes.get, raws, repeat(MISSING)))
        if MISSING in keys:
            keys = [
                self.host.key(r, b"[Rank") if key is MISSING else key
                for r, key in zip(raws, keys, strict=True)
            ]
        return keys

    def ds_lines(self, block: bytes, pos: int, T: int, nl: np.ndarray) -> DSLines:
        """DeepSpeed ``[Rank N] time (ms) |`` lines of [pos, T) whose form the bulk path
        knows, converted (a look at a few bytes of each line, then maps: no Python step per
        line but a few).  Only lines whose ``[Rank`` is at an offset seen before are looked
        at (``ds_offsets``): another is left to the line path, which ends the step there, and
        the offset is looked at from then on (``_segment``)."""
        if not self.host.ds_offsets and self.host.ds_probes < DS_PROBES:
            # The first steps look for one in the text (a log without any stops looking).
            self.host.ds_probes += 1
            at = block.find(DS_LIT, pos, T)
            if at >= 0:
                self.host.ds_offset(block, block.rfind(b"\n", pos, at) + 1 or pos, T)
        starts = line_starts(pos, nl)
        idx, at, rank, bs = ds_heads(block, starts, nl, self.host.ds_offsets)
        n = len(idx)
        out = DSLines(n)
        if not n:
            return out
        ne = nl[idx]
        bodies = list(map(block.__getitem__, map(slice, bs.tolist(), ne.tolist())))
        joined = b"\n".join(bodies)
        out.ls = starts[idx]
        out.le = ne + 1
        out.keys = keys = self.keys_of(block, out.ls, at)
        out.keep = out.le - out.ls <= MAX_LINE_CHARS
        if None in keys:
            out.keep &= np.array([k is not None for k in keys], dtype=bool)
        # One translate of all bodies.
        shapes = joined.translate(None, DIGITS).split(b"\n")
        # Each shape's code: 2 x its group (the names it is read with) + whether its values
        # are plain decimals (``values_fast``); -1 for a shape not seen before.
        code_of = self.host.ds_codes
        codes = np.fromiter(map(code_of.get, shapes, repeat(-1)), dtype=np.int64, count=n)
        if (codes < 0).any():
            for i in np.flatnonzero(codes < 0).tolist():
                if shapes[i] not in code_of:
                    self.host.shapes.ds_shape(shapes[i], bodies[i], int(rank[i]))
            codes = np.fromiter(map(code_of.__getitem__, shapes), dtype=np.int64, count=n)
        gid = codes >> 1
        out.rank = rank
        names_of = self.host.ds_names
        flat = None
        if (codes & 1).all():  # all plain decimals: every line's values in one read
            counts = np.array([len(nm or ()) for nm in names_of], dtype=np.int64)[gid]
            flat = values_fast(joined, counts) if counts.all() else None
            first = np.cumsum(counts) - counts
        for g in np.flatnonzero(np.bincount(gid)).tolist():
            nm = names_of[g]
            idx = np.flatnonzero(gid == g)
            if nm is None:
                out.keep[idx] = False
                continue
            k = len(nm)
            if flat is not None:
                out.groups.append((nm, idx, flat[first[idx][:, None] + np.arange(k)]))
                continue
            mine = list(map(bodies.__getitem__, idx.tolist()))
            fast = bool((codes[idx] & 1).all())
            vals = ds_values_fast(mine, k) if fast else ds_values(mine, k)
            if vals is None:  # a value does not convert: look line by line
                rows = [ds_values([bodies[i]], k) for i in idx.tolist()]
                good = np.array([r is not None for r in rows], dtype=bool)
                out.keep[idx[~good]] = False
                idx = idx[good]
                vals = np.vstack([r for r in rows if r is not None]) if good.any() else None
            if vals is not None:
                out.groups.append((nm, idx, vals))
        return out

    def plain_lines(
        self, block: bytes, lit: bytes, pos: int, T: int
    ) -> Iterator[tuple[int, int, str, bytes]]:
        """The lines of [pos, T) holding ``lit`` whose content (after the launcher prefixes)
        is printable ASCII and not over-long: (start, end after the newline, stream,
        content)."""
        for ms, e in find_all(block, lit, pos, T, to_eol=True):
            ls = block.rfind(b"\n", pos, ms) + 1 or pos
            if e - ls > MAX_LINE_CHARS:
                continue
            key, c = self.host.line_key(block, ls, e - 1)
            if c < 0:
                continue
            text = block[c : e - 1].rstrip(b"\r\n")
            if is_printable(text):
                yield ls, e, key, text

    def steps_lines(self, block: bytes, pos: int, T: int, nl: np.ndarray) -> StepLines:
        """DeepSpeed PipelineEngine ``steps: N loss: L iter time (s): T samples/sec: S``
        lines of [pos, T) as ``Core._steps`` reads them (its pattern on the text, its
        conversions).  Lines that an earlier branch of ``Core._dispatch`` might take
        (``iteration``, a run outcome) are left to the line path.  ``nl``: where the newlines
        of [pos, T) are."""
        fast = self.steps_fast(block, pos, T, nl)
        if fast is not None:
            return fast
        out = []
        for ls, e, key, raw in self.plain_lines(block, STEPS_LIT, pos, T):
            if b"iter time" not in raw or b"iteration" in raw or b"# run outcome" in raw:
                continue
            m = STEPS_RE.search(raw.decode("ascii"))
            if m is None:
                continue
            secs = to_float(m.group(3))
            sps = to_float(m.group(4)) if m.group(4) else None
            loss = to_float(m.group(2))
            ms = secs * 1000.0 if secs is not None else None
            if len(m.group(1)) > 18:
                continue  # (not a step line for the line path either)
            out.append((ls, e, key, int(m.group(1)), loss, ms, sps))
        return StepLines.of_rows(out)

    def steps_fast(self, block: bytes, pos: int, T: int, nl: np.ndarray) -> StepLines | None:
        """``_steps_lines`` in one pass of a pattern over [pos, T) and a conversion of each
        field's values at once, when every line it finds is printable ASCII (no carriage
        return), one record long, with ``steps:`` after its launcher prefixes, no
        ``iteration`` or run outcome, and values ``float()`` reads; None otherwise (then they
        are read one by one)."""
        # Each match starts at a ``steps:``: when every one starts a match, the matches' groups
        # are in the order of those (no match holds a newline, so its line is the one it starts
        # in).  Else the matches are looked at one by one.
        found = _STEPS_LINE_RE.findall(block, pos, T)
        if not found:
            return StepLines.of_rows([])
        n = len(found)
        st = np.fromiter(map(START, _STEPS_AT_RE.finditer(block, pos, T)), dtype=np.int64)
        if len(st) != n:
            ms = list(_STEPS_LINE_RE.finditer(block, pos, T))
            found = list(map(GROUPS, ms))
            st = np.fromiter(map(START, ms), dtype=np.int64, count=n)
        # The line of each: from the newline before its start to the one after it, which must
        # be there (the line whole).
        j = np.searchsorted(nl, st)
        if not len(nl) or j[-1] >= len(nl):
            return None  # (a line not whole)
        ls = np.where(j > 0, nl[np.maximum(j - 1, 0)] + 1, pos)
        if (np.diff(ls) == 0).any():
            return None  # (two records in one line)
        le = nl[j] + 1
        if (le - ls).max() > MAX_LINE_CHARS:
            return None
        ls_l, le_l = ls.tolist(), le.tolist()
        text = b"".join(map(block.__getitem__, map(slice, ls_l, le_l)))
        # (No line holds what one holding newline-free words does not, and no word spans two.)
        if text.translate(None, _PRINTABLE_NL) or b"iteration" in text or b"# run outcome" in text:
            return None
        same = same_text(block, ls, st)
        if same is not None:
            heads = {same}
        else:
            heads = set(map(block.__getitem__, map(slice, ls_l, st.tolist())))
        keys: dict[bytes, str] = {}
        for head in heads:
            # The text before ``steps:`` must hold all of the line's launcher prefixes (the line
            # path looks for the pattern after them).
            key, c = self.host.line_key(head + b"steps:\n", 0, len(head) + 6)
            if c < 0 or c > len(head):
                return None
            keys[head] = key
        step, loss, secs, sps = zip(*found, strict=True)
        if max(map(len, step)) > 18:
            return None  # (a step number of 19 digits or more: not a step line)
        try:
            step_a = np.fromiter(map(int, step), dtype=np.int64, count=n)
            loss_a = np.fromiter(map(float, loss), dtype=float, count=n)
            secs_a = np.fromiter(map(float, secs), dtype=float, count=n)
            if None in sps or b"" in sps:  # (no samples/sec: None from a match, b"" from findall)
                sps_a = np.array([float(x) if x else np.nan for x in sps], dtype=float)
            else:
                sps_a = np.fromiter(map(float, sps), dtype=float, count=n)
        except (ValueError, OverflowError):
            return None  # (a value ``float`` does not read, such as ``1,5``: ``to_float`` does)
        for a in (loss_a, secs_a, sps_a):
            a[~np.isfinite(a)] = np.nan  # (``to_float``: None)
        if same is not None:
            key_l = [keys[same]] * n
        else:
            key_l = [keys[block[s:t]] for s, t in zip(ls_l, st.tolist(), strict=True)]
        return StepLines(ls, le, key_l, step_a, loss_a, secs_a * 1000.0, sps_a)

    def mem_lines(self, block: bytes, pos: int, T: int, nl: np.ndarray) -> MemLines:
        """Megatron ``memory (MB) |`` reports of [pos, T) the bulk path knows: in bulk
        (``_mem_bulk``) after a step that took many, else one by one."""
        if self.host.mem_many:
            bulk = self.mem_bulk(block, pos, T, nl)
            if bulk is not None:
                return bulk
        out: list[tuple[int, int, int | None, int | None, dict[str, float]]] = []
        for ls, e, _key, text in self.plain_lines(block, MEM_LIT, pos, T):
            shape = text.translate(None, DIGITS)
            names = self.host.mem_shapes.get(shape, MISSING)
            if names is MISSING:
                names = self.host.shapes.mem_shape(shape, text)
            if names is None:
                continue
            head, _, body = text.partition(b"memory (MB) |")
            hm = MEM_HEAD_RE.match(head)
            pairs = byte_pairs(body)
            if hm is None or pairs is None:
                continue
            vals = [finite_float(t) for t in pairs[1]]
            if None in vals:
                continue
            if tuple(n.decode() for n in pairs[0]) != names:
                continue  # a report of the shape whose names differ by a digit
            got = {MEM_FIELDS[n]: v for n, v in zip(pairs[0], vals, strict=True)}
            rank = int(hm.group(1)) if hm.group(1) else None
            after = int(hm.group(2)) if hm.group(2) else None
            out.append((ls, e, rank, after, got))
        self.host.mem_many = len(out) >= MEM_BULK_MIN
        return MemLines.of(out)

    def mem_bulk(self, block: bytes, pos: int, T: int, nl: np.ndarray) -> MemLines | None:
        """``_mem_lines`` when every report of [pos, T) is one rank's after some iterations,
        of a known shape, printable and with values that convert (as 64 ranks print them every
        few iterations), read as ``_ds_lines`` reads DeepSpeed's lines: a split and a few
        passes, no step per line.  None when one is not: then they are read one by one."""
        n = block.count(MEM_LIT, pos, T)
        if n < MEM_BULK_MIN:
            return None
        parts = MEM_BULK_RE.split(memoryview(block)[pos:T])
        if len(parts) != 4 * n + 1:
            return None
        ranks, afters, bodies = parts[1::4], parts[2::4], parts[3::4]
        joined = b"\n".join(bodies)
        if joined.translate(None, PRINTABLE + b"\n"):
            return None  # (a carriage return, or a byte the line-by-line reader looks at)
        ls, le, keys = self.split_lines(parts, 3, len(MEM_BULK_HEAD) + 1, block, pos, nl)
        if None in keys or (le - ls > MAX_LINE_CHARS).any():
            return None
        shapes = joined.translate(None, DIGITS).split(b"\n")
        ids = {sh: i for i, sh in enumerate(dict.fromkeys(shapes))}
        gid = np.fromiter(map(ids.__getitem__, shapes), dtype=np.int64, count=n)
        values = {f: np.full(n, np.nan) for f in MEM_FIELDS.values()}
        for sh, g in ids.items():
            idx = np.flatnonzero(gid == g)
            names = self.host.mem_shapes.get(MEM_BULK_HEAD + sh, MISSING)
            if names is MISSING:
                i = int(idx[0])
                text = b"[Rank %s] (after %s iterations) memory (MB) |%s" % (
                    ranks[i],
                    afters[i],
                    bodies[i],
                )
                names = self.host.shapes.mem_shape(MEM_BULK_HEAD + sh, text)
            if names is None:
                return None
            mine = list(map(bodies.__getitem__, idx.tolist()))
            if all(map(FAST_MEM_PIECE_RE.match, sh.split(b"|"))):  # (plain decimals)
                vals = ds_values_fast(mine, len(names))
            else:
                vals = ds_values(mine, len(names))
            if vals is None:
                return None
            for j, nm in enumerate(names):
                values[MEM_FIELDS[nm.encode()]][idx] = vals[:, j]
        return MemLines(ls, le, list(map(int, ranks)), list(map(int, afters)), values)

    def memalloc_lines(
        self, block: bytes, pos: int, T: int
    ) -> list[tuple[int, int, int | None, float, float]]:
        """DeepSpeed's ``MemAllocated=...GB MaxMemAllocated=...GB`` lines of [pos, T) that
        ``Core._dispatch`` reads as that and nothing else: (start, end, rank, allocated MiB,
        max allocated MiB)."""
        out = []
        for ls, e, _key, text in self.plain_lines(block, ALLOC_LIT, pos, T):
            if any(w in text for w in ALLOC_NOT):
                continue  # a line an earlier branch of ``_dispatch`` reads: the line path's
            m = MEMALLOC_RE.search(text)
            if m is None:
                continue
            try:
                allocated, top = float(m.group(1)) * 1024.0, float(m.group(2)) * 1024.0
            except ValueError:
                continue
            rank = RANK_RE.search(text)
            out.append((ls, e, int(rank.group(1)) if rank else None, allocated, top))
        return out

    def iteration_lines(self, block: bytes, pos: int, T: int, nl: np.ndarray) -> ItLines:
        """Megatron iteration lines of [pos, T) the bulk path knows.  ``nl``: where the
        newlines of [pos, T) are."""
        pieces, rest = self.host.shapes.iteration_patterns(
            block, lines_ending(block, pos, nl, b"|")
        )
        if not rest and len(pieces) == 1:  # every line that can be one is of one pattern
            return pieces[0]
        out = [row for piece in pieces for row in piece.rows()]
        found: list[tuple[int, int, int, int, bytes, list[tuple[int, str, str, float]], str]] = []
        for m in (m for s, e in rest for m in IT_RE.finditer(block, s, e)):
            st = m.start()
            if st > pos and block[st - 1] in WORD:  # (?<![\w-]) of the line path
                continue
            ls = block.rfind(b"\n", pos, st) + 1 or pos
            e = block.find(b"\n", m.end(), T)
            if e < 0 or e - ls > MAX_LINE_CHARS:
                continue
            key, c = self.host.line_key(block, ls, e)
            if c < 0 or c > st:
                continue
            text = block[c:e]
            if text[-1:] == b"\r":
                text = text.rstrip(b"\r\n")
            if not is_printable(text):
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
                or other_glue(text, rel)
            ):
                continue
            rest = text[rel + m.end() - st - 1 :]
            shape = rest.translate(None, DIGITS)
            fields = self.host.it_shapes.get(shape, MISSING)
            if fields is MISSING:
                fields = self.host.shapes.it_shape(shape, text, rest)
            if fields is None or _digit_in_a_key(rest):
                continue  # (a line of the shape whose keys differ from the learned ones by a digit)
            found.append((ls, e + 1, int(m.group(1)), int(m.group(2)), rest, fields, key))  # type: ignore[arg-type]
        by_shape: dict[int, list[int]] = {}
        for i, x in enumerate(found):
            by_shape.setdefault(id(x[5]), []).append(i)
        keep = [True] * len(found)
        got: list[dict[str, Any]] = [{} for _ in found]
        for idx in by_shape.values():
            fields = found[idx[0]][5]
            vals = self.host.shapes.iter_values(fields, [found[i][4] for i in idx])
            if vals is None:  # a value does not convert: look line by line
                for i in idx:
                    one = self.host.shapes.iter_values(fields, [found[i][4]])
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
        out += [
            (x[0], x[1], x[2], x[3], (tuple(got[i]), tuple(got[i].values())), x[6])
            for i, x in enumerate(found)
            if keep[i]
        ]
        if len(pieces) > 1 or (pieces and found):
            out.sort(key=lambda x: x[0])
        return ItLines.of_rows(out)

    def timer_blocks(
        self, block: bytes, pos: int, T: int, nl: np.ndarray
    ) -> tuple[
        int,
        BareBlocks,
        list[tuple[int, int, dict[str, Any] | None, str, Any]],
        list[tuple[int, int]],
        list[tuple[int, int]],
    ]:
        """Megatron timer blocks of [pos, T): the header, then the lines of its stream while
        they are timer lines; the first other line of the stream closes it.  Returns (T, the
        first blocks when one pattern read them at once, the other blocks as (header start,
        close, values, stream, flat values: ``BlockPattern.read``), their header lines,
        their body lines); T moves to the header of a block that does not close before it.
        A block printed in one piece like one read before is read by one match of that
        block's pattern.  ``nl``: where the newlines of [pos, T) are (a header is a line that
        ends in ``HEAD_LIT``: the line path reads no other as one)."""
        blocks: list[tuple[int, int, dict[str, Any] | None, str, Any]] = []
        headers: list[tuple[int, int]] = []
        bodies: list[tuple[int, int]] = []
        bare = BareBlocks.empty()
        hs, he = lines_ending(block, pos, nl, HEAD_LIT)
        pre: list[Any] = []  # each header's block as ``BlockPattern.read_bare`` read it
        if len(hs) >= _BARE_MANY:
            # Many headers of one text (one stream without prefixes, a block each iteration):
            # those one pattern reads, read at once; the first run of them kept as columns.
            hs_a, he_a = np.asarray(hs), np.asarray(he)
            head = same_text(block, hs_a, he_a + 1)
            tmpls = self.host.block_tmpls.get(head, ()) if head is not None else ()
            if tmpls:  # (the one ``read`` tries first: what it reads is what the loop takes)
                tp = tmpls[0]
                if tp.key:
                    taken, close, end, nums = tp.read_keyed(self.host, block, hs_a, pos, T, nl)
                else:
                    taken, close, nums = tp.read_bare(block, hs_a, T, nl)
                    end = close
                n = int(np.argmin(taken)) if not taken.all() else len(hs)
                bare = BareBlocks(hs_a[:n], he_a[:n] + 1, end[:n], close[:n], tp, nums[:n])
                if taken[n:].any():
                    assert tp.flat is not None  # (else none is taken)
                    names, shape = tp.flat
                    pre = [
                        ((ls, c, None, tp.key, (names, shape, row)), b) if t else None
                        for ls, c, b, t, row in zip(
                            hs[n:], close[n:].tolist(), end[n:].tolist(), taken[n:].tolist(),
                            nums[n:].tolist(), strict=True,
                        )
                    ]  # fmt: skip
                hs, he = hs[n:], he[n:]
        for i, (ls, e) in enumerate(zip(hs, he, strict=True)):
            if pre and pre[i] is not None:
                blocks.append(pre[i][0])
                headers.append((ls, e + 1))
                bodies.append((e + 1, pre[i][1]))  # (its lines: to the end of its body)
                continue
            got = None
            for tmpl in self.host.block_tmpls.get(block[ls : e + 1], ()):
                got = tmpl.read(self.host, block, ls, T)
                if got is not None:
                    break
            if got is None:
                key, c = self.host.line_key(block, ls, e)
                if c < 0:
                    continue
                text = block[c:e].rstrip()
                kind = HEADS.get(text) if is_printable(text) else None
                if kind is None or e - ls > MAX_LINE_CHARS:
                    continue
                got = self.read_block(block, ls, e, c, key, kind, T)
            if got is OPEN or got is LONG:  # not closed here: the line path reads it
                self.host.open_at_limit = got is OPEN
                return ls, bare, blocks, headers, bodies
            close, values, mine, key, flat = got  # type: ignore[misc]
            blocks.append((ls, close, values, key, flat))
            headers.append((ls, e + 1))
            bodies.extend(mine)
        # A header in the text after the last newline: it does not close here.
        tail = int(nl[-1]) + 1 if len(nl) else pos
        if block.find(HEAD_LIT, tail, T) >= 0:
            self.host.open_at_limit = True
            return tail, bare, blocks, headers, bodies
        return T, bare, blocks, headers, bodies

    def read_block(self, block: bytes, ls: int, e: int, c: int, key: str, kind: str, T: int) -> Any:
        """One timer block line by line: (close, values, body lines, stream, None), or
        OPEN."""
        values: dict[str, Any] = {}
        name: str | None = None
        q = e + 1
        mine: list[tuple[int, int]] = []
        recipe: list[tuple[bytes, str, str | None]] = []  # for a pattern of the block
        while q < T:
            le = line_end(block, q, T)
            if le >= T:
                return OPEN
            if le - q > MAX_LINE_CHARS:  # truncated by the line path: it reads this block
                return LONG
            k2, cs = self.host.line_key(block, q, le)
            s = q
            apart = k2 != key  # another stream's line: the next of this one is further on
            if apart:
                nxt = self.host.next_of_stream(block, key, le + 1, T)
                if nxt is None:
                    return OPEN
                s, le, cs = nxt
                if le - s > MAX_LINE_CHARS:
                    return LONG
            step = self.body_step(block, s, le, cs, kind, name, values)
            if step is None:
                # The block's lines followed one another (the line that closes it may come
                # after other streams' lines: ``BlockPattern.read`` looks for it so).
                if recipe is not None and mine and len(recipe) == len(mine):
                    self.host.shapes.learn(block, ls, c, kind, recipe, mine)
                return s, values, mine, key, None
            if apart:
                recipe = []  # not in one piece
            name, what = step
            if what is not None:
                recipe.append(what)
            mine.append((s, le + 1))
            q = le + 1
        return OPEN

    def body_step(
        self,
        block: bytes,
        s: int,
        le: int,
        cs: int,
        kind: str,
        name: str | None,
        values: dict[str, Any],
    ) -> tuple[str | None, tuple[bytes, str, str | None] | None] | None:
        """Read one line of a timer block's stream as ``Core._continue_block`` does: None
        when it closes the block, else (current name, how the line reads for a pattern)."""
        if self.host.timer_res is None:
            self.host.str_timer_res = (TIMER_LINE_RE, TIMER_NAME_RE, TIMER_RANK_RE, to_float)
            self.host.timer_res = tuple(
                re.compile(r.pattern.encode())
                for r in (TIMER_LINE_RE, TIMER_NAME_RE, TIMER_RANK_RE)
            )
        body: bytes | str = block[cs:le] if cs >= 0 else b"\x00"
        if body[-1:] == b"\r":
            body = body.rstrip(b"\r\n")  # type: ignore[arg-type]
        plain = is_printable(body)  # type: ignore[arg-type]
        if plain:
            (line_re, name_re, rank_re), num, dec = self.host.timer_res, finite_float, bytes.decode
        else:  # read as the line path does
            body = split_prefix(
                block[s:le].decode("utf-8", "replace")[:MAX_LINE_CHARS].rstrip("\r\n")
            )[1]
            line_re, name_re, rank_re, num = self.host.str_timer_res  # type: ignore[assignment]
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
                return name, (
                    line_pattern(raw, spans, cs - s),
                    "pair" if b is not None else "one",
                    n,
                )
        if kind == "times":
            r = rank_re.match(body)
            if r and name is not None:
                v = num(r.group(2))
                if v is None:
                    return name, (b"\x00", "skip", name)
                lo, hi = values.get(name, (v, v))
                values[name] = (min(lo, v), max(hi, v))
                return name, (line_pattern(raw, [r.span(2)], cs - s), "rank", name)
            nm = name_re.match(body)
            if nm:
                n = dec(nm.group(1).strip())
                return n, (re.escape(raw), "name", n)
        return None
