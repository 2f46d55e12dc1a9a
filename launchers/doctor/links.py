"""The doctor's link test: node pairs in rounds (each node in one pair per round), a TCP stream
each way per pair (``linkprobe``), the verdict that names links well below the others, and its
table.

``make doctor LINKS=1`` (``python -m launchers doctor --links``) measures every pair of nodes in
``n - 1`` rounds (round robin; ``n`` rounds for odd ``n``, each node idle in one) up to
:data:`ALL_PAIRS_MAX_NODES` nodes, and beyond that only the ring ``node i - node i+1`` (2 rounds,
3 for odd ``n``), so the test takes seconds. The pairs of a round run at once: with each node in
one pair, no link carries two tests. One command per node (``linkprobe``), started on every node
at once through the path the run uses (pdsh/ssh, or the lab's namespaces), runs all its rounds:
each pair starts a round together and sends a stream one way for :data:`STREAM_S` seconds, then
the other way, connecting to each node by its hostfile name.

The rule: a pair's figure is the slower of its two directions; the reference is the median over
nodes of each node's fastest link; a link is slow below :data:`SLOW_FRACTION` of the reference,
and a node all of whose links (two or more) are slow is named as their likely cause. A slow node
lowers only its own links, so the reference stays the healthy rate while fewer than half the
nodes are slow.
"""

from __future__ import annotations

import concurrent.futures
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from launchers.doctor import linkprobe
from launchers.doctor.transport import STYLES, Reply, Route, plain_text, run_on

SLOW_FRACTION = 0.6
"""A link below this fraction of the reference is slow. The links of a healthy 4-node lab at
100 Mbit/s read 94.2-95.7 Mbit/s (0.98-1.00 of their reference), and a link at half the rate (a
NIC negotiated down, a cable with half its lanes) must still be named: 0.6 leaves 40% for
scatter and names both."""

ALL_PAIRS_MAX_NODES = 8
"""Up to this many nodes every pair is measured (7 rounds at 8); beyond, the ring only."""

STREAM_S = 1.0
"""Seconds each node of a pair sends."""

WARMUP_S = 0.2
"""Seconds of each received stream left out (TCP slow start, a shaper's bucket)."""

CONNECT_TIMEOUT_S = 30.0
"""Seconds a node waits for its first peer (the nodes' commands start a little apart); each
round adds its own time."""

DEFAULT_PORT = 29511
"""First TCP port each node listens on during the test, one per round (``--links-port``)."""

Verdict = Literal["ok", "slow", "fail", "n/a"]
"""A link's verdict: ``slow`` and ``fail`` (no figure) refuse a run gated on links."""

Pair = tuple[int, int]
"""Two node indices."""


# --- which pairs, when ---------------------------------------------------------------------------


