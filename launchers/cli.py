"""``python -m launchers list|generate|run|matrix|sweep|doctor|demo``.

Every request is resolved and validated before anything starts; a SpecError, HostfileError or
PresetError (or a missing upstream checkout or dataset) prints one message and exits with 2.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from launchers.config.hostfile import (
    HOSTFILE_DIR,
    HostfileError,
    lab_directive,
    load_hostfile,
    parse_hostfile_text,
)
from launchers.config.presets import (
    CORE_STRATEGIES,
    PresetError,
    detect_device,
    expand_strategies,
    load_models,
    load_strategies,
    parse_overrides,
    resolve_spec,
)
from launchers.config.project import DS_CONFIG_NAME
from launchers.config.spec import (
    DEVICES,
    LAUNCHER_MODES,
    TIMING_LOG_OPTIONS,
    Cluster,
    RunSpec,
    SpecError,
    spec_hash,
    steady_profile_steps,
)
from launchers.config.upstream import check_upstream
from launchers.doctor import check as doctor
from launchers.doctor.transport import DoctorError
from launchers.lab.bringup import lab_session
from launchers.lab.faults import lab_faults
from launchers.lab.net import LabError
from launchers.lab.session import LabSession, lab_available
from launchers.lab.slurm import KILL_WAIT_S
from launchers.lab.tools import lab_launcher
from launchers.run.matrix import failed, interleaved, run_specs
from launchers.run.memlimit import LimitError, MemoryCgroup, parse_size
from launchers.run.render import (
    LAUNCH_NAME,
    node_commands,
    planned_run_dir,
    render_files,
    render_run_dir,
)
from launchers.run.sbatch import SBATCH_NAME, check_inside_allocation, render_sbatch
from launchers.sweep import command as sweep_command
from launchers.sweep.space import SweepError

EXIT_USAGE = 2
"""Exit status for a request that cannot run (nothing was started)."""


class PreflightError(RuntimeError):
    """Upstream, data or executables missing; says what to run."""


def human_count(n: int) -> str:
    """875264 -> '875.3K', 63847424 -> '63.8M'."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def preflight(spec: RunSpec, allow_other_upstream: bool = False) -> list[str]:
    """Check that what the run needs is on this machine; return warnings, raise when missing.

    An upstream checkout at another commit than the pinned one is refused (its flags and log
    lines may differ from what the launchers and the parser expect) unless
    ``allow_other_upstream``; then it is a warning, and run.json records the commit.
    """
    status = check_upstream(Path(spec.paths.upstream_dir))
    if not status.present:
        raise PreflightError(status.message())
    if not status.ok and not allow_other_upstream:
        raise PreflightError(
            status.message() + " (or pass --allow-other-upstream to run it anyway; run.json "
            "records its commit)"
        )
    warnings = [status.message()] if not status.ok else []
    p = spec.paths
    needed = {
        "vocab_file": p.vocab_file,
        "merge_file": p.merge_file,
        "data_path (.bin)": p.data_path + ".bin",
        "data_path (.idx)": p.data_path + ".idx",
        "deepspeed": p.deepspeed,
    }
    missing = [f"{key} {path}" for key, path in needed.items() if not Path(path).is_file()]
    if missing:
        raise PreflightError(
            "missing: " + "; ".join(missing) + ". Run `make setup` (it builds the tiny dataset), "
            "or point DATA_PATH/VOCAB_FILE/MERGE_FILE (or --set data_path=...) at your data"
        )
    return warnings


# ---------------------------------------------------------------------------------------------
# list


