"""Straggler ranks: each timer's steady-state time on every rank, its slowest rank and that
rank's node, the excess over the median rank, and whether it stands out of the ranks' scatter.

Sources, per rank: Megatron's ``times across ranks (ms):`` blocks (``--timing-log-option all``,
``TIMERS=all``), which the last rank prints with every rank's time of each timer (upstream
``megatron/timers.py`` ``_get_all_ranks_time_string``: ``  name:`` then ``     rank  r: ms``
lines, already per iteration); and DeepSpeed's ``[Rank r] time (ms) | ...`` lines when more
than one rank printed them.  The parser keeps a ``times across ranks`` block as each timer's
(min, max) only, so those blocks are read here from the run's log files, line by line, with
the parser's own launcher-prefix rule (:func:`analysis.parse.lines.split_prefix`).

Megatron prints its iteration line on the last rank only, so the logs hold no per-node
iteration progress: a slow node shows in the timers of its ranks, not in iteration lines.
With ``TIMERS=all`` the block holds the schedule's ``forward-compute`` and ``backward-compute``
too (the spec's ``schedule_timers``); every timer of a block is judged, by name.

A profiled run (``PROFILE=1``) adds every rank's profiler trace, broken down by
:mod:`analysis.metrics.traces`: its ``trace compute`` ms per iteration (a slow node's rank
computes longer) and, as a second view, its ``trace wait`` (exposed communication + idle: the
others wait in their collectives for it, so the straggler is the rank that waits *least*).  Both
go through the same rule; on ``trace wait`` the straggler's side of the median is below it.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from analysis.metrics.rows import steady_state
from analysis.metrics.timers import outside
from analysis.metrics.traces import breakdown
from analysis.parse.lines import split_prefix
from analysis.parse.records import ParsedRun, blocks_of
from analysis.runs.load import LoadedRun
from analysis.runs.traces import run_traces
from analysis.theory.formulas import SCATTER_FLOOR, WARMUP_K

STRAGGLER_RULE = (
    f"a rank is a straggler on a timer when its steady-state mean lies more than {WARMUP_K} "
    f"scaled MADs (1.4826 x the median absolute deviation over the ranks, at least "
    f"{SCATTER_FLOOR:.0%} of the median) above the median rank (modified z-score > {WARMUP_K}, "
    "Iglewicz-Hoaglin: the steady-state rule's outlier cut, applied across ranks instead of "
    f"windows) and its excess over the median rank is at least {SCATTER_FLOOR:.0%} of the "
    "iteration time (less cannot slow an iteration beyond its own scatter floor); judged with "
    f"{3} ranks or more (with two, the median lies halfway and neither stands out); on a "
    "profiler trace's wait (exposed communication + idle) the straggler is the rank the others "
    "wait for, so the same cut is applied below the median"
)
"""How a straggler is told from the ranks' normal scatter (report and docs quote it)."""

COLLECTIVE_ENDS = (
    "Timers that end in a collective hide a slow rank: the others wait for it inside the "
    "collective, so its lost time is theirs too, and such a timer is expected to name no "
    "straggler: `forward-backward` (the gradient all-reduce, or ZeRO's reduce), "
    "`forward-compute` (pretrain_gpt.py's loss all-reduce over the data-parallel ranks: there "
    "the rank the others wait for is the fastest), ZeRO-1/2's `optimizer` (the parameter "
    "all-gather) and `backward-compute` under ZeRO-2/3 (the gradients are reduced after every "
    "micro-batch). Under ZeRO-0/1 only the last micro-batch's backward ends in the reduce, so "
    "with two micro-batches or more `backward-compute` holds backward passes that no "
    "collective ends: the timer that names a slow rank there"
)
"""Which Megatron timers can name a slow rank under DeepSpeed and which cannot (report and
docs quote it)."""

MIN_RANKS = 3
"""Ranks a timer needs before its slowest rank is judged."""

