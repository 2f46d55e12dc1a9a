"""The lab's CPU budget: one cgroup per node capping its cores (cgroup v1 or v2), and the
cleanup of a lab's cgroups.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launchers.lab.net import PREFIX, LabError, is_of_lab
from launchers.run import cgroup
from launchers.run.cgroup import Version, cpu_controller_roots, cpu_limit_lines

# ----------------------------------------------------------------------------- CPU budget

CPU_CGROUP_PARENT = "mds-bench-lab"
"""Our directory under the cpu controller's root; one child per lab node (``mdsl<id>-n<i>``)."""

CPU_BUDGET_NODES = 4
"""Default budget: the machine's cores divided by this many nodes (0.5 core each on 2 cores),
the same whatever the lab's node count, so that a node of a 4-node lab computes as fast as one of
a 2-node lab, as separate machines would. Labs of more nodes than this oversubscribe the cores."""

PID_NAMESPACE = ["unshare", "--pid", "--mount-proc", "--kill-child"]
"""Each node's sshd runs as PID 1 of its own PID namespace (with its own /proc), as on a machine
of its own: DeepSpeed's pdsh runner stops a run with ``pdsh -w <nodes> pkill -f '<python> -u -m
deepspeed.launcher.launch'``, which in a shared PID namespace also kills every other lab's
launchers and the host's pdsh (their command lines match). ``--kill-child``: when ``unshare``
is stopped, its sshd (and so the whole namespace) goes too."""


def default_node_cpus() -> float:
    """Cores per node when none is asked: ``os.cpu_count() / CPU_BUDGET_NODES``."""
    return (os.cpu_count() or 1) / CPU_BUDGET_NODES


@dataclass(frozen=True)
class CpuCgroup:
    """A cgroup limiting one lab node to a number of cores (CFS bandwidth control)."""

    path: Path
    """The node's cgroup directory."""
    version: Version
    """cgroup v2 (``cpu.max``) or v1 (``cpu.cfs_quota_us``)."""
    cpus: float
    """Cores the node's processes may use together, per scheduler period."""

    @classmethod
    def create(cls, name: str, cpus: float) -> CpuCgroup:
        """Make ``<cpu root>/mds-bench-lab/<name>`` with the limit set, or raise LabError."""
        problems = []
        for root, version in cpu_controller_roots():
            limits = cpu_limit_lines(cpus, version)
            try:
                path = cgroup.create_group(root, version, CPU_CGROUP_PARENT, name, "cpu", limits)
                return cls(path, version, cpus)
            except OSError as err:
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
        return cgroup.join_argv(self.path, argv)

    def stat(self) -> dict[str, int]:
        """``cpu.stat`` counters (periods, throttled periods and time; v2 also usage)."""
        return cgroup.read_counters(self.path / "cpu.stat")

    def describe(self) -> dict[str, Any]:
        """The group as run.json records it."""
        return {"cgroup": str(self.path), "cgroup_version": self.version, "cpus": self.cpus,
                "cpu_stat": self.stat()}  # fmt: skip


def remove_cgroups(lab_id: str) -> list[str]:
    """Remove the CPU cgroups of lab ``lab_id`` (killing what is left in them); the problems."""
    problems = []
    for root, _ in cpu_controller_roots():
        for path in sorted((root / CPU_CGROUP_PARENT).glob(f"{PREFIX}{lab_id}-n*")):
            if not path.is_dir() or not is_of_lab(path.name, lab_id):
                continue
            _, error = cgroup.remove_group(path)
            if error is not None:
                problems.append(f"cgroup {path}: {error}")
    return problems
