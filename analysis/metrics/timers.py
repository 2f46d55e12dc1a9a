"""Timers of a run, per iteration: DeepSpeed per-step timers (plain engine), the
PipelineEngine's totals per ``steps_per_print``, Megatron's minmax timers, the pipeline's
wait share, and the breakdown of an iteration into forward, backward, communication,
optimizer and the rest (``other`` = iteration - timers).
"""

from __future__ import annotations

import math
import statistics
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from analysis.metrics.stats import sample_std, t95
from analysis.parse.records import ParsedRun, TimerBlock, TimerGroupView, blocks_of, timer_groups
from analysis.theory import comm
from analysis.theory.formulas import bubble_fraction
from analysis.theory.setup import RunSetup

_ALIASES = {
    "forward": "fwd",
    "backward": "bwd",
    "backward_inner": "bwd_inner",
    "backward_allreduce": "bwd_allreduce",
    "fwd_microstep": "fwd",
    "bwd_microstep": "bwd",
    "bwd_inner_microstep": "bwd_inner",
    "bwd_allreduce_microstep": "bwd_allreduce",
    "step_microstep": "step",
}
"""Older DeepSpeed timer names, and the PipelineEngine's ``_microstep`` names, to today's."""


def outside(its: np.ndarray, ranges: Sequence[tuple[int, int]]) -> np.ndarray:
    """Mask of the iteration numbers ``its`` outside every (first, last) range (the pauses the
    steady-state rule left out: the timers leave out the same iterations)."""
    keep = np.ones(len(its), dtype=bool)
    for lo, hi in ranges:
        keep &= ~((its >= lo) & (its <= hi))
    return keep


def deepspeed_step_timers(
    parsed: ParsedRun, warmup_iters: int, pauses: Sequence[tuple[int, int]] = ()
) -> dict[str, list[float]]:
    """Per-iteration DeepSpeed timer samples (ms) after dropping ``warmup_iters`` iterations
    and the ``pauses`` (first, last iteration) the steady-state rule left out.

    The plain engine logs its timers once per optimizer step and resets them
    (``deepspeed/runtime/engine.py`` ``DeepSpeedEngine.step`` -> ``timers.log``; ``utils/timer.py``
    ``Timer.elapsed`` sums every start/stop since the last reset), so each ``fwd``/``bwd``/``step``
    value is the SUM over that step's micro-steps. ``_microstep`` lines duplicate them and are
    skipped. Blocks are grouped by their key set; a block attributed to an iteration (or to the
    iteration line closing its window) is kept when that is past the warm-up, otherwise blocks
    are taken in file order, one per iteration (rank 0's node log has no iteration lines).
    """
    # Column-wise (a long run has millions of blocks): groups of one key set, blocks in order.
    by_signature: dict[frozenset[str], list[TimerGroupView]] = {}
    for view in timer_groups(
        parsed.timers, "deepspeed", lambda names: not all(k.endswith("_microstep") for k in names)
    ):
        by_signature.setdefault(frozenset(view.names), []).append(view)
    out: dict[str, array[float]] = {}
    for views in by_signature.values():
        if len(views) == 1:  # one group: its blocks are in file order already
            order = None
            its = views[0].iteration
        else:
            order = np.argsort(np.concatenate([v.rows for v in views]), kind="stable")
            its = np.concatenate([v.iteration for v in views])[order]
        attributed = not np.isnan(its).any()
        # Attributed to an iteration (or to the iteration line closing its window); else one
        # block per iteration, in file order.  ``keep``: in file order.
        if attributed:
            keep = (its > warmup_iters) & outside(its, pauses)
        else:
            keep = np.zeros(len(its), dtype=bool)
            keep[warmup_iters:] = True
        del its
        for key in views[0].names:
            parts = [
                v.values[key] if v.shape[v.names.index(key)] == 0 else np.full(len(v.rows), np.nan)
                for v in views
            ]  # numbers only, not Megatron-style pairs
            vals = parts[0] if order is None else np.concatenate(parts)[order]
            del parts
            for v in views:  # a view keeps what it read: let this name's values go
                v.values.pop(key, None)
            vals = vals[keep & ~np.isnan(vals)]
            # Straight from the numpy buffer (no list of floats in between).
            out.setdefault(_ALIASES.get(key, key), array("d")).frombytes(memoryview(vals).cast("B"))
            del vals
    return out  # type: ignore[return-value]


