"""``make gpu-check``: the refusal without a GPU (under 5 s), the dry-run plan, the GPU detection,
the budget, and the apex build that compiles only the extensions named."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from launchers.config import gpu, gpu_check, torch_check

ROOT = Path(__file__).resolve().parents[1]


def fake_smi(tmp_path: Path, body: str) -> dict[str, str]:
    """An environment whose PATH has only a fake ``nvidia-smi`` (running ``body``) and the
    basic tools."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\n{body}\n")
    smi.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}


def test_refuses_at_once_without_a_gpu(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {**os.environ, "PATH": str(empty)}  # (no nvidia-smi, even on a GPU machine)
    start = time.monotonic()
    proc = subprocess.run(
        [shutil.which("make") or "make", "--no-print-directory", "gpu-check",
         f"GPU_PYTHON={sys.executable}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    elapsed = time.monotonic() - start
    assert proc.returncode != 0 and elapsed < 5.0
    assert "gpu-check: no CUDA GPU on this machine: nvidia-smi not found" in proc.stderr
    assert "nothing was run" in proc.stderr
    assert not (ROOT / ".venv-gpu").exists()


def test_refuses_when_nvidia_smi_lists_no_gpu(tmp_path, monkeypatch):
    env = fake_smi(tmp_path, 'echo "No devices were found"; exit 6')
    monkeypatch.setenv("PATH", env["PATH"])
    gpus, why = gpu_check.detect()
    assert gpus == [] and why == "nvidia-smi -L lists no GPU (No devices were found)"
    assert gpu_check.main([]) == 2


def test_detects_a_gpu(tmp_path, monkeypatch):
    line = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-6f0c0c8e-0000-0000-0000-000000000000)"
    monkeypatch.setenv("PATH", fake_smi(tmp_path, f'echo "{line}"')["PATH"])
    assert gpu_check.detect() == ([line], "")


def dry_run(*extra: str) -> str:
    """``make gpu-check DRY_RUN=1 DEVICE=cuda`` here: the plan it prints."""
    proc = subprocess.run(
        ["make", "--no-print-directory", "gpu-check", "DRY_RUN=1", "DEVICE=cuda",
         f"GPU_PYTHON={sys.executable}", *extra],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert not (ROOT / ".venv-gpu").exists()
    return proc.stdout


def test_dry_run_plan_on_a_cpu_machine():
    out = dry_run()
    assert "make --no-print-directory setup TORCH=system VENV=" in out
    assert "-m venv --system-site-packages" in out and "torch_check requirements" in out
    assert "wheelhouse" not in out and "DEVICE= " in out
    assert "-m launchers.config.gpu build-needed" in out
    for model, strategy in gpu_check.RUN_ORDER:
        assert (
            f"-m launchers matrix --model {model} --strategies {strategy} --device cuda --hosts "
            in out
        )
    assert out.count("--set precision=bf16") == 9 and "localhost slots=1" in out  # 8 + profiled
    assert "-m analysis.report " in out and out.index("matrix --model large") < out.index(
        "analysis.report"
    )
    assert f"gpu-check plan (budget {gpu_check.BUDGET_S:g} s;" in out


def test_gpu_resume_leaves_completed_runs_to_the_matrix():
    """GPU_RESUME=1: the runs are not forced, so a second call on the same machine skips what
    the first completed (the matrix's completed-twin rule, tests/test_faults.py) and runs the
    rest; without it every run is forced."""
    forced, resumed = dry_run(), dry_run("GPU_RESUME=1")
    runs = [line for line in resumed.splitlines() if " matrix --model " in line]
    assert len(runs) == len(gpu_check.RUN_ORDER) + 1  # (and the profiled small baseline)
    assert not any("--force" in r for r in runs)
    assert forced.count(" --force") == len(gpu_check.RUN_ORDER) + 1


def test_gpu_budget_sets_the_budget():
    """GPU_BUDGET: a session with less device time than nine minutes (the second H200 call)."""
    out = dry_run("GPU_BUDGET=328")
    assert "gpu-check plan (budget 328 s;" in out
    assert "--timeout 298" in out  # the first run: the budget less the report's 30 s


def test_dry_run_plan_from_a_wheelhouse(tmp_path):
    """With WHEELS the set-up is make setup's own WHEELS= recipe, each step in its order: the
    chain to a venv interpreter's packages, the manifest check (the apex bundle required, torch
    left to the machine), pip on that folder alone with the manifest's versions and none of pip's
    configuration, upstream and apex from the wheelhouse's bundles."""
    wh = tmp_path / "wh"
    lines = dry_run(f"WHEELS={wh}").splitlines()
    venv = ROOT / ".venv-gpu"

    def at(text: str) -> int:
        return next(n for n, line in enumerate(lines) if text in line)

    chain = at(f"-m launchers.config.torch_check chain {venv}")
    check = at(
        f"{venv}/bin/python -m launchers.config.wheelhouse check {wh} --apex --system "
        f"--constraints {venv}/wheelhouse-constraints.txt"
    )
    pip = at(
        "env -u PIP_FIND_LINKS -u PIP_INDEX_URL -u PIP_EXTRA_INDEX_URL -u PIP_CONSTRAINT "
        f"PIP_CONFIG_FILE=/dev/null {venv}/bin/python -m pip install --quiet --no-index "
        f"--find-links {wh} -c {venv}/wheelhouse-constraints.txt -r {venv}/requirements-system.txt"
    )
    upstream = at(f"MEGATRON_DEEPSPEED_REPO={wh}/megatron-deepspeed.bundle ")
    apex = at(f"APEX_REPO={wh}/apex.bundle {venv}/bin/python -m launchers.config.gpu build-needed")
    runs = at("matrix --model small")
    assert chain < check < pip < upstream < apex < runs
    assert "pip install" not in " ".join(lines[:check])
    # (make gpu-check DEVICE=cuda does not reach the set-up's make: no whole apex build there)
    assert not any("-m launchers.config.gpu setup" in line for line in lines)


def test_a_damaged_wheelhouse_stops_the_check_before_pip(tmp_path, monkeypatch, capfd):
    """The real set-up on a fake GPU machine: the venv on this interpreter (itself a venv, so a
    .pth names its packages), then the wheelhouse's check fails, and nothing is installed, cloned
    or run after it."""
    monkeypatch.setenv("PATH", fake_smi(tmp_path, 'echo "GPU 0: NVIDIA A10 (UUID: x)"')["PATH"])
    venv, wh = tmp_path / "venv", tmp_path / "wh"
    wh.mkdir()
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)],
        check=True,
    )
    args = ["--venv", str(venv), "--logs", str(tmp_path / "logs"), "--wheels", str(wh)]
    assert gpu_check.main(args) == 1
    out, err = capfd.readouterr()
    assert f"wheelhouse: {wh}/manifest.json does not exist" in err
    assert "'make setup TORCH=system" in err and "gpu-check: versions found" not in out
    assert not (venv / "wheelhouse-constraints.txt").exists()
    assert not (venv / ".requirements-system.stamp").exists()
    assert not list(venv.glob("lib/python*/site-packages/deepspeed"))
    (pth,) = venv.glob(f"lib/python*/site-packages/{torch_check.CHAIN_PTH}")
    assert sys.prefix in pth.read_text()


