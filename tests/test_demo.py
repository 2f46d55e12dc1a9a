"""``make demo``'s fallback: without a lab it says why and runs 2 local ranks unshaped."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from launchers import cli
from launchers.lab import session


def test_lab_unavailable_when_not_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session.os, "geteuid", lambda: 1000)
    assert session.lab_available(ssh=True) == (
        False,
        "not root (network namespaces need root)",
    )


def test_lab_unavailable_names_missing_tools(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session.os, "geteuid", lambda: 0)
    monkeypatch.setattr(session.shutil, "which", lambda t: None if t in ("tc", "pdsh") else t)
    ok, why = session.lab_available(ssh=True)
    assert not ok and why.startswith("missing tc, pdsh")
    assert session.lab_available(ssh=False) == (False, "missing tc (Debian: iproute2, "
                                                "openssh-server, pdsh)")  # fmt: skip


def test_demo_falls_back_to_local_ranks_and_says_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: dict[str, object] = {}

    def fake_matrix(args: argparse.Namespace) -> int:
        seen.update(net=args.net, model=args.model, strategies=args.strategies)
        return 0

    reported: list[list[str]] = []

    def fake_report(argv: list[str]) -> int:
        reported.append(argv)
        return 0

    monkeypatch.setattr(cli, "lab_available", lambda ssh: (False, "not root (test)"))
    monkeypatch.setattr(cli, "cmd_matrix", fake_matrix)
    monkeypatch.setattr("analysis.report.build.main", fake_report)
    args = cli.build_parser().parse_args(["demo", "--logs", str(tmp_path)])
    assert args.net == "100mbit"  # the default: 2 emulated nodes at 100 Mbit/s
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "no emulated cluster on this machine (not root (test)); running 2 local ranks" in out
    assert seen == {"net": None, "model": "tiny", "strategies": "core"}
    # The report of the demo's runs, with its executive summary printed by the report itself.
    assert reported == [[str(tmp_path), "--out", str(tmp_path / "report"), "--summary"]]
