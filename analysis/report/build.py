"""``python -m analysis.report LOGDIR [--out DIR] [--baseline NAME]``.

Writes ``report.md``, ``figures/*.png``, ``summary.json`` (``{"runs": [ROW, ...]}``, one row per
run, columns of ``metrics.rows.SCHEMA`` plus ``na_reasons``), ``summary.csv`` and
``tensorboard/`` (one TensorBoard run per run, HParams: ``report.tensorboard``), and prints
a console table. Default output: ``LOGDIR/report``. A previous report is never overwritten: an
existing output directory is renamed to ``<DIR>.previous-<N>`` (first free N) first, and the
console says so. Every sentence of the report that states a number is computed from the rows.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from analysis.metrics import hardware, repeats, speedup
from analysis.metrics import rows as metrics
from analysis.metrics.rows import RunMetrics
from analysis.metrics.speedup import RUNNING, compared_status
from analysis.metrics.stragglers import StragglerResult
from analysis.metrics.stragglers import analyze as analyze_stragglers
from analysis.predict import prediction
from analysis.report import gpu as report_gpu
from analysis.report import pipeline as report_pipeline
from analysis.report import predictions as report_predict
from analysis.report import stragglers as report_stragglers
from analysis.report import sweep as report_sweep
from analysis.report.markdown import md_table
from analysis.report.tensorboard import write_tensorboard
from analysis.report.traces import write_traces
from analysis.runs import load
from analysis.runs.problems import UNREAD_CODES
from analysis.runs.tensorboard import TENSORBOARD_DIR
from analysis.theory.formulas import STEADY_RULE
from analysis.theory.units import count, number


class Footnotes:
    """Numbered footnotes giving the reason behind each n/a (deduplicated by text)."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def ref(self, text: str) -> str:
        """Footnote marker for ``text``."""
        if text not in self.texts:
            self.texts.append(text)
        return f"[^{self.texts.index(text) + 1}]"

    def render(self) -> list[str]:
        """Markdown footnote definitions."""
        return [f"[^{i + 1}]: {t}" for i, t in enumerate(self.texts)]


def cell(row: RunMetrics, col: str, notes: Footnotes, digits: int = 1, reason: str = "") -> str:
    """Formatted value, or ``n/a`` with a footnote giving the reason."""
    value = getattr(row, col)
    if value is None:
        why = row.na_reasons.get(col) or reason or "not derivable from the logs"
        if row.status != "completed" and col not in row.na_reasons:
            why = f"run {row.status}: {row.failure_reason or 'no reason recorded'}"
        return "n/a" + notes.ref(why)
    return number(value, digits)


def _time_cell(r: RunMetrics, notes: Footnotes) -> str:
    if r.iter_ms_mean is None:
        return cell(r, "iter_ms_mean", notes)
    text = f"{r.iter_ms_mean:,.1f}"
    if r.iter_ms_std is not None:
        text += f" ± {r.iter_ms_std:,.1f}"
    if r.iter_ms_ci95_lo is not None:
        text += f" [{r.iter_ms_ci95_lo:,.0f}, {r.iter_ms_ci95_hi:,.0f}]"
    return text


def _speedup_cell(r: RunMetrics, notes: Footnotes) -> str:
    if r.speedup is None:
        return cell(r, "speedup", notes)
    text = f"{r.speedup:.2f}x"
    if r.speedup_ci95_lo is not None:
        text += f" [{r.speedup_ci95_lo:.2f}, {r.speedup_ci95_hi:.2f}]"
    return text


def _groups(rows: list[RunMetrics]) -> dict[str, list[RunMetrics]]:
    groups: dict[str, list[RunMetrics]] = {}
    for r in rows:
        groups.setdefault(r.setup_key, []).append(r)
    return groups


def _timed(rows: list[RunMetrics]) -> list[RunMetrics]:
    """Runs with a steady-state time that take part in ratios: completed, running or cut."""
    return [r for r in rows if r.iter_ms_mean is not None and compared_status(r.status)]


