"""Planted lab faults (SLOW_NODE, SLOW_LINK): their spelling, their checks, and a real lab."""

from __future__ import annotations

import subprocess

import pytest

from launchers import cli
from launchers.lab import cpu as labcpu
from launchers.lab.cluster import Lab
from launchers.lab.faults import (
    Faults,
    SlowLink,
    SlowNode,
    lab_faults,
    parse_slow_link,
    parse_slow_node,
)
from launchers.lab.net import LabError, LinkShape
from launchers.lab.session import lab_available

# ----------------------------------------------------------------------------- faults: spelling


def test_slow_node_and_link_parse() -> None:
    assert parse_slow_node("node2:cpu=0.25") == (SlowNode(2, 0.25),)
    assert parse_slow_node("node1:cpus=.5, node3:cpu=1") == (SlowNode(1, 0.5), SlowNode(3, 1.0))
    assert parse_slow_link("node3:10mbit") == (SlowLink(3, 10.0),)
    assert parse_slow_link("node0:500kbit,node1:1gbit") == (SlowLink(0, 0.5), SlowLink(1, 1000.0))
    assert parse_slow_node("") == () and parse_slow_link(None) == ()
    faults = lab_faults("node2:cpu=0.25", "node3:25mbit", "100mbit", 4, None)
    assert faults.label == "slow node node2:cpu=0.25, slow link node3:25mbit"
    assert not Faults() and faults


@pytest.mark.parametrize(
    ("slow_node", "slow_link", "message"),
    [
        ("node2", None, "SLOW_NODE 'node2' not understood: write node<i>:cpu=<cores>"),
        ("node2:cpu=0", None, "cores > 0"),
        ("2:cpu=0.25", None, "e.g. SLOW_NODE=node2:cpu=0.25"),
        (None, "node3:fast", "SLOW_LINK 'node3:fast' not understood"),
        (None, "node3:none", "SLOW_LINK 'node3:none' not understood"),
        (None, "node3", "SLOW_LINK 'node3' not understood"),
        ("node1:cpu=0.1,node1:cpu=0.2", None, "node1 is named twice"),
    ],
)
def test_fault_spelling_errors(slow_node: str | None, slow_link: str | None, message: str) -> None:
    with pytest.raises(LabError) as err:
        lab_faults(slow_node, slow_link, "100mbit", 4, None)
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("node4:cpu=0.1", None, "100mbit", 4, None), "the lab has 4 nodes (node0..node3"),
        ((None, "node9:10mbit", "100mbit", 4, None), "SLOW_LINK node9:10mbit: the lab has 4"),
        (("node2:cpu=0.5", None, "100mbit", 4, 0.5), "0.5 cores is not less than the other"),
        (("node2:cpu=0.1", None, "100mbit", 4, 0), "no CPU budget per node (NODE_CPUS=0)"),
        ((None, "node3:100mbit", "100mbit", 4, None), "is not slower than the other links'"),
        (("node2:cpu=0.1", None, None, 4, None), "planted in the emulated lab only: give NET"),
    ],
)
def test_faults_checked_against_the_lab(args: tuple, message: str) -> None:
    with pytest.raises(LabError) as err:
        lab_faults(*args)
    assert message in str(err.value)


def test_a_slow_link_on_an_unshaped_lab_is_allowed() -> None:
    faults = lab_faults(None, "node1:10mbit", "none", 2, None)
    assert faults.shape_of(1, LinkShape()) == LinkShape(10.0)
    assert faults.shape_of(0, LinkShape()) == LinkShape()


def test_fault_shapes_and_budgets_per_node() -> None:
    faults = lab_faults("node2:cpu=0.25", "node3:25mbit", "100mbit", 4, None)
    shape = LinkShape(100.0, delay_ms=2.0)
    assert faults.shape_of(3, shape) == LinkShape(25.0, delay_ms=2.0)
    assert faults.shape_of(2, shape) == shape
    assert faults.cpus_of(2, 0.5) == 0.25 and faults.cpus_of(3, 0.5) == 0.5
    names = [f"node{i}" for i in range(4)]
    assert faults.describe(names, LinkShape(100.0), 0.5) == [
        {"kind": "slow_node", "node": "node2", "spelling": "node2:cpu=0.25", "cpus": 0.25,
         "others_cpus": 0.5},
        {"kind": "slow_link", "node": "node3", "spelling": "node3:25mbit", "link_mbit": 25.0,
         "others_link_mbit": 100.0},
    ]  # fmt: skip


def test_lab_refuses_a_bad_fault_before_anything_is_made() -> None:
    """``Lab`` checks its faults in the constructor: no namespace, no root needed to see it."""
    with pytest.raises(LabError, match="the lab has 2 nodes"):
        Lab(2, LinkShape(100.0), faults=Faults(slow_links=(SlowLink(2, 10.0),)))


def test_cli_refuses_a_bad_fault_before_anything_starts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["matrix", "--model", "tiny", "--strategies", "baseline", "--net", "100mbit",
            "--lab-nodes", "4", "--slow-link", "node5:10mbit", "--dry-run"]  # fmt: skip
    assert cli.main(argv) == 2
    assert "SLOW_LINK node5:10mbit: the lab has 4 nodes" in capsys.readouterr().err


def test_a_fault_is_part_of_the_run_identity(capsys: pytest.CaptureFixture[str]) -> None:
    """A run with a planted fault is not a repeat of the same run without (the network label
    the spec hash covers names the fault)."""
    argv = ["run", "--model", "tiny", "--strategy", "baseline", "--net", "100mbit",
            "--lab-nodes", "4", "--slow-node", "node2:cpu=0.25", "--dry-run"]  # fmt: skip
    assert cli.main(argv) == 0
    with_fault = capsys.readouterr().out.split("(spec ")[1].split(")")[0]
    assert cli.main([*argv[:-3], "--dry-run"]) == 0
    without = capsys.readouterr().out.split("(spec ")[1].split(")")[0]
    assert with_fault != without


# ----------------------------------------------------------------------------- faults: real lab


@pytest.mark.root
def test_lab_plants_a_slow_node_and_a_slow_link() -> None:
    ok, why = lab_available(ssh=False)
    if not ok:
        pytest.skip(why)
    faults = lab_faults("node2:cpu=0.25", "node3:25mbit", "100mbit", 4, None)
    with Lab(4, LinkShape(100.0), ssh=False, faults=faults) as lab:
        doc = lab.describe()
        qdiscs = [
            subprocess.run(["tc", "-n", n.namespace, "qdisc", "show", "dev", n.interface],
                           capture_output=True, text=True, check=True).stdout
            for n in lab.nodes
        ]  # fmt: skip
        ports = [
            subprocess.run(["tc", "qdisc", "show", "dev", n.host_interface],
                           capture_output=True, text=True, check=True).stdout
            for n in lab.nodes
        ]  # fmt: skip
        budgets = {n.name: g.cpus for n, g in zip(lab.nodes, lab.cgroups, strict=True)}
    assert [f["node"] for f in doc["faults"]] == ["node2", "node3"]
    assert doc["link_mbit"] == 100.0
    for i, (uplink, downlink) in enumerate(zip(qdiscs, ports, strict=True)):
        want = "25Mbit" if i == 3 else "100Mbit"
        assert f"rate {want}" in uplink and f"rate {want}" in downlink, (i, uplink, downlink)
    if budgets:
        default = labcpu.default_node_cpus()
        assert budgets == {"node0": default, "node1": default, "node2": 0.25, "node3": default}
        assert doc["node_cpu"]["cpus"] == default
        assert doc["node_cpu"]["nodes"]["node2"]["cpus"] == 0.25
