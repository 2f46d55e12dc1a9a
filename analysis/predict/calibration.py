"""Calibration of the time model from measured runs: link fits (netbench.json, the runs'
communication timers, else the link rate) and compute fits per compute kind (DeepSpeed's
fwd / bwd_inner / step timers per GFLOP of the rank's work). See ``analysis.predict``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from analysis.metrics.repeats import random_effects, set_key, within_variance
from analysis.metrics.rows import RunMetrics
from analysis.runs.load import LoadedRun
from analysis.theory import comm
from analysis.theory.costs import (
    ComputeKind,
    compute_kind,
    flops_per_microbatch,
    updated_parameters,
)
from analysis.theory.formulas import LINK_EFFICIENCY, backward_factor, layer_macs
from analysis.theory.setup import RunSetup

MS_PER_MB_AT_1MBIT = 8000.0
"""8 bits x 1e6 bytes / 1e6 bit/s = 8 s = 8000 ms per MB at 1 Mbit/s: divide by the rate."""

_NETBENCH_OPS = {"send_recv": "sendrecv"}
"""analysis.theory.comm op names -> netbench.json op names where they differ."""


# ---------------------------------------------------------------------------- calibration


@dataclass(frozen=True)
class Observation:
    """What one measured run contributes to a calibration."""

    name: str
    """Run name."""
    setup: RunSetup
    """Resolved setup."""
    iter_ms: float
    """Measured steady-state ms per iteration."""
    fwd_ms: float | None = None
    """DeepSpeed ``fwd`` per iteration (sum over micro-steps)."""
    bwd_ms: float | None = None
    """DeepSpeed ``bwd_inner`` per iteration."""
    optimizer_ms: float | None = None
    """``step`` minus ``optimizer_allgather``."""
    comm_timer_ms: float | None = None
    """``bwd_allreduce + optimizer_allgather`` when they isolate the data-parallel collectives."""
    other_ms: float | None = None
    """Iteration time not covered by any timer."""
    netbench: dict[str, Any] | None = None
    """netbench.json of the run directory."""
    ci_half_ms: float | None = None
    """Half-width of the 95% interval of ``iter_ms`` (None with one window): between-run when
    ``repeats`` > 1."""
    repeats: int = 1
    """Runs of one spec averaged into this observation (``collapse_repeats``)."""
    timer_busbw: tuple[tuple[str, float], ...] = ()
    """(netbench op, busbw Gbit/s) of the collectives this run's DeepSpeed timers isolate:
    ``all_reduce`` from ``bwd_allreduce``, ``all_gather`` from ``optimizer_allgather``."""


def observe(run: LoadedRun, row: RunMetrics) -> Observation | None:
    """The observation of a completed, timed run with a known layout; None otherwise."""
    s = run.setup
    if row.iter_ms_mean is None or run.status != "completed":
        return None
    if None in (s.num_layers, s.hidden_size, s.seq_length, s.padded_vocab_size, s.tp, s.pp):
        return None
    if s.dp is None or s.zero_stage is None or s.gas is None:
        return None
    comm_ok = row.comm_ms is not None and "comm_ms" not in row.na_reasons
    # PipelineEngine timers are the first stage's only (and its untimed remainder holds the
    # tied-embedding all-reduce): they do not calibrate the busiest stage's compute.
    flat = (s.pp or 1) == 1
    return Observation(
        name=run.name,
        setup=s,
        iter_ms=row.iter_ms_mean,
        fwd_ms=row.fwd_ms if flat else None,
        bwd_ms=row.bwd_ms if flat else None,
        optimizer_ms=row.optimizer_ms if flat else None,
        comm_timer_ms=row.comm_ms if comm_ok and flat else None,
        other_ms=row.other_ms if flat else None,
        netbench=run.netbench,
        ci_half_ms=(row.iter_ms_ci95_hi - row.iter_ms_mean) if row.iter_ms_ci95_hi else None,
        timer_busbw=_timer_busbw(row) if flat else (),
    )


def _timer_busbw(row: RunMetrics) -> tuple[tuple[str, float], ...]:
    """The run's own busbw per collective from its DeepSpeed timers (``RunMetrics``)."""
    pairs = (("all_reduce", row.busbw_gbps_timers), ("all_gather", row.busbw_gbps_timers_allgather))
    return tuple((op, bw) for op, bw in pairs if bw)


