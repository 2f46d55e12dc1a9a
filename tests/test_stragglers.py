"""Straggler ranks: a 64-rank ``--timing-log-option all`` log with one planted slow rank is named
with its node and excess; with none planted, none is; the rule's bound is what separates them."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from analysis.metrics import stragglers
from analysis.report.build import build
from analysis.runs import load

TIMERS = (("forward-backward", 2900.0, 3300.0), ("batch-generator", 1.0, 9.0))
TIMERS += (("optimizer", 400.0, 440.0),)


def all_ranks_log(
    path: Path,
    ranks: int = 64,
    per_node: int = 8,
    iters: int = 30,
    slow: int | None = None,
    factor: float = 1.6,
    seed: int = 0,
) -> None:
    """A bare log as upstream prints it with ``--timing-log-option all`` under ``srun --label``:
    DeepSpeed's launcher lines (``num_local_procs``, ``global_rank_mapping``: hosts ``gpu-NN``),
    then per iteration rank 0's DeepSpeed timer line, the last rank's iteration line and its
    ``times across ranks`` block of every rank's time of three timers; rank ``slow``'s
    ``optimizer`` time ``factor`` times the others'."""
    rng = random.Random(seed)
    nodes = ranks // per_node
    mapping = {f"gpu-{n:02d}": list(range(n * per_node, (n + 1) * per_node)) for n in range(nodes)}
    last = f"{ranks - 1:2d}: "
    lines = [
        f" 0: [2026-11-22 03:00:00,001] [INFO] [launch.py:168:main] nnodes={nodes}, "
        f"num_local_procs={per_node}, node_rank=0",
        " 0: [2026-11-22 03:00:00,001] [INFO] [launch.py:179:main] global_rank_mapping="
        f"defaultdict(<class 'list'>, {mapping})",
        f" 0: using world size: {ranks}, data-parallel-size: {ranks}, tensor-model-parallel size: "
        "1, pipeline-model-parallel size: 1",
        " 0: training ...",
    ]
    for it in range(1, iters + 1):
        warm = 3.0 if it == 1 else 1.0
        lines += [
            f" 0: [Rank 0] time (ms) | fwd: {rng.uniform(900, 1300):.2f} | bwd: "
            f"{rng.uniform(1800, 2600):.2f} | step: {rng.uniform(400, 440):.2f}",
            f"{last} [2026-11-22 03:00:{it % 60:02d}] iteration {it:8d}/{iters:8d} | consumed "
            f"samples: {it * 512:12d} | elapsed time per iteration (ms): "
            f"{warm * rng.uniform(3400, 3500):.1f} | learning rate: 3.000000E-04 | global batch "
            f"size:   512 | lm loss: {rng.uniform(1.8, 2.4):.6E} | loss scale: 1.0 | number of "
            "skipped iterations:   0 | number of nan iterations:   0 |",
            f"{last}times across ranks (ms):",
        ]
        for name, lo, hi in TIMERS:
            lines.append(f"{last}  {name}:")
            for r in range(ranks):
                ms = rng.uniform(lo, hi) * (factor if r == slow and name == "optimizer" else 1.0)
                lines.append(f"{last}     rank {r:2d}: {ms:.2f}")
    lines.append(" 0: [after training is done] datetime: 2026-11-22 09:00:00")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _analyze(tmp_path: Path, **kw: object) -> stragglers.StragglerResult:
    all_ranks_log(tmp_path / "ranks64.log", **kw)  # type: ignore[arg-type]
    (run,) = load.discover(tmp_path)
    return stragglers.analyze(run, tmp_path)


def test_planted_slow_rank_is_named_with_its_node(tmp_path):
    res = _analyze(tmp_path, slow=37)
    assert res.na is None
    by = {v.timer: v for v in res.verdicts}
    assert set(by) == {"forward-backward", "batch-generator", "optimizer"}
    assert {v.ranks for v in res.verdicts} == {64}
    opt = by["optimizer"]
    assert opt.stragglers == (37,) and opt.straggler_nodes == ("gpu-04",)
    assert opt.slowest_rank == 37 and opt.windows == 29  # the warm-up window left out
    assert opt.excess_pct == pytest.approx(60, abs=5)
    assert [v.timer for v in res.stragglers] == ["optimizer"]
    assert res.nodes_from == "DeepSpeed's launcher line global_rank_mapping"


