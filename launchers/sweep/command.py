"""``python -m launchers sweep``: its options, and the request carried from the command line
through validation, the memory filter and the lab (or cluster) to the measuring loop."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analysis.theory.formulas import parse_size
from launchers.config.spec import Cluster, RunSpec, Strategy
from launchers.run.matrix import completed_runs, run_specs
from launchers.sweep.loop import Budget, Sweep, entries_of, run_sweep
from launchers.sweep.plan import MEMORY_MARGIN, memory_verdict
from launchers.sweep.space import Axes, SweepError, candidates, parse_axis, resolve_points


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The sweep's own options (the run options come from ``launchers.cli``)."""
    p.add_argument(
        "--budget",
        default="30m",
        help="wall time of the runs (30m, 1h, 900s), a run count (6runs), or all",
    )
    p.add_argument("--tp", help="TP degrees, e.g. 1,2 (default: divisors of a node's ranks)")
    p.add_argument("--pp", help="PP degrees (default: divisors of the world size and layers)")
    p.add_argument("--zero", help="ZeRO stages, e.g. 0,1 (default 0-3 where valid)")
    p.add_argument("--mbs", help="micro-batch sizes (default: divisors of global batch / DP)")
    p.add_argument(
        "--recompute",
        choices=("on", "off", "both"),
        help="activation recompute (default: both on GPU, off on CPU)",
    )
    p.add_argument(
        "--device-mem",
        metavar="SIZE",
        help="memory of one device, e.g. 24G (default: this machine's first GPU)",
    )


def axes_of(args: argparse.Namespace) -> Axes:
    """The narrowed axes, each checked (``SweepError`` names the option)."""
    rc = {"on": (True,), "off": (False,), "both": (False, True)}.get(args.recompute or "")
    return Axes(
        tp=parse_axis("TP", args.tp),
        pp=parse_axis("PP", args.pp),
        zero=parse_axis("ZERO", args.zero, (0, 1, 2, 3)),
        mbs=parse_axis("MBS", args.mbs),
        recompute=rc,
    )


def device_bytes(args: argparse.Namespace, device: str) -> float | None:
    """``--device-mem`` in bytes, else this machine's first GPU's, else None."""
    if args.device_mem:
        try:
            return float(parse_size(args.device_mem))
        except ValueError as exc:
            raise SweepError(f"DEVICE_MEM={args.device_mem!r}: {exc}; write e.g. 24G") from None
    if device != "cuda":
        return None
    with contextlib.suppress(Exception):
        import torch

        if torch.cuda.is_available():
            return float(torch.cuda.get_device_properties(0).total_memory)
    return None


Resolve = Callable[[Strategy, Mapping[str, Any], Cluster], RunSpec]
"""A strategy with overrides on a cluster, resolved and validated as a single run."""


@dataclass(frozen=True)
class Hooks:
    """What the sweep takes from ``launchers.cli`` (which imports this package)."""

    resolve: Resolve
    """Spec of a strategy on a cluster, as ``run`` resolves it (lab label included)."""
    preflight: Callable[[RunSpec], list[str]]
    """Upstream, data and executables present (raises), warnings."""
    lab: Callable[[argparse.Namespace], contextlib.AbstractContextManager[Any]]
    """The emulated cluster's session, or None."""
    gate: Callable[[Sequence[RunSpec], Path, Any], None]
    """The doctor's check of every node."""
    timeout_s: float | None
    """Executor's bound of one run."""
    mem_limit: Callable[[Sequence[RunSpec]], int | None]
    """``--mem-limit`` in bytes."""


def _points(
    args: argparse.Namespace,
    cluster: Cluster,
    overrides: Mapping[str, Any],
    resolve: Resolve,
    device: str,
) -> list[Any]:
    from launchers.config.presets import get_model

    preset = get_model(args.model)
    configs = candidates(
        overrides.get("num_layers", preset.model.num_layers),
        overrides.get("global_batch_size", preset.model.global_batch_size),
        cluster.slots,
        device,
        axes_of(args),
    )
    return resolve_points(configs, cluster, overrides, resolve)


