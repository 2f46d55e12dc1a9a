"""Per-rank time breakdown of profiler traces: compute, communication, memory copy and idle ms per
iteration, and the communication-computation overlap, with Holistic Trace Analysis' definitions.

HTA (``hta.trace_analysis``: temporal breakdown, communication-computation overlap) reads the
GPU kernels of each rank: compute kernels, communication (NCCL) kernels, memory copies and sets,
and the GPU's idle time between them; the overlap is the share of communication time during
which a compute kernel runs. The same definitions are applied here to the timeline a trace has:

- a CUDA trace (kernels present): the GPU kernels and copies, as HTA does;
- a CPU trace: the operators the profiler records on every thread of the rank's process.
  Communication is an operator of ``torch.distributed`` (``c10d::*``) or the backend's own
  work (``gloo:*`` on gloo's threads), with everything nested in it; memory copy is
  ``aten::copy_`` and what it calls; compute is every other operator (its self time: the
  copies and collectives it calls are theirs); idle is the rest of the iteration, when no
  operator runs on any thread (Python between operators, the data loader, the schedule).

Each instant of an iteration counts once, first match: compute, then communication (the part
not hidden behind compute: the exposed communication), then memory copy, then idle; so the four
add up to the iteration. Iterations are the profiler's ``ProfilerStep#N`` annotations, which
tile the recorded steps (each from one ``profiler.step()`` to the next). Those are CPU times;
the GPU runs behind them. So on a CUDA trace whose events carry correlation ids the steps are
taken on the GPU, as HTA takes them: the kernels and copies launched (by a runtime call, matched
by correlation id) within the profiled steps, from the first one's start to the last one's end,
divided by the number of steps.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from analysis.runs.traces import RankTrace, Span

Interval = tuple[float, float]
"""A stretch of time (start, end) in us."""

STEP_PREFIX = "ProfilerStep#"
"""Name of the profiler's annotation of one step (iteration)."""
COMM_PREFIXES = ("c10d::", "gloo:", "nccl:", "record_param_comms")
"""CPU operators and annotations of communication: torch.distributed's operators, the gloo
backend's work on its own threads, NCCL's annotations, c10d's ``record_param_comms``."""
COPY_OPS = ("aten::copy_",)
"""CPU operators that are memory copies (``aten::to``, ``clone``, ``contiguous`` call it)."""
CPU_CATS = ("cpu_op", "user_annotation")
"""Categories of CPU work (annotations only where they name communication)."""
KERNEL_CAT = "kernel"
"""Category of a GPU kernel."""
GPU_COPY_CATS = ("gpu_memcpy", "gpu_memset")
"""Categories of GPU memory copies and sets (HTA's memory category)."""
GPU_COMM_MARK = "nccl"
"""A GPU kernel whose name holds this (any case) is communication, as HTA classifies it."""
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
"""Categories of the CPU-side calls that launch GPU work (``cudaLaunchKernel``, copies)."""


# ------------------------------------------------------------------------------ intervals


