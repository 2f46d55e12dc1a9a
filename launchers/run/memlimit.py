"""A memory limit for a run's processes on this machine (``--mem-limit``): a memory cgroup
(v2, or v1's memory hierarchy) each rank joins, so that a rank killed at the limit is recorded as
``oom``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

from analysis.theory import formulas
from launchers.run import cgroup
from launchers.run.cgroup import MEMORY_ROOTS, Version

CGROUP_PARENT = "mds-bench"
"""Our directory under the memory controller's root; one child per run."""


class LimitError(RuntimeError):
    """A resource limit that cannot be applied on this machine; says why and what to do."""


def parse_size(text: str) -> int:
    """``2G``, ``512M``, ``1.5GiB``, ``1073741824`` -> bytes (binary units)."""
    try:
        size = formulas.parse_size(text)
    except ValueError:
        message = f"memory size {text!r}: write e.g. 2G, 512M or a number of bytes"
        raise ValueError(message) from None
    if size < 1 << 20:
        raise ValueError(f"memory size {text!r} is below 1 MiB: no run starts in that")
    return size


def format_size(size: int) -> str:
    """Bytes in the largest binary unit that divides them to one decimal, e.g. ``2.0GiB``."""
    for unit, factor in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= factor:
            return f"{size / factor:.1f}{unit}"
    return f"{size}B"


@dataclass
class MemoryCgroup:
    """A memory cgroup holding every process a run starts on this machine.

    The kernel OOM-kills a process of the group when the group's memory exceeds the limit
    (swap included where the controller accounts it); the group's ``oom_kill`` counter then
    says so, which no log line does (the launcher only sees a rank die of SIGKILL).
    """

    path: Path
    """The run's cgroup directory."""
    version: Version
    """cgroup v2 (``memory.max``, ``memory.events``) or v1 (``memory.limit_in_bytes``,
    ``memory.oom_control``)."""
    limit_bytes: int
    """The memory limit, bytes."""

    @classmethod
    def create(cls, limit_bytes: int, name: str) -> MemoryCgroup:
        """Make ``<root>/mds-bench/<name>`` with the limit set, or raise :class:`LimitError`."""
        problems = []
        for root in MEMORY_ROOTS:
            v2 = (root / "cgroup.controllers").exists()
            v1 = (root / "memory.limit_in_bytes").exists()
            if v2 and "memory" not in (root / "cgroup.controllers").read_text().split():
                problems.append(f"{root}: cgroup v2 without the memory controller")
                continue
            if not (v1 or v2):
                problems.append(f"{root}: no memory controller")
                continue
            version: Version = 2 if v2 else 1
            limits, optional = cgroup.memory_limit_lines(limit_bytes, version)
            try:
                path = cgroup.create_group(
                    root, version, CGROUP_PARENT, name, "memory", limits, optional
                )
                return cls(path, version, limit_bytes)
            except OSError as exc:
                problems.append(f"{root}: {exc.strerror or exc}")
        raise LimitError(
            "--mem-limit needs a writable memory cgroup (root, and cgroup v2 with the memory "
            "controller or cgroup v1's memory hierarchy): " + "; ".join(problems)
        )

    def wrap(self, argv: list[str]) -> list[str]:
        """argv that moves itself into the group, then runs ``argv`` (children inherit it)."""
        return cgroup.join_argv(self.path, argv)

    def _counter(self, wanted: str) -> int | None:
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        return cgroup.read_counters(self.path / name).get(wanted)

    def oom_kills(self) -> int:
        """Processes the kernel OOM-killed in this group so far (by any OOM killer)."""
        return self._counter("oom_kill") or 0

    def limit_reached(self) -> bool | None:
        """Whether the group's memory ever reached its limit (cgroup v2 ``oom`` event); None
        where the controller does not say (v1). A kill without it came from the machine running
        out of memory, not from the limit."""
        return None if self.version != 2 else bool(self._counter("oom"))

    def current_limit(self) -> int:
        """The group's limit as the kernel holds it now (``memory.max`` or v1's
        ``memory.limit_in_bytes``): someone may have changed it while the run ran; the
        configured ``limit_bytes`` when it cannot be read."""
        name = "memory.max" if self.version == 2 else "memory.limit_in_bytes"
        with contextlib.suppress(OSError, ValueError):
            return int((self.path / name).read_text().strip())
        return self.limit_bytes

    def pids(self) -> list[int]:
        """Processes still in the group."""
        return cgroup.group_pids(self.path)

    def remove(self) -> list[int]:
        """SIGKILL whatever is left in the group, remove it; returns the pids it had to kill."""
        return cgroup.remove_group(self.path)[0]