@dataclass(frozen=True)
class ComputeFit:
    """Compute calibration of one kind."""

    kind: ComputeKind
    """Which layouts it applies to."""
    fwd_ms_per_gflop: float
    """Forward ms per GFLOP of the rank's work (pooled: sum of ms / sum of GFLOP)."""
    bwd_ms_per_gflop: float
    """Backward ms per forward-GFLOP (backward does 2x the forward FLOPs), for a backward
    without recompute (a recompute run's backward is divided by ``backward_factor``)."""
    optimizer_ms_per_mparam: float
    """Optimizer step ms per million parameters updated by the rank."""
    other_ms: float
    """Untimed ms per iteration (mean over the runs)."""
    runs: tuple[str, ...]
    """Runs it was fitted on."""
    fwd_ms_per_layer_mb: float
    """Forward ms per layer and micro-batch of the first calibration run's model (for reading)."""
    bwd_ms_per_layer_mb: float
    """Backward ms per layer and micro-batch, same model."""
    cpu_share: float | None = None
    """Cores per rank the figures are for (``cpu_share`` of the first run; the others' times
    scaled to it), None when a run's nodes had no known CPU budget (then nothing is scaled)."""


def cpu_share(setup: RunSetup) -> float | None:
    """Cores one rank may use: its node's CPU budget over the node's ranks, at most 1 (a rank
    computes on one thread); None without a known budget (``RunSetup.node_cpus``)."""
    if not setup.node_cpus or not setup.nodes or not setup.world_size:
        return None
    return min(1.0, setup.node_cpus * setup.nodes / setup.world_size)


def compute_scale(from_share: float | None, setup: RunSetup) -> float:
    """Factor from compute measured at ``from_share`` cores per rank to ``setup``'s (1 when
    either is unknown): compute bound by a CPU budget takes 1/share as long."""
    to_share = cpu_share(setup)
    return from_share / to_share if from_share and to_share else 1.0


@dataclass(frozen=True)
class LinkFit:
    """Cost of collectives over one kind of link."""

    link: comm.Link
    """``intra-node`` (loopback/shared memory) or ``inter-node``."""
    rate_mbit: float | None
    """Link rate at which it was measured (None on one machine)."""
    alpha_ms: float
    """Per-call latency, ms (0 when the runs cannot separate it from the per-byte time)."""
    host_ms_per_mb: float
    """Per wire-MB cost that does not depend on the link rate (all of it on one machine)."""
    efficiency: float | None
    """Wire efficiency e: the fraction of the link rate large transfers reach (inter-node)."""
    source: str
    """Where the figures come from, with the numbers."""
    netbench: tuple[tuple[str, int, float], ...] = ()
    """(op, bytes, busbw Gbit/s) measured at ``rate_mbit``, when netbench.json exists."""
    op_efficiency: tuple[tuple[str, float], ...] = ()
    """(netbench op, e) from its large-message busbw (netbench only; see ``_op_efficiency``)."""
    host_calls: tuple[tuple[str, int, float], ...] = ()
    """(op, bytes, mean ms per call) with the links unshaped, each call after a pause
    (netbench.json ``host_time``, a lab session's): the hosts' own time per call, which the wire
    hides."""

    def ms_per_mb(self, rate_mbit: float | None) -> float:
        """host + 8000 / (e x R) ms per wire MB (host only on one machine)."""
        if self.link != "inter-node" or rate_mbit is None or not self.efficiency:
            return self.host_ms_per_mb
        return self.host_ms_per_mb + MS_PER_MB_AT_1MBIT / (self.efficiency * rate_mbit)

    def efficiency_of(self, op: str) -> float | None:
        """Wire efficiency of one collective (its own large-message figure, else the link's)."""
        name = _NETBENCH_OPS.get(op, op)
        return dict(self.op_efficiency).get(name, self.efficiency)

    def time_ms(self, c: comm.Collective, rate_mbit: float | None) -> float:
        """ms per iteration of a collective at ``rate_mbit`` (count x per-call time)."""
        per_call_mb = c.wire_bytes_per_rank / max(c.count_per_iter, 1) / 1e6
        busbw = _netbench_busbw(self.netbench, c.op, c.size_bytes)
        if busbw is not None:
            # busbw = wire bytes / t (nccl-tests): t at the measured rate splits into the wire
            # part (line rate x e of this collective) and the rest (per-call latency, host
            # copies: >= 0); the wire part is re-evaluated at the target rate, the rest kept.
            # Bytes in netbench's own convention (nccl-tests ring factor of the op as named),
            # which is how its busbw was computed; gloo's heavier reduce-scatter shows in its
            # lower busbw there, so the wire bytes of the plan are not used here.
            bus_mb = comm.ring_factor(c.op, c.group_size) * c.size_bytes / 1e6
            t1 = bus_mb * 8 / busbw
            eff = self.efficiency_of(c.op)
            host = _interp_log(self.host_calls, c.op, c.size_bytes)
            if host is not None and self.link == "inter-node" and rate_mbit and self.rate_mbit:
                # The hosts' time per call and the wire's overlap (gloo sends while it copies
                # and reduces; a node waits on the wire with its CPU idle): a call costs the
                # larger of the two. At the measured rate the call was wire-bound when its
                # bytes at e x R took longer than the host time: then all of its measured time
                # scales with 1/R; else its wire time is those bytes at e x R (or the measured
                # time, if shorter).
                wire1 = bus_mb * MS_PER_MB_AT_1MBIT / ((eff or 1.0) * self.rate_mbit)
                wire1 = t1 if wire1 >= host else min(t1, wire1)
                return c.count_per_iter * max(host, wire1 * self.rate_mbit / rate_mbit)
            if self.link == "inter-node" and rate_mbit and self.rate_mbit and eff:
                wire1 = min(t1, bus_mb * MS_PER_MB_AT_1MBIT / (eff * self.rate_mbit))
                t1 = t1 - wire1 + wire1 * self.rate_mbit / rate_mbit
            return c.count_per_iter * t1
        return c.count_per_iter * (self.alpha_ms + per_call_mb * self.ms_per_mb(rate_mbit))


