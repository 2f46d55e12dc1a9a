"""The sweep section of the report and its console table: every configuration of
``<logs>/sweep.json`` with its predicted and measured time (measured figures from the runs'
logs), the excluded and failed ones with their reason, the winner or the set that cannot be told
apart, and the rank correlation of predicted against measured."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from analysis.metrics.repeats import random_effects, within_variance
from analysis.metrics.rows import RunMetrics

SWEEP_JSON = "sweep.json"
"""The sweep's record, at the root of its logs."""


@dataclass(frozen=True)
class Measured:
    """What the logs say of one run."""

    ms: float | None
    """Steady-state mean ms per iteration."""
    lo: float | None
    """Lower bound of its 95% interval (windows of the run)."""
    hi: float | None
    """Upper bound."""
    variance: float | None
    """Squared standard error of the mean (``within_variance``)."""
    status: str
    """Run status."""
    reason: str
    """Why it did not complete, or why it has no time."""

    @classmethod
    def of(cls, row: RunMetrics) -> Measured:
        """From the report's row of the run."""
        why = row.failure_kind or ""
        if row.failure_reason:
            why = f"{why}: {row.failure_reason}" if why else row.failure_reason
        if row.iter_ms_mean is None and not why:
            why = row.na_reasons.get("iter_ms_mean", "no timing")
        return cls(
            row.iter_ms_mean,
            row.iter_ms_ci95_lo,
            row.iter_ms_ci95_hi,
            within_variance(row),
            row.status,
            why,
        )


@dataclass(frozen=True)
class Group:
    """One configuration's measured time over its runs."""

    name: str
    """Configuration."""
    ms: float | None
    """Mean ms per iteration (geometric mean over repeats)."""
    lo: float | None
    """95% interval: between runs with two or more, else the run's own windows."""
    hi: float | None
    """Upper bound."""
    runs: int
    """Timed runs."""
    basis: str
    """``between-run`` or ``within-run``."""
    contender: bool = False
    """Its interval reaches the fastest one's (it cannot be told apart from it)."""


def load_sweep(logs: Path) -> dict[str, Any] | None:
    """``<logs>/sweep.json``, or None when there is none (or it cannot be read)."""
    try:
        doc = json.loads((Path(logs) / SWEEP_JSON).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("entries"), list) else None


def measure_entries(
    logs: Path, entries: Sequence[Mapping[str, Any]], measured: Mapping[str, Measured]
) -> list[Group]:
    """Measured time of every configuration with a timed run, fastest first; the contenders
    (interval reaching the fastest's) marked."""
    groups = []
    for e in entries:
        timed = [measured[r] for r in e.get("runs") or [] if r in measured]
        timed = [m for m in timed if m.ms is not None and m.status == "completed"]
        if not timed:
            continue
        if len(timed) == 1:
            m = timed[0]
            groups.append(Group(e["name"], m.ms, m.lo, m.hi, 1, "within-run"))
            continue
        est = random_effects([m.ms or 0.0 for m in timed], [m.variance for m in timed])
        groups.append(Group(e["name"], est.mean, est.ci_lo, est.ci_hi, len(timed), "between-run"))
    groups.sort(key=lambda g: g.ms or math.inf)
    if not groups:
        return groups
    top = groups[0].hi if groups[0].hi is not None else groups[0].ms
    return [
        Group(
            g.name,
            g.ms,
            g.lo,
            g.hi,
            g.runs,
            g.basis,
            contender=i == 0 or (g.lo if g.lo is not None else g.ms or 0.0) <= (top or 0.0),
        )
        for i, g in enumerate(groups)
    ]


def verdict(groups: Sequence[Group]) -> str:
    """The winner when its interval excludes the runner-up's, else the set that cannot be told
    apart."""
    if not groups:
        return "no configuration was measured: no winner"
    best = groups[0]
    if len(groups) == 1:
        return f"only {best.name} was measured ({best.ms:.1f} ms/iteration): nothing to compare"
    if best.hi is None:
        return (
            f"{best.name} is fastest ({best.ms:.1f} ms/iteration) but has no interval "
            "(one logging window): no winner is named"
        )
    tied = [g for g in groups if g.contender]
    if len(tied) == 1:
        second = groups[1]
        caveat = (
            "; a single run's interval holds the spread of its own windows, not the "
            "run-to-run spread (a budget with room repeats the contenders)"
            if best.basis == "within-run" or second.basis == "within-run"
            else ""
        )
        return (
            f"winner: {best.name}, {best.ms:.1f} ms/iteration [{best.lo:.1f}, {best.hi:.1f}] "
            f"({best.basis}); its interval excludes the runner-up {second.name} "
            f"({second.ms:.1f} [{_num(second.lo)}, {_num(second.hi)}]){caveat}"
        )
    names = ", ".join(f"{g.name} ({g.ms:.1f} [{_num(g.lo)}, {_num(g.hi)}])" for g in tied)
    return (
        f"no single winner: {len(tied)} configurations cannot be told apart at 95% "
        f"(their intervals overlap the fastest's): {names}"
    )


def _num(x: float | None) -> str:
    return f"{x:.1f}" if x is not None else "n/a"


