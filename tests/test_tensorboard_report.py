"""The report's TensorBoard runs (HParams), read back by a real ``tensorboard`` server on
localhost through its HTTP data API."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from conftest import LAB_LOGS

from analysis.report import build as report
from analysis.report.tensorboard import HPARAMS, METRICS

SERVER_START_S = 90.0
"""How long the server may take to answer its first request (it loads its plugins)."""


def _finite(value: Any) -> bool:
    return value is not None and math.isfinite(value)


def _get(url: str, body: dict[str, Any] | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=20) as answer:
        return json.loads(answer.read())


@pytest.fixture
def server(tmp_path: Path):
    """A report of the lab logs and a tensorboard server on it (localhost, stopped at the end):
    yields (base URL, report rows)."""
    out = tmp_path / "report"
    rows = report.build(LAB_LOGS, out)
    log_path = tmp_path / "tensorboard.log"
    log = log_path.open("w")
    # --port 0: the system picks a free port; the server prints its URL.
    argv = ["--logdir", str(out / "tensorboard"), "--host", "127.0.0.1", "--port", "0"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", *argv], stdout=log, stderr=subprocess.STDOUT
    )
    try:
        # Until it answers with every run (it loads the folder in the background).
        deadline = time.monotonic() + SERVER_START_S
        base = None
        while True:
            try:
                found = re.search(r" at (http://127\.0\.0\.1:\d+)/", log_path.read_text())
                base = base or (found.group(1) if found else None)
                if base and {r.name for r in rows} <= set(_get(f"{base}/data/runs")):
                    break
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            assert proc.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, "tensorboard did not list the runs in time"
            time.sleep(0.5)
        yield base, rows
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def test_tensorboard_server_lists_every_run_and_metric(server) -> None:
    base, rows = server
    runs = _get(f"{base}/data/runs")
    assert {r.name for r in rows} <= set(runs)
    experiment = _get(f"{base}/data/plugin/hparams/experiment", {"experimentName": ""})
    assert {h["name"] for h in experiment["hparamInfos"]} == set(HPARAMS)
    tags = [tag for tag, _label in METRICS.values()]
    assert [m["name"]["tag"] for m in experiment["metricInfos"]] == tags
    strategies = next(h for h in experiment["hparamInfos"] if h["name"] == "strategy")
    assert set(strategies["domainDiscrete"]) >= {"baseline", "pipeline", "tensor", "zero3"}
    differs = {h["name"]: h["differs"] for h in experiment["hparamInfos"]}
    assert differs["strategy"] and differs["tp"] and not differs["model"]  # (ticked first)
    request = {
        "experimentName": "",
        "allowedStatuses": ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE"],
        "colParams": [],
        "startIndex": 0,
        "sliceSize": 1000,
    }
    known = sum(_finite(getattr(r, key)) for r in rows for key in METRICS)
    deadline = time.monotonic() + SERVER_START_S
    while True:  # (until the server has read every run's events)
        groups = _get(f"{base}/data/plugin/hparams/session_groups", request)["sessionGroups"]
        if sum(len(g["metricValues"]) for g in groups) >= known or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    by_name = {g["name"]: g for g in groups}
    assert set(by_name) == {r.name for r in rows}
    for row in rows:
        group = by_name[row.name]
        assert group["hparams"]["strategy"] == (row.strategy or "n/a")
        assert group["hparams"]["tp"] == row.tp
        values = {m["name"]["tag"]: m["value"] for m in group["metricValues"]}
        for key, (tag, _label) in METRICS.items():
            known = getattr(row, key)
            if known is None or not math.isfinite(known):
                assert tag not in values
            else:
                assert values[tag] == pytest.approx(known, rel=1e-6), (row.name, tag)
    timed = [r for r in rows if r.iter_ms_mean is not None]
    assert len(timed) >= 6


def test_report_writes_one_tensorboard_run_per_run(tmp_path: Path) -> None:
    out = tmp_path / "report"
    rows = report.build(LAB_LOGS, out)
    folders = {p.name for p in (out / "tensorboard").iterdir() if p.is_dir()}
    assert folders == {r.name for r in rows}
    shutil.rmtree(out)
