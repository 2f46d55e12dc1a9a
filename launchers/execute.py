"""Run a generated run directory through the real ``deepspeed`` launcher and record its outcome.

The run directory already holds ``launch.sh``, ``ds_config.json``, ``hostfile`` and ``run.json``
(see ``launchers.render``). This module starts ``launch.sh`` (once, or once per node in
``no_ssh`` mode, optionally inside the network namespaces of an emulated lab), streams every
node's output into the run directory, shows a live progress bar fed by the iteration lines, and
writes the outcome into ``run.json`` when the run ends: completed, or failed with the kind and the
line that says why (out of memory, NCCL/gloo error, exception, killed node, hang, time limit,
interrupted by the user).

Bounded time: ``stall_s`` ends a run that prints nothing for that long (a dead peer or a cut link
leaves the survivors blocked in a collective until Megatron's 10-minute distributed timeout);
``timeout_s`` bounds the whole run. Ctrl-C and SIGTERM stop every process of the run (the process
group of each launcher; DeepSpeed's pdsh runner forwards the stop to remote nodes with ``pkill``)
and record the run as interrupted.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

OutcomeStatus = Literal["completed", "failed", "interrupted"]

DEFAULT_STALL_S = 300.0
"""Seconds without a new output line after which a run counts as hung (start-up on a loaded
2-core machine prints something at least every ~30 s; a blocked collective prints nothing)."""

KILL_GRACE_S = 10.0
"""Seconds between SIGTERM and SIGKILL when stopping a run's processes."""

_ITER_RE = re.compile(r"iteration\s*[:=]?\s*(\d+)\s*/\s*(\d+)")
_MS_RE = re.compile(r"elapsed[ _]time[ _]per[ _]iteration[ _]\((ms|s)\)\s*[:=]?\s*([0-9.eE+-]+)")
_LOSS_RE = re.compile(r"lm[ _-]loss\s*[:=]?\s*([0-9.eE+-]+)")


@dataclass(frozen=True)
class NodeProcess:
    """One launcher process of a run and where its output goes."""

    label: str
    """``launcher`` for a single launcher process, ``node<N>`` per node in ``no_ssh`` mode."""
    argv: list[str]
    """Command started (already wrapped for a lab namespace when there is one)."""
    log: Path
    """File that receives its stdout and stderr."""


@dataclass
class Outcome:
    """How a run ended; stored under ``"outcome"`` in run.json."""

    status: OutcomeStatus
    """``completed``, ``failed`` or ``interrupted`` (stopped by the user)."""
    kind: str | None = None
    """Failure kind (``oom``, ``nccl``, ``exception``, ``killed``, ``hang``, ``time_limit``,
    ``cancelled``, ``other``), None when completed."""
    reason: str | None = None
    """One line saying why, quoting the log line when there is one."""
    exit_codes: dict[str, int | None] = field(default_factory=dict)
    """Exit code per launcher process (None if it had to be killed)."""
    start: str | None = None
    """UTC ISO time the first process started."""
    end: str | None = None
    """UTC ISO time the last process ended."""
    wall_s: float | None = None
    """Wall-clock seconds from start to end."""
    last_iteration: int | None = None
    """Last iteration number seen in the output."""
    train_iters: int | None = None
    """Planned iterations (from the iteration lines)."""
    failure_line: str | None = None
    """``file:line`` of the log line that identified the failure."""


def utc_now() -> str:
    """Current UTC time, ISO 8601 with seconds."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write JSON through a temporary file and ``os.replace``: never a half-written record."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=False, default=str)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def update_run_json(run_dir: Path, **fields: Any) -> dict[str, Any]:
    """Merge top-level fields into run.json atomically; returns the new document."""
    path = run_dir / "run.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data.update(fields)
    write_json_atomic(path, data)
    return data


class _Progress:
    """Live state fed by the output streams of all processes."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.iteration = 0
        self.train_iters: int | None = None
        self.iter_ms: float | None = None
        self.loss: float | None = None
        self.last_output = time.monotonic()
        self.changed = threading.Event()

    def feed(self, line: str) -> None:
        with self.lock:
            self.last_output = time.monotonic()
            if "iteration" not in line:
                return
            m = _ITER_RE.search(line)
            if not m:
                return
            it, total = int(m.group(1)), int(m.group(2))
            if it < self.iteration:
                return
            self.iteration, self.train_iters = it, total
            if ms := _MS_RE.search(line):
                try:
                    v = float(ms.group(2))
                    self.iter_ms = v * 1000.0 if ms.group(1) == "s" else v
                except ValueError:
                    pass
            if loss := _LOSS_RE.search(line):
                with contextlib.suppress(ValueError):
                    self.loss = float(loss.group(1))
            self.changed.set()