def rank_correlation(pairs: Sequence[tuple[float, float]]) -> tuple[float | None, str]:
    """Spearman's rho of (predicted, measured) pairs and a sentence; None below 3 pairs."""
    if len(pairs) < 3:
        return None, (
            f"rank correlation n/a: {len(pairs)} configuration(s) predicted before being "
            "measured, 3 are needed"
        )
    from scipy.stats import spearmanr  # (scipy.stats takes a second to import)

    rho = float(spearmanr([p for p, _ in pairs], [m for _, m in pairs]).statistic)
    return rho, (
        f"Spearman rank correlation of predicted against measured over the "
        f"{len(pairs)} configurations predicted before being measured: {rho:.2f}"
    )


def _pred(p: Mapping[str, Any] | None) -> str:
    if not p or p.get("ms") is None:
        return "n/a" + (f" ({p['reason']})" if p and p.get("reason") else "")
    interval = f" [{p['lo']:.0f}, {p['hi']:.0f}]" if p.get("lo") is not None else ""
    return f"{p['ms']:.0f}{interval}"


def rows_of(
    doc: Mapping[str, Any], measured: Mapping[str, Measured]
) -> tuple[list[list[str]], list[Group], list[tuple[float, float]]]:
    """Table rows (configuration, status, predicted, measured, note), the measured groups and the
    (predicted before measuring, measured) pairs."""
    entries = doc["entries"]
    groups = measure_entries(Path("."), entries, measured)
    by_name = {g.name: g for g in groups}
    pairs, table = [], []
    shown_entries = [e for e in entries if e["status"] != "invalid"]
    for e in sorted(shown_entries, key=lambda e: (e.get("order") or 10**6, e["name"])):
        g = by_name.get(e["name"])
        runs = [measured[r] for r in e.get("runs") or [] if r in measured]
        bad = [m for m in runs if m.status != "completed"]
        if e["status"] != "runnable":
            status, note = e["status"], e.get("reason", "")
        elif g is not None:
            status = "anchor" if e.get("anchor") else "measured"
            note = f"{g.runs} run(s), {g.basis} interval" + (" - contender" if g.contender else "")
        elif bad:
            status, note = bad[-1].status, bad[-1].reason
        else:
            status, note = "not measured", ""
        shown = e.get("predicted_before") or e.get("predicted")
        measured_cell = f"{g.ms:.0f} [{_num(g.lo)}, {_num(g.hi)}]" if g else "n/a"
        table.append([e["name"], status, _pred(shown), measured_cell, note])
        before = e.get("predicted_before")
        if g is not None and before and before.get("ms") is not None and g.ms is not None:
            pairs.append((float(before["ms"]), g.ms))
    return table, groups, pairs


def invalid_lines(doc: Mapping[str, Any]) -> list[str]:
    """The configurations the validation refused, grouped by its message."""
    reasons: dict[str, list[str]] = {}
    for e in doc["entries"]:
        if e["status"] == "invalid":
            reasons.setdefault(e.get("reason", ""), []).append(e["name"])
    return [
        f"invalid ({len(names)}): {', '.join(names)}: {reason}" for reason, names in reasons.items()
    ]


def _measured_runs(logs: Path) -> dict[str, Measured]:
    from analysis.predict.cli import load_runs

    _, rows = load_runs(logs)
    return {r.path: Measured.of(r) for r in rows}


COLUMNS = ("configuration", "status", "predicted ms [95%]", "measured ms [95%]", "note")


def section(logs: Path, rows: Sequence[RunMetrics]) -> list[str]:
    """The report's sweep section (empty without ``sweep.json``)."""
    doc = load_sweep(logs)
    if doc is None:
        return []
    measured = {r.path: Measured.of(r) for r in rows}
    table, groups, pairs = rows_of(doc, measured)
    _, rho_text = rank_correlation(pairs)
    out = [
        "## Sweep",
        "",
        f"Model {doc.get('model')} on {doc.get('cluster')}; budget {doc.get('budget')}, "
        f"{doc.get('runs_counted')} run(s), {doc.get('spent_s')} s of runs. Predicted: the "
        "calibrated model when the configuration was chosen (else its latest figure); "
        "measured: the steady-state mean from the logs.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    out += ["| " + " | ".join(c.replace("|", "/") for c in r) + " |" for r in table]
    out += ["", verdict(groups) + ".", "", rho_text + ".", ""]
    out += [f"- {n}" for n in [*invalid_lines(doc), *(doc.get("notes") or [])]]
    return [*out, ""]


def print_table(logs: Path) -> None:
    """The sweep's table in the console (measured figures read from the logs now)."""
    doc = load_sweep(logs)
    if doc is None:
        print(f"no {SWEEP_JSON} under {logs}")
        return
    table, groups, pairs = rows_of(doc, _measured_runs(logs))
    t = Table(title=f"sweep: {doc.get('model')} on {doc.get('cluster')}")
    for col in COLUMNS:
        t.add_column(col, overflow="fold")
    for r in table:
        t.add_row(*(escape(c) for c in r))
    Console(width=160).print(t)
    print(verdict(groups))
    print(rank_correlation(pairs)[1])
    for n in [*invalid_lines(doc), *(doc.get("notes") or [])]:
        print(f"- {n}")