def test_the_check_builds_what_upstream_needs():
    assert tuple(gpu.APEX_EXTENSIONS) == gpu_check.APEX_NEEDED


def test_requirements_without_torch(tmp_path):
    out = torch_check.requirements_without_torch(ROOT / "requirements.txt", tmp_path / "r.txt")
    names = [line.split("==")[0] for line in out.read_text().splitlines() if "==" in line]
    assert "torch" not in names and "torchvision" not in names and "deepspeed" in names


def test_budget_per_run():
    step = gpu_check.Step("small", ["python", "-m", "launchers", "matrix"])
    assert gpu_check.with_timeout(step, 530.0, True)[-2:] == ["--timeout", "500"]
    assert gpu_check.with_timeout(step, 530.0, False)[-1] == "150"  # (RUN_CAP_S after the first)
    assert gpu_check.with_timeout(step, 100.0, False)[-1] == "70"
    assert gpu_check.with_timeout(step, 50.0, True)[-1] == "40"  # (never under MIN_RUN_S)
    assert gpu_check.with_timeout(gpu_check.Step("x", ["true"]), 10.0, True) == ["true"]


def test_every_model_and_strategy_runs_once_most_telling_first(tmp_path):
    pairs = set(gpu_check.RUN_ORDER)
    assert pairs == {(m, s) for m in gpu_check.MODELS for s in gpu_check.STRATEGIES}
    assert len(pairs) == len(gpu_check.RUN_ORDER)
    assert gpu_check.RUN_ORDER[:2] == (("large", "baseline"), ("small", "baseline"))
    steps = gpu_check.plan(tmp_path / "v", tmp_path / "logs", "python3", None)
    runs = [s.argv for s in steps if "matrix" in s.argv]
    said = [(a[a.index("--model") + 1], a[a.index("--strategies") + 1]) for a in runs]
    # The small baseline once more, profiled, right after it, into its own folder.
    assert said == [*gpu_check.RUN_ORDER[:2], ("small", "baseline"), *gpu_check.RUN_ORDER[2:]]
    profiled = [a for a in runs if "--profile" in a]
    assert profiled == [runs[2]]
    assert runs[2][runs[2].index("--logs") + 1] == str(tmp_path / "logs" / "profiled")
    assert all(a[a.index("--logs") + 1] == str(tmp_path / "logs" / "runs") for a in runs[3:])
    assert "analysis.report" in steps[-1].argv and str(tmp_path / "logs" / "runs") in steps[-1].argv
    assert steps[-2].argv[-3:] == [
        str(tmp_path / "logs" / "profiled"),
        "--out",
        str(tmp_path / "logs" / "profiled-report"),
    ]
    assert steps[-2].needs == tmp_path / "logs" / "profiled"


