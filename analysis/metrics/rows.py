"""Per-run metrics: steady-state time, throughput, FLOPs, memory, breakdown, volume, bandwidth.

One ``RunMetrics`` row per run; ``SCHEMA`` is the column -> dtype contract of the DataFrame,
summary.json and summary.csv (units in column names: ``_ms``, ``_mb`` = MiB, ``_gbps`` = Gbit/s,
``_per_s``). A figure the logs cannot support is ``None`` and ``na_reasons[column]`` says why.

Steady-state rule (``STEADY_RULE``, ``formulas.steady_split``): Megatron iteration lines are
means over ``log_interval`` iterations; the first logged window, and the following ones far
above the later windows' median, are warm-up (graph build, compilation, allocator, data loader,
first communicator set-up) and are dropped; later windows as far above it are pauses
(checkpoint save, evaluation) and are left out; the remaining windows are the samples. The
timers (DeepSpeed per-step lines, one per iteration on the plain engine, and Megatron's) leave
out the same iterations, and give the per-iteration spread.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

import numpy as np

from analysis.metrics import hardware
from analysis.metrics.stats import Stats, describe, sample_std
from analysis.metrics.timers import (
    Breakdown,
    breakdown,
    deepspeed_step_timers,
    megatron_timers,
    pipeline_timers,
    pipeline_wait,
    untimed_pipeline_work,
)
from analysis.parse.records import ParsedRun, blocks_of, int_values, record_values
from analysis.runs.identity import identity
from analysis.runs.load import LoadedRun
from analysis.runs.problems import Problem
from analysis.runs.record import RunRecord
from analysis.runs.tensorboard import MEMORY_NA, TFLOPS_NA
from analysis.theory import comm
from analysis.theory.formulas import (
    flops_per_iteration,
    forward_passes,
    gpt_parameters,
    steady_split,
    zero_state_bytes,
)
from analysis.theory.setup import RunSetup

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class SteadyState:
    """Iteration time over the steady-state window, with the iterations that fed it."""

    stats: Stats
    """Statistics of the window means (ms per iteration)."""
    source: str
    """``megatron`` iteration lines or ``pipeline`` PipelineEngine ``steps:`` lines."""
    window: int
    """Iterations per window."""
    first_iteration: int
    """First iteration inside the steady-state window."""
    last_iteration: int
    """Last iteration inside it."""
    dropped: str
    """What was dropped and why."""
    warmup_iterations: tuple[int, ...] = ()
    """Iteration (or step) number closing each window dropped as warm-up."""
    pause_iterations: tuple[int, ...] = ()
    """Iteration number closing each window kept out of the mean as a pause."""

    @property
    def pause_ranges(self) -> list[tuple[int, int]]:
        """(first, last) iteration of each pause window, for the timers to leave out too."""
        return [(end - self.window + 1, end) for end in self.pause_iterations]

    @property
    def iterations_text(self) -> str:
        """``iterations 6-30 (5 windows of 5)``."""
        pauses = (
            f", {len(self.pause_iterations)} pause(s) left out" if self.pause_iterations else ""
        )
        return (
            f"iterations {self.first_iteration}-{self.last_iteration} "
            f"({self.stats.n} windows of {self.window}, {self.source}{pauses})"
        )


def _numbers_text(numbers: Sequence[int]) -> str:
    """``1, 2, 3`` or, for more than six, ``1, 2, ..., 40 (12 windows)``."""
    if len(numbers) <= 6:
        return ", ".join(f"{n}" for n in numbers)
    return f"{numbers[0]}, {numbers[1]}, ..., {numbers[-1]} ({len(numbers)} windows)"


def wire_bytes(record: RunRecord | None) -> tuple[float | None, str]:
    """Bytes per steady-state iteration on the busiest node's interface, from run.json.

    The executor samples the interface counters of an emulated cluster at the iteration lines
    (launchers.lab.session.LabSession.ground_truth); on a real cluster nothing counts them.
    """
    network = record.network if record else None
    if network is None:
        return None, "no interface counters (not run on the emulated cluster)"
    per = network.per_iteration
    if not isinstance(per, dict) or not isinstance(per.get("max_tx_bytes"), int | float):
        return None, str(network.per_iteration_reason or "no per-iteration counters")
    return float(per["max_tx_bytes"]), ""


def _series(
    records: Sequence[Any], number: str, name: str, by_value: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """(numbers, values) of the records that have the value, by number (stable; ``by_value``:
    then by value), as arrays (a log-interval-1 run holds millions)."""
    numbers = record_values(records, number)
    values = record_values(records, name)
    keep = ~np.isnan(values)
    numbers, values = numbers[keep], values[keep]
    order = np.lexsort((values, numbers)) if by_value else np.argsort(numbers, kind="stable")
    return numbers[order].astype(np.int64), values[order]


def steady_state(parsed: ParsedRun) -> tuple[SteadyState | None, str | None]:
    """Apply ``STEADY_RULE`` (:func:`formulas.steady_split`) to Megatron iteration lines, else
    to PipelineEngine step lines: warm-up windows and pauses dropped, with the reason."""
    numbers, ms = _series(parsed.iterations, "iteration", "elapsed_ms")
    source = "megatron"
    if not len(numbers):
        numbers, ms = _series(parsed.pipeline_steps, "step", "iter_ms", by_value=True)
        source = "pipeline"
    if not len(numbers):
        return None, "no iteration timing line in the logs"
    first = int(numbers[0])
    if len(numbers) < 2:
        return None, f"only the warm-up window (iteration {first}) was logged: no steady state"
    split = steady_split(ms)
    warm = tuple(int(x) for x in numbers[: split.start])
    pauses = tuple(int(numbers[i]) for i in split.pauses)
    stats = describe(split.select(ms))
    dropped = f"window ending at iteration {first} (warm-up: the first window, always)"
    if split.threshold is not None:
        bound = (
            f"{split.threshold:,.1f} ms = median {split.median:,.1f} ms of the later windows "
            "+ 3.5 scaled MADs"
        )
        if len(warm) > 1:
            dropped = (
                f"windows ending at iterations {_numbers_text(warm)} (warm-up: the first "
                f"window, and the following ones above {bound}: {ms[1]:,.1f} ms"
                + (f" ... {ms[split.start - 1]:,.1f} ms" if split.start > 2 else "")
                + ")"
            )
        if split.capped:
            dropped += (
                "; the times were still above the bound at the cap (a third of the windows): "
                "a drift, not cut further"
            )
        if pauses:
            dropped += (
                f"; pauses left out of the mean (checkpoint, evaluation or a stall: above {bound})"
                f": windows ending at iterations {_numbers_text(pauses)} ("
                + ", ".join(f"{ms[i]:,.1f}" for i in split.pauses[:6])
                + (" ..." if len(pauses) > 6 else "")
                + " ms)"
            )
    kept = numbers[split.start :]
    return (
        SteadyState(
            stats=stats,
            source=source,
            window=int(numbers[1]) - first,
            first_iteration=int(numbers[split.start - 1]) + 1,
            last_iteration=int(kept[-1]) if len(kept) else int(numbers[-1]),
            dropped=dropped,
            warmup_iterations=warm,
            pause_iterations=pauses,
        ),
        None,
    )


def num_parameters(s: RunSetup) -> int | None:
    """Parameters of one model replica (:func:`formulas.gpt_parameters`), or None when the
    model's dimensions or padded vocabulary are unknown."""
    dims = (s.num_layers, s.hidden_size, s.positions, s.padded_vocab_size)
    if None in dims:
        return None
    norm = s.normalization or "layernorm"
    return gpt_parameters(*dims, norm, ffn=s.ffn_hidden_size)  # type: ignore[arg-type]


