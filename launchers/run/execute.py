"""Run a generated run directory through the real ``deepspeed`` launcher and record its outcome.

The run directory already holds ``launch.sh``, ``ds_config.json``, ``hostfile`` and ``run.json``
(see ``launchers.run.render``). This module starts ``launch.sh`` (once, or once per node in
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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

if TYPE_CHECKING:
    from analysis.parse.records import ParsedRun
from analysis.runs.record import SCHEMA_VERSION, from_json
from analysis.runs.record import Outcome as Outcome
from launchers.run.memlimit import LimitError as LimitError
from launchers.run.memlimit import MemoryCgroup as MemoryCgroup
from launchers.run.memlimit import format_size as format_size
from launchers.run.memlimit import parse_size as parse_size
from launchers.run.render import write_atomic

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


def utc_now() -> str:
    """Current UTC time, ISO 8601 with seconds."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write JSON through a temporary file and ``os.replace``: never a half-written record.

    The document is serialised before anything touches the disk; a failed write or rename
    removes the temporary file and leaves the previous record as it was.
    """
    write_atomic(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def update_run_json(run_dir: Path, **fields: Any) -> dict[str, Any]:
    """Merge top-level fields into run.json atomically; returns the new document.

    The merged document must read as a :class:`analysis.runs.record.RunRecord`: a field that
    does not raises :class:`analysis.runs.record.RunRecordError` naming it, and nothing is
    written. A new document is written as the current ``schema_version``; an existing one
    keeps its version.

    A run.json that cannot be read as a JSON object is not overwritten blindly: its bytes are
    kept next to it as ``run.json.unreadable-<UTC time>`` and the new record says so under
    ``"record_problems"``.
    """
    path = run_dir / "run.json"
    data: dict[str, Any] = {"schema_version": SCHEMA_VERSION}
    problem = kept = raw = None
    if path.exists():
        raw = path.read_bytes()
        try:
            loaded = json.loads(raw)
            if not isinstance(loaded, dict):
                raise ValueError(f"top level is {type(loaded).__name__}, not an object")
            data = loaded
        except ValueError as exc:
            kept = path.with_name(f"run.json.unreadable-{utc_now().replace(':', '')}")
            problem = f"run.json was unreadable ({exc}); its bytes are kept in {kept.name}"
    data.update(fields)
    if problem:
        data.setdefault("record_problems", []).append(problem)
    from_json(data, str(path))  # raises, naming the field, before anything is written
    if kept is not None and raw is not None:
        kept.write_bytes(raw)
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


def _pump(
    proc: subprocess.Popen[bytes], log: Path, progress: _Progress, arrivals: Arrivals
) -> None:
    """Copy a process's output to its log file line by line, feeding the progress state and
    noting when each line arrived (which of several nodes failed first)."""
    assert proc.stdout is not None
    with log.open("ab", buffering=0) as f:
        for raw in iter(proc.stdout.readline, b""):
            f.write(raw)
            arrivals.note(log)
            progress.feed(raw.decode("utf-8", errors="replace"))


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


def _group_alive(pgid: int) -> bool:
    """Whether any process of the process group is still there."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stop(procs: Sequence[subprocess.Popen[bytes]], grace_s: float = KILL_GRACE_S) -> None:
    """SIGTERM every process group, then SIGKILL what is left after ``grace_s``.

    Groups are signalled even when their leader has exited: a launcher killed from outside
    (the OOM killer, a user's ``kill -9``) leaves its children running in its group.
    """
    strays = _outside_group(procs)
    for p in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
    for child in strays:
        with contextlib.suppress(psutil.Error):
            child.terminate()
    deadline = time.monotonic() + grace_s
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
    while time.monotonic() < deadline and any(_group_alive(p.pid) for p in procs):
        time.sleep(0.1)
    for p in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=5)
    for child in strays:
        with contextlib.suppress(psutil.Error):
            child.kill()


