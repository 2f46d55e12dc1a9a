"""Sessions of runs: a matrix that survives bad runs, and the emulated cluster around it.

A matrix resolves and validates every run before anything starts, then runs them one after the
other: a failed run is recorded and the matrix goes on; a run already completed with an identical
resolved spec is skipped unless forced; Ctrl-C stops the current run (recorded as interrupted)
and the matrix. At the end it prints a summary table (run, status, reason, ms per iteration) and
reports whether any run failed.

Repeated (``rounds`` > 1), the matrix runs in interleaved rounds: round 1 runs every strategy,
then round 2, and so on, each round starting one strategy further along the list, so that a
drift of the machine (other tenants, thermal state) hits every strategy alike and no strategy
always runs first. Every repeat is its own run directory; run.json's ``"repeat"`` says which
repeated matrix (``group``) and which ``round`` it belongs to (``repeat_record``).

With a lab (``--net``), the runs go to an emulated cluster (``lab.cluster``): by default the
real ``deepspeed --hostfile`` launcher on this host reaches every node through pdsh over ssh,
exactly as on a cluster; ``--launcher no_ssh`` starts ``launch.sh <node_rank>`` inside each
node's namespace instead. The session measures the collective bandwidth once (``netbench.json``,
copied into every run directory so the report shows it beside the inferred figures) and records
the ground truth of each run in run.json's ``"network"``: the link, and the bytes each node's
interface sent and received during the run and per steady-state iteration.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from analysis.theory.formulas import steady_windows
from launchers.config.spec import RunSpec
from launchers.run.render import write_atomic

NETBENCH_OPTIONS = {
    "ops": "all_reduce,all_gather,reduce_scatter,sendrecv",
    "min_bytes": str(1 << 10),
    "max_bytes": str(16 << 20),
    "factor": "4",
    "budget_s": "1.0",
    "min_iters": "2",
    "max_iters": "50",
}
"""Collective benchmark of a lab session: 1 KiB to 16 MiB (a 64 MiB all-reduce alone takes ~6 s
per operation at 100 Mbit/s; 16 MiB is past the size where the link rate is reached)."""


HOST_TIME_OPTIONS = {
    **NETBENCH_OPTIONS,
    "min_bytes": str(4 << 10),
    "max_bytes": str(4 << 20),
    "pause_ms": "20",
    "min_iters": "5",
    "max_iters": "20",
}
"""Host-time benchmark of a shaped lab session, run with the shaping lifted
(``Lab.unshaped``): each call after a 20 ms pause, as training sends its collectives between
computations. A call's time there is what the hosts cost (gloo, copies, waking up under the
node's CPU budget) without the wire; on a link this cost and the wire time overlap, and the
what-if model takes the larger of the two (``analysis.predict.calibration.LinkFit.time_ms``)."""


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
    """Mean elapsed ms of the iteration lines after the first logging window, or None."""
    from analysis.parse.reader import merge_runs, parse_file

    parts = [runs[-1] for log in sorted(run_dir.glob("*.log")) if (runs := parse_file(log))]
    if not parts:
        return None
    windows = sorted(merge_runs(parts).iterations, key=lambda it: it.iteration)
    values = [it.elapsed_ms for it in steady_windows(windows) if it.elapsed_ms is not None]
    return statistics.fmean(values) if values else None


def completed_twin(spec: RunSpec, logs: Path, repeat: Repeat | None = None) -> Path | None:
    """A completed run directory of this spec's name with the same spec hash, if any.

    With ``repeat``, only a run of the same repeated matrix and round counts: the earlier
    rounds of the same spec are the other repeats, not twins.
    """
    from launchers.config.spec import spec_hash

    wanted = spec_hash(spec)
    for record in sorted((logs / spec.name).glob("*/run.json")):
        with contextlib.suppress(OSError, json.JSONDecodeError):
            doc = json.loads(record.read_text(encoding="utf-8"))
            if (
                doc.get("spec_hash") == wanted
                and (doc.get("outcome") or {}).get("status") == "completed"
                and (repeat is None or Repeat.of(doc) == repeat)
            ):
                return record.parent
    return None


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
    import hashlib

    digest = hashlib.sha256("\n".join([str(rounds), *spec_hashes]).encode()).hexdigest()[:12]
    stamp = time.strftime("-%Y%m%dT%H%M%SZ", time.gmtime()) if force else ""
    return f"r{rounds}-{digest}{stamp}"


def repeat_record(run_dir: Path, repeat: Repeat) -> None:
    """Write the repeat grouping into the run's run.json (``"repeat"``)."""
    from launchers.run.execute import update_run_json

    update_run_json(run_dir, repeat={"group": repeat.group, "round": repeat.round,
                                     "rounds": repeat.rounds})  # fmt: skip