def status_text(r: RunMetrics) -> str:
    """The status as the tables show it: a running or cut run with where its log ends."""
    if r.status not in RUNNING:
        return r.status
    where = "" if r.last_iteration is None else f" at iteration {r.last_iteration}"
    if where and r.train_iters:
        where += f" of {r.train_iters}"
    if r.since_last_write_s is not None:
        where += f", log last written {_age(r.since_last_write_s)} ago"
    return f"running or cut{where}"


def _age(seconds: float) -> str:
    """``42 s``, ``7 min``, ``3.2 h``, ``2.0 d``."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def _context(rows: list[RunMetrics]) -> str:
    r = rows[0]
    params = f"{r.num_parameters:,} parameters" if r.num_parameters else "parameters unknown"
    return (
        f"Model {r.model} ({params}), global batch {r.global_batch_size}, micro-batch "
        f"{r.micro_batch_size}, sequence {r.seq_length}, {r.precision or 'precision unknown'}; "
        f"{r.nodes if r.nodes is not None else '?'} node(s), {count(r.world_size, 'rank')}, "
        f"device {r.device or 'unknown'}"
        + (f", link {r.link_mbit:g} Mbit/s" if r.link_mbit else "")
        + "."
    )


def findings(group: list[RunMetrics]) -> list[str]:
    """Statements that follow from the group's numbers (computed, never canned)."""
    out: list[str] = []
    timed = _timed(group)
    g = repeats.group_repeats(group)
    if len(timed) >= 2 and not g.repeated:  # with repeats: the sets' means (speed_findings)
        fastest = min(timed, key=lambda r: r.iter_ms_mean or 0.0)
        slowest = max(timed, key=lambda r: r.iter_ms_mean or 0.0)
        out.append(
            f"Fastest: **{fastest.name}** ({fastest.strategy}) at {fastest.iter_ms_mean:,.1f} "
            f"ms/iteration; slowest: **{slowest.name}** ({slowest.strategy}) at "
            f"{slowest.iter_ms_mean:,.1f} ms "
            f"({(slowest.iter_ms_mean or 0) / (fastest.iter_ms_mean or 1):.2f}x)."
        )
    out += repeats.speed_findings(g)
    for r in [] if g.repeated else timed:  # one run per spec: within-run intervals
        if r.speedup is None or r.name == r.baseline or r.speedup_ci95_lo is None:
            continue
        if r.speedup_ci95_lo > 1.0:
            out.append(
                f"{r.name} is faster than {r.baseline}: {r.speedup:.2f}x "
                f"(within-run 95% interval {r.speedup_ci95_lo:.2f}-{r.speedup_ci95_hi:.2f})."
            )
        elif (r.speedup_ci95_hi or 0) < 1.0:
            out.append(
                f"{r.name} is slower than {r.baseline}: {r.speedup:.2f}x "
                f"(within-run 95% interval {r.speedup_ci95_lo:.2f}-{r.speedup_ci95_hi:.2f})."
            )
        else:
            out.append(
                f"{r.name} vs {r.baseline}: {r.speedup:.2f}x, interval "
                f"{r.speedup_ci95_lo:.2f}-{r.speedup_ci95_hi:.2f} includes 1: no measurable "
                "difference with these samples (within-run interval: one run each)."
            )
    for r in timed:
        if r.comm_ms is not None and r.iter_ms_mean and "comm_ms" not in r.na_reasons:
            share = r.comm_ms / r.iter_ms_mean
            if share >= 0.15:
                out.append(
                    f"{repeats.label(r)}: timed communication is {share:.0%} of the iteration "
                    f"({r.comm_ms:,.1f} of {r.iter_ms_mean:,.1f} ms)."
                )
        if r.other_ms is not None and r.iter_ms_mean and r.other_ms / r.iter_ms_mean >= 0.10:
            out.append(
                f"{repeats.label(r)}: {r.other_ms:,.1f} ms/iteration "
                f"({r.other_ms / r.iter_ms_mean:.0%}) is not covered by any timer."
            )
    mems = [r for r in timed if r.peak_mem_mb is not None]
    if len(mems) >= 2:
        lo = min(r.peak_mem_mb or 0.0 for r in mems)
        hi = max(r.peak_mem_mb or 0.0 for r in mems)
        kind = mems[0].mem_kind or ""
        text = f"Peak memory spans {lo:,.0f}-{hi:,.0f} MiB ({(hi - lo) / hi:.1%} spread)"
        states = [r.model_state_mb for r in mems if r.model_state_mb is not None]
        if "RSS" in kind and states:
            text += (
                f"; these are process RSS figures (CPU), while the Adam model state per rank is "
                f"only {min(states):,.1f}-{max(states):,.1f} MiB: the differences between "
                "strategies are not tensor-memory savings"
            )
        out.append(text + ".")
    out += [_not_completed(r) for r in group if r.status != "completed"]
    return out