def cmd_list(_: argparse.Namespace) -> int:
    """Models with computed parameter counts, strategies, hostfiles."""
    console = Console()
    models = Table(title="Models (megatron_configs/*.yaml)")
    for col in ("model", "layers", "hidden", "heads", "seq", "micro/global", "precision",
                "iters", "params"):  # fmt: skip
        models.add_column(col, justify="left" if col == "model" else "right", overflow="fold")
    presets = sorted(load_models().items(), key=lambda kv: kv[1].model.num_parameters())
    for name, preset in presets:
        m, t = preset.model, preset.training
        models.add_row(
            name, str(m.num_layers), str(m.hidden_size), str(m.num_attention_heads),
            str(m.seq_length), f"{m.micro_batch_size}/{m.global_batch_size}", m.precision,
            str(t.train_iters), human_count(m.num_parameters()),
        )  # fmt: skip
    console.print(models)
    console.print(
        "params = l(4h^2 + 2fh + f + 9h) + V h + s h + 2h, f = ffn_hidden_size (4h unless set),"
        " V padded to a multiple of 128 (TP=1)",
        style="dim",
    )
    strategies = Table(title="Strategies (megatron_configs/strategies.yaml); dp = world/(tp*pp)")
    for col in ("strategy", "tp", "pp", "zero", "offload", "core", "description"):
        strategies.add_column(col)
    for name, s in load_strategies().items():
        strategies.add_row(
            name, str(s.tp), str(s.pp), str(s.zero_stage), s.offload,
            "yes" if name in CORE_STRATEGIES else "", s.description,
        )  # fmt: skip
    console.print(strategies)
    hosts = Table(title=f"Hostfiles ({HOSTFILE_DIR.name}/)")
    for col in ("hostfile", "hosts", "world size"):
        hosts.add_column(col)
    for path in sorted(p for p in HOSTFILE_DIR.iterdir() if p.is_file()):
        if (lab := lab_directive(path)) is not None:
            hosts.add_row(
                f"{HOSTFILE_DIR.name}/{path.name}",
                f"emulated lab: {lab[0]} nodes, link {lab[1]} (addresses assigned per lab)",
                str(lab[0]),
            )
            continue
        try:
            cluster = load_hostfile(path)
            hosts.add_row(
                f"{HOSTFILE_DIR.name}/{path.name}",
                ", ".join(f"{h.name} slots={h.slots}" for h in cluster.hosts),
                str(cluster.world_size),
            )
        except HostfileError as exc:
            hosts.add_row(f"{HOSTFILE_DIR.name}/{path.name}", f"invalid: {exc}", "")
    console.print(hosts)
    return 0


# ---------------------------------------------------------------------------------------------
# generate / run / matrix


@dataclass(frozen=True)
class Request:
    """What the command line asked for, before resolution."""

    cluster: Cluster
    """Hosts from ``--hosts`` (or the lab's)."""
    overrides: dict[str, Any]
    """Typed ``--set`` values."""
    device: str | None
    """``--device`` or None (detected)."""
    launcher: str | None
    """``--launcher`` or None (from the hostfile)."""
    logs: Path
    """``--logs`` root."""
    profile: bool = False
    """``--profile``: record steady-state iterations with upstream's PyTorch profiler."""
    timers: str = "minmax"
    """``--timers``: Megatron's ``--timing-log-option`` (``all``: every rank's timers)."""


def _request(args: argparse.Namespace) -> Request:
    return Request(
        cluster=load_hostfile(args.hosts),
        overrides=parse_overrides(args.set),
        device=args.device,
        launcher=args.launcher,
        logs=Path(args.logs),
        profile=args.profile,
        timers=args.timers,
    )


def _resolve(req: Request, model: str, strategy: str) -> RunSpec:
    spec = resolve_spec(
        model,
        strategy,
        req.cluster,
        req.overrides,
        device=req.device,  # type: ignore[arg-type]
        launcher=req.launcher,  # type: ignore[arg-type]
    )
    if req.timers != spec.timing_log_option:
        spec = replace(spec, timing_log_option=req.timers)
    if req.timers == "all":  # every rank's times: the schedule's compute timers too
        spec = replace(spec, schedule_timers=True)
    if req.profile:
        return replace(spec, profile_steps=steady_profile_steps(spec.training))
    return spec


def print_dry_run(
    spec: RunSpec,
    logs: Path,
    out: Callable[[str], None] = print,
    time_limit_s: float | None = None,
    slurm_nodes: Sequence[str] | None = None,
) -> None:
    """The exact files a run would get (and its ``sbatch.sh`` with Slurm, whose nodes are
    ``slurm_nodes`` when Slurm names the hosts otherwise than the hostfile); writes nothing."""
    run_dir = str(planned_run_dir(spec, logs, datetime.now(timezone.utc)))
    files = render_files(spec, run_dir)
    if spec.launcher == "slurm":
        files[SBATCH_NAME] = render_sbatch(spec, run_dir, time_limit_s=time_limit_s,
                                           nodes=slurm_nodes)  # fmt: skip
    out(f"# dry run: {spec.name} (spec {spec_hash(spec)}); nothing written, nothing started")
    out(f"# run directory would be {run_dir}")
    for name in (LAUNCH_NAME, DS_CONFIG_NAME, SBATCH_NAME):
        if name in files:
            out(f"# ==> {name} <==")
            out(files[name].rstrip("\n"))
    if spec.launcher == "no_ssh":
        out("# ==> per-node commands <==")
        for host, line in node_commands(spec, run_dir):
            out(f"# on {host}: {line}")