def _pump(proc: subprocess.Popen[bytes], log: Path, progress: _Progress) -> None:
    """Copy a process's output to its log file line by line, feeding the progress state."""
    assert proc.stdout is not None
    with log.open("ab", buffering=0) as f:
        for raw in iter(proc.stdout.readline, b""):
            f.write(raw)
            progress.feed(raw.decode("utf-8", errors="replace"))


def _stop(procs: Sequence[subprocess.Popen[bytes]], grace_s: float = KILL_GRACE_S) -> None:
    """SIGTERM every process group, then SIGKILL what is left after ``grace_s``."""
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
    for p in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=5)


def node_processes(
    run_dir: Path,
    run: dict[str, Any],
    wrap: Callable[[int, list[str]], list[str]] | None = None,
) -> list[NodeProcess]:
    """The processes a run needs: one ``bash launch.sh``, or one per node for ``no_ssh``."""
    spec = run.get("spec", {})
    launch = str(run_dir / "launch.sh")
    if spec.get("launcher") == "no_ssh":
        hosts = spec.get("cluster", {}).get("hosts") or []
        out = []
        for rank in range(len(hosts)):
            argv = ["bash", launch, str(rank)]
            out.append(
                NodeProcess(
                    f"node{rank}", wrap(rank, argv) if wrap else argv, run_dir / f"node{rank}.log"
                )
            )
        return out
    return [NodeProcess("launcher", ["bash", launch], run_dir / "launcher.log")]


def _classify(run_dir: Path, logs: list[Path], exit_codes: dict[str, int | None]) -> Outcome:
    """Decide the outcome from the parsed logs and the exit codes."""
    from analysis.parse import merge_runs, parse_file

    parsed = []
    for log in logs:
        runs = parse_file(log)
        if runs:
            parsed.append(runs[-1])
    merged = merge_runs(parsed) if parsed else None
    last = max((it.iteration for it in merged.iterations), default=None) if merged else None
    total = (
        next((it.train_iters for it in reversed(merged.iterations) if it.train_iters), None)
        if merged
        else None
    )
    failed_rc = {k: v for k, v in exit_codes.items() if v not in (0,)}
    if merged and merged.failure is not None:
        f = merged.failure
        where = None
        src = merged.sources[0] if merged.sources else None
        if src:
            where = f"{Path(src).name}:{f.line}"
        return Outcome(
            "failed",
            kind=f.kind,
            reason=f.message,
            last_iteration=last,
            train_iters=total,
            failure_line=where,
        )
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


def _render_bar(progress: _Progress, title: str):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(
        TextColumn(f"[bold]{title}[/]"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[detail]}"),
        TimeElapsedColumn(),
        transient=False,
    )
    task = bar.add_task("train", total=None, detail="starting...")
    return bar, task