def _running(r: RunMetrics) -> str:
    """A run whose log ends before its last iteration without a failure."""
    timed = (
        f"timed over {r.steady_iterations} and compared like a completed run"
        if r.iter_ms_mean is not None
        else "no steady-state time yet"
    )
    return f"{repeats.label(r)} {status_text(r)} (no failure in its log): {timed}."


def _not_completed(r: RunMetrics) -> str:
    """A run that did not complete: status, kind, where it stopped, why; never in a ratio
    (a running or cut run: ``_running``)."""
    if r.status in RUNNING:
        return _running(r)
    if r.last_iteration is None:
        where = "before any logged iteration"
    else:
        where = f"last logged iteration {r.last_iteration}" + (
            f" of {r.train_iters}" if r.train_iters else ""
        )
    return (
        f"{repeats.label(r)} {r.status}" + (f" ({r.failure_kind})" if r.failure_kind else "")
        + f", {where}: {r.failure_reason or 'no reason recorded'}. Not in any ratio."
    )  # fmt: skip


def reference_line(group: list[RunMetrics]) -> str:
    """Which run the group's ratios use, and why."""
    why = next((r.baseline_why for r in group if r.baseline_why), None)
    return f"Reference for speedups and savings: {why or 'none'}."


def _counts(timed: list[RunMetrics], running: list[RunMetrics], failed: int) -> str:
    """``; 4 timed run(s) (3 running or cut), 2 running or cut without a steady time yet, 1 not
    completed.``"""
    live = sum(1 for r in timed if r.status in RUNNING)
    text = f"; {len(timed)} timed run(s)" + (f" ({live} running or cut)" if live else "")
    if waiting := len(running) - live:
        text += f", {waiting} running or cut without a steady-state time yet"
    return text + f", {failed} not completed."


def executive_summary(groups: dict[str, list[RunMetrics]]) -> list[str]:
    """One line per setup group: its fastest run (or the repeats' summary) and what failed."""
    md: list[str] = []
    for key, group in groups.items():
        timed = _timed(group)
        failed = [r for r in group if r.status != "completed" and r.status not in RUNNING]
        running = [r for r in group if r.status in RUNNING]
        counts = _counts(timed, running, len(failed))
        if (line := repeats.summary_line(key, repeats.group_repeats(group))) is not None:
            md.append(line + counts)
        elif timed:
            best = min(timed, key=lambda r: r.iter_ms_mean or 0.0)
            what = [best.strategy] if best.strategy else []
            what += [status_text(best)] if best.status in RUNNING else []
            line = (
                f"- **{key}**: fastest {best.name}"
                + (f" ({', '.join(what)})" if what else "")
                + f", {best.iter_ms_mean:,.1f} ms/iteration"
                + (f", {number(best.samples_per_s, 1)} samples/s" if best.samples_per_s else "")
            )
            if best.speedup is not None and best.name != best.baseline:
                line += f", {best.speedup:.2f}x vs {best.baseline}"
            md.append(line + counts)
        elif stopped := [r for r in failed if r.iter_ms_mean is not None]:
            best = min(stopped, key=lambda r: r.iter_ms_mean or 0.0)
            md.append(
                f"- **{key}**: no run to compare (failed runs stay out of every ratio); "
                f"{len(stopped)} timed before {'it' if len(stopped) == 1 else 'they'} stopped "
                f"({'fastest ' if len(stopped) > 1 else ''}{best.name} {best.status}: "
                f"{best.iter_ms_mean:,.1f} ms/iteration, not in any ratio)" + counts
            )
        else:
            md.append(f"- **{key}**: no timed run" + counts)
    return md


