"""The report's "Pipeline timers" subsection: per-iteration figures of the PipelineEngine's own
timers, the measured wait beside the bubble theory, and the untimed remainder in words."""

from __future__ import annotations

from analysis.metrics.rows import RunMetrics
from analysis.report.markdown import md_table
from analysis.theory.units import number


def section(rows: list[RunMetrics]) -> list[str]:
    """Pipeline runs whose PipelineEngine timers were printed: per-iteration figures, the
    measured wait beside the bubble theory, and the untimed remainder in words."""
    timed = [r for r in rows if r.pipe_wait_ms is not None or ((r.pp or 1) > 1 and r.fwd_ms)]
    if not timed:
        return []
    md = [
        "### Pipeline timers",
        "",
        "DeepSpeed's PipelineEngine prints its timers on global rank 0 (the first stage) every "
        "steps_per_print steps, as totals over those steps (deepspeed/runtime/pipe/engine.py "
        "_exec_optimizer_step and train_batch, timers.log with reset): each figure below is the "
        "printed total / steps_per_print, mean over the prints after the first (warm-up).",
        "",
    ]
    table = []
    for r in timed:
        table.append(
            [
                r.name,
                number(r.iter_ms_mean, 1),
                number(r.fwd_ms, 1),
                number(r.bwd_ms, 1),
                number(r.optimizer_ms, 1),
                number(r.data_ms, 1),
                number(r.pipe_wait_ms, 1),
                f"{r.pipe_wait_share:.1%}" if r.pipe_wait_share is not None else "n/a",
                f"{r.pipe_bubble_theory:.1%}" if r.pipe_bubble_theory is not None else "n/a",
                number(r.other_ms, 1),
                number(r.other_busbw_gbps, 3) or "n/a",
            ]
        )
    md += md_table(
        ["run", "iteration", "fwd", "bwd", "step", "batch_input", "pipe wait",
         "wait share", "bubble theory", "untimed", "untimed busbw Gbit/s"],
        table,
    )  # fmt: skip
    md += [
        "",
        "ms per iteration. Pipe wait = pipe_send_output + pipe_recv_grad (the first stage's "
        "blocking sends and receives); wait share = wait / (fwd + bwd + wait); bubble theory = "
        "(p-1)/(m+p-1), p stages, m micro-batches per step, for balanced stages. Untimed = "
        "iteration - every timer; its busbw is the bandwidth the untimed collectives' bytes "
        "imply if they took all of it.",
        "",
    ]
    for r in timed:
        steps = (r.breakdown_sources or {}).get("steps_per_print")
        if steps:
            md.append(f"- {r.name}: steps_per_print {steps}.")
        if "pipe_wait_ms" in r.na_reasons:
            md.append(f"- {r.name}: {r.na_reasons['pipe_wait_ms']}.")
        if r.other_named:
            md.append(f"- {r.name}: {r.other_ms or 0:,.1f} ms/iteration {r.other_named}.")
    return [*md, ""]
