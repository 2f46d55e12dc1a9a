"""Figures against the hardware: MFU per run, and the memory reports' peaks (per run, and per
rank for GPU tensor memory).

MFU = the model's FLOPs per second per GPU (``RunMetrics.tflops_model``: the spec's FLOPs over
the steady-state mean iteration time, the same window as every other figure, the recomputed
forward not counted, as PaLM defines it) / the GPU's dense peak for the run's dtype
(``analysis.theory.hardware``); HFU counts the recomputed forward too (``tflops``, as
Megatron-DeepSpeed's ``throughput_calculator`` does: x 4/3 with full recompute).
``mfu_printed`` puts the TFLOPs Megatron itself printed over the same windows (``TFLOPs:`` of
Megatron-DeepSpeed, ``throughput per GPU (TFLOP/s/GPU)`` of Megatron-Core; the parser's
``tflops`` field) against the same peak, as a check.

The GPU is run.json's ``provenance.gpus`` (``nvidia-smi`` on every node when a CUDA run
started, ``launchers.run.gpus``), else ``--gpu NAME`` of ``python -m analysis.report`` for bare
logs; ``--peak-tflops X`` gives the denominator itself. Without either, or for a name not in
the table, there is no MFU and ``na_reasons['mfu']`` says why: never a guess.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from analysis.parse.records import ParsedRun, record_values
from analysis.runs.record import RunRecord
from analysis.theory import hardware


@dataclass(frozen=True)
class HardwareGiven:
    """What the user said about the hardware of logs that do not record it."""

    gpu: str | None = None
    """``--gpu NAME``: a device name or table model (``H100 SXM``, ``NVIDIA A100-SXM4-80GB``)."""
    peak_tflops: float | None = None
    """``--peak-tflops X``: the dense peak per GPU for the run's dtype, TFLOP/s."""
    dtype: str | None = None
    """``--dtype``: the runs' dtype where their logs do not say (fp32, tf32, fp16, bf16, fp8)."""


def recorded_gpu(record: RunRecord | None) -> tuple[str | None, float | None, str]:
    """(device name, memory.total MiB, why none) from run.json ``provenance.gpus``."""
    gpus = record.provenance.gpus if record and record.provenance else None
    if not gpus:
        return None, None, "no GPU recorded in run.json (CPU run, or a bare log: give --gpu NAME)"
    named = [g for g in gpus if g.name]
    if not named:
        errors = "; ".join(f"{g.node}: {g.error}" for g in gpus if g.error)
        return None, None, f"the GPUs could not be read when the run started ({errors})"
    names = sorted({g.name for g in named if g.name})
    if len(names) > 1:
        return None, None, f"the nodes have different GPUs ({', '.join(names)}): no one peak"
    memory = named[0].memory_total_mib
    return names[0], float(memory) if memory is not None else None, ""


def peak_of(row: Any, record: RunRecord | None, given: HardwareGiven) -> hardware.Peak:
    """The run's denominator: ``--peak-tflops``, else (not on CPU) ``--gpu``, else run.json's
    GPU."""
    name, memory, why = recorded_gpu(record)
    precision = given.dtype or row.precision
    if given.peak_tflops is not None:
        return hardware.given_peak(given.peak_tflops, precision, given.gpu or name)
    if row.device == "cpu":  # (--gpu names the GPU of the CUDA runs, never a CPU run's peak)
        return hardware.Peak(None, hardware.peak_dtype(precision), None, "CPU run: no GPU")
    if given.gpu:
        return hardware.peak(given.gpu, precision)
    if name is None:
        return hardware.Peak(None, hardware.peak_dtype(precision), None, why)
    return hardware.peak(name, precision, memory)


def with_mfu(row: Any, record: RunRecord | None, given: HardwareGiven) -> Any:
    """``row`` (a ``RunMetrics``) with ``gpu``, ``peak_tflops``, ``peak_label``, ``mfu`` and
    ``mfu_printed`` filled, or their reasons in ``na_reasons``."""
    pk = peak_of(row, record, given)
    na = dict(row.na_reasons)
    out: dict[str, Any] = {"gpu": pk.gpu, "peak_tflops": pk.tflops, "peak_label": pk.label or None}
    if pk.tflops is None:
        na["mfu"] = na["peak_tflops"] = pk.reason
    else:
        na["peak_tflops"] = f"dense peak from {pk.source}"
        if row.tflops is not None:
            out["hfu"] = 100.0 * row.tflops / pk.tflops
            out["mfu"] = 100.0 * (row.tflops_model or row.tflops) / pk.tflops
            if out["hfu"] > 100.0:
                na["mfu"] = "above 100%: the GPU or the dtype of the peak is not the run's"
        else:
            na["mfu"] = f"no TFLOP/s for this run ({na.get('tflops') or 'no steady state'})"
            na["hfu"] = na["mfu"]
        if row.tflops_printed is not None:
            out["mfu_printed"] = 100.0 * row.tflops_printed / pk.tflops
        else:
            na["mfu_printed"] = "the log prints no TFLOPs"
    return replace(row, na_reasons=na, **out)


