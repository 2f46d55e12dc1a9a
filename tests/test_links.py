"""Planted lab faults (SLOW_NODE, SLOW_LINK) and the doctor's link test: spelling and checks,
the pairing schedule, the slow-link rule, the probe on loopback, and both on a real lab."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from launchers import cli
from launchers.doctor import check, linkprobe, links
from launchers.doctor.transport import Reply, Route, probe_local
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


# ----------------------------------------------------------------------------- links: schedule


def _check_rounds(n: int, rounds: list[list[tuple[int, int]]]) -> set[tuple[int, int]]:
    """Each node at most once per round; the pairs, each seen once."""
    seen: set[tuple[int, int]] = set()
    for pairs in rounds:
        nodes = [x for pair in pairs for x in pair]
        assert len(nodes) == len(set(nodes)), f"a node twice in one round: {pairs}"
        assert all(0 <= x < n for x in nodes)
        for a, b in pairs:
            key = (min(a, b), max(a, b))
            assert key not in seen, f"pair {key} measured twice"
            seen.add(key)
    return seen


@pytest.mark.parametrize("n", range(2, 13))
def test_round_robin_covers_every_pair_once_with_each_node_once_per_round(n: int) -> None:
    rounds = links.round_robin(n)
    assert len(rounds) == (n - 1 if n % 2 == 0 else n)
    assert _check_rounds(n, rounds) == {(a, b) for a in range(n) for b in range(a + 1, n)}
    if n % 2 == 0:  # every node busy in every round
        assert all(len(pairs) == n // 2 for pairs in rounds)


@pytest.mark.parametrize("n", range(3, 20))
def test_ring_covers_the_ring_in_two_or_three_rounds(n: int) -> None:
    rounds = links.ring(n)
    assert len(rounds) == (2 if n % 2 == 0 else 3)
    ring_edges = {(min(i, (i + 1) % n), max(i, (i + 1) % n)) for i in range(n)}
    assert _check_rounds(n, rounds) == ring_edges


def test_schedule_switches_to_the_ring_above_the_limit() -> None:
    plan, rounds = links.schedule(8)
    assert plan.startswith("every pair") and len(rounds) == 7
    plan, rounds = links.schedule(9)
    assert plan.startswith("ring") and len(rounds) == 3
    assert links.schedule(4, all_pairs_max=3)[0].startswith("ring")


# ----------------------------------------------------------------------------- links: the rule


def _results(figures: dict[tuple[int, int], float]) -> list[links.LinkResult]:
    return [
        links.LinkResult(1, f"node{a}", f"node{b}", mbit, mbit * 1.02)
        for (a, b), mbit in figures.items()
    ]


def _all_pairs(n: int, rate: float, slow: dict[int, float] | None = None) -> list:
    """Every pair of ``n`` nodes at ``rate``, a pair with a slow node at the node's rate, with
    a deterministic scatter of up to +-8%."""
    slow = slow or {}
    figures = {}
    pairs = [(a, b) for a in range(n) for b in range(a + 1, n)]
    for k, (a, b) in enumerate(pairs):
        base = min([rate, *(slow[x] for x in (a, b) if x in slow)])
        figures[(a, b)] = base * (1 + 0.08 * ((k * 7) % 5 - 2) / 2)
    return _results(figures)


def test_rule_names_the_slow_node_and_its_links_only() -> None:
    results = _all_pairs(4, 95.0, {3: 24.0})
    j = links.judge(results)
    assert j.slow_nodes == ("node3",)
    slow = {(r.a, r.b) for r, v in zip(results, j.verdicts, strict=True) if v == "slow"}
    assert slow == {("node0", "node3"), ("node1", "node3"), ("node2", "node3")}
    assert j.reference_mbit is not None and 85 < j.reference_mbit < 105


def test_rule_names_none_on_healthy_scatter() -> None:
    for n in (3, 4, 8):
        j = links.judge(_all_pairs(n, 95.0))
        assert set(j.verdicts) == {"ok"} and j.slow_nodes == ()


def test_rule_names_a_half_rate_link_and_two_slow_nodes_of_eight() -> None:
    j = links.judge(_all_pairs(8, 95.0, {2: 47.0, 5: 10.0}))
    assert j.slow_nodes == ("node2", "node5")
    results = _all_pairs(8, 95.0, {2: 47.0, 5: 10.0})
    slow = [r for r, v in zip(results, j.verdicts, strict=True) if v == "slow"]
    assert all("node2" in (r.a, r.b) or "node5" in (r.a, r.b) for r in slow)
    assert len(slow) == 7 + 7 - 1


def test_rule_one_link_has_nothing_to_compare_with_and_a_missing_figure_fails() -> None:
    assert links.judge(_results({(0, 1): 95.0})).verdicts == ("n/a",)
    results = [*_all_pairs(3, 95.0), links.LinkResult(2, "node0", "node9", None, 90.0, "x")]
    assert links.judge(results).verdicts[-1] == "fail"


def test_report_states_the_rule_and_names_the_links() -> None:
    results = tuple(_all_pairs(4, 95.0, {3: 24.0}))
    report = links.LinkReport(tuple(f"node{i}" for i in range(4)), "every pair", 3, results, 8.9)
    text = report.render()
    assert not report.ok
    assert "median over nodes of each node's fastest link" in text and "0.6 x" in text
    assert "slow link node0 - node3:" in text and "node3: all 3 of its links are slow" in text
    assert "slow link node0 - node1" not in text
    ok = links.LinkReport(report.nodes, "every pair", 3, tuple(_all_pairs(4, 95.0)), 8.9)
    assert ok.ok and "every link measured is within the rule" in ok.render()


# ----------------------------------------------------------------------------- links: measuring


def test_measure_maps_each_direction_to_its_pair(monkeypatch: pytest.MonkeyPatch) -> None:
    """What node b received in a round is a -> b; what a received is b -> a."""
    hosts = ["h0", "h1", "h2", "h3"]

    def fake(route: Route, host: str, argv: list[str]) -> Reply:
        request = json.loads(argv[-1])
        me = hosts.index(host)
        rounds = [
            {"round": r, "peer": p, "rx_mbit": 10.0 * hosts.index(p) + me if p else None}
            for r, p in enumerate(request["peers"])
        ]
        return Reply(True, {"rounds": rounds})

    monkeypatch.setattr(links, "run_on", fake)
    report = links.measure(hosts, hosts, Route("ssh"), "python3")
    assert len(report.results) == 6 and report.rounds == 3
    for r in report.results:
        a, b = hosts.index(r.a), hosts.index(r.b)
        assert r.ab_mbit == 10.0 * a + b and r.ba_mbit == 10.0 * b + a


def test_link_probe_between_three_loopback_addresses(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real probe, one process per node on 127.0.0.1-3 (each listening on its own address):
    every pair measured with a rate, the idle round of an odd count kept in step."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    hosts = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]

    def local(route: Route, host: str, argv: list[str]) -> Reply:
        request = json.loads(argv[-1]) | {"bind": host}
        return probe_local([*argv[:-1], json.dumps(request)])

    monkeypatch.setattr(links, "run_on", local)
    report = links.measure(hosts, hosts, Route("local"), sys.executable, port=port, stream_s=0.4)
    assert report.rounds == 3 and len(report.results) == 3
    for r in report.results:
        assert r.error == "" and r.ab_mbit and r.ba_mbit and r.ab_mbit > 10, r


def test_link_probe_says_when_it_cannot_listen() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        facts = linkprobe.run({"peers": ["127.0.0.2"], "port": port, "bind": "127.0.0.1"})
    assert f"cannot listen on ports {port}-{port}" in facts["error"]
    assert "--links-port" in facts["error"]


# ----------------------------------------------------------------------------- links: real lab


def _lab_links(slow_link: str | None) -> links.LinkReport:
    faults = lab_faults(None, slow_link, "100mbit", 4, None)
    with Lab(4, LinkShape(100.0), ssh=False, faults=faults) as lab:
        route = Route("lab-netns", {}, lab, "lab")
        names = [n.name for n in lab.nodes]
        return links.measure([n.address for n in lab.nodes], names, route, sys.executable)


@pytest.mark.root
def test_lab_link_test_names_the_quarter_rate_node_and_no_other() -> None:
    ok, why = lab_available(ssh=False)
    if not ok:
        pytest.skip(why)
    report = _lab_links("node3:25mbit")
    j = report.judgement
    assert j.slow_nodes == ("node3",), report.render()
    for r, v in zip(report.results, j.verdicts, strict=True):
        assert (v == "slow") == ("node3" in (r.a, r.b)), report.render()
        if v == "slow":  # TCP payload of a 25 Mbit/s link: 1448/1514 of it
            assert r.mbit is not None and 18 < r.mbit < 25.5, report.render()
    assert report.seconds < 30
    clean = _lab_links(None)
    assert clean.ok and clean.judgement.slow_nodes == (), clean.render()


def test_doctor_links_on_one_host_says_there_is_no_link(capsys: pytest.CaptureFixture[str]) -> None:
    status = check.main(["--links", "--device", "cpu"])
    out = capsys.readouterr().out
    assert "links: n/a: one host, no link to measure" in out
    assert status in (0, 1)  # the node table's own verdict; the link test adds nothing here
