"""Generated run directories: golden launch.sh/ds_config.json, run.json, shell safety, CLI.

Regenerate the golden files with ``UPDATE_GOLDEN=1 pytest tests/test_generate.py``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from analysis.runs.record import Outcome, Upstream, from_json
from launchers.cli import main as cli_main
from launchers.config.hostfile import load_hostfile, parse_hostfile_text
from launchers.config.presets import CORE_STRATEGIES, load_strategies, resolve_spec
from launchers.config.project import ds_config, launcher_command, megatron_args, script_index
from launchers.config.spec import PLACEHOLDER_PATHS, RunPaths, RunSpec, SpecError, spec_hash
from launchers.run.render import load_run_spec, read_run_record, render_run_dir

REPO = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden" / "launch"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"
NOW = datetime(2026, 11, 22, 2, 15, 0, tzinfo=timezone.utc)
PLACEHOLDER_ROOT = "/RUNS"
PATHS = PLACEHOLDER_PATHS
LOCALHOST = parse_hostfile_text("# 2 ranks here\nlocalhost slots=2\n", "hostfiles/localhost")
TWO_NODE = load_hostfile(REPO / "hostfiles" / "2node")
TINY_STRATEGIES = [
    s.name for s in load_strategies().values() if s.tp * s.pp <= LOCALHOST.world_size
]


def make_spec(model: str, strategy: str, **kwargs: Any) -> RunSpec:
    if model == "tiny":
        kwargs.setdefault("device", "cpu")
        return resolve_spec(model, strategy, LOCALHOST, paths=PATHS, **kwargs)
    kwargs.setdefault("device", "cuda")
    kwargs.setdefault("launcher", "pdsh")
    return resolve_spec(model, strategy, TWO_NODE, paths=PATHS, **kwargs)


CASES = [("tiny", s) for s in TINY_STRATEGIES] + [
    (m, s) for m in ("small", "large") for s in CORE_STRATEGIES
]
IDS = [f"{m}-{s}" for m, s in CASES]


def placeholder(text: str, root: Path) -> str:
    return text.replace(str(root), PLACEHOLDER_ROOT)


@pytest.mark.parametrize(("model", "strategy"), CASES, ids=IDS)
def test_golden_files(tmp_path: Path, model: str, strategy: str) -> None:
    run_dir = render_run_dir(make_spec(model, strategy), tmp_path, now=NOW)
    assert run_dir == tmp_path / f"{model}-{strategy}" / "20261122T021500Z"
    for name in ("launch.sh", "ds_config.json"):
        actual = placeholder((run_dir / name).read_text(), tmp_path)
        golden = GOLDEN / f"{model}-{strategy}" / name
        if UPDATE:
            golden.parent.mkdir(parents=True, exist_ok=True)
            golden.write_text(actual)
        assert golden.is_file(), f"{golden} missing: run with UPDATE_GOLDEN=1"
        assert actual == golden.read_text(), f"{golden} differs (UPDATE_GOLDEN=1 to accept)"


@pytest.mark.parametrize(("model", "strategy"), CASES, ids=IDS)
def test_launch_script_is_valid_bash(tmp_path: Path, model: str, strategy: str) -> None:
    script = render_run_dir(make_spec(model, strategy), tmp_path, now=NOW) / "launch.sh"
    assert os.access(script, os.X_OK)
    subprocess.run(["bash", "-n", str(script)], check=True)
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck not installed (apt-get install -y shellcheck)")
    result = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


@pytest.mark.parametrize("launcher", ["no_ssh", "pdsh", "openmpi", "slurm"])
def test_launch_script_is_valid_bash_for_every_launcher(tmp_path: Path, launcher: str) -> None:
    spec = resolve_spec("tiny", "pipeline", TWO_NODE, device="cpu", launcher=launcher, paths=PATHS)
    script = render_run_dir(spec, tmp_path, now=NOW) / "launch.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    if shutil.which("shellcheck"):
        result = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout


def test_ds_config_projection() -> None:
    pp = ds_config(make_spec("tiny", "pipeline"))
    assert pp["wall_clock_breakdown"] is False  # PipelineEngine: bwd_microstep timer assertion
    assert ds_config(make_spec("tiny", "baseline"))["wall_clock_breakdown"] is True
    z3 = ds_config(make_spec("tiny", "zero3-offload"))["zero_optimization"]
    assert z3 == {
        "stage": 3,
        "offload_optimizer": {"device": "cpu", "pin_memory": False},
        "offload_param": {"device": "cpu", "pin_memory": False},
    }
    fp16 = ds_config(make_spec("small", "zero2"))
    assert fp16["fp16"]["enabled"] and fp16["fp16"]["loss_scale"] == 0  # dynamic
    assert fp16["train_batch_size"] == 8
    assert fp16["train_micro_batch_size_per_gpu"] * fp16["gradient_accumulation_steps"] * 2 == 8
    assert ds_config(make_spec("small", "zero2", overrides={"precision": "bf16"}))["bf16"] == {
        "enabled": True
    }


def test_megatron_args_cpu_and_gpu() -> None:
    cpu_pp = megatron_args(make_spec("tiny", "pipeline"), "/r")
    assert "--no-pipeline-parallel" not in cpu_pp
    assert cpu_pp[cpu_pp.index("--normalization") + 1] == "rmsnorm"
    assert "--no-gradient-accumulation-fusion" in cpu_pp
    gpu = megatron_args(make_spec("small", "baseline"), "/r")
    for flag in ("--fp16", "--checkpoint-activations", "--no-pipeline-parallel"):
        assert flag in gpu
    assert "--no-gradient-accumulation-fusion" not in gpu and "--normalization" not in gpu
    assert gpu[gpu.index("--deepspeed_config") + 1] == "/r/ds_config.json"
    assert gpu[gpu.index("--zero-stage") + 1] == "0"


def test_every_run_writes_tensorboard(tmp_path: Path) -> None:
    """Upstream's --tensorboard-dir in the run directory, with the timers, batch size and world
    size; memory only on CUDA (upstream reads torch.cuda.memory_stats(), empty on CPU)."""
    for model, strategy, memory in (("tiny", "zero2", False), ("small", "pipeline", True)):
        spec = make_spec(model, strategy)
        run_dir = render_run_dir(spec, tmp_path, now=NOW)
        record = read_run_record(run_dir)
        argv = record.command[script_index(record.command) + 1 :]
        assert argv[argv.index("--tensorboard-dir") + 1] == f"{run_dir}/tensorboard"
        for flag in (
            "--log-timers-to-tensorboard",
            "--log-batch-size-to-tensorboard",
            "--log-world-size-to-tensorboard",
        ):
            assert flag in argv
            assert flag in (run_dir / "launch.sh").read_text()
        assert ("--log-memory-to-tensorboard" in argv) is memory


def test_recompute_on_cpu_uses_megatrons_checkpointing_and_refuses_the_pipeline() -> None:
    # DeepSpeed's CheckpointFunction needs an accelerator Stream, which the CPU accelerator has
    # not: on CPU the recompute is Megatron's own (uniform, one layer a unit); on GPU DeepSpeed's.
    ckpt = {"activation_checkpointing": True}
    gpu = megatron_args(make_spec("small", "tensor"), "/r")
    assert "--deepspeed-activation-checkpointing" in gpu and "--recompute-method" not in gpu
    cpu = megatron_args(make_spec("tiny", "tensor", overrides=ckpt), "/r")
    assert "--checkpoint-activations" in cpu and "--deepspeed-activation-checkpointing" not in cpu
    assert cpu[cpu.index("--recompute-granularity") + 1] == "full"
    assert cpu[cpu.index("--recompute-method") + 1] == "uniform"
    plain = megatron_args(make_spec("tiny", "tensor"), "/r")
    assert not {"--checkpoint-activations", "--recompute-method"} & set(plain)
    with pytest.raises(SpecError, match=r"activation_checkpointing with pp\(2\) > 1 on device cpu"):
        make_spec("tiny", "pipeline", overrides=ckpt)


def test_run_json_records_the_resolved_spec(tmp_path: Path) -> None:
    spec = make_spec("tiny", "zero2")
    run_dir = render_run_dir(spec, tmp_path, now=NOW)
    record = read_run_record(run_dir)
    assert record.name == "tiny-zero2"
    assert record.outcome == Outcome(status="generated")
    assert record.spec_hash == spec_hash(spec)
    assert record.command == launcher_command(spec, str(run_dir))
    s = record.spec
    assert s is not None
    assert s["model"]["num_parameters"] == 875_264
    # The strategy as strategies.yaml states it, plus dp = world(2) / (tp * pp).
    assert s["strategy"] == {
        "name": "zero2", "tp": 1, "pp": 1, "dp": 2, "zero_stage": 2, "offload": "none",
        "description": "ZeRO-2, optimizer state and gradients partitioned",
    }  # fmt: skip
    assert s["cluster"] == {
        "hostfile": "hostfiles/localhost",
        "hosts": ["localhost"],
        "slots": [2],
        "world_size": 2,
    }
    prov = record.provenance
    assert prov is not None
    assert prov.upstream == Upstream(commit=None, patch=None)  # placeholder path: no checkout
    assert prov.hostfile_text == LOCALHOST.text
    assert prov.created == "2026-11-22T02:15:00+00:00"
    doc = json.loads((run_dir / "run.json").read_text())
    assert doc["schema_version"] == 2 and from_json(doc, "run.json") == record
    assert doc["outcome"]["status"] == "generated"
    assert (run_dir / "hostfile").read_text() == LOCALHOST.text
    assert load_run_spec(run_dir) == spec
    assert not [p for p in run_dir.iterdir() if p.name.startswith(".")]  # no temp files left


def test_run_directories_are_never_reused(tmp_path: Path) -> None:
    spec = make_spec("tiny", "baseline")
    first = render_run_dir(spec, tmp_path, now=NOW)
    second = render_run_dir(spec, tmp_path, now=NOW)
    assert second == first.with_name("20261122T021500Z-2")
    assert (first / "run.json").is_file() and (second / "run.json").is_file()


def fake_tree(tmp_path: Path) -> RunPaths:
    """Upstream and a deepspeed that prints its argv, under paths that need quoting."""
    root = tmp_path / "it's a dir $(x)"
    upstream = root / "upstream"
    upstream.mkdir(parents=True)
    (upstream / "pretrain_gpt.py").write_text("")
    deepspeed = root / "deepspeed"
    deepspeed.write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        "print(json.dumps({'argv': sys.argv[1:], 'cwd': os.getcwd(),"
        " 'env': {k: os.environ.get(k) for k in ('DS_ACCELERATOR', 'OMP_NUM_THREADS')},"
        " 'path0': os.environ['PATH'].split(':')[0]}))\n"
    )
    deepspeed.chmod(0o755)
    data = root / "data"
    return RunPaths(str(upstream), str(data / "d"), str(data / "v.json"), str(data / "m.txt"),
                    "/venv/bin/python", str(deepspeed))  # fmt: skip


@pytest.mark.parametrize("launcher", ["local", "no_ssh"])
def test_launch_script_passes_the_exact_argv(tmp_path: Path, launcher: str) -> None:
    paths = fake_tree(tmp_path)
    hosts = LOCALHOST if launcher == "local" else TWO_NODE
    spec = resolve_spec("tiny", "zero1", hosts, device="cpu", launcher=launcher, paths=paths)
    run_dir = render_run_dir(spec, tmp_path / "logs dir", now=NOW)
    argv = ["bash", str(run_dir / "launch.sh")] + (["1"] if launcher == "no_ssh" else [])
    result = subprocess.run(argv, capture_output=True, text=True, check=True)
    seen = json.loads(result.stdout)
    expected = launcher_command(spec, str(run_dir), node_rank=1)
    assert seen["argv"] == expected[1:]
    assert seen["cwd"] == paths.upstream_dir
    assert seen["env"] == {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    assert seen["path0"] == "/venv/bin", "the venv's bin must come first on PATH"
    assert expected[script_index(expected)].endswith("/pretrain_gpt.py")


@pytest.mark.parametrize("rank", [None, "2", "x", "-1"], ids=["missing", "2", "x", "-1"])
def test_no_ssh_script_refuses_without_a_valid_node_rank(tmp_path: Path, rank: str | None) -> None:
    spec = resolve_spec("tiny", "baseline", TWO_NODE, device="cpu", launcher="no_ssh", paths=PATHS)
    script = render_run_dir(spec, tmp_path, now=NOW) / "launch.sh"
    env = {k: v for k, v in os.environ.items() if k != "NODE_RANK"}
    result = subprocess.run(
        ["bash", str(script), *([rank] if rank else [])], capture_output=True, text=True, env=env
    )
    assert result.returncode == 2
    assert "give this node's rank (0..1)" in result.stderr


# ---------------------------------------------------------------------------------------------
# CLI


def test_cli_dry_run_prints_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    logs = tmp_path / "logs"
    status = cli_main(["generate", "--model", "tiny", "--strategy", "baseline", "--hosts",
                       str(REPO / "hostfiles" / "2node"), "--launcher", "no_ssh", "--device",
                       "cpu", "--logs", str(logs), "--dry-run"])  # fmt: skip
    out = capsys.readouterr().out
    assert status == 0
    assert not logs.exists()
    assert "# ==> launch.sh <==" in out and '"train_batch_size": 8' in out
    assert "# on node1: bash " in out and "launch.sh 0" in out and "launch.sh 1" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--strategy", "hybrid"], "tp(2) * pp(2) * dp(0) != world_size(2)"),
        (["--strategy", "zero2", "--set", "train_iters=x"], "train_iters must be an integer"),
        (["--strategy", "zero9"], "unknown strategy 'zero9'; valid: baseline"),
        (["--strategy", "zero2", "--hosts", "/nonexistent"], "/nonexistent: hostfile not found"),
        (["--strategy", "zero2", "--set", "upstream_dir=/nonexistent"], "run `make setup`"),
    ],
    ids=["spec", "override", "preset", "hostfile", "upstream"],
)
def test_cli_errors_exit_2_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture, argv: list[str], message: str
) -> None:
    logs = tmp_path / "logs"
    base = ["generate", "--model", "tiny", "--device", "cpu", "--logs", str(logs)]
    assert cli_main(base + argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err
    assert not logs.exists()


def test_cli_generate_writes_a_run_directory(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    paths = fake_tree(tmp_path)
    for name in ("d.bin", "d.idx", "v.json", "m.txt"):
        Path(paths.vocab_file).parent.mkdir(exist_ok=True)
        (Path(paths.vocab_file).parent / name).write_text("")
    sets = [f"{k}={getattr(paths, k)}" for k in ("upstream_dir", "data_path", "vocab_file",
                                                  "merge_file", "deepspeed")]  # fmt: skip
    argv = ["generate", "--model", "tiny", "--strategy", "zero2", "--device", "cpu",
            "--logs", str(tmp_path / "logs")]  # fmt: skip
    for item in sets:
        argv += ["--set", item]
    assert cli_main(argv) == 0
    run_dir = Path(capsys.readouterr().out.strip())
    assert run_dir.parent == tmp_path / "logs" / "tiny-zero2"
    assert sorted(p.name for p in run_dir.iterdir()) == [
        "ds_config.json",
        "hostfile",
        "launch.sh",
        "run.json",
    ]


def test_launcher_flags_per_mode() -> None:
    local = launcher_command(make_spec("tiny", "baseline"), "/r")
    assert local[:5] == ["/venv/bin/deepspeed", "--num_gpus", "2", "--master_port", "29500"]
    assert "--hostfile" not in local  # the runner would ssh-check localhost
    pdsh = launcher_command(make_spec("small", "zero1"), "/r")
    assert pdsh[:8] == ["/venv/bin/deepspeed", "--hostfile", "/r/hostfile", "--launcher", "pdsh",
                        "--master_addr", "node1", "--master_port"]  # fmt: skip
    spec = resolve_spec("tiny", "zero1", TWO_NODE, device="cpu", launcher="no_ssh", paths=PATHS)
    no_ssh = launcher_command(spec, "/r", node_rank=1)
    assert no_ssh[1:7] == ["--hostfile", "/r/hostfile", "--no_ssh", "--node_rank", "1",
                           "--master_addr"]  # fmt: skip


def test_cpu_multi_node_runners_forward_the_cpu_settings(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    spec = resolve_spec("tiny", "zero1", TWO_NODE, device="cpu", launcher="pdsh", paths=PATHS)
    run_dir = render_run_dir(spec, tmp_path, now=NOW)
    # pdsh exports only a few variable families to remote ranks; DS_ENV_FILE lists the rest,
    # with the venv's bin first on PATH (upstream compiles with the python3 found there).
    assert (run_dir / "deepspeed_env").read_text() == (
        "DS_ACCELERATOR=cpu\nOMP_NUM_THREADS=1\nPATH=/venv/bin:/usr/bin:/bin\n"
    )
    assert f"export DS_ENV_FILE={run_dir}/deepspeed_env" in (run_dir / "launch.sh").read_text()


# ---------------------------------------------------------------------------------------------
# Values through DeepSpeed's own multi-node runners (their real get_cmd), to the remote shell

HOSTILE = 'd %n $(touch {marker}) `touch {marker}` it\'s \\ "q" $HOME; x'
"""A data path no remote shell may expand, split or substitute."""

FAKE_LAUNCH = (
    "import json, os, sys\n"
    "print(json.dumps({'argv': sys.argv[1:], 'cwd': os.getcwd(),"
    " 'env': {k: os.environ.get(k) for k in ('DS_ACCELERATOR', 'OMP_NUM_THREADS', 'PATH')}}))\n"
)


def hostile_spec(tmp_path: Path, launcher: str) -> tuple[RunSpec, Path]:
    marker = tmp_path / "marker"
    data = tmp_path / HOSTILE.format(marker=marker)
    paths = RunPaths(str(tmp_path / "upstream"), str(data / "d"), str(data / "vocab %h.json"),
                     str(data / "m$1.txt"), "/venv/bin/python", "/venv/bin/deepspeed")  # fmt: skip
    spec = resolve_spec("tiny", "zero1", TWO_NODE, device="cpu", launcher=launcher, paths=paths)
    return spec, marker


def ds_runner_cmd(spec: RunSpec, run_dir: Path) -> tuple[list[str], Any]:
    """The command DeepSpeed's real runner builds for this run, with the env file read the way
    ``deepspeed/launcher/runner.py`` ``main`` reads it."""
    from deepspeed.launcher import runner as ds_runner
    from deepspeed.launcher.multinode_runner import OpenMPIRunner, PDSHRunner, SlurmRunner

    argv = launcher_command(spec, str(run_dir))
    args = ds_runner.parse_args(argv[1:])
    pool = {h.name: h.slots for h in spec.cluster.hosts}
    runner = (PDSHRunner(args, "d29ybGQ=") if spec.launcher == "pdsh" else
              {"openmpi": OpenMPIRunner, "slurm": SlurmRunner}[spec.launcher](
                  args, "d29ybGQ=", pool))  # fmt: skip
    with open(run_dir / "deepspeed_env") as fd:
        for var in fd.readlines():
            key, val = var.split("=", maxsplit=1)
            runner.add_export(key, val)
    return runner.get_cmd({}, {h: list(range(n)) for h, n in pool.items()}), runner


def test_pdsh_remote_shell_sees_every_value_literally(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", "/opt/it's $HOME/bin %u:/usr/bin:/bin")
    spec, marker = hostile_spec(tmp_path, "pdsh")
    run_dir = render_run_dir(spec, tmp_path / "logs", now=NOW)
    (cmd, _kill, _env), runner = ds_runner_cmd(spec, run_dir)
    fake = tmp_path / "fake" / "deepspeed" / "launcher"
    fake.mkdir(parents=True)
    for init in (fake / "__init__.py", fake.parent / "__init__.py"):
        init.write_text("")
    (fake / "launch.py").write_text(FAKE_LAUNCH)
    runner.add_export("PYTHONPATH", str(tmp_path / "fake"))  # shadows the real launcher module
    cmd, _kill, _env = runner.get_cmd({}, {h.name: [0] for h in spec.cluster.hosts})
    # pdsh joins its arguments into one line, substitutes %n/%h/%u/%%, ssh hands it to a shell.
    line = " ".join(cmd[cmd.index("-w") + 2 :])
    subst = {"n": "1", "h": "node2", "u": "root", "%": "%"}
    line = re.sub(r"%([nhu%])", lambda m: subst[m.group(1)], line)
    result = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    plain = launcher_command(spec, str(run_dir), plain=True)
    assert (
        seen["argv"][seen["argv"].index(plain[script_index(plain)]) + 1 :]
        == plain[script_index(plain) + 1 :]
    )
    assert seen["env"] == {
        "DS_ACCELERATOR": "cpu",
        "OMP_NUM_THREADS": "1",
        "PATH": "/venv/bin:/opt/it's $HOME/bin %u:/usr/bin:/bin",
    }
    assert not marker.exists(), "a value was executed by the remote shell"


@pytest.mark.parametrize("launcher", ["openmpi", "slurm"])
def test_mpi_and_slurm_runners_get_the_values_as_argv(
    tmp_path: Path, monkeypatch, launcher: str
) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    spec, _marker = hostile_spec(tmp_path, launcher)
    run_dir = render_run_dir(spec, tmp_path / "logs", now=NOW)
    cmd, _runner = ds_runner_cmd(spec, run_dir)
    plain = launcher_command(spec, str(run_dir), plain=True)
    script = plain[script_index(plain)]
    assert cmd[cmd.index(script) + 1 :] == plain[script_index(plain) + 1 :]
    exported = "PATH=/venv/bin:/usr/bin:/bin"
    if launcher == "openmpi":
        assert cmd[cmd.index(exported) - 1] == "-x"
    else:
        assert next(a for a in cmd if a.startswith("--export=ALL,")).endswith("," + exported)


@pytest.mark.parametrize("launcher", ["local", "no_ssh", "pdsh", "openmpi", "slurm"])
def test_every_launcher_puts_the_venv_first_on_path(tmp_path: Path, monkeypatch, launcher) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    hosts = LOCALHOST if launcher == "local" else TWO_NODE
    spec = resolve_spec("tiny", "zero1", hosts, device="cpu", launcher=launcher, paths=PATHS)
    run_dir = render_run_dir(spec, tmp_path, now=NOW)
    script = (run_dir / "launch.sh").read_text()
    assert 'export PATH=/venv/bin:"${PATH}"' in script  # this node (and each no_ssh node)
    env_file = run_dir / "deepspeed_env"
    if launcher in ("pdsh", "openmpi", "slurm"):  # the ranks the runner starts elsewhere
        assert "PATH=/venv/bin:/usr/bin:/bin\n" in env_file.read_text()
    else:
        assert not env_file.exists()


@pytest.mark.parametrize("launcher", ["local", "no_ssh", "pdsh", "openmpi", "slurm"])
def test_every_launcher_builds_deepspeed_ops_inside_the_venv(
    tmp_path: Path, monkeypatch, launcher
) -> None:
    # Torch's default extension cache is shared by every venv of a user, and an op built by one
    # venv is rebuilt by the next (minutes on 2 cores, the rank silent): each venv keeps its own.
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    paths = dataclasses.replace(PATHS, python=str(venv / "bin" / "python"))
    hosts = LOCALHOST if launcher == "local" else TWO_NODE
    spec = resolve_spec("tiny", "zero1", hosts, device="cpu", launcher=launcher, paths=paths)
    run_dir = render_run_dir(spec, tmp_path / "runs", now=NOW)
    ext = venv / "torch_extensions"
    assert f"export TORCH_EXTENSIONS_DIR={ext}\n" in (run_dir / "launch.sh").read_text()
    if launcher in ("pdsh", "openmpi", "slurm"):  # the ranks the runner starts elsewhere
        assert f"TORCH_EXTENSIONS_DIR={ext}\n" in (run_dir / "deepspeed_env").read_text()
    # A user's own choice is kept; an interpreter outside a venv keeps torch's default.
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", "/scratch/ext")
    mine = render_run_dir(spec, tmp_path / "mine", now=NOW)
    assert "export TORCH_EXTENSIONS_DIR=/scratch/ext\n" in (mine / "launch.sh").read_text()
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR")
    system = resolve_spec("tiny", "zero1", hosts, device="cpu", launcher=launcher, paths=PATHS)
    plain = render_run_dir(system, tmp_path / "plain", now=NOW)
    assert "TORCH_EXTENSIONS_DIR" not in (plain / "launch.sh").read_text()
