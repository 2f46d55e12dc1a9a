"""A hostfile can describe an emulated lab instead of naming hosts."""

from __future__ import annotations

from pathlib import Path

from launchers.cli import main
from launchers.config.hostfile import HOSTFILE_DIR, lab_directive


def test_shipped_lab_hostfile_describes_two_nodes():
    assert lab_directive(HOSTFILE_DIR / "lab-2node") == (2, "100mbit")


def test_plain_hostfiles_are_not_labs(tmp_path: Path):
    assert lab_directive(HOSTFILE_DIR / "localhost") is None
    odd = tmp_path / "odd"
    odd.write_text("# lab: nodes=two\n")
    assert lab_directive(odd) is None
    assert lab_directive(tmp_path / "missing") is None


def test_lab_hostfile_dry_run_shows_a_two_node_pdsh_launch(capsys):
    status = main(["run", "--model", "tiny", "--strategy", "zero2",
                   "--hosts", str(HOSTFILE_DIR / "lab-2node"), "--dry-run"])  # fmt: skip
    out = capsys.readouterr().out
    assert status == 0
    assert "world size 2 on 10.200.0.1(1), 10.200.0.2(1)" in out
    assert "--launcher pdsh" in out and "--no_ssh_check" in out
