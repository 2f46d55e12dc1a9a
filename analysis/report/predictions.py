"""The report's prediction sections (markdown): calibration, leave-one-out, what-if tables,
crossovers and memory, rendered for ``analysis.report.build``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from analysis.metrics.rows import RunMetrics
from analysis.predict.calibration import UNCALIBRATED, Calibration, calibrate, observations_from
from analysis.predict.prediction import LooResult, Prediction, leave_one_out, predict
from analysis.predict.whatif import (
    STRATEGIES,
    BandwidthCrossover,
    MemoryCrossover,
    bandwidth_crossover,
    crossover,
    memory_crossover,
    what_if,
)
from analysis.report.markdown import md_table
from analysis.runs.load import LoadedRun
from analysis.theory import comm
from analysis.theory.costs import memory_estimate
from analysis.theory.setup import RunSetup
from analysis.theory.units import number

# ---------------------------------------------------------------------------- report sections


@dataclass(frozen=True)
class ReportSections:
    """Markdown of the report's model-driven sections, and the leave-one-out behind them."""

    scaling: list[str]
    """"Scaling predictions" lines."""
    recommendations: list[str]
    """Model-driven "Recommendations" lines."""
    loo: list[LooResult]
    """Leave-one-out results (fill ``predicted_iter_ms``/``prediction_error`` with them)."""


REPORT_RATES_MBIT = (100.0, 1000.0, 10000.0)
"""Link rates of the report's what-if table."""

REPORT_GPU_MEM_GB = (16.0, 40.0, 80.0)
"""GPU memories of the report's memory crossover."""


def _calibration_lines(cal: Calibration) -> list[str]:
    md = ["Calibration (all runs):", ""]
    for fit in cal.compute.values():
        md.append(
            f"- compute '{fit.kind}' from {', '.join(fit.runs)}: forward "
            f"{fit.fwd_ms_per_layer_mb:.2f} + backward {fit.bwd_ms_per_layer_mb:.2f} ms per layer "
            f"and micro-batch ({fit.fwd_ms_per_gflop:.1f} + {fit.bwd_ms_per_gflop:.1f} ms per "
            f"forward GFLOP); optimizer {fit.optimizer_ms_per_mparam:.1f} ms per million "
            f"parameters updated; untimed 'other' {fit.other_ms:.1f} ms/iteration"
        )
    for fit in (cal.intra, cal.inter):
        if fit is not None:
            md.append(f"- {fit.link} collectives: {fit.source}")
    md += [f"- assumption: {a}" for a in cal.assumptions]
    return [*md, ""]


def _memory_lines(rows: Sequence[RunMetrics], runs: Sequence[LoadedRun]) -> list[str]:
    by_name = {r.name: r for r in runs}
    table, timed = [], []
    for row in rows:
        run = by_name.get(row.name)
        if run is None or comm.plan(run.setup)[0] is None or row.status != "completed":
            continue
        mem = memory_estimate(run.setup)
        timed.append((row, mem))
    if not timed:
        return []
    md = ["Memory per rank, model (ZeRO paper state + Korthikanti activations) vs measured:", ""]
    for row, mem in timed:
        model_diff = meas_diff = "n/a"
        base = next(
            (x for x in timed if x[0].strategy == "baseline" and x[0].setup_key == row.setup_key),
            None,
        )
        if base is not None:
            model_diff = f"{(mem.total_bytes - base[1].total_bytes) / 2**20:+.1f}"
            if row.peak_mem_mb is not None and base[0].peak_mem_mb is not None:
                meas_diff = f"{row.peak_mem_mb - base[0].peak_mem_mb:+.1f}"
        table.append(
            [
                row.name,
                f"{mem.state_bytes / 2**20:.1f}",
                f"{mem.activation_bytes / 2**20:.1f}",
                f"{mem.total_bytes / 2**20:.1f}",
                number(row.peak_mem_mb, missing="n/a"),
                model_diff,
                meas_diff,
            ]
        )
    md += md_table(
        [
            "run",
            "state MiB",
            "activations MiB",
            "model MiB",
            "measured peak MiB",
            "model vs baseline",
            "measured vs baseline",
        ],
        table,
    )
    rss = [row for row, _ in timed if "RSS" in (row.mem_kind or "")]
    if rss:
        peak = max(r.peak_mem_mb or 0.0 for r in rss)
        state = max(m.total_bytes for _, m in timed) / 2**20
        md += [
            "",
            f"Not meaningful here: the measured figures are process RSS on CPU (up to "
            f"{peak:,.0f} MiB) while the model's whole tensor memory is at most {state:,.1f} "
            "MiB; the RSS is dominated by the Python/torch runtime, and its differences "
            "between strategies are of the same size as the model's and of either sign. "
            "Compare on an accelerator (max allocated) to check these formulas.",
        ]
    return [*md, ""]


