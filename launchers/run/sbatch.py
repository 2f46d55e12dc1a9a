"""The Slurm batch script of a run (``sbatch.sh``) and the allocation it asks for.

The script asks Slurm for the run's hosts (``--nodes``, ``--nodelist``: the hostfile's hosts,
since the hostfile fixes the world size and the master address), one task per slot
(``--ntasks-per-node``), one GPU per slot on CUDA (``--gpus-per-node``) and a time limit, writes
Slurm's output into the run directory, and runs the run's ``launch.sh``: the same environment as
every launcher (``launch.sh`` exports the run's variables; its ``deepspeed_env`` carries them
and the rendezvous address to every rank), then ``deepspeed --launcher slurm``, whose runner
starts the ranks with ``srun``. Partition and account have a place in the script, commented out;
``sbatch`` also reads them from ``SBATCH_PARTITION`` / ``SBATCH_ACCOUNT`` or ``-p`` / ``-A``.

The lab's Slurm cluster (``launchers.lab.slurm``) asks ``salloc`` for the same options.
"""

from __future__ import annotations

import math
import shlex
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from launchers.config.spec import RunSpec, SpecError

SBATCH_NAME = "sbatch.sh"
"""File name of the batch script inside a run directory."""

DEFAULT_TIME_S = 3600.0
"""Time limit asked for when none is given (``TIMEOUT`` / ``--timeout`` give one)."""

OUTPUT_PATTERN = "slurm-%j.log"
"""Slurm's output file of a batch job, in the run directory (``%j``: the job id)."""


def slurm_time(seconds: float) -> str:
    """A duration in Slurm's ``[D-]HH:MM:SS``, rounded up to whole minutes (Slurm's unit);
    ``math.inf`` is ``UNLIMITED`` (the partition's maximum)."""
    if not seconds > 0:
        raise ValueError(f"time limit {seconds!r} s must be > 0")
    if math.isinf(seconds):
        return "UNLIMITED"
    minutes = math.ceil(seconds / 60)
    days, rest = divmod(minutes, 24 * 60)
    text = f"{rest // 60:02d}:{rest % 60:02d}:00"
    return f"{days}-{text}" if days else text


@dataclass(frozen=True)
class Allocation:
    """What a run asks Slurm for (``sbatch``/``salloc`` options)."""

    job_name: str
    """``--job-name``."""
    nodes: tuple[str, ...]
    """``--nodelist`` (and ``--nodes``, their count): Slurm's names of the run's hosts."""
    tasks_per_node: int
    """``--ntasks-per-node``: the slots of each host (every host has the same number)."""
    gpus_per_node: int
    """``--gpus-per-node`` on CUDA; 0 on CPU (no GPU is asked for)."""
    time_limit: str
    """``--time``, ``[D-]HH:MM:SS``."""

    def options(self) -> list[str]:
        """The options, each one token (``--nodes=2``)."""
        opts = [
            f"--job-name={self.job_name}",
            f"--nodes={len(self.nodes)}",
            f"--ntasks-per-node={self.tasks_per_node}",
        ]
        if self.gpus_per_node:
            opts.append(f"--gpus-per-node={self.gpus_per_node}")
        return [*opts, f"--time={self.time_limit}", f"--nodelist={','.join(self.nodes)}"]


def allocation(
    spec: RunSpec,
    *,
    time_limit_s: float | None = None,
    job_name: str | None = None,
    nodes: Sequence[str] | None = None,
) -> Allocation:
    """The allocation a run needs; ``nodes`` names the hosts as Slurm does (default: as the
    hostfile does). Raises SpecError when the hosts have different slot counts (Slurm's
    ``--ntasks-per-node`` is one number for all)."""
    slots = set(spec.cluster.slots)
    if len(slots) != 1:
        raise SpecError(
            f"launcher slurm: hostfile {spec.cluster.hostfile} gives its hosts different slots "
            f"({', '.join(map(str, spec.cluster.slots))}), but --ntasks-per-node is one number: "
            "give every host the same slots"
        )
    names = tuple(nodes) if nodes is not None else tuple(h.name for h in spec.cluster.hosts)
    if len(names) != len(spec.cluster.hosts):
        raise ValueError(f"nodes {names} do not match the {len(spec.cluster.hosts)} hosts")
    per_node = slots.pop()
    return Allocation(
        job_name=job_name or spec.name,
        nodes=names,
        tasks_per_node=per_node,
        gpus_per_node=per_node if spec.device == "cuda" else 0,
        time_limit=slurm_time(time_limit_s if time_limit_s is not None else DEFAULT_TIME_S),
    )


