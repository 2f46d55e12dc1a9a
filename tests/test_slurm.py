"""Slurm: the batch script, the lab's launcher choice, the rank environment, and a real Slurm
cluster in the lab (munge, slurmctld, one slurmd per node) when root and slurm-wlm are present.

Tests that need them skip with the reason otherwise; the ones that train upstream also need
``make setup``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from analysis.runs.record import Outcome
from launchers.cli import main as cli_main
from launchers.config.hostfile import load_hostfile, parse_hostfile_text
from launchers.config.presets import resolve_spec
from launchers.config.project import (
    RANK_ENV_SCRIPT,
    launcher_command,
    remote_environment,
    script_index,
    venv_bin,
)
from launchers.config.spec import PLACEHOLDER_PATHS, RunSpec, SpecError
from launchers.config.upstream import check_upstream, tiny_data
from launchers.lab import cluster as labmod
from launchers.lab import net as labnet
from launchers.lab import slurm as lab_slurm
from launchers.lab.cluster import Lab
from launchers.lab.faults import Faults
from launchers.lab.net import LabError, LinkShape, namespace_pids
from launchers.lab.session import LabSession
from launchers.lab.slurm import (
    FINAL_STATES,
    SlurmCluster,
    SlurmJob,
    SlurmLabSession,
    parse_job,
    slurm_conf_text,
    slurm_session,
)
from launchers.lab.tools import check_launcher, lab_launcher
from launchers.run.execute import run as execute_run
from launchers.run.matrix import steady_iter_ms
from launchers.run.rank_env import RankEnvError, rank_environment
from launchers.run.render import render_run_dir
from launchers.run.sbatch import allocation, check_inside_allocation, render_sbatch, slurm_time

ROOT = Path(__file__).resolve().parents[1]
TWO_NODE = load_hostfile(ROOT / "hostfiles" / "2node")


def two_node_spec(model: str = "large", strategy: str = "zero2", **kwargs):
    kwargs.setdefault("device", "cuda")
    return resolve_spec(model, strategy, TWO_NODE, launcher="slurm", paths=PLACEHOLDER_PATHS,
                        **kwargs)  # fmt: skip


# ----------------------------------------------------------------------------- sbatch


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(1, "00:01:00"), (60, "00:01:00"), (61, "00:02:00"), (3600, "01:00:00"),
     (90000, "1-01:00:00"), (float("inf"), "UNLIMITED")],
    ids=["1s", "60s", "61s", "1h", "25h", "inf"],
)  # fmt: skip
def test_slurm_time_rounds_up_to_minutes(seconds: float, text: str) -> None:
    assert slurm_time(seconds) == text


@pytest.mark.parametrize("seconds", [0, -5, float("nan")])
def test_slurm_time_refuses_nonpositive(seconds: float) -> None:
    with pytest.raises(ValueError, match="must be > 0"):
        slurm_time(seconds)


def test_allocation_gpu_and_cpu() -> None:
    gpu = allocation(two_node_spec(), time_limit_s=5400)
    assert gpu.options() == [
        "--job-name=large-zero2",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--gpus-per-node=1",
        "--time=01:30:00",
        "--nodelist=node1,node2",
    ]
    cpu = allocation(two_node_spec("tiny", "baseline", device="cpu"), nodes=["n0", "n1"])
    assert "--gpus-per-node" not in " ".join(cpu.options())
    assert cpu.options()[-2:] == ["--time=01:00:00", "--nodelist=n0,n1"]


def test_allocation_refuses_uneven_slots() -> None:
    hosts = parse_hostfile_text("a slots=3\nb slots=1\n", "uneven")
    spec = resolve_spec("tiny", "baseline", hosts, device="cpu", launcher="slurm",
                        paths=PLACEHOLDER_PATHS)  # fmt: skip
    with pytest.raises(SpecError, match=r"different slots \(3, 1\).*same slots"):
        allocation(spec)


def _directives(text: str) -> list[str]:
    """The #SBATCH lines sbatch reads: those before the first command."""
    out = []
    for line in text.splitlines()[1:]:
        if line.startswith("#SBATCH "):
            out.append(line.removeprefix("#SBATCH "))
        elif line.strip() and not line.startswith("#"):
            break
    return out


