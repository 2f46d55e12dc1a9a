"""Repeats: interleaved rounds in the launcher, between-run intervals in the analysis."""

from __future__ import annotations

import importlib.util
import json
import math
import random
import re
import shutil
import statistics
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import pytest
from conftest import LAB_LOGS, tiny_specs

from analysis.metrics import repeats
from analysis.metrics.repeats import repeat_sets, speedup_model
from analysis.metrics.rows import RunMetrics
from analysis.metrics.speedup import speedup_interval
from analysis.metrics.stats import describe
from analysis.report import build as report
from launchers import cli
from launchers.run.matrix import Repeat, interleaved, repeat_group, run_specs
from launchers.run.render import render_run_dir

# --------------------------------------------------------------------------- launcher


def _line(k: int, ms: float) -> str:
    return (
        f" iteration {k:>8}/{4:>8} | consumed samples: {8 * k:>12} | elapsed time per "
        f"iteration (ms): {ms:.1f} | learning rate: 1.000E-03 | global batch size:     8 | "
        "lm loss: 5.000000E+00 | loss scale: 1.0 |"
    )


def _scripted(fail: set[tuple[str, int]] | None = None):
    """A render that replaces launch.sh by a script printing iteration lines, or failing."""
    order: list[tuple[str, int]] = []

    def render(spec, logs: Path) -> Path:
        run_dir = render_run_dir(spec, logs)
        k = sum(1 for name, _ in order if name == spec.strategy.name) + 1
        order.append((spec.strategy.name, k))
        if (spec.strategy.name, k) in (fail or set()):
            script = "echo 'ValueError: injected'; exit 1\n"
        else:
            script = "".join(f"echo '{_line(i, 100.0 * k)}'\n" for i in (2, 4))
        (run_dir / "launch.sh").write_text(script)
        return run_dir

    return render, order


def _repeat_of(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "run.json").read_text())["repeat"]


def test_interleaved_rounds_rotate_the_order() -> None:
    assert [(k, s) for k, s in interleaved(["a", "b", "c"], 3)] == [  # type: ignore[arg-type]
        (1, "a"), (1, "b"), (1, "c"), (2, "b"), (2, "c"), (2, "a"), (3, "c"), (3, "a"), (3, "b"),
    ]  # fmt: skip
    assert interleaved(["a"], 2) == [(1, "a"), (2, "a")]  # type: ignore[arg-type]


def test_repeated_matrix_runs_rounds_interleaved_and_records_them(tmp_path, capsys) -> None:
    logs = tmp_path / "logs"
    render, order = _scripted(fail={("zero1", 2)})
    rows = run_specs(tiny_specs(["baseline", "zero1"]), logs, stall_s=30, render=render, rounds=3)
    assert order == [("baseline", 1), ("zero1", 1), ("zero1", 2), ("baseline", 2),
                     ("baseline", 3), ("zero1", 3)]  # fmt: skip
    assert [(r.name, r.round, r.status) for r in rows] == [
        ("tiny-baseline", 1, "completed"), ("tiny-zero1", 1, "completed"),
        ("tiny-zero1", 2, "failed"), ("tiny-baseline", 2, "completed"),
        ("tiny-baseline", 3, "completed"), ("tiny-zero1", 3, "completed"),
    ]  # fmt: skip
    dirs = [r.run_dir for r in rows]
    assert len(set(dirs)) == 6, "every repeat is its own run directory"
    groups = {_repeat_of(d)["group"] for d in dirs if d}
    assert len(groups) == 1 and groups.pop().startswith("r3-")
    assert [_repeat_of(d)["round"] for d in dirs if d] == [1, 1, 2, 2, 3, 3]
    assert all(_repeat_of(d)["rounds"] == 3 for d in dirs if d)
    out = capsys.readouterr().out
    assert "tiny-baseline: 3 rounds timed, 100.0-300.0 ms/iteration (max/min 3.00)" in out
    assert "tiny-zero1: 2 rounds timed" in out

    # The same command again resumes: completed rounds are skipped, the failed one reruns in
    # its own round of the same group.
    render2, order2 = _scripted()
    again = run_specs(tiny_specs(["baseline", "zero1"]), logs, stall_s=30, render=render2, rounds=3)
    assert order2 == [("zero1", 1)], "only the failed round runs again"
    assert [r.status for r in again].count("skipped") == 5
    rerun = next(r for r in again if r.status == "completed")
    assert _repeat_of(rerun.run_dir)["round"] == 2 and rerun.round == 2

    # Forced: a new group, three new rounds of each.
    render3, order3 = _scripted()
    forced = run_specs(tiny_specs(["baseline", "zero1"]), logs, stall_s=30, render=render3,
                       rounds=3, force=True)  # fmt: skip
    assert len(order3) == 6
    new_groups = {_repeat_of(r.run_dir)["group"] for r in forced}
    assert len(new_groups) == 1 and new_groups != {_repeat_of(dirs[0])["group"]}


