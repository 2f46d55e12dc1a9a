"""Upstream's fused masked softmax against the CUDA toolkit: CUDA 13 turns it off, recorded."""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from launchers.config import softmax_fusion
from launchers.config.presets import parse_overrides, resolve_spec
from launchers.config.project import launcher_command, script_index
from launchers.config.spec import (
    PLACEHOLDER_PATHS,
    Cluster,
    Host,
    RunSpec,
    spec_from_json,
    spec_to_json,
)
from launchers.config.upstream import check_upstream
from launchers.run.render import render_launch_script

FLAG = "--no-masked-softmax-fusion"


def toolkit(major: int, minor: int = 0) -> softmax_fusion.CudaToolkit:
    return softmax_fusion.CudaToolkit((major, minor), f"nvcc {major}.{minor} (/stand-in/nvcc)")


def resolved(
    monkeypatch: pytest.MonkeyPatch, cuda: tuple[int, int] | None, device: str = "cuda", **sets: str
) -> RunSpec:
    """``large`` x baseline on one host with the toolkit probe replaced by a stand-in."""
    found = toolkit(*cuda) if cuda else None
    asked: list[str] = []

    def stand_in(python: str) -> softmax_fusion.CudaToolkit | None:
        asked.append(python)
        return found

    monkeypatch.setattr(softmax_fusion, "compiling_toolkit", stand_in)
    overrides = parse_overrides([f"{k}={v}" for k, v in sets.items()])
    cluster = Cluster(hostfile="hostfile", hosts=(Host("localhost", 1),))
    spec = resolve_spec("large", "baseline", cluster, overrides, device=device,
                        paths=PLACEHOLDER_PATHS)  # fmt: skip
    assert asked == ([PLACEHOLDER_PATHS.python] if device == "cuda" and not sets else [])
    return spec


def softmax_record(spec: RunSpec) -> list[dict[str, object]]:
    return [a for a in spec_to_json(spec)["adjustments"] if a["key"] == "masked_softmax_fusion"]


def test_cuda_12_keeps_the_fusion(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = resolved(monkeypatch, (12, 8))
    assert softmax_record(spec) == []
    assert FLAG not in launcher_command(spec, "/run")


def test_cuda_13_drops_the_fusion_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = resolved(monkeypatch, (13, 0))
    argv = launcher_command(spec, "/run")
    assert argv.count(FLAG) == 1
    (record,) = softmax_record(spec)
    assert (record["requested"], record["applied"]) == (True, False)
    reason = str(record["reason"])
    for words in ("nvcc 13.0 (/stand-in/nvcc)", "compute_70", "unfused", FLAG):
        assert words in reason
    # run.json keeps it (the spec document round-trips) and the launch script says it.
    assert softmax_record(spec_from_json(spec_to_json(spec))) == [record]
    script = render_launch_script(spec, "/run")
    assert (
        "# Adjusted masked_softmax_fusion: True -> False (the CUDA toolkit is nvcc 13.0" in script
    )
    assert f"  {FLAG} \\" in script


def test_no_toolkit_known_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    assert softmax_record(resolved(monkeypatch, None)) == []


def test_cpu_runs_are_not_probed(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = resolved(monkeypatch, (13, 0), device="cpu")
    assert softmax_record(spec) == [] and FLAG not in launcher_command(spec, "/run")


@pytest.mark.parametrize(
    ("cuda", "value", "dropped"), [((13, 0), "true", False), ((12, 4), "false", True)]
)
def test_the_set_key_wins(
    monkeypatch: pytest.MonkeyPatch, cuda: tuple[int, int], value: str, dropped: bool
) -> None:
    spec = resolved(monkeypatch, cuda, masked_softmax_fusion=value)
    assert (FLAG in launcher_command(spec, "/run")) is dropped
    records = softmax_record(spec)
    assert len(records) == int(dropped)
    if dropped:
        assert "--set masked_softmax_fusion=false" in str(records[0]["reason"])


def fake_nvcc(home: Path, text: str, rc: int = 0) -> None:
    nvcc = home / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text(f"#!/bin/sh\necho '{text}'\nexit {rc}\n")
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IXUSR)


def test_the_toolkit_is_nvcc_under_cuda_home(tmp_path: Path) -> None:
    fake_nvcc(tmp_path, "Cuda compilation tools, release 13.0, V13.0.88")
    found = softmax_fusion.compiling_toolkit(sys.executable, {"CUDA_HOME": str(tmp_path)})
    assert found == softmax_fusion.CudaToolkit((13, 0), f"nvcc 13.0 ({tmp_path}/bin/nvcc)")
    fake_nvcc(tmp_path / "old", "Cuda compilation tools, release 12.4, V12.4.131")
    found = softmax_fusion.compiling_toolkit(sys.executable, {"CUDA_PATH": str(tmp_path / "old")})
    assert found is not None and found.version == (12, 4)


def test_without_an_answering_nvcc_torch_build_decides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_nvcc(tmp_path, "broken", rc=1)
    monkeypatch.setattr(softmax_fusion.node_probe, "torch_cuda_build", lambda: "13.0")
    found = softmax_fusion.compiling_toolkit(sys.executable, {"CUDA_HOME": str(tmp_path)})
    assert found is not None and found.version == (13, 0)
    assert found.source.startswith("torch.version.cuda 13.0 of ")
    assert "-V gave no release" in found.source


def test_a_python_not_on_this_machine_says_nothing(tmp_path: Path) -> None:
    fake_nvcc(tmp_path, "Cuda compilation tools, release 13.0, V13.0.88")
    absent = str(tmp_path / "no-venv" / "bin" / "python")
    assert softmax_fusion.compiling_toolkit(absent, {"CUDA_HOME": str(tmp_path)}) is None


PARSE = r"""
import json, os, sys
sys.path.insert(0, os.environ["UPSTREAM_DIR"])
from megatron.arguments import parse_args
seen = []
for argv in json.load(sys.stdin):
    sys.argv = ["pretrain_gpt.py", *argv]
    seen.append(parse_args(None, ignore_unknown_args=False).masked_softmax_fusion)
print("FUSION " + json.dumps(seen))
"""


@pytest.mark.upstream
def test_upstream_reads_the_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Upstream's own parser: the CUDA 13 spec's argv turns masked_softmax_fusion off."""
    status = check_upstream()
    if not status.present or importlib.util.find_spec("deepspeed") is None:
        pytest.skip("upstream Megatron-DeepSpeed or deepspeed missing: run `make setup`")
    argvs = []
    for cuda in ((12, 8), (13, 0)):
        argv = launcher_command(resolved(monkeypatch, cuda), "/RUNS/run")
        argvs.append(argv[script_index(argv) + 1 :])
    env = os.environ | {"UPSTREAM_DIR": str(status.path), "DS_ACCELERATOR": "cpu",
                        "WORLD_SIZE": "1", "RANK": "0"}  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", PARSE], input=json.dumps(argvs), text=True,
                          capture_output=True, env=env, cwd=status.path, timeout=300)  # fmt: skip
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("FUSION ")), None)
    assert line is not None, proc.stderr[-2000:]
    assert json.loads(line.removeprefix("FUSION ")) == [True, False]