def test_sbatch_script(tmp_path: Path) -> None:
    spec = two_node_spec()
    text = render_sbatch(spec, "/runs/large-zero2/T", time_limit_s=600)
    assert _directives(text) == [
        "--job-name=large-zero2", "--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=1",
        "--time=00:10:00", "--nodelist=node1,node2", "--output=/runs/large-zero2/T/slurm-%j.log",
    ]  # fmt: skip
    # The documented place for partition and account: commented out, ready to edit.
    assert "##SBATCH --partition=PARTITION" in text and "##SBATCH --account=ACCOUNT" in text
    assert text.rstrip().endswith("exec bash /runs/large-zero2/T/launch.sh")
    script = tmp_path / "sbatch.sh"
    script.write_text(text)
    subprocess.run(["bash", "-n", str(script)], check=True)
    if shutil.which("shellcheck"):
        result = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout


def test_a_cluster_run_through_slurm_needs_an_allocation_with_the_hosts() -> None:
    spec = two_node_spec()
    with pytest.raises(SpecError, match=r"SLURM_JOB_ID is not set: submit the run's sbatch\.sh.*"
                       r"salloc --nodes=2 --ntasks-per-node=1 --gpus-per-node=1 "
                       r"--time=01:00:00 --nodelist=node1,node2"):  # fmt: skip
        check_inside_allocation(spec, {})
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "node[1-3]"}
    check_inside_allocation(spec, env, expand=lambda _: ["node1", "node2", "node3"])
    with pytest.raises(SpecError, match=r"names node2, not in allocation 42 \(node1, node3\)"):
        check_inside_allocation(spec, env, expand=lambda _: ["node1", "node3"])


def test_slurm_launcher_command_and_environment(tmp_path: Path) -> None:
    spec = two_node_spec("tiny", "pipeline", device="cpu")
    argv = launcher_command(spec, "/r")
    assert argv[argv.index("--launcher") + 1] == "slurm"
    assert "--launcher_args=--label" in argv  # srun prefixes every line with its rank
    assert "--no_ssh_check" in argv  # srun reaches the nodes through slurmd, not ssh
    index = script_index(argv)
    assert argv[index - 1] == RANK_ENV_SCRIPT and argv[index].endswith("/pretrain_gpt.py")
    assert remote_environment(spec, path="/usr/bin") == {
        "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "MASTER_ADDR": "node1",
        "MASTER_PORT": "29500", "PATH": f"{venv_bin(spec)}:/usr/bin"}  # fmt: skip
    run_dir = render_run_dir(spec, tmp_path)
    assert "MASTER_ADDR=node1\n" in (run_dir / "deepspeed_env").read_text()


