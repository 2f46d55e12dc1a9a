"""A matrix of runs that survives bad runs: every spec resolved first, then run one after the
other, repeated in interleaved rounds, with a summary table at the end.

A failed run is recorded and the matrix goes on; a run already completed with an identical
resolved spec is skipped unless forced; Ctrl-C stops the current run (recorded as interrupted)
and the matrix. At the end it prints a summary table (run, status, reason, ms per iteration) and
reports whether any run failed.

Repeated (``rounds`` > 1), the matrix runs in interleaved rounds: round 1 runs every strategy,
then round 2, and so on, each round starting one strategy further along the list, so that a
drift of the machine (other tenants, thermal state) hits every strategy alike and no strategy
always runs first. Every repeat is its own run directory; run.json's ``"repeat"`` says which
repeated matrix (``group``) and which ``round`` it belongs to (``repeat_record``).

Where the runs go is the caller's: this machine, or a ``Session`` (an emulated lab's, see
``launchers.lab.session``) that adapts each spec and gives the executor its hooks.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from analysis.runs.record import Outcome
from analysis.theory.formulas import steady_windows
from launchers.config.spec import RunSpec, spec_hash
from launchers.run.execute import DEFAULT_STALL_S, run, update_run_json
from launchers.run.render import render_run_dir


class Session(Protocol):
    """Where a matrix's runs go when not as resolved on this machine (an emulated lab)."""

    def adapt(self, spec: RunSpec) -> RunSpec:
        """The spec as it runs there."""
        ...

    def hooks(self, spec: RunSpec, run_dir: Path) -> dict[str, Any]:
        """Keyword arguments for ``launchers.run.execute.run`` there."""
        ...

    def settle(self, run_dir: Path, outcome: Outcome) -> Outcome:
        """The run's outcome once what ran it had its say."""
        ...


@dataclass
class MatrixRow:
    """One line of the matrix summary."""

    name: str
    """``<model>-<strategy>``."""
    status: str
    """``completed``, ``failed``, ``interrupted``, ``skipped`` (identical spec completed)."""
    reason: str = ""
    """Why it failed, or where the completed twin is."""
    iter_ms: float | None = None
    """Steady-state mean ms per iteration (first logging window dropped), when it ran."""
    run_dir: Path | None = None
    """Its run directory."""
    round: int | None = None
    """Round of a repeated matrix (None when not repeated)."""


def steady_iter_ms(run_dir: Path) -> float | None:
    """Mean elapsed ms of the steady iteration lines (``STEADY_RULE``), or None."""
    # The parser brings numpy (~0.25 s): imported when a run's logs are read, not with the CLI.
    from analysis.parse.reader import merge_runs, parse_file

    parts = [runs[-1] for log in sorted(run_dir.glob("*.log")) if (runs := parse_file(log))]
    if not parts:
        return None
    windows = sorted(merge_runs(parts).iterations, key=lambda it: it.iteration)
    times = [it.elapsed_ms for it in windows]  # the report's rule: warm-up and pauses found
    values = [it.elapsed_ms for it in steady_windows(windows, times) if it.elapsed_ms is not None]
    return statistics.fmean(values) if values else None


def completed_twin(spec: RunSpec, logs: Path, repeat: Repeat | None = None) -> Path | None:
    """A completed run directory of this spec's name with the same spec hash, if any.

    With ``repeat``, only a run of the same repeated matrix and round counts: the earlier
    rounds of the same spec are the other repeats, not twins.
    """
    for run_dir, doc in completed_runs(spec, logs):
        if repeat is None or Repeat.of(doc) == repeat:
            return run_dir
    return None


