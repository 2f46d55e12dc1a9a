"""Faults: every failure ends within its bound, is recorded with its cause, and loses nothing.

Two halves. The first drives the real executor and matrix with small bash launchers that
behave like a failing run (a hang, a killed peer, a launcher killed from outside, a signal to
the executor): fast, no upstream needed. The second injects faults into real runs of upstream
on an emulated 2-node cluster (root + upstream; ``slow``): a node's ranks SIGKILLed mid-run, a
cut link, Ctrl-C, and a memory limit the run does not fit in.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import tiny_specs

from launchers.config.hostfile import parse_hostfile_text
from launchers.config.presets import resolve_spec
from launchers.config.upstream import check_upstream
from launchers.run import execute
from launchers.run.execute import update_run_json, write_json_atomic
from launchers.run.matrix import failed, run_specs
from launchers.run.memlimit import LimitError, MemoryCgroup, parse_size
from launchers.run.render import render_run_dir
from launchers.run.verdict import LogFailure, root_cause

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


def iteration_line(k: int, total: int, ms: float = 200.0) -> str:
    """An upstream iteration line (the shape of the lab logs)."""
    return (
        f" iteration {k:>8}/{total:>8} | consumed samples: {8 * k:>12} | elapsed time per "
        f"iteration (ms): {ms:.1f} | learning rate: 1.000E-03 | global batch size:     8 | "
        f"lm loss: 5.000000E+00 | loss scale: 1.0 |"
    )


def fake_run_dir(tmp: Path, script: str, name: str = "fake-run", nodes: int = 0) -> Path:
    """A run directory whose launch.sh is ``script`` (bash); ``nodes`` > 0 makes it no_ssh."""
    run_dir = tmp / name
    run_dir.mkdir(parents=True)
    spec: dict[str, Any] = {"launcher": "local"}
    if nodes:
        spec = {"launcher": "no_ssh", "cluster": {"hosts": [f"n{i}" for i in range(nodes)]}}
    (run_dir / "run.json").write_text(
        json.dumps({"name": name, "spec": spec, "outcome": {"status": "generated"}})
    )
    (run_dir / "launch.sh").write_text("set -u\n" + textwrap.dedent(script))
    return run_dir


def prints_iterations(upto: int, total: int) -> str:
    return "".join(f"echo '{iteration_line(k, total)}'\n" for k in range(2, upto + 1, 2))


def outcome_of(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "run.json").read_text())["outcome"]


def pids_matching(pattern: str) -> list[int]:
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout
    return [int(p) for p in out.split() if int(p) != os.getpid()]


# --------------------------------------------------------------------------- records


def test_atomic_write_keeps_the_old_record_when_the_rename_fails(tmp_path, monkeypatch) -> None:
    path = tmp_path / "run.json"
    write_json_atomic(path, {"outcome": {"status": "generated"}})

    def broken_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(execute.os, "replace", broken_replace)
    with pytest.raises(OSError, match="No space left"):
        update_run_json(tmp_path, outcome={"status": "failed", "kind": "hang"})
    assert json.loads(path.read_text()) == {"outcome": {"status": "generated"}}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"], "temporary file left"


def test_atomic_write_keeps_the_old_record_when_the_write_fails(tmp_path, monkeypatch) -> None:
    path = tmp_path / "run.json"
    write_json_atomic(path, {"n": 1})

    def broken_fsync(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(execute.os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="Input/output error"):
        write_json_atomic(path, {"n": 2, "big": "x" * 1_000_000})
    assert json.loads(path.read_text()) == {"n": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]


def test_unserialisable_record_never_touches_the_file(tmp_path) -> None:
    path = tmp_path / "run.json"
    write_json_atomic(path, {"n": 1})
    with pytest.raises(ValueError, match="Circular reference"):
        cyclic: dict[str, Any] = {}
        cyclic["self"] = cyclic
        write_json_atomic(path, cyclic)
    assert json.loads(path.read_text()) == {"n": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]


@pytest.mark.parametrize("corrupt", [b'{"name": "tiny-base', b"\x00\xff\xfe", b"[1, 2]", b""])
def test_corrupt_run_json_is_kept_aside_not_overwritten(tmp_path, corrupt: bytes) -> None:
    (tmp_path / "run.json").write_bytes(corrupt)
    doc = update_run_json(tmp_path, outcome={"status": "failed"})
    kept = [p for p in tmp_path.iterdir() if p.name.startswith("run.json.unreadable-")]
    assert len(kept) == 1 and kept[0].read_bytes() == corrupt
    assert doc["outcome"] == {"status": "failed"}
    assert f"its bytes are kept in {kept[0].name}" in doc["record_problems"][0]
    assert json.loads((tmp_path / "run.json").read_text()) == doc


def _spec(**overrides: Any):
    cluster = parse_hostfile_text("localhost slots=2\n", "hf")
    return resolve_spec("tiny", "baseline", cluster, overrides, device="cpu")


def test_two_runs_in_the_same_second_get_distinct_directories(tmp_path) -> None:
    from datetime import datetime, timezone

    now = datetime(2026, 11, 22, 3, 0, 0, tzinfo=timezone.utc)
    spec = _spec()
    dirs = [render_run_dir(spec, tmp_path, now) for _ in range(3)]
    assert [d.name for d in dirs] == ["20261122T030000Z", "20261122T030000Z-2",
                                      "20261122T030000Z-3"]  # fmt: skip
    assert all((d / "run.json").exists() for d in dirs)


def test_a_run_directory_that_ran_cannot_run_again(tmp_path) -> None:
    run_dir = fake_run_dir(tmp_path, prints_iterations(4, 4))
    assert execute.run(run_dir, stall_s=30, show_progress=False).status == "completed"
    before = (run_dir / "launcher.log").read_text()
    with pytest.raises(RuntimeError, match=r"was already run .* never reused: generate a new one"):
        execute.run(run_dir, stall_s=30, show_progress=False)
    assert (run_dir / "launcher.log").read_text() == before
    assert outcome_of(run_dir)["status"] == "completed"


# --------------------------------------------------------------------------- executor, fast


def test_hang_is_stopped_after_stall_and_recorded(tmp_path) -> None:
    run_dir = fake_run_dir(tmp_path, prints_iterations(4, 10) + "exec sleep 600\n")
    t0 = time.monotonic()
    outcome = execute.run(run_dir, stall_s=2, show_progress=False)
    took = time.monotonic() - t0
    assert took < 2 + 4, f"took {took:.1f} s for a 2 s stall bound"
    assert (outcome.status, outcome.kind) == ("failed", "hang")
    assert outcome.reason == "no output for 2 s (last iteration 4): stopped as hung"
    assert (outcome.last_iteration, outcome.train_iters) == (4, 10)
    assert outcome_of(run_dir)["kind"] == "hang"
    last = (run_dir / "launcher.log").read_text().splitlines()[-1]
    assert last == f"# run outcome: failed kind=hang reason={outcome.reason}"


def test_killed_peer_then_hang_is_recorded_as_killed(tmp_path) -> None:
    killed = (
        "[2026-11-22 03:00:16,781] [ERROR] [launch.py:325:sigkill_handler] "
        "['python', '-u', 'pretrain_gpt.py'] exits with return code = -9"
    )
    script = prints_iterations(4, 10) + f'echo "10.200.0.2: {killed}"\nexec sleep 600\n'
    run_dir = fake_run_dir(tmp_path, script)
    outcome = execute.run(run_dir, stall_s=2, show_progress=False)
    assert (outcome.status, outcome.kind) == ("failed", "killed")
    assert outcome.reason == (
        "exits with return code = -9 (died of SIGKILL: Killed); then no output for 2 s "
        "(last iteration 4): stopped as hung"
    )
    assert outcome.failure_line == "launcher.log:4"  # after "# started" and 2 iterations


def test_what_the_stop_makes_processes_print_is_not_a_cause(tmp_path) -> None:
    # On SIGTERM this launcher prints an exception, as a rank does when it is terminated.
    script = (
        "trap 'echo \"RuntimeError: Connection reset by peer\"; exit 1' TERM\n"
        + prints_iterations(2, 10)
        + "sleep 600 & wait\n"
    )
    outcome = execute.run(fake_run_dir(tmp_path, script), stall_s=2, show_progress=False)
    assert (outcome.kind, outcome.last_iteration) == ("hang", 2)


def test_time_limit_bounds_a_run_that_keeps_printing(tmp_path) -> None:
    script = "while true; do echo still alive; sleep 0.2; done\n"
    t0 = time.monotonic()
    outcome = execute.run(fake_run_dir(tmp_path, script), stall_s=60, timeout_s=2,
                          show_progress=False)  # fmt: skip
    assert time.monotonic() - t0 < 2 + 4
    assert (outcome.status, outcome.kind) == ("failed", "time_limit")
    assert outcome.reason == "run exceeded its time limit of 2 s"


def test_launcher_killed_from_outside_leaves_no_orphans(tmp_path) -> None:
    tag = f"{987000 + os.getpid() % 1000}"
    script = prints_iterations(2, 10) + f"sleep {tag} &\nsleep 0.5\nkill -9 $$\n"
    outcome = execute.run(fake_run_dir(tmp_path, script), stall_s=30, show_progress=False)
    assert (outcome.status, outcome.kind) == ("failed", "killed")
    assert outcome.exit_codes == {"launcher": -9}
    assert pids_matching(f"sleep {tag}") == []


def test_one_dead_node_stops_the_other_nodes(tmp_path) -> None:
    script = """
        if [ "$1" = 1 ]; then echo 'ValueError: bad shard'; exit 3; fi
        exec sleep 600
    """
    t0 = time.monotonic()
    run_dir = fake_run_dir(tmp_path, script, nodes=2)
    outcome = execute.run(run_dir, stall_s=300, show_progress=False)
    assert time.monotonic() - t0 < 30 + execute.KILL_GRACE_S + 5
    assert (outcome.status, outcome.kind) == ("failed", "exception")
    assert outcome.reason == "ValueError: bad shard"
    assert outcome.failure_line == "node1.log:2"
    assert outcome.exit_codes["node1"] == 3


def test_the_node_that_failed_first_is_blamed_not_the_first_log(tmp_path) -> None:
    # node1 runs out of memory first; node0, whose log comes first, fails after it with an
    # error of its own (a consequence). Both are causes by kind: the first to arrive wins.
    script = """
        if [ "$1" = 1 ]; then
          sleep 0.3
          echo 'RuntimeError: DefaultCPUAllocator: can'"'"'t allocate memory: 8 bytes'
          exit 1
        fi
        sleep 2
        echo 'RuntimeError: Detected mismatch between collectives on ranks'
        exit 1
    """
    outcome = execute.run(fake_run_dir(tmp_path, script, nodes=2), stall_s=60,
                          show_progress=False)  # fmt: skip
    assert (outcome.kind, outcome.failure_line) == ("oom", "node1.log:2")
    assert "DefaultCPUAllocator" in (outcome.reason or "")


def test_a_rank_that_exits_without_a_traceback_is_blamed_not_its_peer(tmp_path) -> None:
    # Upstream's rank 0 when its C++ dataset helpers do not build: a line and sys.exit(1);
    # rank 1, waiting for it in a collective, then dies in gloo, its lines first in the log.
    gloo = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed "
            "by peer [127.0.0.1]:29610")  # fmt: skip
    script = f"""
        echo '[default1]:{gloo}'
        echo '[default0]:Making C++ dataset helpers module failed, exiting.'
        exit 1
    """
    outcome = execute.run(fake_run_dir(tmp_path, script), stall_s=60, show_progress=False)
    assert (outcome.status, outcome.kind) == ("failed", "exception")
    assert (outcome.reason or "").startswith("[default0]:Making C++ dataset helpers module failed")
    assert "run `make setup`" in (outcome.reason or "") and "Connection closed" in outcome.reason
    assert outcome.failure_line == "launcher.log:3"


def test_a_launcher_that_cannot_start_is_recorded_not_left_running(tmp_path) -> None:
    run_dir = fake_run_dir(tmp_path, "true\n")

    def wrap(_rank: int, argv: list[str]) -> list[str]:
        return ["/nonexistent/launcher", *argv]

    record = {"name": "x", "spec": {"launcher": "no_ssh", "cluster": {"hosts": ["n0"]}},
              "outcome": {"status": "generated"}}  # fmt: skip
    (run_dir / "run.json").write_text(json.dumps(record))
    with pytest.raises(FileNotFoundError):
        execute.run(run_dir, wrap=wrap, show_progress=False)
    outcome = outcome_of(run_dir)
    assert (outcome["status"], outcome["kind"]) == ("failed", "other")
    assert outcome["reason"].startswith("the executor could not run it: FileNotFoundError")


_SIGNAL_DRIVER = """
import sys
from pathlib import Path
from launchers.run import execute
try:
    execute.run(Path(sys.argv[1]), stall_s=60, show_progress=False)
