"""The report: files written, summary.json contract, n/a with reasons, golden on the lab logs."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from test_metrics import DP2_WINDOWS, SETUP, dp2_parsed, loaded

from analysis import load, report

LAB = Path(__file__).parents[2] / "shared" / "lab-logs"
GOLDEN = Path(__file__).parent / "golden" / "report"

DESIGN_KEYS = [
    "name", "model", "strategy", "status", "iter_ms_mean", "iter_ms_std", "samples_per_s",
    "tflops", "peak_mem_mb", "speedup", "comm_bytes_per_iter", "busbw_gbps_timers",
    "busbw_gbps_inferred", "busbw_gbps_measured",
]  # fmt: skip


def hand_runs() -> list[load.LoadedRun]:
    slow = [(i, ms * 1.5) for i, ms in DP2_WINDOWS]
    zero2 = load.RunSetup(**{**SETUP.__dict__, "strategy": "zero2", "zero_stage": 2})
    failed = load.LoadedRun(
        name="pp2_layernorm_FAIL", path="pp2_layernorm_FAIL", kind="log_files",
        parsed=dp2_parsed(windows=[], steps={}), setup=SETUP, status="failed",
        failure_kind="exception",
        failure_reason="TypeError: LayerNorm.__init__() got an unexpected keyword argument "
        "'sequence_parallel'",
    )  # fmt: skip
    return [loaded(), loaded("zero2", dp2_parsed(windows=slow), zero2), failed]


@pytest.fixture
def built(tmp_path, monkeypatch):
    monkeypatch.setattr(load, "discover", lambda logdir, exclude=(): hand_runs())
    out = tmp_path / "report"
    rows = report.build(tmp_path, out)
    return out, rows


def test_writes_every_output(built):
    out, rows = built
    assert (out / "report.md").exists() and (out / "summary.csv").exists()
    pngs = sorted(p.name for p in (out / "figures").glob("*.png"))
    assert [p.split("-")[0] for p in pngs] == ["bandwidth", "breakdown", "memory", "time"]
    assert all((out / "figures" / p).stat().st_size > 5000 for p in pngs)
    assert len(rows) == 3


def test_summary_json_has_design_keys(built):
    out, _ = built
    runs = json.loads((out / "summary.json").read_text())["runs"]
    assert [r["name"] for r in runs] == ["dp2", "zero2", "pp2_layernorm_FAIL"]
    for run in runs:
        assert set(DESIGN_KEYS) <= run.keys()
    zero2 = runs[1]
    assert zero2["speedup"] == pytest.approx(1 / 1.5)
    assert zero2["iter_ms_mean"] == pytest.approx(209.84 * 1.5)
    assert runs[2]["iter_ms_mean"] is None and runs[2]["status"] == "failed"


def test_failed_run_shown_with_reason_and_na_footnotes(built):
    out, _ = built
    text = (out / "report.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| pp2_layernorm_FAIL"))
    assert "failed" in row and "n/a[^" in row
    assert "sequence_parallel" in text
    # Every footnote marker has a definition.
    refs = set(re.findall(r"\[\^(\d+)\](?!:)", text))
    defs = set(re.findall(r"^\[\^(\d+)\]:", text, flags=re.M))
    assert refs == defs and refs


def test_findings_follow_the_numbers(built):
    out, _ = built
    text = (out / "report.md").read_text()
    assert "Fastest: **dp2** (baseline) at 209.8 ms/iteration" in text
    assert "zero2 is slower than dp2: 0.67x" in text


def test_previous_report_is_kept(built, tmp_path, monkeypatch):
    out, _ = built
    (out / "report.md").write_text("old")
    report.build(tmp_path, out)
    assert (tmp_path / "report.previous-1" / "report.md").read_text() == "old"


def normalise(text: str) -> str:
    """Replace what depends on the machine: report numbering and where the lab logs live."""
    text = text.replace(str(LAB.resolve()), "<lab-logs>").replace(str(LAB), "<lab-logs>")
    return re.sub(r"previous-\d+", "previous-N", text)


def test_golden_lab_logs(tmp_path):
    pytest.importorskip("analysis.parse", reason="analysis.parse not available yet")
    if not LAB.is_dir():
        pytest.skip(f"lab logs not found at {LAB}")
    out = tmp_path / "report"
    report.build(LAB, out)
    text = normalise((out / "report.md").read_text())
    golden = GOLDEN / "lab-logs.md"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
    assert golden.exists(), "run with UPDATE_GOLDEN=1 to create the golden report"
    assert text == golden.read_text()
