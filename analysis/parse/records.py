"""Typed records that the parser produces and the metrics consume, and the column tables that
hold them.  ``to_dict`` gives the JSON of ``python -m analysis.parse LOG... --json``
(docs/parsing.md).  All times are milliseconds and all memory figures MiB (bytes / 1024**2,
which is what both Megatron's ``report_memory`` and DeepSpeed's ``see_memory_usage`` print
under the label "MB"), whatever unit the log itself printed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from copy import deepcopy
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

import numpy as np

from analysis.parse.columns import Column, none_of
from analysis.parse.tables import RecordTable, Rows, json_key, json_rows

_BLOCKS_AT_A_TIME = 1 << 16
"""Timer blocks ``TimerTable.blocks_of`` converts to Python values at a time."""

RunStatus = Literal["completed", "failed", "incomplete"]
"""``completed``: training reached its last iteration (or the launcher said every process exited
successfully); ``failed``: a failure was recognised; ``incomplete``: neither (log cut short)."""

FailureKind = Literal[
    "oom", "nccl", "exception", "killed", "time_limit", "cancelled", "hang", "other"
]
"""Closed set of failure kinds; ``nccl`` also covers gloo and other collective-backend errors."""

TimerSource = Literal["megatron", "deepspeed", "pipeline"]
"""Who printed a timer block: Megatron's ``Timers.log``, DeepSpeed's ``wall_clock_breakdown``
(``[Rank 0] time (ms) | ...``), or DeepSpeed's PipelineEngine (also ``time (ms)`` lines, but
totals over ``steps_per_print`` steps rather than per step)."""


@dataclass(frozen=True, slots=True)
class Failure:
    """Why a run did not complete."""

    kind: FailureKind
    """Closed classification of the failure."""
    message: str
    """The log line (prefixes stripped) that identified the failure."""
    line: int
    """1-based line number of that line in the file it came from."""


@dataclass(frozen=True, slots=True)
class Iteration:
    """One Megatron iteration line (or a PipelineEngine ``steps:`` line when no Megatron line)."""

    iteration: int
    """Iteration number as printed (1-based, the last iteration of the logging window)."""
    elapsed_ms: float | None = None
    """Mean wall time per iteration over the logging window, in ms (converted from s if needed)."""
    samples_per_s: float | None = None
    """Samples per second as printed."""
    tflops: float | None = None
    """TFLOPs per GPU as printed by Megatron (its own formula; recomputed in ``metrics.rows``)."""
    lm_loss: float | None = None
    """Language-model loss averaged over the window."""
    loss_scale: float | None = None
    """Dynamic loss scale (fp16) or 1.0."""
    grad_norm: float | None = None
    """Gradient norm, when printed."""
    skipped: int | None = None
    """Number of skipped iterations in the window."""
    nan: int | None = None
    """Number of NaN iterations in the window."""
    global_batch_size: int | None = None
    """Global batch size as printed."""
    learning_rate: float | None = None
    """Learning rate as printed."""
    consumed_samples: int | None = None
    """Consumed samples so far."""
    consumed_tokens: int | None = None
    """Consumed tokens so far, when printed."""
    tokens_per_gpu_per_s: float | None = None
    """Tokens per GPU per second as printed (Megatron-DeepSpeed's ``tgs``)."""
    train_iters: int | None = None
    """Total iterations planned (the N in ``iteration k/N``)."""
    line: int | None = None
    """1-based line number in the source file."""
    source: str | None = None
    """File the line came from (several files can feed one run)."""


@dataclass(frozen=True, slots=True)
class Memory:
    """One memory report, in MiB."""

    rank: int | None
    """Global rank that printed it, if the line says."""
    allocated_mb: float | None = None
    """Currently allocated tensor memory (MiB)."""
    max_allocated_mb: float | None = None
    """Peak allocated tensor memory (MiB)."""
    reserved_mb: float | None = None
    """Memory reserved by the caching allocator (MiB)."""
    max_reserved_mb: float | None = None
    """Peak reserved memory (MiB)."""
    kind: str = "megatron"
    """Which report printed it: ``megatron`` (report_memory), ``deepspeed`` (MemAllocated), or
    ``see_memory_usage`` (MA/Max_MA/CA/Max_CA in GB, converted)."""
    after_iteration: int | None = None
    """Iteration after which it was printed, when the line says (``(after 5 iterations)``)."""
    line: int | None = None
    """1-based line number in the source file."""


@dataclass(frozen=True, slots=True)
class TimerBlock:
    """One printed group of timers."""

    source: TimerSource
    """Who printed it."""
    values_ms: dict[str, float | tuple[float, float]]
    """Timer name -> ms; a ``(min, max)`` pair across ranks for Megatron minmax blocks."""
    rank: int | None = None
    """Rank that printed it (``[Rank 0]``), if stated."""
    iteration: int | None = None
    """Iteration the block belongs to, when it can be attributed (the next iteration line for
    per-step DeepSpeed timers; the preceding one for Megatron blocks)."""
    line: int | None = None
    """1-based line number in the source file."""


@dataclass(frozen=True, slots=True)
class PipelineStep:
    """DeepSpeed PipelineEngine ``steps: N loss: L iter time (s): T samples/sec: S`` line."""

    step: int
    """Optimizer step count."""
    loss: float | None
    """Loss printed by the engine."""
    iter_ms: float | None
    """Per-step time in ms (the line prints seconds)."""
    samples_per_s: float | None
    """Samples per second as printed."""
    line: int | None = None
    """1-based line number in the source file."""


@dataclass
class ParsedRun:
    """Everything one training run's log says. Mutable while the parser fills it."""

    status: RunStatus = "incomplete"
    """See ``RunStatus``."""
    failure: Failure | None = None
    """The first failure recognised, or None."""
    further_failures: list[Failure] = field(default_factory=list)
    """Failures recognised after the first (another rank's, a consequence), in log order; each
    is also named in ``problems``."""
    interrupted: bool = False
    """The launcher's own outcome marker (``# run outcome: interrupted``) says the run was
    cancelled by a signal (Ctrl-C, SIGTERM); ``status`` is then ``failed`` with kind
    ``cancelled``, and a run directory's ``run.json`` says ``interrupted``."""
    iterations: Sequence[Iteration] = field(default_factory=lambda: IterationTable())
    """Iteration lines in file order, duplicates (same iteration from several ranks) removed
    (an ``IterationTable``: typed columns; a plain list works too)."""
    memory: Sequence[Memory] = field(default_factory=lambda: MemoryTable())
    """Every Megatron ``memory (MB)`` report (``report_memory``: exact MiB, per rank)."""
    memory_other: Sequence[Memory] = field(default_factory=lambda: MemoryTable())
    """Coarser memory figures kept apart from ``memory``: DeepSpeed's ``MemAllocated=..GB``
    and ``see_memory_usage`` (``MA .. GB ... Max_CA .. GB``), printed in GB rounded to 2
    decimals (``Max_CA`` to a whole GB), so they must not feed a peak-memory figure."""
    timers: Sequence[TimerBlock] = field(default_factory=lambda: TimerTable())
    """Every timer block, in line order (a ``TimerTable``; a plain list works too)."""
    pipeline_steps: Sequence[PipelineStep] = field(default_factory=lambda: PipelineStepTable())
    """PipelineEngine step lines (a ``PipelineStepTable``; a plain list works too)."""
    config: dict[str, Any] = field(default_factory=dict)
    """Configuration recovered from the log: Megatron's ``arguments`` dump (typed values) and
    summary keys ``num_layers, hidden_size, num_attention_heads, seq_length, micro_batch_size,
    global_batch_size, tensor_model_parallel_size, pipeline_model_parallel_size,
    data_parallel_size, zero_stage, world_size, padded_vocab_size, num_parameters``."""
    ds_config: dict[str, Any] = field(default_factory=dict)
    """DeepSpeed's config dump, if printed."""
    ds_engine: dict[str, Any] = field(default_factory=dict)
    """DeepSpeed's ``DeepSpeedEngine configuration:`` attribute dump (typed), if printed."""
    versions: dict[str, str] = field(default_factory=dict)
    """Versions the log states (torch, deepspeed, megatron git hash)."""
    problems: list[str] = field(default_factory=list)
    """What the parser could not read or had to guess, in words (never raised)."""
    sources: list[str] = field(default_factory=list)
    """Files that fed this run."""
    first_line: int | None = None
    """1-based line where this run starts in its (first) file."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict following DESIGN.md's RUN contract (plus extra keys)."""
        d: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "timers":
                d[f.name] = [block_dict(b) for b in value]
            elif f.name in RECORD_LISTS:
                d[f.name] = [asdict(x) for x in value]
            else:
                d[f.name] = asdict(value) if f.name == "failure" and value else deepcopy(value)
        return d

    def nbytes(self) -> dict[str, int]:
        """Bytes held by the typed columns of each record table (0 for plain lists)."""
        return {name: getattr(getattr(self, name), "nbytes", 0) for name in RECORD_LISTS[:5]}


RECORD_LISTS = (
    "iterations",
    "memory",
    "memory_other",
    "timers",
    "pipeline_steps",
    "further_failures",
)
"""The fields of ``ParsedRun`` that hold records (JSON lists of objects)."""


def block_dict(block: TimerBlock) -> dict[str, Any]:
    """A timer block as JSON-ready dict (pairs as lists)."""
    d = asdict(block)
    d["values_ms"] = {
        k: (list(v) if isinstance(v, tuple) else v) for k, v in block.values_ms.items()
    }
    return d


# -- typed column tables ----------------------------------------------------------------------


class IterationTable(RecordTable[Iteration]):
    """``Iteration`` records as typed columns."""

    record = Iteration
    ints = frozenset(
        ("iteration", "skipped", "nan", "global_batch_size", "consumed_samples",
         "consumed_tokens", "train_iters", "line")
    )  # fmt: skip
    strs = frozenset(("source",))


class MemoryTable(RecordTable[Memory]):
    """``Memory`` records as typed columns."""

    record = Memory
    ints = frozenset(("rank", "after_iteration", "line"))
    strs = frozenset(("kind",))


class PipelineStepTable(RecordTable[PipelineStep]):
    """``PipelineStep`` records as typed columns."""

    record = PipelineStep
    ints = frozenset(("step", "line"))


class _Group:
    """Timer blocks of one source and one set of names: one column per value."""

    __slots__ = ("cols", "names", "shape", "source")

    def __init__(self, source: str, names: tuple[str, ...], shape: tuple[int, ...]) -> None:
        self.source = source
        self.names = names
        self.shape = shape  # per name: 0 = one number, k = a k-tuple
        self.cols = [Column("f") for k in shape for _ in range(max(k, 1))]

    def values(self, flat: Sequence[Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        j = 0
        for name, k in zip(self.names, self.shape, strict=True):
            if k:
                out[name] = tuple(flat[j : j + k])
                j += k
            else:
                out[name] = flat[j]
                j += 1
        return out


def timer_shape(values: dict[str, Any]) -> tuple[int, ...]:
    return tuple(len(v) if isinstance(v, tuple) else 0 for v in values.values())


class TimerTable(Rows[TimerBlock]):
    """``TimerBlock`` records as typed columns: the blocks of one source and one set of timer
    names (one "group", e.g. DeepSpeed's ``fwd bwd bwd_inner bwd_allreduce step``) share a
    column per timer; each block is a group index, rank, iteration and line."""

    def __init__(self, items: Iterable[TimerBlock] = ()) -> None:
        self._groups: list[_Group] = []
        self._gindex: dict[tuple[Any, ...], int] = {}
        self._gid = Column("i")
        self._rank = Column("i")
        self._iteration = Column("i")
        self._line = Column("i")
        for b in items:
            self.append(b)

    # -- groups -----------------------------------------------------------------------------

    def group(self, source: str, names: tuple[str, ...], shape: tuple[int, ...]) -> int:
        """Index of the group of ``source`` blocks with these timer names (added when new)."""
        key = (source, names, shape)
        g = self._gindex.get(key)
        if g is None:
            g = self._gindex[key] = len(self._groups)
            self._groups.append(_Group(source, names, shape))
        return g

    @property
    def groups(self) -> list[tuple[str, tuple[str, ...], tuple[int, ...]]]:
        """(source, names, shape) of every group, by index."""
        return [(g.source, g.names, g.shape) for g in self._groups]

    def group_ids(self) -> np.ndarray:
        """Group index of every block (the stored array, in the narrowest int type)."""
        return self._gid.array() if len(self._gid) else np.zeros(0, dtype=np.int8)

    def column(self, name: str) -> Column:
        """``rank``, ``iteration`` or ``line`` of every block."""
        return {"rank": self._rank, "iteration": self._iteration, "line": self._line}[name]

    # -- writing ----------------------------------------------------------------------------

    def append(self, block: TimerBlock) -> None:
        """Add one block."""
        values = block.values_ms
        g = self.group(block.source, tuple(values), timer_shape(values))
        cols = self._groups[g].cols
        flat = [x for v in values.values() for x in (v if isinstance(v, tuple) else (v,))]
        for col, x in zip(cols, flat, strict=True):
            col.append(x)
        self._gid.append(g)
        self._rank.append(block.rank)
        self._iteration.append(block.iteration)
        self._line.append(block.line)

    def extend(self, items: Iterable[TimerBlock]) -> None:
        """Add blocks (another table's column-wise: its arrays are shared, not copied)."""
        if not isinstance(items, TimerTable):
            for b in items:
                self.append(b)
            return
        remap = [self.group(g.source, g.names, g.shape) for g in items._groups]
        for g_other, g in zip(items._groups, remap, strict=True):
            for mine, theirs in zip(self._groups[g].cols, g_other.cols, strict=True):
                mine.concat(theirs)
        if remap == list(range(len(remap))):
            self._gid.concat(items._gid)
        else:
            to = np.array(remap, dtype=np.int8 if len(self._groups) < 2**7 else np.int64)
            self._gid.add_ints(to[items.group_ids()], copy=False)  # (no wider array)
        for name in ("rank", "iteration", "line"):
            self.column(name).concat(items.column(name))

    def add_rows(
        self,
        g: int,
        values: np.ndarray,
        rank: Any,
        iteration: Any,
        line: np.ndarray,
    ) -> None:
        """Add blocks of group ``g`` column-wise: ``values`` (blocks x numbers, float; NaN
        is None); ``rank`` and ``iteration`` an int array or one value for all; lines."""
        n = len(line)
        if not n:
            return
        for j, col in enumerate(self._groups[g].cols):
            col.add_floats(values[:, j])
        self._gid.add_const(g, n)
        for col, v in ((self._rank, rank), (self._iteration, iteration)):
            if isinstance(v, np.ndarray):
                col.add_ints(v)
            else:
                col.add_const(v, n)
        self._line.add_ints(line)

    def set_source(self, g: int, source: str) -> None:
        """Change the source of a group (the merge re-sources DeepSpeed blocks of a pipeline
        run); when a group of that source and names is already present, the two stay
        apart (each keeps its blocks in their order) and new blocks go to the first."""
        grp = self._groups[g]
        del self._gindex[(grp.source, grp.names, grp.shape)]
        grp.source = source
        key = (source, grp.names, grp.shape)
        if key in self._gindex:  # two groups now the same: keep them apart (order is kept)
            self._gindex[(source, grp.names, grp.shape, g)] = g
        else:
            self._gindex[key] = g

    def set_iterations(self, values: np.ndarray, none: np.ndarray) -> None:
        """Replace the iteration of every block (None where ``none``); ``values`` is kept
        (changed where ``none``)."""
        self._iteration = Column("i")
        self._iteration.add_ints(values, none, copy=False)

    def sort_by_line(self) -> None:
        """Order the blocks by line (stable; a block without a line sorts as line 0), as the
        log printed them.  When one stretch already in order holds most blocks (Megatron's
        blocks beside DeepSpeed's), the others are sorted and inserted into it (one new array a
        column, no index per block); else all are sorted."""
        n = len(self)
        lines = self._line.array() if n > 1 else np.zeros(0, dtype=np.int8)
        if (missing := lines == none_of(lines.dtype)).any():
            lines = np.where(missing, 0, lines)
        del missing
        bounds = [0, *(np.flatnonzero(lines[1:] < lines[:-1]) + 1).tolist(), n]
        if len(bounds) < 3:
            return
        longest = max(range(len(bounds) - 1), key=lambda i: bounds[i + 1] - bounds[i])
        a, b = bounds[longest], bounds[longest + 1]
        gid = self.group_ids()
        if 8 * (n - (b - a)) > n:  # no stretch holds most: every block sorted
            order = np.argsort(lines, kind="stable").astype(np.int32 if n < 2**31 else np.int64)
            groups = list(range(len(self._groups)))
            moved = lambda col: col.take(order)  # noqa: E731
        else:
            rest = np.concatenate([np.arange(a), np.arange(b, n)])
            rest = rest[np.argsort(lines[rest], kind="stable")]
            at = np.searchsorted(lines[a:b], lines[rest], "left")  # (before the stretch: first)
            after = rest >= b
            at[after] = np.searchsorted(lines[a:b], lines[rest[after]], "right")
            groups = np.unique(gid[rest]).tolist()  # (a group only in the stretch is in order)
            moved = lambda col: col.inserted(slice(a, b), at, rest)  # noqa: E731
        for g in groups:
            own = lines[gid == g]
            if (own[1:] < own[:-1]).any():
                within = np.argsort(own, kind="stable")
                self._groups[g].cols = [c.take(within) for c in self._groups[g].cols]
        del gid, lines
        for name in ("_gid", "_rank", "_iteration", "_line"):
            setattr(self, name, moved(getattr(self, name)))

    # -- reading ----------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._gid)

    def __iter__(self) -> Iterator[TimerBlock]:
        return self._blocks(range(len(self._groups)))

    def _row(self, i: int) -> TimerBlock:
        g = self._gid[i]
        k = int((self.group_ids()[:i] == g).sum())
        grp = self._groups[g]
        flat = [c[k] for c in grp.cols]
        return TimerBlock(
            grp.source, grp.values(flat), self._rank[i], self._iteration[i], self._line[i]
        )  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return f"TimerTable({len(self)} blocks in {len(self._groups)} groups, {self.nbytes} bytes)"

    def json_blocks(self, sep: str, size: int = 1 << 12) -> Iterator[str]:
        """The blocks as JSON objects (as ``json`` writes ``block_dict`` of each) joined by
        ``sep``, ``size`` at a time, from the texts of whole columns (no dict per block)."""
        templates = []  # per group: the texts around its values, rank, iteration and line
        for grp in self._groups:
            parts = ['{"source": ' + json.dumps(grp.source) + ', "values_ms": {']
            for i, (n, k) in enumerate(zip(grp.names, grp.shape, strict=True)):
                parts[-1] += (", " if i else "") + json_key(n) + ("[" if k else "")
                parts += [", "] * (k - 1) + ["]" if k else ""]
            parts[-1] += '}, "rank": '
            templates.append([*parts, ', "iteration": ', ', "line": ', "}" + sep])
        width = np.array([2 * len(t) - 1 for t in templates])  # pieces of a block of each
        values = [[c.text_reader() for c in grp.cols] for grp in self._groups]
        done = [0] * len(self._groups)  # blocks of each group written
        common = [c.text_reader() for c in (self._rank, self._iteration, self._line)]
        gids = self.group_ids()
        for s in range(0, len(self), size):
            gid = gids[s : s + size]
            rest = [r(s, s + size) for r in common]
            ends = np.cumsum(width[gid])
            pieces = np.empty(int(ends[-1]), dtype=object)
            for g in np.flatnonzero(np.bincount(gid)).tolist():
                at = np.flatnonzero(gid == g)
                cols = [r(done[g], done[g] + len(at)) for r in values[g]]
                done[g] += len(at)
                json_rows(pieces, ends[at] - width[g], templates[g], cols + [r[at] for r in rest])
            yield "".join(pieces.tolist())[: -len(sep) or None]

    def blocks_of(self, source: str) -> Iterator[TimerBlock]:
        """The blocks of one source, in order (only their groups are read)."""
        return self._blocks([g for g, grp in enumerate(self._groups) if grp.source == source])

    def _blocks(self, gs: Sequence[int]) -> Iterator[TimerBlock]:
        """The blocks of groups ``gs``, in order, converted a few at a time."""
        gid = self.group_ids()
        readers = {g: zip(*self._groups[g].cols, strict=True) for g in gs}
        for s in range(0, len(gid) if gs else 0, _BLOCKS_AT_A_TIME):
            part = s + np.flatnonzero(np.isin(gid[s : s + _BLOCKS_AT_A_TIME], gs))
            ranks, its, lines = (c.at(part) for c in (self._rank, self._iteration, self._line))
            for g, rank, it, line in zip(gid[part].tolist(), ranks, its, lines, strict=True):
                grp = self._groups[g]
                yield TimerBlock(grp.source, grp.values(next(readers[g])), rank, it, line)  # type: ignore[arg-type]

    @property
    def nbytes(self) -> int:
        """Bytes of the stored values."""
        cols = [self._gid, self._rank, self._iteration, self._line]
        cols += [c for g in self._groups for c in g.cols]
        return sum(c.nbytes for c in cols)


# -- column views for consumers (tables and plain lists alike) -------------------------------


def record_values(records: Sequence[Any], name: str) -> np.ndarray:
    """One numeric field of every record as float64 (None as NaN)."""
    if isinstance(records, RecordTable):
        return records.column(name).floats()
    return np.array([np.nan if (v := getattr(r, name)) is None else float(v) for r in records])


def int_values(records: Sequence[Any], name: str) -> np.ndarray | list[int]:
    """One int field of every record (an iteration or step number, never None): a table's
    column as int64, read as stored (no record object per row); else, or when a number does
    not fit 64 bits, the Python ints."""
    if isinstance(records, RecordTable):
        col = records.column(name)
        try:
            return col.ints()
        except OverflowError:
            return list(col)
    return [getattr(r, name) for r in records]


def blocks_of(timers: Sequence[TimerBlock], source: str) -> Iterator[TimerBlock]:
    """The timer blocks of one source, in order (a table reads only those)."""
    if not isinstance(timers, TimerTable):
        yield from (b for b in timers if b.source == source)
        return
    yield from timers.blocks_of(source)


class _LazyValues(dict):  # type: ignore[type-arg]
    """Name -> values of a timer group, read from its columns on first access."""

    def __init__(self, grp: _Group) -> None:
        super().__init__()
        self.grp = grp

    def __missing__(self, name: str) -> np.ndarray:
        grp = self.grp
        j = 0
        for n, k in zip(grp.names, grp.shape, strict=True):
            if n == name:
                cols = [c.floats() for c in grp.cols[j : j + max(k, 1)]]
                value = cols[0] if len(cols) == 1 else np.maximum.reduce(cols)
                self[name] = value
                return value
            j += max(k, 1)
        raise KeyError(name)


@dataclass(frozen=True)
class TimerGroupView:
    """The blocks of one source and one set of timer names, column-wise."""

    names: tuple[str, ...]
    """Timer names, in printed order."""
    shape: tuple[int, ...]
    """Per name: 0 = one number, k = a k-tuple (Megatron's (min, max))."""
    rows: np.ndarray
    """Positions of the blocks among all blocks (int64), ascending."""
    iteration: np.ndarray
    """Iteration of each block (float64, NaN = not attributed)."""
    values: dict[str, np.ndarray]
    """Name -> values (float64, NaN = None); a tuple name gives ``name`` (its largest element)
    only."""


def timer_groups(
    timers: Sequence[TimerBlock],
    source: str,
    names: Callable[[tuple[str, ...]], bool] | None = None,
) -> list[TimerGroupView]:
    """The blocks of one source as column groups (one per set of names, blocks in order);
    ``names``: only the groups whose names it accepts."""
    table = timers if isinstance(timers, TimerTable) else TimerTable(timers)
    gid = table.group_ids()
    out = []
    for g, grp in enumerate(table._groups):
        if grp.source == source and (names is None or names(grp.names)):
            rows = np.flatnonzero(gid == g)
            its = table._iteration.floats(rows)  # values are read when asked for:
            out.append(TimerGroupView(grp.names, grp.shape, rows, its, _LazyValues(grp)))
    return out