def round_robin(n: int) -> list[list[Pair]]:
    """Every pair of ``n`` nodes in rounds where each node is in at most one pair (the circle
    method: ``n - 1`` rounds for even ``n``, ``n`` for odd ``n``, each node idle in one)."""
    if n < 2:
        return []
    seats: list[int | None] = [*range(n), *([None] if n % 2 else [])]
    m = len(seats)
    rounds = []
    for _ in range(m - 1):
        pairs = [(seats[i], seats[m - 1 - i]) for i in range(m // 2)]
        rounds.append(
            sorted((min(a, b), max(a, b)) for a, b in pairs if a is not None and b is not None)
        )
        seats = [seats[0], seats[-1], *seats[1:-1]]
    return rounds


def ring(n: int) -> list[list[Pair]]:
    """The ring ``i - i+1`` (and ``n-1 - 0``) in rounds where each node is in at most one pair:
    2 rounds for even ``n``, 3 for odd ``n``."""
    if n < 3:
        return round_robin(n)
    edges = [(i, (i + 1) % n) for i in range(n)]
    if n % 2 == 0:
        return [edges[0::2], edges[1::2]]
    return [edges[0 : n - 1 : 2], edges[1 : n - 1 : 2], [edges[-1]]]


def schedule(n: int, all_pairs_max: int = ALL_PAIRS_MAX_NODES) -> tuple[str, list[list[Pair]]]:
    """``(plan, rounds)``: every pair up to ``all_pairs_max`` nodes, else the ring."""
    if n <= all_pairs_max:
        return "every pair (round robin)", round_robin(n)
    return f"ring (more than {all_pairs_max} nodes)", ring(n)


# --- the verdict ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class LinkResult:
    """One pair's measurement."""

    round: int
    """Round it was measured in (1-based)."""
    a: str
    """First node, as shown."""
    b: str
    """Second node, as shown."""
    ab_mbit: float | None
    """Rate ``a`` -> ``b`` (what ``b`` received), Mbit/s; None when not measured."""
    ba_mbit: float | None
    """Rate ``b`` -> ``a``, Mbit/s; None when not measured."""
    error: str = ""
    """Why a direction has no figure."""

    @property
    def mbit(self) -> float | None:
        """The pair's figure: the slower direction (None unless both were measured)."""
        if self.ab_mbit is None or self.ba_mbit is None:
            return None
        return min(self.ab_mbit, self.ba_mbit)


@dataclass(frozen=True)
class Judgement:
    """What the rule says about a set of link results."""

    reference_mbit: float | None
    """Median over nodes of each node's fastest link (None with fewer than two figures)."""
    verdicts: tuple[Verdict, ...]
    """One per result, in order."""
    slow_nodes: tuple[str, ...]
    """Nodes all of whose links (two or more) are slow."""


def judge(results: Sequence[LinkResult], fraction: float = SLOW_FRACTION) -> Judgement:
    """Apply the rule (module docstring) to ``results``."""
    measured = [r for r in results if r.mbit is not None]
    best: dict[str, float] = {}
    for r in measured:
        for node in (r.a, r.b):
            best[node] = max(best.get(node, 0.0), r.mbit or 0.0)
    reference = statistics.median(best.values()) if len(measured) >= 2 else None
    verdicts: list[Verdict] = []
    for r in results:
        if r.mbit is None:
            verdicts.append("fail")
        elif reference is None:
            verdicts.append("n/a")
        else:
            verdicts.append("slow" if r.mbit < fraction * reference else "ok")
    slow_nodes = []
    for node in best:
        mine = [v for r, v in zip(results, verdicts, strict=True) if node in (r.a, r.b)]
        if len(mine) >= 2 and all(v == "slow" for v in mine):
            slow_nodes.append(node)
    return Judgement(reference, tuple(verdicts), tuple(slow_nodes))


@dataclass(frozen=True)
class LinkReport:
    """The link test of one cluster."""

    nodes: tuple[str, ...]
    """Nodes as shown, in hostfile order."""
    plan: str
    """Which pairs were measured (every pair, or the ring)."""
    rounds: int
    """Rounds it took."""
    results: tuple[LinkResult, ...]
    """One per pair measured."""
    seconds: float
    """Wall time of the whole test."""
    stream_s: float = STREAM_S
    """Seconds each node of a pair sent."""
    fraction: float = SLOW_FRACTION
    """The rule's fraction of the reference."""

    @property
    def judgement(self) -> Judgement:
        """The rule applied to the results."""
        return judge(self.results, self.fraction)

    @property
    def ok(self) -> bool:
        """No slow link and none without a figure."""
        return all(v in ("ok", "n/a") for v in self.judgement.verdicts)

    def heading(self) -> str:
        """What was measured, how and how long it took."""
        return (
            f"links: {len(self.results)} pair(s) of {len(self.nodes)} nodes, {self.plan}, in "
            f"{self.rounds} round(s) with each node in one pair per round; a TCP stream one way "
            f"then the other, {self.stream_s:g} s each: {self.seconds:.1f} s"
        )

    def rule(self) -> str:
        """The rule, with this test's reference."""
        ref = self.judgement.reference_mbit
        if ref is None:
            return "rule: n/a: fewer than two links measured, nothing to compare a link with"
        return (
            f"rule: a pair's figure is its slower direction; reference {ref:.1f} Mbit/s = the "
            f"median over nodes of each node's fastest link; slow below {self.fraction:g} x "
            f"the reference ({self.fraction * ref:.1f} Mbit/s)"
        )

    def findings(self) -> list[str]:
        """One line per slow or failed link, then per node named."""
        j = self.judgement
        lines = []
        for r, v in zip(self.results, j.verdicts, strict=True):
            if v == "slow" and j.reference_mbit and r.mbit is not None:
                lines.append(
                    f"slow link {r.a} - {r.b}: {r.mbit:.1f} Mbit/s, "
                    f"{r.mbit / j.reference_mbit:.2f} of the reference {j.reference_mbit:.1f}"
                )
            elif v == "fail":
                lines.append(f"link {r.a} - {r.b} not measured: {r.error or 'no figure'}")
        for node in j.slow_nodes:
            count = sum(node in (r.a, r.b) for r in self.results)
            lines.append(
                f"{node}: all {count} of its links are slow: its own link (NIC, cable, switch "
                "port, or its CPU) is the likely cause"
            )
        return lines

    def show(self, console: Any = None) -> None:
        """Print the heading, the table (a row per pair), the rule and the findings."""
        console = console or Console(width=max(Console().width, 160))
        j = self.judgement
        table = Table()
        for column in ("round", "link", "a->b Mbit/s", "b->a Mbit/s", "figure", "/ reference",
                       "verdict"):  # fmt: skip
            table.add_column(column, justify="left" if column in ("link", "verdict") else "right")
        for r, v in zip(self.results, j.verdicts, strict=True):
            share = f"{r.mbit / j.reference_mbit:.2f}" if r.mbit and j.reference_mbit else "n/a"
            table.add_row(
                str(r.round),
                escape(f"{r.a} - {r.b}"),
                _mbit(r.ab_mbit),
                _mbit(r.ba_mbit),
                _mbit(r.mbit),
                share,
                f"[{STYLES['fail' if v == 'slow' else v]}]{v}[/]",
            )
        console.print(escape(self.heading()), soft_wrap=True)
        console.print(table)
        console.print(escape(self.rule()), soft_wrap=True)
        for line in self.findings():
            console.print(escape(line), soft_wrap=True)
        bad = sum(v in ("slow", "fail") for v in j.verdicts)
        console.print(
            "[green]every link measured is within the rule[/]"
            if not bad
            else f"[bold red]{bad} of {len(self.results)} link(s) slow or not measured[/]"
        )

    def render(self, width: int = 200) -> str:
        """:meth:`show` as plain text."""
        return plain_text(self.show, width)


def _mbit(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


# --- measuring -----------------------------------------------------------------------------------


def _round_rate(reply: Reply, number: int) -> tuple[float | None, str]:
    """The rate a node received in round ``number`` (0-based), or why there is none."""
    facts = reply.facts or {}
    rounds = facts.get("rounds") or []
    mine = rounds[number] if number < len(rounds) else {}
    if "rx_mbit" in mine:
        return float(mine["rx_mbit"]), ""
    said = [x for x in (facts.get("error"), mine.get("rx_error"), mine.get("tx_error")) if x]
    return None, "; ".join(str(x) for x in said) or reply.error or "no reply"


def measure(
    hosts: Sequence[str],
    labels: Sequence[str],
    route: Route,
    python: str,
    *,
    port: int = DEFAULT_PORT,
    stream_s: float = STREAM_S,
    all_pairs_max: int = ALL_PAIRS_MAX_NODES,
) -> LinkReport:
    """Measure the links between ``hosts`` (shown as ``labels``) through ``route``, with the
    interpreter at ``python`` on every node: one command per node for all the rounds
    (``linkprobe``), every node at once."""
    plan, rounds = schedule(len(hosts), all_pairs_max)
    peers: list[list[str | None]] = [[None] * len(rounds) for _ in hosts]
    first = [[False] * len(rounds) for _ in hosts]
    for number, pairs in enumerate(rounds):
        for a, b in pairs:
            peers[a][number], peers[b][number] = hosts[b], hosts[a]
            first[a][number] = True
    timeout_s = CONNECT_TIMEOUT_S + len(rounds) * 2 * (stream_s + WARMUP_S + 5)
    jobs = [
        linkprobe.command(python, {"peers": mine, "first": go, "port": port,
                                   "seconds": stream_s, "warmup_s": WARMUP_S,
                                   "timeout_s": timeout_s})
        for mine, go in zip(peers, first, strict=True)
    ]  # fmt: skip
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(64, len(hosts))) as pool:
        replies = list(pool.map(lambda host, argv: run_on(route, host, argv), hosts, jobs))
    seconds = time.monotonic() - started
    results = []
    for number, pairs in enumerate(rounds):
        for a, b in pairs:
            ba, why_a = _round_rate(replies[a], number)  # what a received from b
            ab, why_b = _round_rate(replies[b], number)
            why = [f"{labels[n]}: {w}" for n, w in ((a, why_a), (b, why_b)) if w]
            results.append(LinkResult(number + 1, labels[a], labels[b], ab, ba, "; ".join(why)))
    return LinkReport(tuple(labels), plan, len(rounds), tuple(results), seconds, stream_s)
