"""What a run keeps while it is parsed (the iteration-number index, DeepSpeed blocks before
attribution) and the columnar steps of finishing and merging runs (attribution of DeepSpeed
timer blocks, iteration dedup)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from analysis.parse.columns import Column
from analysis.parse.records import IterationTable, TimerBlock, TimerTable


class DeepSpeedBlocks:
    """DeepSpeed ``time (ms) |`` blocks of a run being parsed, before attribution: the values
    as a ``TimerTable`` and, per block, how many iteration lines of its own stream and how many
    pipeline steps preceded it, and its stream (what attribution needs).  ``append`` takes the
    parser's tuple ``(values, rank, line, iterations before, steps before, stream)``."""

    def __init__(self) -> None:
        self.table = TimerTable()
        self.n_iter = Column("i")
        self.n_steps = Column("i")
        self.stream = Column("i")
        self.keys: dict[str, int] = {}
        """Stream key (launcher prefixes) -> the id stored in ``stream``."""

    def stream_id(self, key: str) -> int:
        """The id of stream ``key``."""
        return self.keys.setdefault(key, len(self.keys))

    def append(self, block: tuple[dict[str, Any], int | None, int, int, int, str]) -> None:
        values, rank, line, n_iter, n_steps, key = block
        self.table.append(TimerBlock("deepspeed", values, rank, None, line))
        self.n_iter.append(n_iter)
        self.n_steps.append(n_steps)
        self.stream.append(self.stream_id(key))

    def add_rows(
        self,
        names: tuple[str, ...],
        values: np.ndarray,
        rank: np.ndarray,
        line: np.ndarray,
        n_iter: np.ndarray,
        n_steps: np.ndarray,
        stream: np.ndarray,
    ) -> None:
        """Add blocks of one set of names column-wise (the file reader's bulk path)."""
        g = self.table.group("deepspeed", names, (0,) * len(names))
        self.table.add_rows(g, values, rank, None, line)
        self.n_iter.add_ints(n_iter)
        self.n_steps.add_ints(n_steps)
        self.stream.add_ints(stream)


