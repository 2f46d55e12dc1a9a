"""Upstream's TensorBoard event files read as a run: the same rows as its text log (the fixture:
a real lab run, both ways), n/a with the reason where the events lack a value."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from analysis.parse.records import blocks_of
from analysis.report import build as report
from analysis.runs import load
from analysis.runs.tensorboard import MEMORY_NA, TFLOPS_NA

EVENTS_RUN = Path(__file__).parent / "fixtures" / "tensorboard" / "tiny-zero2-100mbit"
"""A real lab run (tiny, ZeRO-2, 2 nodes x 1 rank, 100 Mbit/s, upstream f4157bea): its text log
and its TensorBoard events (``--tensorboard-dir``, timers, batch and world size)."""


def _copy_without_logs(tmp_path: Path) -> Path:
    root = tmp_path / "events-only"
    shutil.copytree(EVENTS_RUN, root / EVENTS_RUN.name)
    for log in root.rglob("*.log"):
        log.unlink()
    return root


def test_events_give_the_rows_of_the_text_log(tmp_path: Path) -> None:
    (text,) = load.discover(EVENTS_RUN.parent)
    (events,) = load.discover(_copy_without_logs(tmp_path))
    assert text.log_files and not events.log_files
    assert events.event_files == text.event_files and len(events.event_files) == 1
    assert events.status == text.status == "completed"
    assert events.setup.strategy == "zero2" and events.setup.dp == 2
    pairs = list(zip(text.parsed.iterations, events.parsed.iterations, strict=True))
    assert [t.iteration for t, _e in pairs] == [5, 10, 15, 20, 25, 30]
    for t, e in pairs:
        assert e.iteration == t.iteration
        assert e.elapsed_ms == pytest.approx(t.elapsed_ms, abs=0.05)  # (printed to 0.1 ms)
        assert e.lm_loss == pytest.approx(t.lm_loss, rel=1e-6)  # (printed to 7 digits)
        assert e.learning_rate == pytest.approx(t.learning_rate, rel=1e-3)
        assert e.samples_per_s == pytest.approx(t.samples_per_s, abs=0.001)
        assert (e.global_batch_size, e.consumed_samples) == (
            t.global_batch_size,
            t.consumed_samples,
        )
        assert e.tflops is None
    timers = {b.iteration: b.values_ms for b in blocks_of(text.parsed.timers, "megatron")}
    compared = 0
    for block in blocks_of(events.parsed.timers, "megatron"):
        for name, ms in block.values_ms.items():
            printed = timers[block.iteration][name]
            assert ms == pytest.approx(max(printed), abs=0.005), (block.iteration, name)
            compared += 1
    assert compared == 6 * 3  # forward-backward, batch-generator, optimizer
    assert TFLOPS_NA in events.parsed.problems and MEMORY_NA in events.parsed.problems


def test_report_from_events_matches_the_text_log(tmp_path: Path) -> None:
    """The acceptance: the same ms/iteration (to 0.5%) with and without the text log."""
    text_rows = report.build(EVENTS_RUN.parent, tmp_path / "text")
    events_rows = report.build(_copy_without_logs(tmp_path), tmp_path / "events")
    (t,), (e,) = text_rows, events_rows
    assert e.iter_ms_mean == pytest.approx(t.iter_ms_mean, rel=0.005)
    assert e.iter_ms_mean == pytest.approx(1847.34, abs=0.05)
    assert e.samples_per_s == pytest.approx(t.samples_per_s, rel=0.005)
    assert e.event_files == t.event_files
    assert e.peak_mem_mb is None and e.na_reasons["peak_mem_mb"] == MEMORY_NA
    assert e.na_reasons["tflops_printed"] == TFLOPS_NA
    assert e.fwd_bwd_ms is not None and e.optimizer_ms is not None  # (Megatron's timers)


def test_a_bare_event_folder_is_a_run(tmp_path: Path) -> None:
    folder = tmp_path / "copied" / "my-run" / "tensorboard"
    shutil.copytree(EVENTS_RUN / "tensorboard", folder)
    (run,) = load.discover(tmp_path / "copied")
    assert run.name == "my-run" and run.kind == "log_files" and not run.log_files
    assert run.setup.zero_stage == 2 and run.setup.world_size == 2
    assert [i.iteration for i in run.parsed.iterations] == [5, 10, 15, 20, 25, 30]
    assert run.parsed.iterations[-1].lm_loss == pytest.approx(3.540396, rel=1e-6)
