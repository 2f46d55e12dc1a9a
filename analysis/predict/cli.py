"""Calibrated time and memory model: predictions for runs that were not made.

``python -m analysis.predict LOGDIR [--link 100mbit] [--nodes N] [--model small|large|L,H,S]
[--strategies ...] [--gpu-mem-gb G] [--json]``.

Time of one iteration (optimizer step) on the busiest rank, no overlap of communication and
compute (gloo on CPU blocks; the timers show the all-reduce after backward, not inside it):

    iter = compute + bubble + optimizer + other + exposed communication

- compute: forward and backward ms per GFLOP, calibrated per *compute kind* (``base``, ``tp``,
  ``zero3``) from DeepSpeed's ``fwd`` and ``bwd_inner`` timers (per step: sums over micro-steps)
  divided by the model FLOPs of the rank's work (``flops_per_microbatch``: Megatron's
  ``throughput_calculator`` count, layers of the busiest stage, 1/TP). Scaling by FLOPs scales by
  layers, micro-batches (GAS), tokens and 1/TP at once. A kind with no timed run borrows ``base``
  and says so.
- bubble: (p - 1) / (m + p - 1) of the pipeline time (p stages, m micro-batches): the bottleneck
  stage's per-micro-batch time times (p - 1) (GPipe/1F1B, UPSTREAM.md).
- optimizer: ms per million parameters updated by the rank (DeepSpeed ``step`` minus
  ``optimizer_allgather``), parameters of the busiest stage, / dp under ZeRO >= 1.
- other: iteration time not covered by any timer, a per-iteration constant (mean of the kind).
- communication: every collective of ``theory.comm.plan`` (busiest rank, one direction: links
  are full duplex) costs ``count x (alpha + wire MB x (host + 8000 / (e x R)))`` ms, ``R`` the
  link in Mbit/s (8000 / R = ms per MB at line rate), ``e`` the wire efficiency, ``host`` the
  per-MB cost that does not depend on the link (copies and reductions in gloo/DeepSpeed). Sources,
  in order: netbench.json (busbw by op, interpolated in log size; e of each op = its busbw at
  the largest message / link rate; with a lab session's host-time benchmark, netbench.json
  ``host_time``, a call costs ``max(host time per call, wire time per call)``: the hosts' own
  time, measured on the unshaped links after a pause, overlaps the wire), the
  runs' ``bwd_allreduce + optimizer_allgather`` timers against the plan's bytes (pooled ms / MB;
  with runs at two or more rates, host and e from a line in 1/R), else the link rate with the
  assumed efficiency ``LINK_EFFICIENCY``.

A run of the same model and layout measured elsewhere (another link or node count) is the best
calibration for itself: the prediction is then ``anchored``: its measured time minus its modelled
communication plus the modelled communication at the target. Otherwise it is built from the
components above. Memory per rank follows the ZeRO paper and Korthikanti et al. (see
``zero_state_bytes`` and ``activation_bytes_per_layer``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from analysis.metrics import rows as metrics
from analysis.metrics import speedup
from analysis.metrics.rows import RunMetrics
from analysis.predict.calibration import (
    Calibration,
    calibrate,
    observations_from,
)
from analysis.predict.prediction import LooResult, Prediction, leave_one_out, predict
from analysis.predict.whatif import (
    STRATEGIES,
    BandwidthCrossover,
    MemoryCrossover,
    bandwidth_crossover,
    memory_crossover,
    what_if,
)
from analysis.runs import load
from analysis.runs.load import MODEL_PRESETS, LoadedRun
from analysis.theory import formulas
from analysis.theory.units import number

# ---------------------------------------------------------------------------- CLI


def parse_rate(text: str) -> float:
    """Mbit/s from ``100mbit``, ``1gbit``, ``10g``, ``1000`` (a bare number is Mbit/s); a
    what-if needs a rate, so ``none`` is refused."""
    try:
        rate = formulas.parse_rate(text, bare_unit="mbit")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    if rate is None:
        raise argparse.ArgumentTypeError(f"link {text!r}: a what-if needs a rate, e.g. 100mbit")
    return rate


def parse_model(text: str) -> tuple[int, int, int, int]:
    """(layers, hidden, heads, seq) from a preset name or ``L,H,S`` (heads h/64) / ``L,H,A,S``."""
    if text in MODEL_PRESETS:
        return MODEL_PRESETS[text]
    parts = [int(p) for p in text.split(",") if p.strip()]
    if len(parts) == 3:
        return parts[0], parts[1], max(1, parts[1] // 64), parts[2]
    if len(parts) == 4:
        return parts[0], parts[1], parts[2], parts[3]
    raise argparse.ArgumentTypeError(f"model {text!r}: {', '.join(MODEL_PRESETS)} or L,H,S")


def load_runs(logdir: Path) -> tuple[list[LoadedRun], list[RunMetrics]]:
    """The runs under ``logdir`` (its ``report/`` left out) and their metrics rows, compared."""
    runs = load.discover(logdir, exclude=[logdir / "report"])
    rows = speedup.compare([metrics.compute(r) for r in runs])
    return runs, rows


def _jsonable(value: Any) -> Any:
    if hasattr(value, "__dataclass_fields__"):
        d = asdict(value)
        d.pop("sources", None)
        return {k: _jsonable(v) for k, v in d.items()}
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items() if k != "sources"}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def _prediction_json(p: Prediction) -> dict[str, Any]:
    d = _jsonable(p)
    d["setup"] = {
        k: getattr(p.setup, k)
        for k in (
            "model",
            "strategy",
            "num_layers",
            "hidden_size",
            "seq_length",
            "tp",
            "pp",
            "dp",
            "zero_stage",
            "nodes",
            "world_size",
            "link_mbit",
            "global_batch_size",
        )
    }
    if p.memory is not None:
        d["memory"]["total_bytes"] = p.memory.total_bytes
    return d


@dataclass(frozen=True)
class WhatIf:
    """Everything the CLI computes."""

    calibration: Calibration
    """Fits from LOGDIR."""
    loo: list[LooResult]
    """Leave-one-out on the measured runs."""
    predictions: list[Prediction]
    """Requested what-if setups."""
    crossovers: list[BandwidthCrossover]
    """Per ZeRO stage."""
    memory: MemoryCrossover | None
    """Memory crossover (with --gpu-mem-gb)."""
    notes: list[str] = field(default_factory=list)
    """What the request assumed."""


def run_what_if(
    runs: Sequence[LoadedRun],
    rows: Sequence[RunMetrics],
    link: float | None = None,
    nodes: int | None = None,
    model: tuple[int, int, int, int] | None = None,
    strategies: Sequence[str] = tuple(STRATEGIES),
    gpu_mem_gb: float | None = None,
    ranks_per_node: int | None = None,
) -> WhatIf:
    """Calibrate on the runs and predict the requested setups, crossovers and memory limits."""
    obs = observations_from(runs, rows)
    if not obs:
        raise ValueError("no completed timed run with a known layout to calibrate on")
    cal = calibrate(obs)
    notes: list[str] = []
    multi = [o for o in obs if (o.setup.nodes or 1) > 1]
    ref = (multi or list(obs))[0].setup
    rpn = ranks_per_node or max(1, (ref.world_size or 1) // (ref.nodes or 1))
    n = nodes or max(ref.nodes or 1, 2)
    rate = link or ref.link_mbit or (cal.inter.rate_mbit if cal.inter else None) or 1000.0
    if link is None:
        notes.append(f"link {rate:g} Mbit/s (the measured runs' rate; --link to change)")
    preds = []
    for st in strategies:
        try:
            su = what_if(ref, st, n, rpn, rate, model)
        except ValueError as exc:
            notes.append(f"{st}: {exc}")
            continue
        preds.append(predict(su, cal))
    base = what_if(ref, "baseline", max(n, 2), rpn, rate, model)
    cross = [bandwidth_crossover(base, z, cal) for z in (1, 2, 3)]
    mem = None
    if gpu_mem_gb:
        mem = memory_crossover(base, gpu_mem_gb, base.world_size or 2)
    return WhatIf(cal, leave_one_out(obs), preds, cross, mem, notes)


def to_json(w: WhatIf) -> dict[str, Any]:
    """The CLI's --json document."""
    return {
        "calibration": {
            "compute": _jsonable(w.calibration.compute),
            "intra_node": _jsonable(w.calibration.intra),
            "inter_node": _jsonable(w.calibration.inter),
            "assumptions": list(w.calibration.assumptions),
        },
        "leave_one_out": [
            {
                "name": r.name,
                "repeats": r.repeats,
                "measured_ms": r.measured_ms,
                "predicted_ms": r.prediction.iter_ms,
                "error": r.error,
                "method": r.prediction.method,
                "anchors": list(r.prediction.anchors),
            }
            for r in w.loo
        ],
        "predictions": [_prediction_json(p) for p in w.predictions],
        "crossovers": _jsonable(w.crossovers),
        "memory_crossover": _jsonable(w.memory),
        "notes": w.notes,
    }