def render(
    rows: list[RunMetrics],
    logdir_label: str,
    figures: list[str],
    model: report_predict.ReportSections | None = None,
    stragglers: dict[str, StragglerResult] | None = None,
) -> str:
    """The whole markdown report; ``model`` adds the calibrated model's sections,
    ``stragglers`` (run path -> result) the straggler section."""
    stragglers = stragglers or {}
    notes = Footnotes()
    groups = _groups(rows)
    md: list[str] = ["# Megatron-DeepSpeed parallelism report", ""]
    md += [f"Source: `{logdir_label}`, {len(rows)} run(s) in {len(groups)} setup group(s).", ""]

    md += ["## Executive summary", "", *executive_summary(groups)]
    md += [*report_stragglers.summary_lines(rows, stragglers), ""]

    unread = [(r, [p.message for p in r.problems if p.code in UNREAD_CODES]) for r in rows]
    unread = [(r, found) for r, found in unread if found]
    if unread:
        md += ["## Runs that could not be read fully", ""]
        md += [
            f"- {repeats.label(r)} (`{r.path}`, {r.status}): {'; '.join(found)}."
            for r, found in unread
        ]
        md.append("")

    md += ["## Results per model and setup", ""]
    for key, group in groups.items():
        md += [f"### {key}", "", _context(group), "", reference_line(group), ""]
        table = []
        for r in group:
            table.append(
                [
                    repeats.label(r),
                    r.strategy or "?",
                    status_text(r),
                    cell(r, "peak_mem_mb", notes, 0),
                    _time_cell(r, notes),
                    cell(r, "samples_per_s", notes, 2),
                    cell(r, "tflops", notes, 4),
                    _speedup_cell(r, notes),
                    cell(r, "mem_saving_pct", notes, 1, "no baseline memory in this group"),
                ]
            )
        headers = ["run", "strategy", "status", "peak mem (MiB)", "ms/iter mean ± std [95% CI]"]
        headers += ["samples/s", "TFLOP/s/rank", "speedup [95% CI]", "mem saving %"]
        md += md_table(headers, table)
        md += [
            "",
            "Legend: ms/iter is the mean over steady-state windows (rule: "
            f"{STEADY_RULE}); ± is the per-iteration standard deviation (source per run "
            "below); [CI] the 95% t-interval of the mean; speedup = baseline time / run time "
            "within this group, interval by the delta method on the log ratio (Welch df); "
            "memory saving = (baseline - run) / baseline peak; TFLOP/s recomputed from the spec "
            "(Megatron-DeepSpeed megatron/utils.py throughput_calculator formula).",
            "",
        ]
        md += repeats.results_table(repeats.group_repeats(group))
        for finding in findings(group):
            md.append(f"- {finding}")
        md.append("")
        md += ["Which iterations fed each number:", ""]
        for r in group:
            md.append(
                f"- {repeats.label(r)}: {r.steady_iterations or 'none'}"
                + (f"; dropped: {r.steady_dropped}" if r.steady_dropped else "")
                + "; spread: "
                f"{r.iter_ms_std_source or 'n/a'}; TFLOPs printed "
                f"{number(r.tflops_printed, 3) or 'n/a'} vs recomputed "
                f"{number(r.tflops, 4) or 'n/a'}"
                f" ({r.tflops_check or 'no comparison'}); "
                f"tokens/s {number(r.tokens_per_s, 0) or 'n/a'}"
            )
        md.append("")

    md += report_gpu.section(rows)
    md += report_stragglers.section(rows, stragglers)
    md += ["## Time breakdown", ""]
    md += [
        "ms per iteration, steady state. DeepSpeed's per-step timers are sums over the step's "
        "micro-steps (deepspeed/runtime/engine.py step -> timers.log); 'other' is iteration time "
        "minus the sum of the timers: not covered by any timer.",
        "",
    ]
    bd_rows = []
    piped = any(r.pipe_wait_ms is not None or r.data_ms is not None for r in rows)
    for r in rows:
        if r.status != "completed" and r.iter_ms_mean is None:
            continue
        bd_rows.append(
            [
                repeats.label(r),
                number(r.iter_ms_mean, 1) or cell(r, "iter_ms_mean", notes),
                number(r.fwd_ms, 1) or ("" if r.fwd_bwd_ms else cell(r, "fwd_ms", notes)),
                number(r.bwd_ms, 1),
                number(r.fwd_bwd_ms, 1),
                number(r.optimizer_ms, 1),
                number(r.comm_ms, 1)
                + (notes.ref(r.na_reasons["comm_ms"]) if "comm_ms" in r.na_reasons else ""),
                *([number(r.data_ms, 1), number(r.pipe_wait_ms, 1)] if piped else []),
                number(r.other_ms, 1),
                ", ".join(f"{k}: {v}" for k, v in (r.breakdown_sources or {}).items()) or "-",
            ]
        )
    headers = ["run", "iteration", "forward", "backward", "fwd+bwd", "optimizer", "comm"]
    headers += ["data", "pipe wait"] if piped else []
    md += md_table([*headers, "other", "timers"], bd_rows)
    md.append("")
    md += report_pipeline.section(rows)

    md += ["## Memory efficiency", ""]
    mem_rows = [
        [
            repeats.label(r),
            cell(r, "peak_mem_mb", notes, 1),
            number(r.peak_reserved_mb, 1) or "n/a",
            r.mem_kind or "n/a",
            number(r.mem_saving_pct, 1) or "n/a",
            number(r.model_state_mb, 1) or "n/a",
        ]
        for r in rows
    ]
    md += md_table(
        [
            "run",
            "peak allocated (MiB)",
            "peak reserved (MiB)",
            "what it measures",
            "saving %",
            "Adam model state per rank (MiB)",
        ],
        mem_rows,
    )
    md += [
        "",
        "The logs print 'MB' = bytes / 1024^2: figures here are MiB. Megatron's memory line is "
        "printed once, after the first log interval, by every rank whose data-parallel rank is "
        "0 (TensorBoard's memory scalars, every logged iteration, hold the current allocation "
        "only: a lower bound); the peak is the max over ranks and nodes. The Adam model state "
        "per rank follows the ZeRO paper with Psi the busiest rank's parameters (its TP shard "
        "and pipeline stage) and N the data-parallel size: fp16/bf16 16 Psi (DP), "
        "4 Psi + 12 Psi/N (ZeRO-1), "
        "2 Psi + 14 Psi/N (ZeRO-2), 16 Psi/N (ZeRO-3); fp32 16 Psi, 8 Psi + 12 Psi/N, "
        "4 Psi + 16 Psi/N, 20 Psi/N (DeepSpeed keeps an fp32 copy of the partition).",
        "",
    ]

    md += ["## Communication overhead per strategy", ""]
    comm_rows = [
        [
            repeats.label(r),
            cell(r, "comm_bytes_per_iter", notes, 0),
            number(r.comm_bytes_dp, 0),
            number(r.comm_bytes_pp, 0),
            number(r.comm_bytes_tp, 0),
            number(r.comm_ms, 1) or "n/a",
            f"{r.comm_ms / r.iter_ms_mean:.0%}" if r.comm_ms and r.iter_ms_mean else "n/a",
            cell(r, "wire_bytes_per_iter", notes, 0),
            f"{r.wire_over_model:.3f}" if r.wire_over_model is not None else "n/a",
        ]
        for r in rows
    ]
    md += md_table(
        ["run", "bytes/iter (busiest rank)", "DP", "PP", "TP", "timed comm ms", "share",
         "on the wire (counters)", "wire / model"],
        comm_rows,
    )  # fmt: skip
    md += [
        "",
        "Bytes from the spec (analysis.theory.comm), as DeepSpeed really communicates: ZeRO-1/2 "
        "all-reduce gradients (ZeRO-2 every micro-step) then all-gather parameters; ring bytes "
        "per rank: all-reduce 2(n-1)/n S, all-gather/reduce-scatter (n-1)/n S, send/recv S. "
        "'On the wire' is the ground truth of an emulated cluster: the busiest node's interface "
        "counters per steady-state iteration, headers included (TCP/IP adds ~4-8%).",
        "",
    ]
    for r in rows:
        if r.collectives:
            md.append(
                f"- {repeats.label(r)}: " + "; ".join(_collective_text(c) for c in r.collectives)
            )
    md.append("")

    md += ["## Network bandwidth analysis", ""]
    bw_rows = []
    for r in rows:
        if r.iter_ms_mean is None:
            continue
        bw_rows.append(
            [
                repeats.label(r),
                f"{r.link_mbit / 1000:g}" if r.link_mbit else "n/a",
                cell(r, "busbw_gbps_timers", notes, 3),
                number(r.busbw_gbps_timers_allgather, 3) or "n/a",
                cell(r, "busbw_gbps_inferred", notes, 3)
                + (" (!)" if r.busbw_inferred_warning else ""),
                cell(r, "busbw_gbps_measured", notes, 3),
            ]
        )
    md += md_table(
        [
            "run",
            "link Gbit/s",
            "busbw timers",
            "all-gather timers",
            "busbw inferred",
            "busbw measured",
        ],
        bw_rows,
    )
    md += [
        "",
        "Gbit/s, nccl-tests bus-bandwidth convention (busbw = algbw x 2(n-1)/n for all-reduce). "
        "Timers: gradient bytes / DeepSpeed bwd_allreduce; inferred: extra bytes / extra "
        "iteration time over the compute-identical run of the group that sends the fewest bytes "
        "(null when the time difference is within its 95% interval of 0; (!) when it is more "
        "than 25% off the measured or link bandwidth, i.e. not bandwidth-bound); measured: "
        "netbench.json at the nearest message size.",
        "",
    ]
    for r in rows:
        for col in ("busbw_gbps_timers", "busbw_gbps_inferred"):
            if getattr(r, col) is not None and col in r.na_reasons:
                md.append(f"- {repeats.label(r)} {col}: {r.na_reasons[col]}")
    for r in rows:
        if r.busbw_inferred_warning:
            md.append(f"- **{repeats.label(r)}: inferred figure is not the link's bandwidth**: "
                      f"{r.busbw_inferred_warning}")  # fmt: skip
    md.append("")

    md += ["## Scaling predictions", ""]
    md += model.scaling if model is not None else _scaling_qualitative(rows)

    md += ["## Recommendations", ""]
    for key, group in groups.items():
        md += recommendations(key, group)
    if model is not None and model.recommendations:
        md += ["", "From the calibrated model (analysis.predict):", "", *model.recommendations]
    md.append("")

    md += ["## Configuration", ""]
    cfg = [
        [
            repeats.label(r),
            r.model or "?",
            r.strategy or "?",
            f"{r.tp}/{r.pp}/{r.dp}",
            str(r.zero_stage),
            str(r.gas),
            f"{r.micro_batch_size}/{r.global_batch_size}",
            f"{r.num_parameters:,}" if r.num_parameters else "n/a",
        ]
        for r in rows
    ]
    md += md_table(
        ["run", "model", "strategy", "tp/pp/dp", "ZeRO", "GAS", "micro/global batch", "params"],
        cfg,
    )
    md += ["", "## Hardware and provenance", ""]
    shared = {r.provenance for r in rows}  # (said once when every run has the same)
    if len(shared) == 1 and None not in shared:
        md += [f"Every run: {shared.pop()}.", ""]
    for r in rows:
        md.append(
            f"- {repeats.label(r)}: `{r.path}`, {r.nodes if r.nodes is not None else '?'} node(s), "
            f"{count(r.world_size, 'rank')}, device {r.device or '?'}"
            + (f"; {r.provenance}" if r.provenance and len(shared) > 1 else "")
            + (f"; problems: {'; '.join(p.message for p in r.problems)}" if r.problems else "")
        )
    if figures:
        md += ["", "## Figures", ""]
        md += [f"![{Path(f).stem}]({f})" for f in figures]
    if notes.texts:
        md += ["", "## Notes", "", *notes.render()]
    return "\n".join(md) + "\n"