def _netbench_busbw(
    table: tuple[tuple[str, int, float], ...], op: str, size: float
) -> float | None:
    """busbw (Gbit/s) interpolated linearly in log(size) between netbench sizes (clamped)."""
    return _interp_log(table, op, size)


def _interp_log(table: tuple[tuple[str, int, float], ...], op: str, size: float) -> float | None:
    """A netbench figure of ``op`` interpolated linearly in log(size) (clamped at the ends)."""
    name = _NETBENCH_OPS.get(op, op)
    points = sorted((b, v) for o, b, v in table if o == name and v > 0)
    if not points or size <= 0:
        return None
    sizes, values = zip(*points, strict=True)
    return float(np.interp(math.log(size), np.log(sizes), values))


@dataclass(frozen=True)
class Calibration:
    """Everything the model learned from measured runs."""

    compute: dict[str, ComputeFit]
    """Compute fit per kind (only kinds that had timed runs)."""
    intra: LinkFit | None
    """One-machine collectives."""
    inter: LinkFit | None
    """Inter-node collectives (None when no run crossed nodes and no rate is known)."""
    observations: tuple[Observation, ...]
    """The runs (anchors for same-layout predictions)."""
    assumptions: tuple[str, ...]
    """What the fits assume, in words."""


def _dp_timer_points(obs: Sequence[Observation]) -> list[tuple[Observation, float, int, str]]:
    """(run, wire MB, calls, link) for runs whose comm timers isolate the DP collectives."""
    out = []
    for o in obs:
        if o.comm_timer_ms is None or o.comm_timer_ms <= 0 or (o.setup.tp or 1) > 1:
            continue
        if (o.setup.zero_stage or 0) == 3:
            continue
        cplan, _ = comm.plan(o.setup)
        if cplan is None:
            continue
        dp = [c for c in cplan.collectives if c.group == "dp"]
        if not dp:
            continue
        mb = sum(c.wire_bytes_per_rank for c in dp) / 1e6
        out.append((o, mb, sum(c.count_per_iter for c in dp), dp[0].link))
    return out


LARGE_MESSAGE_BYTES = 1 << 20
"""Messages from this size on measure the wire efficiency of a collective (``_op_efficiency``)."""


