"""What several test modules share: where the test data lives, strict parsing, the tiny model's
run setup and its resolved specs, and which tests only the full suite runs. Test modules import
the constants and functions from here (``from conftest import LAB_LOGS``); the fixtures are found
by pytest."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from analysis.parse.reader import strict
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