except KeyboardInterrupt:
    sys.exit(130)
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_stops_every_process_and_records_interrupted(tmp_path, sig) -> None:
    tag = f"{988000 + os.getpid() % 1000}{int(sig)}"
    script = prints_iterations(2, 10) + f"sleep {tag} &\nsleep {tag} &\nwait\n"
    run_dir = fake_run_dir(tmp_path, script)
    proc = subprocess.Popen([PY, "-c", _SIGNAL_DRIVER, str(run_dir)], cwd=ROOT)
    log = run_dir / "launcher.log"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(pids_matching(f"sleep {tag}")) < 2:
        time.sleep(0.1)
    assert len(pids_matching(f"sleep {tag}")) == 2
    proc.send_signal(sig)
    assert proc.wait(timeout=30) == 130
    assert pids_matching(f"sleep {tag}") == []
    outcome = outcome_of(run_dir)
    assert (outcome["status"], outcome["kind"]) == ("interrupted", "cancelled")
    assert outcome["reason"] == f"interrupted by signal {sig.name}"
    assert outcome["last_iteration"] == 2
    assert log.read_text().splitlines()[-1].startswith("# run outcome: interrupted kind=cancelled")
    from analysis.parse.reader import parse_file

    parsed = parse_file(log)[-1]
    assert parsed.failure is not None and parsed.failure.kind == "cancelled"