def run(
    run_dir: Path,
    *,
    stall_s: float | None = DEFAULT_STALL_S,
    timeout_s: float | None = None,
    wrap: Callable[[int, list[str]], list[str]] | None = None,
    env: dict[str, str] | None = None,
    show_progress: bool = True,
    on_start: Callable[[], None] | None = None,
    on_iteration: Callable[[int], None] | None = None,
    on_end: Callable[[], dict[str, Any] | None] | None = None,
) -> Outcome:
    """Execute a run directory and record its outcome in run.json.

    ``wrap`` turns a node's argv into the argv that runs it in its place (``ip netns exec ...``
    in the lab). ``on_start``/``on_end`` bracket the run (the lab reads its interface counters
    there); ``on_iteration(k)`` is called when iteration line k appears (counters sampled in
    steady state); a dict returned by ``on_end`` is stored as run.json's ``"network"``.
    """
    run_dir = Path(run_dir)
    doc = json.loads((run_dir / "run.json").read_text())
    outcome_prev = (doc.get("outcome") or {}).get("status")
    if outcome_prev not in (None, "generated"):
        raise RuntimeError(
            f"{run_dir} was already run (outcome {outcome_prev!r}); a run directory is never "
            "reused: generate a new one"
        )
    procs_spec = node_processes(run_dir, doc, wrap)
    progress = _Progress()
    start_iso = utc_now()
    update_run_json(run_dir, outcome={"status": "running", "start": start_iso})

    interrupted: list[int] = []

    def on_signal(signum, _frame):
        interrupted.append(signum)

    old_handlers = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    procs: list[subprocess.Popen[bytes]] = []
    pumps: list[threading.Thread] = []
    t0 = time.monotonic()
    hit: tuple[str, str] | None = None  # (kind, reason) for hang / time_limit / interrupted
    bar = None
    try:
        if on_start:
            on_start()
        full_env = {**os.environ, **(env or {})}
        for np_ in procs_spec:
            with np_.log.open("ab") as f:
                f.write(f"# started {utc_now()}: {' '.join(np_.argv)}\n".encode())
            p = subprocess.Popen(
                np_.argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=full_env,
                start_new_session=True,
            )
            procs.append(p)
            t = threading.Thread(target=_pump, args=(p, np_.log, progress), daemon=True)
            t.start()
            pumps.append(t)
        if show_progress:
            bar, task = _render_bar(progress, doc.get("name", run_dir.name))
            bar.start()
        seen_iteration = 0
        while any(p.poll() is None for p in procs):
            progress.changed.wait(timeout=0.5)
            progress.changed.clear()
            now = time.monotonic()
            if on_iteration is not None and progress.iteration > seen_iteration:
                seen_iteration = progress.iteration
                on_iteration(seen_iteration)
            if bar is not None:
                detail = (
                    f"{progress.iter_ms:.0f} ms/iter  loss {progress.loss:.4f}"
                    if progress.iter_ms is not None and progress.loss is not None
                    else "starting..."
                )
                bar.update(
                    task, completed=progress.iteration, total=progress.train_iters, detail=detail
                )
            if interrupted:
                hit = ("cancelled", f"interrupted by signal {signal.Signals(interrupted[0]).name}")
                break
            if timeout_s is not None and now - t0 > timeout_s:
                hit = ("time_limit", f"run exceeded its time limit of {timeout_s:.0f} s")
                break
            if stall_s is not None and now - progress.last_output > stall_s:
                hit = (
                    "hang",
                    f"no output for {stall_s:.0f} s (last iteration "
                    f"{progress.iteration}): stopped as hung",
                )
                break
            # One node died while others wait in a collective: stop the rest promptly.
            dead = [p for p in procs if p.poll() not in (None, 0)]
            if dead and len(procs) > 1 and any(p.poll() is None for p in procs):
                grace_end = now + 30.0
                while time.monotonic() < grace_end and any(p.poll() is None for p in procs):
                    time.sleep(0.5)
                break
    finally:
        if any(p.poll() is None for p in procs):
            _stop(procs)
        for t in pumps:
            t.join(timeout=10)
        if bar is not None:
            bar.stop()
        for s, h in old_handlers.items():
            signal.signal(s, h)
        network = None
        if on_end:
            try:
                network = on_end()
            except Exception as e:  # counters are a bonus; never lose the outcome over them
                network = {"error": f"could not read network counters: {e}"}
    exit_codes = {np_.label: p.returncode for np_, p in zip(procs_spec, procs, strict=False)}
    if hit is not None:
        kind, reason = hit
        status: OutcomeStatus = "interrupted" if kind == "cancelled" else "failed"
        outcome = Outcome(
            status,
            kind=kind,
            reason=reason,
            last_iteration=progress.iteration,
            train_iters=progress.train_iters,
        )
        for np_ in procs_spec:
            with np_.log.open("a", encoding="utf-8") as f:
                f.write(f"# run outcome: {status} kind={kind} reason={reason}\n")
    else:
        outcome = _classify(run_dir, [n.log for n in procs_spec], exit_codes)
    outcome.exit_codes = exit_codes
    outcome.start = start_iso
    outcome.end = utc_now()
    outcome.wall_s = round(time.monotonic() - t0, 3)
    fields: dict[str, Any] = {"outcome": asdict(outcome)}
    if network is not None:
        fields["network"] = network
    update_run_json(run_dir, **fields)
    if interrupted:
        # Re-deliver the interruption to the caller (a matrix stops; Ctrl-C reaches the shell).
        raise KeyboardInterrupt
    return outcome
