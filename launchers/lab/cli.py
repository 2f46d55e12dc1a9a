"""``python -m launchers.lab up|down|list|...``: the lab's command line."""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import signal
from collections.abc import Iterator, Sequence

from launchers.lab.cluster import Lab, existing_labs, remove_lab
from launchers.lab.cluster import __doc__ as lab_doc
from launchers.lab.net import (
    DEFAULT_BURST_MS,
    PREFIX,
    LinkShape,
    check_lab_id,
    lab_id_of,
    list_namespaces,
)
from launchers.lab.slurm import SlurmCluster

# ----------------------------------------------------------------------------- CLI


@contextlib.contextmanager
def _slurm(lab: Lab, args: argparse.Namespace) -> Iterator[None]:
    """``up --slurm``: the lab's Slurm cluster for as long as the lab is up."""
    if not args.slurm:
        yield
        return
    with SlurmCluster(lab):
        yield


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m launchers.lab up|down|list``."""
    parser = argparse.ArgumentParser(
        prog="python -m launchers.lab", description=(lab_doc or "").split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="create a lab and keep it until Ctrl-C / SIGTERM")
    up.add_argument("--nodes", type=int, default=2, help="number of nodes (default 2)")
    up.add_argument("--link", default="none", help="rate: 100mbit, 1gbit, none (default none)")
    up.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay per node, ms")
    up.add_argument("--loss-pct", type=float, default=0.0, help="packet loss per node, percent")
    up.add_argument("--burst-ms", type=float, default=DEFAULT_BURST_MS,
                    help=f"tbf bucket, ms at the rate (default {DEFAULT_BURST_MS:g})")  # fmt: skip
    up.add_argument("--node-cpus", type=float, default=None,
                    help="cores per node (default: cores / 4; 0: no budget)")  # fmt: skip
    up.add_argument("--name", default=None, help="lab id, 1-6 of a-z0-9 (default: random)")
    up.add_argument("--no_ssh", "--no-ssh", action="store_true", help="no sshd in the nodes")
    up.add_argument(
        "--slurm", action="store_true", help="also a Slurm cluster (slurmctld, a slurmd per node)"
    )
    down = sub.add_parser("down", help="remove a lab by name, or every lab of ours with --all")
    down.add_argument("name", nargs="?", help="lab name (mdsl<id>) or id")
    down.add_argument("--all", action="store_true", help="remove every leftover mdsl* lab")
    sub.add_parser("list", help="list labs present on this machine")
    args = parser.parse_args(argv)

    if args.command == "list":
        for lab_id in existing_labs():
            namespaces = [ns for ns in list_namespaces() if lab_id_of(ns) == lab_id]
            print(f"{PREFIX}{lab_id}\t{len(namespaces)} namespaces\t{' '.join(namespaces)}")
        return 0
    if args.command == "down":
        if args.all == bool(args.name):
            parser.error("down takes a lab name or --all (one of the two)")
        ids = existing_labs() if args.all else [lab_id_of(args.name) or args.name]
        status = 0
        for lab_id in ids:
            problems = remove_lab(check_lab_id(lab_id))
            print(f"{PREFIX}{lab_id}: " + ("removed" if not problems else "; ".join(problems)))
            status |= bool(problems)
        return status
    shape = LinkShape.parse(args.link, args.delay_ms, args.loss_pct, args.burst_ms)
    if args.node_cpus is not None and args.node_cpus < 0:
        parser.error(f"--node-cpus {args.node_cpus:g}: cores per node, > 0 (0: no budget)")
    cpus = "auto" if args.node_cpus is None else (args.node_cpus or None)
    with (
        Lab(args.nodes, shape, name=args.name, ssh=not args.no_ssh, node_cpus=cpus) as lab,
        _slurm(lab, args),
    ):
        hostfile = lab.write_hostfile()
        print(json.dumps(lab.describe(), indent=2))
        print(f"hostfile: {hostfile}")
        if lab.ssh:
            env = lab.launcher_env(base={})
            print(f"ssh: ssh -F {lab.ssh_config_path} {lab.master_addr}")
            print("launcher env: " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()))
        if args.slurm:
            conf = lab.state_dir / "slurm" / "slurm.conf"
            print(f"slurm: SLURM_CONF={conf} sinfo   (salloc, srun, sbatch, squeue, scancel)")
        print(f"remove: Ctrl-C, or 'python -m launchers.lab down {lab.id}'", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
    return 0
