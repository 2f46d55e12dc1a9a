"""What the sweep decides before and between measurements: the memory filter, the anchor runs
that identify the time model's parameters, and every configuration predicted with an interval
from the calibrated model (``analysis.predict``), in the order to measure them."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from analysis.metrics.stats import t95
from analysis.predict.calibration import Calibration, Observation, calibrate
from analysis.predict.prediction import leave_one_out, predict
from analysis.theory.costs import compute_kind, memory_estimate
from analysis.theory.formulas import parse_rate
from analysis.theory.setup import RunSetup
from launchers.config.spec import RunSpec
from launchers.sweep.space import Point

MEMORY_MARGIN = 0.9
"""Fraction of the device memory the model's estimate may use: the estimate counts parameters,
gradients, optimizer states and activations, not the CUDA context, the allocator's
fragmentation or communication buffers, which take the rest."""

GIB = 1 << 30


def setup_of(spec: RunSpec, like: RunSetup | None = None) -> RunSetup:
    """The analysis' view of a run that has not been made (``RunSetup``), with the network and
    CPU budget of ``like`` (a measured run of the same cluster) when given."""
    m, s = spec.model, spec.strategy
    link = None
    if spec.network:  # "emulated 4 nodes x 100mbit"
        link = parse_rate(spec.network.rsplit(" x ", 1)[-1].split(",")[0])
    base = RunSetup(
        model=m.name,
        num_layers=m.num_layers,
        hidden_size=m.hidden_size,
        num_attention_heads=m.num_attention_heads,
        seq_length=m.seq_length,
        max_position_embeddings=m.max_position_embeddings,
        ffn_hidden_size=m.ffn_hidden_size or 4 * m.hidden_size,
        vocab_size=m.vocab_size,
        padded_vocab_size=spec.padded_vocab_size,
        normalization=spec.normalization,
        micro_batch_size=m.micro_batch_size,
        global_batch_size=m.global_batch_size,
        precision=m.precision,
        activation_checkpointing=spec.training.activation_checkpointing,
        strategy=s.name,
        tp=s.tp,
        pp=s.pp,
        dp=spec.dp,
        zero_stage=s.zero_stage,
        offload=s.offload != "none",
        world_size=spec.world_size,
        nodes=len(spec.cluster.hosts),
        device=spec.device,
        train_iters=spec.training.train_iters,
        log_interval=spec.training.log_interval,
        steps_per_print=spec.training.log_interval,
        wall_clock_breakdown=s.pp == 1,
        link_mbit=link if len(spec.cluster.hosts) > 1 else None,
    )
    if like is None:
        return base
    return replace(
        base,
        link_mbit=like.link_mbit if base.nodes == like.nodes else base.link_mbit,
        latency_ms=like.latency_ms,
        node_cpus=like.node_cpus,
        reduce_bucket_size=like.reduce_bucket_size,
        param_persistence_threshold=like.param_persistence_threshold,
        communication_data_type=like.communication_data_type,
    )


# ---------------------------------------------------------------------------- memory


@dataclass(frozen=True)
class MemoryVerdict:
    """Whether a configuration fits the device, by the memory model."""

    fits: bool | None
    """True/False, None when it cannot be judged."""
    reason: str
    """The estimate against the usable memory, with the numbers."""


def memory_verdict(spec: RunSpec, device_bytes: float | None) -> MemoryVerdict:
    """The memory model's estimate per rank against ``MEMORY_MARGIN`` x the device memory."""
    if spec.device != "cuda":
        return MemoryVerdict(
            None,
            "on CPU the memory model cannot judge: ranks use host "
            "memory, shared with the system and the other ranks",
        )
    if not device_bytes:
        return MemoryVerdict(None, "device memory unknown (DEVICE_MEM=24G): not judged")
    est = memory_estimate(setup_of(spec))
    usable = MEMORY_MARGIN * device_bytes
    gib = est.total_bytes / GIB
    text = (
        f"{gib:.1f} GiB per rank (state {est.state_bytes / GIB:.1f} + activations "
        f"{est.activation_bytes / GIB:.1f}) vs {usable / GIB:.1f} GiB usable "
        f"({MEMORY_MARGIN:.0%} of {device_bytes / GIB:.0f} GiB)"
    )
    return MemoryVerdict(est.total_bytes <= usable, text)


# ---------------------------------------------------------------------------- anchors


