"""Profiler traces: the ``--profile`` switch down to upstream's flags, reading a run's traces, the
per-rank breakdown (exact on a constructed trace, adding up on a real one) and the report."""

from __future__ import annotations

import dataclasses
import gzip
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from analysis.metrics.traces import breakdown
from analysis.report.build import build
from analysis.report.traces import window_timers
from analysis.runs.load import discover
from analysis.runs.traces import TraceError, read_trace, run_traces
from launchers.cli import main as cli_main
from launchers.config.hostfile import parse_hostfile_text
from launchers.config.presets import resolve_spec
from launchers.config.project import megatron_args
from launchers.config.spec import (
    PLACEHOLDER_PATHS,
    RunSpec,
    SpecError,
    spec_from_json,
    spec_hash,
    spec_to_json,
    steady_profile_steps,
)

FIXTURES = Path(__file__).parent / "fixtures" / "traces"


def tiny_pipeline(**overrides: Any) -> RunSpec:
    hosts = parse_hostfile_text("node0 slots=1\nnode1 slots=1\n", "hf")
    return resolve_spec(
        "tiny", "pipeline", hosts, overrides, device="cpu", launcher="pdsh", paths=PLACEHOLDER_PATHS
    )


# ------------------------------------------------------------------------------ the switch


def test_profile_records_the_last_logging_window() -> None:
    spec = tiny_pipeline()  # 30 iterations logged every 5: window 26-30 is the last
    assert steady_profile_steps(spec.training) == (26, 30)
    assert steady_profile_steps(tiny_pipeline(train_iters=12, log_interval=4).training) == (9, 12)
    # iterations past the last whole window are not logged: the last logged window is taken
    assert steady_profile_steps(tiny_pipeline(train_iters=33).training) == (26, 30)


def test_profile_needs_a_window_past_the_warm_up() -> None:
    with pytest.raises(SpecError, match=r"train_iters\(9\) // log_interval\(5\) = 1 .*>= 10"):
        steady_profile_steps(tiny_pipeline(train_iters=9).training)


def test_profiled_spec_passes_upstreams_switches_and_keeps_other_hashes() -> None:
    plain = tiny_pipeline()
    argv = megatron_args(plain, "/run")
    assert "--profile" not in argv and "--profile_steps" not in argv
    assert "profile_steps" not in spec_to_json(plain)  # earlier runs keep their hash

    profiled = dataclasses.replace(plain, profile_steps=(26, 30))
    argv = megatron_args(profiled, "/run")
    at = argv.index("--profile")
    assert argv[at : at + 4] == ["--profile", "pt", "--profile_steps", "26,30"]
    assert argv[argv.index("--tensorboard-dir") + 1] == "/run/tensorboard"  # where traces land
    data = spec_to_json(profiled)
    assert data["profile_steps"] == [26, 30]
    assert spec_hash(profiled) != spec_hash(plain)
    assert spec_from_json(json.loads(json.dumps(data)), plain.cluster.text) == profiled


def test_profile_steps_outside_the_run_are_refused() -> None:
    with pytest.raises(SpecError, match=r"profile_steps\(26,31\).*train_iters\(30\)"):
        dataclasses.replace(tiny_pipeline(), profile_steps=(26, 31))
    with pytest.raises(SpecError, match=r"profile_steps\(0,3\)"):
        dataclasses.replace(tiny_pipeline(), profile_steps=(0, 3))


def test_cli_profile_reaches_launch_sh(capsys: pytest.CaptureFixture[str]) -> None:
    status = cli_main(
        ["run", "--model", "tiny", "--strategy", "pipeline", "--device", "cpu", "--profile",
         "--dry-run"]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert status == 0
    assert "--profile pt" in out and "--profile_steps 26,30" in out


# ------------------------------------------------------------------------------ reading


def write_trace(path: Path, events: list[dict[str, Any]], **top: Any) -> Path:
    """A Chrome trace as the profiler writes it (gzipped when the name says so)."""
    doc = {"schemaVersion": 1, "traceEvents": events, **top}
    text = json.dumps(doc)
    if path.name.endswith(".gz"):
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def op(name: str, start: float, end: float, tid: int = 1, cat: str = "cpu_op") -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": start,
            "dur": end - start}  # fmt: skip


