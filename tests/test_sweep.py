"""The sweep: its space and validation, the memory filter, the anchors, the budget, the verdict
and rank correlation, and a sweep interrupted and started again reusing what finished."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import pytest

from analysis.predict.calibration import Observation
from analysis.report.sweep import Group, Measured, measure_entries, rank_correlation, verdict
from launchers.config.hostfile import parse_hostfile_text
from launchers.config.presets import get_model, resolve_spec
from launchers.config.spec import PLACEHOLDER_PATHS, Cluster, RunSpec, Strategy, spec_hash
from launchers.run.matrix import completed_runs
from launchers.sweep.loop import Budget, Sweep, entries_of, run_sweep
from launchers.sweep.plan import anchors, memory_verdict, setup_of
from launchers.sweep.space import Axes, SweepError, candidates, parse_axis, resolve_points

LAB4 = "emulated 4 nodes x 100mbit"


def _cluster(nodes: int, slots: int = 1) -> Cluster:
    text = "".join(f"node{i} slots={slots}\n" for i in range(nodes))
    return parse_hostfile_text(text, f"{nodes}node")


def _resolver(device: str, network: str = "") -> Any:
    def resolve(strategy: Strategy, overrides: Mapping[str, Any], cluster: Cluster) -> RunSpec:
        spec = resolve_spec(
            "tiny" if device == "cpu" else "large",
            strategy,
            cluster,
            overrides,
            device=device,
            launcher="pdsh",  # type: ignore[arg-type]
            paths=PLACEHOLDER_PATHS,
        )
        return replace(spec, network=network) if network else spec

    return resolve


def _tiny_points(axes: Axes, nodes: int = 4) -> list[Any]:
    m = get_model("tiny").model
    cluster = _cluster(nodes)
    configs = candidates(m.num_layers, m.global_batch_size, cluster.slots, "cpu", axes)
    return resolve_points(configs, cluster, {"train_iters": 10}, _resolver("cpu", LAB4))


def test_tiny_space_on_four_nodes() -> None:
    """TP across nodes when asked: 18 valid; the rest rejected by the single run's validation."""
    points = _tiny_points(Axes(tp=(1, 2, 4)))
    valid = sorted(p.config.name for p in points if p.spec is not None)
    assert len(valid) == 18
    assert "tp1-pp4-dp1-z1-mb1" in valid and "tp4-pp1-dp1-z3-mb1" in valid
    reasons = {p.config.name: p.invalid for p in points if p.spec is None}
    assert "incompatible with pipeline" in reasons["tp1-pp2-dp2-z2-mb1"]
    assert reasons["tp1-pp1-dp4-z0-mb2"].startswith("micro_batch_size 2 -> 1")
    # Unasked, TP stays within a node (one rank per node here): TP 1 only.
    assert {p.config.tp for p in _tiny_points(Axes())} == {1}


def test_axes_are_checked() -> None:
    assert parse_axis("TP", "1, 2") == (1, 2)
    with pytest.raises(SweepError, match="TP='1,x'"):
        parse_axis("TP", "1,x")
    with pytest.raises(SweepError, match="4 is not one of 0, 1, 2, 3"):
        parse_axis("ZERO", "4", (0, 1, 2, 3))
    with pytest.raises(SweepError, match="varies these itself"):
        resolve_points([], _cluster(2), {"micro_batch_size": 2}, _resolver("cpu"))


def test_memory_filter_large_on_two_8g_gpus() -> None:
    """Large on 2 nodes x 1 GPU of 8 GiB: without recompute ZeRO-0 does not fit, with it it does,
    each with its estimate; micro-batches > 1 are invalid on GPU too (upstream's attention); on
    CPU nothing is judged."""
    m = get_model("large").model
    cluster = _cluster(2)
    configs = candidates(m.num_layers, m.global_batch_size, cluster.slots, "cuda", Axes())
    points = resolve_points(configs, cluster, {}, _resolver("cuda"))
    invalid = {p.config.name: p.invalid for p in points if p.spec is None}
    assert invalid["tp1-pp1-dp2-z0-mb8"].startswith("micro_batch_size 8 -> 1: upstream's non-flash")
    verdicts = {p.config.name: memory_verdict(p.spec, 8 * 2**30) for p in points if p.spec}
    out = [n for n, v in verdicts.items() if v.fits is False]
    assert out == ["tp1-pp1-dp2-z0-mb1"] and verdicts["tp1-pp1-dp2-z0-mb1-rc"].fits
    assert "vs 7.2 GiB usable (90% of 8 GiB)" in verdicts["tp1-pp1-dp2-z0-mb1"].reason
    cpu = _tiny_points(Axes())[0]
    assert memory_verdict(cpu.spec, None).fits is None