def union(spans: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint intervals covering exactly the given ones."""
    out: list[Interval] = []
    for lo, hi in sorted(spans):
        if hi <= lo:
            continue
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def length(intervals: Sequence[Interval]) -> float:
    """Total length of disjoint intervals."""
    return sum(hi - lo for lo, hi in intervals)


def intersect(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    """Where two sets of disjoint, sorted intervals both hold."""
    out: list[Interval] = []
    i = j = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo < hi:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    """``a`` where ``b`` does not hold (both disjoint and sorted)."""
    out: list[Interval] = []
    j = 0
    for lo, hi in a:
        while j < len(b) and b[j][1] <= lo:
            j += 1
        k, cur = j, lo
        while k < len(b) and b[k][0] < hi:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < hi:
            out.append((cur, hi))
    return out


# ------------------------------------------------------------------------------ categories


def cpu_category(span: Span) -> str | None:
    """``comm``, ``memcpy`` or ``compute`` for a CPU event by its own name; None for an
    annotation that only labels a region (``ProfilerStep#``, ``forward``)."""
    if span.name.startswith(COMM_PREFIXES):
        return "comm"
    if span.cat == "user_annotation":
        return None
    if span.name in COPY_OPS:
        return "memcpy"
    return "compute"


def _cpu_timelines(spans: Sequence[Span]) -> dict[str, list[Interval]]:
    """Each category's time on the CPU threads. On one thread operators nest, so what runs
    inside a collective is communication and what runs inside a copy is memory copy: per thread,
    communication is where a communication operator is open, memory copy where a copy is open
    outside it, compute where any other operator is open outside both (its self time)."""
    by_thread: dict[tuple[str, str], dict[str, list[Interval]]] = defaultdict(
        lambda: {"compute": [], "comm": [], "memcpy": []}
    )
    for s in spans:
        category = cpu_category(s) if s.cat in CPU_CATS else None
        if category is not None:
            by_thread[(s.pid, s.tid)][category].append((s.start_us, s.end_us))
    raw: dict[str, list[Interval]] = {"compute": [], "comm": [], "memcpy": []}
    for own in by_thread.values():
        raw["comm"] += own["comm"]
        raw["memcpy"] += own["memcpy"]  # breakdown() leaves out what is under communication
        raw["compute"] += subtract(union(own["compute"]), union(own["comm"] + own["memcpy"]))
    return {k: union(v) for k, v in raw.items()}


def _gpu_timelines(spans: Sequence[Span]) -> dict[str, list[Interval]]:
    """Each category's time on the GPU streams, as HTA classifies kernels."""
    raw: dict[str, list[Interval]] = {"compute": [], "comm": [], "memcpy": []}
    for s in spans:
        if s.cat in GPU_COPY_CATS:
            raw["memcpy"].append((s.start_us, s.end_us))
        elif s.cat == KERNEL_CAT:
            kind = "comm" if GPU_COMM_MARK in s.name.lower() else "compute"
            raw[kind].append((s.start_us, s.end_us))
    return {k: union(v) for k, v in raw.items()}


def _launched_in(spans: Sequence[Span], window: Sequence[Interval]) -> list[Span] | None:
    """The GPU kernels and copies launched by a runtime call that starts inside ``window`` (the
    profiled steps, CPU side), matched by correlation id, as HTA keeps a trace's kernels; None
    when the trace's GPU events carry no correlation id."""
    gpu = [s for s in spans if s.cat == KERNEL_CAT or s.cat in GPU_COPY_CATS]
    if not any(s.correlation is not None for s in gpu):
        return None
    starts = [a for a, _ in window]
    ids = set()
    for s in spans:
        if s.cat in LAUNCH_CATS and s.correlation is not None:
            i = bisect.bisect_right(starts, s.start_us) - 1
            if i >= 0 and s.start_us < window[i][1]:
                ids.add(s.correlation)
    return [s for s in gpu if s.correlation in ids]


# ------------------------------------------------------------------------------ breakdown


@dataclass(frozen=True)
class RankBreakdown:
    """One rank's profiled iterations, as ms per iteration (means over the iterations)."""

    rank: int | None
    """Global rank (the trace's ``distributedInfo``), None when the trace has none."""
    path: str
    """The trace file."""
    timeline: str
    """``gpu`` (a CUDA trace's kernels) or ``cpu`` (operators of the rank's threads)."""
    steps: int
    """Profiled iterations (``ProfilerStep#N`` annotations; the profiler numbers them from its
    own start, not as the run does)."""
    iteration_ms: float
    """Mean length of a profiled iteration."""
    compute_ms: float
    """Compute per iteration."""
    comm_ms: float
    """Communication not hidden behind compute (exposed), per iteration."""
    memcpy_ms: float
    """Memory copy with neither compute nor communication at the same time, per iteration."""
    idle_ms: float
    """Nothing recorded running, per iteration."""
    comm_total_ms: float
    """All communication per iteration, hidden or not."""
    overlap_pct: float | None
    """Share of the communication time during which compute runs (HTA's communication
    computation overlap), None without communication."""

    @property
    def waiting_ms(self) -> float:
        """Everything but compute: exposed communication (on a pipeline, mostly the wait for
        the neighbouring stage inside its receive), copies and idle time."""
        return self.iteration_ms - self.compute_ms


def breakdown(trace: RankTrace) -> RankBreakdown:
    """The breakdown of one rank's trace (see the module doc); ValueError when it holds no
    ``ProfilerStep#`` annotation (no iteration to divide by)."""
    steps = sorted(
        (s for s in trace.spans if s.name.startswith(STEP_PREFIX)), key=lambda s: s.start_us
    )
    if not steps:
        raise ValueError(
            f"{trace.path}: no {STEP_PREFIX}N annotation: the profiler recorded no whole step "
            "(upstream's --profile_steps range ended before it started, or the run stopped)"
        )
    window = union((s.start_us, s.end_us) for s in steps)
    has_gpu = any(s.cat == KERNEL_CAT for s in trace.spans)
    launched = _launched_in(trace.spans, window) if has_gpu else None
    if launched:  # the steps on the GPU: from their first kernel or copy to their last one's end
        window = [(min(s.start_us for s in launched), max(s.end_us for s in launched))]
    lines = (
        _gpu_timelines(launched if launched is not None else trace.spans)
        if has_gpu
        else _cpu_timelines(trace.spans)
    )
    compute = intersect(lines["compute"], window)
    comm_all = intersect(lines["comm"], window)
    comm = subtract(comm_all, compute)
    memcpy = subtract(subtract(intersect(lines["memcpy"], window), compute), comm)
    idle = subtract(subtract(subtract(window, compute), comm_all), memcpy)
    n = len(steps)
    total = length(window)
    comm_total = length(comm_all)
    hidden = length(intersect(comm_all, compute))
    return RankBreakdown(
        rank=trace.rank,
        path=trace.path,
        timeline="gpu" if has_gpu else "cpu",
        steps=n,
        iteration_ms=total / n / 1000,
        compute_ms=length(compute) / n / 1000,
        comm_ms=length(comm) / n / 1000,
        memcpy_ms=length(memcpy) / n / 1000,
        idle_ms=length(idle) / n / 1000,
        comm_total_ms=comm_total / n / 1000,
        overlap_pct=100 * hidden / comm_total if comm_total > 0 else None,
    )