def test_the_real_traces_are_found_and_say_their_rank() -> None:
    traces = run_traces(FIXTURES / "tiny-pipeline")[0]
    assert [(t.rank, t.world_size, t.backend) for t in traces] == [(0, 2, "gloo"), (1, 2, "gloo")]
    assert all(Path(t.path).name.endswith(".pt.trace.json.gz") for t in traces)
    assert all(any(s.name.startswith("ProfilerStep#") for s in t.spans) for t in traces)


def test_a_broken_trace_names_its_file_and_field(tmp_path: Path) -> None:
    cut = tmp_path / "cut.pt.trace.json.gz"
    cut.write_bytes(gzip.compress(b'{"traceEvents": [')[:-8])
    with pytest.raises(TraceError, match=r"cut\.pt\.trace\.json\.gz: not a readable Chrome trace"):
        read_trace(cut)
    with pytest.raises(TraceError, match="no 'traceEvents' list"):
        read_trace(_no_events(tmp_path))
    bad = write_trace(tmp_path / "b.pt.trace.json", [op("aten::mm", 0, 1) | {"dur": "1"}])
    with pytest.raises(TraceError, match=r"traceEvents\[0\] \('aten::mm'\): field 'dur'"):
        read_trace(bad)


def _no_events(tmp_path: Path) -> Path:
    path = tmp_path / "e.pt.trace.json"
    path.write_text(json.dumps({"schemaVersion": 1}))
    return path


# ------------------------------------------------------------------------------ breakdown


def test_cpu_breakdown_of_a_constructed_trace_is_exact(tmp_path: Path) -> None:
    events = [
        op("ProfilerStep#0", 0, 1000, cat="user_annotation"),
        op("ProfilerStep#1", 1000, 2000, cat="user_annotation"),
        op("aten::mm", 100, 400),  # compute, its copy is memory copy
        op("aten::copy_", 200, 250),
        op("c10d::allreduce_", 500, 700),  # communication, the copy in it too
        op("aten::copy_", 550, 600),
        op("aten::zeros", 520, 540),  # an operator inside the collective is communication
        op("gloo:all_reduce", 650, 900, tid=2, cat="user_annotation"),  # gloo's own thread
        op("aten::add", 800, 850),  # compute while gloo works: overlap
        op("forward", 1000, 2000, cat="user_annotation"),  # a label, not work
        op("aten::mm", 1100, 1900),
        op("aten::mm", 2100, 2200),  # after the profiled steps
    ]
    trace = read_trace(write_trace(tmp_path / "r.pt.trace.json", events,
                                   distributedInfo={"rank": 3, "world_size": 4}))  # fmt: skip
    b = breakdown(trace)
    assert (b.rank, b.timeline, b.steps) == (3, "cpu", 2)
    # per iteration (2): compute 250 + 50 + 800 us, communication [500, 900] less the 50 us of
    # compute in it, copy 50 us, idle the rest of 2000 us
    assert b.iteration_ms == pytest.approx(1.0)
    assert b.compute_ms == pytest.approx(0.55)
    assert b.comm_ms == pytest.approx(0.175)
    assert b.memcpy_ms == pytest.approx(0.025)
    assert b.idle_ms == pytest.approx(0.25)
    assert b.comm_total_ms == pytest.approx(0.2)
    assert b.overlap_pct == pytest.approx(12.5)
    assert b.waiting_ms == pytest.approx(0.45)