# --------------------------------------------------------------------------- root cause


@pytest.mark.parametrize(
    ("kinds", "expected"),
    [
        (["nccl", "killed"], "killed"),
        (["nccl", "exception"], "exception"),
        (["other", "oom"], "oom"),
        (["exception", "nccl"], "exception"),
        (["nccl"], "nccl"),
        (["killed", "oom"], "killed"),
    ],
)
def test_root_cause_prefers_why_a_rank_died_over_its_peers_connection_errors(
    kinds: list[str], expected: str
) -> None:
    failures = [LogFailure(k, f"{k} line", f"launcher.log:{i}") for i, k in enumerate(kinds)]
    cause = root_cause(failures)
    assert cause is not None and cause.kind == expected
    if kinds[0] != expected:
        assert cause.message == f"{expected} line (also seen: {kinds[0]}: {kinds[0]} line)"


# --------------------------------------------------------------------------- memory limit


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("2G", 2 << 30),
        ("512M", 512 << 20),
        ("1.5GiB", 3 << 29),
        ("1048576", 1 << 20),
        ("64mb", 64 << 20),
    ],
)
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text) == size


def _cgroup_or_skip() -> MemoryCgroup:
    try:
        return MemoryCgroup.create(64 << 20, f"test-{os.getpid()}")
    except LimitError as exc:
        pytest.skip(f"no writable memory cgroup here: {exc}")


