"""The lab's CPU budget: one cgroup per node capping its cores (cgroup v1 or v2), and the
cleanup of a lab's cgroups.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from launchers.lab.net import PREFIX, LabError, _is_of_lab

# ----------------------------------------------------------------------------- CPU budget

CPU_CGROUP_PARENT = "mds-bench-lab"
"""Our directory under the cpu controller's root; one child per lab node (``mdsl<id>-n<i>``)."""

CPU_BUDGET_NODES = 4
"""Default budget: the machine's cores divided by this many nodes (0.5 core each on 2 cores),
the same whatever the lab's node count, so that a node of a 4-node lab computes as fast as one of
a 2-node lab, as separate machines would. Labs of more nodes than this oversubscribe the cores."""

CFS_PERIOD_US = 100_000
"""Scheduler period the quota is given in (the kernel's default, 100 ms)."""

PID_NAMESPACE = ["unshare", "--pid", "--mount-proc", "--kill-child"]
"""Each node's sshd runs as PID 1 of its own PID namespace (with its own /proc), as on a machine
of its own: DeepSpeed's pdsh runner stops a run with ``pdsh -w <nodes> pkill -f '<python> -u -m
deepspeed.launcher.launch'``, which in a shared PID namespace also kills every other lab's
launchers and the host's pdsh (their command lines match). ``--kill-child``: when ``unshare``
is stopped, its sshd (and so the whole namespace) goes too."""

JOIN_CGROUP = 'echo $$ > "$0" && exec "$@"'
"""``sh -c`` script: move this shell into the cgroup whose ``cgroup.procs`` is ``$0``, then exec
the command (its pid, and every child it forks, stay in the group)."""


def default_node_cpus() -> float:
    """Cores per node when none is asked: ``os.cpu_count() / CPU_BUDGET_NODES``."""
    return (os.cpu_count() or 1) / CPU_BUDGET_NODES


def cpu_controller_roots(mounts: str | None = None) -> list[tuple[Path, Literal[1, 2]]]:
    """Where the cpu controller can be used: cgroup v2 mounts whose root offers ``cpu``, then
    cgroup v1 hierarchies mounted with the ``cpu`` option (from ``/proc/mounts``)."""
    if mounts is None:
        try:
            mounts = Path("/proc/mounts").read_text()
        except OSError:
            return []
    v2: list[tuple[Path, Literal[1, 2]]] = []
    v1: list[tuple[Path, Literal[1, 2]]] = []
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        path, kind, options = Path(fields[1]), fields[2], fields[3].split(",")
        if kind == "cgroup2":
            with contextlib.suppress(OSError):
                if "cpu" in (path / "cgroup.controllers").read_text().split():
                    v2.append((path, 2))
        elif kind == "cgroup" and "cpu" in options:
            v1.append((path, 1))
    return v2 + v1


def cpu_limit_lines(cpus: float, version: Literal[1, 2]) -> dict[str, str]:
    """Control files and values giving ``cpus`` cores: v2 ``cpu.max`` = "quota period", v1
    ``cpu.cfs_period_us`` then ``cpu.cfs_quota_us`` (both in µs per ``CFS_PERIOD_US``)."""
    if not cpus > 0:
        raise ValueError(f"cpus({cpus}) must be > 0")
    quota = max(1000, round(cpus * CFS_PERIOD_US))
    if version == 2:
        return {"cpu.max": f"{quota} {CFS_PERIOD_US}"}
    return {"cpu.cfs_period_us": str(CFS_PERIOD_US), "cpu.cfs_quota_us": str(quota)}


@dataclass(frozen=True)
class CpuCgroup:
    """A cgroup limiting one lab node to a number of cores (CFS bandwidth control)."""

    path: Path
    """The node's cgroup directory."""
    version: Literal[1, 2]
    """cgroup v2 (``cpu.max``) or v1 (``cpu.cfs_quota_us``)."""
    cpus: float
    """Cores the node's processes may use together, per scheduler period."""

    @classmethod
    def create(cls, name: str, cpus: float) -> CpuCgroup:
        """Make ``<cpu root>/mds-bench-lab/<name>`` with the limit set, or raise LabError."""
        problems = []
        roots = cpu_controller_roots()
        for root, version in roots:
            parent = root / CPU_CGROUP_PARENT
            path = parent / name
            try:
                if version == 2:
                    _write_control(root / "cgroup.subtree_control", "+cpu")
                    parent.mkdir(exist_ok=True)
                    _write_control(parent / "cgroup.subtree_control", "+cpu")
                else:
                    parent.mkdir(exist_ok=True)
                path.mkdir()
                for control, value in cpu_limit_lines(cpus, version).items():
                    _write_control(path / control, value)
                return cls(path, version, cpus)
            except OSError as err:
                with contextlib.suppress(OSError):
                    path.rmdir()
                problems.append(f"{root}: {err.strerror or err}")
        raise LabError(
            "a CPU budget per node needs a writable cpu cgroup (root, and cgroup v2 with the cpu "
            "controller or cgroup v1's cpu hierarchy): "
            + ("; ".join(problems) or "no cpu controller mounted (see /proc/mounts)")
            + "; or run the lab without a budget (node_cpus=None, --node-cpus 0)"
        )

    def join(self, argv: Sequence[str]) -> list[str]:
        """argv that moves itself into this group, then runs ``argv`` (children inherit it).

        On cgroup v2 a process is in one group only: a memory cgroup the executor puts it in
        first (``--mem-limit``) is left by this move.
        """
        return ["sh", "-c", JOIN_CGROUP, str(self.path / "cgroup.procs"), *argv]

    def stat(self) -> dict[str, int]:
        """``cpu.stat`` counters (periods, throttled periods and time; v2 also usage)."""
        out: dict[str, int] = {}
        with contextlib.suppress(OSError):
            for line in (self.path / "cpu.stat").read_text().splitlines():
                key, _, value = line.partition(" ")
                if value.strip().isdigit():
                    out[key] = int(value)
        return out

    def describe(self) -> dict[str, Any]:
        """The group as run.json records it."""
        return {"cgroup": str(self.path), "cgroup_version": self.version, "cpu_stat": self.stat()}


def _write_control(path: Path, value: str) -> None:
    with open(path, "w") as handle:
        handle.write(value)


def _cgroup_pids(path: Path) -> list[int]:
    with contextlib.suppress(OSError):
        return [int(p) for p in (path / "cgroup.procs").read_text().split()]
    return []


def remove_cgroups(lab_id: str) -> list[str]:
    """Remove the CPU cgroups of lab ``lab_id`` (killing what is left in them); the problems."""
    problems = []
    for root, _ in cpu_controller_roots():
        for path in sorted((root / CPU_CGROUP_PARENT).glob(f"{PREFIX}{lab_id}-n*")):
            if not path.is_dir() or not _is_of_lab(path.name, lab_id):
                continue
            for pid in _cgroup_pids(path):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 5
            while True:
                try:
                    path.rmdir()
                    break
                except OSError as err:
                    if time.monotonic() > deadline:
                        problems.append(f"cgroup {path}: {err.strerror or err}")
                        break
                    time.sleep(0.05)
    return problems
