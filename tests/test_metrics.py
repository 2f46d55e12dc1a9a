"""Metrics on runs built by hand from real lab-log values (dp2.log, zero2.log)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from conftest import DP2_SETUP, DP2_WINDOWS, LAB_LOGS, dp2_parsed, loaded

from analysis.metrics import rows as metrics
from analysis.metrics import speedup, stats, timers
from analysis.parse.records import ParsedRun, TimerBlock
from analysis.runs.load import LoadedRun
from analysis.theory import formulas
from analysis.theory.setup import RunSetup


def test_t_quantile_exact_at_the_df():
    from scipy.stats import t  # an independent route to the quantile (scipy.stats: slow import)

    for df in (1, 4, 35, 7.3, 1000):  # integer, between printed rows, fractional Welch df, large
        assert stats.t95(df) == pytest.approx(float(t.ppf(0.975, df)), rel=1e-12)
    # printed t-tables to their three decimals: 4 df 2.776, 35 df 2.030, 1000 df 1.962
    assert stats.t95(4) == pytest.approx(2.776, abs=5e-4)
    assert stats.t95(35) == pytest.approx(2.030, abs=5e-4)
    assert stats.t95(1000) == pytest.approx(1.962, abs=5e-4)
    assert stats.t95(7.3) < stats.t95(7)  # a fractional df is not floored to a row
    with pytest.raises(ValueError):
        stats.t95(0.5)


def test_steady_state_drops_first_window():
    steady, why = metrics.steady_state(dp2_parsed())
    assert why is None and steady is not None
    # (186.6 + 219.0 + 211.9 + 217.7 + 214.0) / 5, hand-checked
    assert steady.stats.mean == pytest.approx(209.84)
    assert steady.stats.median == 214.0
    assert steady.stats.n == 5
    assert (steady.first_iteration, steady.last_iteration, steady.window) == (6, 30, 5)
    a = 4 * 0.975 * 0.025  # the 0.975 quantile of t(4), closed form for 4 df
    t4 = 2 * math.sqrt(math.cos(math.acos(math.sqrt(a)) / 3) / math.sqrt(a) - 1)
    half = t4 * steady.stats.std / math.sqrt(5)
    assert steady.stats.ci_lo == pytest.approx(209.84 - half)


def test_steady_state_needs_two_windows():
    steady, why = metrics.steady_state(dp2_parsed(windows=DP2_WINDOWS[:1]))
    assert steady is None and "warm-up" in (why or "")


def test_parameters_formula():
    assert formulas.gpt_parameters(4, 128, 128, 512) == 875264  # dp2.log prints 875264
    assert formulas.gpt_parameters(12, 512, 512, 50257) == 63_823_360  # "64M"
    assert formulas.gpt_parameters(24, 1024, 1024, 50257) == 354_823_168  # not "512M"


def test_flops_closed_form_and_printed_dp2():
    b, s, layers, h, v = 8, 128, 4, 128, 512
    closed = 72 * b * s * layers * h**2 * (1 + s / (6 * h) + v / (12 * layers * h))
    assert metrics.flops_per_iteration(b, s, layers, h, v) == pytest.approx(closed)
    assert metrics.flops_per_iteration(b, s, layers, h, v, recompute=True) == pytest.approx(
        closed * 4 / 3
    )
    # dp2.log iteration 30: 214.0 ms on 2 ranks, printed "TFLOPs: 0.01" (2 decimals)
    tflops = metrics.tflops_per_gpu(closed, 214.0, 2)
    assert tflops == pytest.approx(0.014113, rel=1e-3)
    assert round(tflops, 2) == 0.01


@pytest.mark.parametrize(
    ("stage", "precision", "bytes_per_param"),
    # By hand, N = 2: fp32 16, 8 + 12/2, 4 + 16/2, 20/2; bf16 16, 4 + 12/2, 2 + 14/2, 16/2.
    [(0, "fp32", 16), (1, "fp32", 14), (2, "fp32", 12), (3, "fp32", 10),
     (0, "bf16", 16), (1, "bf16", 10), (2, "bf16", 9), (3, "bf16", 8)],
)  # fmt: skip
def test_model_state_per_zero_stage(stage: int, precision: str, bytes_per_param: int) -> None:
    setup = replace(DP2_SETUP, zero_stage=stage, precision=precision)
    row = metrics.compute(loaded(setup=setup))
    assert row.model_state_mb == pytest.approx(bytes_per_param * 875_264 / 2**20)


def test_compute_dp2_row():
    row = metrics.compute(loaded())
    assert row.last_iteration == 30
    assert row.iter_ms_mean == pytest.approx(209.84)
    assert row.samples_per_s == pytest.approx(8 / 0.20984)
    assert row.tokens_per_s == pytest.approx(8 / 0.20984 * 128)
    assert row.tflops == pytest.approx(0.01439, rel=1e-3)
    assert row.tflops_check == "agrees in all 5 windows within print rounding (0.005)"
    assert row.peak_mem_mb == pytest.approx(505.13671875)
    assert "RSS" in (row.mem_kind or "")
    assert row.comm_bytes_per_iter == 875264 * 4
    # Breakdown from the per-step timers of iterations 6 and 7 only (1-5 are warm-up).
    assert row.fwd_ms == pytest.approx((68.81 + 66.23) / 2)
    assert row.comm_ms == pytest.approx((9.73 + 12.07) / 2)
    # By hand: backward is bwd_inner (the all-reduce is bwd - bwd_inner, counted once as comm),
    # and 'other' is 209.84 - 67.52 - 64.935 - 10.9 - 9.49 = 56.995 ms.
    assert row.bwd_ms == pytest.approx((69.55 + 60.32) / 2)
    assert row.optimizer_ms == pytest.approx((10.17 + 8.81) / 2)
    assert row.other_ms == pytest.approx(56.995)
    assert row.breakdown_sources and "not covered" in row.breakdown_sources["other_ms"]
    # Timer bandwidth: 3,501,056 wire bytes in mean bwd_allreduce 10.9 ms.
    assert row.busbw_gbps_timers == pytest.approx(3_501_056 * 8 / 0.0109 / 1e9)
    assert row.busbw_gbps_measured is None
    assert "netbench" in row.na_reasons["busbw_gbps_measured"]
    assert row.iter_ms_std == pytest.approx(
        __import__("statistics").stdev([68.81 + 79.37 + 10.17, 66.23 + 72.48 + 8.81])
    )


def test_failed_run_keeps_reason():
    parsed = ParsedRun(status="failed")
    run = LoadedRun(
        name="pp2_fail", path="x", kind="log_files", parsed=parsed, setup=DP2_SETUP,
        status="failed", failure_kind="exception",
        failure_reason="TypeError: LayerNorm.__init__() got an unexpected keyword argument",
    )  # fmt: skip
    row = metrics.compute(run)
    assert row.iter_ms_mean is None
    assert "no iteration timing" in row.na_reasons["iter_ms_mean"]
    assert row.failure_reason and "LayerNorm" in row.failure_reason


def scaled(name: str, factor: float, strategy: str, zero: int) -> LoadedRun:
    windows = [(i, ms * factor) for i, ms in DP2_WINDOWS]
    setup = RunSetup(**{**DP2_SETUP.__dict__, "strategy": strategy, "zero_stage": zero})
    return loaded(name, dp2_parsed(windows=windows), setup)


def test_speedup_and_inferred_bandwidth():
    rows = [metrics.compute(r) for r in (loaded(), scaled("z2", 2.0, "zero2", 2))]
    rows += [metrics.compute(scaled("z1", 1.01, "zero1", 1))]
    base, z2, z1 = speedup.compare(rows)
    assert base.speedup == 1.0 and base.baseline == "dp2"
    assert z2.speedup == pytest.approx(0.5)
    assert z2.speedup_ci95_lo < 0.5 < z2.speedup_ci95_hi
    # ZeRO-2 sends 4 * 3.5 MB + 1.75 MB vs DP's 3.5 MB, in 209.84 ms more.
    extra = 4 * 3_501_056 + 3_501_056 / 2 - 3_501_056
    assert z2.busbw_gbps_inferred == pytest.approx(extra * 8 / 0.20984 / 1e9)
    # ZeRO-1 is 1% slower: the difference is inside the noise -> no inferred figure.
    assert z1.busbw_gbps_inferred is None
    assert "includes 0" in z1.na_reasons["busbw_gbps_inferred"]
    # DP sends the fewest bytes of its compute family: its reference is the zero-byte intercept
    # of the line through dp2 and z2, so two timings give it the same bandwidth as z2's pair.
    assert base.busbw_gbps_inferred == pytest.approx(z2.busbw_gbps_inferred)
    assert "zero-byte intercept" in base.na_reasons["busbw_gbps_inferred"]


def test_frame_schema_has_units_and_design_keys():
    frame = metrics.to_frame([metrics.compute(loaded())])
    assert list(frame.columns) == list(metrics.SCHEMA)
    assert str(frame["iter_ms_mean"].dtype) == "float64"
    assert str(frame["iter_ms_n"].dtype) == "Int64"
    for key in ("predicted_iter_ms", "prediction_error"):
        assert frame[key].isna().all()


def test_inferred_figure_far_from_the_link_is_flagged():
    # 2 nodes at 1 Gbit/s (emulated): DP 313.8 ms and ZeRO-2 623.1 ms per iteration gave
    # 12.25 MB in 309 ms = 0.317 Gbit/s, a third of what the link carries: the extra time is
    # host-side cost, and the report must say so rather than present it as the bandwidth.
    row = replace(metrics.compute(loaded()), link_mbit=1000.0, busbw_gbps_measured=None)
    warning = speedup.inferred_warning(row, 0.317)
    assert warning is not None and "-66% off the link rate x 0.94 (0.940)" in warning
    assert speedup.inferred_warning(row, 0.90) is None  # within 25% of 0.94
    measured = replace(row, busbw_gbps_measured=0.094)
    assert speedup.inferred_warning(measured, 0.086) is None  # 100 Mbit/s: -8.5%
    assert speedup.inferred_warning(replace(row, link_mbit=None), 0.317) is None  # no reference


# -- PipelineEngine timers (real two-node GPU logs, tests/fixtures/external/SOURCES.md) ---------

GPU_PP = "gpu2node-2025-pp2-64m"
# gpu2node-2025-pp2-64m_node0.log, the totals over 10 steps printed at steps 20..100 (the print
# at step 10 is the warm-up): `fwd | bwd | step` and `pipe_send_output | pipe_recv_grad`;
# `batch_input` from the `_microstep` lines.
GPU_FWD = [287.48, 285.94, 285.57, 285.09, 285.14, 286.72, 285.86, 287.05, 286.78]
GPU_BWD = [565.78, 565.52, 566.14, 565.97, 566.43, 567.18, 567.20, 567.40, 566.46]
GPU_STEP = [107.53, 109.41, 109.96, 108.24, 106.06, 108.24, 108.45, 106.25, 107.79]
GPU_BATCH = [26.09, 25.83, 26.19, 26.49, 25.83, 25.99, 25.96, 25.51, 25.65]
GPU_SEND = [8.21, 8.23, 8.23, 8.28, 8.29, 8.25, 8.21, 8.18, 8.22]
GPU_RECV = [1248.95, 1278.22, 1413.12, 1418.61, 1433.07, 1435.89, 1439.54, 1435.49, 1441.38]
# gpu2node-2025-pp2-64m_node1.log: elapsed time per iteration (ms) at iterations 20..100.
GPU_ITER = [668.8, 671.3, 685.2, 686.2, 687.2, 687.6, 689.1, 687.8, 688.1]


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def test_pipeline_engine_timers_per_iteration_wait_and_named_remainder(tmp_path):
    """fwd/bwd/step = printed total / steps_per_print (10, counted between the `steps:` lines:
    the log has no DeepSpeed config dump); wait = pipe_send_output + pipe_recv_grad beside
    (p-1)/(m+p-1) = 1/5; the untimed rest is the tied-embedding all-reduce, 50304 x 512 fp16
    gradients = 51,511,296 bytes between the two nodes."""
    from pathlib import Path

    from analysis.runs import load

    src = Path(__file__).parent / "fixtures" / "external"
    for n in (0, 1):
        (tmp_path / f"{GPU_PP}_node{n}.log").write_bytes(
            (src / f"{GPU_PP}_node{n}.log").read_bytes()
        )
    (run,) = load.discover(tmp_path)
    assert run.setup.steps_per_print == 10 and run.setup.gas == 4 and run.setup.pp == 2
    assert "steps:" in run.setup.sources["steps_per_print"]
    row = metrics.compute(run)
    assert row.iter_ms_mean == pytest.approx(_mean(GPU_ITER))
    assert row.fwd_ms == pytest.approx(_mean(GPU_FWD) / 10)
    assert row.bwd_ms == pytest.approx(_mean(GPU_BWD) / 10)
    assert row.optimizer_ms == pytest.approx(_mean(GPU_STEP) / 10)
    assert row.data_ms == pytest.approx(_mean(GPU_BATCH) / 10)
    wait = (_mean(GPU_SEND) + _mean(GPU_RECV)) / 10
    assert row.pipe_wait_ms == pytest.approx(wait)
    busy = (_mean(GPU_FWD) + _mean(GPU_BWD)) / 10
    assert row.pipe_wait_share == pytest.approx(wait / (busy + wait))
    assert row.pipe_bubble_theory == pytest.approx(1 / 5)
    timed = busy + wait + (_mean(GPU_STEP) + _mean(GPU_BATCH)) / 10
    assert row.other_ms == pytest.approx(_mean(GPU_ITER) - timed)
    assert row.other_named is not None
    assert "_exec_reduce_tied_grads, 51.5 MB" in row.other_named
    # ring all-reduce over 2 ranks: 2(n-1)/n x S = S bytes on the wire per rank
    assert row.other_busbw_gbps == pytest.approx(51_511_296 * 8 / (row.other_ms / 1e3) / 1e9)


def test_pipeline_timers_without_steps_per_print_are_not_divided(tmp_path):
    """`steps:` lines at 10 and 30 do not tell steps_per_print (10 or 20 would print both) and
    there is no config: the totals cover an unknown number of steps, so no figure from them."""
    from analysis.runs import load

    text = "\n".join(
        [
            "using world size: 2, data-parallel-size: 1, tensor-model-parallel size: 1, "
            "pipeline-model-parallel size: 2",
            "training ...",
            "[Rank 0] time (ms) | fwd: 450.35 | bwd: 592.80 | step: 167.23",
            "steps: 10 loss: 10.3759 iter time (s): 0.721 samples/sec: 11.097",
            "[Rank 0] time (ms) | fwd: 287.48 | bwd: 565.78 | step: 107.53",
            "steps: 30 loss: 9.7433 iter time (s): 0.671 samples/sec: 11.927",
        ]
    )
    (tmp_path / "pp.log").write_text(text + "\n")
    (run,) = load.discover(tmp_path)
    assert run.setup.steps_per_print is None
    row = metrics.compute(run)
    assert row.iter_ms_mean == pytest.approx(671.0)
    assert row.fwd_ms is None and row.pipe_wait_ms is None
    assert "steps_per_print" in row.na_reasons["fwd_ms"]
    assert run.parsed is not None
    pool = timers.pipeline_timers(run.parsed, 10)
    assert pool["fwd"] == [pytest.approx(28.748)] and pool["step"] == [pytest.approx(10.753)]


def test_megatron_timers_column_wise_equal_block_by_block(tmp_path):
    """Read column-wise, Megatron's timer samples are those of a loop over the blocks: the
    same names in the same order, the same values in block order (real, external and
    generated logs; blocks with a NaN in a (min, max) pair, names in another order)."""
    import sys
    from pathlib import Path

    from analysis.metrics import timers
    from analysis.parse.reader import parse_file
    from analysis.parse.records import TimerTable

    repo = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(repo / "benchmarks"))
    import loggen

    logs = sorted(LAB_LOGS.glob("*.log")) + sorted((repo / "tests/fixtures/external").glob("*.log"))
    logs.append(tmp_path / "dense.log")
    loggen.write_dense(logs[-1], 0.5, LAB_LOGS)
    runs = [r for p in logs for r in parse_file(p)]
    nan_blocks = [
        TimerBlock("megatron", {"forward-compute": (math.nan, 2.0), "optimizer": 1.0}, None, 1, 3),
        TimerBlock("megatron", {"forward-compute": (1.5, math.nan), "optimizer": 2.0}, None, 2, 7),
        TimerBlock("megatron", {"optimizer": 3.0, "forward-compute": (1.0, 2.0)}, None, 3, 9),
    ]
    runs += [ParsedRun(timers=nan_blocks), ParsedRun(timers=TimerTable(nan_blocks))]
    # A group whose first block is in the warm-up, then one with the names the other way round.
    swapped = [
        TimerBlock("megatron", {"forward-compute": (1.0, 2.0), "optimizer": 1.0}, None, 1, 3),
        TimerBlock("megatron", {"optimizer": 2.0, "forward-compute": (1.5, 2.5)}, None, 2, 7),
        TimerBlock("megatron", {"forward-compute": (1.0, 2.0), "optimizer": 3.0}, None, 3, 9),
    ]
    runs.append(ParsedRun(timers=TimerTable(swapped)))
    assert any(len(r.timers) for r in runs)
    for run in runs:
        for after in (0, 1, 10, 1000):
            want = timers._megatron_timers_by_block(run, after)
            got = timers.megatron_timers(run, after)
            assert list(got) == list(want)
            for k in want:
                assert str(list(got[k])) == str(want[k])


def test_last_iteration_is_the_largest_number_of_a_table_or_a_list():
    """The last iteration of a run whose lines are out of order (a resumed run) is the
    largest number, read from a table's column or from plain records."""
    from analysis.parse.records import PipelineStep, PipelineStepTable

    steps = [PipelineStep(n, None, 1.0, None, line=i) for i, n in enumerate([40, 90, 10, 50])]
    assert metrics._last_number(PipelineStepTable(steps), "step") == 90
    assert metrics._last_number(steps, "step") == 90
    assert metrics._last_number(PipelineStepTable(), "step") is None
    # A number past 64 bits (text the parser kept) is read as a Python int, not an overflow.
    huge = [PipelineStep(n, None, 1.0, None) for n in (5, 2**70, 7)]
    assert metrics._last_number(PipelineStepTable(huge), "step") == 2**70


