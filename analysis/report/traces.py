"""The report's profiler section: each profiled run's per-rank breakdown from its traces beside
the text log's figures for the same run, the pipeline stages' waiting beside the bubble theory;
its ``summary.json`` entries and console lines."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from analysis.metrics import repeats
from analysis.metrics.rows import RunMetrics
from analysis.metrics.timers import deepspeed_step_timers
from analysis.metrics.traces import RankBreakdown, breakdown
from analysis.report.markdown import md_table
from analysis.runs.load import LoadedRun
from analysis.runs.traces import run_traces
from analysis.theory.formulas import bubble_fraction

TIMER_FIELDS = (
    ("forward", "fwd_ms"),
    ("backward", "bwd_ms"),
    ("fwd+bwd", "fwd_bwd_ms"),
    ("optimizer", "optimizer_ms"),
    ("communication", "comm_ms"),
    ("pipeline wait", "pipe_wait_ms"),
    ("other", "other_ms"),
)
"""The timers' breakdown of a row (label, field), steady-state ms per iteration."""


@dataclass(frozen=True)
class Profile:
    """One profiled run: its ranks' breakdowns and what its text log says of the same run."""

    row: RunMetrics
    """The run's report row (timers' breakdown, steady-state time, bubble theory)."""
    steps: tuple[int, int] | None
    """The profiled iterations (run.json ``spec.profile_steps``), None when run.json lacks it."""
    ranks: list[RankBreakdown]
    """One breakdown per rank trace, by rank."""
    logged_ms: float | None
    """The text log's ms per iteration of exactly the profiled iterations (their logging
    window), None when they are not one whole window of the log."""
    window_timers: dict[str, float] = field(default_factory=dict)
    """DeepSpeed's per-step timers of exactly the profiled iterations (the first data-parallel
    rank's, printed every step by the plain engine), mean ms per iteration by timer name;
    empty when the log has none (the PipelineEngine prints none)."""
    problems: list[str] = field(default_factory=list)
    """Traces that could not be read or broken down, each with its reason."""

    def stage(self, rank: int | None) -> int | None:
        """Pipeline stage of a global rank (Megatron puts pipeline stages outermost: stage =
        rank // (world / pp)); None when unknown."""
        pp, world = self.row.pp, self.row.world_size
        if rank is None or not pp or not world or world % pp:
            return None
        return rank // (world // pp)

    @property
    def steps_text(self) -> str:
        """``iterations 26-30``, ``iteration 3``, or that run.json does not say them."""
        if self.steps is None:
            return "iterations unknown (run.json has no profile_steps)"
        first, last = self.steps
        return f"iteration {first}" if first == last else f"iterations {first}-{last}"

    @property
    def bubble(self) -> float | None:
        """The bubble theory's idle share (p-1)/(m+p-1), p stages, m micro-batches per step;
        None when either is unknown."""
        pp, gas = self.row.pp, self.row.gas
        return bubble_fraction(pp, gas) if pp and gas else None

    @property
    def iteration_ms(self) -> float | None:
        """Mean profiled iteration over the ranks."""
        return sum(r.iteration_ms for r in self.ranks) / len(self.ranks) if self.ranks else None


def _steps(run: LoadedRun) -> tuple[int, int] | None:
    spec = run.record.spec if run.record else None
    steps = (spec or {}).get("profile_steps")
    if isinstance(steps, list) and len(steps) == 2 and all(isinstance(s, int) for s in steps):
        return steps[0], steps[1]
    return None


def _logged_ms(run: LoadedRun, steps: tuple[int, int] | None) -> float | None:
    """The iteration line closing the profiled iterations, when its window is exactly them."""
    if run.parsed is None or steps is None:
        return None
    logged = sorted((it.iteration, it.elapsed_ms) for it in run.parsed.iterations)
    for (before, _), (last, ms) in zip([(0, None), *logged], logged, strict=False):
        if last == steps[1] and before == steps[0] - 1:
            return ms
    return None