@pytest.mark.root
def test_memory_limit_oom_kill_is_recorded_as_oom(tmp_path) -> None:
    _cgroup_or_skip().remove()
    hog = "import time; b = bytearray(256 << 20); time.sleep(60)"
    script = prints_iterations(2, 10) + f"{PY} -c '{hog}'\necho rank exited $?\nexit 1\n"
    outcome = execute.run(fake_run_dir(tmp_path, script), stall_s=30,
                          mem_limit_bytes=64 << 20, show_progress=False)  # fmt: skip
    assert (outcome.status, outcome.kind) == ("failed", "oom")
    assert re.match(
        r"1 process\(es\) killed by the kernel OOM killer at the memory limit 64\.0MiB \(cgroup "
        r"fake-run-\d+ oom_kill counter\); the log says: killed: .*launch\.sh: line 3: \d+ Killed ",
        outcome.reason or "",
    ), outcome.reason
    record = json.loads((tmp_path / "fake-run" / "run.json").read_text())
    assert record["limits"]["memory_bytes"] == 64 << 20
    assert not Path(record["limits"]["cgroup"]).exists(), "the run's cgroup is removed"


_LOWER_OWN_LIMIT = r"""m=$(grep -E '^[0-9]+:memory:' /proc/self/cgroup | cut -d: -f3)
if [ -n "$m" ] && [ -f "/sys/fs/cgroup/memory$m/memory.limit_in_bytes" ]; then
  f="/sys/fs/cgroup/memory$m/memory.limit_in_bytes"
else
  f="/sys/fs/cgroup$(grep '^0::' /proc/self/cgroup | cut -d: -f3)/memory.max"
fi
echo 67108864 > "$f"
"""


@pytest.mark.root
def test_oom_reason_states_the_limit_the_kernel_held_when_it_was_changed(tmp_path) -> None:
    """A limit lowered while the run ran (here by the run itself, after 4 logged iterations: how
    a baseline that runs out of memory mid-run is reproduced) is the limit the reason names."""
    _cgroup_or_skip().remove()
    hog = "import time; b = bytearray(128 << 20); time.sleep(60)"
    script = prints_iterations(4, 10) + _LOWER_OWN_LIMIT + f"{PY} -c '{hog}'\nexit 1\n"
    outcome = execute.run(fake_run_dir(tmp_path, script), stall_s=30,
                          mem_limit_bytes=512 << 20, show_progress=False)  # fmt: skip
    assert (outcome.status, outcome.kind) == ("failed", "oom"), outcome
    assert (
        "killed by the kernel OOM killer at the memory limit 64.0MiB (changed while the run "
        "ran; configured 512.0MiB)" in (outcome.reason or "")
    ), outcome.reason


# --------------------------------------------------------------------------- matrix, fast

_BEHAVIOUR = {
    # Brackets as in gloo's messages: text in the summary table, not rich markup.
    "baseline": "echo 'ValueError: [/data/shard.cc:545] dataset shard missing'; exit 1\n",
    "zero1": prints_iterations(4, 4),
}