def test_describe_of_many_samples_agrees_with_the_exact_statistics():
    """Past ``_EXACT_UP_TO`` samples (a log-interval-1 run of millions of iterations),
    ``describe`` works on an array: the mean and median as ``statistics`` gives them, the
    standard deviation and interval to within a few units in the last place."""
    import statistics

    import numpy as np

    rng = np.random.default_rng(0)
    x = 200.0 + rng.normal(0.0, 5.0, stats.EXACT_UP_TO + 11)
    got = stats.describe(x)
    values = x.tolist()
    assert got.n == len(values)
    assert got.mean == statistics.fmean(values)
    assert got.median == statistics.median(values)
    std = statistics.stdev(values)
    assert got.std == pytest.approx(std, rel=1e-12)
    assert stats.sample_std(x) == got.std  # (the per-iteration spread is taken the same way)
    assert stats.sample_std(x[:1000]) == statistics.stdev(values[:1000])  # exact below
    half = stats.t95(len(values) - 1) * std / math.sqrt(len(values))
    assert (got.ci_lo, got.ci_hi) == pytest.approx((got.mean - half, got.mean + half), rel=1e-15)


def test_describe_of_two_million_samples_holds_no_python_float_each():
    """A 2M-iteration run's steady state is described from its array: 15 MiB at the peak
    (the median's copy), where a list of floats and ``statistics`` took 85 MiB."""
    import tracemalloc

    import numpy as np

    x = 200.0 + np.random.default_rng(0).normal(0.0, 5.0, 2_000_000)
    tracemalloc.start()
    try:
        stats.describe(x)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 32 * 2**20, f"describe peaked at {peak / 2**20:.0f} MiB"


