"""What a run's logs and exit codes say once it ended or was stopped: the fatal lines, the
failures in the order they arrived across nodes, the root cause among them, the outcome.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from analysis.runs.record import Outcome

if TYPE_CHECKING:
    from analysis.parse.records import ParsedRun


class Arrivals:
    """When each line of each log arrived (monotonic seconds), to order failures across logs.

    Lines already in a log when it is first noted (the executor's ``# started`` header) are
    counted so that line numbers match the file's.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._times: dict[Path, list[float]] = {}

    def note(self, log: Path) -> None:
        """A line was just appended to ``log``."""
        now = time.monotonic()
        with self._lock:
            times = self._times.get(log)
            if times is None:
                try:
                    before = log.read_bytes().count(b"\n") - 1  # this line is already written
                except OSError:
                    before = 0
                times = self._times[log] = [float("-inf")] * max(before, 0)
            times.append(now)

    def at(self, log: Path, line: int) -> float | None:
        """Arrival time of 1-based ``line`` of ``log``, None when not seen."""
        with self._lock:
            times = self._times.get(log)
            return times[line - 1] if times is not None and 0 < line <= len(times) else None


FATAL_LINES: tuple[tuple[bytes, str, str], ...] = (
    (
        b"Making C++ dataset helpers module failed",
        "exception",
        "upstream's megatron/data/Makefile could not build the C++ dataset helpers (rank 0 "
        "exits): run `make setup`, which builds them with the venv's interpreter, and check "
        "that the venv's bin comes first on PATH on every node",
    ),
)
"""Lines that end a rank without a traceback, which the log parser does not flag: (text,
kind, what it means and the fix). A peer's connection error after them is their consequence."""

SYMPTOM_KINDS = ("nccl", "other")
"""Kinds that are often the consequence of another rank's failure: a peer that died closes
its connections, so the survivors report gloo/NCCL errors. A root cause found elsewhere in the
logs (:data:`ROOT_CAUSE_KINDS`) is preferred over them."""

ROOT_CAUSE_KINDS = ("oom", "killed", "exception")
"""Kinds that say why a rank died."""


@dataclass(frozen=True)
class LogFailure:
    """A failure line found in a run's logs."""

    kind: str
    """Parser failure kind."""
    message: str
    """The line."""
    where: str
    """``file:line``."""
    arrived: float | None = None
    """When the executor received the line (monotonic seconds), None when unknown."""


def _prefix_lines(path: Path, size: int) -> Iterator[str]:
    """The lines of the first ``size`` bytes of ``path`` (what it held when the run was stopped)."""
    with path.open("rb") as f:
        data = f.read(size)
    for raw in data.splitlines():
        yield raw.decode("utf-8", errors="replace")


def _fatal_lines(log: Path, size: int | None) -> list[tuple[int, str, str]]:
    """(line, kind, message) of every :data:`FATAL_LINES` line in the first ``size`` bytes."""
    try:
        with log.open("rb") as f:
            data = f.read() if size is None else f.read(size)
    except OSError:
        return []
    found = []
    for text, kind, meaning in FATAL_LINES:
        start = data.find(text)
        while start >= 0:
            line_start = data.rfind(b"\n", 0, start) + 1
            end = data.find(b"\n", start)
            line = data[line_start : end if end >= 0 else len(data)].decode(errors="replace")
            found.append((data.count(b"\n", 0, start) + 1, kind, f"{line.strip()} ({meaning})"))
            start = data.find(text, end) if end >= 0 else -1
    return found


def read_logs(
    logs: Sequence[Path],
    upto: dict[Path, int] | None = None,
    arrivals: Arrivals | None = None,
) -> tuple[ParsedRun | None, list[LogFailure]]:
    """The merged parse of a run's logs and every failure line, first arrived first.

    ``upto`` limits a log to its first bytes: the part written before the executor stopped the
    run (what the stop itself makes processes print is not a cause). ``arrivals`` orders the
    failures of several logs (one per node) by when the executor received them; without it
    (or for lines it did not see) they stay in file order, log after log.
    """
    # The parser brings numpy (~0.25 s): imported when a run's logs are read, not with the CLI.
    from analysis.parse.reader import merge_runs, parse_file, parse_lines

    parts = []
    failures: list[LogFailure] = []

    def add(log: Path, kind: str, message: str, line: int) -> None:
        arrived = arrivals.at(log, line) if arrivals is not None else None
        failures.append(LogFailure(kind, message, f"{log.name}:{line}", arrived))

    for log in logs:
        if not log.exists():
            continue
        if upto is not None and log in upto:
            runs = parse_lines(_prefix_lines(log, upto[log]), str(log))
        else:
            runs = parse_file(log)
        for line, kind, message in _fatal_lines(log, upto.get(log) if upto else None):
            add(log, kind, message, line)
        if not runs:
            continue
        part = runs[-1]
        parts.append(part)
        if part.failure is not None:
            add(log, part.failure.kind, part.failure.message, part.failure.line)
        for further in part.further_failures:
            add(log, further.kind, further.message, further.line)
    order = {id(f): i for i, f in enumerate(failures)}
    failures.sort(key=lambda f: (f.arrived is None, f.arrived or 0.0, order[id(f)]))
    return (merge_runs(parts) if parts else None), failures


def root_cause(failures: Sequence[LogFailure]) -> LogFailure | None:
    """The failure that explains the run: the first one (``failures`` come first-arrived first,
    across ranks and nodes), unless it is a symptom (a connection error) and another line names
    why a rank died (killed, out of memory, an exception): a peer's death closes its
    connections, and the survivors' gloo/NCCL errors may reach the log before its own words."""
    if not failures:
        return None
    first = failures[0]
    if first.kind in SYMPTOM_KINDS:
        cause = next((f for f in failures if f.kind in ROOT_CAUSE_KINDS), None)
        if cause is not None:
            return replace(
                cause, message=f"{cause.message} (also seen: {first.kind}: {first.message})"
            )
    return first


def _progress_of(merged: ParsedRun | None) -> tuple[int | None, int | None]:
    if merged is None:
        return None, None
    last = max((it.iteration for it in merged.iterations), default=None)
    total = next((it.train_iters for it in reversed(merged.iterations) if it.train_iters), None)
    return last, total


def classify(
    run_dir: Path,
    logs: list[Path],
    exit_codes: dict[str, int | None],
    arrivals: Arrivals | None = None,
) -> Outcome:
    """Decide the outcome of a run that ended by itself from its logs and exit codes."""
    merged, failures = read_logs(logs, arrivals=arrivals)
    last, total = _progress_of(merged)
    cause = root_cause(failures)
    if cause is not None:
        return Outcome(
            "failed",
            kind=cause.kind,
            reason=cause.message,
            last_iteration=last,
            train_iters=total,
            failure_line=cause.where,
        )
    failed_rc = {k: v for k, v in exit_codes.items() if v not in (0,)}
    if failed_rc:
        label, rc = next(iter(failed_rc.items()))
        kind = "killed" if rc is not None and rc < 0 and -rc == signal.SIGKILL else "other"
        return Outcome(
            "failed",
            kind=kind,
            reason=f"{label} exited with code {rc} and the log names no cause",
            last_iteration=last,
            train_iters=total,
        )
    if total is not None and last is not None and last >= total:
        return Outcome("completed", last_iteration=last, train_iters=total)
    return Outcome(
        "failed",
        kind="other",
        reason=f"launcher exited 0 but training stopped at iteration {last} of {total}",
        last_iteration=last,
        train_iters=total,
    )


def classify_stopped(
    logs: list[Path],
    upto: dict[Path, int],
    kind: str,
    reason: str,
    seen: tuple[int, int | None],
    arrivals: Arrivals | None = None,
) -> Outcome:
    """Outcome of a run the executor stopped (hang, time limit): a cause the logs held before
    the stop wins (a killed peer leaves the survivors hanging), the stop goes in the reason.
    ``seen``: (last iteration, train iterations) from the live output, where the logs say none.
    """
    merged, failures = read_logs(logs, upto, arrivals)
    last, total = _progress_of(merged)
    last = last if last is not None else seen[0]
    total = total if total is not None else seen[1]
    cause = root_cause(failures)
    if cause is not None and cause.kind not in ("other", "hang"):
        return Outcome(
            "failed",
            kind=cause.kind,
            reason=f"{cause.message}; then {reason}",
            last_iteration=last,
            train_iters=total,
            failure_line=cause.where,
        )
    return Outcome("failed", kind=kind, reason=reason, last_iteration=last, train_iters=total)