def _print(w: WhatIf) -> None:
    console = Console(width=160)
    table = Table(title="Predicted ms/iteration and memory per rank")
    for col in (
        "setup",
        "ms/iter",
        "method",
        "compute",
        "bubble",
        "optimizer",
        "other",
        "comm",
        "state MiB",
        "activations MiB",
    ):
        table.add_column(col)
    for p in w.predictions:
        cells = [
            p.label,
            number(p.iter_ms),
            p.method,
            number(p.compute_ms),
            number(p.bubble_ms),
            number(p.optimizer_ms),
            number(p.other_ms),
            number(p.comm_ms),
        ]
        mem = p.memory
        cells += (
            [number(mem.state_bytes / 2**20), number(mem.activation_bytes / 2**20)]
            if mem
            else ["", ""]
        )
        table.add_row(*cells)
    console.print(table)
    for p in w.predictions:
        console.print(f"- {p.label}: " + "; ".join([*p.assumptions, p.reason or ""]).strip("; "))
    loo = Table(title="Leave-one-out: each run predicted from the others")
    for col in ("run", "measured", "predicted", "error", "method"):
        loo.add_column(col)
    for r in w.loo:
        err = f"{r.error:+.1%}" if r.error is not None else "n/a"
        loo.add_row(
            r.name, number(r.measured_ms), number(r.prediction.iter_ms), err, r.prediction.method
        )
    console.print(loo)
    for c in w.crossovers:
        console.print(f"- {c.strategy}: {c.verdict}; {c.reason}")
    if w.memory:
        console.print(f"- memory ({w.memory.gpu_mem_gb:g} GiB): {w.memory.reasoning}")
    for n in w.notes:
        console.print(f"- note: {n}")