def _scaling_qualitative(rows: list[RunMetrics]) -> list[str]:
    """Scaling notes without a calibrated model."""
    md = [
        "Assumptions: communication bytes scale as in analysis.theory.comm with the ring factor "
        "2(n-1)/n (all-reduce) approaching 2 as n grows; per-rank compute scales with the "
        "per-rank batch; link bandwidth as measured above; no overlap of communication and "
        "compute. No calibrated model was run: no predicted times are shown.",
        "",
    ]
    for r in rows:
        if r.comm_bytes_per_iter and r.busbw_gbps_timers:
            t = r.comm_bytes_per_iter * 8 / (r.busbw_gbps_timers * 1e9) * 1000
            md.append(
                f"- {r.name}: {r.comm_bytes_per_iter / 1e6:.2f} MB/iteration at the timer "
                f"bandwidth {r.busbw_gbps_timers:.3f} Gbit/s = {t:,.1f} ms of communication per "
                "iteration if not overlapped; it stays at that size per rank as DP grows."
            )
    return [*md, ""]


def _collective_text(c: dict[str, Any]) -> str:
    return (
        f"{c['op']} {c['purpose']} {c['size_bytes']:,} B x{c['count_per_iter']} "
        f"(n={c['group_size']}, {c['link']}) = {c['wire_bytes_per_rank']:,.0f} B"
    )


