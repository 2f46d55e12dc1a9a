"""Which launcher a lab runs through (pdsh over ssh, openmpi, slurm, or the same script per
node) and the tools each needs on this machine.
"""

from __future__ import annotations

import os
import shutil

from launchers.lab.net import INSTALL_HINT, SSHD, LabError


def check_prerequisites(ssh: bool) -> None:
    """Raise LabError naming what is missing to run a lab (root, ip, tc, sshd, ssh, pdsh)."""
    if os.geteuid() != 0:
        raise LabError("the lab needs root (network namespaces, veth, tc): run it with sudo")
    tools = ["ip", "tc"] + (["ssh", "ssh-keygen", "pdsh", "unshare"] if ssh else [])
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if ssh and not os.access(SSHD, os.X_OK):
        missing.append(SSHD)
    if missing:
        raise LabError(f"missing {', '.join(missing)}: {INSTALL_HINT}")


LAB_LAUNCHERS: dict[str, str] = {
    "pdsh": "DeepSpeed's pdsh runner over the lab's ssh (the default)",
    "no_ssh": "launch.sh NODE_RANK started inside each node's namespace",
    "openmpi": "DeepSpeed's openmpi runner: mpirun over the lab's ssh",
    "slurm": "DeepSpeed's slurm runner: srun inside a salloc allocation of the lab's Slurm cluster",
}
"""Launchers a lab serves, and how. Any other is refused: a lab never runs a request through a
launcher other than the one asked for."""

LAB_TRANSPORTS: dict[str, str] = {
    "pdsh": "ssh",
    "no_ssh": "netns-exec",
    "openmpi": "openmpi",
    "slurm": "slurm",
}
"""run.json's ``network.transport`` per lab launcher: how the ranks reached the nodes."""

LAUNCHER_TOOLS: dict[str, tuple[tuple[str, ...], str]] = {
    "pdsh": (("ssh", "ssh-keygen", "pdsh", SSHD), INSTALL_HINT),
    "no_ssh": ((), INSTALL_HINT),
    "openmpi": (("ssh", "ssh-keygen", SSHD, "pdsh", "mpirun", "ompi_info"),
                "apt-get install -y openmpi-bin openssh-server openssh-client pdsh"),
    "slurm": (("munged", "slurmctld", "slurmd", "sinfo", "squeue", "scontrol", "scancel",
               "salloc", "srun", "nsenter", "unshare"), "apt-get install -y slurm-wlm munge"),
}  # fmt: skip
"""Executables each lab launcher needs beyond ``ip`` and ``tc``, and the Debian packages."""


def lab_launcher(requested: str | None) -> str:
    """The launcher a lab runs a request with: the one asked for, or pdsh when none was.

    Raises LabError for a launcher the lab cannot serve (``local`` starts every rank on this
    machine outside the nodes), naming those it serves: never another one in its place.
    """
    if requested is None:
        return "pdsh"
    if requested not in LAB_LAUNCHERS:
        why = {
            "local": "it starts every rank on this machine, outside the lab's nodes and links"
        }.get(requested, "the lab does not know it")
        served = "; ".join(f"{name}: {how}" for name, how in LAB_LAUNCHERS.items())
        raise LabError(
            f"launcher {requested!r} cannot run on the lab: {why}. The lab serves {served}"
        )
    return requested


def missing_launcher_tools(launcher: str) -> list[str]:
    """Executables ``launcher`` needs in a lab that this machine lacks."""
    tools, _ = LAUNCHER_TOOLS[lab_launcher(launcher)]
    return [t for t in tools if not is_executable(t)]


def is_executable(tool: str) -> bool:
    """Whether ``tool`` (a name on PATH, or an absolute path) can be run."""
    return os.access(tool, os.X_OK) if "/" in tool else shutil.which(tool) is not None


def check_launcher(launcher: str) -> None:
    """Raise LabError saying what is missing for a lab run with ``launcher`` (root included)."""
    check_prerequisites(ssh=False)
    missing = missing_launcher_tools(launcher)
    if missing:
        hint = LAUNCHER_TOOLS[launcher][1]
        raise LabError(
            f"launcher {launcher} in the lab needs {', '.join(missing)}, missing here: {hint} "
            "(the lab does not fall back to another launcher)"
        )