def completed_runs(spec: RunSpec, logs: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Every completed run directory of this spec's name with the same spec hash, oldest first,
    with its run.json document."""
    wanted, out = spec_hash(spec), []
    for record in sorted((logs / spec.name).glob("*/run.json")):
        with contextlib.suppress(OSError, json.JSONDecodeError):
            doc = json.loads(record.read_text(encoding="utf-8"))
            if (
                doc.get("spec_hash") == wanted
                and (doc.get("outcome") or {}).get("status") == "completed"
            ):
                out.append((record.parent, doc))
    return out


@dataclass(frozen=True)
class Repeat:
    """Where a run sits in a repeated matrix: run.json's ``"repeat"``."""

    group: str
    """Shared by every run of one repeated matrix; derived from its specs and round count, so
    the same command resumes an interrupted matrix (a forced one gets a new group)."""
    round: int
    """1-based round: round k runs every strategy once before round k + 1 starts."""
    rounds: int
    """Rounds the matrix was asked for."""

    def __post_init__(self) -> None:
        if not 1 <= self.round <= self.rounds:
            raise ValueError(f"round({self.round}) must be in 1..rounds({self.rounds})")

    @classmethod
    def of(cls, record: dict[str, Any]) -> Repeat | None:
        """The ``"repeat"`` of a run.json document, or None (not a repeat, or malformed)."""
        doc = record.get("repeat")
        if not isinstance(doc, dict):
            return None
        try:
            return cls(str(doc["group"]), int(doc["round"]), int(doc["rounds"]))
        except (KeyError, TypeError, ValueError):
            return None


def repeat_group(spec_hashes: Sequence[str], rounds: int, force: bool = False) -> str:
    """Id of a repeated matrix: ``r<rounds>-<digest of its specs>`` (plus the UTC time when
    forced, so a forced matrix is a new group rather than a second copy of each round)."""
    digest = hashlib.sha256("\n".join([str(rounds), *spec_hashes]).encode()).hexdigest()[:12]
    stamp = time.strftime("-%Y%m%dT%H%M%SZ", time.gmtime()) if force else ""
    return f"r{rounds}-{digest}{stamp}"


def repeat_record(run_dir: Path, repeat: Repeat) -> None:
    """Write the repeat grouping into the run's run.json (``"repeat"``)."""
    update_run_json(run_dir, repeat={"group": repeat.group, "round": repeat.round,
                                     "rounds": repeat.rounds})  # fmt: skip


def interleaved(specs: Sequence[RunSpec], rounds: int) -> list[tuple[int, RunSpec]]:
    """(round, spec) in run order: every spec once per round, round k starting at spec k."""
    n = len(specs)
    return [(k + 1, specs[(k + i) % n]) for k in range(rounds) for i in range(n)]


def run_specs(
    specs: Sequence[RunSpec],
    logs: Path,
    *,
    force: bool = False,
    stall_s: float | None = None,
    timeout_s: float | None = None,
    session: Session | None = None,
    render: Callable[[RunSpec, Path], Path] | None = None,
    mem_limit_bytes: int | None = None,
    rounds: int = 1,
    deadline: float | None = None,
) -> list[MatrixRow]:
    """Run every spec in turn; never stop at a failed run; stop at Ctrl-C/SIGTERM.

    ``mem_limit_bytes`` runs each run's local processes in a memory cgroup of that size.
    ``rounds`` > 1 runs the specs in interleaved rounds (``interleaved``), each run recorded
    as a repeat (``repeat_record``). ``deadline`` (``time.monotonic()``) bounds the rounds after
    the first: a round that would end after it, judged by the mean duration of the rounds so
    far, is not started (and said so).
    """
    if rounds < 1:
        raise ValueError(f"rounds({rounds}) must be >= 1")
    render = render or render_run_dir
    rows: list[MatrixRow] = []
    adapted = [session.adapt(s) if session is not None else s for s in specs]
    group = repeat_group([spec_hash(s) for s in adapted], rounds, force) if rounds > 1 else ""
    pending = interleaved(adapted, rounds)
    started, current = time.monotonic(), 1
    try:
        while pending:
            k, spec = pending[0]
            if k != current and deadline is not None:  # round k is about to start
                current, per_round = k, (time.monotonic() - started) / (k - 1)
                if time.monotonic() + per_round > deadline:
                    print(f"rounds {k}-{rounds} not started: a round takes ~{per_round:.0f} s "
                          "here, past the time budget", flush=True)  # fmt: skip
                    break
            pending.pop(0)
            repeat = Repeat(group, k, rounds) if rounds > 1 else None
            rnd = k if repeat else None
            label = f"{spec.name} (round {k}/{rounds})" if repeat else spec.name
            twin = None if force else completed_twin(spec, logs, repeat)
            if twin is not None:
                print(f"{label}: skipped, identical spec completed in {twin} (FORCE=1 reruns)")
                rows.append(MatrixRow(spec.name, "skipped", f"completed in {twin}",
                                      steady_iter_ms(twin), twin, rnd))  # fmt: skip
                continue
            run_dir = render(spec, logs)
            if repeat is not None:
                repeat_record(run_dir, repeat)
            print(f"{run_dir}" + (f" (round {k}/{rounds})" if repeat else ""), flush=True)
            hooks = session.hooks(spec, run_dir) if session is not None else {}
            try:
                outcome = run(
                    run_dir,
                    stall_s=stall_s if stall_s is not None else DEFAULT_STALL_S,
                    timeout_s=timeout_s,
                    mem_limit_bytes=mem_limit_bytes,
                    **hooks,
                )
                if session is not None:
                    outcome = session.settle(run_dir, outcome)
            except KeyboardInterrupt:
                rows.append(MatrixRow(spec.name, "interrupted", "stopped by the user",
                                      steady_iter_ms(run_dir), run_dir, rnd))  # fmt: skip
                raise
            except Exception as exc:  # recorded in run.json by the executor; the matrix goes on
                reason = f"other: the executor could not run it: {type(exc).__name__}: {exc}"
                print(f"{run_dir}: failed ({reason})", file=sys.stderr, flush=True)
                rows.append(MatrixRow(spec.name, "failed", reason, None, run_dir, rnd))
                continue
            reason = "" if outcome.status == "completed" else f"{outcome.kind}: {outcome.reason}"
            print(f"{run_dir}: {outcome.status}" + (f" ({reason})" if reason else ""), flush=True)
            rows.append(MatrixRow(spec.name, outcome.status, reason,
                                  steady_iter_ms(run_dir), run_dir, rnd))  # fmt: skip
    except KeyboardInterrupt:
        rows += [MatrixRow(s.name, "not run", "matrix interrupted",
                           round=k if rounds > 1 else None) for k, s in pending]  # fmt: skip
        print_summary(rows)
        raise
    print_summary(rows)
    return rows


def print_summary(rows: Sequence[MatrixRow]) -> None:
    """The end-of-matrix table."""
    table = Table(title="matrix summary")
    for col in ("run", "status", "ms/iter (steady)", "reason", "run directory"):
        table.add_column(col, overflow="fold")
    for r in rows:
        style = {"completed": "green", "skipped": "cyan"}.get(r.status, "red")
        table.add_row(  # reasons quote logs: '[...]' there is text, not rich markup
            escape(r.name + (f" (round {r.round})" if r.round else "")),
            f"[{style}]{escape(r.status)}[/]",
            f"{r.iter_ms:.1f}" if r.iter_ms is not None else "n/a",
            escape(r.reason),
            escape(str(r.run_dir or "")),
        )
    Console(width=160).print(table)
    for name, times in round_spread(rows).items():
        print(f"{name}: {len(times)} rounds timed, {min(times):.1f}-{max(times):.1f} "
              f"ms/iteration (max/min {max(times) / min(times):.2f}); `make report` gives the "
              "intervals")  # fmt: skip


def round_spread(rows: Sequence[MatrixRow]) -> dict[str, list[float]]:
    """Steady ms/iteration of each repeated run name over its rounds (2 or more timed)."""
    times: dict[str, list[float]] = {}
    for r in rows:
        if r.round is not None and r.iter_ms is not None:
            times.setdefault(r.name, []).append(r.iter_ms)
    return {name: t for name, t in times.items() if len(t) >= 2}


def failed(rows: Sequence[MatrixRow]) -> list[MatrixRow]:
    """Rows that did not complete (skipped twins count as completed)."""
    return [r for r in rows if r.status not in ("completed", "skipped")]