def anchors(points: Sequence[Point]) -> list[Point]:
    """The runs that identify the time model: per compute kind the flat (PP 1, ZeRO 0 unless
    the kind is ZeRO-3) configuration with the most data parallelism, so its DeepSpeed timers
    give the compute rate and the gradient all-reduce the link's bandwidth and per-call cost;
    and the pipeline of the fewest stages, whose time beyond its compute is the bubble.

    ``points``: the runnable configurations (valid and not excluded by memory).
    """
    chosen: list[Point] = []

    def pick(pool: list[Point]) -> None:
        if pool:
            best = min(
                pool, key=lambda p: (-p.config.dp, p.config.tp, -p.config.mbs, p.config.recompute)
            )
            if best not in chosen:
                chosen.append(best)

    flat = [p for p in points if p.config.pp == 1 and p.spec is not None]
    kind = {p.config.name: compute_kind(setup_of(p.spec)) for p in flat if p.spec is not None}
    pick([p for p in flat if kind[p.config.name] == "base" and p.config.zero == 0])
    if not chosen:
        pick([p for p in flat if kind[p.config.name] == "base"])
    tps = sorted({p.config.tp for p in flat if kind[p.config.name] == "tp"})
    if tps:
        pick([p for p in flat if kind[p.config.name] == "tp" and p.config.tp == tps[0]])
    pick([p for p in flat if kind[p.config.name] == "zero3"])
    pps = sorted({p.config.pp for p in points if p.config.pp > 1})
    if pps:
        pick(
            [p for p in points if p.config.pp == pps[0] and p.config.tp == 1 and p.config.zero == 0]
            or [p for p in points if p.config.pp == pps[0]]
        )
    return chosen


# ---------------------------------------------------------------------------- predictions


@dataclass(frozen=True)
class Predicted:
    """A configuration's predicted ms per iteration with its 95% interval."""

    ms: float | None
    """Predicted ms per iteration; None with ``reason``."""
    lo: float | None
    """Lower bound of the interval."""
    hi: float | None
    """Upper bound."""
    method: str
    """``anchored`` (on its own measured run) or ``components``; ``none`` without a figure."""
    reason: str = ""
    """Why there is no figure or no interval."""


@dataclass(frozen=True)
class ModelError:
    """How far the calibrated model missed the measured runs, left out one at a time."""

    errors: tuple[float, ...]
    """Relative errors (predicted - measured) / measured of each measured configuration."""

    @property
    def half_width(self) -> float | None:
        """Half-width of a 95% prediction interval in log time: t(n-1) x RMS of the log errors
        log(predicted / measured) x sqrt(1 + 1/n), so that the interval, predicted x
        exp(-/+ half), stays positive however large the errors; None below two errors."""
        n = len(self.errors)
        if n < 2:
            return None
        rms = math.sqrt(statistics.fmean(math.log1p(e) ** 2 for e in self.errors))
        return t95(n - 1) * rms * math.sqrt(1 + 1 / n)


def model_error(observations: Sequence[Observation]) -> ModelError:
    """Leave-one-out errors over the observations (``analysis.predict.leave_one_out``)."""
    errs = [r.error for r in leave_one_out(observations) if r.error is not None]
    return ModelError(tuple(errs))


def predict_all(
    points: Sequence[Point], observations: Sequence[Observation]
) -> tuple[dict[str, Predicted], ModelError, Calibration | None]:
    """Every runnable point predicted from a calibration on ``observations``.

    A configuration measured itself is predicted anchored on its own runs (their interval); any
    other is built from the components, with the interval of the model's leave-one-out error.
    """
    out: dict[str, Predicted] = {}
    if not observations:
        for p in points:
            out[p.config.name] = Predicted(None, None, None, "none", "no measured run yet")
        return out, ModelError(()), None
    cal = calibrate(observations)
    err = model_error(observations)
    half = err.half_width
    like = observations[0].setup
    for p in points:
        assert p.spec is not None
        pred = predict(setup_of(p.spec, like), cal)
        if pred.iter_ms is None:
            out[p.config.name] = Predicted(None, None, None, "none", pred.reason or "")
            continue
        if pred.method == "anchored" and pred.uncertainty_ms is not None:
            u = pred.uncertainty_ms
            out[p.config.name] = Predicted(
                pred.iter_ms, pred.iter_ms - u, pred.iter_ms + u, "anchored"
            )
        elif half is not None:
            lo, hi = pred.iter_ms * math.exp(-half), pred.iter_ms * math.exp(half)
            out[p.config.name] = Predicted(pred.iter_ms, lo, hi, pred.method)
        else:
            out[p.config.name] = Predicted(
                pred.iter_ms,
                None,
                None,
                pred.method,
                f"no interval: {len(err.errors)} leave-one-out error(s), two are needed",
            )
    return out, err, cal