def _outside_group(procs: Sequence[subprocess.Popen[bytes]]) -> list[psutil.Process]:
    """Descendants of ``procs`` that left their process group: pdsh starts each ``ssh`` in a
    session of its own, and an ssh to a node whose link is down never notices that pdsh was
    killed (no packet comes back); it would stay on this machine, orphaned, for good."""
    out: list[psutil.Process] = []
    for p in procs:
        with contextlib.suppress(psutil.Error):
            out += [
                c
                for c in psutil.Process(p.pid).children(recursive=True)
                if _pgid(c.pid) not in (p.pid, None)
            ]
    return out


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except (ProcessLookupError, PermissionError):
        return None


def node_processes(
    run_dir: Path,
    run: dict[str, Any],
    wrap: Callable[[int, list[str]], list[str]] | None = None,
) -> list[NodeProcess]:
    """The processes a run needs: one ``bash launch.sh``, or one per node for ``no_ssh``.

    ``wrap(i, argv)`` runs node ``i``'s process in its place; for a single launcher, ``wrap(0,
    argv)`` runs it where it belongs (the lab's Slurm cluster: inside a ``salloc``).
    """
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
    argv = ["bash", launch]
    return [NodeProcess("launcher", wrap(0, argv) if wrap else argv, run_dir / "launcher.log")]


# --- classification -------------------------------------------------------------------------

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