def main(argv: list[str] | None = None) -> int:
    """CLI entry point."""
    parser = argparse.ArgumentParser(prog="python -m analysis.predict", description=__doc__)
    parser.add_argument("logdir", type=Path, help="measured runs (run directories, log files)")
    parser.add_argument("--link", type=parse_rate, help="target link, e.g. 100mbit, 10gbit")
    parser.add_argument("--nodes", type=int, help="target node count (default: as measured)")
    parser.add_argument("--ranks-per-node", type=int, help="ranks per node (default: as measured)")
    parser.add_argument("--model", type=parse_model, help="tiny|small|large or L,H,S / L,H,A,S")
    parser.add_argument(
        "--strategies",
        nargs="+",
        default=list(STRATEGIES),
        choices=list(STRATEGIES),
        help="strategies to predict",
    )
    parser.add_argument("--gpu-mem-gb", type=float, help="memory per rank for the size crossover")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args(argv)
    if not args.logdir.exists():
        parser.error(f"{args.logdir} does not exist")
    runs, rows = load_runs(args.logdir)
    try:
        w = run_what_if(
            runs,
            rows,
            args.link,
            args.nodes,
            args.model,
            args.strategies,
            args.gpu_mem_gb,
            args.ranks_per_node,
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(to_json(w), indent=2, default=str))
    else:
        _print(w)
    return 0