def recommendations(key: str, group: list[RunMetrics]) -> list[str]:
    """Recommendations that follow from the group's numbers."""
    timed = _timed(group)
    if not timed:
        return [f"- {key}: no completed timed run; nothing to recommend from data."]
    out = repeats.speed_recommendation(key, repeats.group_repeats(group))
    mems = [r for r in timed if r.peak_mem_mb is not None]
    if mems:
        low = min(mems, key=lambda r: r.peak_mem_mb or 0.0)
        if "RSS" in (low.mem_kind or ""):
            out.append(
                f"- {key}: memory figures are process RSS on CPU; they cannot rank strategies "
                "by tensor memory. Measure on the accelerator before choosing for memory."
            )
        else:
            out.append(
                f"- {key}: lowest peak memory: **{low.strategy}** ({low.peak_mem_mb:,.0f} MiB)."
            )
    dominated = [
        r
        for r in timed
        if r.comm_ms and r.iter_ms_mean and "comm_ms" not in r.na_reasons
        if r.comm_ms / r.iter_ms_mean >= 0.25
    ]
    for r in repeats.first_of_each(dominated):  # repeats: one line per spec
        out.append(
            f"- {key}: communication dominates {r.name} ({r.comm_ms / (r.iter_ms_mean or 1):.0%} "
            "of the iteration): a faster link or fewer bytes (see the communication table) "
            "pays off directly."
        )
    return out


