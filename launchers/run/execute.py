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
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psutil
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from analysis.runs.record import SCHEMA_VERSION, Outcome, from_json
from launchers.run import gpus
from launchers.run.memlimit import MemoryCgroup, format_size
from launchers.run.render import write_atomic
from launchers.run.verdict import Arrivals, classify, classify_stopped

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


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _render_bar(progress: _Progress, title: str) -> tuple[Progress, TaskID]:

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


@dataclass
class _Execution:
    """One run directory being executed: what was started, and what was seen while it ran."""

    run_dir: Path
    """The run directory."""
    name: str
    """The run's name (the progress bar's title)."""
    nodes: list[NodeProcess]
    """The launcher processes to start (wrapped for the lab and the memory cgroup)."""
    cgroup: MemoryCgroup | None
    """The run's memory cgroup (``mem_limit_bytes``), or None."""
    start_iso: str = ""
    """UTC start time, as run.json records it."""
    t0: float = 0.0
    """``time.monotonic()`` when the processes were about to start."""
    progress: _Progress = field(default_factory=_Progress)
    """Live state fed by the output streams."""
    arrivals: Arrivals = field(default_factory=Arrivals)
    """When each line of each log arrived."""
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    """The started launcher processes, in ``nodes`` order."""
    pumps: list[threading.Thread] = field(default_factory=list)
    """Threads copying each process's output to its log."""
    bar: Any = None
    """The rich progress bar and its task, when shown."""
    task: Any = None
    """The bar's task id."""
    hit: tuple[str, str] | None = None
    """(kind, reason) when the executor stopped the run: hang, time_limit, cancelled."""
    error: BaseException | None = None
    """What the executor itself raised (recorded, then raised again)."""
    upto: dict[Path, int] = field(default_factory=dict)
    """Log sizes when the executor stopped the run."""
    network: dict[str, Any] | None = None
    """What ``on_end`` returned (run.json's ``"network"``)."""
    leftovers: list[int] = field(default_factory=list)
    """Pids still in the memory cgroup at the end, killed."""
    oom_kills: int = 0
    """Processes the kernel OOM-killed in the memory cgroup."""
    at_limit: bool | None = None
    """Whether the cgroup's memory reached its limit (None: the controller does not say)."""
    limit_now: int = 0
    """The cgroup's limit when the run ended (someone may change it meanwhile)."""


def _prepare(
    run_dir: Path,
    mem_limit_bytes: int | None,
    wrap: Callable[[int, list[str]], list[str]] | None,
) -> _Execution:
    """Check the run directory was never run, plan its processes (in the memory cgroup when
    asked) and record it as running."""
    doc = json.loads((run_dir / "run.json").read_text())
    record = from_json(doc, str(run_dir / "run.json"))
    outcome_prev = record.outcome.status if record.outcome else None
    if outcome_prev not in (None, "generated"):
        raise RuntimeError(
            f"{run_dir} was already run (outcome {outcome_prev!r}); a run directory is never "
            "reused: generate a new one"
        )
    nodes = node_processes(run_dir, doc, wrap)
    cgroup = None
    if mem_limit_bytes is not None:
        cgroup = MemoryCgroup.create(mem_limit_bytes, f"{doc.get('name', 'run')}-{os.getpid()}")
        nodes = [replace(n, argv=cgroup.wrap(n.argv)) for n in nodes]
    ex = _Execution(run_dir, doc.get("name", run_dir.name), nodes, cgroup, start_iso=utc_now())
    fields: dict[str, Any] = {"outcome": {"status": "running", "start": ex.start_iso}}
    prov = gpus.provenance_with_gpus(doc)  # (CUDA only: the GPUs every node has)
    if prov is not None:
        fields["provenance"] = prov
    if cgroup is not None:
        fields["limits"] = {
            "memory_bytes": cgroup.limit_bytes,
            "memory": format_size(cgroup.limit_bytes),
            "cgroup": str(cgroup.path),
            "cgroup_version": cgroup.version,
        }
    update_run_json(run_dir, **fields)
    return ex


