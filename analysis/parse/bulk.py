"""The bulk path of the file reader (``reader.drive_file``): during training, while no timer
block is open, the high-volume lines of a stretch are found by the extractors of ``extract`` and
``blocks``, assigned to iterations and pipeline steps with ``np.searchsorted`` over their
offsets, per stream, and added to the run's columns in one step.  The first other line holding a
keyword ends the stretch and goes to the line path (``Core.feed``), as does a counter going back
or the final iteration; ``tests/test_parse_engine.py`` checks that both paths agree.
"""

from __future__ import annotations

from array import array
from typing import Any

import numpy as np

from analysis.parse.blocks import BlockExtractor, Blocks
from analysis.parse.extract import Extractors, Lines
from analysis.parse.keywords import Keywords
from analysis.parse.machine import Core
from analysis.parse.records import Memory
from analysis.parse.rules import StreamState

SEG_START, SEG_MIN, SEG_MAX = 1 << 18, 1 << 14, 4 << 20
"""Bytes the bulk path looks at in one step: it grows while no line needs the line path and
shrinks when one soon does."""
SPARSE_LINES, SPARSE_BYTES = 1000, 8 << 20
"""A bulk step of at least SEG_START bytes that took fewer lines per MB than this hands the
next SPARSE_BYTES to the line path (whose keyword jumps are cheaper over chatter)."""
SHORT_LINES, SHORT_BYTES = 4, 64 << 10
"""What the line path reads after the second bulk step in a row that took fewer than
SHORT_LINES lines and stopped in the first quarter of what it looked at; doubled for each
more, up to SPARSE_BYTES."""


def line_after(block: bytes, at: int, end: int) -> int:
    """Where the line holding byte ``at - 1`` ends (past its newline), at most ``end``."""
    nl = block.find(b"\n", at - 1, end) if at < end else -1
    return end if nl < 0 else nl + 1