def megatron_timers(
    parsed: ParsedRun, after_iteration: int, pauses: Sequence[tuple[int, int]] = ()
) -> dict[str, list[float]]:
    """Megatron timer means per window (ms per iteration, max across ranks) after the warm-up,
    without the ``pauses`` (first, last iteration) the steady-state rule left out.

    Megatron logs them with ``normalizer=args.log_interval`` (upstream ``megatron/training.py``
    ``training_log``), so each value is already per iteration.
    """
    views = timer_groups(parsed.timers, "megatron")
    picked: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    first: dict[str, tuple[int, int]] = {}  # name -> (its first block, its place in it)
    for view in views:
        its = np.nan_to_num(view.iteration, nan=0.0)
        keep = (its > after_iteration) & outside(its, pauses)
        rows = view.rows[keep]  # (once for all the view's names: a run of log interval 1 has
        # millions of blocks)
        for j, name in enumerate(view.names):
            picked.setdefault(name, []).append((rows, view.values[name][keep]))
            if len(rows):
                first[name] = min(first.get(name, (int(rows[0]), j)), (int(rows[0]), j))
    if not any(np.isnan(v).any() for parts in picked.values() for _r, v in parts):
        # Column-wise: each name's values in block order (names in order of first appearance).
        columns: dict[str, list[float]] = {}
        for name in sorted(first, key=first.__getitem__):
            parts = picked[name]
            if len(parts) == 1 and bool((np.diff(parts[0][0]) > 0).all()):
                vals = parts[0][1]  # (one group, its blocks in order: most runs)
            else:
                rows = np.concatenate([r for r, _v in parts])
                vals = np.concatenate([v for _r, v in parts])[np.argsort(rows, kind="stable")]
            columns[name] = array("d", vals)  # type: ignore[assignment]
        return columns
    return _megatron_timers_by_block(parsed, after_iteration, pauses)  # a NaN: Python's max


def _megatron_timers_by_block(
    parsed: ParsedRun, after_iteration: int, pauses: Sequence[tuple[int, int]] = ()
) -> dict[str, list[float]]:
    """``megatron_timers`` block by block (a (min, max) pair's largest as Python's ``max``)."""
    out: dict[str, list[float]] = {}
    for block in blocks_of(parsed.timers, "megatron"):
        it = block.iteration or 0
        if it <= after_iteration or any(lo <= it <= hi for lo, hi in pauses):
            continue
        for key, value in block.values_ms.items():
            ms = max(value) if isinstance(value, tuple) else value
            out.setdefault(key, []).append(float(ms))
    return out