def test_dry_run_prints_the_sbatch_script(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["matrix", "--model", "large", "--strategies", "core", "--hosts",
            str(ROOT / "hostfiles" / "2node"), "--launcher", "slurm", "--device", "cuda",
            "--dry-run", "--timeout", "7200"]  # fmt: skip
    assert cli_main(args) == 0
    out = capsys.readouterr().out
    assert out.count("# ==> sbatch.sh <==") == 6
    assert out.count("#SBATCH --time=02:00:00") == 6
    assert "#SBATCH --gpus-per-node=1" in out and "#SBATCH --nodelist=node1,node2" in out


def test_dry_run_of_other_launchers_has_no_sbatch_script(capsys: pytest.CaptureFixture) -> None:
    args = ["run", "--model", "large", "--strategy", "zero2", "--hosts",
            str(ROOT / "hostfiles" / "2node"), "--launcher", "pdsh", "--dry-run"]  # fmt: skip
    assert cli_main(args) == 0
    assert "sbatch.sh" not in capsys.readouterr().out


# ----------------------------------------------------------------------------- the lab's choice


def test_lab_runs_the_launcher_asked_for_or_refuses() -> None:
    assert lab_launcher(None) == "pdsh"
    for name in ("pdsh", "no_ssh", "openmpi", "slurm"):
        assert lab_launcher(name) == name
    with pytest.raises(LabError, match=r"'local' cannot run on the lab: it starts every rank on "
                       r"this machine.*slurm: DeepSpeed's slurm runner"):  # fmt: skip
        lab_launcher("local")


def test_missing_slurm_tools_are_named_not_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    real = shutil.which
    monkeypatch.setattr(labmod.shutil, "which", lambda t: None if t in ("salloc", "munged")
                        else real(t))  # fmt: skip
    monkeypatch.setattr(labmod.os, "geteuid", lambda: 0)
    with pytest.raises(
        LabError,
        match=r"needs munged, salloc, missing here: apt-get install -y "
        r"slurm-wlm munge \(the lab does not fall back to another launcher\)",
    ):
        check_launcher("slurm")


def test_cli_refuses_local_in_the_lab_before_anything_starts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    before = labmod.existing_labs() if os.geteuid() == 0 else []
    args = ["run", "--model", "tiny", "--strategy", "zero2", "--net", "100mbit",
            "--launcher", "local", "--set", "train_iters=2"]  # fmt: skip
    assert cli_main(args) == 2
    assert "launcher 'local' cannot run on the lab" in capsys.readouterr().err
    if os.geteuid() == 0:
        assert labmod.existing_labs() == before


def test_lab_dry_run_keeps_the_launcher(capsys: pytest.CaptureFixture[str]) -> None:
    for launcher in ("slurm", "openmpi"):
        args = ["run", "--model", "tiny", "--strategy", "zero2", "--net", "100mbit",
                "--launcher", launcher, "--dry-run"]  # fmt: skip
        assert cli_main(args) == 0
        out = capsys.readouterr().out
        assert f"--launcher {launcher}" in out and "--launcher pdsh" not in out
        # the lab's jobs: its node names, no time limit unless TIMEOUT
        assert ("#SBATCH --nodelist=node0,node1\n" in out) == (launcher == "slurm")
        assert ("#SBATCH --time=UNLIMITED\n" in out) == (launcher == "slurm")


# ----------------------------------------------------------------------------- rank environment


BASE = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1"},
         {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}),
        ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
          "OMPI_COMM_WORLD_LOCAL_RANK": "0", "SLURM_PROCID": "0", "SLURM_NTASKS": "1",
          "SLURM_LOCALID": "0"}, {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}),
        ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "SLURM_PROCID": "1",
          "SLURM_NTASKS": "2", "SLURM_LOCALID": "0"}, {}),
    ],
    ids=["slurm", "mpirun-inside-slurm", "already-set"],
)  # fmt: skip
def test_rank_environment(env: dict[str, str], expected: dict[str, str]) -> None:
    assert rank_environment(BASE | env) == expected


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0"}, "MASTER_ADDR"),
        (BASE, "start this through srun or mpirun"),
        (BASE | {"SLURM_PROCID": "2", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0"},
         "inconsistent"),
        (BASE | {"SLURM_PROCID": "x", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0"},
         "non-negative integers"),
    ],
    ids=["no-master", "no-launcher", "rank-past-size", "not-a-number"],
)  # fmt: skip
def test_rank_environment_refuses(env: dict[str, str], match: str) -> None:
    with pytest.raises(RankEnvError, match=match):
        rank_environment(env)