def test_a_single_run_is_not_a_repeat_and_keeps_the_twin_rule(tmp_path) -> None:
    logs = tmp_path / "logs"
    render, _ = _scripted()
    rows = run_specs(tiny_specs(["zero1"]), logs, stall_s=30, render=render)
    assert rows[0].round is None
    assert "repeat" not in json.loads((rows[0].run_dir / "run.json").read_text())
    # An earlier single run is not a round of a repeated matrix: rounds all run.
    render2, order2 = _scripted()
    run_specs(tiny_specs(["zero1"]), logs, stall_s=30, render=render2, rounds=2)
    assert order2 == [("zero1", 1), ("zero1", 2)]


def test_repeat_group_is_stable_and_forced_groups_differ() -> None:
    assert repeat_group(["a", "b"], 3) == repeat_group(["a", "b"], 3)
    assert repeat_group(["a", "b"], 3) != repeat_group(["a", "b"], 2)
    assert repeat_group(["a", "b"], 3) != repeat_group(["a", "c"], 3)
    assert repeat_group(["a"], 2, force=True).startswith(repeat_group(["a"], 2) + "-")


def test_repeat_record_is_read_back_and_malformed_records_are_not_repeats() -> None:
    assert Repeat.of({"repeat": {"group": "g", "round": 2, "rounds": 3}}) == Repeat("g", 2, 3)
    for bad in ({}, {"repeat": "x"}, {"repeat": {"group": "g", "round": "two", "rounds": 3}},
                {"repeat": {"group": "g", "round": 4, "rounds": 3}}):  # fmt: skip
        assert Repeat.of(bad) is None


