"""cgroup control files, v1 and v2: where a controller is mounted, making a group with its limits
(memory for ``--mem-limit``, a CFS quota for a lab node's cores), moving a command into it, the
processes in it, and removing it. The one place that writes cgroup files.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

Version = Literal[1, 2]
"""cgroup v1 (one hierarchy per controller) or v2 (the unified hierarchy)."""

MEMORY_ROOTS = (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/memory"))
"""Where the memory controller is looked for: cgroup v2 (unified) first, then v1."""

CFS_PERIOD_US = 100_000
"""Scheduler period a CPU quota is given in (the kernel's default, 100 ms)."""

JOIN_CGROUP = 'echo $$ > "$0" && exec "$@"'
"""``sh -c`` script: move this shell into the cgroup whose ``cgroup.procs`` is ``$0``, then exec
the command (its pid, and every child it forks, stay in the group)."""


def write_control(path: Path, value: str) -> None:
    """Write one value into a cgroup control file (raises OSError as the kernel says)."""
    with open(path, "w") as handle:
        handle.write(value)


def create_group(
    root: Path,
    version: Version,
    parent: str,
    name: str,
    controller: str,
    limits: Mapping[str, str],
    optional: Mapping[str, str] | None = None,
) -> Path:
    """Make ``<root>/<parent>/<name>`` with ``controller`` enabled (v2: in ``root``'s and
    ``parent``'s ``cgroup.subtree_control``), write ``limits`` in order, then each ``optional``
    control the kernel offers there. On OSError the new group is removed and the error raised."""
    parent_dir = root / parent
    path = parent_dir / name
    try:
        if version == 2:
            write_control(root / "cgroup.subtree_control", f"+{controller}")
            parent_dir.mkdir(exist_ok=True)
            write_control(parent_dir / "cgroup.subtree_control", f"+{controller}")
        else:
            parent_dir.mkdir(exist_ok=True)
        path.mkdir()
        for control, value in limits.items():
            write_control(path / control, value)
        for control, value in (optional or {}).items():
            if (path / control).exists():
                write_control(path / control, value)
        return path
    except OSError:
        with contextlib.suppress(OSError):
            path.rmdir()
        raise


def join_argv(path: Path, argv: Sequence[str]) -> list[str]:
    """argv that moves itself into the group at ``path``, then runs ``argv`` (children inherit
    it). On cgroup v2 a process is in one group only: joining one leaves the group it was in."""
    return ["sh", "-c", JOIN_CGROUP, str(path / "cgroup.procs"), *argv]


def group_pids(path: Path) -> list[int]:
    """Processes in the group at ``path`` (none when it cannot be read)."""
    with contextlib.suppress(OSError):
        return [int(p) for p in (path / "cgroup.procs").read_text().split()]
    return []


def remove_group(path: Path, timeout_s: float = 5.0) -> tuple[list[int], str | None]:
    """SIGKILL whatever is left in the group, then remove it, trying for ``timeout_s``.

    Returns the pids it had to kill and, when the group stayed, why (None when removed).
    """
    left = group_pids(path)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    while group_pids(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    while True:
        try:
            path.rmdir()
            return left, None
        except OSError as err:
            if time.monotonic() > deadline:
                return left, str(err.strerror or err)
            time.sleep(0.05)


def read_counters(path: Path) -> dict[str, int]:
    """``key value`` lines of a cgroup statistics file (``cpu.stat``, ``memory.events``) with
    integer values; empty when it cannot be read."""
    out: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if value.strip().isdigit():
                out[key] = int(value)
    return out


# --- CPU ------------------------------------------------------------------------------------


def cpu_controller_roots(mounts: str | None = None) -> list[tuple[Path, Version]]:
    """Where the cpu controller can be used: cgroup v2 mounts whose root offers ``cpu``, then
    cgroup v1 hierarchies mounted with the ``cpu`` option (from ``/proc/mounts``)."""
    if mounts is None:
        try:
            mounts = Path("/proc/mounts").read_text()
        except OSError:
            return []
    v2: list[tuple[Path, Version]] = []
    v1: list[tuple[Path, Version]] = []
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


def cpu_limit_lines(cpus: float, version: Version) -> dict[str, str]:
    """Control files and values giving ``cpus`` cores: v2 ``cpu.max`` = "quota period", v1
    ``cpu.cfs_period_us`` then ``cpu.cfs_quota_us`` (both in µs per ``CFS_PERIOD_US``)."""
    if not cpus > 0:
        raise ValueError(f"cpus({cpus}) must be > 0")
    quota = max(1000, round(cpus * CFS_PERIOD_US))
    if version == 2:
        return {"cpu.max": f"{quota} {CFS_PERIOD_US}"}
    return {"cpu.cfs_period_us": str(CFS_PERIOD_US), "cpu.cfs_quota_us": str(quota)}


# --- memory ---------------------------------------------------------------------------------


def memory_limit_lines(limit_bytes: int, version: Version) -> tuple[dict[str, str], dict[str, str]]:
    """(limits, optional limits) giving ``limit_bytes`` of memory, swap included where the
    controller accounts it: v2 ``memory.max`` (and ``memory.swap.max`` 0), v1
    ``memory.limit_in_bytes`` (and ``memory.memsw.limit_in_bytes``)."""
    if version == 2:
        return {"memory.max": str(limit_bytes)}, {"memory.swap.max": "0"}
    return (
        {"memory.limit_in_bytes": str(limit_bytes)},
        {"memory.memsw.limit_in_bytes": str(limit_bytes)},
    )
