"""The sweep's measuring loop: anchors first, then the best predicted configuration, the model
recalibrated after every run, until the budget (wall time or a run count) is spent; completed
runs of an identical spec are reused (``FORCE`` starts over), Ctrl-C keeps what finished; the
record ``<logs>/sweep.json`` that the report's sweep section reads."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from analysis.predict.calibration import Observation, observations_from
from analysis.report.sweep import SWEEP_JSON, Measured, measure_entries, print_table
from launchers.config.spec import RunSpec
from launchers.sweep.plan import Predicted, anchors, predict_all
from launchers.sweep.space import Config, Point, SweepError

MAX_REPEATS = 3
"""Runs of one configuration the repeat phase goes up to."""


@dataclass(frozen=True)
class Budget:
    """How much measuring the sweep may do: wall seconds of its runs, or a number of runs."""

    seconds: float | None = None
    """Wall seconds (the runs' own wall time, reused runs included)."""
    runs: int | None = None
    """Runs (reused runs included)."""

    @classmethod
    def parse(cls, text: str) -> Budget:
        """``30m``, ``1h``, ``900s`` or ``900`` (seconds), ``6runs``/``6r``; ``all``: no bound."""
        t = text.strip().lower()
        if t in ("all", "inf", "none"):
            return cls()
        m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(s|m|min|h)?", t)
        if m:
            scale = {"s": 1, None: 1, "m": 60, "min": 60, "h": 3600}[m.group(2)]
            return cls(seconds=float(m.group(1)) * scale)
        m = re.fullmatch(r"(\d+)\s*(r|runs?)", t)
        if m and int(m.group(1)) >= 1:
            return cls(runs=int(m.group(1)))
        raise SweepError(
            f"BUDGET={text!r}: write a wall time (30m, 1h, 900s), a run count (6runs) or all"
        )

    def allows(self, runs: int, spent_s: float, next_s: float | None) -> tuple[bool, str]:
        """Whether one more run fits: (yes/no, why not)."""
        if self.runs is not None and runs >= self.runs:
            return False, f"run budget spent ({runs} of {self.runs} runs)"
        if self.seconds is not None:
            need = spent_s + (next_s or 0.0)
            if need > self.seconds:
                return False, (
                    f"time budget: {spent_s:.0f} s spent, a run takes ~{next_s or 0:.0f}"
                    f" s, budget {self.seconds:.0f} s"
                )
        return True, ""

    @property
    def bounded(self) -> bool:
        """A time or run bound: the sweep may stop exploring early and repeat contenders.
        Unbounded (``all``), it measures every runnable configuration once: the full grid."""
        return self.runs is not None or self.seconds is not None

    def label(self) -> str:
        """As the user would write it."""
        if self.runs is not None:
            return f"{self.runs} runs"
        return f"{self.seconds:.0f} s" if self.seconds is not None else "all"


@dataclass
class Entry:
    """One configuration in the sweep record."""

    name: str
    """Strategy name (``tp1-pp2-dp2-z1-mb1``)."""
    config: Config
    """TP, PP, DP, ZeRO, micro-batch, recompute."""
    status: str
    """``invalid`` (validation), ``excluded`` (memory), ``runnable``."""
    reason: str = ""
    """Why invalid or excluded; the memory estimate when judged."""
    anchor: bool = False
    """Measured first to calibrate the model."""
    predicted: dict[str, Any] | None = None
    """Latest prediction (``Predicted`` as a dict)."""
    predicted_first: dict[str, Any] | None = None
    """Prediction from the anchors alone (what steered the order)."""
    predicted_before: dict[str, Any] | None = None
    """Prediction when it was chosen to be measured (None for anchors)."""
    order: int | None = None
    """Position in the measuring order (1 = first measured)."""
    runs: list[str] = field(default_factory=list)
    """Run directories (relative to the logs root), completed or not."""


Executor = Callable[[RunSpec], Path | None]
"""Runs one spec now; returns its run directory (None when it could not start)."""

Reuse = Callable[[RunSpec], list[Path]]
"""Completed run directories of an identical spec, oldest first."""

Measurer = Callable[[Path, Sequence[Path]], tuple[dict[str, Measured], list[Observation]]]
"""Reads the run directories under the logs root: figures per run path, and observations."""


def read_runs(
    logs: Path, run_dirs: Sequence[Path]
) -> tuple[dict[str, Measured], list[Observation]]:
    """The runs' figures (``analysis.report.sweep.measure_entries``) and their observations for
    the calibration, from their logs."""
    from analysis.predict.cli import load_runs

    runs, rows = load_runs(logs)
    wanted = {_rel(logs, d) for d in run_dirs}
    runs = [r for r in runs if r.path in wanted]
    rows = [r for r in rows if r.path in wanted]
    return {r.path: Measured.of(r) for r in rows}, observations_from(runs, rows)


def _rel(logs: Path, run_dir: Path) -> str:
    return Path(run_dir).resolve().relative_to(Path(logs).resolve()).as_posix()


@dataclass
class Sweep:
    """The state of one sweep: its configurations, what ran, what the model says."""

    model: str
    """Model preset."""
    cluster: str
    """Cluster in words (nodes, ranks, network)."""
    points: list[Point]
    """Every configuration, resolved."""
    entries: dict[str, Entry]
    """The record per configuration name."""
    logs: Path
    """Logs root."""
    budget: Budget
    """The budget."""
    notes: list[str] = field(default_factory=list)
    """What the sweep said along the way (stop reasons, model error)."""
    spent_s: float = 0.0
    """Wall seconds of its runs (reused ones included)."""
    started: int = 0
    """Runs counted against the budget."""

    def write(self) -> Path:
        """``<logs>/sweep.json``, atomically."""
        doc = {
            "model": self.model,
            "cluster": self.cluster,
            "budget": self.budget.label(),
            "spent_s": round(self.spent_s, 1),
            "runs_counted": self.started,
            "notes": self.notes,
            "entries": [asdict(e) for e in self.entries.values()],
        }
        path = self.logs / SWEEP_JSON
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
        tmp.replace(path)
        return path


def entries_of(
    points: Sequence[Point], verdicts: dict[str, tuple[bool | None, str]]
) -> dict[str, Entry]:
    """The record's entries: invalid, excluded by memory, or runnable (with the memory note)."""
    out = {}
    for p in points:
        c = p.config
        if p.spec is None:
            status, reason = "invalid", p.invalid
        else:
            fits, why = verdicts.get(c.name, (None, ""))
            status = "excluded" if fits is False else "runnable"
            reason = ("does not fit: " if fits is False else "") + why
        out[c.name] = Entry(c.name, c, status, reason)
    return out


def run_sweep(
    sweep: Sweep,
    execute: Executor,
    reuse: Reuse,
    measure: Measurer = read_runs,
    force: bool = False,
    say: Callable[[str], None] = print,
) -> int:
    """Measure under the budget; returns 0, or 130 when interrupted (what finished is kept)."""
    runnable = [p for p in sweep.points if sweep.entries[p.config.name].status == "runnable"]
    by_name = {p.config.name: p for p in runnable}
    done: dict[str, list[Path]] = {}  # completed run dirs per configuration
    durations: list[float] = []
    measured: dict[str, Measured] = {}
    observations: list[Observation] = []

    def refresh() -> dict[str, Predicted]:
        nonlocal measured, observations
        dirs = [d for ds in done.values() for d in ds]
        measured, observations = measure(sweep.logs, dirs) if dirs else ({}, [])
        preds, err, _ = predict_all(runnable, observations)
        for name, pred in preds.items():
            sweep.entries[name].predicted = asdict(pred)
        if err.errors:
            sweep.notes = [n for n in sweep.notes if not n.startswith("model error")]
            sweep.notes.append(
                "model error (leave-one-out over the measured configurations): "
                + ", ".join(f"{e:+.0%}" for e in err.errors)
            )
        sweep.write()
        return preds

    def measure_one(p: Point, repeat: int) -> bool:
        """Make sure ``repeat`` completed runs of ``p`` exist; False when the budget is spent."""
        assert p.spec is not None
        entry = sweep.entries[p.config.name]
        have = [] if force else reuse(p.spec)
        have = [d for d in have if d not in done.get(p.config.name, [])] + done.get(
            p.config.name, []
        )
        done[p.config.name] = sorted(set(have), key=lambda d: d.name)[:repeat] if have else []
        if len(done[p.config.name]) >= repeat:
            for d in done[p.config.name]:
                rel = _rel(sweep.logs, d)
                if rel not in entry.runs:
                    entry.runs.append(rel)
                    sweep.started += 1
                    sweep.spent_s += _wall_s(d)
                    say(f"sweep: {p.config.name}: reusing {d} (FORCE=1 reruns)")
            return True
        next_s = statistics_mean(durations)
        ok, why = sweep.budget.allows(sweep.started, sweep.spent_s, next_s)
        if not ok:
            sweep.notes.append(f"stopped before {p.config.name}: {why}")
            return False
        t0 = time.monotonic()
        run_dir = execute(p.spec)
        took = time.monotonic() - t0
        durations.append(took)
        sweep.started += 1
        sweep.spent_s += took
        if run_dir is not None:
            entry.runs.append(_rel(sweep.logs, run_dir))
            if _completed(run_dir):
                done[p.config.name].append(run_dir)
        sweep.write()
        return True

    order = 0
    try:
        refresh()
        for a in anchors(runnable):
            sweep.entries[a.config.name].anchor = True
        sweep.write()
        for a in [p for p in runnable if sweep.entries[p.config.name].anchor]:
            say(f"sweep: anchor {a.config.name}")
            order += 1
            sweep.entries[a.config.name].order = order
            if not measure_one(a, 1):
                break
        else:
            preds = refresh()
            for name, pred in preds.items():
                sweep.entries[name].predicted_first = asdict(pred)
            while True:
                tried = {n for n, e in sweep.entries.items() if e.runs}
                todo = [n for n in by_name if n not in tried and preds[n].ms is not None]
                if not todo:
                    sweep.notes.append("every configuration with a prediction was measured")
                    break
                nxt = min(todo, key=lambda n: (preds[n].ms, n))
                best = _best(measured, sweep.entries)
                if (
                    sweep.budget.bounded
                    and best is not None
                    and preds[nxt].lo is not None
                    and best[1] is not None
                    and preds[nxt].lo > best[1]
                ):
                    sweep.notes.append(
                        f"stopped exploring: the best unmeasured prediction ({nxt}, "
                        f"{preds[nxt].ms:.0f} ms, interval from {preds[nxt].lo:.0f}) lies above "
                        f"the measured best's interval ({best[0]}, up to {best[1]:.0f} ms)"
                    )
                    break
                order += 1
                sweep.entries[nxt].order = order
                sweep.entries[nxt].predicted_before = asdict(preds[nxt])
                say(f"sweep: measuring {nxt} (predicted {preds[nxt].ms:.0f} ms/iteration)")
                if not measure_one(by_name[nxt], 1):
                    break
                preds = refresh()
            _repeat_contenders(sweep, measured, by_name, measure_one, refresh)
        refresh()
    except KeyboardInterrupt:
        sweep.notes.append(
            "interrupted (Ctrl-C): the runs that finished are kept and reused "
            "when the same sweep starts again"
        )
        sweep.write()
        print_table(sweep.logs)
        return 130
    print_table(sweep.logs)
    return 0


def _repeat_contenders(
    sweep: Sweep,
    measured: dict[str, Measured],
    by_name: dict[str, Point],
    measure_one: Callable[[Point, int], bool],
    refresh: Callable[[], dict[str, Predicted]],
) -> None:
    """While the budget allows: another run of each configuration the best cannot be told
    apart from (fewest runs first), up to ``MAX_REPEATS`` each, so their intervals include the
    run-to-run spread."""
    if not sweep.budget.bounded:
        return
    for k in range(2, MAX_REPEATS + 1):
        groups = measure_entries(sweep.logs, [asdict(e) for e in sweep.entries.values()], measured)
        tied = [g.name for g in groups if g.contender]
        if len(tied) < 2:
            return
        for name in tied:
            if name in by_name and not measure_one(by_name[name], k):
                return
        refresh()


def _best(
    measured: dict[str, Measured], entries: dict[str, Entry]
) -> tuple[str, float | None] | None:
    """(name, upper bound of its interval) of the fastest measured configuration."""
    best = None
    for name, e in entries.items():
        ms = [measured[r] for r in e.runs if r in measured and measured[r].ms is not None]
        if ms:
            mean = sum(m.ms or 0.0 for m in ms) / len(ms)
            hi = max((m.hi for m in ms if m.hi is not None), default=None)
            if best is None or mean < best[1]:
                best = (name, mean, hi)
    return (best[0], best[2]) if best else None


def statistics_mean(values: Sequence[float]) -> float | None:
    """Mean, None for none."""
    return sum(values) / len(values) if values else None


def _completed(run_dir: Path) -> bool:
    try:
        doc = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return False
    return (doc.get("outcome") or {}).get("status") == "completed"


def _wall_s(run_dir: Path) -> float:
    """The run's wall seconds from its run.json (0 when not recorded)."""
    try:
        doc = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return 0.0
    value = (doc.get("outcome") or {}).get("wall_s")
    return float(value) if isinstance(value, int | float) else 0.0