def _op_efficiency(
    table: tuple[tuple[str, int, float], ...], rate_mbit: float
) -> tuple[tuple[str, float], ...]:
    """Per collective, e = busbw / link rate at its largest measured message (>= 1 MiB).

    Large messages, not the best of all sizes: below a token-bucket shaper's burst a small
    message leaves at the host's speed and its busbw can exceed the link rate, which says
    nothing of the rate a transfer sustains. Each collective keeps its own figure: gloo's
    all-gather sustains less of the link than its all-reduce at every rate (the training
    timers agree), and that shortfall scales with 1/R, so it belongs to the wire part.
    """
    out = []
    for op in sorted({o for o, _, _ in table}):
        points = sorted((b, bw) for o, b, bw in table if o == op and bw > 0)
        large = [bw for b, bw in points if b >= LARGE_MESSAGE_BYTES]
        if large:
            out.append((op, min(1.0, large[-1] * 1000 / rate_mbit)))
    return tuple(out)


def _with_timer_efficiency(
    op_eff: tuple[tuple[str, float], ...], obs: Sequence[Observation], rate_mbit: float
) -> tuple[tuple[str, float], ...]:
    """Per collective, the larger of the benchmark's e and the training runs' own (their
    DeepSpeed timers' busbw / link rate, mean over the runs across nodes at that rate).

    Both are lower bounds on what the wire sustains: each figure includes the host's stalls (a
    timer also the wait for the slowest rank). The larger one is the tighter bound. They differ
    most where the benchmark's back-to-back large messages lose more of the link than training's
    one bucket per step does (lab, 100 Mbit/s: all-reduce 0.67 of the link in netbench, 0.85 in
    bwd_allreduce); the rate-dependent share of every collective's time is the bytes at e x R,
    so a low e would move too much of the measured time with the rate.
    """
    timers: dict[str, list[float]] = {}
    for o in obs:
        if (o.setup.nodes or 1) > 1 and o.setup.link_mbit == rate_mbit:
            for op, bw in o.timer_busbw:
                timers.setdefault(op, []).append(bw * 1000 / rate_mbit)
    out = dict(op_eff)
    for op, values in timers.items():
        if op in out:
            out[op] = min(1.0, max(out[op], statistics.fmean(values)))
    return tuple(sorted(out.items()))


def _netbench_table(nb: dict[str, Any]) -> tuple[tuple[str, int, float], ...]:
    rows = []
    for r in nb.get("results") or []:
        if isinstance(r.get("bytes"), int) and isinstance(r.get("busbw_gbps"), int | float):
            rows.append((str(r.get("op")), int(r["bytes"]), float(r["busbw_gbps"])))
    return tuple(rows)


def _host_table(nb: dict[str, Any]) -> tuple[tuple[str, int, float], ...]:
    """(op, bytes, mean ms per call) of netbench.json's ``host_time`` (links unshaped).

    The mean, not the median: on a lab node a call after a pause takes either well under a
    millisecond or a scheduler tick more (about 4 ms here), and the median lands on one or the
    other from one session to the next; a training step pays the mean over its many calls."""
    host = nb.get("host_time")
    rows = []
    for r in (host.get("results") if isinstance(host, dict) else None) or []:
        ms = r.get("time_ms")
        if isinstance(r.get("bytes"), int) and isinstance(ms, int | float) and ms > 0:
            rows.append((str(r.get("op")), int(r["bytes"]), float(ms)))
    return tuple(rows)