def _fake_render(spec, logs: Path) -> Path:
    """The real run directory of ``spec``, its launch.sh replaced by a scripted behaviour."""
    run_dir = render_run_dir(spec, logs)
    (run_dir / "launch.sh").write_text(_BEHAVIOUR[spec.strategy.name])
    return run_dir


def test_matrix_goes_on_past_a_failure_and_skips_completed_twins(tmp_path, capsys) -> None:
    logs = tmp_path / "logs"
    rows = run_specs(tiny_specs(["baseline", "zero1"]), logs, stall_s=30, render=_fake_render)
    assert [(r.name, r.status) for r in rows] == [("tiny-baseline", "failed"),
                                                   ("tiny-zero1", "completed")]  # fmt: skip
    assert rows[0].reason == "exception: ValueError: [/data/shard.cc:545] dataset shard missing"
    assert rows[1].iter_ms == 200.0
    assert [r.name for r in failed(rows)] == ["tiny-baseline"]
    out = capsys.readouterr().out
    assert "matrix summary" in out and "ValueError: [/data/shard.cc:545] dataset shard" in out

    again = run_specs(tiny_specs(["baseline", "zero1"]), logs, stall_s=30, render=_fake_render)
    assert [(r.name, r.status) for r in again] == [("tiny-baseline", "failed"),
                                                    ("tiny-zero1", "skipped")]  # fmt: skip
    assert again[1].run_dir == rows[1].run_dir

    forced = run_specs(tiny_specs(["zero1"]), logs, force=True, stall_s=30, render=_fake_render)
    changed = run_specs(
        tiny_specs(["zero1"], train_iters=12), logs, stall_s=30, render=_fake_render
    )
    assert forced[0].status == changed[0].status == "completed"
    runs = sorted((logs / "tiny-zero1").iterdir())
    assert len(runs) == 3, "first run, forced rerun, changed spec: three directories"
    assert len(list((logs / "tiny-baseline").iterdir())) == 2, "a failed run is never skipped"


def test_matrix_cli_exits_non_zero_when_a_run_failed(tmp_path, monkeypatch, capsys) -> None:
    if not check_upstream().ok:
        pytest.skip("upstream absent or not at the pinned commit: the CLI's preflight refuses")
    from launchers import cli
    from launchers.run import matrix

    monkeypatch.setattr(matrix, "render_run_dir", _fake_render)
    argv = ["matrix", "--model", "tiny", "--strategies", "baseline,zero1", "--device", "cpu",
            "--logs", str(tmp_path / "logs"), "--stall", "30"]  # fmt: skip
    assert cli.main(argv) == 1
    captured = capsys.readouterr()
    assert "not completed: tiny-baseline" in captured.err
    assert re.search(r"tiny-zero1\s+│\s+completed\s+│\s+200\.0", captured.out), captured.out


# --------------------------------------------------------------------------- real runs


def _lab_ready() -> str | None:
    from launchers.lab.session import lab_available

    ok, why = lab_available(ssh=True)
    if not ok:
        return why
    if not check_upstream().ok:
        return "upstream absent or not at the pinned commit (make setup)"
    return None


SHORT = ["--set", "train_iters=10", "--set", "log_interval=2", "--no-netbench"]
LONG = ["--set", "train_iters=2000", "--set", "log_interval=2", "--no-netbench"]
"""For runs that the test ends itself (a cut link, Ctrl-C): on a fast machine a 10-iteration run
could finish between its first iteration line and the fault."""


class Cli:
    """``python -m launchers ...`` in its own session, its output collected line by line."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(
            [PY, "-m", "launchers", *argv], cwd=ROOT, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )  # fmt: skip
        self.lines: list[str] = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def lab_id(self, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if m := re.search(r"^lab (mdsl\w+): ", self.text, re.M):
                return m.group(1)
            time.sleep(0.2)
        raise AssertionError(f"no lab started:\n{self.text}")

    def wait(self, timeout: float) -> int:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            raise
        self.thread.join(timeout=10)
        return rc


@pytest.fixture
def start_cli():
    """Start ``python -m launchers``; whatever the test's fate, the CLI is stopped (SIGINT:
    the lab it made is torn down) and waited for."""
    started: list[Cli] = []

    def start(argv: list[str]) -> Cli:
        started.append(Cli(argv))
        return started[-1]

    yield start
    for cli in started:
        if cli.proc.poll() is None:
            cli.proc.send_signal(signal.SIGINT)
            try:
                cli.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(cli.proc.pid, signal.SIGKILL)


def wait_for_iteration(logs: Path, pattern: str, timeout: float = 240) -> Path:
    """The run directory whose log shows a first iteration line, once it does."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for log in logs.glob(pattern):
            if re.search(r" iteration\s+\d+/", log.read_text(errors="replace")):
                return log.parent
        time.sleep(0.2)
    raise AssertionError(f"no iteration line in {logs}/{pattern} within {timeout} s")


