"""Stragglers on a real lab matrix: the 4-node 100 Mbit/s lab's ``tiny-zero1`` with
``TIMERS=all`` (the schedule's ``forward-compute`` and ``backward-compute`` on), node2 given 0.1
core and the others 0.4 (``SLOW_NODE=node2:cpu=0.1 NODE_CPUS=0.4``), against the same run
without the fault. The fixtures are those runs' ``run.json`` and ``hostfile`` with the lines of
``launcher.log`` the analysis reads (launcher mapping, iteration lines, ``times across ranks``
blocks); docs/metrics.md, Stragglers, has the commands and the whole matrices."""

from __future__ import annotations

from pathlib import Path

import pytest

from analysis.metrics import stragglers
from analysis.report.build import build
from analysis.report.stragglers import verdict_text
from analysis.runs import load

FIXTURES = Path(__file__).parent / "fixtures" / "stragglers"


def _result(which: str) -> stragglers.StragglerResult:
    root = FIXTURES / which
    (run,) = load.discover(root)
    return stragglers.analyze(run, root)


def _slow_node(which: str) -> str:
    """node2's address in that lab (``run.json``'s network nodes: addresses are per lab)."""
    (run,) = load.discover(FIXTURES / which)
    assert run.record is not None and run.record.network is not None
    (node,) = [n for n in run.record.network.nodes if n.get("name") == "node2"]
    return f"node2 ({node['address']})"


def test_the_slow_nodes_rank_is_named_on_backward_compute_only() -> None:
    res = _result("slow")
    assert res.na is None
    named = {v.timer: (v.stragglers, v.straggler_nodes) for v in res.stragglers}
    assert named == {"backward-compute": ((2,), (_slow_node("slow"),))}
    text = verdict_text("tiny-zero1", res)
    assert text.startswith("tiny-zero1: **straggler**: rank 2 (node2 (")
    assert "on megatron backward-compute" in text


def test_the_timers_that_end_in_a_collective_show_it_on_no_rank_above_the_others() -> None:
    """``forward-compute`` ends in the loss all-reduce: the slow rank is the fastest there."""
    verdicts = {v.timer: v for v in _result("slow").verdicts}
    assert not verdicts["forward-backward"].stragglers
    fwd = verdicts["forward-compute"]
    assert not fwd.stragglers and fwd.slowest_rank != 2


def test_the_same_run_without_the_fault_names_none() -> None:
    res = _result("none")
    assert res.na is None and res.verdicts and not res.stragglers
    assert {v.timer for v in res.verdicts} >= {"forward-compute", "backward-compute"}
    text = verdict_text("tiny-zero1", res)
    assert text.startswith("tiny-zero1: no straggler: the ranks agree within ")


@pytest.mark.parametrize("which", ["slow", "none"])
def test_the_report_names_the_slow_node_in_its_summary_and_says_which_timers_cannot(
    which: str, tmp_path: Path
) -> None:
    build(FIXTURES / which, tmp_path / "report")
    md = (tmp_path / "report" / "report.md").read_text()
    summary = md.split("## Executive summary")[1].split("\n## ")[0]
    part = md.split("## Stragglers")[1].split("\n## ")[0]
    assert stragglers.COLLECTIVE_ENDS in part
    if which == "slow":
        assert f"**stragglers** in tiny-zero1: **straggler**: rank 2 ({_slow_node(which)})" in (
            summary
        )
    else:
        assert "**stragglers**" not in md
        assert "- tiny-zero1: no straggler: the ranks agree within " in part