@contextlib.contextmanager
def _lab_session(args: argparse.Namespace) -> Iterator[LabSession | None]:
    """With ``--net``: an emulated cluster, reached through pdsh over ssh unless ``no_ssh``."""
    if not args.net or args.dry_run:
        yield None
        return
    with lab_session(
        args.lab_nodes,
        args.net,
        args.delay_ms or 0.0,
        args.loss_pct or 0.0,
        launcher=lab_launcher(args.launcher),
        time_limit_s=args.timeout,
        slots=args.lab_slots,
        node_cpus="auto" if args.node_cpus is None else (args.node_cpus or None),
        faults=getattr(args, "faults", None),
    ) as session:
        yield session


def _slurm_dry_run(args: argparse.Namespace) -> dict[str, Any]:
    """How a dry run's ``sbatch.sh`` looks: as the lab's jobs (its node names, no time limit
    unless TIMEOUT) with ``--net``, else as on a cluster (TIMEOUT or the default)."""
    if not args.net:
        return {"time_limit_s": args.timeout}
    nodes = [f"node{i}" for i in range(args.lab_nodes)]
    return {"time_limit_s": args.timeout or math.inf, "slurm_nodes": nodes}


def _executor_timeout(args: argparse.Namespace) -> float | None:
    """The executor's bound of a run: TIMEOUT, and later than Slurm's own when Slurm enforces
    it (the lab's jobs get TIMEOUT as their time limit; the executor stays a backstop)."""
    if args.timeout is None or not (args.net and args.launcher == "slurm"):
        return args.timeout
    return args.timeout + 60 + 2 * KILL_WAIT_S  # Slurm's minute rounding and its kill wait


def _dry_run_cluster(args: argparse.Namespace) -> Cluster:
    """For ``--net --dry-run``: the lab's hostfile shape with placeholder addresses."""
    lines = [f"10.200.0.{i + 1} slots={args.lab_slots}" for i in range(args.lab_nodes)]
    text = "# emulated lab: addresses are assigned when the lab starts\n" + "\n".join(lines)
    return parse_hostfile_text(text + "\n", "lab (dry run)")


def _mem_limit(args: argparse.Namespace, specs: Sequence[RunSpec]) -> int | None:
    """``--mem-limit`` in bytes, checked before anything starts (None when not given).

    The limit holds the processes the executor starts on this machine: ``local`` runs, and
    ``no_ssh`` nodes (each node's launcher). Ranks that pdsh, mpirun or srun start elsewhere
    are not under it, so those launchers are refused rather than silently unlimited.
    """
    if args.mem_limit is None:
        return None
    try:
        size = parse_size(args.mem_limit)
    except ValueError as exc:
        raise PreflightError(f"--mem-limit: {exc}") from None
    launchers = {lab_launcher(args.launcher) if args.net else s.launcher for s in specs}
    remote = sorted(launchers - {"local", "no_ssh"})
    if remote:
        raise PreflightError(
            f"--mem-limit applies to processes started on this machine; launcher "
            f"{', '.join(remote)} starts the ranks elsewhere: use --launcher no_ssh (each node's "
            "launcher is then started here) or a local run, or drop --mem-limit"
        )
    probe = MemoryCgroup.create(size, f"probe-{os.getpid()}")  # LimitError says why not
    probe.remove()
    return size


def _apply_lab_hostfile(args: argparse.Namespace) -> None:
    """``HOSTS=hostfiles/lab-2node``: run on an emulated lab; ``NET`` still sets the link."""
    lab = lab_directive(args.hosts) if getattr(args, "hosts", None) else None
    if lab is None:
        return
    args.lab_nodes = lab[0] if args.lab_nodes == 2 else args.lab_nodes
    args.net = args.net or lab[1]
    args.hosts = str(HOSTFILE_DIR / "localhost")  # placeholder until the lab writes its own