def test_no_planted_rank_names_none(tmp_path):
    res = _analyze(tmp_path)
    assert res.na is None and len(res.verdicts) == 3
    assert res.stragglers == []
    assert res.agree_pct is not None and res.agree_pct < 3  # uniform scatter, 29 windows


def test_the_report_and_summary_name_the_rank(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    all_ranks_log(logs / "ranks64.log", slow=12)
    build(logs, tmp_path / "report")
    md = (tmp_path / "report" / "report.md").read_text()
    summary = md.split("## Executive summary")[1].split("\n## ")[0]
    assert "**stragglers** in ranks64" in summary and "rank 12 (gpu-01)" in summary
    assert "## Stragglers" in md
    (row,) = json.loads((tmp_path / "report" / "summary.json").read_text())["runs"]
    (found,) = row["stragglers"]["stragglers"]
    assert found["timer"] == "optimizer" and found["ranks"] == [12]
    assert found["nodes"] == ["gpu-01"]


def test_the_report_says_the_ranks_agree_without_one(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    all_ranks_log(logs / "ranks64.log")
    build(logs, tmp_path / "report")
    md = (tmp_path / "report" / "report.md").read_text()
    assert "**stragglers**" not in md
    assert "ranks64: no straggler: the ranks agree within" in md
    (row,) = json.loads((tmp_path / "report" / "summary.json").read_text())["runs"]
    assert row["stragglers"]["stragglers"] == []


def test_scatter_alone_is_no_straggler_but_a_rank_beyond_the_bound_is():
    """The bound: median + 3.5 scaled MADs (at least 2% of the median each), and an excess of
    2% of the iteration; a rank just inside is not named, just outside it is."""
    means = {r: 100.0 + (r % 5) for r in range(20)}  # median 102, MAD 1: scatter 2.04
    bound = 102 + 3.5 * max(1.4826, 0.02 * 102)
    inside = stragglers.judge("t", "megatron", means | {20: bound - 0.01}, 9, 100.0, {})
    assert inside.stragglers == () and inside.bound_ms == pytest.approx(bound)
    outside = stragglers.judge("t", "megatron", means | {20: bound + 0.01}, 9, 100.0, {})
    assert outside.stragglers == (20,)
    # Beyond the bound but less than 2% of a 1000 ms iteration: not material.
    small = stragglers.judge("t", "megatron", means | {20: 119.0}, 9, 1000.0, {})
    assert small.stragglers == ()
    assert stragglers.judge("t", "megatron", means | {20: 122.5}, 9, 1000.0, {}).stragglers


def test_a_log_without_per_rank_timers_says_why(tmp_path):
    fixture = Path(__file__).parent / "fixtures" / "lab-logs" / "dp2.log"
    (tmp_path / "dp2.log").write_bytes(fixture.read_bytes())
    (run,) = load.discover(tmp_path)
    res = stragglers.analyze(run, tmp_path)
    assert res.verdicts == () and res.na is not None
    assert "no times across ranks block" in res.na and "minmax" in res.na
    assert "DeepSpeed timer lines of 1 rank(s)" in res.na


def test_deepspeed_lines_of_every_rank_name_the_slow_one(tmp_path):
    """Eight ranks each printing DeepSpeed's ``[Rank r] time (ms)`` line every step (more than
    upstream's rank 0): rank 5's ``step`` three times the others' is named; ``fwd`` is not."""
    rng = random.Random(1)
    lines = [" 0: training ..."]
    for it in range(1, 13):
        for r in range(8):
            step = 50.0 * (3 if r == 5 else 1) * rng.uniform(0.98, 1.02)
            lines.append(
                f"{r:2d}: [Rank {r}] time (ms) | fwd: {rng.uniform(95, 105):.2f} | bwd: "
                f"{rng.uniform(190, 210):.2f} | step: {step:.2f}"
            )
        lines.append(
            f" 7:  iteration {it:8d}/      12 | consumed samples: {it * 8:12d} | elapsed time "
            f"per iteration (ms): {rng.uniform(400, 420):.1f} | learning rate: 3.0E-04 | global "
            "batch size:     8 | lm loss: 2.0E+00 | loss scale: 1.0 | number of skipped "
            "iterations:   0 | number of nan iterations:   0 |"
        )
    (tmp_path / "ds8.log").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (run,) = load.discover(tmp_path)
    res = stragglers.analyze(run, tmp_path)
    by = {v.timer: v for v in res.verdicts}
    assert set(by) == {"fwd", "bwd", "step"} and {v.source for v in res.verdicts} == {"deepspeed"}
    assert by["step"].stragglers == (5,) and by["step"].windows == 11
    assert by["step"].straggler_nodes == (None,) and res.nodes_from is None
    assert not by["fwd"].stragglers and not by["bwd"].stragglers


TRACE_RUN = Path(__file__).parent / "fixtures" / "traces" / "tiny-pipeline"


def _trace(rank: int, compute_ms: float, step_ms: float = 100.0, steps: int = 5) -> dict:
    """A CPU profiler trace of one rank: ``steps`` steps of ``step_ms``, each ``compute_ms`` of
    ``aten::mm``, then a gloo all-reduce to 2 ms before the step's end (the rest idle)."""
    events = []
    for i in range(steps):
        t0 = 1_000.0 + i * step_ms * 1000
        events.append(
            {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i + 1}", "ts": t0,
             "dur": step_ms * 1000, "pid": 1, "tid": 1}
        )  # fmt: skip
        events.append(
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": t0,
             "dur": compute_ms * 1000, "pid": 1, "tid": 1}
        )  # fmt: skip
        events.append(
            {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_",
             "ts": t0 + compute_ms * 1000, "dur": (step_ms - compute_ms - 2) * 1000,
             "pid": 1, "tid": 1}
        )  # fmt: skip
    info = {"rank": rank, "world_size": 4, "backend": "gloo"}
    return {"traceEvents": events, "distributedInfo": info}