def window_timers(run: LoadedRun, steps: tuple[int, int] | None) -> dict[str, float]:
    """Mean per-step DeepSpeed timers (ms) of the profiled iterations."""
    if run.parsed is None or steps is None:
        return {}
    first, last = steps
    samples = deepspeed_step_timers(run.parsed, first - 1, [(last + 1, 2**62)])
    return {k: sum(v) / len(v) for k, v in samples.items() if len(v) == last - first + 1}


def profiles(runs: Sequence[LoadedRun], rows: Sequence[RunMetrics], logdir: Path) -> list[Profile]:
    """The profiled runs among ``runs`` (run directories with trace files), with their rows."""
    by_path = {r.path: r for r in rows}
    root = logdir if logdir.is_dir() else logdir.parent
    out = []
    for run in runs:
        row = by_path.get(run.path)
        if run.kind != "run_dir" or row is None:
            continue
        traces, problems = run_traces(root / run.path)
        if not traces and not problems:
            continue
        ranks = []
        for trace in traces:
            try:
                ranks.append(breakdown(trace))
            except ValueError as exc:
                problems.append(str(exc))
        steps = _steps(run)
        logged, timers = _logged_ms(run, steps), window_timers(run, steps)
        out.append(Profile(row, steps, ranks, logged, timers, problems))
    return out


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.1f}"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def _log_line(p: Profile) -> str:
    """The text log's figures for the run, beside the traces'."""
    r, traced = p.row, p.iteration_ms
    if p.logged_ms is not None and traced is not None:
        diff = 100 * (traced - p.logged_ms) / p.logged_ms
        same = (
            f"its iteration line for the same iterations: {_ms(p.logged_ms)} ms/iteration; "
            f"the traces' {_ms(traced)} differ by {diff:+.1f}%"
        )
    else:
        same = "the profiled iterations are not one logging window: no log figure for them alone"
    timers = [f"{label} {_ms(getattr(r, key))}" for label, key in TIMER_FIELDS
              if getattr(r, key) is not None]  # fmt: skip
    why = r.na_reasons.get("fwd_ms", "no timers in the log")
    told = ", ".join(timers) if timers else f"n/a ({why})"
    window = ", ".join(f"{k} {_ms(v)}" for k, v in p.window_timers.items())
    window = f"; DeepSpeed's per-step timers of the same iterations: {window}" if window else ""
    return (
        f"Text log: {same}{window}. Its steady-state mean over the run: {_ms(r.iter_ms_mean)} "
        f"ms/iteration; its timers' breakdown (steady mean, ms/iteration): {told}."
    )


def _stage_rows(p: Profile) -> list[list[str]]:
    """Per pipeline stage: measured waiting beside the bubble theory."""
    theory = p.bubble
    stages: dict[int, list[RankBreakdown]] = {}
    for b in p.ranks:
        stage = p.stage(b.rank)
        if stage is not None:
            stages.setdefault(stage, []).append(b)
    out = []
    for stage, ranks in sorted(stages.items()):
        it = sum(b.iteration_ms for b in ranks) / len(ranks)
        wait = sum(b.waiting_ms for b in ranks) / len(ranks)
        out.append(
            [
                str(stage),
                ", ".join(str(b.rank) for b in ranks),
                _ms(it),
                _ms(wait),
                _pct(100 * wait / it if it else None),
                _pct(None if theory is None else 100 * theory),
                _ms(None if theory is None else theory * it),
            ]
        )
    return out