def test_rank_env_script_execs_the_target_with_the_rank(tmp_path: Path) -> None:
    target = tmp_path / "show.py"
    target.write_text(
        "import json, os, sys\nprint(json.dumps([sys.argv[1:], "
        "{k: os.environ.get(k) for k in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK')}]))\n"
    )
    env = {**os.environ, **BASE, "SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(key, None)
    out = subprocess.run([sys.executable, "-u", RANK_ENV_SCRIPT, str(target), "--a", "b c"],
                         env=env, capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert json.loads(out) == [["--a", "b c"], {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}]
    bad = subprocess.run(
        [sys.executable, RANK_ENV_SCRIPT, str(target)],
        capture_output=True,
        text=True,
        env={k: v for k, v in env.items() if k != "MASTER_ADDR"},
    )
    assert bad.returncode == 2 and "MASTER_ADDR" in bad.stderr


# ----------------------------------------------------------------------------- job states


def test_slurm_conf_names_every_node_by_its_address(tmp_path: Path) -> None:
    nodes = labnet.plan_nodes("ab12", labnet.ipaddress.IPv4Network("10.200.7.0/24"), 3)
    text = slurm_conf_text("mdslab12", nodes, 2, tmp_path, tmp_path / "m.sock")
    assert "SlurmctldHost=node0(10.200.7.1)" in text
    for i in range(3):
        assert f"NodeName=node{i} NodeAddr=10.200.7.{i + 1} CPUs=2 State=UNKNOWN" in text
    assert "PartitionName=lab Nodes=node0,node1,node2 Default=YES" in text
    assert f"AuthInfo=socket={tmp_path / 'm.sock'}" in text
    assert "ProctrackType=proctrack/linuxproc" in text and "TaskPlugin=task/none" in text


def test_parse_job() -> None:
    line = ("JobId=7 JobName=tiny-zero2.T UserId=root(0) JobState=TIMEOUT Reason=TimeLimit "
            "ExitCode=0:15 NodeList=node[0-1] TimeLimit=00:01:00 Command=(null)")  # fmt: skip
    job = parse_job(line)
    assert job["JobId"] == "7" and job["JobState"] == "TIMEOUT" and job["NodeList"] == "node[0-1]"
    assert parse_job("not scontrol output") == {}


def _job(state: str, stopped: bool = False, uid: int | None = 0) -> SlurmJob:
    return SlurmJob(
        7,
        "tiny-zero2.T",
        state,
        "None",
        "0:0",
        ("node0", "node1"),
        "node[0-1]",
        "00:01:00",
        "s",
        "e",
        stopped,
        uid if state == "CANCELLED" else None,
    )


@pytest.mark.parametrize(
    ("state", "status", "kind"),
    [("CANCELLED", "interrupted", "cancelled"), ("TIMEOUT", "failed", "time_limit"),
     ("NODE_FAIL", "failed", "killed"), ("OUT_OF_MEMORY", "failed", "oom"),
     ("PREEMPTED", "interrupted", "cancelled")],
)  # fmt: skip
def test_job_state_decides_the_outcome(tmp_path: Path, state: str, status: str, kind: str) -> None:
    (tmp_path / "run.json").write_text(json.dumps({"outcome": {"status": "running"}}))
    session = SlurmLabSession(lab=None, ssh=False, launcher="slurm")
    session.job = _job(state)
    logged = Outcome(
        "failed", kind="nccl", reason="Connection reset by peer", exit_codes={"launcher": 143}
    )  # salloc ends with its command's code
    settled = session.settle(tmp_path, logged)
    assert (settled.status, settled.kind) == (status, kind)
    assert f"Slurm job 7 {FINAL_STATES[state][2]}" in settled.reason  # type: ignore[index]
    assert "the log says: nccl: Connection reset by peer" in settled.reason
    assert json.loads((tmp_path / "run.json").read_text())["outcome"] == asdict(settled)
    assert f"# run outcome: {status} kind={kind}" in (tmp_path / "launcher.log").read_text()


@pytest.mark.parametrize("state", ["COMPLETED", "FAILED"])
def test_a_job_that_ended_by_itself_keeps_the_logs_outcome(tmp_path: Path, state: str) -> None:
    session = SlurmLabSession(lab=None, ssh=False, launcher="slurm")
    session.job = _job(state)
    logged = Outcome("failed", kind="exception", reason="ValueError: x")
    assert session.settle(tmp_path, logged) is logged


def test_a_job_the_executor_stopped_keeps_the_executors_outcome(tmp_path: Path) -> None:
    session = SlurmLabSession(lab=None, ssh=False, launcher="slurm")
    session.job = _job("CANCELLED", stopped=True)  # still running at the end: the lab cancelled it
    logged = Outcome("failed", kind="hang", reason="no output for 300 s")
    assert session.settle(tmp_path, logged) is logged
    # salloc stopped by the executor (SIGTERM) gives its allocation up: CANCELLED, but nobody
    # asked slurmctld to kill the job
    session.job = _job("CANCELLED", uid=None)
    stopped = Outcome("failed", kind="hang", reason="no output", exit_codes={"launcher": 143})
    assert session.settle(tmp_path, stopped) is stopped


# ----------------------------------------------------------------------------- a real cluster


def _slurm_skip_reason() -> str | None:
    try:
        check_launcher("slurm")
    except LabError as err:
        return str(err)
    return None


SKIP_SLURM = _slurm_skip_reason()
needs_slurm = pytest.mark.skipif(SKIP_SLURM is not None, reason=f"no Slurm lab: {SKIP_SLURM}")


@pytest.fixture(scope="module")
def slurm_lab() -> SlurmLabSession:
    if SKIP_SLURM is not None:
        pytest.skip(SKIP_SLURM)
    with (
        Lab(nodes=2, shape=LinkShape.parse("100mbit"), ssh=False) as lab,
        slurm_session(lab) as session,
    ):
        yield session


def _cluster(session: SlurmLabSession) -> SlurmCluster:
    assert session.slurm is not None
    return session.slurm


def _leftovers(session: SlurmLabSession) -> dict[int, str]:
    """Processes in the nodes other than the cluster's daemons."""
    keep = session.keep_pids()
    return {
        pid: Path(f"/proc/{pid}/comm").read_text().strip()
        for node in session.lab.nodes
        for pid in namespace_pids(node.namespace)
        if pid not in keep and Path(f"/proc/{pid}").exists()
    }


@pytest.mark.root
@needs_slurm
def test_each_slurmd_is_its_node(slurm_lab: SlurmLabSession) -> None:
    cluster = _cluster(slurm_lab)
    assert cluster.node_states() == {"node0": "idle", "node1": "idle"}
    # every process in the nodes is a daemon of the cluster (slurmctld's slurmscriptd too)
    assert _leftovers(slurm_lab) == {}
    out = cluster.command(
        [
            "srun",
            "-N2",
            "-n2",
            "--label",
            "sh",
            "-c",
            "echo $(hostname) $(ip -o -4 addr show eth0 | awk '{print $4}')",
        ]
    )
    assert out.returncode == 0, out.stderr
    lines = sorted(out.stdout.split("\n")[:2])
    nodes = slurm_lab.lab.nodes
    assert lines == [f"{i}: node{i} {nodes[i].address}/24" for i in range(2)]


GLOO = """
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(t)
print(os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"], t.item())
dist.barrier()  # leave together (a rank exiting under its peer's open gloo pair can abort it)
dist.destroy_process_group()
"""


@pytest.mark.root
@needs_slurm
def test_srun_ranks_join_one_rendezvous_through_rank_env(
    slurm_lab: SlurmLabSession, tmp_path: Path
) -> None:
    script = tmp_path / "gloo.py"
    script.write_text(GLOO)
    lab = slurm_lab.lab
    exports = f"ALL,MASTER_ADDR={lab.master_addr},MASTER_PORT=29555,GLOO_SOCKET_IFNAME=eth0"
    argv = [
        "salloc",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--nodelist=node0,node1",
        "srun",
        "--label",
        f"--export={exports}",
        sys.executable,
        "-u",
        RANK_ENV_SCRIPT,
        str(script),
    ]
    out = _cluster(slurm_lab).command(argv, timeout=300)
    assert out.returncode == 0, out.stderr
    assert sorted(line for line in out.stdout.splitlines() if line[:1].isdigit()) == [
        "0: 0 2 0 3.0",
        "1: 1 2 0 3.0",
    ]


def _stand_in_run(session: SlurmLabSession, logs: Path, command: str) -> tuple[RunSpec, Path]:
    """A run directory of this lab whose launch.sh runs ``command`` instead of training."""
    cluster = session.cluster()
    spec = session.adapt(resolve_spec("tiny", "zero2", cluster, device="cpu",
                                      paths=PLACEHOLDER_PATHS))  # fmt: skip
    run_dir = render_run_dir(spec, logs)
    (run_dir / "launch.sh").write_text(f"#!/usr/bin/env bash\nset -euo pipefail\n{command}\n")
    return spec, run_dir


def _run(
    session: SlurmLabSession, spec: RunSpec, run_dir: Path, meanwhile=None, stall_s: float = 300
) -> Outcome:
    """Execute a run directory on the lab (the executor needs the main thread) while
    ``meanwhile()`` runs in another thread; return the settled outcome."""
    helper = threading.Thread(target=meanwhile) if meanwhile else None
    if helper:
        helper.start()
    try:
        hooks = session.hooks(spec, run_dir)
        outcome = execute_run(run_dir, show_progress=False, stall_s=stall_s, **hooks)
        return session.settle(run_dir, outcome)
    finally:
        if helper:
            helper.join(timeout=120)


def _wait_running(cluster: SlurmCluster, timeout: float = 120) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = cluster.command(["squeue", "-h", "-t", "R", "-o", "%i"]).stdout.split()
        if out:
            return int(out[0])
        time.sleep(0.5)
    raise AssertionError("no job started running")


@pytest.mark.root
@needs_slurm
def test_scancel_mid_run_is_cancelled_and_leaves_nothing(
    slurm_lab: SlurmLabSession, tmp_path: Path
) -> None:
    cluster = _cluster(slurm_lab)
    spec, run_dir = _stand_in_run(slurm_lab, tmp_path, "exec srun --label sleep 600")
    cancelled: list[int] = []

    def cancel() -> None:
        cancelled.append(_wait_running(cluster))
        time.sleep(2)  # the step's tasks are up
        cluster.command(["scancel", str(cancelled[0])])

    outcome = _run(slurm_lab, spec, run_dir, cancel)
    (job_id,) = cancelled
    assert (outcome.status, outcome.kind) == ("interrupted", "cancelled")
    assert f"Slurm job {job_id} was cancelled (scancel by uid 0)" in outcome.reason
    doc = json.loads((run_dir / "run.json").read_text())
    assert doc["outcome"]["kind"] == "cancelled"
    assert doc["slurm"]["job_id"] == job_id and doc["slurm"]["state"] == "CANCELLED"
    assert doc["slurm"]["nodes"] == ["node0", "node1"]
    assert doc["network"]["transport"] == "slurm"
    assert doc["slurm"]["queue_after"] == [] and doc["slurm"]["processes_after"] == []
    assert "stopped_leftovers" not in doc["network"]  # the job left nothing to sweep
    assert cluster.queue() == [] and _leftovers(slurm_lab) == {}
    assert (run_dir / "sbatch.sh").exists() and (run_dir / "slurm" / "slurmctld.log").exists()


@pytest.mark.root
@needs_slurm
def test_the_sbatch_script_runs_as_a_batch_job(slurm_lab: SlurmLabSession, tmp_path: Path) -> None:
    spec, run_dir = _stand_in_run(slurm_lab, tmp_path, "exec srun --label hostname")
    names = [node.name for node in slurm_lab.lab.nodes]
    script = run_dir / "sbatch.sh"
    script.write_text(render_sbatch(spec, str(run_dir), time_limit_s=120, nodes=names))
    out = _cluster(slurm_lab).command(["sbatch", "--parsable", "--wait", str(script)], 180)
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.strip().split(";")[0]
    log = (run_dir / f"slurm-{job_id}.log").read_text()
    assert sorted(log.split()) == ["0:", "1:", "node0", "node1"]


@pytest.mark.root
@pytest.mark.slow
@needs_slurm
def test_time_limit_is_time_limit(slurm_lab: SlurmLabSession, tmp_path: Path) -> None:
    cluster = _cluster(slurm_lab)
    slurm_lab.time_limit_s = 60  # Slurm's smallest: one minute
    try:
        spec, run_dir = _stand_in_run(slurm_lab, tmp_path, "exec srun --label sleep 600")
        outcome = _run(slurm_lab, spec, run_dir)
    finally:
        slurm_lab.time_limit_s = None
    assert (outcome.status, outcome.kind) == ("failed", "time_limit"), outcome
    assert "JobState=TIMEOUT" in outcome.reason
    assert "#SBATCH --time=00:01:00" in (run_dir / "sbatch.sh").read_text()
    assert cluster.queue() == [] and _leftovers(slurm_lab) == {}


HOLDER = """
import time
from launchers.lab.cluster import Lab
from launchers.lab.slurm import slurm_session
with Lab(nodes=2, ssh=False) as lab, slurm_session(lab) as session:
    print("READY", lab.id, session.slurm.conf_path, flush=True)
    time.sleep(120)
"""


def _daemons_of(conf: str) -> list[str]:
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return [line for line in ps.splitlines() if conf in line and "ps -eo" not in line]


@pytest.mark.root
@needs_slurm
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_teardown_on_signal_stops_every_daemon(sig: signal.Signals) -> None:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True)  # fmt: skip
    assert proc.stdout is not None
    line = ""
    while not line.startswith("READY"):
        line = proc.stdout.readline()
        assert line, "the holder ended before its lab was up"
    lab_id, conf = line.split()[1:]
    assert len(_daemons_of(conf)) == 3  # slurmctld and two slurmds (munged has no conf)
    proc.send_signal(sig)
    assert proc.wait(timeout=60) == -sig
    assert _daemons_of(conf) == [] and _daemons_of(f"/tmp/mdsl{lab_id}/") == []
    assert not labnet.state_dir_of(lab_id).exists()
    assert [n for n in labnet.list_namespaces() if labnet.lab_id_of(n) == lab_id] == []


# ----------------------------------------------------------------------------- real training

STARTUP_S = 1800
"""Seconds a training run may take to print its first iterations: on a loaded shared machine
DeepSpeed's CPU communication op, rebuilt at start-up, alone took minutes."""

UPSTREAM = check_upstream()
needs_upstream = pytest.mark.skipif(
    not (UPSTREAM.ok and tiny_data().exists()),
    reason=f"needs upstream and the tiny dataset (make setup): {UPSTREAM.message()}",
)


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.upstream
@needs_upstream
@pytest.mark.parametrize("launcher", ["slurm", "openmpi"])
def test_lab_run_through_the_launcher_asked_for_completes(tmp_path: Path, launcher: str) -> None:
    try:
        check_launcher(launcher)
    except LabError as err:
        pytest.skip(str(err))
    args = ["run", "--model", "tiny", "--strategy", "zero2", "--net", "100mbit",
            "--launcher", launcher, "--no-netbench", "--logs", str(tmp_path),
            "--set", "train_iters=10", "--stall", str(STARTUP_S)]  # fmt: skip
    assert cli_main(args) == 0
    (run_dir,) = (tmp_path / "tiny-zero2").iterdir()
    doc = json.loads((run_dir / "run.json").read_text())
    assert doc["outcome"]["status"] == "completed" and doc["outcome"]["last_iteration"] == 10
    assert doc["spec"]["launcher"] == launcher and doc["network"]["transport"] == launcher
    log = (run_dir / "launcher.log").read_text()
    assert "using world size: 2" in log  # the ranks found each other (rank_env.py)
    assert steady_iter_ms(run_dir) is not None
    if launcher == "openmpi":
        assert "mpirun -n 2" in log and "[1,1]<stdout>:" in log
        return
    slurm = doc["slurm"]
    assert isinstance(slurm["job_id"], int) and slurm["state"] == "COMPLETED"
    assert slurm["nodes"] == ["node0", "node1"] and "idle" in slurm["sinfo_before"]
    assert f"salloc: Granted job allocation {slurm['job_id']}" in log and "\n1: " in log


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.upstream
@needs_slurm
@needs_upstream
def test_scancel_mid_training_is_cancelled_and_leaves_nothing(
    slurm_lab: SlurmLabSession, tmp_path: Path
) -> None:
    cluster = _cluster(slurm_lab)
    spec = slurm_lab.adapt(resolve_spec("tiny", "zero2", slurm_lab.cluster(), device="cpu",
                                        overrides={"train_iters": 200}))  # fmt: skip
    run_dir = render_run_dir(spec, tmp_path)
    cancelled: list[int] = []

    def cancel_after_the_first_iterations() -> None:
        log = run_dir / "launcher.log"
        deadline = time.monotonic() + STARTUP_S
        while time.monotonic() < deadline:
            if log.exists() and re.search(r"iteration\s+5/", log.read_text(errors="replace")):
                cancelled.append(_wait_running(cluster))
                cluster.command(["scancel", str(cancelled[0])])
                return
            time.sleep(1)

    outcome = _run(slurm_lab, spec, run_dir, cancel_after_the_first_iterations, STARTUP_S)
    assert cancelled, f"training never reached iteration 5: {outcome}"
    assert (outcome.status, outcome.kind) == ("interrupted", "cancelled"), outcome
    assert 5 <= (outcome.last_iteration or 0) < 200
    doc = json.loads((run_dir / "run.json").read_text())
    assert doc["slurm"]["job_id"] == cancelled[0] and doc["slurm"]["state"] == "CANCELLED"
    assert doc["slurm"]["queue_after"] == [] and doc["slurm"]["processes_after"] == []
    assert "stopped_leftovers" not in doc["network"]  # the job left nothing to sweep
    assert cluster.queue() == [] and _leftovers(slurm_lab) == {}


class _FakeLab:
    """What LabSession.adapt reads of a lab."""

    master_addr = "10.200.9.1"
    nodes = (None, None)

    class shape:
        label = "100mbit"

    faults = Faults()


@pytest.mark.parametrize("launcher", ["pdsh", "no_ssh", "openmpi", "slurm"])
def test_a_lab_session_runs_every_spec_with_its_launcher(launcher: str) -> None:
    hosts = parse_hostfile_text("10.200.9.1 slots=1\n10.200.9.2 slots=1\n", "lab")
    spec = resolve_spec("tiny", "zero2", hosts, device="cpu", paths=PLACEHOLDER_PATHS)
    assert spec.launcher == "pdsh"  # what a multi-host hostfile gets by default
    session = LabSession(lab=_FakeLab(), ssh=launcher in ("pdsh", "openmpi"), launcher=launcher)
    adapted = session.adapt(spec)
    assert adapted.launcher == launcher and adapted.network == "emulated 2 nodes x 100mbit"
    assert adapted.ssh_check == (launcher == "no_ssh")


@pytest.mark.root
@pytest.mark.slow
@needs_slurm
def test_a_lost_node_is_killed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lab_slurm, "SLURMD_TIMEOUT_S", 20)  # Slurm's default waits 300 s
    with Lab(nodes=2, ssh=False) as lab, slurm_session(lab) as session:
        cluster = _cluster(session)
        # a launcher that keeps srun as its child, as DeepSpeed's runner does
        spawn = "exec python3 -c \"import subprocess; subprocess.run(['srun', 'sleep', '600'])\""
        spec, run_dir = _stand_in_run(session, tmp_path, spawn)

        def lose_node1() -> None:
            _wait_running(cluster)
            time.sleep(3)
            for pid in namespace_pids(lab.nodes[1].namespace):  # its slurmd and tasks included
                os.kill(pid, signal.SIGKILL)

        outcome = _run(session, spec, run_dir, lose_node1)
        assert (outcome.status, outcome.kind) == ("failed", "killed"), outcome
        assert "JobState=NODE_FAIL" in outcome.reason
        assert cluster.node_states()["node1"].startswith("down")
        assert cluster.queue() == [] and _leftovers(session) == {}
        assert subprocess.run(["pgrep", "-f", "srun sleep 600"]).returncode == 1  # none left
