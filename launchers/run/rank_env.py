"""Start a training script as one rank of a job that ``srun`` or ``mpirun`` launched.

DeepSpeed's ``slurm`` and ``openmpi`` runners start ``python -u <script> <args>`` once per rank
through ``srun -n N`` or ``mpirun -n N``, with no ``deepspeed.launcher.launch`` in between, so
nothing sets the variables ``torch.distributed``'s ``env://`` rendezvous reads. Upstream's
``megatron/arguments.py`` reads ``RANK`` and ``WORLD_SIZE`` while parsing its arguments, before
DeepSpeed's MPI discovery could run (and that discovery needs ``mpi4py``): without them every
rank believes it is alone (world size 1, pipeline and tensor degrees clamped to 1).

The launchers name the script as ``python -u launchers/run/rank_env.py <script> <args>``; this
module sets ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` from what the launcher gives each task
(Open MPI's ``OMPI_COMM_WORLD_*``, else Slurm's ``SLURM_PROCID``/``SLURM_NTASKS``/
``SLURM_LOCALID``), checks that ``MASTER_ADDR`` and ``MASTER_PORT`` arrived (the run's
``deepspeed_env``), and replaces itself with ``python -u <script> <args>`` (same process, so
``srun``/``mpirun`` keep tracking it). Variables already set are left as they are.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

RANK_SOURCES: dict[str, tuple[str, str, str]] = {
    "openmpi": ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
    "slurm": ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
}
"""Per launcher, the variables holding (global rank, number of ranks, rank on this node); tried
in this order (``mpirun`` inside a Slurm allocation sets both: the innermost launcher wins)."""

RENDEZVOUS = ("MASTER_ADDR", "MASTER_PORT")
"""Variables the run's environment file must carry to every rank."""


class RankEnvError(RuntimeError):
    """The process was not started by a launcher this module knows, or misses the rendezvous."""


def rank_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The variables to add to ``env`` so that the process can join the rendezvous.

    Empty when ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` are all set already (started by
    DeepSpeed's own per-node launcher, or by hand).
    """
    wanted = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
    missing_rendezvous = [key for key in RENDEZVOUS if not env.get(key)]
    if missing_rendezvous:
        raise RankEnvError(
            f"{', '.join(missing_rendezvous)} not set: the run's deepspeed_env file (DS_ENV_FILE) "
            "must carry MASTER_ADDR and MASTER_PORT to every rank"
        )
    if all(env.get(key) for key in wanted):
        return {}
    for launcher, names in RANK_SOURCES.items():
        if all(env.get(name) for name in names):
            values = [env[name] for name in names]
            if not all(value.isdigit() for value in values):
                raise RankEnvError(f"{launcher}: {dict(zip(names, values, strict=True))} are not "
                                   "non-negative integers")  # fmt: skip
            rank, size, local = (int(v) for v in values)
            if not 0 <= rank < size or local > rank:
                raise RankEnvError(f"{launcher}: rank {rank}, local rank {local} and size {size} "
                                   "are inconsistent")  # fmt: skip
            found = dict(zip(wanted, (str(rank), str(size), str(local)), strict=True))
            return {key: value for key, value in found.items() if not env.get(key)}
    sources = "; ".join(f"{k}: {', '.join(v)}" for k, v in RANK_SOURCES.items())
    raise RankEnvError(
        f"no rank in the environment: start this through srun or mpirun (they set {sources}), "
        "or set RANK, WORLD_SIZE and LOCAL_RANK"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -u rank_env.py SCRIPT [ARGS...]``: set the rank variables, exec the script."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0].startswith("-"):
        print("usage: python -u rank_env.py SCRIPT [ARGS...]", file=sys.stderr)
        return 2
    try:
        extra = rank_environment(os.environ)
    except RankEnvError as err:
        print(f"rank_env: {err}", file=sys.stderr, flush=True)
        return 2
    os.environ.update(extra)
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, "-u", *args])
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