def render_sbatch(
    spec: RunSpec,
    run_dir: str,
    *,
    time_limit_s: float | None = None,
    nodes: Sequence[str] | None = None,
    job_name: str | None = None,
) -> str:
    """The text of ``sbatch.sh`` for the run directory ``run_dir``."""
    alloc = allocation(spec, time_limit_s=time_limit_s, nodes=nodes, job_name=job_name)
    launch = f"{run_dir.rstrip('/')}/launch.sh"
    given = (
        f"default {DEFAULT_TIME_S / 60:.0f} min; TIMEOUT=<s> sets it"
        if time_limit_s is None
        else "as asked"
    )
    gpus = (
        f"{alloc.gpus_per_node} GPU(s) per node" if alloc.gpus_per_node else "no GPU (device cpu)"
    )
    lines = [
        "#!/usr/bin/env bash",
        f"# Slurm batch script of run {spec.name}; submit it with:",
        f"#   sbatch {run_dir.rstrip('/')}/{SBATCH_NAME}",
        f"# {len(alloc.nodes)} node(s) x {alloc.tasks_per_node} task(s), {gpus};",
        f"# time limit {alloc.time_limit} ({given}).",
        "# The nodes are the hostfile's hosts: the hostfile fixes the world size and the master",
        f"# address ({spec.master_addr}). Slurm writes the job's output to the run directory.",
        *(f"#SBATCH {opt}" for opt in alloc.options()),
        f"#SBATCH --output={run_dir.rstrip('/')}/{OUTPUT_PATTERN}",
        "# Partition and account: uncomment and edit these two lines, or set SBATCH_PARTITION /",
        "# SBATCH_ACCOUNT in the environment of sbatch, or pass -p / -A to sbatch.",
        "##SBATCH --partition=PARTITION",
        "##SBATCH --account=ACCOUNT",
        "set -euo pipefail",
        "# launch.sh exports the run's environment (deepspeed_env carries it and the rendezvous",
        "# address to every rank) and runs deepspeed --launcher slurm: srun starts the ranks.",
        f"exec bash {shlex.quote(launch)}",
    ]
    return "\n".join(lines) + "\n"


def check_inside_allocation(
    spec: RunSpec, env: Mapping[str, str], expand: Callable[[str], list[str]] | None = None
) -> None:
    """Raise SpecError unless ``env`` is inside a Slurm allocation holding the run's hosts.

    DeepSpeed's slurm runner calls ``srun``; outside an allocation srun would make its own,
    on nodes Slurm chooses, while the ranks meet at the hostfile's first host. ``expand`` turns
    ``SLURM_JOB_NODELIST`` into names (default: ``scontrol show hostnames``).
    """
    hosts = [h.name for h in spec.cluster.hosts]
    if not env.get("SLURM_JOB_ID"):
        opts = " ".join(allocation(spec).options()[1:])  # all but the job name
        raise SpecError(
            f"launcher slurm runs inside an allocation, and SLURM_JOB_ID is not set: submit the "
            f"run's {SBATCH_NAME} (DRY_RUN=1 shows it, `python -m launchers generate` writes it) "
            f"or run make inside `salloc {opts}`"
        )
    expand = expand or _scontrol_hostnames
    allocated = expand(env.get("SLURM_JOB_NODELIST", ""))
    missing = [h for h in hosts if h not in allocated]
    if missing:
        raise SpecError(
            f"launcher slurm: hostfile {spec.cluster.hostfile} names {', '.join(missing)}, not in "
            f"allocation {env['SLURM_JOB_ID']} ({', '.join(allocated) or 'no nodes'}): write the "
            "allocated nodes into the hostfile, or allocate the hostfile's hosts (--nodelist)"
        )


def _scontrol_hostnames(node_list: str) -> list[str]:
    if not node_list:
        return []
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", node_list], capture_output=True,
                             text=True, timeout=30, check=True).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError) as err:
        raise SpecError(f"scontrol show hostnames {node_list!r} failed: {err}") from None
    return out.split()