TRACE_COMPUTE = "trace compute"
"""Timer name of a rank's profiler-trace compute (ms per profiled iteration)."""
TRACE_WAIT = "trace wait"
"""Timer name of a rank's profiler-trace exposed communication + idle (ms per iteration)."""
TRACE_SOURCE = "profiler"
"""Source name of the per-rank profiler-trace views."""

_TIMES_HEAD = "times across ranks (ms):"
_RANK_RE = re.compile(r"^\s+rank\s+(\d+):\s+([-+]?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)\s*$")
_NAME_RE = re.compile(r"^\s{1,4}(\S[^:]*):\s*$")
_ITER_RE = re.compile(r"\biteration\s+(\d+)\s*/\s*\d+")
_MAPPING_RE = re.compile(r"global_rank_mapping=defaultdict\(<class 'list'>, (\{.*\})\)")
_LOCAL_RE = re.compile(r"nnodes=(\d+), num_local_procs=(\d+)")


@dataclass
class RankTimes:
    """What the run's log files say per rank, beside what the parser keeps."""

    blocks: list[tuple[int | None, dict[str, dict[int, float]]]] = field(default_factory=list)
    """Every ``times across ranks`` block: (iteration of the last iteration line of its
    stream before it, or None; timer name -> rank -> ms per iteration)."""
    rank_hosts: dict[int, str] = field(default_factory=dict)
    """Rank -> host, from DeepSpeed's launcher line ``global_rank_mapping=...``."""
    local_procs: int | None = None
    """Ranks per node from the launcher's ``nnodes=N, num_local_procs=M`` line."""


def read_rank_times(lines: Iterable[str], into: RankTimes | None = None) -> RankTimes:
    """The ``times across ranks`` blocks and the rank-to-host mapping of a log's lines."""
    out = into if into is not None else RankTimes()
    last_iter: dict[str, int] = {}
    open_blocks: dict[str, tuple[dict[str, dict[int, float]], list[str]]] = {}
    for raw in lines:
        key, text = split_prefix(raw.rstrip("\n"))
        block = open_blocks.get(key)
        if block is not None:
            values, name = block
            m = _RANK_RE.match(text)
            if m and name:
                values.setdefault(name[0], {})[int(m.group(1))] = float(m.group(2))
                continue
            n = _NAME_RE.match(text)
            if n:
                name[:] = [n.group(1).strip()]
                continue
            del open_blocks[key]  # any other line of the stream closes the block
        if _TIMES_HEAD in text and "(min, max)" not in text and "max time" not in text:
            values = {}
            out.blocks.append((last_iter.get(key), values))
            open_blocks[key] = (values, [])
            continue
        if "iteration" in text:
            m = _ITER_RE.search(text)
            if m:
                last_iter[key] = int(m.group(1))
            continue
        if "global_rank_mapping=" in text:
            m = _MAPPING_RE.search(text)
            if m:
                try:
                    mapping = ast.literal_eval(m.group(1))
                except (ValueError, SyntaxError):
                    continue
                for host, ranks in mapping.items():
                    for r in ranks:
                        out.rank_hosts[int(r)] = str(host)
            continue
        if "num_local_procs" in text:
            m = _LOCAL_RE.search(text)
            if m:
                out.local_procs = int(m.group(2))
    return out


def read_rank_files(paths: Sequence[Path]) -> RankTimes:
    """:func:`read_rank_times` of every file, in order."""
    out = RankTimes()
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as fh:
            read_rank_times(fh, out)
    return out