def interleaved(specs: Sequence[RunSpec], rounds: int) -> list[tuple[int, RunSpec]]:
    """(round, spec) in run order: every spec once per round, round k starting at spec k."""
    n = len(specs)
    return [(k + 1, specs[(k + i) % n]) for k in range(rounds) for i in range(n)]


# --- the emulated cluster -------------------------------------------------------------------


def namespace_pids(namespace: str) -> list[int]:
    """Processes inside a network namespace (``ip netns pids``)."""
    out = subprocess.run(
        ["ip", "netns", "pids", namespace], capture_output=True, text=True, check=False
    ).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def _cmdline(pid: int) -> str:
    with contextlib.suppress(OSError):
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:300]
    return ""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def lab_available(ssh: bool = True) -> tuple[bool, str]:
    """Whether this machine can host a lab, and if not, why (for the fallback message)."""
    if os.geteuid() != 0:
        return False, "not root (network namespaces need root)"
    missing = [t for t in ("ip", "tc") if shutil.which(t) is None]
    if ssh:
        missing += [t for t in ("sshd", "pdsh", "ssh-keygen") if shutil.which(t) is None]
        if shutil.which("sshd") is None and Path("/usr/sbin/sshd").exists():
            missing.remove("sshd")
    if missing:
        return False, f"missing {', '.join(missing)} (Debian: iproute2, openssh-server, pdsh)"
    return True, ""


