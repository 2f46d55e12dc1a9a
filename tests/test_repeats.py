"""Repeats: interleaved rounds in the launcher, between-run intervals in the analysis."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

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