def tflops_per_gpu(flops: float, iter_ms: float, world_size: int) -> float:
    """TFLOP/s per rank = FLOPs / (t * N * 1e12), t in seconds (as upstream prints it)."""
    return flops / (iter_ms / 1000.0 * world_size * 1e12)


@dataclass(frozen=True)
class RunMetrics:
    """One row of the report: every figure for one run (None = not derivable, see na_reasons)."""

    name: str
    """Run name."""
    path: str
    """Where the run was found, relative to LOGDIR."""
    model: str | None
    """Model preset or custom name."""
    strategy: str | None
    """Strategy name."""
    setup_key: str
    """Comparison group: model / nodes x ranks / network."""
    status: str
    """completed, failed, incomplete, interrupted, running."""
    failure_kind: str | None
    """Failure kind when not completed."""
    failure_reason: str | None
    """Failure message."""
    nodes: int | None
    """Machines."""
    world_size: int | None
    """Ranks."""
    tp: int | None
    """Tensor-parallel size."""
    pp: int | None
    """Pipeline-parallel size."""
    dp: int | None
    """Data-parallel size."""
    zero_stage: int | None
    """ZeRO stage."""
    gas: int | None
    """Gradient-accumulation steps (micro-batches per step per replica)."""
    micro_batch_size: int | None
    """Micro-batch size."""
    global_batch_size: int | None
    """Global batch size (samples per iteration)."""
    seq_length: int | None
    """Tokens per sample."""
    precision: str | None
    """fp32/fp16/bf16."""
    device: str | None
    """cpu or cuda."""
    link_mbit: float | None
    """Inter-node link, Mbit/s."""
    num_parameters: int | None
    """Parameters from the formula l(4h^2 + 2fh + f + 9h) + Vh + sh + 2h (f the FFN size)."""
    iter_ms_mean: float | None
    """Mean ms per iteration over the steady-state windows."""
    iter_ms_median: float | None
    """Median of the steady-state window means."""
    iter_ms_std: float | None
    """Per-iteration spread, ms (source in iter_ms_std_source)."""
    iter_ms_std_source: str | None
    """What the spread was computed from."""
    iter_ms_ci95_lo: float | None
    """95% t-interval of the mean iteration time, lower bound, ms."""
    iter_ms_ci95_hi: float | None
    """Upper bound."""
    iter_ms_n: int | None
    """Number of steady-state windows."""
    steady_iterations: str | None
    """Which iterations fed the time (and from which lines)."""
    steady_dropped: str | None
    """Which iterations were left out of the steady state (warm-up, pauses) and why."""
    warmup_iterations: list[int] | None
    """Iteration closing each window dropped as warm-up."""
    pause_iterations: list[int] | None
    """Iteration closing each window left out of the mean as a pause (checkpoint, evaluation)."""
    samples_per_s: float | None
    """Global batch / mean iteration time."""
    tokens_per_s: float | None
    """samples_per_s * seq_length."""
    tflops: float | None
    """Recomputed TFLOP/s per rank from the spec and the mean iteration time, as Megatron-DeepSpeed
    counts them (``throughput_calculator``: the recomputed forward included)."""
    tflops_printed: float | None
    """Mean of the TFLOPs Megatron printed over the steady windows (2 decimals)."""
    tflops_check: str | None
    """Recomputed vs printed."""
    peak_mem_mb: float | None
    """Max over ranks and nodes of ``max allocated``, MiB."""
    peak_reserved_mb: float | None
    """Max over ranks of ``max reserved``, MiB."""
    provenance: str | None
    """What ran, from run.json: upstream's commit, versions, GPUs, warnings (``describe``)."""
    peak_mem_is_peak: bool | None
    """Whether ``peak_mem_mb`` is an allocator's peak (``max allocated``); False: the largest
    current allocation recorded (TensorBoard's ``mem-allocated-bytes``), a lower bound of it."""
    mem_kind: str | None
    """What the memory figure measures (tensor memory, or process RSS on CPU)."""
    model_state_mb: float | None
    """Adam model state per rank of this strategy, MiB: ``formulas.zero_state_bytes`` of the
    busiest rank's parameters (16 Psi for DP, 4 Psi + 12 Psi / N for ZeRO-1 ... in fp16/bf16)."""
    mem_saving_pct: float | None
    """(baseline peak - peak) / baseline peak * 100, same setup."""
    speedup: float | None
    """Baseline mean iteration time / this run's, same setup."""
    speedup_ci95_lo: float | None
    """95% interval of the speedup (delta method on the log ratio, Welch df)."""
    speedup_ci95_hi: float | None
    """Upper bound."""
    baseline: str | None
    """Name of the reference run the ratios use (always a completed run)."""
    baseline_why: str | None
    """Why that run is the reference of its group (see ``choose_reference``)."""
    last_iteration: int | None
    """Last iteration the logs show (Megatron iteration line, else PipelineEngine step)."""
    train_iters: int | None
    """Iterations the run was asked to train."""
    fwd_ms: float | None
    """Forward, ms per iteration."""
    bwd_ms: float | None
    """Backward compute, ms per iteration."""
    fwd_bwd_ms: float | None
    """Forward + backward when only combined."""
    optimizer_ms: float | None
    """Optimizer, ms per iteration."""
    comm_ms: float | None
    """Separately timed communication, ms per iteration."""
    other_ms: float | None
    """Not covered by any timer, ms per iteration."""
    data_ms: float | None
    """Loading and broadcasting micro-batches, ms per iteration (PipelineEngine ``batch_input``)."""
    pipe_wait_ms: float | None
    """The first stage's blocking pipeline sends and receives, ms per iteration (PipelineEngine
    ``pipe_send_output + pipe_recv_grad``, plus ``pipe_send_grad + pipe_recv_input`` where
    printed): transfer time plus waiting for the neighbouring stage."""
    pipe_wait_share: float | None
    """``pipe_wait_ms / (fwd_ms + bwd_ms + pipe_wait_ms)``: measured idle share of the pipelined
    part of the iteration."""
    pipe_bubble_theory: float | None
    """(p-1)/(m+p-1), p stages and m micro-batches per step: the idle share with balanced
    stages (GPipe/1F1B)."""
    other_named: str | None
    """What DeepSpeed does in the untimed remainder of a pipeline iteration, with its bytes."""
    other_busbw_gbps: float | None
    """Bus bandwidth, Gbit/s, that ``other_ms`` implies if it were all the untimed collectives
    named in ``other_named`` (an upper bound on their time, so a lower bound on the busbw)."""
    breakdown_sources: dict[str, str] | None
    """Part -> timers that fed it."""
    comm_bytes_per_iter: float | None
    """Bytes the busiest rank sends per iteration, from the spec (analysis.theory.comm)."""
    comm_bytes_dp: float | None
    """Of which data-parallel (gradients/parameters)."""
    comm_bytes_pp: float | None
    """Of which pipeline p2p and tied embedding."""
    comm_bytes_tp: float | None
    """Of which tensor-parallel activations."""
    collectives: list[dict[str, Any]] | None
    """Per-collective list: op, purpose, size_bytes, count_per_iter, group, group_size, link,
    wire_bytes_per_rank, source."""
    wire_bytes_per_iter: float | None
    """Ground truth: bytes the busiest node's interface sent per steady-state iteration
    (run.json ``network.per_iteration``, interface counters of an emulated cluster; includes
    Ethernet/IP/TCP headers)."""
    wire_over_model: float | None
    """``wire_bytes_per_iter / comm_bytes_per_iter``: how well the byte model matches the wire."""
    busbw_gbps_timers: float | None
    """Gradient all-reduce busbw from bytes / ``bwd_allreduce`` time, Gbit/s."""
    busbw_gbps_timers_allgather: float | None
    """Parameter all-gather busbw from bytes / ``optimizer_allgather`` time, Gbit/s."""
    busbw_gbps_inferred: float | None
    """Extra bytes / extra time over a compute-identical reference run, Gbit/s."""
    busbw_inferred_warning: str | None
    """Set when the inferred figure is not a network bandwidth: the extra time is well above
    what the bytes take on the link (measured busbw, or the link rate), so host-side costs of
    the extra collectives (reduction, copies, ZeRO bookkeeping) dominate it."""
    busbw_gbps_measured: float | None
    """netbench.json busbw at the nearest message size, Gbit/s."""
    predicted_iter_ms: float | None = None
    """Leave-one-out prediction of ``iter_ms_mean`` from the other runs (analysis.predict)."""
    prediction_error: float | None = None
    """(predicted - measured) / measured, signed (analysis.predict leave-one-out)."""
    spec_hash: str | None = None
    """run.json ``spec_hash``: runs of one setup group with the same name and hash are repeats
    of one spec (analysis.metrics.repeats)."""
    repeat_group: str | None = None
    """run.json ``repeat.group``: the repeated matrix the run was a round of."""
    repeat_round: int | None = None
    """run.json ``repeat.round`` (1-based)."""
    na_reasons: dict[str, str] = field(default_factory=dict)
    """Column -> why it is None (or why it should be read with care)."""
    since_last_write_s: float | None = None
    """Running or cut runs: seconds from the last write of the log files to the report (the
    wall time since the last line when the log is still being written)."""
    event_files: list[str] = field(default_factory=list)
    """The run's TensorBoard event files (upstream's ``--tensorboard-dir``), relative to LOGDIR;
    the run's figures come from them when it has no log file."""
    gpu: str | None = None
    """GPU model of the peak table (``H100 SXM``), from run.json or ``--gpu``."""
    peak_tflops: float | None = None
    """Dense peak TFLOP/s per GPU for the run's dtype (analysis.theory.hardware)."""
    peak_label: str | None = None
    """What MFU is out of: ``989 TFLOP/s dense bf16, H100 SXM``."""
    tflops_model: float | None = None
    """TFLOP/s per rank of the model's own FLOPs: ``tflops`` without the recomputed forward (x 3/4
    with full recompute), MFU's numerator."""
    mfu: float | None = None
    """Model FLOPs utilisation, percent: ``tflops_model / peak_tflops * 100`` (metrics.hardware;
    PaLM's definition: recomputation is not counted)."""
    hfu: float | None = None
    """Hardware FLOPs utilisation, percent: ``tflops / peak_tflops * 100`` (recomputation
    counted); equal to ``mfu`` without recompute."""
    mfu_printed: float | None = None
    """Megatron's printed TFLOPs (``tflops_printed``) over the same peak, percent: an HFU for
    Megatron-DeepSpeed, which counts the recomputed forward."""
    mem_per_rank: list[dict[str, Any]] | None = None
    """Per rank: ``rank``, ``allocated_mb`` and ``reserved_mb`` peaks (MiB), ``after_iteration``."""
    problems: list[Problem] = field(default_factory=list)
    """Loading/parsing problems of this run (summary.json gives their messages)."""