def section(found: Sequence[Profile]) -> str:
    """The report's ``Profiler traces`` section (empty when no run was profiled)."""
    if not found:
        return ""
    md = [
        "",
        "## Profiler traces",
        "",
        "Runs recorded with `--profile` (upstream's `--profile pt`): one PyTorch profiler trace "
        "per rank in the run's `tensorboard/` (open each in ui.perfetto.dev). Per rank and "
        "profiled iteration, each instant counts once: compute (operators, or compute kernels "
        "on CUDA), else communication (torch.distributed operators and the backend's work: "
        "the part not hidden behind compute), else memory copy, else idle (nothing recorded "
        "running); the four add up to the iteration. Overlap: share of all communication time "
        "during which compute runs (Holistic Trace Analysis' definition). On CPU the "
        "collectives are gloo's, blocking: see docs/profiling.md for what a CPU trace shows.",
        "",
    ]
    for p in found:
        steps = p.steps_text
        world = p.row.world_size
        md += [
            f"### {repeats.label(p.row)}",
            "",
            f"`{p.row.path}`: {steps}, {len(p.ranks)} of {world or '?'} ranks traced.",
            "",
        ]
        table = [
            [
                str(b.rank) if b.rank is not None else "?",
                "n/a" if p.stage(b.rank) is None else str(p.stage(b.rank)),
                b.timeline,
                _ms(b.iteration_ms),
                _ms(b.compute_ms),
                _ms(b.comm_ms),
                _ms(b.memcpy_ms),
                _ms(b.idle_ms),
                _ms(b.comm_total_ms),
                _pct(b.overlap_pct),
            ]
            for b in p.ranks
        ]
        headers = ["rank", "stage", "timeline", "ms/iter", "compute", "communication"]
        headers += ["memory copy", "idle", "all communication", "overlap %"]
        md += [*md_table(headers, table), "", _log_line(p), ""]
        if (p.row.pp or 1) > 1 and p.ranks:
            md += [
                "Pipeline stages: waiting = iteration - compute (exposed communication, which "
                "holds the wait for the neighbouring stage inside its receive, copies and "
                "idle time), beside the bubble theory (p-1)/(m+p-1) of the same iteration.",
                "",
            ]
            headers = ["stage", "ranks", "ms/iter", "waiting ms", "waiting %", "bubble %"]
            md += [*md_table([*headers, "bubble ms"], _stage_rows(p)), ""]
        md += [f"- trace not analysed: {why}" for why in p.problems]
    return "\n".join(md).rstrip("\n") + "\n"


def to_json(found: Sequence[Profile]) -> list[dict[str, Any]]:
    """``summary.json``'s ``profiles``: per profiled run, each rank's breakdown (ms per
    iteration) with its stage, and the text log's figure for the same iterations."""
    return [
        {
            "run": repeats.label(p.row),
            "path": p.row.path,
            "profile_steps": list(p.steps) if p.steps else None,
            "trace_iteration_ms": p.iteration_ms,
            "logged_iteration_ms": p.logged_ms,
            "window_timers_ms": p.window_timers,
            "ranks": [
                asdict(b) | {"stage": p.stage(b.rank), "waiting_ms": b.waiting_ms} for b in p.ranks
            ],
            "bubble_theory": p.bubble,
            "problems": p.problems,
        }
        for p in found
    ]


def console_lines(found: Sequence[Profile]) -> list[str]:
    """What ``python -m analysis.report`` prints of the traces."""
    out = []
    for p in found:
        steps = p.steps_text
        out.append(f"profile {repeats.label(p.row)} ({steps}), ms per iteration:")
        for b in p.ranks:
            stage = p.stage(b.rank)
            out.append(
                f"  rank {b.rank if b.rank is not None else '?'}"
                + (f" (stage {stage})" if (p.row.pp or 1) > 1 and stage is not None else "")
                + f": {_ms(b.iteration_ms)} = compute {_ms(b.compute_ms)} + communication "
                f"{_ms(b.comm_ms)} + memory copy {_ms(b.memcpy_ms)} + idle {_ms(b.idle_ms)}; "
                f"overlap {_pct(b.overlap_pct)}%"
            )
        out.append("  " + _log_line(p))
        out += [f"  trace not analysed: {why}" for why in p.problems]
    return out


def write_traces(
    runs: Sequence[LoadedRun], rows: Sequence[RunMetrics], logdir: Path, out: Path
) -> list[Profile]:
    """Add the profiled runs to a written report: the section at the end of ``report.md``,
    ``profiles`` in ``summary.json``, the console lines; nothing when no run was profiled."""
    found = profiles(runs, rows, logdir)
    if not found:
        return found
    report = out / "report.md"
    report.write_text(report.read_text() + section(found))
    summary_path = out / "summary.json"
    summary = json.loads(summary_path.read_text())
    summary["profiles"] = to_json(found)
    summary_path.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    print("\n".join(console_lines(found)))
    return found