@dataclass(frozen=True)
class TimerVerdict:
    """One timer across the ranks."""

    timer: str
    """Timer name as printed."""
    source: str
    """``megatron`` (``times across ranks``), ``deepspeed`` (per-rank ``time (ms)`` lines) or
    ``profiler`` (each rank's profiler trace)."""
    ranks: int
    """Ranks that printed it."""
    windows: int
    """Steady-state blocks (logging windows or steps) averaged per rank."""
    median_ms: float
    """Median over the ranks of their mean (ms per iteration)."""
    slowest_rank: int
    """Rank with the largest mean."""
    slowest_node: str | None
    """Its node (host), None when the logs and run record name none."""
    slowest_ms: float
    """Its mean (ms per iteration)."""
    excess_ms: float
    """slowest - median (ms)."""
    excess_pct: float | None
    """excess / median (%), None when the median is 0."""
    bound_ms: float
    """median + 3.5 x max(1.4826 x MAD, 2% of the median): above it a rank stands out."""
    stragglers: tuple[int, ...]
    """Ranks judged stragglers on this timer (slowest first): above ``bound_ms`` with an excess
    of at least 2% of the iteration; empty when none."""
    straggler_nodes: tuple[str | None, ...]
    """Their nodes, in the same order."""
    low: bool = False
    """True when the straggler's side of the median is below it (``trace wait``: the rank the
    others wait for waits least); ``slowest_*`` is then the rank furthest below, ``excess_ms``
    its shortfall (median - its ms) and ``bound_ms`` median - 3.5 x scatter."""