def test_anchors_cover_each_compute_kind_and_the_pipeline() -> None:
    points = [p for p in _tiny_points(Axes(tp=(1, 2, 4))) if p.spec is not None]
    names = [p.config.name for p in anchors(points)]
    assert names == [
        "tp1-pp1-dp4-z0-mb1",
        "tp2-pp1-dp2-z0-mb1",
        "tp1-pp1-dp4-z3-mb1",
        "tp1-pp2-dp2-z0-mb1",
    ]


def test_prediction_interval_from_log_errors() -> None:
    """Errors of +100% and -50% are the same distance in log time (a relative half-width would
    make the interval of a large error reach below zero)."""
    import math

    from analysis.metrics.stats import t95
    from launchers.sweep.plan import ModelError

    half = ModelError((1.0, -0.5)).half_width
    assert half == pytest.approx(t95(1) * math.log(2) * math.sqrt(1.5))
    assert ModelError((0.1,)).half_width is None


def test_budget() -> None:
    assert Budget.parse("30m").seconds == 1800 and Budget.parse("6runs").runs == 6
    assert Budget.parse("all").allows(100, 1e9, 1e9)[0]
    assert not Budget.parse("6runs").allows(6, 0, None)[0]
    assert not Budget.parse("100s").allows(0, 80, 30)[0]
    with pytest.raises(SweepError, match="BUDGET='soon'"):
        Budget.parse("soon")


def test_verdict_names_a_winner_only_when_intervals_separate() -> None:
    entries = [{"name": n, "runs": [n]} for n in ("a", "b", "c")]
    apart = {
        "a": Measured(100, 95, 105, 4, "completed", ""),
        "b": Measured(120, 115, 125, 4, "completed", ""),
        "c": Measured(200, 190, 210, 4, "completed", ""),
    }
    assert verdict(measure_entries(Path("."), entries, apart)).startswith("winner: a")
    close = dict(apart, b=Measured(108, 103, 113, 4, "completed", ""))
    text = verdict(measure_entries(Path("."), entries, close))
    assert text.startswith("no single winner: 2 configurations") and "c (" not in text
    assert verdict(
        [Group("a", 100, None, None, 1, "within-run"), Group("b", 110, None, None, 1, "within-run")]
    ).endswith("no winner is named")


def test_rank_correlation() -> None:
    assert rank_correlation([(1, 10), (2, 20)])[0] is None
    rho, text = rank_correlation([(1, 10), (2, 30), (3, 20), (4, 40)])
    assert rho == pytest.approx(0.8) and "4 configurations" in text


# ---------------------------------------------------------------------------- resume


def _fake_ms(spec: RunSpec) -> float:
    """A stand-in cluster's time: TP and pipeline cost, data parallelism saves."""
    s = spec.strategy
    return 100.0 + 80 * (s.tp - 1) + 30 * (s.pp - 1) + 10 * s.zero_stage


class StandIn:
    """Writes a completed run directory per spec (no processes); Ctrl-C at the ``stop``-th."""

    def __init__(self, logs: Path, stop: int | None = None) -> None:
        self.logs, self.stop, self.calls = logs, stop, 0
        self.specs: dict[str, RunSpec] = {}

    def execute(self, spec: RunSpec) -> Path:
        self.calls += 1
        if self.stop is not None and self.calls == self.stop:
            raise KeyboardInterrupt
        StandIn.made += 1
        run_dir = self.logs / spec.name / f"2026{StandIn.made:04d}"
        run_dir.mkdir(parents=True)
        outcome = {"status": "completed", "wall_s": 30.0}
        doc = {"spec_hash": spec_hash(spec), "outcome": outcome}
        (run_dir / "run.json").write_text(json.dumps(doc))
        self.specs[run_dir.relative_to(self.logs).as_posix()] = spec
        return run_dir

    def reuse(self, spec: RunSpec) -> list[Path]:
        return [d for d, _ in completed_runs(spec, self.logs)]

    def measure(self, logs: Path, dirs: Any) -> tuple[dict[str, Measured], list[Observation]]:
        out, obs = {}, []
        for d in dirs:
            rel = Path(d).relative_to(logs).as_posix()
            spec = self.specs.get(rel) or self.specs_by_name[rel.split("/")[0]]
            ms = _fake_ms(spec)
            out[rel] = Measured(ms, ms * 0.98, ms * 1.02, (ms * 0.01) ** 2, "completed", "")
            flat = spec.strategy.pp == 1
            obs.append(
                Observation(
                    rel,
                    setup_of(spec),
                    ms,
                    fwd_ms=ms * 0.3 if flat else None,
                    bwd_ms=ms * 0.5 if flat else None,
                    optimizer_ms=ms * 0.1 if flat else None,
                    other_ms=ms * 0.1 if flat else None,
                    ci_half_ms=ms * 0.02,
                )
            )
        return out, obs

    specs_by_name: ClassVar[dict[str, RunSpec]] = {}
    made: ClassVar[int] = 0