@dataclass
class LabSession:
    """A running lab and what every run on it needs."""

    lab: Any
    """The ``launchers.lab.cluster.Lab`` (entered)."""
    ssh: bool
    """The nodes run sshd (pdsh and openmpi reach them through it)."""
    launcher: str = ""
    """The lab launcher every run uses (``cluster.LAB_LAUNCHERS``); by default pdsh over
    ssh, or ``no_ssh`` per node in each namespace when the nodes have no sshd."""
    netbench: Path | None = None
    """The session's ``netbench.json``, once measured."""
    samples: list[tuple[int, dict[str, dict[str, int]]]] = field(default_factory=list)
    """(iteration, counters) sampled during the current run."""
    start: dict[str, dict[str, int]] | None = None
    """Counters when the current run started."""
    slots: int = 1
    """Ranks per node."""

    def __post_init__(self) -> None:
        self.launcher = self.launcher or ("pdsh" if self.ssh else "no_ssh")

    @property
    def label(self) -> str:
        """What the spec records as its network."""
        return f"emulated {len(self.lab.nodes)} nodes x {self.lab.shape.label}"

    def cluster(self):
        """The lab's hostfile as a ``Cluster`` (one slot per node)."""
        from launchers.config.hostfile import parse_hostfile_text

        return parse_hostfile_text(self.lab.hostfile_text(slots=self.slots), f"lab {self.lab.name}")

    def adapt(self, spec: RunSpec) -> RunSpec:
        """The spec as it runs on this lab."""
        return replace(
            spec,
            launcher=self.launcher,
            master_addr=self.lab.master_addr,
            ssh_check=self.launcher == "no_ssh",
            network=self.label,
        )

    def measure_bandwidth(self, logs: Path) -> Path | None:
        """Run the collective benchmark once for the session; never fails the session."""
        from launchers.lab import netbench

        out = logs / "netbench" / f"{self.lab.name}-{self.lab.shape.label}"
        print(f"lab {self.lab.name}: measuring collective bandwidth ({out})", flush=True)
        try:
            netbench.run_on_lab(self.lab, out, NETBENCH_OPTIONS, timeout_s=900)
        except Exception as e:  # the runs stay useful without a measured figure
            print(f"lab {self.lab.name}: collective benchmark failed: {e}", file=sys.stderr)
            return None
        path = out / "netbench.json"
        self.netbench = path if path.exists() else None
        if self.netbench is not None and self.lab.shaping_commands:
            self.measure_host_time(out)
        return self.netbench

    def measure_host_time(self, out: Path) -> None:
        """Add the host-time benchmark (``HOST_TIME_OPTIONS``, links unshaped) to the session's
        netbench.json under ``host_time``; on failure say so there and go on."""
        from launchers.lab import netbench

        assert self.netbench is not None
        print(f"lab {self.lab.name}: measuring the hosts' time per call (links unshaped)",
              flush=True)  # fmt: skip
        doc = json.loads(self.netbench.read_text(encoding="utf-8"))
        # Not putting the shaping back raises out of here: no run may go on unshaped links.
        with self.lab.unshaped():
            try:
                host = netbench.run_on_lab(self.lab, out / "host", HOST_TIME_OPTIONS, 600)
            except Exception as e:  # the bandwidth figures stay useful without it
                print(f"lab {self.lab.name}: host-time benchmark failed: {e}", file=sys.stderr)
                host = {"error": str(e)}
        doc["host_time"] = {
            "link": "unshaped",
            "pause_ms": float(HOST_TIME_OPTIONS["pause_ms"]),
            "results": host.get("results") or [],
            "elapsed_s": host.get("elapsed_s"),
            **({"error": host["error"]} if "error" in host else {}),
        }
        write_atomic(self.netbench, json.dumps(doc, indent=2) + "\n")

    def hooks(self, spec: RunSpec, run_dir: Path) -> dict[str, Any]:
        """Keyword arguments for ``launchers.run.execute.run`` on this lab."""
        self.samples, self.start = [], None
        if self.netbench is not None:
            shutil.copy2(self.netbench, run_dir / "netbench.json")

        def on_start() -> None:
            self.start = self.lab.counters()

        def on_iteration(k: int) -> None:
            with contextlib.suppress(Exception):
                self.samples.append((k, self.lab.counters()))

        def on_end() -> dict[str, Any]:
            leftovers = self.sweep()
            doc = self.ground_truth(self.lab.counters())
            if leftovers:
                doc["stopped_leftovers"] = leftovers
            return doc

        hooks: dict[str, Any] = {"on_start": on_start, "on_iteration": on_iteration,
                                 "on_end": on_end}  # fmt: skip
        return hooks | self.launch_hooks(spec, run_dir)

    def launch_hooks(self, spec: RunSpec, run_dir: Path) -> dict[str, Any]:
        """How the executor starts a run here: ``wrap`` per node, or the launcher's ``env``."""
        from launchers.config.project import remote_environment

        if self.launcher == "no_ssh":
            return {"wrap": lambda i, argv: self.lab.wrap(i, argv, remote_environment(spec))}
        if self.launcher == "openmpi":
            return {"env": self.lab.openmpi_env(remote_environment(spec), base={})}
        return {"env": self.lab.launcher_env(remote_environment(spec), base={})}

    def settle(self, run_dir: Path, outcome: Any) -> Any:
        """The run's outcome once what ran it had its say (a scheduler's job state); as is."""
        return outcome

    def keep_pids(self) -> set[int]:
        """Processes of the lab itself, which outlive every run (each node's sshd)."""
        return set(self.lab.daemon_pids())

    def sweep(self, grace_s: float = 5.0) -> list[dict[str, Any]]:
        """Stop every process a run left inside the nodes (all but the lab's own sshd).

        The executor stops the launcher's process group, and DeepSpeed's pdsh runner forwards
        the stop to the nodes over ssh; a node whose link is down never gets it, so its ranks
        would outlive the run. Returns what had to be stopped (node, pid, command).
        """
        keep = self.keep_pids()
        found: list[dict[str, Any]] = []
        for sig in (signal.SIGTERM, signal.SIGKILL):
            alive = []
            for node in self.lab.nodes:
                for pid in namespace_pids(node.namespace):
                    if pid in keep:
                        continue
                    alive.append(pid)
                    if sig == signal.SIGTERM:
                        found.append({"node": node.name, "pid": pid, "command": _cmdline(pid)})
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, sig)
            if not alive:
                break
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline and any(_alive(pid) for pid in alive):
                time.sleep(0.1)
        return found

    def ground_truth(self, end: dict[str, dict[str, int]]) -> dict[str, Any]:
        """run.json's ``"network"``: the lab, bytes per node during the run and per iteration.

        Per iteration: counters sampled when the first and the last iteration lines after the
        first logging window appeared, divided by the iterations between them, so start-up
        traffic (rendezvous, parameter broadcast, data-index building) is left out.
        """
        from launchers.lab.cluster import LAB_TRANSPORTS

        doc = self.lab.describe()
        doc["transport"] = LAB_TRANSPORTS[self.launcher]
        delta = {
            node: {k: end[node][k] - self.start[node][k] for k in end[node]}
            for node in end
            if self.start and node in self.start
        }
        doc["counters"] = {"start": self.start, "end": end, "delta": delta}
        steady = steady_windows(self.samples)
        if len(steady) >= 2:
            (k0, c0), (k1, c1) = steady[0], steady[-1]
            per = {
                node: {
                    "tx_bytes": (c1[node]["tx_bytes"] - c0[node]["tx_bytes"]) / (k1 - k0),
                    "rx_bytes": (c1[node]["rx_bytes"] - c0[node]["rx_bytes"]) / (k1 - k0),
                }
                for node in c1
            }
            doc["per_iteration"] = {
                "from_iteration": k0,
                "to_iteration": k1,
                "bytes": per,
                "max_tx_bytes": max(v["tx_bytes"] for v in per.values()),
                "method": "interface counters sampled at the iteration lines; includes "
                "Ethernet/IP/TCP headers and the ssh-carried log output",
            }
        else:
            doc["per_iteration"] = None
            doc["per_iteration_reason"] = (
                f"only {len(self.samples)} iteration lines were seen: need 3 or more to leave "
                "out the first logging window"
            )
        return doc


