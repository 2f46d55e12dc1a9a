"""A real Slurm cluster on the emulated lab: munge, slurmctld on node 0, one slurmd per node.

What runs where (all inside the lab's network namespaces, so the lab's teardown, also on
Ctrl-C, stops every daemon with the namespaces):

- ``munged`` in node 0's namespace, with a key made for the lab, on a socket in the lab's state
  directory. Every Slurm daemon and client on this machine reaches it through that socket
  (``AuthInfo=socket=...``): one munged serves the whole cluster, since every node shares the
  machine's file system and clock. The lab's state directory is private (0700), which munged
  reports as "socket is inaccessible"; ``--force`` starts it anyway (root is the only user).
- ``slurmctld`` in node 0 and one ``slurmd`` per node, each with the node's name as its host name
  (a UTS namespace per daemon: ``unshare --uts`` then ``hostname node<i>``), so each slurmd finds
  its own ``NodeName`` in ``slurm.conf``; every node's ``NodeAddr`` is its lab address and
  ``SlurmctldHost`` is node 0's. Daemons enter a node with ``nsenter --net`` rather than
  ``ip netns exec``: the latter mounts a fresh ``/sys`` without ``/sys/fs/cgroup``, where
  slurmd stops at "Unable to initialize cgroup plugin".
- ``slurm.conf`` for a container-like host: ``ProctrackType=proctrack/linuxproc`` (no cgroup
  process tracking), ``TaskPlugin=task/none``, no accounting; each node offers the machine's
  cores (namespaces share them). State, spool, pid files and logs live in the lab's state
  directory. Client commands (``sinfo``, ``salloc``, ``srun`` ...) find the cluster through
  ``SLURM_CONF``.

The cluster is ready when ``sinfo`` shows every node idle. ``down()`` cancels every job, waits
for the queue to empty and stops the daemons.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import secrets
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from launchers.config.project import remote_environment
from launchers.config.spec import RunSpec
from launchers.lab.cluster import Lab
from launchers.lab.net import LabError, LabNode, namespace_pids
from launchers.lab.session import LabSession
from launchers.lab.tools import check_launcher
from launchers.run.execute import update_run_json
from launchers.run.sbatch import SBATCH_NAME, allocation, render_sbatch

SLURMCTLD_PORT = 6817
"""slurmctld's port (Slurm's default), on node 0's address."""
SLURMD_PORT = 6818
"""Each slurmd's port (Slurm's default), on its node's address."""
PARTITION = "lab"
"""The one partition, holding every node (the default partition)."""
READY_TIMEOUT_S = 60.0
"""Seconds the daemons get to register and show every node idle."""
SLURMD_TIMEOUT_S = 60
"""``SlurmdTimeout``: seconds without an answer from a node's slurmd before slurmctld sets the
node DOWN and fails its jobs (``NODE_FAIL``); Slurm's default is 300."""
KILL_WAIT_S = 5
"""``KillWait``: seconds between SIGTERM and SIGKILL for a job's tasks at cancel or time limit
(Slurm's default is 30; the lab's jobs are short)."""

FINAL_STATES: dict[str, tuple[str, str, str] | None] = {
    "COMPLETED": None,
    "FAILED": None,
    "CANCELLED": ("interrupted", "cancelled", "was cancelled"),
    "PREEMPTED": ("interrupted", "cancelled", "was preempted"),
    "TIMEOUT": ("failed", "time_limit", "reached its time limit"),
    "DEADLINE": ("failed", "time_limit", "reached its deadline"),
    "NODE_FAIL": ("failed", "killed", "lost a node of its allocation (NODE_FAIL)"),
    "BOOT_FAIL": ("failed", "killed", "could not boot a node of its allocation (BOOT_FAIL)"),
    "OUT_OF_MEMORY": ("failed", "oom", "ran out of memory (OUT_OF_MEMORY)"),
}
"""Slurm job states that end a job, and the run outcome (status, kind, what happened) each one
means. None: the job ended by itself and the logs and exit codes decide (completed, or the
failure the log names)."""

_KV_RE = re.compile(r"(\w+(?:/\w+)?(?::\w+)?)=(\S*)")


