"""Predicted iteration time of a setup from a calibration (``anchored`` on a measured run of
the same layout, else built from the components), and leave-one-out over measured runs.
See ``analysis.predict.cli`` for the model.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from analysis.metrics.rows import RunMetrics
from analysis.predict.calibration import (
    Calibration,
    Observation,
    calibrate,
    comm_time,
    compute_scale,
    cpu_share,
)
from analysis.runs.load import derive_strategy
from analysis.theory import comm
from analysis.theory.costs import (
    MemoryEstimate,
    compute_kind,
    flops_per_microbatch,
    memory_estimate,
    updated_parameters,
)
from analysis.theory.formulas import backward_factor, bubble_fraction
from analysis.theory.setup import RunSetup

# ---------------------------------------------------------------------------- prediction


@dataclass(frozen=True)
class Prediction:
    """Predicted time and memory of one setup, with how it was obtained."""

    label: str
    """Strategy and cluster, e.g. ``zero2 / 2 nodes, 2 ranks / 100 Mbit/s``."""
    setup: RunSetup
    """What was predicted."""
    iter_ms: float | None
    """Predicted ms per iteration (None with ``reason``)."""
    method: Literal["anchored", "components", "none"]
    """``anchored`` on a measured run of the same layout, or built from ``components``."""
    anchors: tuple[str, ...] = ()
    """Runs anchored on."""
    compute_ms: float | None = None
    """Forward + backward busy time of the bottleneck rank (components only)."""
    bubble_ms: float | None = None
    """Pipeline bubble (components only)."""
    optimizer_ms: float | None = None
    """Optimizer step (components only)."""
    other_ms: float | None = None
    """Untimed constant (components only)."""
    comm_ms: float | None = None
    """Exposed communication at the target."""
    memory: MemoryEstimate | None = None
    """Memory per rank from the formulas."""
    assumptions: tuple[str, ...] = ()
    """What this figure assumes."""
    reason: str | None = None
    """Why there is no figure, or what limits it."""
    uncertainty_ms: float | None = None
    """Measurement part of the uncertainty (anchored: the anchors' 95% half-widths, root mean
    square over anchors / sqrt(count)); None for components (model error dominates)."""


def _layout_key(s: RunSetup) -> tuple[Any, ...]:
    return (
        s.num_layers,
        s.hidden_size,
        s.num_attention_heads,
        s.seq_length,
        s.padded_vocab_size,
        s.micro_batch_size,
        s.global_batch_size,
        s.precision,
        s.tp,
        s.pp,
        s.dp,
        s.zero_stage,
        bool(s.offload),
        bool(s.activation_checkpointing),
    )


def label(setup: RunSetup) -> str:
    """``strategy / Nn x Wr / link``."""
    strat = setup.strategy or derive_strategy(setup.tp or 1, setup.pp or 1, setup.zero_stage or 0)
    rate = f"{setup.link_mbit:g} Mbit/s" if setup.link_mbit else "link unknown"
    where = "one machine" if (setup.nodes or 1) == 1 else rate
    return f"{strat} / {setup.nodes or '?'}n x {setup.world_size}r / {where}"


def predict(setup: RunSetup, cal: Calibration, exclude: Sequence[str] = ()) -> Prediction:
    """Predicted time (anchored when a same-layout run exists, else components) and memory."""
    mem = memory_estimate(setup) if comm.plan(setup)[0] is not None else None
    target_comm, why = comm_time(setup, cal.intra, cal.inter)
    if target_comm is None:
        return Prediction(label(setup), setup, None, "none", memory=mem, reason=why)
    base_notes: list[str] = []
    if (setup.nodes or 1) > 1 and cal.inter is not None and cal.inter.rate_mbit:
        base_notes.append(
            f"inter-node at {setup.link_mbit:g} Mbit/s: {cal.inter.ms_per_mb(setup.link_mbit):.2f}"
            f" ms per wire MB ({cal.inter.source})"
        )
    anchors = [
        o
        for o in cal.observations
        if o.name not in exclude and _layout_key(o.setup) == _layout_key(setup)
    ]
    same_cluster = [o for o in anchors if o.setup.nodes == setup.nodes]
    anchors = same_cluster or anchors  # the same cluster at another rate is the closest run
    estimates = []
    for o in anchors:
        own, _ = comm_time(o.setup, cal.intra, cal.inter)
        if own is not None:
            scale = compute_scale(cpu_share(o.setup), setup)
            estimates.append((o.iter_ms - own) * scale + target_comm)
    if estimates:
        names = tuple(o.name for o in anchors)
        halves = [o.ci_half_ms for o in anchors if o.ci_half_ms is not None]
        unc = None
        if len(halves) == len(anchors):
            unc = math.sqrt(sum(h * h for h in halves)) / len(halves)
        return Prediction(
            label(setup),
            setup,
            statistics.fmean(estimates),
            "anchored",
            names,
            comm_ms=target_comm,
            memory=mem,
            assumptions=(
                f"measured {', '.join(names)} minus its modelled communication plus the "
                "modelled communication here",
                *base_notes,
            ),
            uncertainty_ms=unc,
        )
    kind = compute_kind(setup)
    fit = cal.compute.get(kind)
    notes = list(base_notes)
    if fit is None:
        fit = cal.compute.get("base")
        if fit is None:
            return Prediction(
                label(setup),
                setup,
                None,
                "none",
                memory=mem,
                reason="no run with DeepSpeed fwd/bwd_inner/step timers to calibrate compute: "
                "run the baseline with wall_clock_breakdown true",
            )
        notes.append(
            f"no {kind} run to calibrate its compute: borrowed the base fit (FLOPs / tp); "
            f"a measured {kind} run would replace this"
        )
    gflop, _ = flops_per_microbatch(setup)
    scale = compute_scale(fit.cpu_share, setup)
    if scale != 1.0:
        notes.append(
            f"compute x {scale:.2f}: {fit.cpu_share:g} cores per rank in the calibration runs, "
            f"{cpu_share(setup):g} here (node CPU budget / ranks per node)"
        )
    recompute = bool(setup.activation_checkpointing)
    bwd_per_gflop = fit.bwd_ms_per_gflop * backward_factor(recompute)
    if recompute:
        notes.append(
            "full activation recompute: backward x 1.5 (it runs the forward again), FLOPs x 4/3"
        )
    per_mb = gflop / 1e9 * (fit.fwd_ms_per_gflop + bwd_per_gflop) * scale
    m, p = setup.gas or 1, setup.pp or 1
    compute = per_mb * m
    bubble = per_mb * (p - 1)
    opt = fit.optimizer_ms_per_mparam * updated_parameters(setup) / 1e6 * scale
    if p > 1:
        notes.append(
            f"pipeline: bubble (p-1)/(m+p-1) = {bubble_fraction(p, m):.3f}; 'other' taken from "
            "non-pipeline runs (the PipelineEngine prints no step timers)"
        )
    other = fit.other_ms * scale
    total = compute + bubble + opt + other + target_comm
    return Prediction(
        label(setup),
        setup,
        total,
        "components",
        (),
        compute,
        bubble,
        opt,
        other,
        target_comm,
        mem,
        (f"compute fit '{fit.kind}' from {', '.join(fit.runs)}", *notes),
    )


@dataclass(frozen=True)
class LooResult:
    """Leave-one-out: one measured run predicted from the others."""

    name: str
    """Run predicted."""
    measured_ms: float
    """Its measured steady-state ms per iteration."""
    prediction: Prediction
    """Prediction calibrated on the other runs."""
    repeats: int = 1
    """Runs whose mean ``measured_ms`` is."""

    @property
    def error(self) -> float | None:
        """(predicted - measured) / measured, signed."""
        if self.prediction.iter_ms is None:
            return None
        return (self.prediction.iter_ms - self.measured_ms) / self.measured_ms


def leave_one_out(observations: Sequence[Observation]) -> list[LooResult]:
    """Each run predicted from a calibration on the others with the same model and batch."""
    out = []
    for o in observations:
        same_model = [
            x
            for x in observations
            if x.name != o.name and _layout_key(x.setup)[:8] == _layout_key(o.setup)[:8]
        ]
        if not same_model:
            none = "no other completed timed run of this model and batch to predict it from"
            p = Prediction(label(o.setup), o.setup, None, "none", reason=none)
        else:
            p = predict(o.setup, calibrate(same_model))
        out.append(LooResult(o.name, o.iter_ms, p, o.repeats))
    return out


def fill_rows(rows: Sequence[RunMetrics], loo: Sequence[LooResult]) -> list[RunMetrics]:
    """Rows with ``predicted_iter_ms`` and ``prediction_error`` (leave-one-out) filled; the
    error of a repeat is against the mean of its repeats."""
    by_name = {(r.name, r.prediction.setup.setup_key): r for r in loo}
    out = []
    for row in rows:
        na = dict(row.na_reasons)
        res = by_name.get((row.name, row.setup_key))
        if res is None or res.prediction.iter_ms is None:
            why = f"leave-one-out: {res.prediction.reason}" if res else None
            na["predicted_iter_ms"] = why or "not a completed timed run with a known layout"
            out.append(replace(row, na_reasons=na))
            continue
        p = res.prediction
        na["predicted_iter_ms"] = (
            f"leave-one-out ({p.method}"
            + (f" on {', '.join(p.anchors)}" if p.anchors else "")
            + "): calibrated on the other runs of this model"
            + (f"; error vs the mean of its {res.repeats} repeats" if res.repeats > 1 else "")
        )
        out.append(
            replace(row, predicted_iter_ms=p.iter_ms, prediction_error=res.error, na_reasons=na)
        )
    return out