def pipeline_timers(parsed: ParsedRun, steps_per_print: int) -> dict[str, list[float]]:
    """PipelineEngine timers in ms per iteration (optimizer step): printed totals divided by
    ``steps_per_print``, one sample per print after the first (warm-up) print.

    ``deepspeed/runtime/pipe/engine.py`` (0.18-0.19) logs, only every ``steps_per_print`` steps
    and on global rank 0 (the first stage), with ``timers.log(..., reset=True)``
    (``utils/timer.py``: ``elapsed`` sums every start/stop since the last reset):
    ``_exec_optimizer_step``: ``batch_input | fwd_microstep | bwd_microstep | bwd_inner_microstep
    | bwd_allreduce_microstep | step_microstep`` and ``fwd | bwd | bwd_inner | bwd_allreduce |
    step``; ``train_batch``: ``pipe_send_output | pipe_send_grad | pipe_recv_input |
    pipe_recv_grad`` (those the rank ran). Each is a total over ``steps_per_print`` steps and all
    their micro-batches. The ``_microstep`` group duplicates the global one and is used only for
    ``batch_input`` or when the global group is missing.
    """
    if steps_per_print < 1:
        raise ValueError(f"steps_per_print({steps_per_print}) must be >= 1")
    groups: dict[frozenset[str], list[TimerBlock]] = {}
    for block in blocks_of(parsed.timers, "pipeline"):
        groups.setdefault(frozenset(block.values_ms), []).append(block)
    has_global = any("fwd" in keys or "forward" in keys for keys in groups)
    out: dict[str, list[float]] = {}
    for keys, blocks in groups.items():
        micro = any(k.endswith("_microstep") for k in keys)
        for block in blocks[1:]:
            for key, value in block.values_ms.items():
                if not isinstance(value, int | float):
                    continue
                if micro and has_global and key.endswith("_microstep"):
                    continue
                out.setdefault(_ALIASES.get(key, key), []).append(float(value) / steps_per_print)
    return out


PIPE_WAIT_TIMERS = ("pipe_send_output", "pipe_recv_grad", "pipe_send_grad", "pipe_recv_input")
"""PipelineEngine p2p timers: blocking sends and receives between stages, i.e. transfer time plus
the time a stage waits for its neighbour (the bubble and any stage imbalance)."""


@dataclass(frozen=True)
class PipelineWait:
    """The first stage's measured pipeline wait beside the bubble theory."""

    wait_ms: float
    """Sum of the printed ``pipe_*`` timers, ms per iteration."""
    share: float
    """wait / (fwd + bwd + wait): the idle share of the pipelined part of the iteration."""
    theory: float
    """(p-1)/(m+p-1), p stages, m micro-batches per step: the idle share with balanced stages."""
    timers: tuple[str, ...]
    """Which ``pipe_*`` timers were printed."""

    @property
    def text(self) -> str:
        """One sentence with both figures."""
        return (
            f"measured wait {self.wait_ms:,.1f} ms/iteration ({' + '.join(self.timers)}) = "
            f"{self.share:.1%} of forward + backward + wait; bubble theory (p-1)/(m+p-1) = "
            f"{self.theory:.1%} for balanced stages"
            + (
                f"; the {self.share - self.theory:.1%} more is waiting for a slower stage "
                "(the last stage also computes the LM head and loss) or transfer time"
                if self.share > self.theory + 0.02
                else ""
            )
        )


def pipeline_wait(pipe: dict[str, list[float]], setup: RunSetup) -> PipelineWait | None:
    """Measured pipeline wait and the bubble theory, when ``pipe_*`` and fwd/bwd were printed."""
    names = tuple(n for n in PIPE_WAIT_TIMERS if pipe.get(n))
    if not names or not pipe.get("fwd") or not pipe.get("bwd") or not setup.pp or not setup.gas:
        return None
    wait = sum(statistics.fmean(pipe[n]) for n in names)
    busy = statistics.fmean(pipe["fwd"]) + statistics.fmean(pipe["bwd"])
    if busy + wait <= 0:
        return None
    return PipelineWait(wait, wait / (busy + wait), bubble_fraction(setup.pp, setup.gas), names)