def console_table(rows: list[RunMetrics]) -> None:
    """Print the main figures with rich (plain text when not a terminal)."""
    table = Table(title="Megatron-DeepSpeed runs")
    cols: list[tuple[str, Callable[[RunMetrics], str]]] = [
        ("setup", lambda r: r.setup_key),
        ("run", repeats.label),
        ("strategy", lambda r: r.strategy or "?"),
        ("status", status_text),
        ("ms/iter", lambda r: number(r.iter_ms_mean, 1) or "n/a"),
        ("samples/s", lambda r: number(r.samples_per_s, 2) or "n/a"),
        ("speedup", lambda r: f"{r.speedup:.2f}x" if r.speedup else "n/a"),
        ("MFU", lambda r: f"{r.mfu:.1f}%" if r.mfu is not None else "n/a"),
        (
            "peak MiB",
            lambda r: (">= " * (r.peak_mem_is_peak is False)) + (number(r.peak_mem_mb, 0) or "n/a"),
        ),
        ("MB/iter", lambda r: number((r.comm_bytes_per_iter or 0) / 1e6, 2) or "n/a"),
    ]
    for name, _ in cols:
        table.add_column(name)
    for r in rows:
        table.add_row(*(fn(r) for _, fn in cols))
    Console(width=160).print(table)