def run(
    args: argparse.Namespace,
    cluster: Cluster,
    overrides: Mapping[str, Any],
    device: str,
    hooks: Hooks,
) -> int:
    """Validate every configuration, judge memory, then (unless a dry run) measure."""
    budget = Budget.parse(args.budget)
    points = _points(args, cluster, overrides, hooks.resolve, device)
    valid = [p for p in points if p.spec is not None]
    if not valid:
        raise SweepError(
            "no valid configuration: " + "; ".join(sorted({p.invalid for p in points}))[:2000]
        )
    dev = valid[0].spec.device
    mem = device_bytes(args, dev)
    verdicts = {
        p.config.name: (v.fits, v.reason) for p in valid if (v := memory_verdict(p.spec, mem))
    }
    where = f"{len(cluster.hosts)} node(s), {cluster.world_size} ranks, {dev}" + (
        f", emulated links {args.net}" if args.net else ""
    )
    sweep = Sweep(args.model, where, points, entries_of(points, verdicts), Path(args.logs), budget)
    _print_plan(sweep, mem, dev)
    if args.dry_run:
        return 0
    runnable = [p for p in points if sweep.entries[p.config.name].status == "runnable"]
    if not runnable:
        raise SweepError("every valid configuration was excluded by the memory model")
    for warning in hooks.preflight(runnable[0].spec):
        print(f"warning: {warning}", file=sys.stderr)
    mem_limit = hooks.mem_limit([p.spec for p in runnable])
    if not args.net:
        hooks.gate([p.spec for p in runnable], sweep.logs, None)
    with hooks.lab(args) as session:
        if session is not None:  # the lab's own hosts: every runnable point resolved there
            lab_cluster = session.cluster()
            for p in runnable:
                p.spec = hooks.resolve(
                    p.config.strategy(), {**overrides, **p.config.overrides()}, lab_cluster
                )
            hooks.gate([session.adapt(p.spec) for p in runnable], sweep.logs, session)
            if not args.no_netbench:
                session.measure_bandwidth(sweep.logs, quick=True)

        def execute(spec: RunSpec) -> Path | None:
            rows = run_specs(
                [spec],
                sweep.logs,
                force=True,
                stall_s=args.stall,
                timeout_s=hooks.timeout_s,
                session=session,
                mem_limit_bytes=mem_limit,
            )
            return rows[-1].run_dir if rows else None

        def reuse(spec: RunSpec) -> list[Path]:
            adapted = session.adapt(spec) if session is not None else spec
            return [d for d, _ in completed_runs(adapted, sweep.logs)]

        return run_sweep(sweep, execute, reuse, force=args.force)


def _print_plan(sweep: Sweep, mem: float | None, device: str) -> None:
    """Counts, the invalid reasons grouped, the memory verdicts."""
    es = list(sweep.entries.values())
    by = {s: [e for e in es if e.status == s] for s in ("runnable", "excluded", "invalid")}
    print(
        f"sweep {sweep.model} on {sweep.cluster}: {len(es)} configurations, "
        f"{len(by['runnable'])} runnable, {len(by['excluded'])} excluded by memory, "
        f"{len(by['invalid'])} invalid; budget {sweep.budget.label()}"
    )
    if device == "cuda":
        size = f"{mem / (1 << 30):.0f} GiB" if mem else "unknown"
        print(
            f"memory: device {size}, the model's estimate may use {MEMORY_MARGIN:.0%} of it "
            "(the rest: CUDA context, allocator fragmentation, communication buffers)"
        )
    else:
        print(
            "memory: on CPU the memory model cannot judge (ranks use host memory, shared with "
            "the system): nothing excluded"
        )
    reasons: dict[str, list[str]] = {}
    for e in by["invalid"]:
        reasons.setdefault(e.reason, []).append(e.name)
    for reason, names in reasons.items():
        print(f"invalid ({len(names)}): {reason}: {', '.join(names)}")
    for e in by["excluded"]:
        print(f"excluded {e.name}: {e.reason}")
    for e in by["runnable"]:
        print(f"runnable {e.name}" + (f": {e.reason}" if e.reason else ""))


@contextlib.contextmanager
def no_lab(_: argparse.Namespace) -> Iterator[None]:
    """No emulated cluster (a stand-in for ``Hooks.lab``)."""
    yield None