def _profiled_run(tmp_path: Path, computes: dict[int, float]) -> stragglers.StragglerResult:
    """The fixture run directory (its log and run record) with four constructed rank traces."""
    run_dir = tmp_path / "tiny-pipeline"
    run_dir.mkdir()
    for f in TRACE_RUN.iterdir():
        if f.is_file():
            (run_dir / f.name).write_bytes(f.read_bytes())
    (run_dir / "tensorboard").mkdir()
    for rank, ms in computes.items():
        doc = _trace(rank, ms)
        (run_dir / "tensorboard" / f"vm_{rank}.1.pt.trace.json").write_text(json.dumps(doc))
    (run,) = load.discover(tmp_path)
    return stragglers.analyze(run, tmp_path)


def test_profiler_traces_name_the_rank_that_computes_longest(tmp_path):
    """Rank 2 computing 60 ms of a 100 ms step against the others' 20: named on ``trace
    compute`` (+40 ms) and, as the rank the others wait for, on ``trace wait`` (it waits 38 ms
    against their 78)."""
    res = _profiled_run(tmp_path, {0: 20.0, 1: 21.0, 2: 60.0, 3: 20.5})
    by = {(v.source, v.timer): v for v in res.verdicts}
    comp = by[("profiler", "trace compute")]
    assert comp.ranks == 4 and comp.windows == 5 and not comp.low
    assert comp.stragglers == (2,)
    assert comp.excess_ms == pytest.approx(60.0 - 20.75)
    wait = by[("profiler", "trace wait")]
    assert wait.low and wait.stragglers == (2,)
    assert wait.slowest_ms == pytest.approx(40.0) and wait.median_ms == pytest.approx(79.25)
    assert [v.timer for v in res.stragglers] == ["trace compute", "trace wait"]


def test_profiler_traces_of_even_ranks_name_none(tmp_path):
    res = _profiled_run(tmp_path, {0: 20.0, 1: 21.0, 2: 20.2, 3: 20.5})
    by = {(v.source, v.timer): v for v in res.verdicts}
    assert by[("profiler", "trace compute")].stragglers == ()
    assert by[("profiler", "trace wait")].stragglers == ()
    assert res.stragglers == []