def untimed_pipeline_work(
    other_ms: float, setup: RunSetup, cplan: comm.CommPlan | None
) -> tuple[str, float | None]:
    """What the PipelineEngine does outside every timer, in words, and the busbw (Gbit/s) the
    untimed time implies if it were all those collectives (None when it cannot be said).

    ``TrainSchedule`` runs, after the last backward, ``ReduceTiedGrads``
    (``_exec_reduce_tied_grads``: all-reduce of the tied word-embedding gradient between the
    first and the last stage) and ``ReduceGrads`` (``_exec_reduce_grads``: the data-parallel
    gradient all-reduce, ``allreduce_gradients``), neither timed; ``train_batch`` then
    aggregates the loss (``_aggregate_total_loss``: a broadcast from the last stage).
    """
    parts = []
    colls = []
    if cplan is not None:
        colls = [c for c in cplan.collectives if c.group == "tied-embedding"]
        colls += [c for c in cplan.collectives if c.group == "dp" and c.purpose == "gradients"]
    for c in colls:
        where = "_exec_reduce_tied_grads" if c.group == "tied-embedding" else "_exec_reduce_grads"
        parts.append(
            f"{c.purpose} {c.op.replace('_', '-')} ({where}, {c.size_bytes / 1e6:,.1f} MB, "
            f"{c.wire_bytes_per_rank / 1e6:,.1f} MB on the wire per rank, {c.link})"
        )
    if not colls:
        parts.append(
            "the tied-embedding gradient all-reduce (_exec_reduce_tied_grads; bytes unknown: "
            "model dimensions or vocabulary unknown)"
        )
    text = "untimed: " + "; ".join(parts) + "; the loss broadcast (_aggregate_total_loss)"
    wire = sum(c.wire_bytes_per_rank * c.count_per_iter for c in colls)
    if not colls or other_ms <= 0:
        return text, None
    bw = comm.gbps(wire, other_ms)
    return text + (f"; if the {other_ms:,.1f} ms were all of it: {bw:.3f} Gbit/s bus bandwidth"), bw


@dataclass(frozen=True)
class Breakdown:
    """Where one iteration's time goes (ms per iteration); parts sum to the iteration time."""

    forward_ms: float | None = None
    """Forward compute (DeepSpeed ``fwd``; includes ZeRO-3 parameter gathers and TP all-reduces
    issued inside forward)."""
    backward_ms: float | None = None
    """Backward compute (``bwd_inner``)."""
    forward_backward_ms: float | None = None
    """Forward + backward when only a combined timer exists (Megatron ``forward-backward``)."""
    optimizer_ms: float | None = None
    """Optimizer (``step`` minus ``optimizer_allgather``; or Megatron ``optimizer``)."""
    communication_ms: float | None = None
    """Separately timed communication (``bwd_allreduce`` + ``optimizer_allgather``)."""
    data_ms: float | None = None
    """Loading and broadcasting micro-batches (PipelineEngine ``batch_input``)."""
    pipeline_wait_ms: float | None = None
    """Blocking pipeline sends and receives of the first stage (PipelineEngine ``pipe_*``)."""
    other_ms: float | None = None
    """Iteration time not covered by any timer (data loading, bookkeeping, untimed comm);
    never below zero (see ``other_na``)."""
    other_na: str | None = None
    """Why ``other_ms`` is None or 0 when the timers sum to more than the iteration time."""
    sources: dict[str, str] = field(default_factory=dict)
    """Part -> timers that fed it."""


def half_width(values: Sequence[float]) -> float:
    """Half-width of the 95% t-interval of the mean of ``values`` (0 for fewer than 2)."""
    n = len(values)
    if n < 2:
        return 0.0
    return t95(n - 1) * sample_std(values) / math.sqrt(n)


