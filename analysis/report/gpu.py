"""The report's GPU section: MFU against the dense peak, and tensor memory per rank beside the
analytic model state of each ZeRO stage, with the saving against the reference.

Shown when a run ran on CUDA or has a peak (``--gpu``/``--peak-tflops``); CPU runs have no
MFU (their memory is process RSS, see the results table).
"""

from __future__ import annotations

from analysis.metrics import repeats
from analysis.metrics.hardware import mfu_text
from analysis.metrics.rows import RunMetrics
from analysis.report.markdown import md_table
from analysis.theory.formulas import zero_state_bytes
from analysis.theory.units import number


def shown(rows: list[RunMetrics]) -> bool:
    """Whether the report has a GPU section."""
    return any(r.device == "cuda" or r.peak_tflops is not None for r in rows)


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}%"


def mfu_lines(rows: list[RunMetrics]) -> list[str]:
    """The MFU table, and one sentence per run saying what its MFU is out of."""
    table = []
    for r in rows:
        table.append(
            [
                repeats.label(r),
                r.gpu or "?",
                r.peak_label or "n/a",
                number(r.tflops, 1) or "n/a",
                _pct(r.mfu),
                _pct(r.hfu),
                number(r.tflops_printed, 2) or "n/a",
                _pct(r.mfu_printed),
            ]
        )
    headers = ["run", "GPU", "peak (dense)", "TFLOP/s/GPU", "MFU", "HFU"]
    headers += ["TFLOP/s printed", "printed / peak"]
    out = [
        "MFU = the model's FLOP/s per GPU over the steady-state window / the GPU's dense peak "
        "for the run's dtype (analysis.theory.hardware: vendor datasheets, never the sparse "
        "figure; fp32 is the non-tensor-core figure unless the run states tf32); the recomputed "
        "forward of activation checkpointing is not counted (PaLM's definition). HFU counts it, "
        "as the TFLOP/s/GPU column and Megatron-DeepSpeed's printed TFLOPs do (x 4/3 with full "
        "recompute). The printed columns use Megatron's own TFLOPs over the same windows.",
        "",
        *md_table(headers, table),
        "",
    ]
    out += [f"- {repeats.label(r)}: {mfu_text(r)}." for r in rows]
    return [*out, ""]


def stage_states(r: RunMetrics) -> str | None:
    """The analytic Adam model state per rank of every ZeRO stage at this run's DP size
    (``formulas.zero_state_bytes``), MiB; None without TP = PP = 1 and the parameter count."""
    if r.num_parameters is None or not r.dp or (r.tp or 1) * (r.pp or 1) != 1:
        return None
    psi, precision = r.num_parameters, r.precision or "fp32"
    parts = [f"ZeRO-{k} {zero_state_bytes(psi, k, r.dp, precision) / 2**20:,.0f}" for k in range(4)]
    return "; ".join(parts).replace("ZeRO-0", "DP")


def memory_lines(rows: list[RunMetrics]) -> list[str]:
    """Allocated and reserved peaks per rank beside the analytic model state, and the saving
    against the group's reference as tensor memory (CUDA runs only)."""
    cuda = [r for r in rows if r.device == "cuda" and r.mem_per_rank]
    if not cuda:
        return ["No CUDA memory report in the logs (DeepSpeed/Megatron memory lines).", ""]
    table = []
    for r in cuda:
        state = number(r.model_state_mb, 0) or "n/a"
        for m in r.mem_per_rank or []:
            alloc = m.get("allocated_mb")
            peak = m.get("peak") is not False  # (False: a current allocation, a lower bound)
            table.append(
                [
                    repeats.label(r),
                    r.strategy or "?",
                    "not recorded" if m.get("rank") is None else str(m.get("rank")),
                    ("" if peak else ">= ")
                    + (number(alloc, 0) or "n/a")
                    + ("" if peak else " (current)"),
                    number(m.get("reserved_mb"), 0) or "n/a",
                    state,
                    number(alloc - r.model_state_mb, 0)
                    if peak and alloc is not None and r.model_state_mb is not None
                    else "n/a",
                ]
            )
    headers = ["run", "strategy", "rank", "max allocated MiB", "max reserved MiB"]
    headers += ["model state MiB (analytic)", "allocated - state MiB"]
    out = [
        "Tensor memory (the CUDA caching allocator's allocated and reserved peaks, MiB) per rank; "
        "the analytic model state is Adam's per-rank bytes for the run's ZeRO stage "
        "(formulas.zero_state_bytes); the rest of the allocated peak is activations, "
        "buffers and fragmentation.",
        "",
        *md_table(headers, table),
        "",
    ]
    by_name = {(r.setup_key, r.name): r for r in rows}
    said: set[str] = set()
    for r in cuda:
        states = stage_states(r)
        if states and r.setup_key not in said:
            said.add(r.setup_key)
            out.append(f"- {r.setup_key}: model state per rank at DP {r.dp}, MiB: {states}.")
        ref = by_name.get((r.setup_key, r.baseline)) if r.baseline else None
        text = f"- {repeats.label(r)}: peak allocated {number(r.peak_mem_mb, 0) or 'n/a'} MiB"
        if r.peak_mem_is_peak is False:
            text = (
                f"- {repeats.label(r)}: no allocator peak recorded (only current allocations, as "
                f"in TensorBoard's memory scalars): the peak is at least "
                f"{number(r.peak_mem_mb, 0)} MiB, the largest current allocation seen"
            )
        if ref is not None and ref is not r and ref.peak_mem_mb and r.peak_mem_mb is not None:
            saved = ref.peak_mem_mb - r.peak_mem_mb
            text += f", saves {saved:,.0f} MiB ({_pct(r.mem_saving_pct)}) of tensor memory"
            text += f" against {ref.name}"
            if ref.model_state_mb is not None and r.model_state_mb is not None:
                predicted = ref.model_state_mb - r.model_state_mb
                text += f" (the model state predicts {predicted:,.0f} MiB)"
        out.append(text + ".")
    return [*out, ""]


def section(rows: list[RunMetrics]) -> list[str]:
    """``## GPU: MFU and tensor memory``, or nothing when no run ran on a GPU."""
    if not shown(rows):
        return []
    return ["## GPU: MFU and tensor memory", "", *mfu_lines(rows), *memory_lines(rows)]