def _run_many(args: argparse.Namespace, strategies: Sequence[str]) -> int:
    """Resolve every run first (all errors before anything starts), then run them in turn."""
    _apply_lab_hostfile(args)
    args.faults = lab_faults(getattr(args, "slow_node", None), getattr(args, "slow_link", None),
                             args.net, args.lab_nodes, args.node_cpus)  # fmt: skip
    req = _request(args)
    if args.net:  # the launcher asked for, or a refusal that says why (never another one),
        # resolved as the lab will run them, before the lab starts
        launcher = lab_launcher(args.launcher)
        req = replace(req, cluster=_dry_run_cluster(args), launcher=launcher)
        specs = [replace(_resolve(req, args.model, s), ssh_check=launcher == "no_ssh",
                         network=f"emulated {args.lab_nodes} nodes x {args.net}"
                         + (f", {args.faults.label}" if args.faults else ""))
                 for s in strategies]  # fmt: skip
    else:
        specs = [_resolve(req, args.model, s) for s in strategies]
    if args.dry_run:
        for spec in specs:
            print_dry_run(spec, req.logs, **_slurm_dry_run(args))
        if args.repeat > 1:
            order = [f"{k}:{s.strategy.name}" for k, s in interleaved(specs, args.repeat)]
            print(f"# {args.repeat} interleaved rounds, in this order: {' '.join(order)}")
        return 0
    for warning in preflight(specs[0], args.allow_other_upstream):
        print(f"warning: {warning}", file=sys.stderr)
    if not args.net and specs[0].launcher == "slurm":
        check_inside_allocation(specs[0], os.environ)
    mem_limit = _mem_limit(args, specs)
    gate = _doctor_gate(args, strategies)
    if not args.net:
        gate(specs, req.logs, None)
    with _lab_session(args) as session:
        if session is not None:
            cluster = session.cluster()
            req = replace(req, cluster=cluster)
            specs = [_resolve(req, args.model, s) for s in strategies]
            gate([session.adapt(s) for s in specs], req.logs, session)
            if not args.no_netbench:
                session.measure_bandwidth(req.logs, quick=getattr(args, "quick_netbench", False))
        try:
            rows = run_specs(specs, req.logs, force=args.force, stall_s=args.stall,
                             timeout_s=_executor_timeout(args), session=session,
                             mem_limit_bytes=mem_limit, rounds=args.repeat,
                             deadline=getattr(args, "deadline", None))  # fmt: skip
        except KeyboardInterrupt:
            return 130
    bad = failed(rows)
    if bad:
        print(f"not completed: {', '.join(r.name for r in bad)}", file=sys.stderr)
        return 1
    return 0


def _doctor_gate(args: argparse.Namespace, strategies: Sequence[str]) -> Callable[..., Any]:
    """``doctor.check.check_before_run`` for a multi-node run or a matrix, unless skipped."""

    def gate(specs: Sequence[RunSpec], logs: Path, session: LabSession | None) -> None:
        matrix = args.command in ("matrix", "demo") or len(strategies) > 1
        if not args.skip_doctor and (session is not None or doctor.needs_doctor(specs, matrix)):
            doctor.check_before_run(specs, logs, session,
                                    check_links=getattr(args, "doctor_links", False))  # fmt: skip

    return gate


def cmd_generate(args: argparse.Namespace) -> int:
    """Write one run directory (or show it with --dry-run) and print its path."""
    req = _request(args)
    spec = _resolve(req, args.model, args.strategy)
    if args.dry_run:
        print_dry_run(spec, req.logs)
        return 0
    for warning in preflight(spec, allow_other_upstream=True):
        print(f"warning: {warning}", file=sys.stderr)
    run_dir = render_run_dir(spec, req.logs)
    if spec.launcher == "slurm":  # a batch script to submit: `sbatch <run dir>/sbatch.sh`
        (run_dir / SBATCH_NAME).write_text(render_sbatch(spec, str(run_dir)), encoding="utf-8")
    print(run_dir)
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """generate + execute."""
    return _run_many(args, [args.strategy])


def cmd_matrix(args: argparse.Namespace) -> int:
    """Several strategies of one model, in sequence."""
    return _run_many(args, expand_strategies(args.strategies))


def cmd_sweep(args: argparse.Namespace) -> int:
    """TP x PP x DP, ZeRO, micro-batch (and recompute on GPU) searched: ``launchers.sweep``."""
    _apply_lab_hostfile(args)
    req = _request(args)
    launcher = lab_launcher(args.launcher) if args.net else req.launcher
    if args.net:
        req = replace(req, cluster=_dry_run_cluster(args), launcher=launcher)

    def resolve(strategy: Any, overrides: Any, cluster: Cluster) -> RunSpec:
        spec = _resolve(replace(req, cluster=cluster, overrides=dict(overrides)), args.model,
                        strategy)  # fmt: skip
        if args.net:
            return replace(spec, ssh_check=launcher == "no_ssh",
                           network=f"emulated {args.lab_nodes} nodes x {args.net}")  # fmt: skip
        return spec

    gate = _doctor_gate(args, ["sweep"])
    hooks = sweep_command.Hooks(resolve, preflight, _lab_session, gate, _executor_timeout(args),
                                lambda specs: _mem_limit(args, specs))  # fmt: skip
    device = req.device or detect_device()
    return sweep_command.run(args, req.cluster, req.overrides, device, hooks)