def _sweep(logs: Path, budget: str) -> Sweep:
    points = _tiny_points(Axes(tp=(1, 2)))
    entries = entries_of(points, {})
    return Sweep("tiny", "4 nodes", points, entries, logs, Budget.parse(budget))


def test_interrupted_sweep_reuses_finished_runs(tmp_path: Path) -> None:
    first = StandIn(tmp_path, stop=3)
    sweep = _sweep(tmp_path, "5runs")
    StandIn.specs_by_name = {p.spec.name: p.spec for p in sweep.points if p.spec}
    assert run_sweep(sweep, first.execute, first.reuse, first.measure, say=lambda _: None) == 130
    assert first.calls == 3  # two finished, the third interrupted
    record = json.loads((tmp_path / "sweep.json").read_text())
    assert sum(len(e["runs"]) for e in record["entries"]) == 2
    assert "interrupted" in record["notes"][-1]

    again = StandIn(tmp_path)
    again.specs = first.specs
    sweep = _sweep(tmp_path, "5runs")
    assert run_sweep(sweep, again.execute, again.reuse, again.measure, say=lambda _: None) == 0
    assert again.calls == 3  # 5 runs in all: 2 reused, 3 new
    record = json.loads((tmp_path / "sweep.json").read_text())
    measured = [e for e in record["entries"] if e["runs"]]
    assert len(measured) == 5 and record["runs_counted"] == 5
    # What the model steered to after the anchors was predicted before it was measured.
    assert all(e["predicted_before"] for e in measured if not e["anchor"])

    forced = StandIn(tmp_path)
    forced.specs = first.specs
    run_sweep(
        _sweep(tmp_path, "2runs"),
        forced.execute,
        forced.reuse,
        forced.measure,
        force=True,
        say=lambda _: None,
    )
    assert forced.calls == 2  # FORCE: nothing reused


# ---------------------------------------------------------------------------- report section


def _row(path: str, windows: list[float] | None, status: str = "completed", **kw: Any) -> Any:
    from dataclasses import fields

    from analysis.metrics.rows import RunMetrics
    from analysis.metrics.stats import describe

    base: dict[str, Any] = {f.name: None for f in fields(RunMetrics)}
    base |= {"na_reasons": {}, "problems": [], "name": path.split("/")[0], "path": path}
    base |= {"status": status, "setup_key": "tiny / 4 nodes, 4 ranks / 100 Mbit/s"}
    if windows:
        st = describe(windows)
        base |= {"iter_ms_mean": st.mean, "iter_ms_ci95_lo": st.ci_lo,
                 "iter_ms_ci95_hi": st.ci_hi, "iter_ms_n": st.n}  # fmt: skip
    return RunMetrics(**(base | kw))


def test_report_section_reads_the_times_from_the_runs(tmp_path: Path) -> None:
    from analysis.report.sweep import section

    def entry(name: str, status: str = "runnable", **kw: Any) -> dict[str, Any]:
        return {"name": name, "status": status, "reason": "", "runs": [], "anchor": False} | kw

    pred = {"ms": 300.0, "lo": 250.0, "hi": 350.0, "method": "components", "reason": ""}
    doc = {
        "model": "tiny",
        "cluster": "4 node(s)",
        "budget": "6 runs",
        "runs_counted": 3,
        "spent_s": 200.0,
        "notes": ["stopped before x: run budget spent (6 of 6 runs)"],
        "entries": [
            entry("a", anchor=True, runs=["a/1"], order=1),
            entry("b", runs=["b/1"], order=2, predicted_before=pred),
            entry("c", runs=["c/1"], order=3, predicted_before=pred),
            entry("d", "excluded", reason="does not fit: 30.0 GiB per rank vs 21.6 GiB usable"),
            entry("e", "invalid", reason="pp(2) > 1 with zero_stage(2)"),
        ],
    }
    (tmp_path / "sweep.json").write_text(json.dumps(doc))
    rows = [
        _row("a/1", [500.0, 510.0, 505.0, 495.0]),
        _row("b/1", [300.0, 302.0, 298.0, 301.0]),
        _row("c/1", None, "failed", failure_kind="oom", failure_reason="CUDA out of memory"),
    ]
    text = "\n".join(section(tmp_path, rows))
    assert "| b | measured | 300 [250, 350] | 300 [" in text
    assert "| c | failed | 300 [250, 350] | n/a | oom: CUDA out of memory |" in text
    assert "| d | excluded |" in text and "30.0 GiB per rank" in text
    assert "winner: b, 300.2 ms/iteration" in text and "runner-up a (502.5" in text
    assert "invalid (1): e: pp(2) > 1 with zero_stage(2)" in text
    assert "rank correlation n/a: 1 configuration(s)" in text
    assert section(tmp_path / "none", rows) == []