def _start(ex: _Execution, env: dict[str, str] | None, show_progress: bool) -> None:
    """Start every launcher process in its own session, a pump thread per output, the bar."""
    full_env = {**os.environ, **(env or {})}
    for node in ex.nodes:
        with node.log.open("ab") as f:
            f.write(f"# started {utc_now()}: {' '.join(node.argv)}\n".encode())
        p = subprocess.Popen(
            node.argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=full_env,
            start_new_session=True,
        )
        ex.procs.append(p)
        t = threading.Thread(
            target=_pump, args=(p, node.log, ex.progress, ex.arrivals), daemon=True
        )
        t.start()
        ex.pumps.append(t)
    if show_progress:
        ex.bar, ex.task = _render_bar(ex.progress, ex.name)
        ex.bar.start()


def _watch(
    ex: _Execution,
    interrupted: list[int],
    stall_s: float | None,
    timeout_s: float | None,
    on_iteration: Callable[[int], None] | None,
) -> None:
    """Follow the processes until they end, or until the executor must stop them (``ex.hit``):
    a signal, the time limit, no output for ``stall_s``, or one node dead while others wait."""
    progress, procs = ex.progress, ex.procs
    seen_iteration = 0
    while any(p.poll() is None for p in procs):
        progress.changed.wait(timeout=0.5)
        progress.changed.clear()
        now = time.monotonic()
        if on_iteration is not None and progress.iteration > seen_iteration:
            seen_iteration = progress.iteration
            on_iteration(seen_iteration)
        if ex.bar is not None:
            detail = (
                f"{progress.iter_ms:.0f} ms/iter  loss {progress.loss:.4f}"
                if progress.iter_ms is not None and progress.loss is not None
                else "starting..."
            )
            ex.bar.update(
                ex.task, completed=progress.iteration, total=progress.train_iters, detail=detail
            )
        if interrupted:
            ex.hit = ("cancelled", f"interrupted by signal {signal.Signals(interrupted[0]).name}")
            return
        if timeout_s is not None and now - ex.t0 > timeout_s:
            ex.hit = ("time_limit", f"run exceeded its time limit of {timeout_s:.0f} s")
            return
        if stall_s is not None and now - progress.last_output > stall_s:
            ex.hit = (
                "hang",
                f"no output for {stall_s:.0f} s (last iteration "
                f"{progress.iteration}): stopped as hung",
            )
            return
        # One node died while others wait in a collective: stop the rest promptly.
        dead = [p for p in procs if p.poll() not in (None, 0)]
        if dead and len(procs) > 1 and any(p.poll() is None for p in procs):
            grace_end = now + 30.0
            while time.monotonic() < grace_end and any(p.poll() is None for p in procs):
                time.sleep(0.5)
            return


def _stop_all(ex: _Execution) -> None:
    """Stop whatever of the run is still alive (noting the log sizes then), end the pumps and
    the bar."""
    if any(p.poll() is None or _group_alive(p.pid) for p in ex.procs):
        ex.upto = {n.log: n.log.stat().st_size for n in ex.nodes if n.log.exists()}
        _stop(ex.procs)
    for t in ex.pumps:
        t.join(timeout=10)
    if ex.bar is not None:
        ex.bar.stop()


def _release(ex: _Execution, on_end: Callable[[], dict[str, Any] | None] | None) -> None:
    """Read and remove the memory cgroup, then let ``on_end`` have its say (never failing)."""
    if ex.cgroup is not None:
        ex.oom_kills = ex.cgroup.oom_kills()  # read before the group goes away
        ex.at_limit = ex.cgroup.limit_reached()
        ex.limit_now = ex.cgroup.current_limit()
        ex.leftovers = ex.cgroup.remove()
    if on_end:
        try:
            ex.network = on_end()
        except Exception as e:  # counters are a bonus; never lose the outcome over them
            ex.network = {"error": f"could not read network counters: {e}"}


