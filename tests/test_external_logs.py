"""Real logs of other sources and eras (tests/fixtures/external) against hand-checked expectations.

Each entry of ``expected.json`` was read off the log text by hand (SOURCES.md says where each log
comes from and what was cut). The parser must meet every recorded expectation: a missing parser
module is a failure, not a skip, because parsing these formats is a requirement. The parser runs
in strict mode here: an exception inside a line handler fails the test instead of becoming a
problem string.
"""

from __future__ import annotations

import importlib
import json
import re
import statistics
from pathlib import Path
from typing import Any

import pytest

FIXTURES = Path(__file__).parent / "fixtures" / "external"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text(encoding="utf-8"))["fixtures"]
REL = 1e-6


def _parse_file(path: Path) -> list[Any]:
    # Imported here so that a missing parser fails each test with its reason instead of
    # aborting collection of the whole module.
    parse = importlib.import_module("analysis.parse.reader")
    with parse.strict():
        return parse.parse_file(path)


def _same(actual: Any, expected: Any) -> bool:
    """Equality with floats compared at rel 1e-6, pairs (min, max) element-wise."""
    if expected is None:
        return actual is None
    if isinstance(expected, list):
        if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
            return False
        return all(_same(a, e) for a, e in zip(actual, expected, strict=True))
    if isinstance(expected, (bool, str)):
        return actual == expected
    if isinstance(expected, (int, float)):
        if isinstance(actual, bool) or not isinstance(actual, (int, float)):
            return False
        return actual == pytest.approx(expected, rel=REL)
    return actual == expected


def _fields(obj: Any, wanted: dict[str, Any]) -> dict[str, Any]:
    return {key: getattr(obj, key, "<missing>") for key in wanted}


def _check_fields(what: str, obj: Any, wanted: dict[str, Any], problems: list[str]) -> None:
    for key, value in wanted.items():
        actual = getattr(obj, key, "<missing>")
        if not _same(actual, value):
            problems.append(f"{what}.{key}: expected {value!r}, got {actual!r}")


def _check_run(entry: dict[str, Any], runs: list[Any]) -> list[str]:
    problems: list[str] = []
    if "runs" in entry and len(runs) != entry["runs"]:
        problems.append(f"runs: expected {entry['runs']}, got {len(runs)}")
    index = entry.get("run", 0)
    if index >= len(runs):
        return [*problems, f"run {index} missing ({len(runs)} runs parsed)"]
    run = runs[index]

    if "status" in entry and run.status != entry["status"]:
        problems.append(f"status: expected {entry['status']!r}, got {run.status!r}")
    if "failure" in entry:
        want = entry["failure"]
        if want is None:
            if run.failure is not None:
                problems.append(f"failure: expected none, got {run.failure!r}")
        elif run.failure is None:
            problems.append(f"failure: expected {want!r}, got none")
        else:
            if run.failure.kind != want["kind"]:
                problems.append(
                    f"failure.kind: expected {want['kind']!r}, got {run.failure.kind!r}"
                )
            if want["message_contains"] not in run.failure.message:
                problems.append(
                    f"failure.message: expected to contain {want['message_contains']!r}, "
                    f"got {run.failure.message!r}"
                )
            if "line" in want and run.failure.line != want["line"]:
                problems.append(f"failure.line: expected {want['line']}, got {run.failure.line}")

    numbers = [it.iteration for it in run.iterations]
    if "iterations_count" in entry and len(set(numbers)) != entry["iterations_count"]:
        problems.append(
            f"iterations: expected {entry['iterations_count']} distinct, got {len(set(numbers))}"
        )
    if "first_iteration" in entry and (numbers[:1] or [None])[0] != entry["first_iteration"]:
        problems.append(f"first iteration: expected {entry['first_iteration']}, got {numbers[:1]}")
    if "last_iteration" in entry and (numbers[-1:] or [None])[0] != entry["last_iteration"]:
        problems.append(f"last iteration: expected {entry['last_iteration']}, got {numbers[-1:]}")
    by_number = {it.iteration: it for it in run.iterations}
    for number, wanted in entry.get("iterations", {}).items():
        it = by_number.get(int(number))
        if it is None:
            problems.append(f"iteration {number}: not parsed")
        else:
            _check_fields(f"iteration {number}", it, wanted, problems)

    for source, count in entry.get("timer_blocks", {}).items():
        got = sum(1 for block in run.timers if block.source == source)
        if got != count:
            problems.append(f"timer blocks from {source}: expected {count}, got {got}")
    for wanted in entry.get("timers", []):
        candidates = [b for b in run.timers if b.source == wanted["source"]]
        if not any(
            all(_same(b.values_ms.get(k, "<missing>"), v) for k, v in wanted["values_ms"].items())
            for b in candidates
        ):
            problems.append(
                f"no {wanted['source']} timer block with {wanted['values_ms']!r} "
                f"({len(candidates)} blocks of that source parsed)"
            )

    if "memory_count" in entry and len(run.memory) != entry["memory_count"]:
        problems.append(f"memory reports: expected {entry['memory_count']}, got {len(run.memory)}")
    for key in ("memory", "memory_other"):
        reports = getattr(run, key)
        for wanted in entry.get(key, []):
            if not any(
                all(_same(getattr(m, k, "<missing>"), v) for k, v in wanted.items())
                for m in reports
            ):
                seen = [_fields(m, wanted) for m in reports[:3]]
                problems.append(f"no {key} report with {wanted!r} (first parsed: {seen!r})")

    for key, value in entry.get("config", {}).items():
        actual = run.config.get(key, "<missing>")
        if not _same(actual, value):
            problems.append(f"config.{key}: expected {value!r}, got {actual!r}")

    steps_wanted = entry.get("pipeline_steps")
    if steps_wanted:
        if len(run.pipeline_steps) != steps_wanted["count"]:
            problems.append(
                f"pipeline steps: expected {steps_wanted['count']}, got {len(run.pipeline_steps)}"
            )
        by_step = {s.step: s for s in run.pipeline_steps}
        for step, wanted in steps_wanted.get("steps", {}).items():
            if int(step) not in by_step:
                problems.append(f"pipeline step {step}: not parsed")
            else:
                _check_fields(f"pipeline step {step}", by_step[int(step)], wanted, problems)
    return problems


