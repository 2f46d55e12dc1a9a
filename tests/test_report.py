"""The report: files written, summary.json contract, n/a with reasons, golden on the lab logs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import DP2_SETUP, DP2_WINDOWS, LAB_LOGS, dp2_parsed, loaded
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analysis.report import build as report
from analysis.runs import load
from analysis.theory import setup as run_setup

GOLDEN = Path(__file__).parent / "golden" / "report"

DESIGN_KEYS = [
    "name", "model", "strategy", "status", "iter_ms_mean", "iter_ms_std", "samples_per_s",
    "tflops", "peak_mem_mb", "speedup", "comm_bytes_per_iter", "busbw_gbps_timers",
    "busbw_gbps_inferred", "busbw_gbps_measured",
]  # fmt: skip


def hand_runs() -> list[load.LoadedRun]:
    slow = [(i, ms * 1.5) for i, ms in DP2_WINDOWS]
    zero2 = run_setup.RunSetup(**{**DP2_SETUP.__dict__, "strategy": "zero2", "zero_stage": 2})
    failed = load.LoadedRun(
        name="pp2_layernorm_FAIL", path="pp2_layernorm_FAIL", kind="log_files",
        parsed=dp2_parsed(windows=[], steps={}), setup=DP2_SETUP, status="failed",
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
    """Replace what depends on the machine (report numbering, where the lab logs live) and the
    model's outputs: the numbers of the "Scaling predictions" section are masked, so the golden
    file holds that section's shape and words, not the model's values; those are checked by
    behaviour in tests/test_predict.py (leave-one-out, bounds, hand-computed values)."""
    text = text.replace(str(LAB_LOGS.resolve()), "<lab-logs>").replace(str(LAB_LOGS), "<lab-logs>")
    start = text.find("## Scaling predictions")
    if start >= 0:
        end = text.find("\n## ", start + 1)
        end = len(text) if end < 0 else end
        text = text[:start] + re.sub(r"\d[\d,.]*", "#", text[start:end]) + text[end:]
    return re.sub(r"previous-\d+", "previous-N", text)


def test_golden_lab_logs(tmp_path):
    out = tmp_path / "report"
    report.build(LAB_LOGS, out)
    text = normalise((out / "report.md").read_text())
    golden = GOLDEN / "lab-logs.md"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
    assert golden.exists(), "run with UPDATE_GOLDEN=1 to create the golden report"
    assert text == golden.read_text()


# -- failed and incomplete runs never take part in a ratio ----------------------------------------

STRATEGY_LAYOUT = {  # strategy -> (tp, pp, dp, zero stage) on 2 ranks
    "baseline": (1, 1, 2, 0),
    "zero1": (1, 1, 2, 1),
    "zero2": (1, 1, 2, 2),
    "pipeline": (1, 2, 1, 0),
    "tensor": (2, 1, 1, 0),
}


def _run(name: str, strategy: str, status: str, windows, factor: float = 1.0, **kw):
    tp, pp, dp, zero = STRATEGY_LAYOUT[strategy]
    setup = run_setup.RunSetup(**{**DP2_SETUP.__dict__, "strategy": strategy, "tp": tp, "pp": pp,
                             "dp": dp, "zero_stage": zero, "train_iters": 30})  # fmt: skip
    parsed = None
    if windows is not None:
        parsed = dp2_parsed(windows=[(i, ms * factor) for i, ms in windows], steps={})
        parsed.status = status if status in ("completed", "failed", "incomplete") else "incomplete"
    return load.LoadedRun(
        name=name, path=name, kind="log_files", parsed=parsed, setup=setup, status=status, **kw
    )  # fmt: skip


def _rows(runs, baseline=None):
    from analysis.metrics import rows as metrics
    from analysis.metrics import speedup
    from analysis.predict import prediction
    from analysis.report import predictions as report_predictions

    rows = speedup.compare([metrics.compute(r) for r in runs], baseline)
    model = report_predictions.report_sections(runs, rows)
    rows = prediction.fill_rows(rows, model.loo)
    text = report.render(rows, "logs", [], model)
    for key, group in report._groups(rows).items():
        text += "\n".join(report.recommendations(key, group))
    return rows, text


OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"


def test_failed_baseline_after_three_iterations_is_never_a_reference(tmp_path, monkeypatch):
    """The baseline logged iterations 1-3 (two steady windows: a time of its own) and then
    died of OOM: no speedup uses it; the completed run with the fewest model-parallel ranks is
    the reference, and the report says which and why; the failed run is listed with its
    reason and last iteration, and the report is written (it used to raise StopIteration)."""
    three = [(1, 300.0), (2, 210.0), (3, 212.0)]
    runs = [
        _run("base", "baseline", "failed", three, failure_kind="oom", failure_reason=OOM),
        _run("z1", "zero1", "completed", DP2_WINDOWS, 1.05),
        _run("pp", "pipeline", "completed", DP2_WINDOWS, 1.02),
        _run("tp", "tensor", "completed", DP2_WINDOWS, 2.0),
    ]
    monkeypatch.setattr(load, "discover", lambda logdir, exclude=(): runs)
    rows = {r.name: r for r in report.build(tmp_path, tmp_path / "report")}
    assert rows["base"].iter_ms_mean is not None  # it has a time, but no ratio uses it
    assert rows["base"].speedup is None and rows["base"].last_iteration == 3
    assert {r.baseline for r in rows.values() if r.speedup is not None} == {"z1"}
    assert rows["z1"].speedup == 1.0
    assert rows["tp"].speedup == pytest.approx(1.05 / 2.0)
    text = (tmp_path / "report" / "report.md").read_text()
    assert (
        "Reference for speedups and savings: z1: the completed run with the fewest "
        "model-parallel ranks (tp x pp = 1), because base, the baseline run, failed (oom)."
    ) in text
    assert f"base failed (oom), last logged iteration 3 of 30: {OOM}. Not in any ratio." in text


def test_baseline_option_names_the_reference_unless_it_failed():
    runs = [
        _run("base", "baseline", "completed", DP2_WINDOWS),
        _run("z1", "zero1", "completed", DP2_WINDOWS, 1.05),
        _run("z2", "zero2", "failed", DP2_WINDOWS, 1.1, failure_kind="oom", failure_reason=OOM),
    ]
    rows, _ = _rows(runs, baseline="z1")
    assert {r.baseline for r in rows if r.speedup is not None} == {"z1"}
    assert rows[0].baseline_why == "z1: named by --baseline"
    rows, text = _rows(runs, baseline="z2")
    assert {r.baseline for r in rows if r.speedup is not None} == {"base"}
    assert "base: the group's data-parallel baseline run" in text


STATUSES = ["completed", "failed", "incomplete", "interrupted", "running", "missing"]
WINDOW_SETS = [[], DP2_WINDOWS[:1], DP2_WINDOWS[:2], DP2_WINDOWS[:3], DP2_WINDOWS]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.sampled_from(list(STRATEGY_LAYOUT)),
            st.sampled_from(STATUSES),
            st.integers(0, len(WINDOW_SETS) - 1),
            st.floats(0.5, 3.0),
        ),
        min_size=1,
        max_size=6,
    ),
    st.one_of(st.none(), st.integers(0, 7)),
)
def test_no_status_set_crashes_the_report_and_ratios_use_completed_runs(specs, named):
    """Failed and interrupted runs stay out of every ratio; running or cut runs are compared
    against a completed reference and marked."""
    runs = []
    for i, (strategy, status, w, factor) in enumerate(specs):
        windows = None if status == "missing" else WINDOW_SETS[w]
        runs.append(
            _run(f"r{i}-{strategy}", strategy, "incomplete" if status == "missing" else status,
                 windows, factor, failure_kind="oom" if status == "failed" else None,
                 failure_reason=OOM if status == "failed" else None)
        )  # fmt: skip
    baseline = runs[named].name if named is not None and named < len(runs) else None
    rows, text = _rows(runs, baseline)
    by_name = {r.name: r for r in rows}
    for r in rows:
        if r.status not in ("completed", "incomplete", "running"):  # failed, interrupted
            assert r.speedup is None and r.mem_saving_pct is None
            assert r.busbw_gbps_inferred is None
            assert f"{r.name} {r.status}" in text and "Not in any ratio." in text
        elif r.status != "completed":  # running or cut: timed and compared, marked
            assert r.busbw_gbps_inferred is None
            assert f"{r.name} running or cut" in text
        if r.speedup is not None:
            ref = by_name[r.baseline or ""]
            assert ref.status == "completed" and ref.setup_key == r.setup_key
            assert r.status in ("completed", "incomplete", "running")


def test_pipeline_timers_section_on_real_gpu_logs(tmp_path):
    """The bare per-node logs of a real two-node GPU pipeline run (DeepSpeed 0.18.2, PP 2):
    fwd/bwd/step per iteration, the wait beside the bubble theory, the remainder named."""
    src = Path(__file__).parent / "fixtures" / "external"
    for n in (0, 1):
        name = f"gpu2node-2025-pp2-64m_node{n}.log"
        (tmp_path / name).write_bytes((src / name).read_bytes())
    report.build(tmp_path, tmp_path / "report")
    text = (tmp_path / "report" / "report.md").read_text()
    section = text[text.index("### Pipeline timers") : text.index("## Memory efficiency")]
    # fwd 28.6 = mean of the printed totals after the warm-up print / steps_per_print 10, ...
    assert (
        "| gpu2node-2025-pp2-64m | 683.5 | 28.6 | 56.6 | 10.8 | 2.6 | 140.2 | 62.2% | 20.0% |"
        in (section)
    )
    assert "steps_per_print 10 (log (every 10 steps between 10 'steps:' lines))" in section
    assert "bubble theory (p-1)/(m+p-1) = 20.0% for balanced stages" in section
    assert "tied embedding gradient all-reduce (_exec_reduce_tied_grads, 51.5 MB" in section
    assert "0.927 Gbit/s bus bandwidth" in section


def test_main_prints_the_executive_summary(tmp_path, capsys):
    assert report.main([str(LAB_LOGS), "--out", str(tmp_path / "r"), "--summary"]) == 0
    out = capsys.readouterr().out
    md = (tmp_path / "r" / "report.md").read_text()
    lines = [line for line in out.splitlines() if line.startswith("- **")]
    # The same lines as the report's executive summary, one per setup group.
    assert lines and all(line in md for line in lines)
    assert len(lines) == md.split("## Executive summary", 1)[1].split("\n## ", 1)[0].count("- **")


def test_the_report_parses_the_logs_before_it_imports_pandas():
    """pandas takes 40 MiB: imported once the logs are parsed (for the one DataFrame), it is
    not resident at the parse's peak (the 64-rank stress log's report: 380 -> 343 MiB)."""
    repo = str(Path(__file__).resolve().parents[1])
    code = "import sys; import analysis.report.build; print('pandas' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=repo
    ).stdout
    assert out.strip() == "False"


def test_cut_log_is_timed_and_compared(tmp_path):
    """zero1's lab log cut at half its 30 iterations, beside the completed dp2 of its group."""
    for suffix in ("cmd", "json", "log"):
        (tmp_path / f"dp2.{suffix}").write_bytes((LAB_LOGS / f"dp2.{suffix}").read_bytes())
    for suffix in ("cmd", "json"):
        (tmp_path / f"zero1.{suffix}").write_bytes((LAB_LOGS / f"zero1.{suffix}").read_bytes())
    lines = (LAB_LOGS / "zero1.log").read_text(encoding="utf-8").splitlines(keepends=True)
    last = next(i for i, line in enumerate(lines) if " iteration       15/      30 |" in line)
    (tmp_path / "zero1.log").write_text("".join(lines[: last + 1]), encoding="utf-8")
    written = time.time() - 3 * 3600  # its last line three hours ago
    os.utime(tmp_path / "zero1.log", (written, written))
    rows = {r.name: r for r in report.build(tmp_path, tmp_path / "report")}
    cut, done = rows["zero1"], rows["dp2"]
    assert cut.status == "incomplete" and done.status == "completed"
    assert cut.last_iteration == 15 and cut.iter_ms_mean == pytest.approx((196.0 + 205.8) / 2)
    assert cut.baseline == "dp2" and cut.speedup == pytest.approx(
        done.iter_ms_mean / cut.iter_ms_mean
    )
    assert cut.speedup_ci95_lo < cut.speedup < cut.speedup_ci95_hi
    text = (tmp_path / "report" / "report.md").read_text(encoding="utf-8")
    assert cut.since_last_write_s == pytest.approx(3 * 3600, abs=600)
    assert (
        "| zero1 | zero1 | running or cut at iteration 15 of 30, log last written 3.0 h ago |"
        in text
    )
    assert "no timed run" not in text and "(1 running or cut), 0 not completed" in text