def breakdown(
    iter_ms: float,
    setup: RunSetup,
    ds: dict[str, list[float]],
    mg: dict[str, list[float]],
    pipe: dict[str, list[float]] | None = None,
    iter_half: float = 0.0,
) -> tuple[Breakdown | None, str | None]:
    """Breakdown from the PipelineEngine's timers (``pipe``, already per iteration), else
    DeepSpeed per-step timers, else Megatron's; ``other`` = iteration - timers.

    Each source combines its ranks one way for every part: DeepSpeed's engine and the
    PipelineEngine print rank 0's timers (the first stage), Megatron's ``minmax`` timers are
    read at their max over ranks. ``other`` below zero by more than its noise (the 95%
    half-widths of the iteration mean, ``iter_half``, and of every timer's mean, in
    quadrature) is not a time: None, with the reason in ``Breakdown.other_na``; within the
    noise it is 0 (with the same note).
    """
    noise: list[float] = [iter_half]

    def mean(name: str, pool: dict[str, list[float]]) -> float:
        if not pool.get(name):
            return 0.0
        noise.append(half_width(pool[name]))
        return statistics.fmean(pool[name])

    pipe = pipe or {}
    if {"fwd", "bwd", "step"} <= pipe.keys():
        waits = [n for n in PIPE_WAIT_TIMERS if pipe.get(n)]
        parts = {
            "forward_ms": mean("fwd", pipe),
            "backward_ms": mean("bwd", pipe),
            "optimizer_ms": mean("step", pipe),
        }
        sources = {
            "forward_ms": "PipelineEngine fwd / steps_per_print (first stage)",
            "backward_ms": "PipelineEngine bwd / steps_per_print (first stage)",
            "optimizer_ms": "PipelineEngine step / steps_per_print",
        }
        if pipe.get("batch_input"):
            parts["data_ms"] = mean("batch_input", pipe)
            sources["data_ms"] = "PipelineEngine batch_input / steps_per_print"
        if waits:
            parts["pipeline_wait_ms"] = sum(mean(n, pipe) for n in waits)
            sources["pipeline_wait_ms"] = f"PipelineEngine {' + '.join(waits)} / steps_per_print"
    elif {"fwd", "bwd_inner", "step"} <= ds.keys():
        gather = mean("optimizer_allgather", ds)
        parts = {
            "forward_ms": mean("fwd", ds),
            "backward_ms": mean("bwd_inner", ds),
            "communication_ms": mean("bwd_allreduce", ds) + gather,
            "optimizer_ms": mean("step", ds) - gather,
        }
        sources = {
            "forward_ms": "deepspeed fwd",
            "backward_ms": "deepspeed bwd_inner",
            "communication_ms": "deepspeed bwd_allreduce"
            + (" + optimizer_allgather" if gather else ""),
            "optimizer_ms": "deepspeed step" + (" - optimizer_allgather" if gather else ""),
        }
    elif "forward-backward" in mg:
        parts = {"forward_backward_ms": mean("forward-backward", mg)}
        parts["optimizer_ms"] = mean("optimizer", mg)
        sources = {
            "forward_backward_ms": "megatron forward-backward (max over ranks)",
            "optimizer_ms": "megatron optimizer (max over ranks)",
        }
    else:
        reason = "no step timers in the logs"
        if (setup.pp or 1) > 1:
            reason += (
                " (PP>1: Megatron prints no step timer and DeepSpeed's PipelineEngine prints "
                "its timers only with wall_clock_breakdown, which DeepSpeed 0.19.6 rejects "
                "with PP; none in this log)"
            )
        elif setup.wall_clock_breakdown is False:
            reason += " (DeepSpeed wall_clock_breakdown off, Megatron timing-log-level 0)"
        return None, reason
    other: float | None = iter_ms - sum(parts.values())
    sources["other_ms"] = "iteration time - sum of the timers: not covered by any timer"
    why = None
    spread = math.sqrt(math.fsum(x * x for x in noise))
    if other is not None and other < 0:
        over = f"the timers sum to {iter_ms - other:,.1f} ms, {-other:,.1f} ms more than the "
        over += f"{iter_ms:,.1f} ms iteration (noise ±{spread:,.1f} ms, 95%)"
        if -other > spread:
            why = over + (
                ": timers and iteration time disagree (a timer overlapping another, or "
                "counted on a slower rank than the iteration line): no remainder"
            )
            other = None
        else:
            why = over + ": within the noise, shown as 0"
            other = 0.0
    return Breakdown(**parts, other_ms=other, other_na=why, sources=sources), None