@dataclass(frozen=True)
class SlurmJob:
    """One Slurm job of a run, as ``scontrol show job`` reported it when the run ended."""

    job_id: int
    """Slurm's job id."""
    name: str
    """``JobName``."""
    state: str
    """``JobState`` (``COMPLETED``, ``CANCELLED``, ``TIMEOUT``, ``NODE_FAIL`` ...)."""
    reason: str
    """``Reason`` (``None`` when Slurm gives none)."""
    exit_code: str
    """``ExitCode`` (``code:signal``)."""
    nodes: tuple[str, ...]
    """The allocation's nodes, in order."""
    node_list: str
    """``NodeList`` as Slurm writes it (``node[0-1]``)."""
    time_limit: str
    """``TimeLimit`` (``UNLIMITED`` or ``[D-]HH:MM:SS``)."""
    start: str
    """``StartTime``."""
    end: str
    """``EndTime``."""
    stopped_by_executor: bool = False
    """The job was still running when the run ended (the executor stopped the run: Ctrl-C,
    hang, time limit) and the lab cancelled it; its state says nothing about the run then."""
    cancelled_by_uid: int | None = None
    """Who asked slurmctld to kill the job (``scancel``: ``REQUEST_KILL_JOB ... uid N`` in its
    log); None when nobody did. A ``CANCELLED`` job nobody killed was given up by its
    ``salloc``, which does so when the executor stops it (SIGTERM): not a cancel by a user."""


def parse_job(text: str) -> dict[str, str]:
    """``scontrol -o show job`` output (one line of ``Key=Value``) as a dict."""
    return {m[1]: m[2] for m in _KV_RE.finditer(text)}


def slurm_conf_text(
    cluster: str, nodes: Sequence[LabNode], cpus: int, state_dir: Path, munge_socket: Path
) -> str:
    """``slurm.conf`` of a lab's cluster (pure): nodes named after the lab's, by address."""
    if not nodes:
        raise ValueError("a Slurm cluster needs at least one node")
    if cpus < 1:
        raise ValueError(f"cpus({cpus}) must be >= 1")
    log, run = state_dir / "log", state_dir / "run"
    lines = [
        f"# Slurm cluster of lab {cluster}: written by launchers.lab.slurm, removed with the lab.",
        f"ClusterName={cluster}",
        f"SlurmctldHost={nodes[0].name}({nodes[0].address})",
        f"SlurmctldPort={SLURMCTLD_PORT}",
        f"SlurmdPort={SLURMD_PORT}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={munge_socket}",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={state_dir / 'state'}",
        f"SlurmdSpoolDir={state_dir / 'spool'}/%n",
        f"SlurmctldPidFile={run / 'slurmctld.pid'}",
        f"SlurmdPidFile={run}/slurmd.%n.pid",
        f"SlurmctldLogFile={log / 'slurmctld.log'}",
        f"SlurmdLogFile={log}/slurmd.%n.log",
        "# A container-like host: no cgroup process tracking or task binding, no accounting.",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "MpiDefault=none",
        "MailProg=/bin/true",
        "ReturnToService=2",
        # The configured cores count, not the sockets/cores layout hwloc reads.
        "SlurmdParameters=config_overrides",
        f"KillWait={KILL_WAIT_S}",
        f"SlurmdTimeout={SLURMD_TIMEOUT_S}",
        "InactiveLimit=0",
        "MinJobAge=600",
        *(f"NodeName={n.name} NodeAddr={n.address} CPUs={cpus} State=UNKNOWN" for n in nodes),
        f"PartitionName={PARTITION} Nodes={','.join(n.name for n in nodes)} Default=YES "
        "MaxTime=INFINITE State=UP",
    ]
    return "\n".join(lines) + "\n"


def in_node(node: LabNode, argv: Sequence[str]) -> list[str]:
    """argv running ``argv`` in ``node``'s network namespace with host name ``node.name``."""
    return ["nsenter", f"--net=/run/netns/{node.namespace}", "unshare", "--uts", "sh", "-c",
            'hostname "$0" && exec "$@"', node.name, *argv]  # fmt: skip


