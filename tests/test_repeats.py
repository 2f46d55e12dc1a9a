"""Repeats: interleaved rounds in the launcher, between-run intervals in the analysis."""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import pytest

from analysis.metrics import RunMetrics, describe, speedup_interval
from analysis.repeats import repeat_sets, speedup_model
from launchers import cli
from launchers.hostfile import parse_hostfile_text
from launchers.presets import resolve_spec
from launchers.render import render_run_dir
from launchers.session import Repeat, interleaved, repeat_group, run_specs

# --------------------------------------------------------------------------- launcher


def _specs(strategies: list[str], **overrides: Any) -> list:
    cluster = parse_hostfile_text("localhost slots=2\n", "hf")
    return [resolve_spec("tiny", s, cluster, overrides, device="cpu") for s in strategies]


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
    rows = run_specs(_specs(["baseline", "zero1"]), logs, stall_s=30, render=render, rounds=3)
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
    again = run_specs(_specs(["baseline", "zero1"]), logs, stall_s=30, render=render2, rounds=3)
    assert order2 == [("zero1", 1)], "only the failed round runs again"
    assert [r.status for r in again].count("skipped") == 5
    rerun = next(r for r in again if r.status == "completed")
    assert _repeat_of(rerun.run_dir)["round"] == 2 and rerun.round == 2

    # Forced: a new group, three new rounds of each.
    render3, order3 = _scripted()
    forced = run_specs(_specs(["baseline", "zero1"]), logs, stall_s=30, render=render3,
                       rounds=3, force=True)  # fmt: skip
    assert len(order3) == 6
    new_groups = {_repeat_of(r.run_dir)["group"] for r in forced}
    assert len(new_groups) == 1 and new_groups != {_repeat_of(dirs[0])["group"]}


def test_a_single_run_is_not_a_repeat_and_keeps_the_twin_rule(tmp_path) -> None:
    logs = tmp_path / "logs"
    render, _ = _scripted()
    rows = run_specs(_specs(["zero1"]), logs, stall_s=30, render=render)
    assert rows[0].round is None
    assert "repeat" not in json.loads((rows[0].run_dir / "run.json").read_text())
    # An earlier single run is not a round of a repeated matrix: rounds all run.
    render2, order2 = _scripted()
    run_specs(_specs(["zero1"]), logs, stall_s=30, render=render2, rounds=2)
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
        """Expected run mean of strategy s (log-normal mean of the round and run effects)."""
        sd = (self.run_sd_of or {}).get(s, self.run_sd)
        return self.ms[s] * math.exp((self.round_sd**2 + sd**2) / 2)


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