SCHEMA: dict[str, str] = {
    f.name: (
        "string"
        if f.type in ("str", "str | None")
        else "Int64"
        if f.type == "int | None"
        else "float64"
        if f.type in ("float | None", "float")
        else "object"
    )
    for f in fields(RunMetrics)
}
"""Column -> pandas dtype of the one DataFrame (derived from ``RunMetrics``)."""


def _last_number(records: Sequence[Any], name: str) -> int | None:
    """The largest iteration (or step) number of the records, None when there is none."""
    numbers = int_values(records, name)
    if not len(numbers):
        return None
    return int(numbers.max()) if isinstance(numbers, np.ndarray) else max(numbers)


def compute(run: LoadedRun) -> RunMetrics:
    """All per-run figures (cross-run ones, speedup and inferred bandwidth, are None here)."""
    s, p = run.setup, run.parsed
    na: dict[str, str] = {}
    row: dict[str, Any] = {
        "name": run.name,
        "path": run.path,
        "event_files": list(run.event_files),
        "model": s.model,
        "strategy": s.strategy,
        "setup_key": s.setup_key,
        "status": run.status,
        "failure_kind": run.failure_kind,
        "failure_reason": run.failure_reason,
        "nodes": s.nodes,
        "world_size": s.world_size,
        "tp": s.tp,
        "pp": s.pp,
        "dp": s.dp,
        "zero_stage": s.zero_stage,
        "gas": s.gas,
        "micro_batch_size": s.micro_batch_size,
        "global_batch_size": s.global_batch_size,
        "seq_length": s.seq_length,
        "precision": s.precision,
        "device": s.device,
        "link_mbit": s.link_mbit,
        "train_iters": s.train_iters,
        "problems": list(run.problems),
    }
    row |= {f.name: None for f in fields(RunMetrics) if f.name not in row}
    row["na_reasons"] = na
    row |= identity(run.record, s)
    if run.record is not None and run.record.provenance is not None:
        row["provenance"] = run.record.provenance.describe() or None

    dims = (s.num_layers, s.hidden_size, s.positions, s.padded_vocab_size)
    row["num_parameters"] = num_parameters(s)
    if row["num_parameters"] is None:
        na["num_parameters"] = "model dimensions or padded vocabulary unknown"
    elif s.zero_stage is not None and s.dp:
        psi = comm.rank_parameters(s)
        state = zero_state_bytes(psi, s.zero_stage, s.dp, s.precision or "fp32")
        row["model_state_mb"] = state / 2**20
    else:
        na["model_state_mb"] = "ZeRO stage or data-parallel size unknown"

    cplan, why = comm.plan(s)
    if cplan is not None:
        row["comm_bytes_per_iter"] = cplan.bytes_per_iter
        row["comm_bytes_dp"] = cplan.bytes_for(group="dp")
        row["comm_bytes_pp"] = cplan.bytes_for(group="pp") + cplan.bytes_for(group="tied-embedding")
        row["comm_bytes_tp"] = cplan.bytes_for(group="tp")
        row["collectives"] = [
            {
                "op": c.op,
                "purpose": c.purpose,
                "size_bytes": c.size_bytes,
                "count_per_iter": c.count_per_iter,
                "group": c.group,
                "group_size": c.group_size,
                "link": c.link,
                "wire_bytes_per_rank": c.wire_bytes_per_rank,
                "source": c.source,
            }
            for c in cplan.collectives
        ]
    else:
        na["comm_bytes_per_iter"] = why or "unknown"
    wire, why_wire = wire_bytes(run.record)
    row["wire_bytes_per_iter"] = wire
    if wire is None:
        na["wire_bytes_per_iter"] = why_wire
    elif row.get("comm_bytes_per_iter"):
        row["wire_over_model"] = wire / row["comm_bytes_per_iter"]

    if run.status in ("incomplete", "running") and run.last_write is not None:
        row["since_last_write_s"] = max(0.0, time.time() - run.last_write)
    if p is None:
        na["iter_ms_mean"] = "no log"
        return RunMetrics(**row)
    row["last_iteration"] = _last_number(p.iterations, "iteration")
    if row["last_iteration"] is None:
        row["last_iteration"] = _last_number(p.pipeline_steps, "step")

    steady, why = steady_state(p)
    if steady is None:
        na["iter_ms_mean"] = why or "no timing"
        if run.status != "completed":
            na["iter_ms_mean"] += f"; run {run.status}"
    peak, reserved, mem_rank, mem_after, is_max = hardware.peak_memory(p)
    row["peak_mem_mb"], row["peak_reserved_mb"] = peak, reserved
    row["peak_mem_is_peak"] = is_max if peak is not None else None
    from_events = bool(run.event_files) and not run.log_files  # (read from TensorBoard)
    if peak is None and from_events:
        na["peak_mem_mb"] = MEMORY_NA
    elif peak is None:
        na["peak_mem_mb"] = "no memory report in the logs (printed after the first log interval)"
    else:
        on_cpu = s.device == "cpu"
        row["mem_kind"] = (
            "process RSS (CPU accelerator: not tensor memory)"
            if on_cpu
            else "accelerator allocator (tensor memory)"
        )
        when = f"after iteration {mem_after}" if mem_after else "once"
        if is_max:
            what = f"max over ranks of 'max allocated' (rank {mem_rank}), printed {when} only"
        else:  # (TensorBoard's mem-allocated-bytes, or reports without a 'max allocated')
            where = "TensorBoard's mem-allocated-bytes" if from_events else "the memory reports"
            what = (
                f"the largest current allocation in {where} "
                f"(rank {'not recorded' if mem_rank is None else mem_rank}, {when}): no "
                "allocator peak ('max allocated') was recorded, so the peak is at least this"
            )
            if not on_cpu:
                row["mem_kind"] += ", current at the reports: the peak is at least this"
        na["peak_mem_mb"] = f"{what}; logs print 'MB' = bytes/1024^2 (MiB)" + (
            "; on CPU DeepSpeed's accelerator reports psutil RSS of the process "
            "(deepspeed/accelerator/cpu_accelerator.py memory_allocated)"
            if on_cpu
            else ""
        )
    if steady is None:
        return RunMetrics(**row)

    st = steady.stats
    row |= {
        "iter_ms_mean": st.mean,
        "iter_ms_median": st.median,
        "iter_ms_ci95_lo": st.ci_lo,
        "iter_ms_ci95_hi": st.ci_hi,
        "iter_ms_n": st.n,
        "steady_iterations": steady.iterations_text,
        "steady_dropped": steady.dropped,
        "warmup_iterations": list(steady.warmup_iterations),
        "pause_iterations": list(steady.pause_iterations),
    }
    if st.n < 2:
        na["iter_ms_ci95_lo"] = "fewer than 2 steady-state windows: no interval"
    warmup = steady.first_iteration - 1  # the timers over the same iterations as the time
    ds = deepspeed_step_timers(p, warmup, steady.pause_ranges)
    mg = megatron_timers(p, warmup, steady.pause_ranges)
    if ds.get("fwd") and ds.get("step"):
        parts = [np.asarray(ds["fwd"]), np.asarray(ds.get("bwd", ds.get("bwd_inner", []))),
                 np.asarray(ds["step"])]  # fmt: skip
        n = min(len(x) for x in parts)
        per_iter = (parts[0][:n] + parts[1][:n]) + parts[2][:n]  # as (a + b) + c per iteration
        if len(per_iter) >= 2:
            row["iter_ms_std"] = sample_std(per_iter)
            row["iter_ms_std_source"] = (
                f"std of per-iteration DeepSpeed fwd+bwd+step over {len(per_iter)} iterations "
                "(timed part of each iteration)"
            )
    if row["iter_ms_std"] is None and st.std is not None:
        row["iter_ms_std"] = st.std
        row["iter_ms_std_source"] = (
            f"std of {st.n} window means ({steady.window} iterations each): understates "
            "per-iteration spread"
        )
    if row["iter_ms_std"] is None:
        na["iter_ms_std"] = "fewer than 2 samples"

    if s.global_batch_size:
        row["samples_per_s"] = s.global_batch_size / (st.mean / 1000.0)
        if s.seq_length:
            row["tokens_per_s"] = row["samples_per_s"] * s.seq_length
    else:
        na["samples_per_s"] = "global batch size unknown"

    if None not in dims and s.seq_length and s.global_batch_size and s.world_size:
        layers, h, _, v = dims
        flops = flops_per_iteration(
            s.global_batch_size,
            s.seq_length,
            layers,
            h,
            v,
            s.ffn_hidden_size,
            bool(s.activation_checkpointing),
        )  # type: ignore[arg-type]
        row["tflops"] = tflops_per_gpu(flops, st.mean, s.world_size)
        row["tflops_model"] = row["tflops"] * 3 / forward_passes(bool(s.activation_checkpointing))
    else:
        na["tflops"] = "model dimensions, padded vocabulary, batch or world size unknown"
    tf, el = record_values(p.iterations, "tflops"), record_values(p.iterations, "elapsed_ms")
    numbers = record_values(p.iterations, "iteration")
    sel = ~np.isnan(tf) & ~np.isnan(el) & (el != 0) & (numbers >= steady.first_iteration)
    sel &= ~np.isin(numbers, steady.pause_iterations)  # (the windows the time was taken over)
    tf_w, el_w = tf[sel], el[sel]  # (the windows' printed TFLOPs and elapsed time)
    if not len(tf_w) and from_events:
        na["tflops_printed"] = TFLOPS_NA
    if len(tf_w):
        row["tflops_printed"] = math.fsum(tf_w) / len(tf_w)
        if row["tflops"] is not None:
            # Window by window: recompute from that window's time, compare with the printed
            # value, which Megatron rounds to 2 decimals (+-0.005).
            worst = float(np.max(np.abs(row["tflops"] * st.mean / el_w - tf_w)))
            row["tflops_check"] = (
                f"agrees in all {len(tf_w)} windows within print rounding (0.005)"
                if worst <= 0.005 + 1e-9
                else f"differs by up to {worst:.3g} TFLOP/s in a window"
            )
    pipe = _pipeline_pool(p, s, na)
    iter_half = 0.0 if st.ci_hi is None else st.ci_hi - st.mean
    bd, why = breakdown(st.mean, s, ds, mg, pipe, iter_half)
    if bd is None:
        na["fwd_ms"] = na.get("fwd_ms") or why or "no timers"
    else:
        row |= {
            "fwd_ms": bd.forward_ms,
            "bwd_ms": bd.backward_ms,
            "fwd_bwd_ms": bd.forward_backward_ms,
            "optimizer_ms": bd.optimizer_ms,
            "comm_ms": bd.communication_ms,
            "data_ms": bd.data_ms,
            "other_ms": bd.other_ms,
            "breakdown_sources": bd.sources,
        }
        if bd.other_na:
            na["other_ms"] = bd.other_na
        if bd.pipeline_wait_ms is not None:
            _pipeline_figures(row, s, pipe, cplan, bd, na)
        if (s.zero_stage or 0) == 3:
            na["comm_ms"] = (
                "ZeRO-3 gathers parameters inside forward/backward: that time is in fwd/bwd"
            )
        if (s.tp or 1) > 1:
            na["comm_ms"] = "TP all-reduces run inside forward/backward: that time is in fwd/bwd"
        if s.dp == 1 and (s.tp or 1) * (s.pp or 1) == 1 and bd.communication_ms is not None:
            na["comm_ms"] = (
                "dp = 1: the gradient all-reduce exchanges nothing; this is the time of "
                "DeepSpeed's reduction path on one rank (bucketing, averaging, copies)"
            )

    _timer_bandwidth(row, s, cplan, ds, na)
    _measured_bandwidth(row, run, cplan, na)
    return RunMetrics(**row)