def mfu_text(row: Any, digits: int = 1) -> str:
    """``MFU 41.0% of 989 TFLOP/s dense bf16, H100 SXM`` or ``MFU n/a: <why>``."""
    if row.mfu is None:
        text = f"MFU n/a: {row.na_reasons.get('mfu', 'unknown')}"
        if row.mfu_printed is not None:
            text += f"; Megatron's printed TFLOPs give {row.mfu_printed:.{digits}f}%"
            text += f" of {row.peak_label}"
        return text
    text = f"MFU {row.mfu:.{digits}f}% of {row.peak_label}"
    if row.hfu is not None and row.hfu != row.mfu:
        text += f" (HFU {row.hfu:.{digits}f}%, the recomputed forward counted)"
    return text


def _memory_columns(mem: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per report: ``max allocated`` (NaN where none), allocated (its max, else the current
    allocation) and reserved (its max, else the current), MiB."""
    maxed = record_values(mem, "max_allocated_mb")
    alloc = np.where(np.isnan(maxed), record_values(mem, "allocated_mb"), maxed)
    res = record_values(mem, "max_reserved_mb")
    return maxed, alloc, np.where(np.isnan(res), record_values(mem, "reserved_mb"), res)


def peak_memory(
    parsed: ParsedRun,
) -> tuple[float | None, float | None, int | None, int | None, bool]:
    """Over every memory report of a run: (allocated peak, reserved peak, the allocated peak's
    rank and iteration, whether that figure is an allocator's peak: ``max allocated``, not the
    current allocation of a report), MiB; the first report with the largest figure wins."""
    peak = reserved = rank = after = None
    mem = parsed.memory
    if not len(mem):
        return peak, reserved, rank, after, False
    maxed, alloc, res = _memory_columns(mem)
    is_max = False
    if not np.isnan(alloc).all():
        i = int(np.nanargmax(alloc))
        peak, rank, after = float(alloc[i]), mem[i].rank, mem[i].after_iteration
        is_max = not np.isnan(maxed[i])
    if not np.isnan(res).all():
        reserved = float(np.nanmax(res))
    return peak, reserved, rank, after, is_max


def memory_per_rank(parsed: ParsedRun | None) -> list[dict[str, Any]] | None:
    """Per rank, the largest ``max allocated`` and ``max reserved`` its memory lines print, MiB
    (``allocated``/``reserved`` where the line has no max), with the iteration of the first
    line printing that allocated peak, and ``peak``: whether that figure is a ``max allocated``
    (False: a current allocation, as TensorBoard's ``mem-allocated-bytes``, a lower bound of the
    peak). None when the logs print no memory line."""
    if parsed is None or not len(parsed.memory):
        return None
    mem = parsed.memory
    maxed, alloc, res = _memory_columns(mem)
    ranks: dict[Any, dict[str, Any]] = {}
    for i, rec in enumerate(mem):
        entry = ranks.setdefault(
            rec.rank,
            {
                "rank": rec.rank,
                "allocated_mb": None,
                "reserved_mb": None,
                "after_iteration": None,
                "peak": None,
            },
        )
        if not np.isnan(alloc[i]) and (
            entry["allocated_mb"] is None or alloc[i] > entry["allocated_mb"]
        ):
            entry["allocated_mb"] = float(alloc[i])
            entry["after_iteration"] = rec.after_iteration
            entry["peak"] = not np.isnan(maxed[i])
        if not np.isnan(res[i]) and (entry["reserved_mb"] is None or res[i] > entry["reserved_mb"]):
            entry["reserved_mb"] = float(res[i])
    return sorted(ranks.values(), key=lambda e: (e["rank"] is None, e["rank"] or 0))


def with_memory(row: Any, parsed: ParsedRun | None) -> Any:
    """``row`` with ``mem_per_rank`` filled (or its reason)."""
    per = memory_per_rank(parsed)
    if per is None:
        na = dict(row.na_reasons)
        na["mem_per_rank"] = "no memory report in the logs"
        return replace(row, na_reasons=na)
    return replace(row, mem_per_rank=per)


def apply(rows: Sequence[Any], runs: Sequence[Any], given: HardwareGiven) -> list[Any]:
    """Every row with its MFU and per-rank memory (``runs``: the ``LoadedRun`` of each row)."""
    return [
        with_memory(with_mfu(r, run.record, given), run.parsed)
        for r, run in zip(rows, runs, strict=True)
    ]