def _json_default(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    return str(value)


def _set_aside(out: Path) -> Path | None:
    if not out.exists():
        return None
    n = 1
    while (moved := out.with_name(f"{out.name}.previous-{n}")).exists():
        n += 1
    shutil.move(str(out), str(moved))
    return moved


def summarize(
    logdir: Path,
    exclude: list[Path],
    baseline: str | None = None,
    given: hardware.HardwareGiven | None = None,
) -> tuple[list[load.LoadedRun], list[RunMetrics], report_predict.ReportSections]:
    """The runs under ``logdir``, their summary rows (with the cross-run and leave-one-out
    figures, MFU against ``given`` or run.json's GPU) and the calibrated model's sections:
    everything the report shows."""
    runs = load.discover(logdir, exclude=exclude)
    computed = hardware.apply([metrics.compute(r) for r in runs], runs, given or _NO_GIVEN)
    rows = speedup.compare(computed, baseline)
    rows = repeats.same_round_speedups(rows)
    model = report_predict.report_sections(runs, rows)
    return runs, prediction.fill_rows(rows, model.loo), model


_NO_GIVEN = hardware.HardwareGiven()
"""No ``--gpu``/``--peak-tflops``: the GPU comes from run.json."""


def build(
    logdir: Path,
    out: Path,
    baseline: str | None = None,
    given: hardware.HardwareGiven | None = None,
) -> list[RunMetrics]:
    """Load, compute, write everything; returns the rows."""
    runs, rows, model = summarize(logdir, [out], baseline, given)
    stragglers = {run.path: analyze_stragglers(run, logdir) for run in runs}
    moved = _set_aside(out)
    if moved:
        print(f"previous report kept as {moved}", file=sys.stderr)
    out.mkdir(parents=True)
    frame = metrics.to_frame(rows)
    from analysis.report.plots import write_figures  # matplotlib and pandas: 0.7 s, for figures

    sets = repeats.to_json(rows)
    written = write_figures(frame, out / "figures", sets)
    figures = [p.relative_to(out).as_posix() for p in written]
    label = logdir.name or str(logdir)
    sweep_md = report_sweep.section(logdir, rows)  # empty without <logdir>/sweep.json
    md = render(rows, label, figures, model, stragglers)
    (out / "report.md").write_text(md + ("\n" + "\n".join(sweep_md) if sweep_md else ""))
    summary = {
        "runs": [
            metrics.row_dict(r)
            | ({"stragglers": stragglers[r.path].to_dict()} if r.path in stragglers else {})
            for r in rows
        ],
        "repeats": sets,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=_json_default) + "\n")
    frame.to_csv(out / "summary.csv", index=False)
    write_tensorboard(rows, out / TENSORBOARD_DIR)
    write_traces(runs, rows, logdir, out)  # profiled runs: report.md section, summary profiles
    return rows


def main(argv: list[str] | None = None) -> int:
    """CLI entry point."""
    parser = argparse.ArgumentParser(prog="python -m analysis.report", description=__doc__)
    parser.add_argument("logdir", type=Path, help="run directories and/or log files")
    parser.add_argument("--out", type=Path, help="output directory (default LOGDIR/report)")
    parser.add_argument("--baseline", help="name of the baseline run (default: strategy baseline)")
    parser.add_argument("--summary", action="store_true", help="also print the executive summary")
    parser.add_argument(
        "--gpu", help="GPU of logs without run.json (MFU peak): e.g. 'H100 SXM', 'A100 80GB'"
    )
    parser.add_argument(
        "--peak-tflops", type=float, help="dense peak TFLOP/s per GPU for the runs' dtype (MFU)"
    )
    parser.add_argument(
        "--dtype",
        choices=("fp32", "tf32", "fp16", "bf16", "fp8"),
        help="the runs' dtype where their logs do not say it (MFU peak)",
    )
    args = parser.parse_args(argv)
    if not args.logdir.exists():
        parser.error(f"{args.logdir} does not exist")
    default = args.logdir if args.logdir.is_dir() else args.logdir.parent
    out = args.out or default / "report"
    given = hardware.HardwareGiven(args.gpu, args.peak_tflops, args.dtype)
    rows = build(args.logdir, out, args.baseline, given)
    console_table(rows)
    print(f"wrote {out / 'report.md'}")
    print(f"TensorBoard: tensorboard --logdir {out / TENSORBOARD_DIR}")
    if args.summary:
        print("\n".join(executive_summary(_groups(rows))))
    return 0
