"""End to end on real upstream: generate, launch through the real deepspeed launcher, record,
parse and report. Short runs (8 iterations); minutes in all.

Local: 2 ranks on this machine. Lab (root): two emulated nodes on a shaped link, through the
default pdsh-over-ssh path and through per-node ``--no_ssh``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from launchers.config.upstream import check_upstream, tiny_data
from launchers.lab.session import lab_available

ROOT = Path(__file__).resolve().parents[1]
UPSTREAM = check_upstream()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.upstream,
    pytest.mark.skipif(not UPSTREAM.ok, reason=f"needs upstream: {UPSTREAM.message()}"),
    pytest.mark.skipif(not tiny_data().exists(), reason="tiny dataset missing: run `make setup`"),
]
SHORT = ["--set", "train_iters=8", "--set", "log_interval=2"]


def launch(logs: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "launchers", *args, "--logs", str(logs), *SHORT],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def only_run_dir(logs: Path, name: str) -> Path:
    dirs = sorted((logs / name).iterdir())
    assert len(dirs) == 1, dirs
    return dirs[0]


def check_completed_run(run_dir: Path, *, logs: tuple[str, ...]) -> dict:
    for name in ("launch.sh", "ds_config.json", "hostfile", "run.json", *logs):
        assert (run_dir / name).is_file(), f"{name} missing in {run_dir}"
    doc = json.loads((run_dir / "run.json").read_text())
    outcome = doc["outcome"]
    assert outcome["status"] == "completed", outcome
    assert outcome["last_iteration"] == outcome["train_iters"] == 8
    assert doc["provenance"]["upstream"] == {"commit": UPSTREAM.commit, "patch": None}
    from analysis.parse.reader import merge_runs, parse_file

    parsed = merge_runs([parse_file(run_dir / name)[-1] for name in logs])
    losses = [it.lm_loss for it in sorted(parsed.iterations, key=lambda it: it.iteration)]
    assert len(losses) == 4 and None not in losses
    assert losses[-1] < losses[0], f"loss did not decrease: {losses}"
    return doc


def test_local_run_dir_is_complete_and_reported(tmp_path):
    res = launch(tmp_path, "run", "--model", "tiny", "--strategy", "zero1")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    run_dir = only_run_dir(tmp_path, "tiny-zero1")
    doc = check_completed_run(run_dir, logs=("launcher.log",))
    assert doc["spec"]["strategy"]["zero_stage"] == 1 and doc["spec"]["launcher"] == "local"
    assert "matrix summary" in res.stdout

    # The same spec again is skipped; a changed one runs.
    again = launch(tmp_path, "run", "--model", "tiny", "--strategy", "zero1")
    assert again.returncode == 0 and "skipped, identical spec completed" in again.stdout
    assert len(list((tmp_path / "tiny-zero1").iterdir())) == 1

    out = tmp_path / "report"
    rep = subprocess.run(
        [sys.executable, "-m", "analysis.report", str(tmp_path), "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert rep.returncode == 0, rep.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    (row,) = [r for r in summary["runs"] if r["strategy"] == "zero1"]
    assert row["status"] == "completed"
    assert row["iter_ms_mean"] and row["iter_ms_mean"] > 0
    assert row["comm_bytes_per_iter"] == 3_501_056 + 1_750_528  # all-reduce + all-gather (fp32)

    # Upstream's TensorBoard events alone (the text log deleted) give the same figures.
    assert row["event_files"] and list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    events_only = tmp_path / "events-only"
    shutil.copytree(run_dir, events_only / run_dir.name)
    for log in events_only.rglob("*.log"):
        log.unlink()
    out2 = tmp_path / "report-events"
    rep2 = subprocess.run(
        [sys.executable, "-m", "analysis.report", str(events_only), "--out", str(out2)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert rep2.returncode == 0, rep2.stderr[-2000:]
    (row2,) = json.loads((out2 / "summary.json").read_text())["runs"]
    assert row2["status"] == "completed"
    assert row2["iter_ms_mean"] == pytest.approx(row["iter_ms_mean"], rel=0.005)


LAB_OK, LAB_WHY = lab_available(ssh=True)


@pytest.mark.root
@pytest.mark.skipif(not LAB_OK, reason=f"emulated cluster unavailable: {LAB_WHY}")
@pytest.mark.parametrize("launcher", ["pdsh", "no_ssh"], ids=["pdsh-over-ssh", "no_ssh"])
@pytest.mark.parametrize("strategy", ["pipeline", "zero2"])
def test_lab_runs_complete(tmp_path, strategy, launcher):
    args = ["run", "--model", "tiny", "--strategy", strategy, "--net", "1gbit", "--no-netbench"]
    if launcher == "no_ssh":
        args += ["--launcher", "no_ssh"]
    res = launch(tmp_path, *args)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    run_dir = only_run_dir(tmp_path, f"tiny-{strategy}")
    logs = ("launcher.log",) if launcher == "pdsh" else ("node0.log", "node1.log")
    doc = check_completed_run(run_dir, logs=logs)
    assert doc["spec"]["launcher"] == launcher
    net = doc["network"]
    assert net["link_mbit"] == 1000.0 and net["transport"] in ("ssh", "netns-exec")
    per = net["per_iteration"]
    assert per is not None, net.get("per_iteration_reason")
    # ZeRO-2 moves ~15.75 MB per iteration, PP ~0.79 MB (theory.comm); the wire adds headers.
    expected = 15_754_752 if strategy == "zero2" else 786_432
    assert 0.95 * expected < per["max_tx_bytes"] < 1.25 * expected, per
    assert (
        subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.count(
            net["lab"]
        )
        == 0
    ), "lab left behind"


@pytest.mark.root
@pytest.mark.skipif(not LAB_OK, reason=f"emulated cluster unavailable: {LAB_WHY}")
def test_lab_values_reach_the_remote_shell_literally(tmp_path):
    # The data under a path with a space, '$', '%n' (pdsh substitutes it) and a command
    # substitution that must never run, on 2 emulated nodes through pdsh over ssh.
    marker = tmp_path / "marker"
    data_dir = tmp_path / "d $HOME %n" / f"$(touch {marker})"
    data_dir.mkdir(parents=True)
    data = tiny_data()
    for src in (data.vocab_file, data.merge_file, data.data_prefix.with_suffix(".bin"),
                data.data_prefix.with_suffix(".idx")):  # fmt: skip
        (data_dir / src.name).write_bytes(src.read_bytes())
    sets = [f"data_path={data_dir / data.data_prefix.name}",
            f"vocab_file={data_dir / data.vocab_file.name}",
            f"merge_file={data_dir / data.merge_file.name}"]  # fmt: skip
    args = ["run", "--model", "tiny", "--strategy", "zero1", "--net", "1gbit", "--no-netbench",
            "--stall", "900"]  # fmt: skip
    for item in sets:
        args += ["--set", item]
    res = launch(tmp_path / "logs", *args)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    doc = check_completed_run(only_run_dir(tmp_path / "logs", "tiny-zero1"),
                              logs=("launcher.log",))  # fmt: skip
    assert doc["spec"]["launcher"] == "pdsh"
    assert doc["spec"]["paths"]["data_path"] == str(data_dir / data.data_prefix.name)
    assert not marker.exists(), "a value was executed by a remote shell"