def fit_links(obs: Sequence[Observation]) -> tuple[LinkFit | None, LinkFit | None, list[str]]:
    """Intra- and inter-node link fits (netbench first, then timers, then the link rate)."""
    notes: list[str] = []
    points = _dp_timer_points(obs)
    intra_pts = [(o, mb) for o, mb, _, link in points if link == "intra-node"]
    intra: LinkFit | None = None
    for o in obs:
        if o.netbench and (o.setup.nodes or 1) == 1 and _netbench_table(o.netbench):
            intra = LinkFit(
                "intra-node",
                None,
                0.0,
                0.0,
                None,
                f"netbench.json of {o.name}",
                _netbench_table(o.netbench),
            )
            break
    if intra is None and intra_pts:
        ms = sum(o.comm_timer_ms or 0.0 for o, _ in intra_pts)
        mb = sum(m for _, m in intra_pts)
        names = ", ".join(o.name for o, _ in intra_pts)
        intra = LinkFit(
            "intra-node",
            None,
            0.0,
            ms / mb,
            None,
            f"timers of {names}: {ms:,.1f} ms / {mb:,.2f} wire MB",
        )

    inter: LinkFit | None = None
    for o in obs:
        rate = o.setup.link_mbit
        table = _netbench_table(o.netbench) if o.netbench else ()
        if table and (o.setup.nodes or 1) > 1 and rate:
            bench = _op_efficiency(table, rate)
            op_eff = _with_timer_efficiency(bench, obs, rate)
            if op_eff:
                eff = dict(op_eff).get("all_reduce") or statistics.fmean(e for _, e in op_eff)
                raised = {op for op, e in op_eff if e > dict(bench).get(op, e)}
                per_op = ", ".join(
                    f"{op} {e:.2f}"
                    + (f" (run timers; netbench {dict(bench)[op]:.2f})" if op in raised else "")
                    for op, e in op_eff
                )
            else:  # no message of 1 MiB or more: nothing measured the sustained rate
                eff = LINK_EFFICIENCY
                per_op = f"no message >= 1 MiB measured, assumed e = {eff}"
            host = _host_table(o.netbench or {})
            host_note = (
                f"; each call costs the larger of its wire time and the hosts' own time per "
                f"call (netbench host_time, links unshaped, after a pause: {_host_summary(host)})"
                if host
                else "; no host-time benchmark (netbench.json host_time): a call's time beyond "
                "its wire time at the measured rate is taken as host time, added at every rate"
            )
            inter = LinkFit(
                "inter-node",
                rate,
                0.0,
                0.0,
                eff,
                f"netbench.json of {o.name} at {rate:g} Mbit/s: e = large-message busbw / link "
                f"rate, or the runs' own timer busbw where higher: {per_op}{host_note}",
                table,
                op_eff,
                host,
            )
            break
    inter_pts = [(o, mb) for o, mb, _, link in points if link == "inter-node" and o.setup.link_mbit]
    if inter is None and inter_pts:
        by_rate: dict[float, list[tuple[Observation, float]]] = {}
        for o, mb in inter_pts:
            by_rate.setdefault(o.setup.link_mbit or 0.0, []).append((o, mb))
        per_rate = {
            r: sum(o.comm_timer_ms or 0.0 for o, _ in p) / sum(m for _, m in p)
            for r, p in by_rate.items()
        }
        names = ", ".join(o.name for o, _ in inter_pts)
        if len(per_rate) >= 2:
            xs = [1.0 / r for r in per_rate]
            ys = list(per_rate.values())
            slope, host = statistics.linear_regression(xs, ys)
            if slope > 0 and host >= 0:
                eff = MS_PER_MB_AT_1MBIT / slope
                rate = max(per_rate)
                inter = _inter_fit(
                    rate,
                    host,
                    eff,
                    f"timers of {names} at {len(per_rate)} rates: ms/MB = "
                    f"{host:.2f} + 8000 / ({eff:.2f} R)",
                )
        if inter is None:
            rate = max(by_rate, key=lambda r: len(by_rate[r]))
            total = per_rate[rate]
            wire = MS_PER_MB_AT_1MBIT / (LINK_EFFICIENCY * rate)
            host, eff = total - wire, LINK_EFFICIENCY
            if host < 0:
                host, eff = 0.0, MS_PER_MB_AT_1MBIT / (total * rate)
            inter = _inter_fit(
                rate,
                host,
                eff,
                f"timers of {names} at {rate:g} Mbit/s: {total:.2f} ms/MB = "
                f"wire {MS_PER_MB_AT_1MBIT / (eff * rate):.2f} (e = {eff:.2f}) + host {host:.2f}",
            )
            if intra is not None and not intra.netbench:
                e_alt = MS_PER_MB_AT_1MBIT / max(total - intra.host_ms_per_mb, 1e-9) / rate
                notes.append(
                    f"cross-check: taking the one-machine cost ({intra.host_ms_per_mb:.2f} ms/MB) "
                    f"as the host part instead would give e = {e_alt:.2f}"
                )
    if inter is None:
        rates = sorted({o.setup.link_mbit for o in obs if o.setup.link_mbit})
        if rates:
            host = intra.host_ms_per_mb if intra and not intra.netbench else 0.0
            inter = LinkFit(
                "inter-node",
                rates[-1],
                0.0,
                host,
                LINK_EFFICIENCY,
                f"link rate {rates[-1]:g} Mbit/s (run.json network) with the assumed "
                f"efficiency {LINK_EFFICIENCY}; host {host:.2f} ms/MB from "
                "the one-machine runs",
            )
    notes.append(
        "per-call latency alpha = 0 unless netbench.json measured small messages: the runs' "
        "messages are all of similar size, so it cannot be separated from the per-MB time"
    )
    return intra, inter, notes