def test_gpu_breakdown_reads_the_kernels_as_hta_does(tmp_path: Path) -> None:
    events = [
        op("ProfilerStep#0", 0, 1000, cat="user_annotation"),
        op("aten::mm", 0, 900),  # the host's side: not the GPU timeline
        op("ampere_sgemm_128x64_nn", 100, 300, tid=7, cat="kernel"),
        op("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 200, 500, tid=20, cat="kernel"),
        op("Memcpy DtoH (Device -> Pinned)", 600, 700, tid=7, cat="gpu_memcpy"),
    ]
    b = breakdown(read_trace(write_trace(tmp_path / "g.pt.trace.json.gz", events)))
    assert (b.rank, b.timeline) == (None, "gpu")
    assert (b.compute_ms, b.comm_ms, b.memcpy_ms, b.idle_ms) == pytest.approx((0.2, 0.2, 0.1, 0.5))
    assert b.overlap_pct == pytest.approx(100 / 3)


def test_gpu_steps_are_the_kernels_their_steps_launched(tmp_path: Path) -> None:
    """On the GPU the steps run behind the host: the kernels launched (correlation ids) within
    the profiled steps are the steps' GPU time, wherever they run, and only those."""
    launch = {"cat": "cuda_runtime"}
    events = [
        op("ProfilerStep#0", 0, 1000, cat="user_annotation"),
        {**op("cudaLaunchKernel", -50, -40), **launch, "args": {"correlation": 1}},  # before
        {**op("cudaLaunchKernel", 10, 20), **launch, "args": {"correlation": 2}},
        {**op("cudaLaunchKernel", 900, 910), **launch, "args": {"correlation": 3}},
        {**op("sgemm_before", 0, 150, tid=7, cat="kernel"), "args": {"correlation": 1}},
        {**op("sgemm", 200, 600, tid=7, cat="kernel"), "args": {"correlation": 2}},
        {**op("ncclKernel_AllReduce", 1000, 1400, tid=9, cat="kernel"), "args": {"correlation": 3}},
    ]
    b = breakdown(read_trace(write_trace(tmp_path / "c.pt.trace.json", events)))
    # The GPU span of the step: 200 (its first kernel) to 1400 (its last one's end).
    assert b.iteration_ms == pytest.approx(1.2)
    assert (b.compute_ms, b.comm_ms, b.memcpy_ms, b.idle_ms) == pytest.approx((0.4, 0.4, 0, 0.4))


def test_a_real_cuda_trace_breaks_down_as_hta_does() -> None:
    """One rank of HTA's own test data (fixtures/traces/hta/SOURCES.md): the microseconds HTA's
    temporal breakdown gives for it (kernel time, compute, idle, the rest) and its overlap."""
    b = breakdown(read_trace(FIXTURES / "hta" / "sampled_rank-0.pt.trace.json.gz"))
    assert (b.timeline, b.steps) == ("gpu", 2)
    us = {
        k: round(v * b.steps * 1000) for k, v in dataclasses.asdict(b).items() if k.endswith("_ms")
    }
    assert us["iteration_ms"] == 1_222_847
    assert (us["compute_ms"], us["idle_ms"]) == (210_320, 675_191)
    assert round((b.comm_ms + b.memcpy_ms) * b.steps * 1000) == 337_336  # HTA's non-compute
    assert round(b.overlap_pct, 2) == 14.95


def test_a_trace_without_steps_says_so(tmp_path: Path) -> None:
    trace = read_trace(write_trace(tmp_path / "n.pt.trace.json", [op("aten::mm", 0, 5)]))
    with pytest.raises(ValueError, match="no ProfilerStep#N annotation"):
        breakdown(trace)


def test_the_real_traces_categories_add_up_to_the_iteration() -> None:
    for trace in run_traces(FIXTURES / "tiny-pipeline")[0]:
        b = breakdown(trace)
        steps = [s for s in trace.spans if s.name.startswith("ProfilerStep#")]
        assert b.steps == len(steps) == 1  # the run: iterations 1-3 logged each, 3 profiled
        assert b.iteration_ms == pytest.approx(sum(s.dur_us for s in steps) / 1000 / len(steps))
        parts = (b.compute_ms, b.comm_ms, b.memcpy_ms, b.idle_ms)
        assert all(p >= 0 for p in parts)
        assert sum(parts) == pytest.approx(b.iteration_ms, rel=1e-9)
        # a pipeline stage computes and waits for its neighbour in gloo's p2p
        assert b.compute_ms > 0 and b.comm_ms > 0


# ------------------------------------------------------------------------------ report


def test_report_shows_the_profiled_run_beside_its_text_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    logdir = tmp_path / "logs"
    shutil.copytree(FIXTURES / "tiny-pipeline", logdir / "tiny-pipeline")
    build(logdir, tmp_path / "report")
    printed = capsys.readouterr().out
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    (profile,) = summary["profiles"]
    assert profile["profile_steps"] == [3, 3]
    assert [(r["rank"], r["stage"]) for r in profile["ranks"]] == [(0, 0), (1, 1)]
    # the log's line for iteration 3 (log interval 1) times the same iteration as the traces
    assert profile["logged_iteration_ms"] == 68.9
    assert profile["trace_iteration_ms"] == pytest.approx(68.9, rel=0.05)
    assert profile["bubble_theory"] == pytest.approx(1 / 3)  # p 2, m 2: (p-1)/(m+p-1)
    md = (tmp_path / "report" / "report.md").read_text()
    assert "## Profiler traces" in md and "| stage | ranks | ms/iter | waiting ms" in md
    assert "iteration line for the same iterations: 68.9 ms/iteration" in md
    assert "profile tiny-pipeline (iteration 3)" in printed
    assert "rank 1 (stage 1):" in printed


def test_a_trace_cut_short_is_named_and_the_other_ranks_stay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "logs" / "tiny-pipeline"
    shutil.copytree(FIXTURES / "tiny-pipeline", run_dir)
    first = sorted((run_dir / "tensorboard").glob("*.pt.trace.json.gz"))[0]
    first.write_bytes(first.read_bytes()[: first.stat().st_size // 2])  # a run stopped mid-export
    traces, unreadable = run_traces(run_dir)
    assert len(traces) == 1 and len(unreadable) == 1 and first.name in unreadable[0]
    build(tmp_path / "logs", tmp_path / "report")
    capsys.readouterr()
    (profile,) = json.loads((tmp_path / "report" / "summary.json").read_text())["profiles"]
    assert [r["rank"] for r in profile["ranks"]] == [traces[0].rank]
    assert first.name in profile["problems"][0]
    md = (tmp_path / "report" / "report.md").read_text()
    assert f"trace not analysed: {first}" in md and "1 of 2 ranks traced" in md


def test_the_real_traces_nest_but_for_gloos_p2p_annotations() -> None:
    """What Perfetto's JSON importer expects of the slices of one thread: that they nest. In the
    real traces only gloo's send/recv annotations do not (they end at the wait, after the
    c10d operator that opened them); docs/profiling.md says so."""
    for trace in run_traces(FIXTURES / "tiny-pipeline")[0]:
        by_thread: dict[tuple[str, str], list[Any]] = {}
        for s in trace.spans:
            if s.cat in ("cpu_op", "user_annotation"):
                by_thread.setdefault((s.pid, s.tid), []).append(s)
        crossing = []
        for spans in by_thread.values():
            spans.sort(key=lambda s: (s.start_us, -s.dur_us))
            stack: list[Any] = []
            for s in spans:
                while stack and stack[-1].end_us <= s.start_us:
                    stack.pop()
                if stack and s.end_us > stack[-1].end_us:
                    crossing.append((s.name, stack[-1].name))
                stack.append(s)
        assert crossing, "the fixture's gloo p2p annotations cross their parent"
        assert set(crossing) <= {
            ("gloo:send", "c10d::send"),
            ("gloo:recv", "c10d::recv_"),
        }


def test_the_timers_of_the_profiled_iterations_are_those_steps_alone() -> None:
    """DeepSpeed's per-step timers of the profiled iterations, on a real ZeRO-2 lab run: the
    ``fwd:`` lines of those steps alone (26-30: the last five of its 30)."""
    (run,) = discover(Path(__file__).parent / "fixtures" / "tensorboard")
    timers = window_timers(run, (26, 30))
    assert timers["fwd"] == pytest.approx((71.93 + 62.17 + 52.88 + 62.76 + 63.82) / 5)
    assert set(timers) >= {"fwd", "bwd", "bwd_inner", "bwd_allreduce", "step"}
    timers = window_timers(run, (6, 10))  # a window in the middle: the steps after it left out
    assert timers["fwd"] == pytest.approx((127.31 + 102.07 + 89.23 + 106.06 + 82.56) / 5)
    assert window_timers(run, None) == {}