def holds(starts: np.ndarray, ends: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Whether each position of ``at`` falls in one of the spans [starts, ends) (sorted by
    start, not overlapping)."""
    i = np.searchsorted(starts, at, side="right") - 1
    return (i >= 0) & (at < ends[np.maximum(i, 0)])


def stream_ids(keys: list[Any]) -> tuple[dict[Any, int], np.ndarray]:
    """Each distinct stream key's number, in order of first appearance, and each key's."""
    ids = {k: i for i, k in enumerate(dict.fromkeys(keys))}
    if len(ids) == 1:
        return ids, np.zeros(len(keys), dtype=np.int64)
    return ids, np.fromiter(map(ids.__getitem__, keys), dtype=np.int64, count=len(keys))


class Bulk:
    """The bulk path over one file (module doc)."""

    def __init__(self, core: Core, kw: Keywords) -> None:
        self.core = core
        self.extract = Extractors()
        """Its extractors of one-line records."""
        self.blocks = BlockExtractor(self.extract)
        """Its extractor of timer blocks."""
        self.keywords = Keywords(kw.keywords)
        """Every keyword, looked for in the lines a step does not take (``_first_keyword``)."""
        self.seg = SEG_START
        self.line_budget = 0  # bytes the line path reads before the bulk path tries again
        self.sparse = 0  # bulk steps in a row that took few lines
        self.short = 0  # bulk steps in a row that stopped soon after their start
        self.taken = 0  # lines the last bulk step took (``_segment``)
        self.lineno_at = 0  # the line number where the last step stopped
        self.open_at_limit = False  # the last look ended in an open timer block
        self.open_block = -1  # where that block starts, when the step ended there

    def advance(self, block: bytes, pos: int, end: int, lineno: int) -> tuple[int, int, bool]:
        """Take the lines from ``pos`` (a line start) in bulk up to the first one the line
        path must read.  Returns (position, line number there, whether the line there must be
        read by the line path)."""
        seg_end = line_after(block, pos + self.seg, end)
        hard = line_after(block, pos + 4 * self.seg, end)  # how far a timer block may take it
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
            limit = line_after(block, pos + 2 * (limit - pos), hard)
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
        to the run; return where it stopped (``self.lineno_at``: the line number there), or
        None when a timer block is open at the limit and more bytes may be looked at."""
        run = self.core.run
        ex = self.extract
        # Where the newlines of [pos, limit) are (line starts, line numbers).
        nl = (
            np.flatnonzero(
                np.frombuffer(block, dtype=np.uint8, count=limit - pos, offset=pos) == 10
            )
            + pos
        )
        # Timer blocks first: the step ends before one that does not close by the limit (or,
        # when that is its first line and it may, looks at more bytes); the other extractors
        # then read only up to there.
        # Iteration lines first: one of a block's stream right after the block closes it.
        its = ex.iteration_lines(block, pos, limit, nl)
        T, blocks, self.open_at_limit = self.blocks.timer_blocks(block, pos, limit, nl, its)
        if self.open_at_limit and can_grow and pos >= T:
            return None  # look at more bytes (nothing was added)
        self.open_block = T if self.open_at_limit else -1
        nl = nl[: np.searchsorted(nl, T)]
        its = its.select(its.ls < T)
        ds = ex.ds_lines(block, pos, T, nl)
        # (PipelineEngine step lines once the line path read one: a run with them.)
        steps = ex.steps_lines(block, pos, T, nl) if len(run.steps) else Lines.empty()
        ones = [its, ex.mem_lines(block, pos, T, nl), steps, ex.alloc_lines(block, pos, T, nl)]
        if len(blocks):  # lines a timer block took are not read as anything else
            order = np.argsort(blocks.own_s, kind="stable")
            held = blocks.own_s[order], blocks.own_e[order]
            ds.keep &= ~holds(*held, ds.ls)
            ones = [x.select(~holds(*held, x.ls)) for x in ones]
        # The first line the line path must read: one holding a keyword among the others.
        k = ds.keep
        span_s = np.concatenate([ds.ls[k], *(x.ls for x in ones), blocks.start, blocks.own_s])
        span_e = np.concatenate([ds.le[k], *(x.le for x in ones), blocks.body, blocks.own_e])
        R = self._first_keyword(block, pos, T, span_s, span_e)
        T = T if R is None else min(T, R)
        new_its, T, repeated = self._rising(ones[0], T)
        while True:  # timer blocks must close before T
            across = (blocks.start < T) & (blocks.close > T)
            if not across.any():
                break
            T = int(blocks.start[across].min())
        if pos >= T:
            return pos
        blocks = blocks.head(int(np.searchsorted(blocks.start, T)))
        new_its, mem, steps, alloc = (x.select(x.ls < T) for x in (new_its, *ones[1:]))
        ds.keep &= ds.ls < T
        b_start, b_close = blocks.start, blocks.close

        # Lines taken: a timer block counts its lines (64 ranks' ``--timing-log-option all``
        # block is one record of 130 lines, which the line path would read one by one).
        block_lines = int((np.searchsorted(nl, b_close) - np.searchsorted(nl, b_start)).sum())
        self.taken = (
            len(new_its) + int(ds.keep.sum()) + len(mem) + block_lines + len(steps) + len(alloc)
        )

        def lines_at(starts: Any) -> np.ndarray:
            return lineno + np.searchsorted(nl, np.asarray(starts, dtype=np.int64))

        it_pos = new_its.ls
        it_num = new_its.cols.get("iteration", np.zeros(0, dtype=np.int64))
        # Per stream (launcher prefix): iteration lines printed before the step, and the
        # numbers of those of the step (timer blocks are placed among their own stream's).
        before = {k: len(v) for k, v in run.iter_numbers.items()}
        last_of = {k: int(v[-1]) for k, v in run.iter_numbers.items() if len(v)}
        it_ids, it_sid = stream_ids(new_its.keys)
        last_before = run.last_iter
        if len(new_its):
            self._add_iterations(new_its, lines_at(it_pos), it_sid, it_ids)
        if len(new_its) or repeated:
            run.pipe_iterations = True
        if ds.keep.any():
            self._add_ds(ds, (it_pos, it_sid, it_ids), before, lines_at, steps)
        if len(steps):  # PipelineEngine step lines, as ``Core._steps`` reads them
            line_s = lines_at(steps.ls)
            run.steps.add_columns(len(steps), {"line": line_s, **steps.cols})
            for key in dict.fromkeys(steps.keys):  # (each stream's first)
                run.begin_training(key, int(line_s[steps.keys.index(key)]))
        if len(alloc):  # DeepSpeed's `MemAllocated=` lines, as ``Core._dispatch`` reads them
            c = alloc.cols
            for rank, a, top, line in zip(
                c["rank"].tolist(),
                c["allocated_mb"].tolist(),
                c["max_allocated_mb"].tolist(),
                lines_at(alloc.ls).tolist(),
                strict=True,
            ):
                run.memory_other.append(
                    Memory(
                        rank=rank, allocated_mb=a, max_allocated_mb=top, kind="deepspeed", line=line
                    )
                )
        if len(mem):
            cols_m: dict[str, Any] = {"kind": "megatron", "line": lines_at(mem.ls), **mem.cols}
            run.memory.add_columns(len(mem), cols_m)
        if len(blocks):
            # The line path keeps a state per stream, created on its first block: the order
            # in which open blocks are closed at the end of the file.
            for key in dict.fromkeys(blocks.keys):
                if key not in self.core.streams:
                    self.core.streams[key] = StreamState(key=key)
            self._add_blocks(
                blocks,
                lines_at(b_start),
                (it_pos, it_num, it_sid, it_ids),
                last_of,
                last_before,
            )
        self.lineno_at = lineno + int(np.searchsorted(nl, T))
        return T

    def _rising(self, its: Lines, T: int) -> tuple[Lines, int, bool]:
        """The iteration lines before ``T`` that add to the run: their numbers must go up (a
        repeat changes nothing: whether there is one is returned); the final iteration or a
        counter going back ends the step there (the new ``T``), for the line path."""
        top = self.core.run.max_iter
        number = its.cols.get("iteration", np.zeros(0, dtype=np.int64))
        total = its.cols.get("train_iters", np.zeros(0, dtype=np.int64))
        if (
            len(its)
            and its.le[-1] <= T
            and number[0] > top
            and (np.diff(number) > 0).all()
            and (number < total).all()
        ):
            return its, T, False  # (all go up: most often)
        new, repeated = [], False
        for i, (start, num, tot) in enumerate(
            zip(its.ls.tolist(), number.tolist(), total.tolist(), strict=True)
        ):
            if start >= T:
                break
            if top < num < tot:
                new.append(i)
                top = num
            elif num == top and top >= 0:
                repeated = True
            else:
                T = start
                break
        return its.select(np.array(new, dtype=np.int64)), T, repeated

    def _add_iterations(
        self,
        its: Lines,
        lines: np.ndarray,
        it_sid: np.ndarray,
        it_ids: dict[str, int],
    ) -> None:
        """Add iteration lines to the run, as ``Core._add_iteration`` does one by one."""
        run = self.core.run
        cols: dict[str, Any] = {}
        for f, vals in its.cols.items():
            if f in ("iteration", "train_iters") or f not in its.ints:
                cols[f] = vals
            elif np.isnan(vals).any():
                cols[f] = [None if v != v else int(v) for v in vals.tolist()]
            else:
                cols[f] = vals.astype(np.int64)
        it_num = cols["iteration"]
        cols["line"] = lines
        cols["source"] = self.core.source
        run.iterations.add_columns(len(its), cols)
        if run.seen_iters is not None:
            run.seen_iters.update(it_num.tolist())
        for key, sid in it_ids.items():
            mine = it_sid == sid
            run.iter_numbers.setdefault(key, array("q")).extend(it_num[mine].tolist())
            run.begin_training(key, int(lines[np.argmax(mine)]))
        run.max_iter = max(run.max_iter, int(it_num[-1]))
        run.train_iters = int(cols["train_iters"][-1])

    def _add_ds(
        self,
        ds: Lines,
        its: tuple[np.ndarray, np.ndarray, dict[str, int]],
        before: dict[str, int],
        lines_at: Any,
        steps: Lines,
    ) -> None:
        """Add DeepSpeed lines to the run's ``ds_blocks``: each with the count of its stream's
        iteration lines before it and of the run's step lines before it (their attribution)."""
        run = self.core.run
        it_pos, it_sid, it_ids = its
        ds_ids, ds_sid = stream_ids(ds.keys)
        keys = list(ds_ids)
        # Per stream: its number among the iteration lines' (-1: none), its iteration lines
        # before the step, its number in ``ds_blocks`` (0 for lines of no stream).
        it_of = np.array([it_ids.get(k, -1) for k in keys], dtype=np.int64)[ds_sid]
        first = np.array([before.get(k, 0) for k in keys], dtype=np.int64)[ds_sid]
        ids = [0 if k is None else run.ds_blocks.stream_id(k) for k in keys]
        stream = np.array(ids, dtype=np.int64)[ds_sid]
        # The iteration lines of its stream before each line: over (stream, offset) keys.
        span = int(max(ds.ls.max(), it_pos.max() if len(it_pos) else 0)) + 1
        by_stream = np.sort(it_sid * span + it_pos)
        at = np.searchsorted(by_stream, it_of * span + ds.ls)
        n_iter = first + at - np.searchsorted(by_stream, it_of * span)
        kept = np.bincount(ds_sid[ds.keep], minlength=len(keys))
        for key, k in zip(keys, kept.tolist(), strict=True):
            if k and key is not None:
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
                    ds.cols["rank"][rows],
                    line_all[rows],
                    n_iter[rows],
                    n_steps[rows],
                    stream[rows],
                )

    def _add_blocks(
        self,
        blocks: Blocks,
        hlines: np.ndarray,
        its: tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, int]],
        last_of: dict[str, int],
        last_before: int | None,
    ) -> None:
        """Add Megatron timer blocks (``hlines``: their header line numbers): the iteration is
        the last one of the block's stream read when it closed, else the last one of the run
        (``Core._megatron_block``)."""
        it_pos, it_num, it_sid, it_ids = its
        closes = blocks.close
        table = self.core.run.megatron_blocks
        # The last iteration of the run before each close (-1 with none: last_before).
        kb = np.searchsorted(it_pos, closes)
        it_of = np.where(kb > 0, it_num[np.maximum(kb - 1, 0)], -1) if len(it_num) else kb * 0 - 1
        known = kb > 0
        streams, sid = stream_ids(blocks.keys)
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
        for names, shape, at, nums in blocks.groups:
            g, mine = table.group("megatron", names, shape), known[at]
            if last_before is None and not mine.all():  # (blocks before the run's first)
                table.add_rows(g, nums[~mine], None, None, hlines[at][~mine])
                nums, at = nums[mine], at[mine]
            table.add_rows(
                g, nums, None, np.where(known[at], it_of[at], last_before or 0), hlines[at]
            )

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