def _host_summary(host: tuple[tuple[str, int, float], ...]) -> str:
    """'all_reduce 64 KiB 3.9 ms, ...' for the sizes nearest 64 KiB and 4 MiB of each op."""
    parts = []
    for op in sorted({o for o, _, _ in host}):
        for target in (64 << 10, 4 << 20):
            b, ms = min(((b, ms) for o, b, ms in host if o == op), key=lambda p: abs(
                math.log(p[0] / target)))  # fmt: skip
            parts.append(f"{op} {b >> 10:,} KiB {ms:.2f} ms")
    return ", ".join(dict.fromkeys(parts))


def _inter_fit(rate: float, host: float, eff: float, source: str) -> LinkFit:
    """Inter-node fit without netbench: alpha 0 (not separable from the per-MB time)."""
    return LinkFit("inter-node", rate, 0.0, host, eff, source)


UNCALIBRATED = "no calibration for"
"""How :func:`comm_time` begins its reason when no fit covers a collective's link: ``no
calibration for <link> collectives (<op> <purpose>)``."""


def comm_time(
    setup: RunSetup,
    intra: LinkFit | None,
    inter: LinkFit | None,
    inside_timers_only: bool = False,
) -> tuple[float | None, str | None]:
    """Exposed communication ms per iteration of ``setup``'s plan; (None, reason) if unknown.

    ``inside_timers_only``: only the collectives DeepSpeed runs inside forward/backward (TP
    all-reduces, ZeRO-3 forward/backward gathers), to take them out of the compute timers.
    """
    cplan, why = comm.plan(setup)
    if cplan is None:
        return None, why
    total = 0.0
    for c in cplan.collectives:
        if inside_timers_only and not (
            c.group == "tp" or c.purpose.startswith(("parameters (forward", "parameters (back"))
        ):
            continue
        fit = inter if c.link == "inter-node" else intra
        if c.link == "unknown":
            fit = inter if (setup.nodes or 1) > 1 else intra
        if fit is None:
            return None, f"{UNCALIBRATED} {c.link} collectives ({c.op} {c.purpose})"
        total += fit.time_ms(c, setup.link_mbit)
    return total, None


def fit_compute(
    obs: Sequence[Observation], intra: LinkFit | None, inter: LinkFit | None
) -> dict[str, ComputeFit]:
    """Per-kind compute fits from runs with DeepSpeed fwd/bwd_inner/step timers."""
    pools: dict[str, list[tuple[Observation, float, float]]] = {}
    for o in obs:
        if None in (o.fwd_ms, o.bwd_ms, o.optimizer_ms, o.other_ms):
            continue
        gflop = flops_per_microbatch(o.setup)[0] / 1e9 * (o.setup.gas or 1)
        inside, _ = comm_time(o.setup, intra, inter, inside_timers_only=True)
        pools.setdefault(compute_kind(o.setup), []).append((o, gflop, inside or 0.0))
    fits: dict[str, ComputeFit] = {}
    for kind, pool in pools.items():
        shares = [cpu_share(o.setup) for o, _, _ in pool]
        share = shares[0] if None not in shares else None
        # Each run's busy time at the first run's cores per rank (1 without known budgets).
        k = [compute_scale(share, o.setup) ** -1 if share else 1.0 for o, _, _ in pool]
        # In-timer communication split by the layer's all-reduces: 2 forward + 2 backward, or
        # 2 + 4 with full recompute (the recomputed forward runs inside the backward timer).
        # Backward is counted per backward without recompute (formulas.backward_factor).
        fwd = bwd = 0.0
        for (o, _, inside), f in zip(pool, k, strict=True):
            recompute = bool(o.setup.activation_checkpointing)
            fwd_share = 1 / 3 if recompute else 1 / 2
            fwd += (o.fwd_ms or 0.0) * f - inside * fwd_share
            bwd += ((o.bwd_ms or 0.0) * f - inside * (1 - fwd_share)) / backward_factor(recompute)
        gflop = sum(g for _, g, _ in pool)
        fwd, bwd = max(fwd, 0.0), max(bwd, 0.0)
        mparams = sum(updated_parameters(o.setup) / 1e6 for o, _, _ in pool)
        opt = sum((o.optimizer_ms or 0.0) * f for (o, _, _), f in zip(pool, k, strict=True))
        opt /= mparams
        ref = pool[0][0].setup
        ref_gflop = 2 * layer_macs(ref.hidden_size or 0, ref.seq_length or 0, ref.ffn_hidden_size)
        ref_gflop *= (ref.micro_batch_size or 1) / 1e9
        fits[kind] = ComputeFit(
            kind=kind,  # type: ignore[arg-type]
            fwd_ms_per_gflop=fwd / gflop,
            bwd_ms_per_gflop=bwd / gflop,
            optimizer_ms_per_mparam=opt,
            other_ms=statistics.fmean(
                (o.other_ms or 0.0) * f for (o, _, _), f in zip(pool, k, strict=True)
            ),
            runs=tuple(o.name for o, _, _ in pool),
            fwd_ms_per_layer_mb=fwd / gflop * ref_gflop,
            bwd_ms_per_layer_mb=bwd / gflop * ref_gflop,
            cpu_share=share,
        )
    return fits


