"""Bad input is refused before anything starts, with a message that names the place and the fix.

Every case goes through the real command line (``launchers.cli.main``) and asserts three things:
exit status 2 with one ``error:`` message naming the file/line/field and what would fix it, no
process started but ``git`` (the upstream commit check), and no run directory created.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from launchers import cli
from launchers.config.presets import CONFIG_DIR, PresetError, load_models, resolve_spec
from launchers.config.spec import Cluster, Host
from launchers.config.upstream import PINNED_COMMIT, check_upstream

BAD = Path(__file__).parent / "fixtures" / "bad"
UPSTREAM_PRESENT = check_upstream().present


@pytest.fixture
def spawned(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """argv of every process started during the test (recorded, then started for real)."""
    calls: list[list[str]] = []
    real = subprocess.Popen

    class Recording(real):  # type: ignore[misc,valid-type]
        def __init__(self, args, *a, **kw):  # type: ignore[no-untyped-def]
            calls.append([str(x) for x in (args if isinstance(args, list | tuple) else [args])])
            super().__init__(args, *a, **kw)

    monkeypatch.setattr(subprocess, "Popen", Recording)
    return calls


def refuse(
    argv: list[str], logs: Path, capsys: pytest.CaptureFixture[str], spawned: list[list[str]]
) -> str:
    """Run the CLI; assert it refused and started nothing; return the error message."""
    status = cli.main([*argv, "--logs", str(logs)])
    err = capsys.readouterr().err
    assert status == cli.EXIT_USAGE, err
    assert err.startswith("error: "), err
    assert not logs.exists(), f"a run directory was created: {list(logs.rglob('*'))}"
    started = [a for a in spawned if Path(a[0]).name != "git"]
    assert started == [], f"processes were started: {started}"
    return err


def run_args(hosts: str | Path = "hostfiles/localhost", strategy: str = "baseline") -> list[str]:
    root = Path(__file__).resolve().parents[1]
    hosts = hosts if Path(hosts).is_absolute() else root / hosts
    return [
        "run",
        "--model",
        "tiny",
        "--strategy",
        strategy,
        "--hosts",
        str(hosts),
        "--device",
        "cpu",
    ]


# --------------------------------------------------------------------------- hostfiles

HOSTFILES = [
    ("hostfile-semicolon", 3, r"expected 'HOST slots=N', got 'node2;rm -rf ~ slots=1'"),
    ("hostfile-substitution", 2, r"expected 'HOST slots=N', got '\$\(touch /tmp/pwned\) slots=1'"),
    ("hostfile-newline", 2, r"expected 'HOST slots=N', got 'node1'"),
    ("hostfile-unicode", 3, r"host name 'nodа' has character 'а' at position 4; host names may "),
    ("hostfile-slots-zero", 2, r"slots must be an integer >= 1, got 0"),
    ("hostfile-duplicate", 4, r"duplicate host 'node1' \(first at line 2\)"),
    ("hostfile-option", 2, r"starts with '-'; it must start with a letter or digit"),
    ("hostfile-empty", 4, r"no 'HOST slots=N' entry in the hostfile"),
]


@pytest.mark.parametrize(("name", "line", "match"), HOSTFILES, ids=[h[0] for h in HOSTFILES])
def test_bad_hostfile_is_refused_with_file_and_line(
    name: str, line: int, match: str, tmp_path: Path, capsys, spawned
) -> None:
    err = refuse(run_args(BAD / name), tmp_path / "logs", capsys, spawned)
    assert f"{BAD / name}:{line}: " in err
    assert re.search(match, err), err


def test_hostfile_that_is_not_utf8_is_refused(tmp_path: Path, capsys, spawned) -> None:
    err = refuse(run_args(BAD / "hostfile-binary"), tmp_path / "logs", capsys, spawned)
    assert f"{BAD / 'hostfile-binary'}: cannot read hostfile" in err
    assert "utf-8" in err


def test_missing_hostfile_is_refused(tmp_path: Path, capsys, spawned) -> None:
    err = refuse(run_args(tmp_path / "nope"), tmp_path / "logs", capsys, spawned)
    assert f"{tmp_path / 'nope'}: hostfile not found" in err


def test_matrix_with_bad_hostfile_starts_nothing(tmp_path: Path, capsys, spawned) -> None:
    argv = [
        "matrix",
        "--model",
        "tiny",
        "--strategies",
        "core",
        "--hosts",
        str(BAD / "hostfile-duplicate"),
        "--device",
        "cpu",
    ]
    err = refuse(argv, tmp_path / "logs", capsys, spawned)
    assert "duplicate host 'node1'" in err


# --------------------------------------------------------------------------- names and combos


def test_unknown_model_lists_the_valid_ones(tmp_path: Path, capsys, spawned) -> None:
    argv = ["run", "--model", "huge", "--strategy", "baseline", "--device", "cpu"]
    err = refuse(argv, tmp_path / "logs", capsys, spawned)
    assert "unknown model 'huge'; valid: " in err
    for name in ("tiny", "small", "large"):
        assert name in err


def test_unknown_strategy_lists_the_valid_ones(tmp_path: Path, capsys, spawned) -> None:
    err = refuse(run_args(strategy="zero4"), tmp_path / "logs", capsys, spawned)
    assert "unknown strategy 'zero4'; valid: baseline, pipeline, tensor, zero1" in err


def test_matrix_with_one_unknown_strategy_runs_none(tmp_path: Path, capsys, spawned) -> None:
    argv = ["matrix", "--model", "tiny", "--strategies", "baseline,zero9", "--device", "cpu"]
    err = refuse(argv, tmp_path / "logs", capsys, spawned)
    assert "unknown strategy 'zero9'" in err


@pytest.mark.parametrize(
    ("strategy", "sets", "match"),
    [
        ("hybrid", [], r"tp\(2\) \* pp\(2\) \* dp\(0\) != world_size\(2\)"),
        ("pipeline", ["num_layers=3"], r"num_layers\(3\) % pp\(2\) = 1 != 0"),
        (
            "tensor",
            ["num_attention_heads=3", "hidden_size=129"],
            r"num_attention_heads\(3\) % tp\(2\) = 1 != 0",
        ),
        (
            "baseline",
            ["global_batch_size=7"],
            r"global_batch_size\(7\) % \(micro_batch_size\(1\) \* dp\(2\)\) = 1 != 0",
        ),
        ("baseline", ["seq_length=256"], r"seq_length\(256\) > max_position_embeddings\(128\)"),
        ("zero2", ["precision=fp16"], r"precision 'fp16' on device cpu"),
    ],
    ids=[
        "hybrid-on-2-ranks",
        "layers-vs-pp",
        "heads-vs-tp",
        "batch-vs-dp",
        "seq-vs-positions",
        "fp16-on-cpu",
    ],
)
def test_invalid_combination_shows_the_rule_with_numbers(
    strategy: str, sets: list[str], match: str, tmp_path: Path, capsys, spawned
) -> None:
    argv = run_args(strategy=strategy) + [x for kv in sets for x in ("--set", kv)]
    err = refuse(argv, tmp_path / "logs", capsys, spawned)
    assert f"invalid run tiny-{strategy}:" in err
    assert re.search(match, err), err


# --------------------------------------------------------------------------- values out of range


@pytest.mark.parametrize(
    ("kv", "match"),
    [
        ("train_iters=-1", "training: train_iters must be"),
        ("train_iters=ten", "--set 'train_iters=ten': train_iters must be an integer; got 'ten'"),
        (
            "precision=fp8",
            "--set 'precision=fp8': precision must be one of fp32, fp16, bf16; got 'fp8'",
        ),
        ("master_port=70000", "master_port must be an integer in 1..65535, got 70000"),
        ("master_port=0", "master_port must be an integer in 1..65535, got 0"),
        ("master_addr=$(id)", "--set master_addr: host name '$(id)' has character '$'"),
        ("log_interval=0", "log_interval"),
        ("nonsense=1", "unknown key 'nonsense'; valid keys: num_layers"),
        ("train_iters", "--set 'train_iters': expected key=value"),
    ],
)
def test_value_out_of_range_is_refused(kv: str, match: str, tmp_path: Path, capsys, spawned):
    err = refuse([*run_args(), "--set", kv], tmp_path / "logs", capsys, spawned)
    assert match in err, err


@pytest.mark.parametrize(
    ("size", "match"),
    [("lots", "write e.g. 2G, 512M"), ("10K", "below 1 MiB")],
)
def test_bad_memory_limit_is_refused(size: str, match: str, tmp_path, capsys, spawned) -> None:
    if not UPSTREAM_PRESENT:
        pytest.skip("upstream absent: the preflight stops earlier (covered by the upstream tests)")
    err = refuse([*run_args(), "--mem-limit", size], tmp_path / "logs", capsys, spawned)
    assert f"--mem-limit: memory size {size!r}" in err and match in err


def test_memory_limit_with_a_remote_launcher_is_refused(tmp_path, capsys, spawned) -> None:
    if not UPSTREAM_PRESENT:
        pytest.skip("upstream absent: the preflight stops earlier (covered by the upstream tests)")
    argv = [*run_args("hostfiles/2node"), "--mem-limit", "2G"]
    err = refuse(argv, tmp_path / "logs", capsys, spawned)
    assert "launcher pdsh starts the ranks elsewhere: use --launcher no_ssh" in err


# --------------------------------------------------------------------------- presets


def _copy_presets(tmp_path: Path) -> Path:
    config = tmp_path / "configs"
    shutil.copytree(CONFIG_DIR, config)
    return config


def test_broken_yaml_preset_names_file_and_line(tmp_path: Path) -> None:
    config = _copy_presets(tmp_path)
    shutil.copy(BAD / "preset-broken.yaml", config / "tiny.yaml")
    with pytest.raises(PresetError) as info:
        load_models(config)
    message = str(info.value)
    assert message.startswith(f"{config / 'tiny.yaml'}: not valid YAML: ")
    assert "line 6" in message or "line 7" in message, message


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (
            ("num_layers: 4 ", "num_layers: four "),
            r"model\.num_layers: num_layers must be an "
            r"integer; got 'four'",
        ),
        (("num_layers: 4 ", "num_layers: -4 "), r"model: .*num_layers"),
        (("hidden_size: 128", "hidden_sise: 128"), r"model\.hidden_sise: unknown key; valid keys"),
        (("precision: fp32", "precision: fp8"), r"model\.precision: precision must be one of"),
        (("training:", "trainings:"), r"unknown top-level key\(s\) trainings; valid"),
    ],
    ids=["type", "negative", "unknown-key", "literal", "top-level"],
)
def test_invalid_preset_value_names_file_and_key(tmp_path: Path, edit, match: str) -> None:
    config = _copy_presets(tmp_path)
    path = config / "tiny.yaml"
    text = path.read_text()
    assert edit[0] in text
    path.write_text(text.replace(edit[0], edit[1], 1))
    cluster = Cluster("hf", (Host("localhost", 2),))
    with pytest.raises(PresetError, match=f"^{path}: {match}"):
        resolve_spec("tiny", "baseline", cluster, device="cpu", config_dir=config)


def test_broken_strategies_file_is_refused(tmp_path: Path) -> None:
    config = _copy_presets(tmp_path)
    (config / "strategies.yaml").write_text("baseline:\n  tp: 1\n  pp: {\n")
    cluster = Cluster("hf", (Host("localhost", 2),))
    with pytest.raises(PresetError, match=r"(?s)strategies\.yaml: not valid YAML: .*line 4"):
        resolve_spec("tiny", "baseline", cluster, device="cpu", config_dir=config)


# --------------------------------------------------------------------------- upstream


def test_missing_upstream_says_how_to_get_it(tmp_path: Path, monkeypatch, capsys, spawned):
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("MEGATRON_DEEPSPEED_DIR", str(empty))
    err = refuse(run_args(), tmp_path / "logs", capsys, spawned)
    assert f"upstream Megatron-DeepSpeed not found at {empty} (no pretrain_gpt.py)" in err
    assert "make setup" in err and "MEGATRON_DEEPSPEED_DIR" in err


def _git(cwd: Path, *args: str) -> str:
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.org",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.org",
        "HOME": str(cwd),
    }
    return subprocess.run(
        ["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True
    ).stdout.strip()


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_upstream_at_another_commit_is_refused(tmp_path, monkeypatch, capsys, spawned) -> None:
    repo = tmp_path / "other-upstream"
    repo.mkdir()
    (repo / "pretrain_gpt.py").write_text("raise SystemExit('not the pinned upstream')\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "pretrain_gpt.py")
    _git(repo, "commit", "-q", "-m", "other")
    commit = _git(repo, "rev-parse", "HEAD")
    assert commit != PINNED_COMMIT
    monkeypatch.setenv("MEGATRON_DEEPSPEED_DIR", str(repo))
    spawned.clear()
    err = refuse(run_args(), tmp_path / "logs", capsys, spawned)
    assert f"upstream at {repo} is at commit {commit}, not the pinned {PINNED_COMMIT[:12]}" in err
    assert "make setup" in err and "--allow-other-upstream" in err


# --------------------------------------------------------------------------- dry run


def test_dry_run_writes_nothing_and_starts_nothing(tmp_path: Path, capsys, spawned) -> None:
    logs = tmp_path / "logs"
    assert cli.main([*run_args(), "--dry-run", "--logs", str(logs)]) == 0
    out = capsys.readouterr().out
    assert "nothing written, nothing started" in out
    assert not logs.exists()
    assert [a for a in spawned if Path(a[0]).name != "git"] == []


# --------------------------------------------------------------------------- remote values

REMOTE_CASES = [
    # (launcher, --set or environment, the field and the character the message names)
    ("pdsh", {"set": "data_path=/data/a\nb"}, "data_path (--data-path) '/data/a\\nb' contains "
     "'\\n' (line break, U+000A)"),
    ("pdsh", {"set": "upstream_dir=/opt/up stream"}, "paths.upstream_dir '/opt/up stream' "
     "contains ' ' (SPACE, U+0020): DeepSpeed's pdsh runner puts it into the remote shell line"),
    ("pdsh", {"env": ("PYTHONPATH", "/opt/$(touch /tmp/x)")}, "environment variable PYTHONPATH "
     "'/opt/$(touch /tmp/x)' contains '$' (DOLLAR SIGN, U+0024)"),
    ("pdsh", {"env": ("PYTHONWARNINGS", "ignore%n")}, "contains '%' (PERCENT SIGN, U+0025)"),
    ("openmpi", {"env": ("PATH", "/opt/my bin:/usr/bin")}, "deepspeed_env PATH "
     "'/venv/bin:/opt/my bin:/usr/bin' contains ' ' (SPACE, U+0020): DeepSpeed's openmpi runner "
     "would pass it to mpirun -x with quotes inside"),
    ("slurm", {"env": ("PATH", "/opt/a,b:/usr/bin")}, "deepspeed_env PATH '/venv/bin:/opt/a,b:"
     "/usr/bin' contains ',' (COMMA, U+002C): DeepSpeed's slurm runner would pass it in srun "
     "--export=ALL,... as it is"),
]  # fmt: skip


@pytest.mark.parametrize(("launcher", "given", "match"), REMOTE_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(REMOTE_CASES)])  # fmt: skip
def test_values_that_cannot_reach_remote_ranks_are_refused_naming_field_and_character(
    tmp_path: Path, monkeypatch, capsys, spawned, launcher: str, given: dict, match: str
) -> None:
    from launchers.config.spec import PLACEHOLDER_PATHS

    monkeypatch.setattr(
        "launchers.config.presets.default_paths", lambda env=None: PLACEHOLDER_PATHS
    )
    argv = [*run_args("hostfiles/2node"), "--launcher", launcher]
    if "set" in given:
        argv += ["--set", given["set"]]
    if "env" in given:
        monkeypatch.setenv(*given["env"])
    err = refuse(argv, tmp_path / "logs", capsys, spawned)
    assert f"through {launcher}: values that cannot reach the remote ranks intact" in err
    assert match in err, err


def test_a_lab_run_with_a_value_for_the_remote_shell_is_refused_before_the_lab(
    tmp_path: Path, monkeypatch, capsys, spawned
) -> None:
    monkeypatch.setenv("PYTHONPATH", "`touch /tmp/x`")
    err = refuse([*run_args(), "--net", "1gbit"], tmp_path / "logs", capsys, spawned)
    assert "environment variable PYTHONPATH '`touch /tmp/x`' contains '`'" in err