class SlurmCluster:
    """munged, slurmctld and the slurmds of a running lab; ``with SlurmCluster(lab):``."""

    def __init__(self, lab: Lab, cpus: int | None = None) -> None:
        self.lab = lab
        self.cpus = cpus or os.cpu_count() or 1
        self.daemons: dict[str, subprocess.Popen] = {}
        self._up = False

    # -- paths and environment

    @property
    def state_dir(self) -> Path:
        """``<lab state>/slurm``: configuration, key, state, spool, logs."""
        return self.lab.state_dir / "slurm"

    @property
    def conf_path(self) -> Path:
        """The cluster's ``slurm.conf``."""
        return self.state_dir / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        """munged's socket (its directory must be world-searchable)."""
        return self.state_dir / "run" / "munge.socket"

    @property
    def log_dir(self) -> Path:
        """Daemon logs: ``slurmctld.log``, ``slurmd.<node>.log``, ``munged.log``."""
        return self.state_dir / "log"

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """Environment of a Slurm client command of this cluster (``SLURM_CONF``)."""
        env = dict(os.environ if base is None else base)
        env["SLURM_CONF"] = str(self.conf_path)
        return env

    def command(self, argv: Sequence[str], timeout: float = 30) -> subprocess.CompletedProcess:
        """Run a client command (``sinfo``, ``scontrol`` ...) against this cluster."""
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                              env=self.env(), check=False)  # fmt: skip

    # -- life cycle

    def __enter__(self) -> SlurmCluster:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    def up(self) -> SlurmCluster:
        """Start munged, slurmctld and the slurmds; return once ``sinfo`` shows every node idle."""
        check_launcher("slurm")
        nodes = self.lab.nodes
        if not nodes:
            raise LabError("the lab is not up: start the Slurm cluster inside 'with Lab(...)'")
        self._up = True
        try:
            for sub in ("state", "spool", "log", "run"):
                (self.state_dir / sub).mkdir(parents=True, exist_ok=True)
            for node in nodes:
                (self.state_dir / "spool" / node.name).mkdir(exist_ok=True)
            self.state_dir.chmod(0o755)
            (self.state_dir / "run").chmod(0o755)  # munged: a world-searchable socket directory
            key = self.state_dir / "munge.key"
            key.write_bytes(secrets.token_bytes(128))
            key.chmod(0o600)
            self.conf_path.write_text(
                slurm_conf_text(self.lab.name, nodes, self.cpus, self.state_dir,
                                self.munge_socket), encoding="utf-8",
            )  # fmt: skip
            self._start("munged", nodes[0], [
                "munged", "--foreground", "--force", f"--socket={self.munge_socket}",
                f"--key-file={key}", f"--log-file={self.log_dir / 'munged.log'}",
                f"--pid-file={self.state_dir / 'run' / 'munged.pid'}",
                f"--seed-file={self.state_dir / 'munged.seed'}",
            ])  # fmt: skip
            self._wait_for(lambda: self.munge_socket.exists(), "munged", "its socket", 10)
            self._start("slurmctld", nodes[0], ["slurmctld", "-D", "-f", str(self.conf_path)])
            for node in nodes:
                self._start(
                    f"slurmd.{node.name}", node, ["slurmd", "-D", "-f", str(self.conf_path)]
                )
            self._wait_for(self._all_idle, "slurmd", "every node idle in sinfo", READY_TIMEOUT_S)
        except BaseException:
            self.down()
            raise
        return self

    def _start(self, name: str, node: LabNode, argv: list[str]) -> None:
        out = open(self.log_dir / f"{name}.out", "ab")  # noqa: SIM115
        with out:
            self.daemons[name] = subprocess.Popen(
                in_node(node, argv), stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                start_new_session=True,
            )  # fmt: skip

    def _wait_for(self, ready, what: str, condition: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dead = {n: p.returncode for n, p in self.daemons.items() if p.poll() is not None}
            if dead:
                name = next(iter(dead))
                raise LabError(f"{name} exited ({dead[name]}) while starting the lab's Slurm "
                               f"cluster: {self._tail(name)}")  # fmt: skip
            if ready():
                return
            time.sleep(0.5)
        raise LabError(
            f"{what}: no {condition} after {timeout:.0f} s; sinfo says: "
            f"{self.command(['sinfo', '-N', '-h', '-o', '%N %T']).stdout.strip()!r}; "
            f"{self._tail(what if what in self.daemons else 'slurmctld')}"
        )

    def _tail(self, name: str, lines: int = 8) -> str:
        texts = []
        for path in (self.log_dir / f"{name}.out", self.log_dir / f"{name}.log"):
            with contextlib.suppress(OSError):
                texts += path.read_text(errors="replace").splitlines()[-lines:]
        return " | ".join(texts) or f"no output in {self.log_dir}"

    def node_states(self) -> dict[str, str]:
        """``sinfo``'s state of every node (``idle``, ``alloc``, ``down*`` ...)."""
        out = self.command(["sinfo", "-N", "-h", "-o", "%N %T"], timeout=15).stdout
        return dict(line.split(None, 1) for line in out.splitlines() if len(line.split()) == 2)

    def _all_idle(self) -> bool:
        states = self.node_states()
        return all(states.get(n.name) == "idle" for n in self.lab.nodes)

    def sinfo(self) -> str:
        """``sinfo`` as a user sees it."""
        return self.command(["sinfo"]).stdout

    def queue(self) -> list[int]:
        """Ids of the jobs in the queue (pending or running)."""
        out = self.command(["squeue", "-h", "-o", "%i"], timeout=15).stdout
        return [int(x) for x in out.split() if x.isdigit()]

    def cancel_all(self, timeout: float = 30) -> list[int]:
        """scancel every job, wait until the queue is empty; returns the ids it cancelled."""
        if not self._controller_alive():
            return []
        ids = self.queue()
        if ids:
            self.command(["scancel", *map(str, ids)])
        deadline = time.monotonic() + timeout
        while self.queue() and time.monotonic() < deadline:
            time.sleep(0.5)
        return ids

    def _controller_alive(self) -> bool:
        proc = self.daemons.get("slurmctld")
        return proc is not None and proc.poll() is None

    def job(self, job_id: int) -> dict[str, str]:
        """``scontrol show job`` of one job as a dict (empty when Slurm no longer knows it)."""
        out = self.command(["scontrol", "-o", "show", "job", str(job_id)], timeout=15)
        return parse_job(out.stdout) if out.returncode == 0 else {}

    def find_job(self, name: str) -> int | None:
        """The newest job named ``name``, if Slurm still holds it."""
        out = self.command(["scontrol", "-o", "show", "jobs"], timeout=15).stdout
        ids = [
            int(d["JobId"])
            for line in out.splitlines()
            if (d := parse_job(line)).get("JobName") == name and d.get("JobId", "").isdigit()
        ]
        return max(ids) if ids else None  # fmt: skip

    def expand(self, node_list: str) -> tuple[str, ...]:
        """``node[0-1]`` -> ``("node0", "node1")`` (``scontrol show hostnames``)."""
        if not node_list or node_list == "(null)":
            return ()
        out = self.command(["scontrol", "show", "hostnames", node_list], timeout=15).stdout
        return tuple(out.split())

    def settle(
        self, name: str, since: Mapping[Path, int] | None = None, timeout: float = 20
    ) -> SlurmJob | None:
        """The job named ``name`` once it has ended; a job still running is cancelled first
        (the run ended without it: the executor stopped the run) and marked as such. ``since``
        (:meth:`log_sizes` when the run started) bounds the slurmctld log read for who killed
        the job."""
        job_id = self.find_job(name)
        if job_id is None:
            return None
        info = self.job(job_id)
        stopped = False
        deadline = time.monotonic() + timeout
        while info.get("JobState") not in FINAL_STATES and time.monotonic() < deadline:
            if info.get("JobState") in ("RUNNING", "PENDING", "SUSPENDED") and not stopped:
                # Still running after its launcher ended: whatever ended the run, not Slurm.
                stopped = True
                self.command(["scancel", str(job_id)])
            time.sleep(0.5)
            info = self.job(job_id)
        return SlurmJob(
            job_id=job_id,
            name=info.get("JobName", name),
            state=info.get("JobState", "UNKNOWN"),
            reason=info.get("Reason", ""),
            exit_code=info.get("ExitCode", ""),
            nodes=self.expand(info.get("NodeList", "")),
            node_list=info.get("NodeList", ""),
            time_limit=info.get("TimeLimit", ""),
            start=info.get("StartTime", ""),
            end=info.get("EndTime", ""),
            stopped_by_executor=stopped,
            cancelled_by_uid=self._killed_by(job_id, since or {}),
        )

    def _killed_by(self, job_id: int, since: Mapping[Path, int]) -> int | None:
        """The uid slurmctld logged a kill request of ``job_id`` from, if any."""
        log = self.log_dir / "slurmctld.log"
        with contextlib.suppress(OSError), log.open("rb") as f:
            f.seek(since.get(log, 0))
            text = f.read().decode(errors="replace")
            if m := re.search(rf"REQUEST_KILL_JOB JobId={job_id} uid (\d+)", text):
                return int(m[1])
        return None

    def daemon_pids(self) -> set[int]:
        """Processes that are the cluster's daemons (kept when a run's leftovers are swept):
        munged, slurmctld with its helper ``slurmscriptd``, each slurmd (whose children, the
        ``slurmstepd`` of a job, are the job's)."""
        # nsenter, unshare and sh exec into the daemon: each Popen pid is the daemon itself.
        pids = {proc.pid for proc in self.daemons.values() if proc.poll() is None}
        for name in ("munged", "slurmctld"):
            if (proc := self.daemons.get(name)) is not None and proc.poll() is None:
                pids |= _descendants(proc.pid)
        return pids

    def log_sizes(self) -> dict[Path, int]:
        """Current size of every daemon log (to copy what a run added)."""
        return {p: p.stat().st_size for p in self.log_dir.glob("*.log")}

    def copy_logs(self, since: Mapping[Path, int], target: Path) -> list[Path]:
        """Copy what each daemon log gained since ``since`` into ``target`` (a run's)."""
        target.mkdir(parents=True, exist_ok=True)
        copied = []
        for path in sorted(self.log_dir.glob("*.log")):
            with path.open("rb") as f:
                f.seek(since.get(path, 0))
                data = f.read()
            if data:
                (target / path.name).write_bytes(data)
                copied.append(target / path.name)
        return copied

    def down(self) -> None:
        """Cancel every job, stop the daemons (safe to call twice; the lab removes the rest)."""
        if not self._up:
            return
        self._up = False
        with contextlib.suppress(subprocess.TimeoutExpired, OSError):
            self.cancel_all(timeout=15)
        for name in ("slurmd", "slurmctld", "munged"):
            for proc in [p for n, p in self.daemons.items() if n.startswith(name)]:
                _stop_group(proc)
        self.daemons = {}


def _descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (from ``/proc/*/stat`` parent links)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(stat.parent.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _stop_group(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """SIGTERM a daemon's process group, SIGKILL it after ``grace_s``."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


# ----------------------------------------------------------------------------- runs


@dataclass
class SlurmLabSession(LabSession):
    """A lab session whose runs go through the lab's Slurm cluster.

    Each run is one job: ``salloc`` with the options of the run's ``sbatch.sh`` (nodes, tasks
    per node, time limit, the lab's node names) runs ``launch.sh``, whose ``deepspeed
    --launcher slurm`` starts the ranks with ``srun`` on the nodes. When the run ends, the job's
    state is read (``scontrol show job``), recorded in run.json under ``"slurm"`` and mapped to
    the outcome (:data:`FINAL_STATES`); what the daemons logged meanwhile is copied into the
    run directory (``slurm/``).
    """

    slurm: SlurmCluster | None = None
    """The running cluster."""
    time_limit_s: float | None = None
    """Each job's time limit (``--time``), None for none."""
    job: SlurmJob | None = field(default=None, repr=False)
    """The current run's job, once it has ended."""

    def _cluster(self) -> SlurmCluster:
        if self.slurm is None:
            raise LabError("the lab's Slurm cluster is not up")
        return self.slurm

    def keep_pids(self) -> set[int]:
        """The lab's sshd and the cluster's daemons."""
        return super().keep_pids() | self._cluster().daemon_pids()

    def strays(self) -> list[dict[str, Any]]:
        """Processes in the nodes that are neither the lab's sshd nor the cluster's daemons."""
        keep = self.keep_pids()
        found = []
        for node in self.lab.nodes:
            for pid in namespace_pids(node.namespace):
                with contextlib.suppress(OSError):
                    comm = Path(f"/proc/{pid}/comm").read_text().strip()
                    if pid not in keep:
                        found.append({"node": node.name, "pid": pid, "program": comm})
        return found

    def job_name(self, spec: RunSpec, run_dir: Path) -> str:
        """The run's job name: ``<run name>.<run directory>`` (unique, readable in squeue)."""
        return f"{spec.name}.{run_dir.name}"

    def launch_hooks(self, spec: RunSpec, run_dir: Path) -> dict[str, Any]:
        """``salloc <the run's allocation> bash launch.sh``, with the cluster's ``SLURM_CONF``."""
        how = {
            "time_limit_s": self.time_limit_s if self.time_limit_s is not None else math.inf,
            "job_name": self.job_name(spec, run_dir),
            "nodes": [node.name for node in self.lab.nodes],
        }
        alloc = allocation(spec, **how)
        (run_dir / SBATCH_NAME).write_text(render_sbatch(spec, str(run_dir), **how), "utf-8")
        env = {
            "SLURM_CONF": str(self._cluster().conf_path),
            "DS_ENV_FILE": str(self.lab.write_deepspeed_env(remote_environment(spec))),
        }
        # --kill-command: when Slurm revokes the allocation (scancel, time limit, a lost
        # node), salloc signals launch.sh; without it, an srun waiting on a dead node's tasks
        # kept the run (and itself, outside the nodes) alive after the job had ended.
        salloc = ["salloc", "--kill-command=TERM", *alloc.options()]
        return {"env": env, "wrap": lambda _i, argv: [*salloc, *argv]}

    def hooks(self, spec: RunSpec, run_dir: Path) -> dict[str, Any]:
        """The lab's hooks; at the end, the job is settled and recorded before the sweep."""
        cluster = self._cluster()
        self.job = None
        hooks = super().hooks(spec, run_dir)
        name = self.job_name(spec, run_dir)
        sizes = cluster.log_sizes()
        sinfo = cluster.sinfo()
        base_end = hooks["on_end"]

        def on_end() -> dict[str, Any]:
            self.job = cluster.settle(name, sizes)
            with contextlib.suppress(OSError):
                cluster.copy_logs(sizes, run_dir / "slurm")
            doc = base_end()  # stops what the job left in the nodes, reads the counters
            record: dict[str, Any] = {"job_name": name, "sinfo_before": sinfo}
            record |= (
                asdict(self.job)
                if self.job
                else {"job_id": None, "problem": "Slurm no longer knows the job"}
            )
            # Once the run is over: the queue, and what still runs in the nodes besides the
            # cluster's daemons (both empty unless something escaped the job and the sweep).
            record["queue_after"] = cluster.queue()
            record["processes_after"] = self.strays()
            update_run_json(run_dir, slurm=record)
            return doc

        hooks["on_end"] = on_end
        return hooks

    def settle(self, run_dir: Path, outcome: Any) -> Any:
        """The outcome the job's final state says (cancelled, time limit, node failure), with
        what the logs said kept in the reason; as is when the job ended by itself."""
        job = self.job
        if job is None or job.stopped_by_executor or FINAL_STATES.get(job.state) is None:
            return outcome
        if job.state == "CANCELLED" and job.cancelled_by_uid is None:
            # Nobody asked slurmctld to kill it: salloc gave the allocation up when the
            # executor stopped it (hang, the executor's time limit). The executor's outcome.
            return outcome
        status, kind, what = FINAL_STATES[job.state]  # type: ignore[misc]
        seen = f"{outcome.kind}: {outcome.reason}" if outcome.kind else "no failure"
        by = f" (scancel by uid {job.cancelled_by_uid})" if job.cancelled_by_uid is not None else ""
        reason = (
            f"Slurm job {job.job_id} {what}{by} (JobState={job.state}, Reason={job.reason}, "
            f"nodes {job.node_list}, time limit {job.time_limit}); the log says: {seen}"
        )
        reason = " ".join(reason.split())
        settled = replace(outcome, status=status, kind=kind, reason=reason)
        update_run_json(run_dir, outcome=asdict(settled))
        with contextlib.suppress(OSError), (run_dir / "launcher.log").open("a") as log:
            log.write(f"# run outcome: {status} kind={kind} reason={reason}\n")
        return settled


@contextlib.contextmanager
def slurm_session(lab: Lab, time_limit_s: float | None = None) -> Iterator[SlurmLabSession]:
    """Start the lab's Slurm cluster for a session; always stop it (errors, Ctrl-C included)."""
    with SlurmCluster(lab) as cluster:
        print(f"lab {lab.name}: Slurm cluster up, sinfo:\n{cluster.sinfo().rstrip()}", flush=True)
        yield SlurmLabSession(lab=lab, ssh=lab.ssh, launcher="slurm", slurm=cluster,
                              time_limit_s=time_limit_s)  # fmt: skip
