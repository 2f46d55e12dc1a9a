"""How the bulk scanner learns a log's line shapes (checked against the line path on first
sight) and turns them into patterns: a collaborator of ``analysis.parse.scan.Bulk``.
"""

from __future__ import annotations

import re
import weakref
from itertools import compress, repeat
from operator import itemgetter, methodcaller
from typing import Any

import numpy as np

from analysis.parse.lines import MAX_LINE_CHARS
from analysis.parse.machine import Core
from analysis.parse.scan_blocks import END, GROUPS, START, BlockPattern
from analysis.parse.scan_bytes import (
    DIGITS,
    FAST_PIECE_RE,
    IT_RE,
    MEM_FIELDS,
    MEM_HEAD_RE,
    NAME_RE,
    VALUE,
    IterPattern,
    ItLines,
    byte_pairs,
    finite_float,
    is_printable,
    same_text,
)


class BulkShapes:
    """Shape learning of the bulk path (module doc): a collaborator of ``Bulk``
    (``analysis.parse.scan``), whose learned shapes live in ``host``."""

    def __init__(self, host: Any) -> None:
        self.host = weakref.proxy(host)
        """The ``analysis.parse.scan.Bulk`` reading the file (a weak reference: no cycle
        keeps it, and what it holds, alive once the file is read)."""

    def ds_shape(self, shape: bytes, body: bytes, rank: int) -> None:
        """Learn a new DeepSpeed line shape (``ds_codes``): the names it is read with, when
        the line path reads it the same way."""
        result = None
        fast = False
        pairs = byte_pairs(body)
        if pairs is not None and len(self.host.ds_codes) < 4096:
            names, tokens = pairs
            vals = [finite_float(t) for t in tokens]
            if (
                all(NAME_RE.match(n) for n in names)
                and len(set(names)) == len(names)
                and None not in vals
                and not any(w in body for w in (b"iteration", b"steps", b"iter", b"outcome"))
                and is_printable(body)
            ):
                want = dict(zip((n.decode() for n in names), vals, strict=True))
                core = self.host.probe(f"[Rank {rank}] time (ms) |" + body.decode())
                blocks = list(core.run.ds_blocks.table)
                if len(blocks) == 1 and not core.run.problems and not core.run.iterations:
                    b = blocks[0]
                    if b.values_ms == want and b.rank == rank and b.line == 1:
                        result = tuple(want)
                        fast = all(FAST_PIECE_RE.match(p) for p in shape.split(b"|"))
        if result not in self.host.ds_names:
            self.host.ds_names.append(result)
        self.host.ds_codes[shape] = 2 * self.host.ds_names.index(result) + fast

    def mem_shape(self, shape: bytes, text: bytes) -> tuple[str, ...] | None:
        """Names of a new memory report shape, when the line path reads it the same way."""
        result = None
        head, _, body = text.partition(b"memory (MB) |")
        m = MEM_HEAD_RE.match(head)
        pairs = byte_pairs(body)
        if m is not None and pairs is not None and len(self.host.mem_shapes) < 4096:
            names, tokens = pairs
            vals = [finite_float(t) for t in tokens]
            if all(n in MEM_FIELDS for n in names) and len(set(names)) == len(names):
                core = self.host.probe(text.decode())
                mem = list(core.run.memory)
                want = {MEM_FIELDS[n]: v for n, v in zip(names, vals, strict=True)}
                if (
                    None not in vals
                    and len(mem) == 1
                    and not core.run.problems
                    and not core.run.iterations
                    and mem[0].rank == (int(m.group(1)) if m.group(1) else None)
                    and mem[0].after_iteration == (int(m.group(2)) if m.group(2) else None)
                    and mem[0].kind == "megatron"
                    and all(getattr(mem[0], f) == want.get(f) for f in MEM_FIELDS.values())
                ):
                    result = tuple(n.decode() for n in names)
        self.host.mem_shapes[shape] = result
        return result

    def it_shape(
        self, shape: bytes, text: bytes, rest: bytes
    ) -> list[tuple[int, str, str, float]] | None:
        """Which piece of a new iteration line shape feeds which Iteration field, found by
        giving each piece its own value and reading the line path's record."""
        result = None
        pieces = rest.split(b"|")
        middle = pieces[1:-1]
        if (
            len(self.host.it_shapes) < 4096
            and pieces[0] == b""
            and pieces[-1].strip() == b""
            and all(p.count(b":") == 1 for p in middle)
        ):
            names = [p.partition(b":")[0] for p in middle]
            toks = [p.partition(b":")[2] for p in middle]
            if not any(d in n for n in names for d in DIGITS) and all(
                finite_float(t) is not None for t in toks
            ):
                head = text[: len(text) - len(rest)].decode()
                probe = [1000 + 7 * i for i in range(len(names))]
                line = (
                    head
                    + "|"
                    + "|".join(f"{n.decode()}: {v}" for n, v in zip(names, probe, strict=True))
                    + "|"
                )
                core = self.host.probe(line)
                real = self.host.probe(text.decode())
                fields = self.mapping(core, probe)
                if fields is not None and len(real.run.iterations) == 1 and not real.run.problems:
                    cols = self.iter_values(fields, [rest])
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
                    m = IT_RE.search(text)
                    if (
                        same
                        and others
                        and m
                        and (it.iteration, it.train_iters) == (int(m.group(1)), int(m.group(2)))
                    ):
                        result = fields
                        self.learn_iteration(text[m.start() :], rest, fields)
        self.host.it_shapes[shape] = result
        return result

    def learn_iteration(
        self, text: bytes, rest: bytes, fields: list[tuple[int, str, str, float]]
    ) -> None:
        """Keep a pattern of an iteration line shape the line path reads as ``fields``: the
        keys as printed, the numbers as groups (``_iteration_patterns`` then reads such lines)."""
        if len(self.host.it_tmpls) >= 4 or any(
            t.rx.match(text + b"\n") for t in self.host.it_tmpls
        ):
            return
        pat = rb"iteration( +)(\d+)/( *)(\d+)( *)\|"
        fast = rb"iteration +(\d+)/ *(\d+) *\|"
        used = sorted({piece for piece, *_r in fields})
        for i, piece in enumerate(rest.split(b"|")[1:-1], start=1):
            key = re.escape(piece.partition(b":")[0] + b":")
            pat += key + VALUE + rb"\|"
            fast += key + (VALUE if i in used else b"(?:" + VALUE[1:]) + rb"\|"
        rx = re.compile(pat + rb"([ \t]*\r?)\n")
        m = rx.match(text + b"\n")
        if m is None:  # a value not in plain decimals: such lines are read one by one
            return
        fast += rb"[ \t]*\r?\n"
        self.host.it_tmpls.append(
            IterPattern(rx, fields, re.compile(fast), tuple(used), re.compile(b"(" + fast + b")"))
        )

    @staticmethod
    def mapping(core: Core, probe: list[int]) -> list[tuple[int, str, str, float]] | None:
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
    def iter_values(
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

    def iteration_patterns(
        self, block: bytes, lines: tuple[list[int], list[int]]
    ) -> tuple[list[ItLines], list[tuple[int, int]]]:
        """Iteration lines of the learned patterns among ``lines`` (starts, newlines: the lines
        of a segment that can be iteration lines), those of each pattern read; the lines none
        of them took.  A pattern is looked for in each line from its start (its first
        match there, as at each ``IT_RE`` match: one such line holds no second)."""
        out: list[ItLines] = []
        line_of, nls = lines
        if not self.host.it_tmpls or not line_of:
            return out, list(zip(line_of, nls, strict=True))
        starts = np.asarray(line_of, dtype=np.int64)
        newline = np.asarray(nls, dtype=np.int64)
        free = np.ones(len(line_of), dtype=bool)
        lo, hi = line_of[0], nls[-1] + 1
        dense = 2 * int((newline - starts).sum()) > hi - lo
        for tp in self.host.it_tmpls:
            if not free.any():
                break
            # One search through the lines: a match holds no newline but the one it ends
            # with, so each is in one line, the first of the pattern in that line (as a search
            # of the line alone finds), and in a line that ends in ``|``: one of ``lines``.
            # When every one of them holds a match, the matches are theirs in order: their
            # groups come as tuples (``findall``, no match object each), the whole match first
            # (its length: where it starts).  When those lines are a small part of the text, a
            # search of each instead.
            rows = tp.whole.findall(block, lo, hi) if dense and free.all() else []
            if rows and len(rows) == len(line_of):
                whole, *groups = zip(*rows, strict=True)
                line = np.arange(len(rows))
                ends = newline + 1
                st = ends - np.fromiter(map(len, whole), dtype=np.int64, count=len(rows))
            else:
                if dense:
                    found = list(tp.fast.finditer(block, lo, hi))
                else:
                    at = np.flatnonzero(free).tolist()
                    found = [
                        m
                        for m in map(
                            tp.fast.search,
                            repeat(block),
                            map(line_of.__getitem__, at),
                            [nls[i] + 1 for i in at],
                        )
                        if m is not None
                    ]
                if not found:
                    continue
                st = np.fromiter(map(START, found), dtype=np.int64, count=len(found))
                ends = np.fromiter(map(END, found), dtype=np.int64, count=len(found))
                line = np.searchsorted(starts, st, side="right") - 1
                mine = newline[line] + 1 == ends
                mine &= free[line]
                if not mine.all():
                    found = list(compress(found, mine.tolist()))
                    line, st, ends = line[mine], st[mine], ends[mine]
                if not found:
                    continue
                groups = list(zip(*map(GROUPS, found), strict=True))
            n = len(line)
            ls = starts[line]
            # Most often every line's text before ``iteration`` is the same: looked at once.
            head = same_text(block, ls, st)
            if head is not None:
                heads = None
                ok = np.full(n, self.host.it_head(head), dtype=bool)
            else:
                heads = list(map(block.__getitem__, map(slice, ls.tolist(), st.tolist())))
                ok = np.array(list(map(self.host.it_head, heads)), dtype=bool)
            ok &= ends - ls <= MAX_LINE_CHARS
            if not ok.any():
                continue
            # The groups: number, total and the value of each piece a field is read from.
            col = {piece: 2 + k for k, piece in enumerate(tp.pieces)}
            cols = []
            for piece, f, kind, factor in tp.fields:
                toks = groups[col[piece]]
                try:
                    vals = np.fromiter(map(float, toks), dtype=float, count=n)
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
            if not len(sel):
                continue
            if heads is None:
                keys = [self.host.head_key(head)] * len(sel) if len(sel) else []
            else:
                keys = list(map(self.host.head_key, map(heads.__getitem__, sel.tolist())))
            out.append(
                ItLines(
                    ls[sel],
                    ends[sel],
                    np.fromiter(map(int, groups[0]), dtype=np.int64, count=n)[sel],
                    np.fromiter(map(int, groups[1]), dtype=np.int64, count=n)[sel],
                    keys,
                    tuple(f for f, _k, _v in cols),
                    np.array([v[sel] for _f, _k, v in cols], dtype=float).reshape(-1, len(sel)).T,
                    tuple(kind == "int" for _f, kind, _v in cols),
                )
            )
            free[line[sel]] = False
        return out, [(line_of[i], nls[i]) for i in np.flatnonzero(free).tolist()]

    def learn(
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
        known = self.host.block_tmpls.get(head, [])
        if len(known) >= 8 or any(p == b"\x00" or how == "skip" for p, how, _n in recipe):
            return
        if not is_printable(head.rstrip(b"\n")):
            return  # (not one line: the block is looked up by its header line alone)
        self.host.block_tmpls[head] = known
        pattern = re.escape(head) + b"".join(p + b"\n" for p, _h, _n in recipe)
        # The same with any lines that do not start with its launcher prefixes between its
        # lines (none for a stream without prefixes: every line might be one of its own).
        prefix = block[ls:c]
        apart = None
        if prefix:
            other = rb"(?:(?!" + re.escape(prefix) + rb")[^\n]*\n)*"
            apart = re.compile(
                re.escape(head) + b"".join(other + p + b"\n" for p, _h, _n in recipe)
            )
        known.append(
            BlockPattern(
                re.compile(pattern),
                kind,
                [(h, n) for _p, h, n in recipe],
                self.host.line_key(block, ls, e)[0],
                apart,
                prefix,
            )
        )