@pytest.mark.parametrize("entry", EXPECTED, ids=[e["file"].removesuffix(".log") for e in EXPECTED])
def test_external_log(entry: dict[str, Any]) -> None:
    runs = _parse_file(FIXTURES / entry["file"])
    problems = _check_run(entry, runs)
    assert not problems, f"{entry['file']}:\n  " + "\n  ".join(problems)


def test_every_fixture_has_expectations() -> None:
    logs = {p.name for p in FIXTURES.glob("*.log")}
    assert logs == {e["file"] for e in EXPECTED}
    assert len(logs) >= 12


# -- the report on these logs: warm-up where it ends, pauses left out, no negative remainder ----


def _report_rows(logdir: Path, out: Path) -> dict[str, Any]:
    build = importlib.import_module("analysis.report.build")
    return {r.name: r for r in build.build(logdir, out)}


def test_warm_up_of_several_iterations_is_found_and_named(tmp_path: Path) -> None:
    """A real Megatron log at log interval 1 (bigscience-2021-meg-ds-3d-lm-loss, 49 iterations)
    with the times of the issue's Megatron-Core run written in: iteration 1 at 132,508 ms,
    2 at 67,124 ms, then 1,460-1,830 ms."""
    text = (FIXTURES / "bigscience-2021-meg-ds-3d-lm-loss.log").read_text(encoding="utf-8")
    later = [1460.0 + (i * 37) % 371 for i in range(47)]
    times = iter([132508.0, 67124.0, *later])
    text = re.sub(
        r"elapsed time per iteration \(ms\): [\d.]+",
        lambda _m: f"elapsed time per iteration (ms): {next(times):.1f}",
        text,
    )
    (tmp_path / "warmup.log").write_text(text, encoding="utf-8")
    row = _report_rows(tmp_path, tmp_path / "report")["warmup"]
    median = statistics.median(later)
    assert abs(row.iter_ms_mean - median) / median < 0.03
    assert row.warmup_iterations == [1, 2]
    assert "iterations 1, 2 (warm-up" in row.steady_dropped
    report = (tmp_path / "report" / "report.md").read_text(encoding="utf-8")
    assert "dropped: windows ending at iterations 1, 2 (warm-up" in report


def test_external_corpus_pauses_left_out_and_no_negative_remainder(tmp_path: Path) -> None:
    rows = _report_rows(FIXTURES, tmp_path / "report")
    for row in rows.values():
        assert row.other_ms is None or row.other_ms >= 0, (row.name, row.other_ms)
    aurora = rows["alcf-aurora-2025-keyvalue"]  # 3,395-3,420 ms; two windows of 6,863 and 5,334
    assert aurora.pause_iterations == [136006, 136008]
    assert aurora.iter_ms_mean == pytest.approx(statistics.fmean([3420.2, 3402.7, 3394.8, 3401.5]))
    moe = rows["mds-moe-2022-dp8-fp16"]  # 942 ms first window; 907 ms at iteration 110
    assert moe.warmup_iterations == [10] and moe.pause_iterations == [110]
    # "no timed run" only where no run of the group has a steady-state time
    text = (tmp_path / "report" / "report.md").read_text(encoding="utf-8")
    untimed = re.findall(r"^- \*\*(.+?)\*\*: no timed run", text, flags=re.M)
    for key in untimed:
        assert all(r.iter_ms_mean is None for r in rows.values() if r.setup_key == key), key
    assert "running or cut at iteration 120 of 1716613" in text  # mds-moe's log, cut