def _pipeline_pool(p: ParsedRun, s: RunSetup, na: dict[str, str]) -> dict[str, list[float]]:
    """PipelineEngine timers per iteration, or {} (with the reason) when none can be used."""
    if next(blocks_of(p.timers, "pipeline"), None) is None:
        return {}
    if s.steps_per_print is None:
        na["fwd_ms"] = (
            "PipelineEngine timers printed, but their totals cover steps_per_print steps and "
            "that is unknown (no DeepSpeed config, no config dump in the log, fewer than two "
            "'steps:' lines to count): not divided, not shown"
        )
        return {}
    pool = pipeline_timers(p, s.steps_per_print)
    if not pool:
        na["fwd_ms"] = "only the first (warm-up) print of the PipelineEngine timers"
    return pool


def _pipeline_figures(
    row: dict[str, Any],
    s: RunSetup,
    pipe: dict[str, list[float]],
    cplan: comm.CommPlan | None,
    bd: Breakdown,
    na: dict[str, str],
) -> None:
    """Pipeline wait beside the bubble theory, and the untimed remainder named."""
    n = len(pipe.get("fwd", []))
    spp_src = s.sources.get("steps_per_print", "?")
    sources = dict(bd.sources)
    sources["steps_per_print"] = (
        f"{s.steps_per_print} ({spp_src}); {n} print(s) after the warm-up print; printed by "
        "global rank 0 (first stage) only"
    )
    row["breakdown_sources"] = sources
    row["pipe_wait_ms"] = bd.pipeline_wait_ms
    wait = pipeline_wait(pipe, s)
    if wait is not None:
        row["pipe_wait_share"] = wait.share
        row["pipe_bubble_theory"] = wait.theory
        na["pipe_wait_ms"] = wait.text
    else:
        na["pipe_wait_share"] = "pipeline stages or micro-batches per step unknown"
    if bd.other_ms is not None:
        row["other_named"], row["other_busbw_gbps"] = untimed_pipeline_work(bd.other_ms, s, cplan)
        if row["other_busbw_gbps"] is None:
            na["other_busbw_gbps"] = "no remainder, or the bytes of the untimed work unknown"


