"""Bringing a lab up for a session of runs: the emulated cluster with the launcher every run
uses (and, for the slurm launcher, the lab's Slurm cluster), always torn down after."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from launchers.lab.cluster import Lab
from launchers.lab.faults import Faults
from launchers.lab.net import LinkShape
from launchers.lab.session import LabSession
from launchers.lab.slurm import slurm_session
from launchers.lab.tools import LAB_LAUNCHERS, check_launcher, lab_launcher


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
    faults: Faults | None = None,
) -> Iterator[LabSession]:
    """Bring a lab up for a session and always tear it down (also on errors and signals).

    ``launcher`` (``launchers.lab.tools.LAB_LAUNCHERS``; default pdsh, or no_ssh when ``ssh`` is
    False) is the one every run uses; one the lab cannot serve, or whose tools are missing, is
    refused before anything starts. ``slurm`` brings up the lab's Slurm cluster, whose jobs get
    ``time_limit_s``. ``faults``: a slow node or link planted (``launchers.lab.faults``).
    """
    chosen = lab_launcher(launcher) if launcher is not None or ssh else "no_ssh"
    check_launcher(chosen)
    shape = LinkShape.parse(net, delay_ms, loss_pct)
    with Lab(
        nodes=nodes,
        shape=shape,
        ssh=chosen in ("pdsh", "openmpi"),
        node_cpus=node_cpus,  # type: ignore[arg-type]
        faults=faults,
    ) as lab:
        cpus = lab.describe_cpu()["cpus"]
        print(f"lab {lab.name}: {nodes} nodes x {slots} ranks, link {shape.label}, "
              f"{f'{cpus:g} cores' if cpus else 'no CPU budget'} per node, {chosen}: "
              f"{LAB_LAUNCHERS[chosen]}{f'; {lab.faults.label}' if lab.faults else ''}",
              flush=True)  # fmt: skip
        if chosen == "slurm":
            with slurm_session(lab, time_limit_s) as session:
                session.slots = slots
                yield session
        else:
            yield LabSession(lab=lab, ssh=lab.ssh, launcher=chosen, slots=slots)