def seconds_until_recorded(run_dir: Path, bound_s: float) -> float:
    """Seconds from now until run.json holds the run's outcome; fails past ``bound_s``."""
    t0 = time.monotonic()
    while outcome_of(run_dir)["status"] == "running":
        assert time.monotonic() - t0 < bound_s, f"run did not end within {bound_s:.0f} s"
        time.sleep(0.5)
    return time.monotonic() - t0


def namespace_ranks(namespace: str) -> list[int]:
    from launchers.lab.net import namespace_pids
    from launchers.lab.session import _cmdline

    # The ranks, not the node's launcher (deepspeed.launcher.launch names the script too).
    return [
        p
        for p in namespace_pids(namespace)
        if "pretrain_gpt.py" in (cmd := _cmdline(p)) and "deepspeed.launcher" not in cmd
    ]


def assert_nothing_left(lab_id: str, logs: Path) -> None:
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert lab_id not in names, f"lab namespaces left: {names}"
    assert pids_matching(f"pretrain_gpt.py.*{logs}") == [], "training processes left"


def report_line(logs: Path, name: str) -> str:
    out = logs / "report"
    subprocess.run([PY, "-m", "analysis.report", str(logs), "--out", str(out)], cwd=ROOT,
                   check=True, capture_output=True, timeout=300)  # fmt: skip
    text = (out / "report.md").read_text()
    lines = [ln for ln in text.splitlines() if f"{name} failed" in ln]
    assert lines, text
    return lines[0]


@pytest.mark.slow
@pytest.mark.upstream
@pytest.mark.root
def test_real_killed_node_is_recorded_and_the_matrix_goes_on(tmp_path, start_cli) -> None:
    if why := _lab_ready():
        pytest.skip(why)
    logs = tmp_path / "logs"
    matrix = ["matrix", "--model", "tiny", "--strategies", "baseline,zero1", "--net", "1gbit"]
    cli = start_cli([*matrix, "--stall", "60", "--logs", str(logs), *SHORT])
    lab_id = cli.lab_id()
    run_dir = wait_for_iteration(logs, "tiny-baseline/*/launcher.log")
    ranks = namespace_ranks(f"{lab_id}-n1")
    assert ranks, "no rank of node 1 found in its namespace"
    for pid in ranks:
        os.kill(pid, signal.SIGKILL)
    detect_s = seconds_until_recorded(run_dir, bound_s=60 + execute.KILL_GRACE_S + 30)
    assert cli.wait(timeout=400) == 1, cli.text
    outcome = outcome_of(run_dir)
    print(f"\nkilled node: ended {detect_s:.1f} s after the kill: {outcome}")
    assert (outcome["status"], outcome["kind"]) == ("failed", "killed"), outcome
    assert "return code = -9" in outcome["reason"]
    zero1 = json.loads(next((logs / "tiny-zero1").glob("*/run.json")).read_text())
    assert zero1["outcome"]["status"] == "completed", "the matrix went on"
    assert re.search(r"tiny-baseline\s+│\s+failed\s+│\s+n/a\s+│\s+killed: ", cli.text)
    assert_nothing_left(lab_id, logs)
    line = report_line(logs, "tiny-baseline")
    assert "(killed)" in line and "return code = -9" in line, line


@pytest.mark.slow
@pytest.mark.upstream
@pytest.mark.root
def test_real_cut_link_ends_as_hang_within_the_stall_bound(tmp_path, start_cli) -> None:
    if why := _lab_ready():
        pytest.skip(why)
    from launchers.lab.net import PREFIX, port_name

    logs = tmp_path / "logs"
    run = ["run", "--model", "tiny", "--strategy", "baseline", "--net", "1gbit"]
    cli = start_cli([*run, "--stall", "60", "--logs", str(logs), *LONG])
    lab_id = cli.lab_id()
    run_dir = wait_for_iteration(logs, "tiny-baseline/*/launcher.log")
    port = port_name(lab_id.removeprefix(PREFIX), 1)  # the bridge port of node 1
    subprocess.run(["ip", "link", "set", port, "down"], check=True)
    detect_s = seconds_until_recorded(run_dir, bound_s=60 + execute.KILL_GRACE_S + 30)
    assert cli.wait(timeout=120) == 1, cli.text
    outcome = outcome_of(run_dir)
    print(f"\ncut link: ended {detect_s:.1f} s after the cut: {outcome}")
    assert (outcome["status"], outcome["kind"]) == ("failed", "hang"), outcome
    assert re.fullmatch(r"no output for 60 s \(last iteration \d+\): stopped as hung",
                        outcome["reason"])  # fmt: skip
    assert 60 <= detect_s < 60 + execute.KILL_GRACE_S + 30
    record = json.loads((run_dir / "run.json").read_text())
    left = record["network"].get("stopped_leftovers", [])
    assert all(p["node"] in ("node0", "node1") for p in left)
    assert_nothing_left(lab_id, logs)
    assert "(hang)" in report_line(logs, "tiny-baseline")