def _timer_bandwidth(
    row: dict[str, Any],
    s: RunSetup,
    cplan: comm.CommPlan | None,
    ds: dict[str, list[float]],
    na: dict[str, str],
) -> None:
    """busbw = wire bytes per rank / timer time (== algbw x ring factor, nccl-tests)."""
    if cplan is None:
        na["busbw_gbps_timers"] = "no communication model for this setup"
        return
    grads = [c for c in cplan.collectives if c.group == "dp" and c.purpose == "gradients"]
    if not grads or grads[0].op != "all_reduce":
        na["busbw_gbps_timers"] = (
            "no data-parallel gradient all-reduce (dp = 1)"
            if not grads
            else "ZeRO-3 reduce-scatters inside backward hooks; no timer isolates it"
        )
        return
    if not ds.get("bwd_allreduce"):
        na["busbw_gbps_timers"] = "no DeepSpeed bwd_allreduce timer (wall_clock_breakdown off)"
        return
    ms = statistics.fmean(ds["bwd_allreduce"])
    if ms <= 0:
        na["busbw_gbps_timers"] = "bwd_allreduce timer is 0"
        return
    row["busbw_gbps_timers"] = comm.gbps(grads[0].wire_bytes_per_rank, ms)
    note = (
        "rank 0's bwd_allreduce (includes waiting for the slowest rank); "
        f"{grads[0].wire_bytes_per_rank:,.0f} wire bytes per rank"
    )
    bucket = s.reduce_bucket_size or comm.DEFAULT_REDUCE_BUCKET
    psi = grads[0].size_bytes // (4 if (s.precision or "fp32") == "fp32" else 2)
    if (s.zero_stage or 0) == 2 and psi > bucket:
        note += "; ZeRO-2 with buckets smaller than the model reduces partly inside bwd_inner"
    na["busbw_gbps_timers"] = note
    gathers = [c for c in cplan.collectives if c.purpose == "parameters (after step)"]
    if gathers and ds.get("optimizer_allgather"):
        gms = statistics.fmean(ds["optimizer_allgather"])
        if gms > 0:
            row["busbw_gbps_timers_allgather"] = comm.gbps(gathers[0].wire_bytes_per_rank, gms)


def _measured_bandwidth(
    row: dict[str, Any], run: LoadedRun, cplan: comm.CommPlan | None, na: dict[str, str]
) -> None:
    if cplan is None or not cplan.collectives:
        na["busbw_gbps_measured"] = "no collective in the communication model"
        return
    main = max(cplan.collectives, key=lambda c: c.wire_bytes_per_rank)
    value, why = comm.measured_busbw(run.netbench, main.op, main.size_bytes)
    row["busbw_gbps_measured"] = value
    na["busbw_gbps_measured"] = why


def to_frame(rows: list[RunMetrics]) -> pd.DataFrame:
    """The one DataFrame, columns and dtypes from ``SCHEMA``."""
    import pandas as pd  # (here: the logs are parsed before pandas takes its 40 MiB)

    records = [{f.name: getattr(r, f.name) for f in fields(RunMetrics)} for r in rows]
    frame = pd.DataFrame.from_records(records, columns=list(SCHEMA))
    return frame.astype(SCHEMA)


def row_dict(row: RunMetrics) -> dict[str, Any]:
    """JSON-ready dict of a row (summary.json)."""
    return {f.name: getattr(row, f.name) for f in fields(RunMetrics)}