def _runs(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For consecutive equal keys: the 1-based position of each element in its run, and the
    length of its run."""
    n = len(keys)
    starts = np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]]))
    lengths = np.diff(np.concatenate([starts, [n]]))
    run_id = np.repeat(np.arange(len(starts)), lengths)
    k = np.arange(n) - starts[run_id] + 1
    return k, lengths[run_id]


def _attribute_piece(
    ni: np.ndarray, rows: np.ndarray, numbers: np.ndarray, out: np.ndarray, none: np.ndarray
) -> bool:
    """Attribute the blocks ``rows`` of one group and one stream (whole runs of equal ``ni``:
    iteration lines of the stream before each) to the iterations ``numbers`` of the stream;
    returns whether some count between two iteration lines did not match."""
    k, m = _runs(ni)
    has_prev = ni > 0
    has_next = ni < len(numbers)
    prev = np.where(has_prev, numbers[np.maximum(ni - 1, 0)], 0)
    nxt = np.where(has_next, numbers[np.minimum(ni, len(numbers) - 1)], 0)
    both = has_prev & has_next
    match = both & (nxt - prev == m)
    mismatch = bool((both & (nxt - prev != m)).any())
    # Before the first iteration line: one block per step since the start (m == N) or since a
    # resume one log interval earlier; anything else (a one-off set-up timer such as ZeRO-3's
    # init_optimizer_state) stays unattributed.
    first = ~has_prev & has_next
    if first.any():
        interval = int(numbers[1] - numbers[0]) if len(numbers) > 1 else None
        ok = first & ((m == nxt) | (m == interval if interval is not None else False))
        out[rows[ok]] = (nxt - m + k)[ok]
        none[rows[ok]] = False
    take = match | (has_prev & ~has_next)  # (after the last iteration line: the next ones)
    out[rows[take]] = (prev + k)[take]
    none[rows[take]] = False
    return mismatch


def attribute_blocks(
    blocks: DeepSpeedBlocks,
    iter_numbers: Mapping[str, Sequence[int]],
    steps: np.ndarray,
    pipeline: bool,
) -> tuple[TimerTable, list[str]]:
    """The DeepSpeed blocks with their iteration, as a table (docs/parsing.md, "The line
    machine").

    Positions count only within one stream (``iter_numbers``: stream -> the numbers of the
    iteration lines it printed): blocks of one timer group (same names) and one stream between
    two consecutive iteration lines of that stream are the iterations between them when their
    count matches; before the first iteration line, one block per step since the start or since
    one log interval; after the last, the next iterations.  A stream with no iteration line of
    its own (rank 0's node beside the last rank's, interleaved in one file) has its blocks
    attributed as ``merge_runs`` does for per-node files: when one block per iteration 1..N was
    printed.  Pipeline blocks: ``pipe_*`` groups go to the preceding ``steps:`` line, the others
    to the next one.
    """
    table = blocks.table
    problems: list[str] = []
    if not len(table):
        return table, problems
    # Every iteration written is a printed number (or a step's), or one of the blocks counted
    # on from one: int32 holds them when that sum does (half the bytes).
    numbers_of = {
        blocks.keys[k]: np.asarray(v, dtype=np.int64)
        for k, v in iter_numbers.items()
        if k in blocks.keys
    }
    top = max([int(np.abs(v).max()) for v in [*numbers_of.values(), steps] if len(v)] or [0])
    counts = (
        (blocks.n_steps.array(),) if pipeline else (blocks.n_iter.array(), blocks.stream.array())
    )
    blocks.n_iter, blocks.n_steps, blocks.stream = Column("i"), Column("i"), Column("i")
    out = np.zeros(len(table), dtype=np.int32 if top + len(table) < 2**31 else np.int64)
    none = np.ones(len(table), dtype=bool)
    if pipeline:
        _by_steps(table, counts[0], steps, out, none)
    else:
        last = max((int(max(v)) for v in iter_numbers.values() if len(v)), default=None)
        problems += _by_iteration_lines(table, *counts, numbers_of, last, out, none)
    del counts
    table.set_iterations(out, none)
    if pipeline:
        for g in range(len(table.groups)):
            table.set_source(g, "pipeline")
    return table, problems


def _by_steps(
    table: TimerTable, n_steps: np.ndarray, steps: np.ndarray, out: np.ndarray, none: np.ndarray
) -> None:
    """Pipeline blocks: ``pipe_*`` groups to the step before (index ``n_steps - 1``), the others
    to the next (index ``n_steps``); a stretch at a time (no index of every block)."""
    if not len(steps):
        return
    is_pipe = np.array([bool(n) and n[0].startswith("pipe_") for _, n, _ in table.groups])
    gid = table.group_ids()
    steps = np.asarray(steps, dtype=out.dtype)
    for s in range(0, len(out), 1 << 20):
        idx = n_steps[s : s + (1 << 20)] - is_pipe[gid[s : s + (1 << 20)]].astype(np.int64)
        none[s : s + len(idx)] = (idx < 0) | (idx >= len(steps))
        out[s : s + len(idx)] = np.take(steps, idx, mode="clip")


def _by_iteration_lines(
    table: TimerTable,
    n_iter: np.ndarray,
    stream: np.ndarray,
    numbers_of: dict[int, np.ndarray],
    last: int | None,
    out: np.ndarray,
    none: np.ndarray,
) -> list[str]:
    """Blocks of each group and stream among the iteration lines of that stream
    (``attribute_blocks``); the problems."""
    gid = table.group_ids()
    problems: list[str] = []
    mismatch = False
    for g, (_source, names, _shape) in enumerate(table.groups):
        in_group = gid == g
        for sid in np.unique(stream[in_group]).tolist():
            rows = np.flatnonzero(in_group & (stream == sid))
            numbers = numbers_of.get(sid, np.zeros(0, dtype=np.int64))
            ni = n_iter[rows].astype(np.int64)
            if len(numbers):
                mismatch |= _attribute_piece(ni, rows, numbers, out, none)
                continue
            # Another stream prints the iteration lines: one block per iteration 1..N.
            if last is not None and len(rows) == last and len(np.unique(ni)) == 1:
                out[rows] = np.arange(1, last + 1)
                none[rows] = False
            elif last is not None:
                problems.append(
                    f"DeepSpeed timer group {names[0]}...: {len(rows)} blocks for {last} "
                    "iterations printed by another stream; left unattributed"
                )
    if mismatch:
        problems.append(
            "some DeepSpeed timer blocks could not be matched to iterations (their count "
            "between two iteration lines differs from the iterations between them); left "
            "unattributed"
        )
    return problems


def merge_iterations(parts: Iterable[Sequence[Any]]) -> IterationTable:
    """Iterations of several files of one run: the first record of each number, by number."""
    merged = IterationTable()
    for part in parts:
        merged.extend(part if isinstance(part, IterationTable) else IterationTable(part))
    if not len(merged):
        return merged
    numbers = merged.column("iteration").ints()
    _, first = np.unique(numbers, return_index=True)  # sorted by number, first occurrence
    return merged.take(first)


def merge_attribution(timers: TimerTable, last: int | None, pipeline: bool) -> list[str]:
    """Re-source DeepSpeed blocks of a pipeline run; attribute blocks of files that had no
    iteration lines when one block per iteration 1..N was printed (in place); problems."""
    problems: list[str] = []
    groups = timers.groups
    if pipeline:
        for g, (source, _names, _shape) in enumerate(groups):
            if source == "deepspeed":
                timers.set_source(g, "pipeline")
        return problems
    if last is None or not len(timers):
        return problems
    gid = timers.group_ids()
    it_col = timers.column("iteration")
    its, unset = it_col.ints(fill=0), it_col.none_mask()
    rows_of: dict[tuple[str, ...], np.ndarray] = {}  # timer names -> unattributed blocks
    for names in dict.fromkeys(names for source, names, _ in groups if source == "deepspeed"):
        gs = [g for g, (src, ns, _) in enumerate(groups) if src == "deepspeed" and ns == names]
        if len(rows := np.flatnonzero(np.isin(gid, gs) & unset)):
            rows_of[names] = rows
    changed = False
    for names, rows in sorted(rows_of.items(), key=lambda item: int(item[1][0])):
        if len(rows) == last:
            its[rows] = np.arange(1, last + 1)
            unset[rows] = False
            changed = True
        else:
            problems.append(
                f"DeepSpeed timer group {names[0]}...: {len(rows)} unattributed blocks for "
                f"{last} iterations; left unattributed"
            )
    if changed:
        timers.set_iterations(its, unset)
    return problems