@pytest.mark.parametrize("as_table", [True, False], ids=["table", "list"])
@pytest.mark.parametrize(
    ("steps", "want"),
    [([10, 20, 30], 10), ([10, 20, 35], None), ([5, 15, 25], None), ([10], None), ([], None)],
)
def test_steps_per_print_from_step_lines_only_when_evenly_spaced(steps, want, as_table):
    """``steps: N`` lines every k steps from a multiple of k give DeepSpeed's
    ``steps_per_print``; lines of two spacings, or from another start, give nothing."""
    from analysis.parse.records import ParsedRun, PipelineStep, PipelineStepTable
    from analysis.runs import load

    records = [PipelineStep(n, None, 1.0, None) for n in steps]
    run = ParsedRun(pipeline_steps=PipelineStepTable(records) if as_table else records)
    got: dict[str, object] = {}
    load._log_steps_per_print(
        run, lambda key, value, _src: value is None or got.setdefault(key, value)
    )
    assert got.get("steps_per_print") == want


def test_negative_remainder_is_not_a_time():
    mg = {"forward-backward": [130.0, 131.0, 129.0], "optimizer": [5.0, 5.0, 5.0]}
    bd, why = timers.breakdown(100.0, DP2_SETUP, {}, mg, None, 2.0)
    assert why is None and bd is not None
    assert bd.other_ms is None and "35.0 ms more than the 100.0 ms iteration" in bd.other_na
    assert "disagree" in bd.other_na
    close = {"forward-backward": [100.5, 101.5, 99.5], "optimizer": [0.5, 0.5, 0.5]}
    bd, _ = timers.breakdown(100.0, DP2_SETUP, {}, close, None, 3.0)
    assert bd.other_ms == 0.0 and "within the noise" in bd.other_na
    fine, _ = timers.breakdown(100.0, DP2_SETUP, {}, {"forward-backward": [90.0]}, None, 1.0)
    assert fine.other_ms == pytest.approx(10.0) and fine.other_na is None