@pytest.mark.parametrize("value", ["0", "-1", "two", "101"])
def test_repeat_option_refuses_bad_values(value: str, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.build_parser().parse_args(["matrix", "--model", "tiny", "--repeat", value])
    assert exc.value.code == 2
    assert "--repeat" in capsys.readouterr().err


def test_dry_run_shows_the_interleaved_order(capsys) -> None:
    assert cli.main(["matrix", "--model", "tiny", "--strategies", "baseline,zero1",
                     "--repeat", "2", "--dry-run"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "# 2 interleaved rounds, in this order: 1:baseline 1:zero1 2:zero1 2:baseline" in out


# --------------------------------------------------------------------------- analysis


def run_row(name: str, windows: list[float], **kw: Any) -> RunMetrics:
    """A RunMetrics row as metrics.compute makes it from steady-state windows."""
    st = describe(windows)
    base: dict[str, Any] = {f.name: None for f in fields(RunMetrics)}
    base |= {"na_reasons": {}, "problems": []}
    base |= {
        "name": name,
        "path": f"{name}/{kw.get('repeat_round') or 0}",
        "strategy": name.split("-", 1)[-1],
        "setup_key": "tiny / 2 nodes, 2 ranks / 100 Mbit/s",
        "status": "completed",
        "iter_ms_mean": st.mean,
        "iter_ms_ci95_lo": st.ci_lo,
        "iter_ms_ci95_hi": st.ci_hi,
        "iter_ms_n": st.n,
        "spec_hash": f"hash-{name}",
    }
    return RunMetrics(**(base | kw))


@dataclass(frozen=True)
class Truth:
    """A synthetic machine whose spreads are known."""

    ms: tuple[float, ...] = (300.0, 200.0, 260.0, 290.0, 310.0, 420.0)
    """Median ms/iteration of each strategy (the first is the baseline)."""
    round_sd: float = 0.15
    """Log-scale sd of a round's drift, common to every strategy of the round."""
    run_sd: float = 0.10
    """Log-scale sd of one run against another (between-run spread)."""
    window_sd: float = 0.05
    """Relative sd of one logging window inside a run (within-run spread)."""
    windows: int = 5
    """Steady-state windows per run."""
    run_sd_of: dict[int, float] | None = None
    """Strategy index -> its own between-run sd (heteroscedastic machines)."""

    def mean_of(self, s: int) -> float:
        """Geometric mean of strategy s's runs over rounds and runs (the median)."""
        return self.ms[s]


def draw(truth: Truth, rounds: int, rng: random.Random, interleaved: bool = True) -> list:
    """One repeated matrix: every strategy once per round, rows as the report sees them."""
    rows = []
    for k in range(1, rounds + 1):
        drift = rng.gauss(0.0, truth.round_sd)
        for s, ms in enumerate(truth.ms):
            if not interleaved:  # back to back: each run meets its own state of the machine
                drift = rng.gauss(0.0, truth.round_sd)
            sd = (truth.run_sd_of or {}).get(s, truth.run_sd)
            level = ms * math.exp(drift + rng.gauss(0.0, sd))
            windows = [level * (1 + rng.gauss(0.0, truth.window_sd)) for _ in range(truth.windows)]
            extra = {"repeat_group": "g", "repeat_round": k} if interleaved else {}
            rows.append(run_row(f"tiny-s{s}", windows, **extra))
    return rows


def coverage(truth: Truth, rounds: int, draws: int, seed: int = 7, interleaved: bool = True):
    """Share of draws whose 95% intervals hold the true value: (means, speedups, the per-run
    within-run speedup interval of round 1 for comparison)."""
    rng = random.Random(seed)
    hit_mean = hit_ratio = hit_within = n_mean = n_ratio = 0
    for _ in range(draws):
        rows = draw(truth, rounds, rng, interleaved)
        sets = repeat_sets(rows)
        model = speedup_model(sets)
        for s, rs in enumerate(sets):
            est = rs.estimate
            assert est is not None and est.ci_lo is not None and est.ci_hi is not None
            n_mean += 1
            hit_mean += est.ci_lo <= truth.mean_of(s) <= est.ci_hi
            if s == 0:
                continue
            ratio = model.ratio(sets[0], rs)
            assert ratio is not None and ratio.ci_lo is not None and ratio.ci_hi is not None
            true = truth.ms[0] / truth.ms[s]
            n_ratio += 1
            hit_ratio += ratio.ci_lo <= true <= ratio.ci_hi
            _, lo, hi = speedup_interval(sets[0].runs[0], rs.runs[0])
            hit_within += (lo or 0) <= true <= (hi or 0)
    return hit_mean / n_mean, hit_ratio / n_ratio, hit_within / n_ratio


COVERAGE_DRAWS = 1000
"""Synthetic matrices per case: the binomial sd of a 95% rate over 1000 x 6 intervals is
~0.3% (twice that with the correlation inside a draw), well inside the +-3% tolerance."""


@pytest.mark.parametrize(
    ("case", "truth", "rounds", "interleaved"),
    [
        ("3 interleaved rounds", Truth(), 3, True),
        ("2 interleaved rounds", Truth(), 2, True),
        ("5 rounds, quiet machine", Truth(round_sd=0.02, run_sd=0.03), 5, True),
        ("3 repeats back to back", Truth(), 3, False),
        ("within-run noise dominates", Truth(round_sd=0.0, run_sd=0.01, window_sd=0.2), 3, True),
    ],
)
def test_intervals_cover_the_true_value_at_their_nominal_rate(case, truth, rounds, interleaved):
    means, ratios, within = coverage(truth, rounds, COVERAGE_DRAWS, interleaved=interleaved)
    print(f"{case}: ms/iteration {means:.1%}, speedup {ratios:.1%}, "
          f"one run's within-run speedup interval {within:.1%}")  # fmt: skip
    assert abs(means - 0.95) <= 0.03, f"{case}: ms/iteration intervals cover {means:.1%}"
    assert abs(ratios - 0.95) <= 0.03, f"{case}: speedup intervals cover {ratios:.1%}"


# --------------------------------------------------------------------------- report, end to end

_ELAPSED = re.compile(r"(elapsed time per iteration \(ms\): )([0-9.]+)")
_LAB_RUNS = {
    "baseline": "2n_dp2_1000mbit",
    "pipeline": "2n_pp2_1000mbit",
    "zero2": "2n_zero2_1000mbit",
}


def _scaled(text: str, factor: float) -> str:
    """Upstream's log text with every iteration time multiplied by ``factor``."""
    return _ELAPSED.sub(lambda m: f"{m.group(1)}{float(m.group(2)) * factor:.1f}", text)


def lab_matrix(
    logs: Path,
    drift: list[float],
    jitter: dict[str, list[float]],
    interleaved: bool = True,
    link_mbit: float = 1000.0,
) -> None:
    """Run directories of a repeated 2-node matrix made from the real lab logs (upstream's own
    output, both nodes): round k's times are the lab run's times x drift[k] x jitter[s][k]."""
    for strategy, stem in _LAB_RUNS.items():
        for k, d in enumerate(drift):
            run_dir = logs / f"tiny-{strategy}" / f"2026010{k + 1}T000000Z"
            run_dir.mkdir(parents=True)
            for node in (0, 1):
                text = (LAB_LOGS / f"{stem}_node{node}.log").read_text()
                (run_dir / f"node{node}.log").write_text(_scaled(text, d * jitter[strategy][k]))
            (run_dir / "ds_config.json").write_text((LAB_LOGS / f"{stem}_node0.json").read_text())
            (run_dir / "launch.sh").write_text((LAB_LOGS / f"{stem}_node0.cmd").read_text())
            record: dict[str, Any] = {
                "name": f"tiny-{strategy}",
                "spec_hash": f"hash-{strategy}",
                "network": {"link_mbit": link_mbit},
                "outcome": {"status": "completed"},
            }
            if interleaved:
                record["repeat"] = {"group": "r3-test", "round": k + 1, "rounds": len(drift)}
            (run_dir / "run.json").write_text(json.dumps(record))


DRIFT = [1.0, 1.4, 0.8]
"""A machine whose speed changes by 75% between rounds (other tenants)."""
JITTER = {"baseline": [1.0, 1.02, 0.99], "pipeline": [1.01, 0.99, 1.0], "zero2": [0.98, 1.0, 1.02]}


def _report(logs: Path) -> tuple[str, dict[str, Any]]:
    out = logs / "report"
    report.build(logs, out)
    return (out / "report.md").read_text(), json.loads((out / "summary.json").read_text())


def test_report_pairs_interleaved_rounds_and_names_a_winner(tmp_path) -> None:
    lab_matrix(tmp_path, DRIFT, JITTER)
    text, summary = _report(tmp_path)
    sets = {s["name"]: s for s in summary["repeats"]}
    assert set(sets) == {"tiny-baseline", "tiny-pipeline", "tiny-zero2"}
    base, zero2 = sets["tiny-baseline"], sets["tiny-zero2"]
    assert base["runs_timed"] == 3 and len(base["runs"]) == 3
    # Over repeats: the lab run's mean x the geometric mean of the round factors.
    lab_base = statistics.fmean([227.0, 224.0, 226.2, 225.6, 224.7])
    factors = [d * j for d, j in zip(DRIFT, JITTER["baseline"], strict=True)]
    geo, arith = statistics.geometric_mean(factors), statistics.fmean(factors)
    assert base["iter_ms_mean"] == pytest.approx(lab_base * geo, rel=0.01)
    assert base["iter_ms_arithmetic_mean"] == pytest.approx(lab_base * arith, rel=0.01)
    assert base["iter_ms_ci95_lo"] < base["iter_ms_mean"] * 0.7, "the drift widens the mean's CI"
    # The drift hits every strategy of a round alike: paired by round, the ratio is tight.
    assert zero2["speedup_interval"] == repeats.PAIRED_METHOD
    assert zero2["speedup_rounds_paired"] == 3 and zero2["speedup_df"] == 4
    assert (
        zero2["speedup_ci95_hi"] < 1.0 and zero2["speedup_ci95_hi"] / zero2["speedup_ci95_lo"] < 1.2
    )
    assert "| tiny-zero2 | zero2 | 3/3 (rounds 1, 2, 3) |" in text
    assert "tiny-zero2 is slower than tiny-baseline" in text
    assert "paired, 3 round(s), 4 df" in text
    # Per-run speedups relate each round to the baseline of its own round.
    runs = [r for r in summary["runs"] if r["name"] == "tiny-zero2"]
    assert {r["repeat_round"] for r in runs} == {1, 2, 3}
    lab_ratios = [
        r["speedup"]
        * JITTER["zero2"][r["repeat_round"] - 1]
        / JITTER["baseline"][r["repeat_round"] - 1]
        for r in runs
    ]
    assert lab_ratios == pytest.approx([lab_ratios[0]] * 3, rel=1e-3), "the drift cancels"
    assert "| tiny-zero2 r2 |" in text, "each repeat labelled with its round"


def test_the_same_runs_without_rounds_are_unpaired_and_wider(tmp_path) -> None:
    lab_matrix(tmp_path / "a", DRIFT, JITTER)
    lab_matrix(tmp_path / "b", DRIFT, JITTER, interleaved=False)
    _, paired = _report(tmp_path / "a")
    text, unpaired = _report(tmp_path / "b")
    p = next(s for s in paired["repeats"] if s["name"] == "tiny-pipeline")
    u = next(s for s in unpaired["repeats"] if s["name"] == "tiny-pipeline")
    assert u["speedup_interval"] == repeats.UNPAIRED_METHOD and u["speedup_df"] == 6
    assert u["speedup"] == pytest.approx(p["speedup"], rel=1e-9), "same runs, same estimate"
    width = {
        k: math.log(d["speedup_ci95_hi"] / d["speedup_ci95_lo"]) for k, d in (("u", u), ("p", p))
    }
    assert width["u"] > 5 * width["p"], f"log widths {width}: pairing removes the drift"
    assert u["speedup_ci95_lo"] < 1.0 < u["speedup_ci95_hi"]
    recommendation = text.split("## Recommendations", 1)[1].splitlines()[2]
    assert recommendation.startswith(
        "- tiny / 2 nodes, 2 ranks / 1000 Mbit/s: no measurable difference between "
        "tiny-baseline and tiny-pipeline (speedup 0.93x, interval"
    ), recommendation


def test_single_run_says_within_run_only_and_quotes_recorded_repeats(tmp_path) -> None:
    lab_matrix(tmp_path, DRIFT, JITTER)
    # One more baseline run, another spec (more iterations), the same setup: it ran once.
    src = tmp_path / "tiny-baseline" / "20260101T000000Z"
    one = tmp_path / "tiny-baseline" / "20260201T000000Z"
    shutil.copytree(src, one)
    record = json.loads((one / "run.json").read_text())
    record |= {"spec_hash": "other-spec-60-iterations"}
    record.pop("repeat")
    (one / "run.json").write_text(json.dumps(record))
    text, summary = _report(tmp_path)
    names = [s["name"] for s in summary["repeats"]]
    repeated, single = "tiny-baseline (spec hash-bas)", "tiny-baseline (spec other-sp)"
    assert {repeated, single} <= set(names), "two specs under one name are told apart"
    note = next(line for line in text.splitlines() if line.startswith(f"- {single} ran once"))
    cv = next(s["iter_ms_spread"] for s in summary["repeats"] if s["name"] == repeated)
    assert note.startswith(f"- {single} ran once: its interval covers within-run noise only")
    assert f"scattered by {cv:.1%} run to run ({repeated} repeated (3 runs))" in note


def test_no_repeats_anywhere_says_so(tmp_path) -> None:
    lab_matrix(tmp_path, [1.0], {s: [1.0] for s in _LAB_RUNS}, interleaved=False)
    text, summary = _report(tmp_path)
    assert "Each spec here ran once: the intervals above cover within-run noise only" in text
    assert "no measurable difference can be claimed: one run per spec" in text
    assert all(s["iter_ms_interval"] == "within-run only (one run)" for s in summary["repeats"])


def test_failed_repeats_are_listed_not_estimated(tmp_path) -> None:
    lab_matrix(tmp_path, DRIFT, JITTER)
    bad = tmp_path / "tiny-zero2" / "20260102T000000Z"
    record = json.loads((bad / "run.json").read_text())
    record["outcome"] = {"status": "failed", "kind": "oom", "reason": "killed at the limit"}
    (bad / "run.json").write_text(json.dumps(record))
    # A baseline that failed in every round: no ratio against it, no crash.
    for run_dir in (tmp_path / "tiny-baseline").iterdir():
        record = json.loads((run_dir / "run.json").read_text())
        record["outcome"] = {"status": "failed", "kind": "oom", "reason": "too big"}
        (run_dir / "run.json").write_text(json.dumps(record))
    text, summary = _report(tmp_path)
    zero2 = next(s for s in summary["repeats"] if s["name"] == "tiny-zero2")
    assert zero2["runs_timed"] == 2 and len(zero2["runs"]) == 3
    assert "| tiny-zero2 | zero2 | 2/3 (rounds 1, 3) |" in text
    base = next(s for s in summary["repeats"] if s["name"] == "tiny-baseline")
    assert base["runs_timed"] == 0 and base["iter_ms_mean"] is None


# --------------------------------------------------------------------------- cross-rate benchmark


def _load_benchmark():
    spec = importlib.util.spec_from_file_location(
        "cross_network", Path(__file__).parents[1] / "benchmarks" / "cross_network.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve their annotations there
    spec.loader.exec_module(module)
    return module


def test_cross_rate_check_counts_inside_the_interval_or_within_the_limit() -> None:
    bench = _load_benchmark()
    wide = bench.Target(100.0, 60.0, 140.0, 3, 0.16)
    single = bench.Target(100.0, 98.0, 102.0, 1, None)
    assert bench.Check("zero2", wide, 135.0).inside and bench.Check("zero2", wide, 135.0).right(0.2)
    assert not bench.Check("zero2", single, 115.0).inside
    assert bench.Check("zero2", single, 115.0).right(0.2), "within 20%"
    assert not bench.Check("zero2", single, 125.0).right(0.2)
    assert bench.Check("zero2", wide, 125.0).error == pytest.approx(0.25)


def test_cross_rate_benchmark_prints_errors_beside_the_targets_spread(tmp_path, capsys) -> None:
    bench = _load_benchmark()
    lab_matrix(tmp_path / "fast", DRIFT, JITTER, link_mbit=1000.0)
    lab_matrix(tmp_path / "slow", [1.0, 1.2, 0.9], JITTER, link_mbit=100.0)
    targets, link = bench.measured(tmp_path / "slow")
    assert link == 100.0 and set(targets) == {"baseline", "pipeline", "zero2"}
    base = targets["baseline"]
    assert base.runs == 3 and base.cv is not None and base.ci_lo < base.mean_ms < base.ci_hi
    status = bench.main([str(tmp_path / "fast"), str(tmp_path / "slow")])
    out = capsys.readouterr().out
    assert "measured ms [95% CI]" in out and "run-to-run" in out
    assert f"{base.cv:.1%} (3)" in out, "the target's spread beside the error"
    summary = next(line for line in out.splitlines() if "predictions:" in line)
    assert summary.startswith("2 calibration/target pair(s), 6 predictions: ")
    assert "targets' median run-to-run spread" in summary
    assert status == (0 if " 6 right" in summary else 1)


def test_a_round_that_would_pass_the_deadline_is_not_started(tmp_path, capsys) -> None:
    logs = tmp_path / "logs"
    render, order = _scripted()

    def slow(spec, logs_root: Path) -> Path:
        run_dir = render(spec, logs_root)
        script = (run_dir / "launch.sh").read_text()
        (run_dir / "launch.sh").write_text("sleep 1\n" + script)
        return run_dir

    deadline = time.monotonic() + 3.0  # round 1 (two runs) takes > 2 s: round 2 would not fit
    rows = run_specs(tiny_specs(["baseline", "zero1"]), logs, stall_s=30, render=slow, rounds=3,
                     deadline=deadline)  # fmt: skip
    assert order == [("baseline", 1), ("zero1", 1)]
    assert [r.status for r in rows] == ["completed", "completed"], "nothing counted as failed"
    assert "rounds 2-3 not started: a round takes ~" in capsys.readouterr().out


def test_demo_repeats_within_its_budget_by_default() -> None:
    args = cli.build_parser().parse_args(["demo"])
    assert (args.repeat, args.budget_min) == (cli.DEMO_ROUNDS, cli.DEMO_BUDGET_MIN) == (2, 10.0)
    assert cli.build_parser().parse_args(["demo", "--repeat", "1"]).repeat == 1


def test_random_effects_mean_interval_and_spreads() -> None:
    means = [100.0, 110.0, 121.0]  # ratios of 1.1: log run means 0.0953 apart
    est = repeats.random_effects(means, [4.0, 4.84, 5.8564])  # 2% within-run se each
    assert est.k == 3 and est.mean == pytest.approx(110.0)
    assert est.arithmetic_mean == pytest.approx(331 / 3)
    assert est.spread == pytest.approx(math.log(1.1))
    t2 = 0.95 / math.sqrt(2 * 0.975 * 0.025)  # the 0.975 quantile of t(2) in closed form
    half = t2 * math.log(1.1) / math.sqrt(3)  # t(2) x sd / sqrt(k), log scale
    assert (est.ci_lo, est.ci_hi) == pytest.approx((110 * math.exp(-half), 110 * math.exp(half)))
    assert est.within == pytest.approx(0.02)
    assert est.tau == pytest.approx(math.sqrt(math.log(1.1) ** 2 - 0.02**2))
    quiet = repeats.random_effects([100.0, 100.5], [9.0, 9.0])
    assert quiet.tau == 0.0, "scatter below the within-run error: no between-run part left"
    one = repeats.random_effects([100.0], [4.0])
    assert (one.ci_lo, one.spread, one.tau) == (None, None, None)
    unknown = repeats.random_effects([100.0, 110.0], [None, 4.0])
    assert unknown.tau is None and unknown.ci_lo is not None
    with pytest.raises(ValueError, match="no run means"):
        repeats.random_effects([], [])
    with pytest.raises(ValueError, match=r"run means must be > 0 ms, got 0.0"):
        repeats.random_effects([0.0, 10.0], [None, None])


def test_bare_logs_of_one_configuration_are_repeats(tmp_path) -> None:
    """Users' own logs: two copies of a run under other names, no run.json, are one spec."""
    for stem in ("dp2", "zero2"):
        for k, factor in enumerate([1.0, 1.2]):
            for ext in (".json", ".cmd"):
                shutil.copy(LAB_LOGS / f"{stem}{ext}", tmp_path / f"{stem}_try{k}{ext}")
            text = _scaled((LAB_LOGS / f"{stem}.log").read_text(), factor)
            (tmp_path / f"{stem}_try{k}.log").write_text(text)
    text, summary = _report(tmp_path)
    sets = {s["name"]: s for s in summary["repeats"]}
    assert set(sets) == {"dp2_try0", "zero2_try0"} and sets["dp2_try0"]["runs_timed"] == 2
    assert sets["zero2_try0"]["speedup_interval"] == repeats.UNPAIRED_METHOD
    assert sets["zero2_try0"]["spec_hash"].startswith("setup:")


def test_repeat_figures_show_one_bar_per_spec(tmp_path) -> None:
    """REPEAT=2: the time and breakdown figures have one bar per spec (the mean over its
    repeats with the between-run interval), never two bars of one name."""
    from analysis.metrics.rows import to_frame
    from analysis.report import plots  # matplotlib: imported by the test that draws

    lab_matrix(tmp_path, [1.0, 1.1], {s: [1.0, 1.0] for s in JITTER})
    rows = report.build(tmp_path, tmp_path / "report")
    frame = to_frame(rows)
    group = frame[frame["iter_ms_mean"].notna()]
    sets = repeats.to_json(rows)
    shown = plots.per_spec(group, sets)
    assert len(group) == 6 and len(shown) == 3
    names = [f"tiny-{s} (mean of 2)" for s in ("baseline", "pipeline", "zero2")]
    assert sorted(shown["name"]) == names
    by = {s["name"]: s for s in sets}
    for _, row in shown.iterrows():
        s = by[row["name"].removesuffix(" (mean of 2)")]
        assert row["iter_ms_mean"] == s["iter_ms_mean"]
        assert row["iter_ms_ci95_lo"] == s["iter_ms_ci95_lo"]
    base = group[group["name"] == "tiny-baseline"]
    merged = shown[shown["name"] == "tiny-baseline (mean of 2)"].iloc[0]
    assert merged["fwd_ms"] == pytest.approx(base["fwd_ms"].mean())
    assert plots.run_labels(base) == ["tiny-baseline r1", "tiny-baseline r2"]
    figures = sorted(p.name for p in (tmp_path / "report" / "figures").glob("*.png"))
    assert any(n.startswith("time-") for n in figures)
    assert any(n.startswith("breakdown-") for n in figures)