DEMO_ROUNDS = 2
"""Interleaved rounds ``make demo`` runs when its time budget allows: two give the report
between-run intervals (pooled over the six strategies, 5 degrees of freedom)."""

DEMO_BUDGET_MIN = 10.0
"""Minutes ``make demo`` may take; a round that would not fit is not started."""

REPORT_RESERVE_S = 20.0
"""Seconds kept for the report at the end of the demo's budget (it takes ~10 s)."""

DEMO_OVERRIDES = ("train_iters=8", "log_interval=1")
"""The demo's runs: 8 iterations, each logged (8 windows: the first is warm-up, 7 feed the
steady state), so that two rounds of the six strategies fit the budget on 2 cores: a run's
start-up and teardown (imports, launchers, data index: ~30 s there) cost more than its
iterations, and at 100 Mbit/s a ZeRO-2/3 iteration of the tiny model takes ~1.8 s.
``--set`` values win."""


def cmd_demo(args: argparse.Namespace) -> int:
    """tiny x the core strategies on an emulated 2-node cluster (or 2 local ranks), then report.

    Up to ``--repeat`` interleaved rounds (default ``DEMO_ROUNDS``): round 2 onwards only when
    the rounds so far say it ends within ``--budget-min``.
    """
    args.deadline = time.monotonic() + args.budget_min * 60 - REPORT_RESERVE_S
    args.model, args.strategies = "tiny", "core"
    args.set = [*DEMO_OVERRIDES, *(args.set or [])]
    args.quick_netbench = True
    if args.node_cpus is None:  # the demo's nodes share the whole machine
        args.node_cpus = (os.cpu_count() or 1) / args.lab_nodes
    if args.net and args.net != "none" and not args.dry_run:
        ok, why = lab_available(ssh=args.launcher != "no_ssh")
        if not ok:
            print(f"demo: no emulated cluster on this machine ({why}); running 2 local ranks "
                  "without network shaping instead", flush=True)  # fmt: skip
            args.net = None
    elif args.net == "none":
        args.net = None
    status = cmd_matrix(args)
    if args.dry_run:
        return status
    # The report brings pandas and matplotlib (~1 s): imported only when the demo reports.
    from analysis.report.build import main as report_main

    out = Path(args.logs) / "report"
    print()
    report_status = report_main([str(args.logs), "--out", str(out), "--summary"])
    return status or report_status


# ---------------------------------------------------------------------------------------------
# argument parsing


MAX_ROUNDS = 100
"""Largest ``--repeat``: a guard against a typo starting days of runs."""