def mark(trail, word, *extra):
    return ["sh", "-c", f"echo {word} >> {trail}", *extra]


def test_steps_run_in_order_and_a_failed_run_still_gets_the_report(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", fake_smi(tmp_path, 'echo "GPU 0: NVIDIA A10 (UUID: x)"')["PATH"])
    trail = tmp_path / "trail"

    def plan(venv, logs, python, wheels, resume=False):
        return [
            gpu_check.Step("first", mark(trail, "first")),
            gpu_check.Step("runs", mark(trail, "runs", "matrix")),
            gpu_check.Step("failing runs", ["sh", "-c", "exit 3", "matrix"]),
            gpu_check.Step("later runs", mark(trail, "later", "matrix")),
            gpu_check.Step(
                "report of nothing",
                ["sh", "-c", "exit 4", "analysis.report"],
                needs=tmp_path / "absent",
            ),
            gpu_check.Step("failing report", ["sh", "-c", "exit 5", "analysis.report"]),
            gpu_check.Step("report", mark(trail, "report", "analysis.report")),
        ]

    monkeypatch.setattr(gpu_check, "plan", plan)
    assert gpu_check.main(["--logs", str(tmp_path / "logs"), "--venv", str(tmp_path)]) == 1
    assert trail.read_text().split() == ["first", "runs", "later", "report"]
    assert (tmp_path / "logs" / "hostfile").read_text() == "localhost slots=1\n"


def test_runs_that_do_not_fit_are_left_out_and_the_report_runs(tmp_path, monkeypatch, capsys):
    """A run that overruns is stopped at the budget less the report's reserve; the runs after it
    are not started; the report runs within what was kept for it."""
    monkeypatch.setattr(gpu_check, "REPORT_S", 1.0)
    monkeypatch.setattr(gpu_check, "MIN_RUN_S", 0.5)
    trail = tmp_path / "trail"
    steps = [
        gpu_check.Step("setup", mark(trail, "setup")),
        gpu_check.Step("quick run", mark(trail, "quick", "matrix")),
        gpu_check.Step("slow run", ["sh", "-c", f"echo slow >> {trail}; sleep 30", "matrix"]),
        gpu_check.Step("left-out run", mark(trail, "left-out", "matrix")),
        gpu_check.Step("report", mark(trail, "report", "analysis.report")),
    ]
    start = time.monotonic()
    assert gpu_check.execute(steps, 3.0, start, tmp_path) == 1
    took = time.monotonic() - start
    assert trail.read_text().split() == ["setup", "quick", "slow", "report"]
    assert took < 3.5
    out = capsys.readouterr()
    assert "not run for want of time: left-out run" in out.out
    assert "'slow run' ran past the budget" in out.err
    took_lines = [line for line in out.out.splitlines() if "' took " in line]
    steps_timed = [line.split("'")[1] for line in took_lines]
    assert steps_timed == ["setup", "quick run", "slow run", "report"]
    slow = took_lines[2].removeprefix("gpu-check: 'slow run' took ").split(" s, ")[0]
    assert 1 <= int(slow) <= 2  # stopped at the budget, 3 s, less the report's 1 s


def test_a_failed_setup_step_stops_the_check(tmp_path):
    trail = tmp_path / "trail"
    steps = [
        gpu_check.Step("setup", ["sh", "-c", "exit 2"]),
        gpu_check.Step("run", mark(trail, "run", "matrix")),
        gpu_check.Step("report", mark(trail, "report", "analysis.report")),
    ]
    assert gpu_check.execute(steps, 30.0, time.monotonic(), tmp_path) == 1
    assert not trail.exists()


def test_apex_ext_builds_only_the_named_extensions(tmp_path):
    """apex's setup.py (here a stand-in declaring two C extensions) runs as is; only the named
    extension is compiled, into the target; a name it does not declare stops the build."""
    src = tmp_path / "apex"
    src.mkdir()
    for name in ("amp_C", "syncbn"):
        (src / f"{name}.c").write_text(textwrap.dedent(f"""
            #include <Python.h>
            static struct PyModuleDef m = {{PyModuleDef_HEAD_INIT, "{name}", 0, -1, 0}};
            PyMODINIT_FUNC PyInit_{name}(void) {{ return PyModule_Create(&m); }}
        """))  # fmt: skip
    (src / "setup.py").write_text(textwrap.dedent("""
        import os
        from setuptools import Extension, setup
        assert os.environ["APEX_CUDA_EXT"] == "1" and os.environ["APEX_CPP_EXT"] == "1"
        setup(name="apex", ext_modules=[Extension("amp_C", ["amp_C.c"]),
                                        Extension("syncbn", ["syncbn.c"])])
    """))  # fmt: skip
    target = tmp_path / "site"
    script = str(Path(gpu.apex_ext.__file__))
    env = {**os.environ, "TORCH_CUDA_ARCH_LIST": "9.0"}
    proc = subprocess.run([sys.executable, script, str(src), str(target), "amp_C"], env=env,
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "apex_ext: building amp_C for sm 9.0" in proc.stdout
    built = sorted(p.name.split(".")[0] for p in target.glob("*.so"))
    assert built == ["amp_C"]
    proc = subprocess.run([sys.executable, script, str(src), str(target), "mlp_cuda"], env=env,
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert proc.returncode != 0 and "declares no extension ['mlp_cuda']" in proc.stderr


@pytest.mark.parametrize("names", [["amp_C"], ["amp_C", "fused_layer_norm_cuda"]])
def test_extension_command(names):
    cmd = gpu.extension_command(Path("/src/apex"), names)
    assert cmd[0] == sys.executable and cmd[1].endswith("launchers/config/apex_ext.py")
    assert cmd[2] == "/src/apex" and cmd[4:] == names


# -- make setup TORCH=system ---------------------------------------------------------------------


def test_setup_torch_system_plan(tmp_path):
    venv = tmp_path / "venv"
    proc = subprocess.run(
        ["make", "-n", "--no-print-directory", "setup", "TORCH=system", f"VENV={venv}",
         "SYSTEM_PYTHON=/opt/site/bin/python3", "WHEELS=/wh"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    lines = proc.stdout.splitlines()
    assert lines[0] == (
        f"test -x {venv}/bin/python || /opt/site/bin/python3 -m venv --system-site-packages {venv}"
    )
    assert any("torch_check requirements requirements.txt" in line for line in lines)
    assert f"/opt/site/bin/python3 -m launchers.config.torch_check chain {venv}" in lines
    assert (
        f"--no-index --find-links /wh -c {venv}/wheelhouse-constraints.txt "
        f"-r {venv}/requirements-system.txt" in proc.stdout
    )
    assert f"{venv}/bin/python -m launchers.config.torch_check check" in lines


def test_setup_torch_system_refuses_a_venv_without_the_system_packages(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    proc = subprocess.run(
        ["make", "--no-print-directory", "setup", "TORCH=system", f"VENV={venv}"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "exists without --system-site-packages: remove it or name another VENV" in proc.stdout
    assert not (venv / "requirements-system.txt").exists()


def test_torch_outside_the_tested_range_is_a_warning_naming_the_versions():
    found = {"torch": "2.11.0+cu130", "torch_cuda": "13.0", "torch_origin": "system (/usr)"}
    (warning,) = torch_check.warnings(found)
    assert warning.startswith("torch 2.11.0+cu130 is outside the tested range (2.14.x")
    found = {"torch": "2.14.1+cu126", "torch_cuda": "12.6"}
    (warning,) = torch_check.warnings(found)
    assert "built with CUDA 12.6, not the tested 13.0" in warning
    assert torch_check.warnings({"torch": "2.14.1", "torch_cuda": "13.0"}) == []
    assert torch_check.cuda_of("2.11.0+cu130") == "13.0" and torch_check.cuda_of("2.1.0") is None
    assert torch_check.built_cuda("cuda: Optional[str] = '13.0'\n") == "13.0"


def test_provenance_records_the_torch_found(tmp_path):
    from conftest import tiny_specs

    from launchers.run import render

    prov = render.provenance(tiny_specs(["baseline"])[0], datetime.now(timezone.utc))
    found = torch_check.facts()
    assert (prov.torch, prov.torch_cuda, prov.torch_origin) == (
        found["torch"], found["torch_cuda"], "venv"
    )  # fmt: skip
    assert prov.torch_warnings == (torch_check.warnings(found) or None)


def test_the_dataset_step_runs_upstream_with_the_cpu_accelerator(tmp_path, monkeypatch):
    """preprocess_data.py imports megatron, which imports apex under DeepSpeed's cuda accelerator:
    the dataset step alone gets DS_ACCELERATOR=cpu, this process's environment keeps its own."""
    from launchers.config import upstream

    monkeypatch.setenv("MDS_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("DS_ACCELERATOR", "cuda")
    monkeypatch.setattr(upstream, "generate_corpus", lambda path: path.write_text("{}\n"))
    monkeypatch.setattr(upstream, "train_tokenizer", lambda corpus, out: None)
    seen: dict[str, str] = {}

    def fake_run(cmd, **kw):
        seen.update(kw["env"])
        data = upstream.tiny_data()
        for p in (data.vocab_file, data.merge_file):
            p.write_text("x")
        for ext in (".bin", ".idx"):
            Path(f"{data.data_prefix}{ext}").write_text("x")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(upstream.subprocess, "run", fake_run)
    upstream.ensure_tiny_data(tmp_path, log=lambda s: None)
    assert seen["DS_ACCELERATOR"] == "cpu"
    assert seen["MDS_CACHE_DIR"] == str(tmp_path)
    assert os.environ["DS_ACCELERATOR"] == "cuda"


def git_repo(path: Path) -> str:
    """A one-commit repository holding a setup.py; its commit id."""
    path.mkdir()
    (path / "setup.py").write_text("print('apex stand-in')\n")
    git = ["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "setup.py"], check=True)
    subprocess.run([*git, "commit", "-qm", "apex"], check=True)
    return subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()  # fmt: skip


def test_apex_from_an_unbundlable_clone_is_a_checked_source_tarball(tmp_path, monkeypatch):
    """Where git cannot bundle the clone (part of its history missing), the wheelhouse holds the
    pinned tree as a tarball; the apex step extracts it only when the commit id git recorded in it
    is the pin, and reuses the extracted tree."""
    from launchers.config import wheelhouse

    commit = git_repo(tmp_path / "apex-clone")
    monkeypatch.setattr(wheelhouse, "APEX_COMMIT", commit)

    def no_bundle(repo, path, commit, what, log=print):
        raise wheelhouse.UpstreamError("git bundle create failed: pack-objects died")

    monkeypatch.setattr(wheelhouse, "bundle", no_bundle)
    folder = tmp_path / "house"
    folder.mkdir()
    said: list[str] = []
    got = wheelhouse.apex_source(str(tmp_path / "apex-clone"), folder, said.append)
    assert got == folder / wheelhouse.APEX_ARCHIVE_NAME and got.is_file()
    assert any("source tarball instead" in line for line in said)
    assert gpu.tar_commit(got) == commit
    with pytest.raises(wheelhouse.UpstreamError):  # (a URL gets no tarball: its error stands)
        wheelhouse.apex_source("https://example.invalid/apex.git", folder, said.append)

    monkeypatch.setenv("APEX_REPO", str(got))
    monkeypatch.setenv("APEX_DIR", str(tmp_path / "src"))
    with pytest.raises(gpu.GpuSetupError, match=f"holds apex {commit[:12]}, this checkout pins"):
        gpu.ensure_apex_source(log=said.append)
    monkeypatch.setattr(gpu, "APEX_COMMIT", commit)
    assert gpu.ensure_apex_source(log=said.append) == tmp_path / "src"
    assert (tmp_path / "src" / "setup.py").read_text() == "print('apex stand-in')\n"
    gpu.ensure_apex_source(log=said.append)
    assert said[-1] == f"apex: reusing {tmp_path / 'src'} at {commit[:12]}"
    assert gpu_check.apex_file(folder) == folder / "apex.bundle"  # (no manifest: the bundle)
    (folder / "manifest.json").write_text(json.dumps({"apex": {"file": "apex.tar.gz"}}))
    assert gpu_check.apex_file(folder) == got