def report_sections(runs: Sequence[LoadedRun], rows: Sequence[RunMetrics]) -> ReportSections:
    """The "Scaling predictions" and model-driven "Recommendations" of the report."""
    obs = observations_from(runs, rows)
    if not obs:
        text = (
            "No completed run with timers and a known layout: nothing to calibrate the model "
            "on. A baseline run with DeepSpeed wall_clock_breakdown true would provide it."
        )
        return ReportSections([text, ""], [], [])
    loo = leave_one_out(obs)
    cal = calibrate(obs)
    md = [
        "Model (analysis.predict): iteration = compute (forward/backward ms per FLOP, calibrated "
        "per compute kind from DeepSpeed's fwd/bwd_inner timers) + pipeline bubble (p-1)/(m+p-1) "
        "+ optimizer (ms per million parameters updated) + untimed constant + exposed "
        "communication (every collective of the communication plan: wire MB x (host + 8000 / "
        "(e x R)) ms, R in Mbit/s; with a collective benchmark, each call's measured time at "
        "its size, whose wire part (e of that collective from its largest messages) scales "
        "with 1/R and whose rest is kept). A run of the same layout measured elsewhere anchors "
        "the prediction (its time minus its modelled communication plus the target's).",
        "",
        *_calibration_lines(cal),
        "Leave-one-out: each run (the mean of its repeats, when repeated) predicted from the "
        "other runs of the same model and batch.",
        "",
    ]
    table = []
    for r in loo:
        p = r.prediction
        how = p.method + (f" on {', '.join(p.anchors)}" if p.anchors else "")
        err = f"{r.error:+.1%}" if r.error is not None else "n/a"
        name = r.name + (f" (mean of {r.repeats})" if r.repeats > 1 else "")
        table.append([name, how, f"{r.measured_ms:,.1f}", number(p.iter_ms, missing="n/a"), err])
    md += md_table(["run", "predicted from", "measured ms", "predicted ms", "error"], table)
    md.append("")
    for r in loo:
        borrowed = [a for a in r.prediction.assumptions if a.startswith("no ")]
        if borrowed and r.error is not None:
            md.append(f"- {r.name} ({r.error:+.0%}): {borrowed[0]}.")
    anchored = [
        abs(r.error) for r in loo if r.error is not None and r.prediction.method == "anchored"
    ]
    if anchored:
        md.append(
            f"- Anchored predictions (communication re-evaluated for another link or node count): "
            f"largest error {max(anchored):.1%} over {len(anchored)} runs."
        )
    md.append("")

    multi = [o for o in obs if (o.setup.nodes or 1) > 1]
    ref = (multi or obs)[0].setup
    rpn = max(1, (ref.world_size or 1) // (ref.nodes or 1))
    nodes = max(ref.nodes or 1, 2)
    rate0 = ref.link_mbit or (cal.inter.rate_mbit if cal.inter else None) or 1000.0
    md += [
        f"Predictions for link rates and node counts not necessarily run ({nodes} nodes x "
        f"{rpn} rank(s) unless stated; a = anchored on a measured run, c = components):",
        "",
    ]
    heads = [f"{r:g} Mbit/s" for r in REPORT_RATES_MBIT] + [f"{2 * nodes} nodes @ {rate0:g}"]
    table = []
    preds: dict[tuple[str, float], Prediction] = {}
    for st in STRATEGIES:
        cells = [st]
        for rate in REPORT_RATES_MBIT:
            try:
                p = predict(what_if(ref, st, nodes, rpn, rate), cal)
            except ValueError as exc:
                cells.append(f"n/a ({exc})")
                continue
            preds[(st, rate)] = p
            cells.append(
                f"{number(p.iter_ms, missing='n/a')} {p.method[0] if p.iter_ms else ''}".strip()
            )
        try:
            p = predict(what_if(ref, st, 2 * nodes, rpn, rate0), cal)
            cells.append(
                f"{number(p.iter_ms, missing='n/a')} {p.method[0] if p.iter_ms else ''}".strip()
            )
        except ValueError as exc:
            cells.append(f"n/a ({exc})")
        table.append(cells)
    if any(p.iter_ms is not None for p in preds.values()):
        md += md_table(["strategy", *heads], table)
        md += [
            "",
            f"With {2 * nodes} nodes the data-parallel degree and the micro-batches per rank "
            "change, so no run anchors those figures: they come from the components.",
            "",
        ]
    else:  # (a table of n/a says less than its reasons)
        why = sorted({p.reason for p in preds.values() if p.reason})
        head = f"{UNCALIBRATED} inter-node collectives ("
        links = [w.removeprefix(head)[:-1] for w in why if w.startswith(head)]
        why = [w for w in why if not w.startswith(head)]
        if links:  # (one reason: no measured run moved data between nodes)
            why.insert(0, "nothing here calibrates an inter-node link (a completed run across "
                       "nodes with a known link rate and DeepSpeed's communication timers, or "
                       f"its netbench.json, would), which {', '.join(links)} need")  # fmt: skip
        md += [f"No time can be predicted at any of them: {'; '.join(why) or 'unknown'}.", ""]

    try:
        base = what_if(ref, "baseline", nodes, rpn, rate0)
    except ValueError as exc:  # (the reference's batch does not split over that many ranks)
        md += [f"No crossover link rates or memory crossover at {nodes} nodes: {exc}.", ""]
        md += _memory_lines(rows, runs)
        return ReportSections(md, _recommendations(ref, rate0, preds, [], [], cal, loo), loo)
    crosses = [bandwidth_crossover(base, z, cal) for z in (1, 2, 3)]
    if (base.num_layers or 0) % 2 == 0 and (base.world_size or 1) % 2 == 0:
        crosses.append(crossover(base, what_if(ref, "pipeline", nodes, rpn, rate0), cal))
    md += ["Crossover link rates vs the baseline (time model T = A + B / R solved for R):", ""]
    md += [
        f"- **{c.strategy}**: {c.verdict}"
        + (f" {c.rate_mbit:,.0f} Mbit/s" if c.rate_mbit else "")
        + f". {c.reason}."
        for c in crosses
    ]
    md.append("")
    md += _memory_lines(rows, runs)
    mems = [memory_crossover(base, g, base.world_size or 2) for g in REPORT_GPU_MEM_GB]
    md += [
        "Memory crossover (family l = 3h/128, s = min(h, 1024), a = h/64, GPT-2 vocabulary, "
        f"micro-batch {base.micro_batch_size}, bf16 Adam, {base.world_size} ranks):",
        "",
    ]
    md += [f"- {m.gpu_mem_gb:g} GiB: {m.reasoning}" for m in mems]
    md.append("")
    recs = _recommendations(ref, rate0, preds, crosses, mems, cal, loo)
    return ReportSections(md, recs, loo)


def _recommendations(
    ref: RunSetup,
    rate0: float,
    preds: dict[tuple[str, float], Prediction],
    crosses: list[BandwidthCrossover],
    mems: list[MemoryCrossover],
    cal: Calibration,
    loo: list[LooResult],
) -> list[str]:
    out = []
    at = {st: p for (st, r), p in preds.items() if r == rate0 and p.iter_ms is not None}
    if at:
        best = min(at.values(), key=lambda p: p.iter_ms or 0.0)
        others = ", ".join(
            f"{p.setup.strategy} {p.iter_ms:,.0f}" for p in at.values() if p is not best
        )
        out.append(
            f"- Model, {ref.model}, {best.label}: **{best.setup.strategy}** at "
            f"{best.iter_ms:,.0f} ms/iteration ({best.method}); the others: {others} ms."
        )
    for c in crosses:
        if c.verdict in ("above", "below"):
            edge = REPORT_RATES_MBIT[0] if c.verdict == "below" else REPORT_RATES_MBIT[-1]
            pz, pb = preds.get((c.strategy, edge)), preds.get(("baseline", edge))
            at_edge = ""
            if pz and pb and pz.iter_ms and pb.iter_ms:
                at_edge = f"; at {edge:g} Mbit/s {pz.iter_ms:,.0f} vs {pb.iter_ms:,.0f} ms"
            out.append(
                f"- {c.strategy} becomes no slower than the baseline {c.verdict} "
                f"{c.rate_mbit:,.0f} Mbit/s (model{at_edge})."
            )
        elif c.verdict == "never":
            out.append(
                f"- {c.strategy} is slower than the baseline at every link rate for this "
                f"model: it moves {c.extra_mb:+.2f} MB/iteration and is "
                f"{c.fixed_ms_diff:+.0f} ms slower even at infinite bandwidth; choose it "
                "only for memory."
            )
        elif c.verdict == "unknown":
            if c.per_rate_diff is not None and c.fixed_ms_diff is not None and c.extra_mb:
                trend = "gains" if c.per_rate_diff < 0 else "loses"
                question = (
                    "whether it stays faster on a fast link"
                    if c.per_rate_diff < 0
                    else "whether it is ever faster"
                )
                out.append(
                    f"- {c.strategy} vs the baseline across link rates: it moves "
                    f"{c.extra_mb:+.2f} MB/iteration, so it {trend} ground as the link slows; "
                    f"at infinite bandwidth the model puts it at {c.fixed_ms_diff:+.0f} ms, "
                    f"within the measurement noise, so {question} is not decidable from these "
                    "runs; longer runs of both would decide."
                )
            elif c.fixed_ms_diff is None:  # the model could not evaluate a setup
                out.append(
                    f"- {c.strategy} vs the baseline across link rates: not predicted: {c.reason}."
                )
            else:
                out.append(
                    f"- {c.strategy} vs the baseline across link rates: not decidable from "
                    "these runs (within the measurement noise); longer runs of both would "
                    "decide."
                )
    for m in mems:
        if m.dp_first_misfit is not None:
            out.append(
                f"- With {m.gpu_mem_gb:g} GiB per GPU, DP stops fitting at "
                f"{m.dp_first_misfit.params / 1e9:,.2f}B parameters; then ZeRO-3 or PP is "
                "necessary (memory formulas, not measured here)."
            )
    missing = []
    if cal.inter is None or "netbench" not in cal.inter.source:
        missing.append(
            "a collective benchmark (python -m launchers.lab.netbench) on the cluster "
            "would replace the assumed wire efficiency"
        )
    for kind in ("tp", "zero3"):
        fit = cal.compute.get(kind)
        if fit is None or len(fit.runs) < 2:
            missing.append(
                f"a second {kind} run (another link or node count) would let "
                f"leave-one-out check the {kind} compute calibration"
            )
    if any(r.prediction.method == "components" and (r.error or 0) < -0.2 for r in loo):
        missing.append(
            "strategies predicted from components with errors beyond 20% are not "
            "reliable until a run of that strategy calibrates them"
        )
    if missing:
        out.append("- Data that would firm this up: " + "; ".join(missing) + ".")
    return out
