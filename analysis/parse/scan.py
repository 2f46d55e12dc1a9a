"""The bulk path of the file reader (``analysis.parse.reader.drive_file``, which feeds a log to
the line state machine ``Core``): the frequent line kinds of a training phase read in bulk.

Two paths, one result:

- the line path: every line that can matter goes through ``Core.feed``.  Until training starts,
  after it ends and while a multi-line block is open, that is every line; during training it is
  the lines holding a keyword (found with ``bytes.find`` over whole chunks, anchored on a rare
  byte of each keyword), and the lines of a stream whose Megatron timer block is open.
- the bulk path (``Bulk``), during training while no block is open: over a segment of the
  chunk, a look at a few bytes of each line (from the newline positions) finds the frequent
  lines (DeepSpeed ``[Rank N] time (ms) | k: v`` lines at the offsets of ``[Rank`` seen before,
  Megatron iteration lines among the lines that end in ``|``, timer block headers among those
  that end in ``across ranks (ms):``), regular expressions the rarer ones (``memory (MB) |``
  reports, DeepSpeed's ``MemAllocated=`` lines) and each line's learned pattern reads it;
  their values are converted column-wise, and they are added to the run's typed columns in
  one step.  Every other line
  of the segment is scanned for keywords; the first one that holds one ends the segment there
  and goes to the line path, as does
  anything the bulk path does not recognise in its exact form (a glued, wrapped, non-ASCII or
  otherwise unusual line, a counter going back, the final iteration).  The form of each new
  kind of line ("shape": the line with its digits removed) is checked once against the line
  path itself before the bulk path takes lines of that shape.

``tests/test_parse_engine.py`` checks that both paths give the same runs.
"""

from __future__ import annotations

import re
from array import array
from itertools import compress
from typing import Any

import numpy as np

from analysis.parse.keywords import Keywords
from analysis.parse.lines import MAX_LINE_CHARS, split_prefix
from analysis.parse.machine import Core
from analysis.parse.records import Memory, TimerBlock, timer_shape
from analysis.parse.rules import StreamState
from analysis.parse.scan_blocks import BareBlocks, BlockPattern
from analysis.parse.scan_bytes import (
    ALLOC_AFTER,
    DS_AFTER,
    DS_LIT,
    DS_OFFSETS,
    MISSING,
    PREFIXES_RE,
    SEG_MAX,
    SEG_MIN,
    SEG_START,
    SHORT_BYTES,
    SHORT_LINES,
    SPARSE_BYTES,
    SPARSE_LINES,
    WORD,
    IterPattern,
    MemLines,
    StepLines,
    ds_group_values,
    is_printable,
    line_end,
)
from analysis.parse.scan_readers import BulkReaders
from analysis.parse.scan_shapes import BulkShapes

_MEM_IDLE = 2
"""Steps in a row without a Megatron memory report after which they are not looked for."""


class _Spans:
    """Spans of bytes that do not overlap (the lines timer blocks took: a line each, or the
    lines of a block printed in one piece), as starts and ends in any order."""

    def __init__(self, starts: np.ndarray, ends: np.ndarray) -> None:
        order = np.argsort(starts, kind="stable")
        self.starts, self.ends = starts[order], ends[order]

    def holds(self, at: Any) -> np.ndarray:
        """Whether each position of ``at`` falls in a span."""
        at = np.asarray(at, dtype=np.int64)
        i = np.searchsorted(self.starts, at, side="right") - 1
        return (i >= 0) & (at < self.ends[np.maximum(i, 0)])


