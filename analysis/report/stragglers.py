"""The report's straggler section and summary lines: per run and timer, the slowest rank, its
node and its excess over the median rank, judged by ``metrics.stragglers.STRAGGLER_RULE``.

Shown when a run has per-rank timers (``TIMERS=all``, or DeepSpeed timers of several ranks) or
asked for them; a run without is listed with the reason.
"""

from __future__ import annotations

from collections.abc import Mapping

from analysis.metrics import repeats
from analysis.metrics.rows import RunMetrics
from analysis.metrics.stragglers import (
    COLLECTIVE_ENDS,
    STRAGGLER_RULE,
    StragglerResult,
    TimerVerdict,
)
from analysis.report.markdown import md_table


def _rank(rank: int, node: str | None) -> str:
    return f"rank {rank} ({node})" if node else f"rank {rank} (node n/a)"


def _sign(v: TimerVerdict) -> float:
    return -1.0 if v.low else 1.0


def _pct(v: TimerVerdict) -> str:
    return "n/a" if v.excess_pct is None else f"{_sign(v) * v.excess_pct:+.1f}%"


def _excess(v: TimerVerdict) -> str:
    """The slowest rank's signed difference from the median rank (negative on a ``low``
    timer: the rank the others wait for waits less)."""
    return f"{_sign(v) * v.excess_ms:+,.2f} ms"


def verdict_text(label: str, res: StragglerResult) -> str:
    """One sentence: the stragglers with their excess, or how closely the ranks agree."""
    if res.na is not None:
        return f"{label}: straggler analysis n/a: {res.na}"
    if res.stragglers:
        parts = []
        for v in res.stragglers:
            who = ", ".join(
                _rank(r, n) for r, n in zip(v.stragglers, v.straggler_nodes, strict=True)
            )
            parts.append(
                f"{who} on {v.source} {v.timer}: {v.slowest_ms:,.2f} ms vs the median rank's "
                f"{v.median_ms:,.2f} ms ({_excess(v)}, {_pct(v)}; bound "
                f"{v.bound_ms:,.2f} ms)"
            )
        return f"{label}: **straggler**: " + "; ".join(parts)
    agree = res.agree_pct
    worst = max(res.verdicts, key=lambda v: v.excess_ms)
    floor = f"{0.02 * (res.iter_ms or 0):,.2f} ms" if res.iter_ms else "n/a"
    text = f"{label}: no straggler: "
    if agree is not None:
        text += f"the ranks agree within {agree:.1f}% on every timer of 2% of the iteration or more"
    else:
        text += "no timer is 2% of the iteration or more"
    return text + (
        f"; the largest excess is {_rank(worst.slowest_rank, worst.slowest_node)} on "
        f"{worst.source} {worst.timer}, {_excess(worst)} from the median rank "
        f"(bound {worst.bound_ms:,.2f} ms, materiality floor {floor})"
    )


def shown(results: Mapping[str, StragglerResult]) -> bool:
    """Whether the report has a straggler section: some run has per-rank timers."""
    return any(res.verdicts for res in results.values())


def summary_lines(rows: list[RunMetrics], results: Mapping[str, StragglerResult]) -> list[str]:
    """The executive summary's straggler findings: one line per run where one stands out."""
    out = []
    for r in rows:
        res = results.get(r.path)
        if res is not None and res.stragglers:
            out.append("- " + verdict_text(f"**stragglers** in {repeats.label(r)}", res))
    return out


def section(rows: list[RunMetrics], results: Mapping[str, StragglerResult]) -> list[str]:
    """The ``Stragglers`` section (empty when no run has per-rank timers)."""
    if not shown(results):
        return []
    md = ["## Stragglers", ""]
    md += [
        "Every rank's steady-state mean of each timer (ms per iteration; the steady-state "
        "windows of the iteration time), from Megatron's `times across ranks` blocks "
        "(`--timing-log-option all`, `TIMERS=all`) and DeepSpeed's per-rank timer lines. "
        "A profiled run (`PROFILE=1`) adds each rank's profiler trace: `profiler trace "
        "compute` (ms per profiled iteration) and `profiler trace wait` (exposed communication "
        "+ idle), where the rank the others wait for waits least (its row shows the rank "
        "furthest below the median). "
        f"Rule: {STRAGGLER_RULE}. {COLLECTIVE_ENDS}. Megatron prints its iteration line on the "
        "last rank only: the logs hold no per-node iteration progress.",
        "",
    ]
    table = []
    for r in rows:
        res = results.get(r.path)
        for v in res.verdicts if res is not None else ():
            table.append(
                [
                    repeats.label(r),
                    f"{v.source} {v.timer}",
                    f"{v.ranks}",
                    f"{v.windows}",
                    f"{v.median_ms:,.2f}",
                    _rank(v.slowest_rank, v.slowest_node),
                    f"{v.slowest_ms:,.2f}",
                    f"{_excess(v)} ({_pct(v)})",
                    f"{v.bound_ms:,.2f}",
                    ", ".join(map(str, v.stragglers)) or "none",
                ]
            )
    headers = ["run", "timer", "ranks", "windows", "median rank (ms)", "slowest"]
    headers += ["its ms", "excess over median", "bound (ms)", "straggler ranks"]
    md += [*md_table(headers, table), ""]
    for r in rows:
        res = results.get(r.path)
        if res is not None:
            line = verdict_text(repeats.label(r), res)
            if res.nodes_from:
                line += f" (nodes from {res.nodes_from})"
            md.append(f"- {line}.")
    return [*md, ""]
