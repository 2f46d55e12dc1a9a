"""What several test modules share: where the test data lives, strict parsing, the tiny model's
run setup and its resolved specs, dp2.log's run built by hand, and which tests only the full
suite runs. Test modules import the constants and functions from here (``from conftest import
LAB_LOGS``); the fixtures are found by pytest."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from analysis.parse.reader import strict
from analysis.parse.records import Iteration, Memory, ParsedRun, TimerBlock
from analysis.runs.load import LoadedRun
from analysis.theory.setup import RunSetup
from launchers.config.hostfile import parse_hostfile_text
from launchers.config.presets import resolve_spec
from launchers.config.spec import RunSpec

FIXTURES = Path(__file__).resolve().parent / "fixtures"
"""Test data the repository carries: nothing under ``tests/`` reads outside the repository."""

LAB_LOGS = FIXTURES / "lab-logs"
"""Real logs of upstream runs (Megatron-DeepSpeed f4157bea, DeepSpeed 0.19.6, CPU, 2 ranks, the
tiny model): one machine and two emulated nodes, two failures; see its README.md."""

TINY_MODEL: dict[str, Any] = {
    "model": "tiny",
    "num_layers": 4,
    "hidden_size": 128,
    "num_attention_heads": 4,
    "seq_length": 128,
    "padded_vocab_size": 512,
    "micro_batch_size": 1,
    "global_batch_size": 8,
    "precision": "fp32",
}
"""The tiny model and batch of the lab logs, as ``RunSetup`` fields."""


def tiny_setup(**fields: Any) -> RunSetup:
    """A ``RunSetup`` of the tiny model (``TINY_MODEL``) with ``fields`` set or replaced."""
    return RunSetup(**{**TINY_MODEL, **fields})


def tiny_specs(strategies: list[str], **overrides: Any) -> list[RunSpec]:
    """The tiny model's resolved specs for ``strategies`` on a one-host, two-slot hostfile (CPU),
    with spec ``overrides`` (``train_iters=4``...)."""
    cluster = parse_hostfile_text("localhost slots=2\n", "hf")
    return [resolve_spec("tiny", s, cluster, overrides, device="cpu") for s in strategies]


# dp2.log: "elapsed time per iteration (ms)" and "TFLOPs" at iterations 5..30 (log interval 5).
DP2_WINDOWS = [(5, 201.6), (10, 186.6), (15, 219.0), (20, 211.9), (25, 217.7), (30, 214.0)]
DP2_TFLOPS = [0.01, 0.02, 0.01, 0.01, 0.01, 0.01]
# dp2.log: DeepSpeed per-step timers of iterations 1-2 and 6-7 (fwd, bwd, bwd_inner,
# bwd_allreduce, step).
DP2_STEPS = {
    1: (143.21, 93.31, 77.85, 15.34, 8.08),
    2: (73.13, 69.13, 58.74, 10.30, 8.99),
    6: (68.81, 79.37, 69.55, 9.73, 10.17),
    7: (66.23, 72.48, 60.32, 12.07, 8.81),
}
DP2_SETUP = tiny_setup(
    strategy="baseline",
    tp=1,
    pp=1,
    dp=2,
    zero_stage=0,
    world_size=2,
    nodes=1,
    device="cpu",
    log_interval=5,
)
"""The setup of dp2.log's run: the tiny model, data parallel on 2 ranks of one machine."""


def dp2_parsed(windows=DP2_WINDOWS, steps=DP2_STEPS) -> ParsedRun:
    """A parsed run with dp2.log's iteration windows, DeepSpeed step timers and memory report."""
    run = ParsedRun(status="completed")
    run.iterations = [
        Iteration(iteration=i, elapsed_ms=ms, tflops=tf)
        for (i, ms), tf in zip(windows, DP2_TFLOPS, strict=False)
    ]
    names = ("fwd", "bwd", "bwd_inner", "bwd_allreduce", "step")
    for it, values in steps.items():
        micro = {f"{n}_microstep": v for n, v in zip(names, values, strict=True)}
        run.timers.append(TimerBlock("deepspeed", micro, rank=0, iteration=it))
        run.timers.append(
            TimerBlock("deepspeed", dict(zip(names, values, strict=True)), rank=0, iteration=it)
        )
    run.memory = [
        Memory(rank=0, allocated_mb=505.13671875, max_allocated_mb=505.13671875,
               reserved_mb=505.13671875, max_reserved_mb=505.13671875, after_iteration=5)
    ]  # fmt: skip
    return run


def loaded(name="dp2", parsed=None, setup=DP2_SETUP, status="completed") -> LoadedRun:
    """A loaded run named ``name`` (log files, no run.json), by default dp2's."""
    return LoadedRun(
        name=name,
        path=name,
        kind="log_files",
        parsed=parsed if parsed is not None else dp2_parsed(),
        setup=setup,
        status=status,
    )


FULL_SUITE_MODULES = frozenset(
    {"test_lab.py", "test_slurm.py", "test_openmpi.py", "test_netbench.py", "test_faults.py"}
)
"""The emulated-lab, Slurm, Open MPI and fault-injection suites: ``make test-all`` only."""

FAST_UPSTREAM_RUN = "test_e2e.py::test_local_run_dir_is_complete_and_reported"
"""The one real upstream run of the fast suite: the tiny model, ZeRO-1, 2 local ranks, 8
iterations, then its report."""


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``full`` what only ``make test-all`` runs: the modules of ``FULL_SUITE_MODULES``,
    every ``root`` test (an emulated cluster) and every ``slow`` one (real training) but
    ``FAST_UPSTREAM_RUN``. ``make test`` is ``-m "not full"``."""
    for item in items:
        module = item.path.name
        own_id = f"{module}::{item.name}"
        if (
            module in FULL_SUITE_MODULES
            or item.get_closest_marker("root")
            or (item.get_closest_marker("slow") and own_id != FAST_UPSTREAM_RUN)
        ):
            item.add_marker(pytest.mark.full)


@pytest.fixture
def strict_parse() -> Iterator[None]:
    """A parser handler's exception fails the test instead of becoming a problem string (a
    module applies it to all its tests with ``pytestmark = pytest.mark.usefixtures(...)``)."""
    with strict():
        yield
