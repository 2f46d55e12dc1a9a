"""Profiler traces: the ``--profile`` switch down to upstream's flags, reading a run's traces, the
per-rank breakdown (exact on a constructed trace, adding up on a real one) and the report."""

from __future__ import annotations

import dataclasses
import gzip
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from launchers.cli import main as cli_main
from launchers.config.hostfile import parse_hostfile_text
from launchers.config.presets import resolve_spec
from launchers.config.project import megatron_args
from launchers.config.spec import (
    PLACEHOLDER_PATHS,
    RunSpec,
    SpecError,
    spec_from_json,
    spec_hash,
    spec_to_json,
    steady_profile_steps,
)

FIXTURES = Path(__file__).parent / "fixtures" / "traces"


def tiny_pipeline(**overrides: Any) -> RunSpec:
    hosts = parse_hostfile_text("node0 slots=1\nnode1 slots=1\n", "hf")
    return resolve_spec(
        "tiny", "pipeline", hosts, overrides, device="cpu", launcher="pdsh", paths=PLACEHOLDER_PATHS
    )


# ------------------------------------------------------------------------------ the switch


def test_profile_records_the_last_logging_window() -> None:
    spec = tiny_pipeline()  # 30 iterations logged every 5: window 26-30 is the last
    assert steady_profile_steps(spec.training) == (26, 30)
    assert steady_profile_steps(tiny_pipeline(train_iters=12, log_interval=4).training) == (9, 12)
    # iterations past the last whole window are not logged: the last logged window is taken
    assert steady_profile_steps(tiny_pipeline(train_iters=33).training) == (26, 30)


def test_profile_needs_a_window_past_the_warm_up() -> None:
    with pytest.raises(SpecError, match=r"train_iters\(9\) // log_interval\(5\) = 1 .*>= 10"):
        steady_profile_steps(tiny_pipeline(train_iters=9).training)


def test_profiled_spec_passes_upstreams_switches_and_keeps_other_hashes() -> None:
    plain = tiny_pipeline()
    argv = megatron_args(plain, "/run")
    assert "--profile" not in argv and "--profile_steps" not in argv
    assert "profile_steps" not in spec_to_json(plain)  # earlier runs keep their hash

    profiled = dataclasses.replace(plain, profile_steps=(26, 30))
    argv = megatron_args(profiled, "/run")
    at = argv.index("--profile")
    assert argv[at : at + 4] == ["--profile", "pt", "--profile_steps", "26,30"]
    assert argv[argv.index("--tensorboard-dir") + 1] == "/run/tensorboard"  # where traces land
    data = spec_to_json(profiled)
    assert data["profile_steps"] == [26, 30]
    assert spec_hash(profiled) != spec_hash(plain)
    assert spec_from_json(json.loads(json.dumps(data)), plain.cluster.text) == profiled


def test_profile_steps_outside_the_run_are_refused() -> None:
    with pytest.raises(SpecError, match=r"profile_steps\(26,31\).*train_iters\(30\)"):
        dataclasses.replace(tiny_pipeline(), profile_steps=(26, 31))
    with pytest.raises(SpecError, match=r"profile_steps\(0,3\)"):
        dataclasses.replace(tiny_pipeline(), profile_steps=(0, 3))


def test_cli_profile_reaches_launch_sh(capsys: pytest.CaptureFixture[str]) -> None:
    status = cli_main(
        ["run", "--model", "tiny", "--strategy", "pipeline", "--device", "cpu", "--profile",
         "--dry-run"]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert status == 0
    assert "--profile pt" in out and "--profile_steps 26,30" in out