@contextlib.contextmanager
def lab_session(
    nodes: int,
    net: str,
    delay_ms: float = 0.0,
    loss_pct: float = 0.0,
    ssh: bool = True,
    launcher: str | None = None,
    time_limit_s: float | None = None,
    slots: int = 1,
    node_cpus: float | str | None = "auto",
) -> Iterator[LabSession]:
    """Bring a lab up for a session and always tear it down (also on errors and signals).

    ``launcher`` (``launchers.lab.cluster.LAB_LAUNCHERS``; default pdsh, or no_ssh when ``ssh`` is
    False) is the one every run uses; one the lab cannot serve, or whose tools are missing, is
    refused before anything starts. ``slurm`` brings up the lab's Slurm cluster, whose jobs get
    ``time_limit_s``.
    """
    from launchers.lab.cluster import LAB_LAUNCHERS, Lab, LinkShape, check_launcher, lab_launcher

    chosen = lab_launcher(launcher) if launcher is not None or ssh else "no_ssh"
    check_launcher(chosen)
    shape = LinkShape.parse(net, delay_ms, loss_pct)
    with Lab(
        nodes=nodes, shape=shape, ssh=chosen in ("pdsh", "openmpi"), node_cpus=node_cpus
    ) as lab:  # type: ignore[arg-type]
        cpus = lab.describe_cpu()["cpus"]
        print(f"lab {lab.name}: {nodes} nodes x {slots} ranks, link {shape.label}, "
              f"{f'{cpus:g} cores' if cpus else 'no CPU budget'} per node, {chosen}: "
              f"{LAB_LAUNCHERS[chosen]}", flush=True)  # fmt: skip
        if chosen == "slurm":
            from launchers.lab.slurm import slurm_session

            with slurm_session(lab, time_limit_s) as session:
                session.slots = slots
                yield session
        else:
            yield LabSession(lab=lab, ssh=lab.ssh, launcher=chosen, slots=slots)


# --- the matrix ------------------------------------------------------------------------------


def run_specs(
    specs: Sequence[RunSpec],
    logs: Path,
    *,
    force: bool = False,
    stall_s: float | None = None,
    timeout_s: float | None = None,
    session: LabSession | None = None,
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
    from launchers.config.spec import spec_hash
    from launchers.run.execute import DEFAULT_STALL_S, run
    from launchers.run.render import render_run_dir

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
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

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