def _classify(
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


def _classify_stopped(
    logs: list[Path],
    upto: dict[Path, int],
    kind: str,
    reason: str,
    progress: _Progress,
    arrivals: Arrivals | None = None,
) -> Outcome:
    """Outcome of a run the executor stopped (hang, time limit): a cause the logs held before
    the stop wins (a killed peer leaves the survivors hanging), the stop goes in the reason."""
    merged, failures = read_logs(logs, upto, arrivals)
    last, total = _progress_of(merged)
    last = last if last is not None else progress.iteration
    total = total if total is not None else progress.train_iters
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


def _one_line(text: str) -> str:
    return " ".join(text.split())


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
    mem_limit_bytes: int | None = None,
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
    ``mem_limit_bytes`` runs every process started here in a memory cgroup of that size (a
    rank the kernel OOM-kills there makes the run ``failed`` with kind ``oom``).

    Whatever happens (a process that cannot start, a hook that raises), run.json ends with an
    outcome: the run is never left ``running``.
    """
    run_dir = Path(run_dir)
    doc = json.loads((run_dir / "run.json").read_text())
    record = from_json(doc, str(run_dir / "run.json"))
    outcome_prev = record.outcome.status if record.outcome else None
    if outcome_prev not in (None, "generated"):
        raise RuntimeError(
            f"{run_dir} was already run (outcome {outcome_prev!r}); a run directory is never "
            "reused: generate a new one"
        )
    procs_spec = node_processes(run_dir, doc, wrap)
    cgroup = None
    if mem_limit_bytes is not None:
        cgroup = MemoryCgroup.create(mem_limit_bytes, f"{doc.get('name', 'run')}-{os.getpid()}")
        procs_spec = [replace(n, argv=cgroup.wrap(n.argv)) for n in procs_spec]
    progress = _Progress()
    arrivals = Arrivals()
    start_iso = utc_now()
    running: dict[str, Any] = {"status": "running", "start": start_iso}
    fields: dict[str, Any] = {"outcome": running}
    if cgroup is not None:
        fields["limits"] = {
            "memory_bytes": cgroup.limit_bytes,
            "memory": format_size(cgroup.limit_bytes),
            "cgroup": str(cgroup.path),
            "cgroup_version": cgroup.version,
        }
    update_run_json(run_dir, **fields)

    interrupted: list[int] = []

    def on_signal(signum, _frame):
        interrupted.append(signum)

    old_handlers = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    procs: list[subprocess.Popen[bytes]] = []
    pumps: list[threading.Thread] = []
    t0 = time.monotonic()
    hit: tuple[str, str] | None = None  # (kind, reason) for hang / time_limit / interrupted
    error: BaseException | None = None
    upto: dict[Path, int] = {}  # log sizes when the executor stopped the run
    leftovers: list[int] = []
    oom_kills = 0
    at_limit: bool | None = None
    limit_now = 0  # the cgroup's limit when the run ended (someone may change it meanwhile)
    bar = None
    network = None
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
            t = threading.Thread(target=_pump, args=(p, np_.log, progress, arrivals), daemon=True)
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
    except BaseException as exc:  # recorded below, then raised again
        error = exc
    finally:
        if any(p.poll() is None or _group_alive(p.pid) for p in procs):
            upto = {n.log: n.log.stat().st_size for n in procs_spec if n.log.exists()}
            _stop(procs)
        for t in pumps:
            t.join(timeout=10)
        if bar is not None:
            bar.stop()
        for s, h in old_handlers.items():
            signal.signal(s, h)
        if cgroup is not None:
            oom_kills = cgroup.oom_kills()  # read before the group goes away
            at_limit = cgroup.limit_reached()
            limit_now = cgroup.current_limit()
            leftovers = cgroup.remove()
        if on_end:
            try:
                network = on_end()
            except Exception as e:  # counters are a bonus; never lose the outcome over them
                network = {"error": f"could not read network counters: {e}"}
    exit_codes = {np_.label: p.returncode for np_, p in zip(procs_spec, procs, strict=False)}
    logs = [n.log for n in procs_spec]
    if error is not None and not isinstance(error, KeyboardInterrupt):
        outcome = Outcome(
            "failed",
            kind="other",
            reason=_one_line(f"the executor could not run it: {type(error).__name__}: {error}"),
            last_iteration=progress.iteration,
            train_iters=progress.train_iters,
        )
    elif (hit is not None and hit[0] == "cancelled") or isinstance(error, KeyboardInterrupt):
        reason = hit[1] if hit is not None else "interrupted (KeyboardInterrupt)"
        outcome = Outcome(
            "interrupted",
            kind="cancelled",
            reason=reason,
            last_iteration=progress.iteration,
            train_iters=progress.train_iters,
        )
    elif hit is not None:
        outcome = _classify_stopped(logs, upto, hit[0], hit[1], progress, arrivals)
    else:
        outcome = _classify(run_dir, logs, exit_codes, arrivals)
    if cgroup is not None and oom_kills > 0:
        seen = f"{outcome.kind}: {outcome.reason}" if outcome.kind else "no failure in the log"
        limit = format_size(limit_now)
        if limit_now != cgroup.limit_bytes:
            limit += f" (changed while the run ran; configured {format_size(cgroup.limit_bytes)})"
        outcome = replace(
            outcome,
            status="failed",
            kind="oom",
            reason=_one_line(
                f"{oom_kills} process(es) killed by the kernel OOM killer "
                + (
                    f"at the memory limit {limit}"
                    if at_limit is not False
                    else f"with the machine out of memory (the run stayed under its limit {limit})"
                )
                + f" (cgroup {cgroup.path.name} oom_kill counter); the log says: {seen}"
            ),
        )
    outcome = replace(
        outcome,
        exit_codes=exit_codes,
        start=start_iso,
        end=utc_now(),
        wall_s=round(time.monotonic() - t0, 3),
    )
    if outcome.status != "completed":
        marker = (
            f"# run outcome: {outcome.status} kind={outcome.kind} "
            f"reason={_one_line(outcome.reason or '')}\n"
        )
        for log in logs:
            with contextlib.suppress(OSError), log.open("a", encoding="utf-8") as f:
                f.write(marker)
    fields = {"outcome": asdict(outcome)}
    if network is not None:
        fields["network"] = network
    if leftovers:
        fields["stopped_leftovers"] = leftovers
    update_run_json(run_dir, **fields)
    if error is not None:
        raise error
    if interrupted:
        # Re-deliver the interruption to the caller (a matrix stops; Ctrl-C reaches the shell).
        raise KeyboardInterrupt
    return outcome
