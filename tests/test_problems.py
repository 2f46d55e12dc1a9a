"""Problems of loaded runs carry a stable code; the report selects unreadable runs by code."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import LAB_LOGS

from analysis.report.build import main as report_main
from analysis.runs.load import discover
from analysis.runs.problems import UNREAD_CODES, Problem


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("3 line(s) longer than 65536 characters were truncated", "truncated_lines"),
        ("line 40: argument dump cut short", "cut_short"),
        ("line 9: traceback without a final exception line (log cut short?)", "cut_short"),
        ("no training output recognised", "no_training_output"),
        ("line 3: further failure (nccl): x", "log"),
    ],
)
def test_parser_problems_get_their_code_in_one_place(text: str, code: str) -> None:
    problem = Problem.of_parser(text)
    assert (problem.code, problem.field, problem.message, str(problem)) == (code, "log", text, text)


def _run_dir(root: Path, name: str, record: object) -> Path:
    run_dir = root / name / "20261122T030000Z"
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps(record))
    shutil.copy(LAB_LOGS / "dp2.log", run_dir / "launcher.log")
    return run_dir


def test_problems_carry_codes_and_the_report_lists_unreadable_ones_by_code(tmp_path) -> None:
    logs = tmp_path / "logs"
    _run_dir(logs, "good", {"name": "good", "outcome": {"status": "completed"}})
    _run_dir(logs, "bad-record", {"name": "bad-record", "outcome": {"wall_s": "slow"}})
    no_log = _run_dir(logs, "no-log", {"name": "no-log"})
    (no_log / "launcher.log").unlink()
    (logs / "bare").mkdir()
    shutil.copy(LAB_LOGS / "dp2.log", logs / "bare" / "dp2.log")  # no .json, no .cmd
    runs = {r.name: r for r in discover(logs)}
    codes = {name: sorted({p.code for p in r.problems}) for name, r in runs.items()}
    assert codes["good"] == []
    assert codes["bad-record"] == ["invalid_run_json"]
    bad = next(p for p in runs["bad-record"].problems if p.code == "invalid_run_json")
    assert bad.field == "run.json"
    assert bad.message.startswith("run.json: outcome.wall_s: 'slow' is not a number")
    assert "no_log" in codes["no-log"]
    assert {"no_ds_config", "no_cmd"} <= set(codes["dp2"])
    assert not set(codes["dp2"]) & UNREAD_CODES

    out = tmp_path / "report"
    assert report_main([str(logs), "--out", str(out)]) == 0
    text = (out / "report.md").read_text()
    section = text.split("## Runs that could not be read fully", 1)[1].split("\n## ", 1)[0]
    assert "bad-record" in section and "outcome.wall_s" in section
    assert "no-log" in section and "no *.log file" in section
    assert "good" not in section and "dp2" not in section
    summary = json.loads((out / "summary.json").read_text())
    bad_row = next(r for r in summary["runs"] if r["name"] == "bad-record")
    assert bad.message in bad_row["problems"], "summary.json keeps the messages"