@dataclass(frozen=True)
class StragglerResult:
    """A run's straggler analysis."""

    verdicts: tuple[TimerVerdict, ...] = ()
    """Every timer judged (at least ``MIN_RANKS`` ranks), Megatron's first."""
    iter_ms: float | None = None
    """Steady-state iteration time (ms) the 2% materiality floor is taken of."""
    nodes_from: str | None = None
    """Where the rank-to-node mapping came from, or None when there is none."""
    na: str | None = None
    """Why nothing was judged (no per-rank timers, too few ranks, no steady state)."""

    @property
    def stragglers(self) -> list[TimerVerdict]:
        """The timers with a straggler."""
        return [v for v in self.verdicts if v.stragglers]

    @property
    def agree_pct(self) -> float | None:
        """Largest excess of a slowest rank over the median rank (% of the median), among the
        timers whose median is at least 2% of the iteration (tiny timers' percentages are
        noise); None when no timer is that large."""
        floor = SCATTER_FLOOR * (self.iter_ms or 0.0)
        pcts = [v.excess_pct for v in self.verdicts if v.median_ms >= floor and v.excess_pct]
        return max(pcts) if pcts else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (summary.json's ``stragglers`` of a run)."""
        return {
            "stragglers": [
                {
                    "timer": v.timer,
                    "source": v.source,
                    "ranks": list(v.stragglers),
                    "nodes": list(v.straggler_nodes),
                    "excess_ms": v.excess_ms,
                }
                for v in self.stragglers
            ],
            "agree_pct": self.agree_pct,
            "iter_ms": self.iter_ms,
            "nodes_from": self.nodes_from,
            "na": self.na,
            "rule": STRAGGLER_RULE,
            "timers": [asdict(v) for v in self.verdicts],
        }


def judge(
    timer: str,
    source: str,
    means: dict[int, float],
    windows: int,
    iter_ms: float,
    node_of: dict[int, str],
    low: bool = False,
) -> TimerVerdict:
    """The verdict on one timer from every rank's mean (``MIN_RANKS`` or more ranks); ``low``
    judges the side below the median (see :attr:`TimerVerdict.low`)."""
    sign = -1.0 if low else 1.0
    ranks = np.array(sorted(means), dtype=np.int64)
    ms = np.array([means[int(r)] for r in ranks], dtype=float)
    median = float(np.median(ms))
    scatter = max(1.4826 * float(np.median(np.abs(ms - median))), SCATTER_FLOOR * abs(median))
    bound = median + sign * WARMUP_K * scatter
    side = sign * (ms - median)  # (how far each rank lies on the straggler's side)
    order = np.argsort(-side, kind="stable")
    slow = int(order[0])
    out = [
        int(ranks[i])
        for i in order
        if side[i] > WARMUP_K * scatter and side[i] >= SCATTER_FLOOR * iter_ms
    ]
    excess = float(side[slow])
    return TimerVerdict(
        timer=timer,
        source=source,
        ranks=len(ranks),
        windows=windows,
        median_ms=median,
        slowest_rank=int(ranks[slow]),
        slowest_node=node_of.get(int(ranks[slow])),
        slowest_ms=float(ms[slow]),
        excess_ms=excess,
        excess_pct=100.0 * excess / median if median else None,
        bound_ms=bound,
        stragglers=tuple(out),
        straggler_nodes=tuple(node_of.get(r) for r in out),
        low=low,
    )


def _kept(iteration: float | None, first: int, pauses: Sequence[tuple[int, int]]) -> bool:
    if iteration is None or iteration != iteration:  # (None or NaN: not attributed)
        return False
    return iteration >= first and bool(outside(np.array([iteration]), pauses)[0])


def megatron_means(
    times: RankTimes, first: int, pauses: Sequence[tuple[int, int]]
) -> dict[str, tuple[dict[int, float], int]]:
    """Timer -> (rank -> mean ms over the steady-state blocks, blocks) of the Megatron
    ``times across ranks`` blocks attributed to a steady-state iteration."""
    sums: dict[str, dict[int, list[float]]] = {}
    count: dict[str, int] = {}
    for it, values in times.blocks:
        if not _kept(it, first, pauses):
            continue
        for name, per_rank in values.items():
            count[name] = count.get(name, 0) + 1
            for r, ms in per_rank.items():
                sums.setdefault(name, {}).setdefault(r, []).append(ms)
    return {
        name: ({r: float(np.mean(v)) for r, v in ranks.items()}, count[name])
        for name, ranks in sums.items()
    }


def deepspeed_means(
    parsed: ParsedRun, first: int, pauses: Sequence[tuple[int, int]]
) -> dict[str, tuple[dict[int, float], int]]:
    """Timer -> (rank -> mean ms, steps) of DeepSpeed's per-rank ``time (ms)`` lines attributed
    to a steady-state iteration (``_microstep`` duplicates left out)."""
    sums: dict[str, dict[int, list[float]]] = {}
    for block in blocks_of(parsed.timers, "deepspeed"):
        if block.rank is None or not _kept(block.iteration, first, pauses):
            continue
        for name, value in block.values_ms.items():
            if name.endswith("_microstep") or not isinstance(value, int | float):
                continue
            sums.setdefault(name, {}).setdefault(block.rank, []).append(float(value))
    return {
        name: ({r: float(np.mean(v)) for r, v in ranks.items()}, min(map(len, ranks.values())))
        for name, ranks in sums.items()
    }


def trace_means(run_dir: Path) -> tuple[dict[str, tuple[dict[int, float], int]], list[str]]:
    """``trace compute`` and ``trace wait`` -> (rank -> ms per profiled iteration, fewest
    profiled iterations of a rank) of a run directory's profiler traces (none when it has no
    trace with a rank), and why each unusable trace was left out."""
    traces, problems = run_traces(run_dir)
    compute: dict[int, float] = {}
    wait: dict[int, float] = {}
    steps: list[int] = []
    for trace in traces:
        if trace.rank is None:
            problems.append(f"{trace.path}: no distributedInfo rank")
            continue
        try:
            b = breakdown(trace)
        except ValueError as exc:
            problems.append(str(exc))
            continue
        compute[trace.rank] = b.compute_ms
        wait[trace.rank] = b.comm_ms + b.idle_ms
        steps.append(b.steps)
    if not compute:
        return {}, problems
    return {TRACE_COMPUTE: (compute, min(steps)), TRACE_WAIT: (wait, min(steps))}, problems


def node_names(
    times: RankTimes, run: LoadedRun, world: int | None
) -> tuple[dict[int, str], str | None]:
    """Rank -> node name and where it came from: DeepSpeed's ``global_rank_mapping`` line, else
    the run record's hosts and slots (DeepSpeed numbers ranks host after host), else the
    launcher's ``num_local_procs`` (node index = rank // ranks per node); a lab host's address
    is shown with the lab's node name."""
    spec = run.record.spec if run.record is not None else None
    cluster = (spec or {}).get("cluster") or {}
    names: dict[str, str] = {}
    network = run.record.network if run.record is not None else None
    for node in network.nodes if network is not None else []:
        if isinstance(node, dict) and node.get("address") and node.get("name"):
            names[str(node["address"])] = f"{node['name']} ({node['address']})"
    if times.rank_hosts:
        return {r: names.get(h, h) for r, h in times.rank_hosts.items()}, (
            "DeepSpeed's launcher line global_rank_mapping"
        )
    hosts, slots = cluster.get("hosts") or [], cluster.get("slots") or []
    if hosts and len(hosts) == len(slots):
        out: dict[int, str] = {}
        for host, k in zip(hosts, slots, strict=True):
            for _ in range(int(k)):
                out[len(out)] = names.get(str(host), str(host))
        return out, "run.json's hosts and slots (ranks numbered host after host)"
    if times.local_procs and world:
        per = times.local_procs
        return (
            {r: f"node index {r // per}" for r in range(world)},
            f"the launcher's num_local_procs={per} (node index = rank // {per})",
        )
    return {}, None


def analyze(run: LoadedRun, logdir: Path) -> StragglerResult:
    """The straggler analysis of one run (its log files read again for the per-rank blocks)."""
    parsed = run.parsed
    if parsed is None:
        return StragglerResult(na="no log")
    steady, why = steady_state(parsed)
    if steady is None:
        return StragglerResult(na=why or "no steady state")
    first, pauses = steady.first_iteration, steady.pause_ranges
    iter_ms = steady.stats.mean
    option = parsed.config.get("timing_log_option")
    times = RankTimes()
    if option in (None, "all") and next(blocks_of(parsed.timers, "megatron"), None) is not None:
        paths = [logdir / p for p in run.log_files]  # (else no block can be a per-rank one)
        times = read_rank_files([p for p in paths if p.is_file()])
    mg = megatron_means(times, first, pauses)
    ds = deepspeed_means(parsed, first, pauses)
    root = logdir if logdir.is_dir() else logdir.parent
    pt, _unread = trace_means(root / run.path) if run.kind == "run_dir" else ({}, [])
    per_timer = [("megatron", k, v) for k, v in mg.items()]
    per_timer += [("deepspeed", k, v) for k, v in ds.items()]
    per_timer += [(TRACE_SOURCE, k, v) for k, v in pt.items()]
    most = max((len(v[0]) for _s, _k, v in per_timer), default=0)
    if most < MIN_RANKS:
        n_mg = max((len(v[0]) for v in mg.values()), default=0)
        n_ds = max((len(v[0]) for v in ds.values()), default=0)
        why = (
            f"Megatron's times across ranks of {n_mg} rank(s)"
            if n_mg
            else f"no times across ranks block (Megatron's --timing-log-option is "
            f"{option or 'not stated in the log'}; TIMERS=all prints every rank's)"
        )
        why += f", DeepSpeed timer lines of {n_ds} rank(s)" if n_ds else ", no DeepSpeed timers"
        return StragglerResult(
            iter_ms=iter_ms, na=f"per-rank timers of {MIN_RANKS} ranks or more needed: {why}"
        )
    node_of, nodes_from = node_names(times, run, parsed.config.get("world_size") or most)
    verdicts = tuple(
        judge(name, source, means, windows, iter_ms, node_of, low=name == TRACE_WAIT)
        for source, name, (means, windows) in per_timer
        if len(means) >= MIN_RANKS
    )
    return StragglerResult(verdicts=verdicts, iter_ms=iter_ms, nodes_from=nodes_from)
