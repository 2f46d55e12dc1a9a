"""Runs compared within one setup: the reference run, speedups with their interval (Welch on
the window means), and the bandwidth the time differences imply (with a warning when it is
far from the measured busbw or the link rate).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from analysis.metrics.rows import RunMetrics
from analysis.metrics.stats import t95, welch
from analysis.theory import comm
from analysis.theory.formulas import LINK_EFFICIENCY


def _welch(a: RunMetrics, b: RunMetrics) -> tuple[float, float, float] | None:
    """(difference of means b - a, se, Welch df) from the window statistics (``stats.welch``;
    each run's standard error recovered from its 95% t-interval)."""
    stats = []
    for r in (a, b):
        if r.iter_ms_mean is None or r.iter_ms_ci95_hi is None or not r.iter_ms_n:
            return None
        half = r.iter_ms_ci95_hi - r.iter_ms_mean
        stats.append((r.iter_ms_mean, half / t95(r.iter_ms_n - 1), r.iter_ms_n))
    return welch(stats[0], stats[1])


def speedup_interval(base: RunMetrics, run: RunMetrics) -> tuple[float, float | None, float | None]:
    """Speedup = base mean / run mean; 95% interval by the delta method on log(ratio):
    se = sqrt((sem_b/mean_b)^2 + (sem_r/mean_r)^2), df by Welch-Satterthwaite."""
    assert base.iter_ms_mean and run.iter_ms_mean
    ratio = base.iter_ms_mean / run.iter_ms_mean
    diff = _welch(base, run)
    if diff is None:
        return ratio, None, None
    rel = []
    for r in (base, run):
        assert r.iter_ms_ci95_hi is not None and r.iter_ms_n and r.iter_ms_mean
        rel.append((r.iter_ms_ci95_hi - r.iter_ms_mean) / t95(r.iter_ms_n - 1) / r.iter_ms_mean)
    se_log = math.sqrt(rel[0] ** 2 + rel[1] ** 2)
    half = t95(max(1.0, diff[2])) * se_log
    return ratio, ratio * math.exp(-half), ratio * math.exp(half)


def choose_reference(
    group: list[RunMetrics], baseline: str | None = None
) -> tuple[RunMetrics | None, str]:
    """The run a setup group's ratios use, and why. Only a completed, timed run can be one:
    the run named ``baseline`` (CLI ``--baseline``), else the group's completed run of strategy
    ``baseline``, else the completed run with the fewest model-parallel ranks (tp x pp: the
    closest to plain data parallelism; then the lowest ZeRO stage, then the name)."""
    done = [r for r in group if r.status == "completed" and r.iter_ms_mean is not None]
    named = [r for r in group if baseline and r.name == baseline]
    if named and named[0] in done:
        return named[0], f"{named[0].name}: named by --baseline"
    plain = [r for r in done if r.strategy == "baseline"]
    if plain:
        return plain[0], f"{plain[0].name}: the group's data-parallel baseline run"
    missed = named or [r for r in group if r.strategy == "baseline"]
    if not done:
        return None, "no completed run with a steady-state time in this group"
    ref = min(done, key=lambda r: ((r.tp or 1) * (r.pp or 1), r.zero_stage or 0, r.name))
    why = (
        f"{ref.name}: the completed run with the fewest model-parallel ranks "
        f"(tp x pp = {(ref.tp or 1) * (ref.pp or 1)})"
    )
    if missed:
        m = missed[0]
        what = f"{m.status}" + (f" ({m.failure_kind})" if m.failure_kind else "")
        if m.status == "completed":
            what = "completed without a steady-state time"
        why += (
            f", because {m.name}, the "
            + ("run named by --baseline" if named else "baseline run")
            + f", {what}"
        )
    else:
        why += "; the group has no baseline-strategy run"
    return ref, why


RUNNING = ("incomplete", "running")
"""Statuses of a run whose log ends before its last iteration without a failure (still running,
or its log cut): timed and compared like a completed run, and marked as such."""


def compared_status(status: str) -> bool:
    """Whether a run of this status takes part in a ratio as the compared run: completed, or
    running / cut (``RUNNING``); failed and interrupted runs never."""
    return status == "completed" or status in RUNNING


def compare(rows: list[RunMetrics], baseline: str | None = None) -> list[RunMetrics]:
    """Cross-run figures within each setup group: speedup, memory saving, inferred bandwidth.

    Completed runs take part in a ratio as reference or as compared run; a running or cut run
    (``RUNNING``) only as the compared run, over the windows it logged; failed and interrupted
    runs never. The reference of each group is ``choose_reference``'s, and its reason is kept in
    ``baseline_why``.
    """
    refs: dict[str, tuple[RunMetrics | None, str]] = {}
    for key in dict.fromkeys(r.setup_key for r in rows):
        refs[key] = choose_reference([r for r in rows if r.setup_key == key], baseline)
    out = []
    for row in rows:
        group = [
            r
            for r in rows
            if r.setup_key == row.setup_key and r.iter_ms_mean is not None
            and r.status == "completed"
        ]  # fmt: skip
        base, why = refs[row.setup_key]
        na = dict(row.na_reasons)
        changes: dict[str, Any] = {"baseline_why": why}
        if not compared_status(row.status):
            na["speedup"] = (
                f"run {row.status}: not compared (only completed and running or cut runs take "
                "part in ratios)"
            )
        elif base is None:
            na["speedup"] = f"no reference run in group '{row.setup_key}': {why}"
        elif row.iter_ms_mean is None:
            na["speedup"] = "no steady-state time"
        elif row.name == base.name:
            changes |= {"speedup": 1.0, "baseline": base.name}
            na["speedup_ci95_lo"] = "the reference itself: exactly 1"
        else:
            ratio, lo, hi = speedup_interval(base, row)
            changes |= {"speedup": ratio, "speedup_ci95_lo": lo, "speedup_ci95_hi": hi}
            changes["baseline"] = base.name
        if not compared_status(row.status):
            na["mem_saving_pct"] = f"run {row.status}: its memory line is not comparable"
        elif base is not None and False in (base.peak_mem_is_peak, row.peak_mem_is_peak):
            na["mem_saving_pct"] = (
                "no allocator peak recorded for "
                + (base.name if base.peak_mem_is_peak is False else row.name)
                + " (only current allocations, as TensorBoard's memory scalars): peaks not "
                "compared"
            )
        elif base is not None and base.peak_mem_mb and row.peak_mem_mb is not None:
            changes["mem_saving_pct"] = (base.peak_mem_mb - row.peak_mem_mb) / base.peak_mem_mb
            changes["mem_saving_pct"] *= 100.0
        if row.status != "completed":
            value, why_bw = None, f"run {row.status}: not compared"
        else:
            value, why_bw = inferred_bandwidth(row, group)
        changes["busbw_gbps_inferred"] = value
        na["busbw_gbps_inferred"] = why_bw
        changes["busbw_inferred_warning"] = inferred_warning(row, value)
        out.append(replace(row, na_reasons=na, **changes))
    return out


def inferred_bandwidth(row: RunMetrics, group: list[RunMetrics]) -> tuple[float | None, str]:
    """busbw = (bytes - ref bytes) / (time - ref time) against the run of the same group with
    the same tp/pp/dp (same compute per rank) that sends the fewest bytes. None with the reason
    when there is no such reference or the 95% CI of the time difference includes 0.
    Assumes communication is not overlapped with compute (gloo on CPU blocks)."""
    if row.iter_ms_mean is None or row.comm_bytes_per_iter is None:
        return None, "no steady-state time or no communication model"
    if row.zero_stage == 3:
        return None, (
            "ZeRO-3 adds parameter partitioning and hook work to forward/backward: no run is "
            "compute-identical, so extra time is not all communication"
        )
    peers = [
        r
        for r in group
        if r.name != row.name
        and (r.tp, r.pp, r.dp) == (row.tp, row.pp, row.dp)
        and r.comm_bytes_per_iter is not None
        and r.comm_bytes_per_iter < row.comm_bytes_per_iter
    ]
    if not peers:
        return _intercept_bandwidth(row, group)
    ref = min(peers, key=lambda r: r.comm_bytes_per_iter or 0.0)
    assert ref.comm_bytes_per_iter is not None
    extra_bytes = row.comm_bytes_per_iter - ref.comm_bytes_per_iter
    compared = _welch(ref, row)
    if compared is None:
        return None, f"reference {ref.name}: not enough windows for an interval"
    diff, se, df = compared
    lo, hi = diff - t95(max(1.0, df)) * se, diff + t95(max(1.0, df)) * se
    text = (
        f"vs {ref.name}: +{extra_bytes / 1e6:.2f} MB in {diff:+.1f} ms "
        f"(95% CI [{lo:.1f}, {hi:.1f}] ms)"
    )
    if lo <= 0:
        return None, text + ": the interval includes 0, communication time is within the noise"
    return comm.gbps(extra_bytes, diff), text


INFERRED_TOLERANCE = 0.25
"""Relative gap between the inferred and the expected link bandwidth beyond which the inferred
figure is flagged as not bandwidth-bound."""


def inferred_warning(row: RunMetrics, inferred: float | None) -> str | None:
    """Why the inferred figure should not be read as the network's bandwidth, or None.

    The reference is the measured busbw when netbench ran, else the link rate times
    ``LINK_EFFICIENCY`` (the emulated cluster's ground truth). Communication time that is small
    next to per-byte host costs and compute noise makes the inference measure those instead.
    """
    if inferred is None:
        return None
    if row.busbw_gbps_measured is not None:
        expected, what = row.busbw_gbps_measured, "the measured busbw"
    elif row.link_mbit:
        expected = row.link_mbit / 1000 * LINK_EFFICIENCY
        what = f"the link rate x {LINK_EFFICIENCY}"
    else:
        return None
    gap = (inferred - expected) / expected
    if abs(gap) <= INFERRED_TOLERANCE:
        return None
    link_ms = (row.comm_bytes_per_iter or 0) * 8 / (expected * 1e9) * 1e3
    return (
        f"{inferred:.3f} Gbit/s is {gap:+.0%} off {what} ({expected:.3f}): at that bandwidth "
        f"the bytes of this run take {link_ms:.0f} ms per iteration, so the extra time is "
        "dominated by host-side costs and compute noise, not by the link; read it as the "
        "cost per extra byte, not as the network's bandwidth"
    )


def _intercept_bandwidth(row: RunMetrics, group: list[RunMetrics]) -> tuple[float | None, str]:
    """For the compute family's run with the fewest bytes (e.g. DP beside ZeRO-1/2): the
    compute-only reference is the zero-byte intercept C of T = C + B / busbw drawn through this
    run and the family's run with the most bytes; busbw = B / (T - C). With two runs this is the
    same bandwidth as the pair's, which is all that two timings can tell."""
    assert row.iter_ms_mean is not None and row.comm_bytes_per_iter is not None
    others = [
        r
        for r in group
        if r.name != row.name
        and (r.tp, r.pp, r.dp) == (row.tp, row.pp, row.dp)
        and r.zero_stage != 3
        and r.comm_bytes_per_iter is not None
        and r.comm_bytes_per_iter > row.comm_bytes_per_iter
    ]
    if not others:
        return None, "no compute-identical run (same tp/pp/dp) with other bytes in this group"
    hi = max(others, key=lambda r: r.comm_bytes_per_iter or 0.0)
    assert hi.comm_bytes_per_iter is not None and hi.iter_ms_mean is not None
    compared = _welch(row, hi)
    if compared is None:
        return None, f"reference {hi.name}: not enough windows for an interval"
    diff, se, df = compared
    lo = diff - t95(max(1.0, df)) * se
    extra = hi.comm_bytes_per_iter - row.comm_bytes_per_iter
    ms_per_byte = diff / extra
    intercept = row.iter_ms_mean - row.comm_bytes_per_iter * ms_per_byte
    text = (
        f"compute-only reference: zero-byte intercept {intercept:.1f} ms of T = C + B/busbw "
        f"through {row.name} and {hi.name} (+{extra / 1e6:.2f} MB in {diff:+.1f} ms)"
    )
    if lo <= 0 or intercept <= 0:
        return None, text + ": not separable from the noise"
    return comm.gbps(row.comm_bytes_per_iter, row.iter_ms_mean - intercept), text