def _outcome(ex: _Execution) -> Outcome:
    """The run's outcome: the executor's error, an interruption, a stop, or what the logs and
    exit codes say; an OOM kill in the memory cgroup overrides the log's story."""
    progress, error, hit = ex.progress, ex.error, ex.hit
    exit_codes = {n.label: p.returncode for n, p in zip(ex.nodes, ex.procs, strict=False)}
    logs = [n.log for n in ex.nodes]
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
        seen = (progress.iteration, progress.train_iters)
        outcome = classify_stopped(logs, ex.upto, hit[0], hit[1], seen, ex.arrivals)
    else:
        outcome = classify(ex.run_dir, logs, exit_codes, ex.arrivals)
    if ex.cgroup is not None and ex.oom_kills > 0:
        outcome = _oom_outcome(ex, outcome)
    return replace(
        outcome,
        exit_codes=exit_codes,
        start=ex.start_iso,
        end=utc_now(),
        wall_s=round(time.monotonic() - ex.t0, 3),
    )


def _oom_outcome(ex: _Execution, outcome: Outcome) -> Outcome:
    """``failed``/``oom``: the kernel killed processes of the run's memory cgroup."""
    assert ex.cgroup is not None
    seen = f"{outcome.kind}: {outcome.reason}" if outcome.kind else "no failure in the log"
    limit = format_size(ex.limit_now)
    if ex.limit_now != ex.cgroup.limit_bytes:
        limit += f" (changed while the run ran; configured {format_size(ex.cgroup.limit_bytes)})"
    return replace(
        outcome,
        status="failed",
        kind="oom",
        reason=_one_line(
            f"{ex.oom_kills} process(es) killed by the kernel OOM killer "
            + (
                f"at the memory limit {limit}"
                if ex.at_limit is not False
                else f"with the machine out of memory (the run stayed under its limit {limit})"
            )
            + f" (cgroup {ex.cgroup.path.name} oom_kill counter); the log says: {seen}"
        ),
    )


def _record(ex: _Execution, outcome: Outcome) -> None:
    """Mark a run that did not complete at the end of every log; write the outcome (and the
    network, the stopped leftovers) into run.json."""
    if outcome.status != "completed":
        marker = (
            f"# run outcome: {outcome.status} kind={outcome.kind} "
            f"reason={_one_line(outcome.reason or '')}\n"
        )
        for node in ex.nodes:
            with contextlib.suppress(OSError), node.log.open("a", encoding="utf-8") as f:
                f.write(marker)
    fields: dict[str, Any] = {"outcome": asdict(outcome)}
    if ex.network is not None:
        fields["network"] = ex.network
    if ex.leftovers:
        fields["stopped_leftovers"] = ex.leftovers
    update_run_json(ex.run_dir, **fields)


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
    ex = _prepare(Path(run_dir), mem_limit_bytes, wrap)
    interrupted: list[int] = []

    def on_signal(signum, _frame):
        interrupted.append(signum)

    old_handlers = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    ex.t0 = time.monotonic()
    try:
        if on_start:
            on_start()
        _start(ex, env, show_progress)
        _watch(ex, interrupted, stall_s, timeout_s, on_iteration)
    except BaseException as exc:  # recorded below, then raised again
        ex.error = exc
    finally:
        _stop_all(ex)
        for s, h in old_handlers.items():
            signal.signal(s, h)
        _release(ex, on_end)
    outcome = _outcome(ex)
    _record(ex, outcome)
    if ex.error is not None:
        raise ex.error
    if interrupted:
        # Re-deliver the interruption to the caller (a matrix stops; Ctrl-C reaches the shell).
        raise KeyboardInterrupt
    return outcome