class Bulk:
    """The bulk path over one file (module doc)."""

    def __init__(self, core: Core, kw: Keywords) -> None:
        self.core = core
        self.readers = BulkReaders(self)
        """Its block readers."""
        self.shapes = BulkShapes(self)
        """Its shape learning."""
        self.kw = kw
        # Where ``[Rank`` of DeepSpeed's lines was in the lines, from their starts: the
        # offsets their lines are looked for at (``_ds_lines``).
        self.ds_offsets: list[int] = []
        self.ds_probes = 0  # steps that searched for one while none was known
        # DeepSpeed's ``MemAllocated=`` lines are read in bulk once the line path has read a
        # few (a log that prints them every few steps): before, no bulk step looks for them.
        self.alloc = False
        # Every keyword, looked for in the lines a step does not take (``_first_keyword``).
        self.keywords = Keywords(kw.keywords)
        self.seg = SEG_START
        self.line_budget = 0  # bytes the line path reads before the bulk path tries again
        self.sparse = 0  # bulk steps in a row that took few lines
        self.short = 0  # bulk steps in a row that stopped soon after their start
        self.taken = 0  # lines the last bulk step took (``_segment``)
        self.open_at_limit = False  # the last look ended in an open timer block
        self.open_block = -1  # where that block starts, when the step ended there
        # Launcher prefixes as printed -> stream key, or None when not only prefixes.  The
        # contents they are checked with ("[Rank", a timer header) are never read as one.
        self.prefixes: dict[bytes, str | None] = {}
        # Shapes (a line with its digits removed) -> names, or None: not taken in bulk.
        # A DeepSpeed line's shape -> 2 x its group + whether its values are plain decimals
        # (``values_fast``); a group: the names its lines are read with, or None.
        self.ds_codes: dict[bytes, int] = {}
        self.ds_names: list[tuple[str, ...] | None] = []
        self.mem_shapes: dict[bytes, tuple[str, ...] | None] = {}
        self.mem_many = False  # the last step read many memory reports: try them in bulk
        self.mem_idle = 0  # steps in a row that found no memory report
        self.mem_read = 0  # memory reports of the run when the last step ended
        # -> [(piece, Iteration field, "int" | "float", factor)], or None.
        self.it_shapes: dict[bytes, list[tuple[int, str, str, float]] | None] = {}
        self.it_tmpls: list[IterPattern] = []
        self.it_heads: dict[bytes, bool] = {}  # text before "iteration" -> takeable
        self.head_keys: dict[bytes, str] = {}  # such text -> stream key (``_head_key``)
        self.stream_res: dict[str, re.Pattern[bytes]] = {}
        # Lines found by a stream's pattern -> (stream key, where the content starts in the
        # line, or -1), as ``_line_key`` gives them.
        self.line_keys: dict[bytes, tuple[str, int]] = {}
        # Prefix runs as matched by PREFIXES_RE -> (key, length that really is prefixes).
        self.prefix_runs: dict[bytes, tuple[str, int]] = {}
        self.timer_res: tuple[re.Pattern[bytes], ...] | None = None
        self.str_timer_res: tuple[Any, ...] = ()
        # A timer block's header line as printed -> patterns of whole blocks seen after it.
        self.block_tmpls: dict[bytes, list[BlockPattern]] = {}

    # -- checks against the line path -------------------------------------------------------

    def key(self, raw: bytes, content: bytes) -> str | None:
        key = self.prefixes.get(raw, MISSING)
        if key is MISSING:
            key = None
            if b"\x1b" not in raw and b"\x00" not in raw:
                text = (raw + content).decode("utf-8", "replace")
                k, rest = split_prefix(text)
                if rest == content.decode("utf-8", "replace"):
                    key = k
            self.prefixes[raw] = key
        return key  # type: ignore[return-value]

    def probe(self, line: str) -> Core:
        """A fresh state machine in its training phase that has read ``line``."""
        core = Core(self.core.source)
        core.run.training = True
        core.feed(1, line)
        return core

    # -- streams ----------------------------------------------------------------------------

    def line_key(self, block: bytes, s: int, e: int) -> tuple[str, int]:
        """Stream key of the line ``block[s:e]`` and where its content starts (-1 when the
        content does not start with plain ASCII: then only the key is known)."""
        m = PREFIXES_RE.match(block, s, e)
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

    def kept_key(self, block: bytes, s: int, e: int) -> tuple[str, int]:
        """``_line_key`` of the line ``block[s:e]`` as (key, offset of its content or -1),
        kept by the line's bytes (a stream's lines repeat)."""
        line = block[s:e]
        got = self.line_keys.get(line)
        if got is None:
            k, c = self.line_key(block, s, e)
            if len(self.line_keys) >= 4096:
                self.line_keys.clear()
            got = self.line_keys[line] = (k, c - s if c >= 0 else -1)
        return got

    def next_of_stream(
        self, block: bytes, key: str, q: int, end: int
    ) -> tuple[int, int, int] | None:
        """The next line at or after ``q`` (a line start) of stream ``key``: (start, end,
        start of its content, or -1 when not plain ASCII); None if none before ``end``."""
        if key:
            pat = self.stream_res.get(key)
            if pat is None:
                label = re.escape(key.split("|")[0].encode())
                pat = self.stream_res[key] = re.compile(
                    rb"\n(?:\s{0,4}"
                    + label
                    + rb":\s|\["
                    + label
                    + rb"\]:|\[\d{1,9},"
                    + label
                    + rb"\]<std(?:out|err)>:)"
                )
            p = q - 1
            while True:
                m = pat.search(block, p, end)
                if m is None:
                    return None
                s = m.start() + 1
                e = block.find(b"\n", s, end)
                if e < 0:
                    return None
                got = self.kept_key(block, s, e)
                if got[0] == key:
                    return s, e, s + got[1] if got[1] >= 0 else -1
                p = e
        s = q
        while s < end:
            e = line_end(block, s, end)
            if e >= end:
                return None
            k, c = self.line_key(block, s, e)
            if k == "":
                return s, e, c
            s = e + 1
        return None

    # -- one segment ------------------------------------------------------------------------

    def advance(self, block: bytes, pos: int, end: int, lineno: int) -> tuple[int, int, bool]:
        """Take the lines from ``pos`` (a line start) in bulk up to the first one the line
        path must read.  Returns (position, line number there, whether the line there must be
        read by the line path)."""
        if not self.alloc and len(self.core.run.memory_other) >= ALLOC_AFTER:
            self.alloc = True
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
        # A line holding another keyword (an error, a launcher exit, DeepSpeed's
        # see_memory_usage line) ends the step when it is not one the step takes:
        # ``_first_keyword`` finds the first such line among the others.  (In one it takes,
        # such a keyword changes nothing: ``Core._dispatch`` reads each kind of line taken in
        # bulk before it looks for failures and launcher exits, and the lines of an open
        # timer block before it dispatches them.)
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
        if T - pos >= SEG_START and self.taken * 1e6 < SPARSE_LINES * (T - pos):
            # Sparse again and again: look less and less often (up to 8 x SPARSE_BYTES).
            self.line_budget = SPARSE_BYTES << min(self.sparse, 3)
            self.sparse += 1
            self.seg = SEG_START // 8  # the next look is a small one again
        elif T - pos >= SEG_START:
            self.sparse = 0
        # A step that took fewer than SHORT_LINES lines and stopped in the first quarter of
        # what it looked at, again and again (a line the bulk path does not take every other
        # line): the line path reads a stretch, longer each time, before the bulk path looks
        # again (each look costs what it looked at, not what it took).
        took = self.lineno_at - lineno if pos < T else 0
        if took < SHORT_LINES and (T - pos) * 4 < limit - pos:
            self.short += 1
            if self.short >= 2:
                stretch = SHORT_BYTES << min(self.short - 2, 7)
                self.line_budget = max(self.line_budget, min(stretch, SPARSE_BYTES))
        else:
            self.short = 0
        if pos >= T:
            self.seg = max(SEG_MIN, self.seg // 2)
            return pos, lineno, True
        # (A step that ended before a timer block open at its limit read all it looked at.)
        whole = seg_end <= T or self.open_block == T
        self.seg = min(SEG_MAX, self.seg * 2) if whole else max(SEG_MIN, self.seg // 2)
        return T, self.lineno_at, seg_end > T

    def _segment(
        self, block: bytes, pos: int, limit: int, lineno: int, can_grow: bool = False
    ) -> int | None:
        """Read [pos, limit) in bulk up to the first line for the line path; add what was read
        to the run; return where it stopped (``self.lineno_at``: the line number there)."""
        run = self.core.run
        # Timer blocks first: the step ends before one that does not close by the limit (or,
        # when that is its first line and it may, looks at more bytes); the other readers then
        # read only up to there.
        self.open_at_limit = False
        # Where the newlines of [pos, limit) are (the readers' line starts, the line numbers).
        nl = (
            np.flatnonzero(
                np.frombuffer(block, dtype=np.uint8, count=limit - pos, offset=pos) == 10
            )
            + pos
        )
        T, bare, blocks, headers, bodies = self.readers.timer_blocks(block, pos, limit, nl)
        if self.open_at_limit and can_grow and pos >= T:
            return None  # look at more bytes (nothing was added)
        self.open_block = T if self.open_at_limit else -1
        if limit > T:
            nl = nl[: np.searchsorted(nl, T)]
        ds = self.readers.ds_lines(block, pos, T, nl)
        # Megatron prints its memory report once in most runs: after steps that found none
        # the report is not looked for, until the line path reads one (a step holding one
        # ends there, at its keyword).
        if self.mem_idle < _MEM_IDLE or len(run.memory) != self.mem_read:
            mem = self.readers.mem_lines(block, pos, T, nl)
            self.mem_idle = 0 if len(mem) else self.mem_idle + 1
        else:
            mem = MemLines.of([])
        alloc = self.readers.memalloc_lines(block, pos, T) if self.alloc else []
        # PipelineEngine step lines, once the line path read one (a run with them).
        steps = StepLines.of_rows([])
        if len(run.steps):
            steps = self.readers.steps_lines(block, pos, T, nl)
        its = self.readers.iteration_lines(block, pos, T, nl)
        # The blocks' starts and closes; their header and body lines.
        b_start = np.concatenate([bare.hs, np.array([b[0] for b in blocks], dtype=np.int64)])
        b_close = np.concatenate([bare.close, np.array([b[1] for b in blocks], dtype=np.int64)])
        hdr = np.array(headers, dtype=np.int64).reshape(-1, 2)
        body = np.array(bodies, dtype=np.int64).reshape(-1, 2)
        lines_s = np.concatenate([bare.hs, bare.body, hdr[:, 0], body[:, 0]])
        lines_e = np.concatenate([bare.body, bare.end, hdr[:, 1], body[:, 1]])
        if len(bare) or bodies:  # lines a timer block took are not read as anything else
            taken = _Spans(
                np.concatenate([bare.body, body[:, 0]]), np.concatenate([bare.end, body[:, 1]])
            )
            ds.keep &= ~taken.holds(ds.ls)
            mem = mem.select(~taken.holds(mem.ls))
            if alloc:
                alloc = list(compress(alloc, (~taken.holds([x[0] for x in alloc])).tolist()))
            if len(steps):
                steps = steps.select(~taken.holds(steps.ls))
            if len(its):
                its = its.select(~taken.holds(its.ls))

        # The first line the line path must read: one holding a keyword among the others.
        k = ds.keep
        alloc_s = np.array([x[0] for x in alloc], dtype=np.int64)
        alloc_e = np.array([x[1] for x in alloc], dtype=np.int64)
        span_s = np.concatenate([ds.ls[k], mem.ls, its.ls, steps.ls, lines_s, alloc_s])
        span_e = np.concatenate([ds.le[k], mem.le, its.le, steps.le, lines_e, alloc_e])
        R = self._first_keyword(block, pos, T, span_s, span_e)
        if R is not None:
            T = min(T, R)
            self.ds_offset(block, R, limit)

        # Iteration numbers must go up; a repeat changes nothing; the final iteration, or a
        # counter going back, is for the line path.
        top = run.max_iter
        repeated = False
        inside = its.ls < T
        if (
            inside.all()
            and len(its)
            and its.number[0] > top
            and (np.diff(its.number) > 0).all()
            and (its.number < its.total).all()
        ):
            new_its = its  # (all go up: most often)
        else:
            new = []
            for i, (start, number, total) in enumerate(
                zip(its.ls.tolist(), its.number.tolist(), its.total.tolist(), strict=True)
            ):
                if start >= T:
                    break
                if top < number < total:
                    new.append(i)
                    top = number
                elif number == top and top >= 0:
                    repeated = True
                else:
                    T = start
                    break
            new_its = its.select(np.array(new, dtype=np.int64))
        # Timer blocks must close before T.
        while True:
            across = (b_start < T) & (b_close > T)
            if not across.any():
                break
            T = int(b_start[across].min())
        if pos >= T:
            return pos
        if len(new_its) and new_its.ls[-1] >= T:
            new_its = new_its.select(new_its.ls < T)
        if len(b_start) and b_start[-1] >= T:
            kept, nb = b_start < T, len(bare)
            bare = bare.select(kept[:nb])
            blocks = list(compress(blocks, kept[nb:].tolist()))
            b_start, b_close = b_start[kept], b_close[kept]
        mem = mem.select(mem.ls < T)
        alloc = [x for x in alloc if x[0] < T]
        steps = steps.select(steps.ls < T)
        ds.keep &= ds.ls < T

        # Lines taken: a timer block counts its lines (64 ranks' ``--timing-log-option all``
        # block is one record of 130 lines, which the line path would read one by one).
        block_lines = int((np.searchsorted(nl, b_close) - np.searchsorted(nl, b_start)).sum())
        self.taken = (
            len(new_its) + int(ds.keep.sum()) + len(mem) + block_lines + len(alloc) + len(steps)
        )

        def lines_at(starts: Any) -> np.ndarray:
            return lineno + np.searchsorted(nl, np.asarray(starts, dtype=np.int64))

        it_pos, it_num = new_its.ls, new_its.number
        # Per stream (launcher prefix): iteration lines printed before the segment, and the
        # numbers of those of the segment (timer blocks are placed among their own stream's).
        before = {k: len(v) for k, v in run.iter_numbers.items()}
        last_of = {k: int(v[-1]) for k, v in run.iter_numbers.items() if len(v)}
        it_keys = new_its.keys
        it_ids = {k: i for i, k in enumerate(dict.fromkeys(it_keys))}
        it_sid = np.fromiter(map(it_ids.__getitem__, it_keys), dtype=np.int64, count=len(it_keys))
        last_before = run.last_iter
        if len(new_its):
            cols: dict[str, Any] = {}
            by_field: dict[str, Any]
            rows = new_its.fields  # (else one pattern's table)
            names = new_its.names if rows is None else rows[0][0]
            if rows is None:
                by_field = dict(zip(names, new_its.table.T, strict=True))  # type: ignore[union-attr,arg-type]
            elif all(x[0] == names for x in rows):  # one shape: transpose in one step
                table = np.array([x[1] for x in rows], dtype=float).reshape(-1, len(names))  # type: ignore[arg-type]
                by_field = dict(zip(names, table.T, strict=True))  # type: ignore[arg-type]
            else:
                dicts = [dict(zip(*x, strict=True)) for x in rows]
                fields = {f for d in dicts for f in d}
                by_field = {f: [d.get(f) for d in dicts] for f in fields}
            for f, vals in by_field.items():
                if isinstance(vals, np.ndarray):  # (values of one shape: no None)
                    cols[f] = vals.astype(np.int64) if f in run.iterations.ints else vals
                elif f in run.iterations.ints:
                    cols[f] = np.array(vals, dtype=np.int64) if None not in vals else vals
                elif None not in vals:
                    cols[f] = np.array(vals, dtype=float)
                else:
                    cols[f] = np.array([np.nan if v is None else v for v in vals], dtype=float)
            cols["iteration"] = it_num
            cols["train_iters"] = new_its.total
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
            run.train_iters = int(new_its.total[-1])
            run.training = True
        if len(new_its) or repeated:
            run.pipe_iterations = True
        if ds.keep.any():
            n_iter = np.zeros(len(ds.ls), dtype=np.int64)
            stream = np.zeros(len(ds.ls), dtype=np.int64)
            if ds.keys.count(ds.keys[0]) == len(ds.keys):  # (one stream prints them)
                ds_ids = {ds.keys[0]: 0}
                ds_sid = np.zeros(len(ds.keys), dtype=np.int64)
            else:
                ds_ids = {k: i for i, k in enumerate(dict.fromkeys(ds.keys))}
                ds_sid = np.fromiter(
                    map(ds_ids.__getitem__, ds.keys), dtype=np.int64, count=len(ds.keys)
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
            # (The steps lines before each, of the run and of this step: its pipeline step.)
            n_steps = len(run.steps) + np.searchsorted(steps.ls, ds.ls)
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
                        n_steps[rows],
                        stream[rows],
                    )
        if len(steps):  # PipelineEngine step lines, as ``Core._steps`` reads them
            line_s = lines_at(steps.ls)
            run.steps.add_columns(
                len(steps),
                {
                    "line": line_s,
                    "step": steps.step,
                    "loss": steps.loss,
                    "iter_ms": steps.iter_ms,
                    "samples_per_s": steps.samples_per_s,
                },
            )
            for key in dict.fromkeys(steps.keys):  # (each stream's first)
                run.begin_training(key, int(line_s[steps.keys.index(key)]))
        if alloc:  # DeepSpeed's `MemAllocated=` lines, as ``Core._dispatch`` reads them
            for (_s, _e, rank, a, m), line in zip(
                alloc, lines_at([x[0] for x in alloc]).tolist(), strict=True
            ):
                run.memory_other.append(
                    Memory(
                        rank=rank, allocated_mb=a, max_allocated_mb=m, kind="deepspeed", line=line
                    )
                )
        if len(mem):
            cols_m: dict[str, Any] = {"kind": "megatron", "line": lines_at(mem.ls)}
            for f, values in (("rank", mem.rank), ("after_iteration", mem.after)):
                cols_m[f] = np.array(values, dtype=np.int64) if None not in values else values
            cols_m.update(mem.values)
            run.memory.add_columns(len(mem), cols_m)
        if len(b_start):
            # The line path keeps a state per stream, created on its first block: the order
            # in which open blocks are closed at the end of the file.
            keys = [bare.pattern.key] if len(bare) and bare.pattern is not None else []
            for key in dict.fromkeys(keys + [b[3] for b in blocks]):
                if key not in self.core.streams:
                    self.core.streams[key] = StreamState(key=key)
            self._add_blocks(
                bare,
                blocks,
                b_close,
                lines_at(b_start),
                (it_pos, it_num, it_sid, it_ids),
                last_of,
                last_before,
            )
        self.mem_read = len(run.memory)
        self.lineno_at = lineno + int(np.searchsorted(nl, T))
        return T

    def head_key(self, head: bytes) -> str:
        """Stream key of an iteration line whose text before ``iteration`` is ``head`` (one
        ``_it_head`` took), as ``_line_key`` finds it."""
        key = self.head_keys.get(head)
        if key is not None:
            return key
        m = PREFIXES_RE.match(head)
        raw = m.group(0) if m else b""
        got = self.prefix_runs.get(raw)
        if got is None:
            k, rest = split_prefix(raw.decode("ascii"))
            got = self.prefix_runs[raw] = (k, len(raw) - len(rest))
        if len(self.head_keys) < 4096:
            self.head_keys[head] = got[0]
        return got[0]

    def it_head(self, head: bytes) -> bool:
        """Whether a line whose text before ``iteration`` is ``head`` is read in bulk (its
        prefixes valid, nothing in it that makes the line path read it otherwise)."""
        got = self.it_heads.get(head)
        if got is None:
            got = False
            if (not head or head[-1] not in WORD) and b"\n" not in head:
                m = PREFIXES_RE.match(head)
                raw = m.group(0) if m else b""
                _k, rest = split_prefix(raw.decode("ascii"))
                text = head[len(raw) - len(rest) :]
                got = (
                    is_printable(text)
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

    def _add_blocks(
        self,
        bare: BareBlocks,
        blocks: list[tuple[int, int, dict[str, Any] | None, str, Any]],
        closes: np.ndarray,
        hlines: np.ndarray,
        its: tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, int]],
        last_of: dict[str, int],
        last_before: int | None,
    ) -> None:
        """Add Megatron timer blocks, ``bare``'s then ``blocks`` (``closes``, ``hlines``: the
        closes and header line numbers of both, in that order): the iteration is the last one
        of the block's stream read when it closed, else the last one of the run
        (``Core._last_iter``)."""
        it_pos, it_num, it_sid, it_ids = its
        table = self.core.run.megatron_blocks
        nb = len(bare)
        # The last iteration of the run before each close (-1 with none: last_before).
        kb = np.searchsorted(it_pos, closes)
        it_of = np.where(kb > 0, it_num[np.maximum(kb - 1, 0)], -1) if len(it_num) else kb * 0 - 1
        known = kb > 0
        bare_key = [bare.pattern.key] if nb and bare.pattern is not None else []
        streams = {k: i for i, k in enumerate(dict.fromkeys(bare_key + [b[3] for b in blocks]))}
        sid = np.concatenate(
            [
                np.zeros(nb, dtype=np.int64),
                np.fromiter((streams[b[3]] for b in blocks), dtype=np.int64, count=len(blocks)),
            ]
        )
        for key, i in streams.items():
            if key not in it_ids and key not in last_of:
                continue
            rows = np.flatnonzero(sid == i)
            if key in it_ids:
                mine = it_sid == it_ids[key]
                j = np.searchsorted(it_pos[mine], closes[rows])
                hit = j > 0
                it_of[rows[hit]] = it_num[mine][j[hit] - 1]
                known[rows[hit]] = True
                rows = rows[~hit]
            if key in last_of and len(rows):
                it_of[rows] = last_of[key]
                known[rows] = True
        # Each group (names, shape) -> the blocks in it, in the order read (``bare``'s first),
        # and the values of those that no learned pattern read.  Most blocks are of one
        # pattern: found at once.
        fl = [b[4] for b in blocks]
        by_group: dict[tuple[Any, ...], list[int]] = {}
        nums_of: dict[int, list[float]] = {}
        flat0 = bare.pattern.flat if nb and bare.pattern is not None else None
        if flat0 is not None and flat0[0]:
            names0: Any = flat0[0]
            by_group[flat0] = list(range(nb))
        else:
            names0 = next((f[0] for f in fl if f is not None and f[0]), None)
        if names0 is not None:
            mask = [f is not None and f[0] is names0 for f in fl]
            if True in mask:
                group = by_group.setdefault((names0, fl[mask.index(True)][1]), [])
                group += [nb + i for i in compress(range(len(fl)), mask)]
            rest = [i for i, m in enumerate(mask) if not m]
        else:
            rest = list(range(len(fl)))
        for i in rest:
            values, flat = blocks[i][2], fl[i]
            if flat is not None:
                if not flat[0]:
                    continue
                key, nums = (flat[0], flat[1]), flat[2]
            elif values:
                nums = [x for v in values.values() for x in (v if isinstance(v, tuple) else (v,))]
                key = (tuple(values), timer_shape(values))
            else:
                continue
            by_group.setdefault(key, []).append(nb + i)
            nums_of[nb + i] = nums
        for (names, shape), idx in by_group.items():
            idx.sort()  # (a pattern's blocks and blocks read line by line of the same group)
            at = np.array(idx, dtype=np.int64)
            n_bare = int(np.searchsorted(at, nb))  # (``bare``'s come first)
            more = [fl[i - nb][2] if i not in nums_of else nums_of[i] for i in idx[n_bare:]]  # type: ignore[index]
            if n_bare:
                nums_g = bare.nums[at[:n_bare]]
                if more:
                    nums_g = np.concatenate([nums_g, np.array(more, dtype=float)])
            else:
                nums_g = np.array(more, dtype=float)
            if last_before is None and not known[at].all():
                for row, it, i in zip(nums_g.tolist(), it_of[at].tolist(), idx, strict=True):
                    table.append(
                        TimerBlock(
                            "megatron",
                            ds_group_values(names, shape, row),
                            None,
                            it if known[i] else None,
                            int(hlines[i]),
                        )
                    )
                continue
            table.add_rows(
                table.group("megatron", names, shape),
                nums_g.reshape(len(idx), -1),
                None,
                np.where(known[at], it_of[at], last_before if last_before is not None else 0),
                hlines[at],
            )

    def ds_offset(self, block: bytes, ls: int, end: int) -> None:
        """Look for DeepSpeed lines at the offset of ``[Rank`` in the line at ``ls`` (one the
        step left to the line path) from now on, when it is one of them."""
        e = line_end(block, ls, end)
        at = block.find(DS_LIT, ls, e)
        if (
            at >= 0
            and at - ls not in self.ds_offsets
            and len(self.ds_offsets) < DS_OFFSETS
            and block.find(DS_AFTER, at, e) >= 0
        ):
            self.ds_offsets.append(at - ls)

    def _first_keyword(
        self, block: bytes, pos: int, T: int, span_s: np.ndarray, span_e: np.ndarray
    ) -> int | None:
        """Start of the first line in [pos, T) outside the lines taken (starts, ends) that
        holds a keyword (``advance``)."""
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
        hit = self.keywords.first(gaps, 0, len(gaps), self.core.run.pipe_iterations, once=True)
        if hit < 0:
            return None
        offsets = np.cumsum(np.concatenate([[0], ends[gap] - starts[gap]]))
        g = int(np.searchsorted(offsets, hit, side="right")) - 1
        p = starts_l[g] + hit - int(offsets[g])
        return block.rfind(b"\n", pos, p) + 1 or pos