def _rounds(text: str) -> int:
    """``--repeat`` value: an integer in 1..MAX_ROUNDS."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--repeat {text!r}: not an integer") from None
    if not 1 <= n <= MAX_ROUNDS:
        raise argparse.ArgumentTypeError(f"--repeat {n}: must be 1..{MAX_ROUNDS}")
    return n


def _common(p: argparse.ArgumentParser, execute: bool) -> None:
    p.add_argument("--model", required=True, help="model preset (see `list`)")
    p.add_argument(
        "--hosts", default=str(HOSTFILE_DIR / "localhost"), help="hostfile (default: localhost)"
    )
    _options(p, execute)


def _options(p: argparse.ArgumentParser, execute: bool) -> None:
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a preset value, e.g. --set train_iters=20 --set precision=bf16",
    )
    p.add_argument("--logs", default="logs", help="root of the run directories (default: logs)")
    p.add_argument("--device", choices=DEVICES, help="default: cuda if torch sees a GPU, else cpu")
    p.add_argument(
        "--launcher", choices=LAUNCHER_MODES, help="default: local for one host, else pdsh"
    )
    p.add_argument(
        "--dry-run", action="store_true", help="print launch.sh and ds_config.json; write nothing"
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="record one steady-state logging window of every rank with upstream's PyTorch "
        "profiler (--profile pt); the traces land in the run's tensorboard/",
    )
    p.add_argument(
        "--timers",
        choices=TIMING_LOG_OPTIONS,
        default="minmax",
        help="Megatron's --timing-log-option: minmax (default), max, or all (every rank's "
        "timers, with the schedule's forward-compute and backward-compute: the report names "
        "straggler ranks and their nodes)",
    )
    if execute:
        p.add_argument(
            "--repeat",
            type=_rounds,
            default=1,
            metavar="N",
            help="run N interleaved rounds (every strategy once per round), each run its own "
            "run directory recorded as a repeat; the report's intervals then include the "
            "run-to-run spread (default 1)",
        )
        p.add_argument("--force", action="store_true", help="rerun identical completed runs")
        p.add_argument("--stall", type=float, help="seconds without output before a run is hung")
        p.add_argument("--timeout", type=float, help="seconds a whole run may take")
        p.add_argument(
            "--mem-limit",
            metavar="SIZE",
            help="memory limit of each run's processes on this machine, e.g. 2G (a cgroup; "
            "a rank killed at the limit is recorded as oom)",
        )
        p.add_argument(
            "--allow-other-upstream",
            action="store_true",
            help="run with an upstream checkout at another commit than the pinned one",
        )
        p.add_argument("--net", help="run in an emulated cluster with links of this rate")
        p.add_argument("--lab-nodes", type=int, default=2, help="nodes of the emulated cluster")
        p.add_argument("--lab-slots", type=int, default=1, help="ranks per emulated node (1)")
        p.add_argument(
            "--node-cpus",
            type=float,
            help="cores per emulated node (default: this machine's cores / 4; 0: no budget)",
        )
        p.add_argument("--slow-node", metavar="NODE:cpu=CORES",
                       help="lab: one node with fewer cores, e.g. node2:cpu=0.25")  # fmt: skip
        p.add_argument("--slow-link", metavar="NODE:RATE",
                       help="lab: one node's link slower, e.g. node3:10mbit")  # fmt: skip
        p.add_argument("--delay-ms", type=float, help="one-way delay of the emulated links")
        p.add_argument("--loss-pct", type=float, help="packet loss of the emulated links")
        p.add_argument(
            "--no-netbench", action="store_true", help="lab: skip the collective benchmark"
        )
        p.add_argument(
            "--doctor-links",
            action="store_true",
            help="the doctor also measures every pair of nodes' link; a slow one stops the start",
        )
        p.add_argument(
            "--skip-doctor",
            action="store_true",
            help="start without checking every node first (python -m launchers doctor)",
        )


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m launchers`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="python -m launchers",
        description="Generate and run upstream Megatron-DeepSpeed pretrain_gpt.py launchers.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="models, strategies, hostfiles").set_defaults(func=cmd_list)

    gen = sub.add_parser("generate", help="write a run directory and print its path")
    _common(gen, execute=False)
    gen.add_argument("--strategy", required=True, help="strategy preset (see `list`)")
    gen.set_defaults(func=cmd_generate)

    run = sub.add_parser("run", help="generate, then execute the run directory")
    _common(run, execute=True)
    run.add_argument("--strategy", required=True, help="strategy preset (see `list`)")
    run.set_defaults(func=cmd_run)

    matrix = sub.add_parser("matrix", help="run several strategies of one model in sequence")
    _common(matrix, execute=True)
    matrix.add_argument(
        "--strategies",
        default="core",
        help=f"'core' ({','.join(CORE_STRATEGIES)}), 'all', or names separated by commas",
    )
    matrix.set_defaults(func=cmd_matrix)

    sweep = sub.add_parser("sweep", help="search TP x PP x DP, ZeRO and micro-batch: model "
                           "steered, measured")  # fmt: skip
    _common(sweep, execute=True)
    sweep_command.add_arguments(sweep)
    sweep.set_defaults(func=cmd_sweep)

    doctor.add_parser(sub)

    demo = sub.add_parser("demo", help="tiny model, core strategies, this machine, then report")
    demo.add_argument(
        "--hosts", default=str(HOSTFILE_DIR / "localhost"), help="hostfile (default: localhost)"
    )
    _options(demo, execute=True)
    demo.add_argument(
        "--budget-min",
        type=float,
        default=DEMO_BUDGET_MIN,
        help=f"minutes the demo may take: rounds after the first start only when they fit "
        f"(default {DEMO_BUDGET_MIN:g})",
    )
    demo.set_defaults(func=cmd_demo, net="100mbit", repeat=DEMO_ROUNDS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (
        SpecError,
        HostfileError,
        PresetError,
        PreflightError,
        LabError,
        LimitError,
        DoctorError,
        SweepError,
    ) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