@pytest.mark.slow
@pytest.mark.upstream
@pytest.mark.root
def test_real_ctrl_c_in_the_lab_stops_everything_and_tears_down(tmp_path, start_cli) -> None:
    if why := _lab_ready():
        pytest.skip(why)
    logs = tmp_path / "logs"
    matrix = ["matrix", "--model", "tiny", "--strategies", "baseline,zero1", "--net", "1gbit"]
    cli = start_cli([*matrix, "--logs", str(logs), *LONG])
    lab_id = cli.lab_id()
    run_dir = wait_for_iteration(logs, "tiny-baseline/*/launcher.log")
    assert namespace_ranks(f"{lab_id}-n0") and namespace_ranks(f"{lab_id}-n1")
    t_sig = time.monotonic()
    os.kill(cli.proc.pid, signal.SIGINT)
    assert cli.wait(timeout=120) == 130, cli.text
    stop_s = time.monotonic() - t_sig
    outcome = outcome_of(run_dir)
    print(f"\nCtrl-C: CLI exited {stop_s:.1f} s after SIGINT: {outcome}")
    assert (outcome["status"], outcome["kind"]) == ("interrupted", "cancelled")
    assert outcome["reason"] == "interrupted by signal SIGINT"
    assert not (logs / "tiny-zero1").exists(), "the matrix stopped"
    assert re.search(r"tiny-zero1\s+│\s+not run", cli.text)
    assert_nothing_left(lab_id, logs)


@pytest.mark.slow
@pytest.mark.upstream
@pytest.mark.root
def test_real_run_over_its_memory_limit_is_recorded_as_oom(tmp_path, start_cli) -> None:
    if not check_upstream().ok:
        pytest.skip("upstream absent or not at the pinned commit (make setup)")
    _cgroup_or_skip().remove()
    logs = tmp_path / "logs"
    t0 = time.monotonic()
    cli = start_cli(["run", "--model", "tiny", "--strategy", "baseline", "--stall", "60",
               "--mem-limit", "1200M", "--logs", str(logs), "--set", "train_iters=10",
               "--set", "log_interval=2"])  # fmt: skip
    assert cli.wait(timeout=300) == 1, cli.text
    run_dir = next((logs / "tiny-baseline").iterdir())
    outcome = outcome_of(run_dir)
    print(f"\nmemory limit: ended after {time.monotonic() - t0:.1f} s: {outcome}")
    assert (outcome["status"], outcome["kind"]) == ("failed", "oom"), outcome
    assert "killed by the kernel OOM killer at the memory limit 1.2GiB" in outcome["reason"]
    assert pids_matching(f"pretrain_gpt.py.*{logs}") == []
    assert "(oom)" in report_line(logs, "tiny-baseline")


# --------------------------------------------------------------------------- unreadable runs


def _good_log(total: int = 10) -> str:
    return "training ...\n" + "".join(
        iteration_line(k, total) + "\n" for k in range(2, total + 1, 2)
    )


UNREADABLE = {
    "empty-log": ({"launcher.log": b""}, "no training output recognised"),
    "binary-log": ({"launcher.log": bytes(range(256)) * 400}, "no training output recognised"),
    "enormous-line": (
        {"launcher.log": b"x" * 3_000_000 + b"\n" + _good_log().encode()},
        "1 line(s) longer than 65536 characters were truncated",
    ),
    "half-run-json": (
        {"launcher.log": _good_log().encode(), "run.json": b'{"name": "tiny-b'},
        "run.json: unreadable JSON (JSONDecodeError: Unterminated string",
    ),
    "list-run-json": (
        {"launcher.log": _good_log().encode(), "run.json": b"[1, 2]"},
        "run.json: not a JSON object (top level is list)",
    ),
    "no-logs": ({}, "no *.log file"),
}


@pytest.mark.parametrize("case", list(UNREADABLE))
def test_parser_never_raises_on_unreadable_logs(tmp_path, case: str) -> None:
    from analysis.parse.reader import parse_file

    files, _ = UNREADABLE[case]
    for name, data in files.items():
        if name.endswith(".log"):
            (tmp_path / name).write_bytes(data)
            runs = parse_file(tmp_path / name)
            assert isinstance(runs, list)
            if case == "enormous-line":
                assert [it.iteration for it in runs[-1].iterations] == [2, 4, 6, 8, 10]