def calibrate(observations: Iterable[Observation]) -> Calibration:
    """Fit links, then compute (net of the in-timer communication), from measured runs."""
    obs = tuple(observations)
    intra, inter, notes = fit_links(obs)
    fits = fit_compute(obs, intra, inter)
    notes += [
        "no overlap of communication with compute: gloo collectives block, and DeepSpeed "
        "times the gradient all-reduce after backward (bwd_allreduce), not inside it",
        "compute scales with the model FLOPs of the busiest rank's work (layers of its stage, "
        "micro-batches, tokens, 1/TP), same device and precision as the calibration runs",
    ]
    return Calibration(fits, intra, inter, obs, tuple(notes))


def observations_from(runs: Sequence[LoadedRun], rows: Sequence[RunMetrics]) -> list[Observation]:
    """Observations of the runs that can calibrate (rows matched by path), the repeats of one
    spec collapsed into their mean (``collapse_repeats``)."""
    by_path = {r.path: r for r in rows}
    pairs = []
    for run in runs:
        row = by_path.get(run.path)
        o = observe(run, row) if row is not None else None
        if o is not None and row is not None:
            pairs.append((o, row))
    return collapse_repeats(pairs)


def _mean_timer_busbw(obs: Sequence[Observation]) -> tuple[tuple[str, float], ...]:
    """Per collective, the mean timer busbw over the runs that have one."""
    by_op: dict[str, list[float]] = {}
    for o in obs:
        for op, bw in o.timer_busbw:
            by_op.setdefault(op, []).append(bw)
    return tuple((op, statistics.fmean(v)) for op, v in sorted(by_op.items()))


def collapse_repeats(pairs: Sequence[tuple[Observation, RunMetrics]]) -> list[Observation]:
    """One observation per repeat set (``analysis.metrics.repeats.set_key``): every figure the mean
    over its runs, ``ci_half_ms`` the between-run half-width (``analysis.metrics.repeats``). A model
    calibrated on one run of a noisy machine learns that run's luck; the mean of the repeats is
    what the configuration costs there. Leave-one-out then leaves a whole set out, so a run is
    never predicted from its own repeats."""
    groups: dict[tuple[str, str], list[tuple[Observation, RunMetrics]]] = {}
    for o, row in pairs:
        groups.setdefault(set_key(row), []).append((o, row))
    out = []
    for members in groups.values():
        if len(members) == 1:
            out.append(members[0][0])
            continue
        obs = [o for o, _ in members]
        est = random_effects([o.iter_ms for o in obs], [within_variance(r) for _, r in members])

        def mean(attr: str, obs: list[Observation] = obs) -> float | None:
            values = [getattr(o, attr) for o in obs if getattr(o, attr) is not None]
            return statistics.fmean(values) if values else None

        out.append(
            replace(
                obs[0],
                iter_ms=est.mean,
                fwd_ms=mean("fwd_ms"),
                bwd_ms=mean("bwd_ms"),
                optimizer_ms=mean("optimizer_ms"),
                comm_timer_ms=mean("comm_timer_ms"),
                other_ms=mean("other_ms"),
                timer_busbw=_mean_timer_busbw(obs),
                netbench=next((o.netbench for o in obs if o.netbench), None),
                ci_half_ms=(est.ci_hi - est.ci_lo) / 2 if est.ci_hi and est.ci_lo else None,
                repeats=len(obs),
            )
        )
    return out
