"""Faults planted in the lab: a slow node (a smaller CPU budget, ``SLOW_NODE``) and a slow link
(one node's link shaped slower, ``SLOW_LINK``): their spelling, their check against the lab, and
how run.json records them.

``SLOW_NODE=node2:cpu=0.25`` gives node2 a CPU cgroup of 0.25 cores while the other nodes keep
the lab's budget (``NODE_CPUS``, default this machine's cores / 4); ``SLOW_LINK=node3:10mbit``
shapes node3's link (both directions) at 10 Mbit/s while the others keep ``NET``. Several faults
are comma separated: ``SLOW_LINK=node1:25mbit,node3:10mbit``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from analysis.theory.formulas import parse_rate
from launchers.lab.cpu import default_node_cpus
from launchers.lab.net import LabError, LinkShape

_SLOW_NODE_RE = re.compile(r"^node(?P<index>\d+):cpus?=(?P<cpus>\d+(?:\.\d*)?|\.\d+)$")
_SLOW_LINK_RE = re.compile(r"^node(?P<index>\d+):(?P<rate>\S+)$")


@dataclass(frozen=True)
class SlowNode:
    """One node with a smaller CPU budget than the others."""

    node: int
    """Index of the node (``node<i>``)."""
    cpus: float
    """Cores the node may use (its cgroup's CFS quota) instead of the lab's budget."""

    @property
    def spelling(self) -> str:
        """As ``SLOW_NODE`` writes it: ``node2:cpu=0.25``."""
        return f"node{self.node}:cpu={self.cpus:g}"


@dataclass(frozen=True)
class SlowLink:
    """One node whose link (uplink and downlink) is shaped slower than the others'."""

    node: int
    """Index of the node (``node<i>``)."""
    rate_mbit: float
    """The node's link rate, Mbit/s, each way."""

    @property
    def spelling(self) -> str:
        """As ``SLOW_LINK`` writes it: ``node3:10mbit``."""
        return f"node{self.node}:{LinkShape(self.rate_mbit).label}"


@dataclass(frozen=True)
class Faults:
    """The faults of one lab (none by default)."""

    slow_nodes: tuple[SlowNode, ...] = ()
    """Nodes with a smaller CPU budget."""
    slow_links: tuple[SlowLink, ...] = ()
    """Nodes with a slower link."""

    def __bool__(self) -> bool:
        return bool(self.slow_nodes or self.slow_links)

    @property
    def label(self) -> str:
        """What a run's network label adds: ``slow node2:cpu=0.25, slow link node3:10mbit``."""
        return ", ".join(
            [f"slow node {f.spelling}" for f in self.slow_nodes]
            + [f"slow link {f.spelling}" for f in self.slow_links]
        )

    def cpus_of(self, node: int, cpus: float) -> float:
        """Cores node ``node`` gets when the lab's budget is ``cpus``."""
        return next((f.cpus for f in self.slow_nodes if f.node == node), cpus)

    def shape_of(self, node: int, shape: LinkShape) -> LinkShape:
        """Node ``node``'s link shape when the lab's is ``shape`` (its delay and loss kept)."""
        rate = next((f.rate_mbit for f in self.slow_links if f.node == node), None)
        return shape if rate is None else replace(shape, rate_mbit=rate)

    def check(self, nodes: int, shape: LinkShape, cpus: float | None) -> None:
        """Raise LabError unless every fault names a node of a lab of ``nodes`` nodes and is
        slower than the rest of the lab (``shape``; ``cpus`` cores per node, None: no budget)."""
        names = f"node0..node{nodes - 1}"
        for kind, faults in (("SLOW_NODE", self.slow_nodes), ("SLOW_LINK", self.slow_links)):
            for fault in faults:
                if fault.node >= nodes:
                    raise LabError(
                        f"{kind} {fault.spelling}: the lab has {nodes} nodes ({names}, "
                        f"LAB_NODES={nodes}): name one of them, or raise LAB_NODES"
                    )
        for slow in self.slow_nodes:
            if cpus is None:
                raise LabError(
                    f"SLOW_NODE {slow.spelling}: the lab has no CPU budget per node (NODE_CPUS=0) "
                    "to be slower than: leave NODE_CPUS unset or give it a number of cores"
                )
            if not slow.cpus < cpus:
                raise LabError(
                    f"SLOW_NODE {slow.spelling}: {slow.cpus:g} cores is not less than the other "
                    f"nodes' {cpus:g} (NODE_CPUS): give it fewer cores, e.g. "
                    f"node{slow.node}:cpu={cpus / 2:g}"
                )
        for link in self.slow_links:
            if shape.rate_mbit is not None and not link.rate_mbit < shape.rate_mbit:
                raise LabError(
                    f"SLOW_LINK {link.spelling}: {link.rate_mbit:g} Mbit/s is not slower than "
                    f"the other links' {shape.label} (NET): give it a lower rate, e.g. "
                    f"node{link.node}:{LinkShape(shape.rate_mbit / 4).label}"
                )

    def describe(self, node_names: Sequence[str], shape: LinkShape, cpus: float | None) -> list:
        """run.json's ``network.faults``: one entry per fault, with what the other nodes have."""
        out: list[dict[str, Any]] = []
        for slow in self.slow_nodes:
            out.append({"kind": "slow_node", "node": node_names[slow.node],
                        "spelling": slow.spelling, "cpus": slow.cpus,
                        "others_cpus": cpus})  # fmt: skip
        for link in self.slow_links:
            out.append({"kind": "slow_link", "node": node_names[link.node],
                        "spelling": link.spelling, "link_mbit": link.rate_mbit,
                        "others_link_mbit": shape.rate_mbit})  # fmt: skip
        return out


def _entries(text: str | None) -> list[str]:
    return [part.strip() for part in (text or "").split(",") if part.strip()]


def _duplicates(kind: str, nodes: Sequence[int]) -> None:
    seen = {n for n in nodes if nodes.count(n) > 1}
    if seen:
        raise LabError(f"{kind}: node{min(seen)} is named twice: give each node one value")


def parse_slow_node(text: str | None) -> tuple[SlowNode, ...]:
    """``node2:cpu=0.25[,node1:cpu=0.5]`` (``SLOW_NODE``, ``--slow-node``); LabError if not."""
    out = []
    for part in _entries(text):
        match = _SLOW_NODE_RE.match(part)
        if match is None or not 0 < float(match["cpus"]) <= 1024:
            raise LabError(
                f"SLOW_NODE {part!r} not understood: write node<i>:cpu=<cores>, cores > 0, "
                "e.g. SLOW_NODE=node2:cpu=0.25"
            )
        out.append(SlowNode(int(match["index"]), float(match["cpus"])))
    _duplicates("SLOW_NODE", [f.node for f in out])
    return tuple(out)


def parse_slow_link(text: str | None) -> tuple[SlowLink, ...]:
    """``node3:10mbit[,node1:25mbit]`` (``SLOW_LINK``, ``--slow-link``); LabError if not."""
    out = []
    for part in _entries(text):
        match = _SLOW_LINK_RE.match(part)
        try:
            rate = parse_rate(match["rate"]) if match else None
        except ValueError:
            rate = None
        if match is None or rate is None:
            raise LabError(
                f"SLOW_LINK {part!r} not understood: write node<i>:<rate> with a rate like "
                "10mbit, 500kbit or 1gbit, e.g. SLOW_LINK=node3:10mbit"
            )
        out.append(SlowLink(int(match["index"]), rate))
    _duplicates("SLOW_LINK", [f.node for f in out])
    return tuple(out)


def parse_faults(slow_node: str | None, slow_link: str | None) -> Faults:
    """Both variables at once (either may be None or empty)."""
    return Faults(parse_slow_node(slow_node), parse_slow_link(slow_link))


def lab_faults(
    slow_node: str | None,
    slow_link: str | None,
    net: str | None,
    nodes: int,
    node_cpus: float | None,
) -> Faults:
    """The faults of a request (``--slow-node``, ``--slow-link``), checked against the lab it
    asks for (``--net``, ``--lab-nodes``, ``--node-cpus``: None the default budget, 0 none)
    before anything starts; LabError says what to change."""
    faults = parse_faults(slow_node, slow_link)
    if not faults:
        return faults
    if not net:
        raise LabError(
            f"SLOW_NODE/SLOW_LINK ({faults.label}): faults are planted in the emulated lab only: "
            "give NET=<rate> "
            "(--net), e.g. NET=100mbit LAB_NODES=4"
        )
    try:
        shape = LinkShape(parse_rate(net))
    except ValueError as exc:
        raise LabError(f"NET {net!r}: {exc}") from None
    cpus = default_node_cpus() if node_cpus is None else (node_cpus or None)
    faults.check(nodes, shape, cpus)
    return faults