def test_report_lists_every_run_it_could_not_read_with_the_reason(tmp_path) -> None:
    from analysis.report.build import main as report_main

    logs = tmp_path / "logs"
    for case, (files, _) in UNREADABLE.items():
        run_dir = logs / case / "20261122T030000Z"
        run_dir.mkdir(parents=True)
        record = {"name": case, "outcome": {"status": "failed", "kind": "other", "reason": "x"}}
        (run_dir / "run.json").write_text(json.dumps(record))
        for name, data in files.items():
            (run_dir / name).write_bytes(data)
    # Two runs' lines mixed up in one bare log file: read as one run, no crash.
    (logs / "mixed.log").write_text(_good_log(4) + "training ...\n" + _good_log(6))
    out = tmp_path / "report"
    assert report_main([str(logs), "--out", str(out)]) == 0
    text = (out / "report.md").read_text()
    section = text.split("## Runs that could not be read fully", 1)[1].split("\n## ", 1)[0]
    for case, (_, reason) in UNREADABLE.items():
        assert f"`{case}/20261122T030000Z`" in section, case
        line = next(ln for ln in section.splitlines() if f"`{case}/" in ln)
        assert reason in line, line
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary["runs"]) == len(UNREADABLE) + 1
    assert {r["path"] for r in summary["runs"]} >= {"mixed", "no-logs/20261122T030000Z"}


# --------------------------------------------------------------------------- real failing runs
# Two ranks on this machine, failing the way a newcomer's first runs fail: the first fatal
# error is the cause, the other rank's gloo error after it a consequence.

UPSTREAM = check_upstream()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_local(logs: Path, *sets: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """``python -m launchers run`` tiny x zero1 on 2 local ranks; returns run.json."""
    argv = [
        PY,
        "-m",
        "launchers",
        "run",
        "--model",
        "tiny",
        "--strategy",
        "zero1",
        "--device",
        "cpu",
        "--logs",
        str(logs),
        "--stall",
        "600",
        "--set",
        f"master_port={free_port()}",
    ]
    for item in sets:
        argv += ["--set", item]
    res = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=1200,
                         env={**os.environ, **(env or {})})  # fmt: skip
    assert res.returncode == 1, res.stdout[-2000:] + res.stderr[-2000:]
    (run_dir,) = (logs / "tiny-zero1").iterdir()
    return json.loads((run_dir / "run.json").read_text())


@pytest.mark.slow
@pytest.mark.upstream
@pytest.mark.skipif(not UPSTREAM.ok, reason=f"needs upstream: {UPSTREAM.message()}")
def test_real_helpers_build_failure_is_the_cause_not_the_peers_gloo_error(tmp_path) -> None:
    # A checkout without built helpers, and pybind11 hidden from the interpreter: upstream's
    # Makefile fails on rank 0, which exits; rank 1 waits for it in a collective.
    clone = tmp_path / "md"
    subprocess.run(["git", "clone", "--quiet", "--no-checkout", str(UPSTREAM.path), str(clone)],
                   check=True)  # fmt: skip
    subprocess.run(["git", "-C", str(clone), "checkout", "--quiet", UPSTREAM.commit], check=True)
    hide = tmp_path / "hide" / "pybind11"  # `python3 -m pybind11` then fails as without it
    hide.mkdir(parents=True)
    (hide / "__init__.py").write_text("")
    (hide / "__main__.py").write_text("import sys\nsys.exit('No module named pybind11')\n")
    doc = run_local(tmp_path / "logs", f"upstream_dir={clone}",
                    env={"PYTHONPATH": str(hide.parent)})  # fmt: skip
    outcome = doc["outcome"]
    assert (outcome["status"], outcome["kind"]) == ("failed", "exception"), outcome
    assert outcome["reason"].startswith("Making C++ dataset helpers module failed"), outcome
    assert "run `make setup`" in outcome["reason"]


@pytest.mark.slow
@pytest.mark.upstream
@pytest.mark.skipif(not UPSTREAM.ok, reason=f"needs upstream: {UPSTREAM.message()}")
def test_real_memory_error_on_rank0_is_the_cause_not_the_peers_gloo_error(tmp_path) -> None:
    # So many iterations that rank 0 (it alone builds the dataset's index) cannot allocate the
    # index (hundreds of GB); rank 1 waits for it in a collective and loses its peer.
    doc = run_local(tmp_path / "logs", "train_iters=3000000000")
    outcome = doc["outcome"]
    assert (outcome["status"], outcome["kind"]) == ("failed", "oom"), outcome
    assert "Unable to allocate" in outcome["reason"], outcome
