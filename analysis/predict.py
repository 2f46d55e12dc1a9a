"""Calibrated time and memory model: predictions for runs that were not made.

``python -m analysis.predict LOGDIR [--link 100mbit] [--nodes N] [--model small|large|L,H,S]
[--strategies ...] [--gpu-mem-gb G] [--json]``.

Time of one iteration (optimizer step) on the busiest rank, no overlap of communication and
compute (gloo on CPU blocks; the timers show the all-reduce after backward, not inside it):

    iter = compute + bubble + optimizer + other + exposed communication

- compute: forward and backward ms per GFLOP, calibrated per *compute kind* (``base``, ``tp``,
  ``zero3``) from DeepSpeed's ``fwd`` and ``bwd_inner`` timers (per step: sums over micro-steps)
  divided by the model FLOPs of the rank's work (``flops_per_microbatch``: Megatron's
  ``throughput_calculator`` count, layers of the busiest stage, 1/TP). Scaling by FLOPs scales by
  layers, micro-batches (GAS), tokens and 1/TP at once. A kind with no timed run borrows ``base``
  and says so.
- bubble: (p - 1) / (m + p - 1) of the pipeline time (p stages, m micro-batches): the bottleneck
  stage's per-micro-batch time times (p - 1) (GPipe/1F1B, UPSTREAM.md).
- optimizer: ms per million parameters updated by the rank (DeepSpeed ``step`` minus
  ``optimizer_allgather``), parameters of the busiest stage, / dp under ZeRO >= 1.
- other: iteration time not covered by any timer, a per-iteration constant (mean of the kind).
- communication: every collective of ``analysis.comm.plan`` (busiest rank, one direction: links
  are full duplex) costs ``count x (alpha + wire MB x (host + 8000 / (e x R)))`` ms, ``R`` the
  link in Mbit/s (8000 / R = ms per MB at line rate), ``e`` the wire efficiency, ``host`` the
  per-MB cost that does not depend on the link (copies and reductions in gloo/DeepSpeed). Sources,
  in order: netbench.json (busbw by op, interpolated in log size; e of each op = its busbw at
  the largest message / link rate), the
  runs' ``bwd_allreduce + optimizer_allgather`` timers against the plan's bytes (pooled ms / MB;
  with runs at two or more rates, host and e from a line in 1/R), else the link rate with the
  assumed efficiency ``LINK_EFFICIENCY``.

A run of the same model and layout measured elsewhere (another link or node count) is the best
calibration for itself: the prediction is then ``anchored``: its measured time minus its modelled
communication plus the modelled communication at the target. Otherwise it is built from the
components above. Memory per rank follows the ZeRO paper and Korthikanti et al. (see
``zero_state_bytes`` and ``activation_bytes_per_layer``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from analysis import comm, formulas
from analysis.formulas import (
    LINK_EFFICIENCY,
    bubble_fraction,
    gpt_parameters,
    layer_macs,
    model_table,
    padded_vocab_size,
    strategy_table,
    zero_state_bytes,
)
from analysis.load import MODEL_PRESETS, LoadedRun, RunSetup, derive_model_name, derive_strategy
from analysis.metrics import RunMetrics

ComputeKind = Literal["base", "tp", "zero3"]
"""Compute calibration classes: TP shards matmuls and adds in-layer all-reduces; ZeRO-3 adds
partitioning hooks to forward/backward and a heavier step; everything else computes alike."""

MS_PER_MB_AT_1MBIT = 8000.0
"""8 bits x 1e6 bytes / 1e6 bit/s = 8 s = 8000 ms per MB at 1 Mbit/s: divide by the rate."""

PROBE_RATES_MBIT = (100.0, 1000.0)
"""Two rates at which the (affine in 1/R) time model is evaluated to solve crossovers."""

_WHAT_IF_ORDER = ("baseline", "zero1", "zero2", "zero3", "pipeline", "tensor")
"""The core strategies in the order the what-if tables list them."""

STRATEGIES: dict[str, tuple[int, int, int]] = {
    name: (shape.tp, shape.pp, shape.zero_stage)
    for name in _WHAT_IF_ORDER
    if (shape := strategy_table()[name])
}
"""What-if strategies as (tp, pp, zero stage), read from ``megatron_configs/strategies.yaml``;
offload is not modelled (no run calibrates a CPU optimizer step)."""

GPT2_VOCAB = model_table()["small"].vocab_size
"""Vocabulary of the small/large presets (GPT-2 BPE, ``megatron_configs/small.yaml``), padded to
128 x tp by Megatron."""

_NETBENCH_OPS = {"send_recv": "sendrecv"}
"""analysis.comm op names -> netbench.json op names where they differ."""


# ---------------------------------------------------------------------------- formulas


def activation_bytes_per_layer(
    s: int, b: int, h: int, a: int, tp: int = 1, recompute: bool = False, precision: str = "bf16"
) -> float:
    """Activation memory of one transformer layer (Korthikanti et al. 2022, eq. 1-2).

    16-bit activations, no sequence parallelism: s b h (10 + 24 / t + 5 a s / (h t)) bytes;
    t = 1 gives s b h (34 + 5 a s / h). Full recompute keeps only the layer input: 2 s b h.
    fp32: every stored element doubles (an approximation that also doubles the 1-byte dropout
    masks, so it overstates by at most s b h (2 + a s / h) / 2).
    """
    per = 2.0 * s * b * h if recompute else s * b * h * (10 + 24 / tp + 5 * a * s / (h * tp))
    return per * (2 if precision == "fp32" else 1)


def stage_layers(setup: RunSetup) -> list[int]:
    """Transformer layers per pipeline stage (Megatron splits evenly)."""
    pp = setup.pp or 1
    return [(setup.num_layers or 0) // pp] * pp


def flops_per_microbatch(setup: RunSetup) -> tuple[float, int]:
    """Forward FLOPs of one micro-batch on the busiest rank, and that stage's index.

    2 x MACs x b / t for the stage's layers, plus the LM head (V h s MACs) on the last stage;
    backward is counted as 2x forward by the callers' calibration, not here.
    """
    h, s = setup.hidden_size or 0, setup.seq_length or 0
    b, tp, v = setup.micro_batch_size or 1, setup.tp or 1, setup.padded_vocab_size or 0
    per_stage = []
    layers = stage_layers(setup)
    for i, n in enumerate(layers):
        macs = n * layer_macs(h, s, setup.ffn_hidden_size)
        if i == len(layers) - 1:
            macs += float(v) * h * s
        per_stage.append(2.0 * macs * b / tp)
    busiest = max(range(len(per_stage)), key=lambda i: per_stage[i])
    return per_stage[busiest], busiest


def updated_parameters(setup: RunSetup) -> float:
    """Parameters the rank's optimizer step updates: its own, / dp under ZeRO >= 1."""
    psi = comm.rank_parameters(setup)
    return psi / (setup.dp or 1) if (setup.zero_stage or 0) >= 1 else float(psi)


def compute_kind(setup: RunSetup) -> ComputeKind:
    """Compute class of a layout."""
    if (setup.tp or 1) > 1:
        return "tp"
    if (setup.zero_stage or 0) == 3:
        return "zero3"
    return "base"


@dataclass(frozen=True)
class MemoryEstimate:
    """Memory per rank from the formulas (bytes); no fragmentation, buffers or runtime."""

    params_per_rank: int
    """Psi: parameters of the busiest model-parallel rank (stage and TP shard)."""
    state_bytes: float
    """Parameters, gradients and optimizer states (``zero_state_bytes``)."""
    activation_bytes: float
    """Activations held at the peak: layers of the stage x micro-batches in flight (1F1B: the
    first stage holds p, so p x l/p = l layers' worth), plus the fp32 logits 4 s b V / t."""
    formula: str
    """The formula with the numbers."""

    @property
    def total_bytes(self) -> float:
        """State + activations."""
        return self.state_bytes + self.activation_bytes


def memory_estimate(setup: RunSetup, precision: str | None = None) -> MemoryEstimate:
    """``zero_state_bytes`` + activations (``activation_bytes_per_layer``) for a setup."""
    prec = precision or setup.precision or "fp32"
    psi = comm.rank_parameters(setup)
    stage, nd = setup.zero_stage or 0, setup.dp or 1
    state = zero_state_bytes(psi, stage, nd, prec)
    s, b, h = setup.seq_length or 0, setup.micro_batch_size or 1, setup.hidden_size or 0
    a, tp, pp = setup.num_attention_heads or 1, setup.tp or 1, setup.pp or 1
    per_layer = activation_bytes_per_layer(
        s, b, h, a, tp, bool(setup.activation_checkpointing), prec
    )
    layers_held = stage_layers(setup)[0] * min(pp, setup.gas or 1)
    logits = 4.0 * s * b * (setup.padded_vocab_size or 0) / tp
    act = per_layer * layers_held + logits
    formula = (
        f"state {zero_state_bytes(1, stage, nd, prec):g} x Psi({psi:,}) = {state / 2**20:,.1f} "
        f"MiB ({prec} Adam, ZeRO-{stage}, Nd {nd}); activations {per_layer / 2**20:,.2f} MiB "
        f"per layer x {layers_held} layers + logits {logits / 2**20:,.2f} MiB"
    )
    return MemoryEstimate(psi, state, act, formula)


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
    )


@dataclass(frozen=True)
class ComputeFit:
    """Compute calibration of one kind."""

    kind: ComputeKind
    """Which layouts it applies to."""
    fwd_ms_per_gflop: float
    """Forward ms per GFLOP of the rank's work (pooled: sum of ms / sum of GFLOP)."""
    bwd_ms_per_gflop: float
    """Backward ms per forward-GFLOP (backward does 2x the forward FLOPs)."""
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


def _compute_scale(from_share: float | None, setup: RunSetup) -> float:
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
            if self.link == "inter-node" and rate_mbit and self.rate_mbit and eff:
                wire1 = min(t1, bus_mb * MS_PER_MB_AT_1MBIT / (eff * self.rate_mbit))
                t1 = t1 - wire1 + wire1 * self.rate_mbit / rate_mbit
            return c.count_per_iter * t1
        return c.count_per_iter * (self.alpha_ms + per_call_mb * self.ms_per_mb(rate_mbit))


def _netbench_busbw(
    table: tuple[tuple[str, int, float], ...], op: str, size: float
) -> float | None:
    """busbw (Gbit/s) interpolated linearly in log(size) between netbench sizes (clamped)."""
    name = _NETBENCH_OPS.get(op, op)
    points = sorted((b, bw) for o, b, bw in table if o == name and bw > 0)
    if not points or size <= 0:
        return None
    if size <= points[0][0]:
        return points[0][1]
    if size >= points[-1][0]:
        return points[-1][1]
    for (b0, w0), (b1, w1) in itertools.pairwise(points):
        if b0 <= size <= b1:
            x = math.log(size / b0) / math.log(b1 / b0)
            return w0 + x * (w1 - w0)
    return None


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


def _netbench_table(nb: dict[str, Any]) -> tuple[tuple[str, int, float], ...]:
    rows = []
    for r in nb.get("results") or []:
        if isinstance(r.get("bytes"), int) and isinstance(r.get("busbw_gbps"), int | float):
            rows.append((str(r.get("op")), int(r["bytes"]), float(r["busbw_gbps"])))
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
            op_eff = _op_efficiency(table, rate)
            if op_eff:
                eff = dict(op_eff).get("all_reduce") or statistics.fmean(e for _, e in op_eff)
                per_op = ", ".join(f"{op} {e:.2f}" for op, e in op_eff)
            else:  # no message of 1 MiB or more: nothing measured the sustained rate
                eff = LINK_EFFICIENCY
                per_op = f"no message >= 1 MiB measured, assumed e = {eff}"
            inter = LinkFit(
                "inter-node",
                rate,
                0.0,
                0.0,
                eff,
                f"netbench.json of {o.name} at {rate:g} Mbit/s: e = large-message busbw / link "
                f"rate: {per_op}",
                table,
                op_eff,
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
            slope, host = _line(xs, ys)
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


def _inter_fit(rate: float, host: float, eff: float, source: str) -> LinkFit:
    """Inter-node fit without netbench: alpha 0 (not separable from the per-MB time)."""
    return LinkFit("inter-node", rate, 0.0, host, eff, source)


def _line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares slope and intercept of y = intercept + slope x."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return slope, my - slope * mx


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
            return None, f"no calibration for {c.link} collectives ({c.op} {c.purpose})"
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
        k = [_compute_scale(share, o.setup) ** -1 if share else 1.0 for o, _, _ in pool]
        fwd = sum((o.fwd_ms or 0.0) * f for (o, _, _), f in zip(pool, k, strict=True))
        bwd = sum((o.bwd_ms or 0.0) * f for (o, _, _), f in zip(pool, k, strict=True))
        inside = sum(i for _, _, i in pool)
        gflop = sum(g for _, g, _ in pool)
        # In-timer communication split by the layer's 2 forward + 2 backward all-reduces.
        fwd, bwd = max(fwd - inside / 2, 0.0), max(bwd - inside / 2, 0.0)
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


def collapse_repeats(pairs: Sequence[tuple[Observation, RunMetrics]]) -> list[Observation]:
    """One observation per repeat set (``analysis.repeats.set_key``): every figure the mean
    over its runs, ``ci_half_ms`` the between-run half-width (``analysis.repeats``). A model
    calibrated on one run of a noisy machine learns that run's luck; the mean of the repeats is
    what the configuration costs there. Leave-one-out then leaves a whole set out, so a run is
    never predicted from its own repeats."""
    from analysis.repeats import random_effects, set_key, within_variance

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
                netbench=next((o.netbench for o in obs if o.netbench), None),
                ci_half_ms=(est.ci_hi - est.ci_lo) / 2 if est.ci_hi and est.ci_lo else None,
                repeats=len(obs),
            )
        )
    return out


# ---------------------------------------------------------------------------- prediction


@dataclass(frozen=True)
class Prediction:
    """Predicted time and memory of one setup, with how it was obtained."""

    label: str
    """Strategy and cluster, e.g. ``zero2 / 2 nodes, 2 ranks / 100 Mbit/s``."""
    setup: RunSetup
    """What was predicted."""
    iter_ms: float | None
    """Predicted ms per iteration (None with ``reason``)."""
    method: Literal["anchored", "components", "none"]
    """``anchored`` on a measured run of the same layout, or built from ``components``."""
    anchors: tuple[str, ...] = ()
    """Runs anchored on."""
    compute_ms: float | None = None
    """Forward + backward busy time of the bottleneck rank (components only)."""
    bubble_ms: float | None = None
    """Pipeline bubble (components only)."""
    optimizer_ms: float | None = None
    """Optimizer step (components only)."""
    other_ms: float | None = None
    """Untimed constant (components only)."""
    comm_ms: float | None = None
    """Exposed communication at the target."""
    memory: MemoryEstimate | None = None
    """Memory per rank from the formulas."""
    assumptions: tuple[str, ...] = ()
    """What this figure assumes."""
    reason: str | None = None
    """Why there is no figure, or what limits it."""
    uncertainty_ms: float | None = None
    """Measurement part of the uncertainty (anchored: the anchors' 95% half-widths, root mean
    square over anchors / sqrt(count)); None for components (model error dominates)."""


def _layout_key(s: RunSetup) -> tuple[Any, ...]:
    return (
        s.num_layers,
        s.hidden_size,
        s.num_attention_heads,
        s.seq_length,
        s.padded_vocab_size,
        s.micro_batch_size,
        s.global_batch_size,
        s.precision,
        s.tp,
        s.pp,
        s.dp,
        s.zero_stage,
        bool(s.offload),
        bool(s.activation_checkpointing),
    )


def label(setup: RunSetup) -> str:
    """``strategy / Nn x Wr / link``."""
    strat = setup.strategy or derive_strategy(setup.tp or 1, setup.pp or 1, setup.zero_stage or 0)
    rate = f"{setup.link_mbit:g} Mbit/s" if setup.link_mbit else "link unknown"
    where = "one machine" if (setup.nodes or 1) == 1 else rate
    return f"{strat} / {setup.nodes or '?'}n x {setup.world_size}r / {where}"


def predict(setup: RunSetup, cal: Calibration, exclude: Sequence[str] = ()) -> Prediction:
    """Predicted time (anchored when a same-layout run exists, else components) and memory."""
    mem = memory_estimate(setup) if comm.plan(setup)[0] is not None else None
    target_comm, why = comm_time(setup, cal.intra, cal.inter)
    if target_comm is None:
        return Prediction(label(setup), setup, None, "none", memory=mem, reason=why)
    base_notes: list[str] = []
    if (setup.nodes or 1) > 1 and cal.inter is not None and cal.inter.rate_mbit:
        base_notes.append(
            f"inter-node at {setup.link_mbit:g} Mbit/s: {cal.inter.ms_per_mb(setup.link_mbit):.2f}"
            f" ms per wire MB ({cal.inter.source})"
        )
    anchors = [
        o
        for o in cal.observations
        if o.name not in exclude and _layout_key(o.setup) == _layout_key(setup)
    ]
    same_cluster = [o for o in anchors if o.setup.nodes == setup.nodes]
    anchors = same_cluster or anchors  # the same cluster at another rate is the closest run
    estimates = []
    for o in anchors:
        own, _ = comm_time(o.setup, cal.intra, cal.inter)
        if own is not None:
            scale = _compute_scale(cpu_share(o.setup), setup)
            estimates.append((o.iter_ms - own) * scale + target_comm)
    if estimates:
        names = tuple(o.name for o in anchors)
        halves = [o.ci_half_ms for o in anchors if o.ci_half_ms is not None]
        unc = None
        if len(halves) == len(anchors):
            unc = math.sqrt(sum(h * h for h in halves)) / len(halves)
        return Prediction(
            label(setup),
            setup,
            statistics.fmean(estimates),
            "anchored",
            names,
            comm_ms=target_comm,
            memory=mem,
            assumptions=(
                f"measured {', '.join(names)} minus its modelled communication plus the "
                "modelled communication here",
                *base_notes,
            ),
            uncertainty_ms=unc,
        )
    kind = compute_kind(setup)
    fit = cal.compute.get(kind)
    notes = list(base_notes)
    if fit is None:
        fit = cal.compute.get("base")
        if fit is None:
            return Prediction(
                label(setup),
                setup,
                None,
                "none",
                memory=mem,
                reason="no run with DeepSpeed fwd/bwd_inner/step timers to calibrate compute: "
                "run the baseline with wall_clock_breakdown true",
            )
        notes.append(
            f"no {kind} run to calibrate its compute: borrowed the base fit (FLOPs / tp); "
            f"a measured {kind} run would replace this"
        )
    gflop, _ = flops_per_microbatch(setup)
    scale = _compute_scale(fit.cpu_share, setup)
    if scale != 1.0:
        notes.append(
            f"compute x {scale:.2f}: {fit.cpu_share:g} cores per rank in the calibration runs, "
            f"{cpu_share(setup):g} here (node CPU budget / ranks per node)"
        )
    per_mb = gflop / 1e9 * (fit.fwd_ms_per_gflop + fit.bwd_ms_per_gflop) * scale
    m, p = setup.gas or 1, setup.pp or 1
    compute = per_mb * m
    bubble = per_mb * (p - 1)
    opt = fit.optimizer_ms_per_mparam * updated_parameters(setup) / 1e6 * scale
    if p > 1:
        notes.append(
            f"pipeline: bubble (p-1)/(m+p-1) = {bubble_fraction(p, m):.3f}; 'other' taken from "
            "non-pipeline runs (the PipelineEngine prints no step timers)"
        )
    other = fit.other_ms * scale
    total = compute + bubble + opt + other + target_comm
    return Prediction(
        label(setup),
        setup,
        total,
        "components",
        (),
        compute,
        bubble,
        opt,
        other,
        target_comm,
        mem,
        (f"compute fit '{fit.kind}' from {', '.join(fit.runs)}", *notes),
    )


@dataclass(frozen=True)
class LooResult:
    """Leave-one-out: one measured run predicted from the others."""

    name: str
    """Run predicted."""
    measured_ms: float
    """Its measured steady-state ms per iteration."""
    prediction: Prediction
    """Prediction calibrated on the other runs."""
    repeats: int = 1
    """Runs whose mean ``measured_ms`` is."""

    @property
    def error(self) -> float | None:
        """(predicted - measured) / measured, signed."""
        if self.prediction.iter_ms is None:
            return None
        return (self.prediction.iter_ms - self.measured_ms) / self.measured_ms


def leave_one_out(observations: Sequence[Observation]) -> list[LooResult]:
    """Each run predicted from a calibration on the others with the same model and batch."""
    out = []
    for o in observations:
        same_model = [
            x
            for x in observations
            if x.name != o.name and _layout_key(x.setup)[:8] == _layout_key(o.setup)[:8]
        ]
        cal = calibrate(same_model)
        out.append(LooResult(o.name, o.iter_ms, predict(o.setup, cal), o.repeats))
    return out


def fill_rows(rows: Sequence[RunMetrics], loo: Sequence[LooResult]) -> list[RunMetrics]:
    """Rows with ``predicted_iter_ms`` and ``prediction_error`` (leave-one-out) filled; the
    error of a repeat is against the mean of its repeats."""
    by_name = {(r.name, r.prediction.setup.setup_key): r for r in loo}
    out = []
    for row in rows:
        na = dict(row.na_reasons)
        res = by_name.get((row.name, row.setup_key))
        if res is None or res.prediction.iter_ms is None:
            why = res.prediction.reason if res else None
            na["predicted_iter_ms"] = why or "not a completed timed run with a known layout"
            out.append(replace(row, na_reasons=na))
            continue
        p = res.prediction
        na["predicted_iter_ms"] = (
            f"leave-one-out ({p.method}"
            + (f" on {', '.join(p.anchors)}" if p.anchors else "")
            + "): calibrated on the other runs of this model"
            + (f"; error vs the mean of its {res.repeats} repeats" if res.repeats > 1 else "")
        )
        out.append(
            replace(row, predicted_iter_ms=p.iter_ms, prediction_error=res.error, na_reasons=na)
        )
    return out


# ---------------------------------------------------------------------------- what-if setups


def what_if(
    template: RunSetup,
    strategy: str,
    nodes: int,
    ranks_per_node: int,
    link_mbit: float | None,
    model: tuple[int, int, int, int] | None = None,
) -> RunSetup:
    """A setup like ``template`` with another strategy, cluster, link or model (l, h, a, s)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; valid: {', '.join(STRATEGIES)}")
    tp, pp, zero = STRATEGIES[strategy]
    world = nodes * ranks_per_node
    if world % (tp * pp):
        raise ValueError(f"world_size({world}) % (tp({tp}) * pp({pp})) != 0")
    dims: dict[str, Any] = {}
    if model is not None:
        layers, h, a, s = model
        if layers % pp:
            raise ValueError(f"num_layers({layers}) % pp({pp}) != 0")
        vocab = template.padded_vocab_size if model[:4] == _dims(template) else GPT2_VOCAB
        dims = {
            "num_layers": layers,
            "hidden_size": h,
            "num_attention_heads": a,
            "seq_length": s,
            "ffn_hidden_size": 4 * h,
            "max_position_embeddings": s,
            "model": derive_model_name(layers, h, a, s),
            "padded_vocab_size": padded_vocab_size(vocab or GPT2_VOCAB, tp),
        }
    dp = world // (tp * pp)
    batch = template.global_batch_size or 0
    micro = template.micro_batch_size or 1
    if batch % (micro * dp):
        raise ValueError(f"global batch({batch}) % (micro({micro}) * dp({dp})) != 0")
    return replace(
        template,
        **dims,
        strategy=strategy,
        tp=tp,
        pp=pp,
        dp=dp,
        zero_stage=zero,
        offload=False,
        world_size=world,
        nodes=nodes,
        link_mbit=link_mbit if nodes > 1 else None,
        sources={},
    )


def _dims(s: RunSetup) -> tuple[int | None, ...]:
    return (s.num_layers, s.hidden_size, s.num_attention_heads, s.seq_length)


# ---------------------------------------------------------------------------- crossovers


@dataclass(frozen=True)
class BandwidthCrossover:
    """Link rate at which a strategy stops being slower than the baseline (T = A + B / R)."""

    strategy: str
    """Strategy compared with the baseline (``zero1``..``zero3``, ``pipeline``)."""
    verdict: Literal["above", "below", "never", "always", "unknown"]
    """No slower ``above``/``below`` the rate; ``never``; ``always``; ``unknown`` (noise)."""
    rate_mbit: float | None
    """The crossover rate (``above``/``below`` only)."""
    fixed_ms_diff: float | None
    """A_zero - A_dp: difference at infinite bandwidth, ms."""
    per_rate_diff: float | None
    """B_zero - B_dp, ms x Mbit/s: the bandwidth-bound difference is this / R."""
    extra_mb: float | None
    """Wire MB per iteration the ZeRO stage moves beyond the baseline (busiest rank)."""
    reason: str
    """The reasoning, with the numbers."""


def _affine(setup: RunSetup, cal: Calibration) -> tuple[float, float] | None:
    """(A, B) with T(R) = A + B / R, from the model at two rates (it is exactly affine)."""
    r1, r2 = PROBE_RATES_MBIT
    t1 = predict(replace(setup, link_mbit=r1), cal).iter_ms
    t2 = predict(replace(setup, link_mbit=r2), cal).iter_ms
    if t1 is None or t2 is None:
        return None
    b = (t1 - t2) / (1 / r1 - 1 / r2)
    return t1 - b / r1, b


def bandwidth_crossover(base: RunSetup, stage: int, cal: Calibration) -> BandwidthCrossover:
    """Solve A_z + B_z / R = A_dp + B_dp / R for R (``base`` is the DP setup across nodes)."""
    name = f"zero{stage}"
    return crossover(base, replace(base, zero_stage=stage, strategy=name), cal)


def crossover(base: RunSetup, zs: RunSetup, cal: Calibration) -> BandwidthCrossover:
    """Link rate at which ``zs`` stops being slower than ``base``: A_z + B_z/R = A_b + B_b/R."""
    name = zs.strategy or "?"
    dp_plan, z_plan = comm.plan(base)[0], comm.plan(zs)[0]
    extra = (z_plan.bytes_per_iter - dp_plan.bytes_per_iter) / 1e6 if dp_plan and z_plan else None
    fa, fz = _affine(base, cal), _affine(zs, cal)
    if fa is None or fz is None:
        return BandwidthCrossover(
            name, "unknown", None, None, None, extra, "the time model cannot evaluate both setups"
        )
    da, db = fz[0] - fa[0], fz[1] - fa[1]
    how, ref = predict(zs, cal), predict(base, cal)
    src = f"{name} {how.method}" + (f" on {', '.join(how.anchors)}" if how.anchors else "")
    src += ", baseline " + ref.method + (f" on {', '.join(ref.anchors)}" if ref.anchors else "")
    unc = None
    if how.uncertainty_ms is not None and ref.uncertainty_ms is not None:
        unc = math.hypot(how.uncertainty_ms, ref.uncertainty_ms)
    host = ""
    if cal.inter is not None and extra is not None and not cal.inter.netbench:
        host = (
            f" (of which {extra * cal.inter.host_ms_per_mb:+.1f} ms is the rate-independent "
            f"host cost of the extra bytes at {cal.inter.host_ms_per_mb:.2f} ms/MB)"
        )
    common = (
        f"{name} moves {extra:+.2f} MB/iteration vs {base.strategy}; at infinite bandwidth it "
        f"is {da:+.1f}"
        + (f" ± {unc:.1f}" if unc is not None else "")
        + f" ms/iteration vs {base.strategy}{host}; the bandwidth-bound difference is "
        f"{db:+,.0f}/R ms ({src})"
    )
    if unc is not None and abs(da) <= unc and db != 0:
        return BandwidthCrossover(
            name,
            "unknown",
            None,
            da,
            db,
            extra,
            f"{common}: the infinite-bandwidth difference is within the "
            "measurement uncertainty, so no crossover rate can be stated; "
            "more iterations of both runs would narrow it",
        )
    if db > 0 and da < 0:
        rate = db / -da
        return BandwidthCrossover(
            name,
            "above",
            rate,
            da,
            db,
            extra,
            f"{common}: equal at R = {rate:,.0f} Mbit/s, faster above",
        )
    if db > 0:
        return BandwidthCrossover(
            name,
            "never",
            None,
            da,
            db,
            extra,
            f"{common}: slower at every link rate, since it moves more "
            "bytes and is slower even with an infinitely fast link",
        )
    if da <= 0:
        return BandwidthCrossover(
            name, "always", None, da, db, extra, f"{common}: no slower at any link rate"
        )
    if db < 0:
        rate = -db / da
        return BandwidthCrossover(
            name,
            "below",
            rate,
            da,
            db,
            extra,
            f"{common}: equal at R = {rate:,.0f} Mbit/s, faster below",
        )
    return BandwidthCrossover(
        name, "never", None, da, db, extra, f"{common}: slower at every link rate"
    )


@dataclass(frozen=True)
class SizePoint:
    """One model of the scaling family and its memory per rank under each strategy."""

    layers: int
    """Layers (3h/128, like the small and large presets)."""
    hidden: int
    """Hidden size."""
    params: int
    """Parameters (GPT formula, GPT-2 vocabulary)."""
    gib: dict[str, float]
    """Strategy -> GiB per rank (state + activations)."""


@dataclass(frozen=True)
class MemoryCrossover:
    """Largest model of the family each strategy fits in a given memory."""

    gpu_mem_gb: float
    """Memory per rank, GB (GiB as GPUs are sold: 16/40/80 GiB)."""
    world_size: int
    """Ranks: DP/ZeRO degree, and pipeline stages for PP."""
    precision: str
    """Adam state precision used."""
    largest_fit: dict[str, SizePoint | None]
    """Strategy -> largest family member that fits (None: not even the smallest)."""
    dp_first_misfit: SizePoint | None
    """First model DP cannot hold (None: DP holds the whole family)."""
    reasoning: str
    """The reasoning, with numbers."""


def _family_setup(template: RunSetup, h: int, strategy: str, world: int) -> RunSetup:
    layers = max(2, round(3 * h / 128))
    layers += layers % 2  # even, so PP=2 splits it
    s = min(h, 1024)
    # The family's pipeline spans every rank (one stage per rank), unlike the 2-stage preset.
    tp, pp, zero = (1, world, 0) if strategy == "pipeline" else STRATEGIES[strategy]
    if layers % pp:
        layers += pp - layers % pp
    return replace(
        template,
        num_layers=layers,
        hidden_size=h,
        num_attention_heads=max(1, h // 64),
        seq_length=s,
        max_position_embeddings=s,
        ffn_hidden_size=4 * h,
        padded_vocab_size=padded_vocab_size(GPT2_VOCAB),
        tp=tp,
        pp=pp,
        dp=world // (tp * pp),
        zero_stage=zero,
        world_size=world,
        global_batch_size=(template.micro_batch_size or 1) * world * 4,
    )


def memory_crossover(
    template: RunSetup, gpu_mem_gb: float, world: int, precision: str = "bf16"
) -> MemoryCrossover:
    """Walk the family h = 128, 256, ... (l = 3h/128, s = min(h, 1024), a = h/64, V = 50257,
    the template's micro-batch and recompute) and find where DP, ZeRO-3 and PP stop fitting."""
    strategies = ("baseline", "zero3", "pipeline") if world > 1 else ("baseline",)
    largest: dict[str, SizePoint | None] = {k: None for k in strategies}
    misfit: SizePoint | None = None
    for h in range(128, 32768 + 1, 128):
        gib = {}
        point_setup = None
        for st in strategies:
            su = _family_setup(template, h, st, world)
            point_setup = point_setup or su
            gib[st] = memory_estimate(su, precision).total_bytes / 2**30
        assert point_setup is not None
        point = SizePoint(
            point_setup.num_layers or 0,
            h,
            gpt_parameters(
                point_setup.num_layers or 0,
                h,
                point_setup.max_position_embeddings or 0,
                point_setup.padded_vocab_size or 0,
            ),
            gib,
        )
        for st in strategies:
            if gib[st] <= gpu_mem_gb:
                largest[st] = point
        if misfit is None and gib["baseline"] > gpu_mem_gb:
            misfit = point
        if all(g > gpu_mem_gb for g in gib.values()):
            break
    if misfit is None:
        text = f"DP holds every model up to h 32768 in {gpu_mem_gb:g} GiB"
    else:
        st0 = zero_state_bytes(1, 0, world, precision)
        text = (
            f"with {precision} Adam, DP keeps {st0:g} bytes per parameter on every rank: at "
            f"{misfit.params / 1e9:,.2f}B parameters (l {misfit.layers}, h {misfit.hidden}) it "
            f"needs {misfit.gib['baseline']:,.1f} GiB > {gpu_mem_gb:g} GiB"
        )
        for st in strategies[1:]:
            big = largest[st]
            if big is not None:
                text += (
                    f"; {st} over {world} ranks fits up to {big.params / 1e9:,.2f}B "
                    f"({big.gib[st]:,.1f} GiB)"
                )
        if world == 1:
            text += "; with one rank neither ZeRO-3 nor PP can split the model"
    return MemoryCrossover(gpu_mem_gb, world, precision, largest, misfit, text + ".")


# ---------------------------------------------------------------------------- CLI


def parse_rate(text: str) -> float:
    """Mbit/s from ``100mbit``, ``1gbit``, ``10g``, ``1000`` (a bare number is Mbit/s); a
    what-if needs a rate, so ``none`` is refused."""
    try:
        rate = formulas.parse_rate(text, bare_unit="mbit")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    if rate is None:
        raise argparse.ArgumentTypeError(f"link {text!r}: a what-if needs a rate, e.g. 100mbit")
    return rate


def parse_model(text: str) -> tuple[int, int, int, int]:
    """(layers, hidden, heads, seq) from a preset name or ``L,H,S`` (heads h/64) / ``L,H,A,S``."""
    if text in MODEL_PRESETS:
        return MODEL_PRESETS[text]
    parts = [int(p) for p in text.split(",") if p.strip()]
    if len(parts) == 3:
        return parts[0], parts[1], max(1, parts[1] // 64), parts[2]
    if len(parts) == 4:
        return parts[0], parts[1], parts[2], parts[3]
    raise argparse.ArgumentTypeError(f"model {text!r}: {', '.join(MODEL_PRESETS)} or L,H,S")


def _load(logdir: Path) -> tuple[list[LoadedRun], list[RunMetrics]]:
    from analysis import load, metrics

    runs = load.discover(logdir, exclude=[logdir / "report"])
    rows = metrics.compare([metrics.compute(r) for r in runs])
    return runs, rows


def _jsonable(value: Any) -> Any:
    if hasattr(value, "__dataclass_fields__"):
        d = asdict(value)
        d.pop("sources", None)
        return {k: _jsonable(v) for k, v in d.items()}
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items() if k != "sources"}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def _prediction_json(p: Prediction) -> dict[str, Any]:
    d = _jsonable(p)
    d["setup"] = {
        k: getattr(p.setup, k)
        for k in (
            "model",
            "strategy",
            "num_layers",
            "hidden_size",
            "seq_length",
            "tp",
            "pp",
            "dp",
            "zero_stage",
            "nodes",
            "world_size",
            "link_mbit",
            "global_batch_size",
        )
    }
    if p.memory is not None:
        d["memory"]["total_bytes"] = p.memory.total_bytes
    return d


@dataclass(frozen=True)
class WhatIf:
    """Everything the CLI computes."""

    calibration: Calibration
    """Fits from LOGDIR."""
    loo: list[LooResult]
    """Leave-one-out on the measured runs."""
    predictions: list[Prediction]
    """Requested what-if setups."""
    crossovers: list[BandwidthCrossover]
    """Per ZeRO stage."""
    memory: MemoryCrossover | None
    """Memory crossover (with --gpu-mem-gb)."""
    notes: list[str] = field(default_factory=list)
    """What the request assumed."""


def run_what_if(
    runs: Sequence[LoadedRun],
    rows: Sequence[RunMetrics],
    link: float | None = None,
    nodes: int | None = None,
    model: tuple[int, int, int, int] | None = None,
    strategies: Sequence[str] = tuple(STRATEGIES),
    gpu_mem_gb: float | None = None,
    ranks_per_node: int | None = None,
) -> WhatIf:
    """Calibrate on the runs and predict the requested setups, crossovers and memory limits."""
    obs = observations_from(runs, rows)
    if not obs:
        raise ValueError("no completed timed run with a known layout to calibrate on")
    cal = calibrate(obs)
    notes: list[str] = []
    multi = [o for o in obs if (o.setup.nodes or 1) > 1]
    ref = (multi or list(obs))[0].setup
    rpn = ranks_per_node or max(1, (ref.world_size or 1) // (ref.nodes or 1))
    n = nodes or max(ref.nodes or 1, 2)
    rate = link or ref.link_mbit or (cal.inter.rate_mbit if cal.inter else None) or 1000.0
    if link is None:
        notes.append(f"link {rate:g} Mbit/s (the measured runs' rate; --link to change)")
    preds = []
    for st in strategies:
        try:
            su = what_if(ref, st, n, rpn, rate, model)
        except ValueError as exc:
            notes.append(f"{st}: {exc}")
            continue
        preds.append(predict(su, cal))
    base = what_if(ref, "baseline", max(n, 2), rpn, rate, model)
    cross = [bandwidth_crossover(base, z, cal) for z in (1, 2, 3)]
    mem = None
    if gpu_mem_gb:
        mem = memory_crossover(base, gpu_mem_gb, base.world_size or 2)
    return WhatIf(cal, leave_one_out(obs), preds, cross, mem, notes)


def to_json(w: WhatIf) -> dict[str, Any]:
    """The CLI's --json document."""
    return {
        "calibration": {
            "compute": _jsonable(w.calibration.compute),
            "intra_node": _jsonable(w.calibration.intra),
            "inter_node": _jsonable(w.calibration.inter),
            "assumptions": list(w.calibration.assumptions),
        },
        "leave_one_out": [
            {
                "name": r.name,
                "repeats": r.repeats,
                "measured_ms": r.measured_ms,
                "predicted_ms": r.prediction.iter_ms,
                "error": r.error,
                "method": r.prediction.method,
                "anchors": list(r.prediction.anchors),
            }
            for r in w.loo
        ],
        "predictions": [_prediction_json(p) for p in w.predictions],
        "crossovers": _jsonable(w.crossovers),
        "memory_crossover": _jsonable(w.memory),
        "notes": w.notes,
    }


def _print(w: WhatIf) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=160)
    table = Table(title="Predicted ms/iteration and memory per rank")
    for col in (
        "setup",
        "ms/iter",
        "method",
        "compute",
        "bubble",
        "optimizer",
        "other",
        "comm",
        "state MiB",
        "activations MiB",
    ):
        table.add_column(col)
    for p in w.predictions:
        cells = [
            p.label,
            _f(p.iter_ms),
            p.method,
            _f(p.compute_ms),
            _f(p.bubble_ms),
            _f(p.optimizer_ms),
            _f(p.other_ms),
            _f(p.comm_ms),
        ]
        mem = p.memory
        cells += (
            [_f(mem.state_bytes / 2**20), _f(mem.activation_bytes / 2**20)] if mem else ["", ""]
        )
        table.add_row(*cells)
    console.print(table)
    for p in w.predictions:
        console.print(f"- {p.label}: " + "; ".join([*p.assumptions, p.reason or ""]).strip("; "))
    loo = Table(title="Leave-one-out: each run predicted from the others")
    for col in ("run", "measured", "predicted", "error", "method"):
        loo.add_column(col)
    for r in w.loo:
        err = f"{r.error:+.1%}" if r.error is not None else "n/a"
        loo.add_row(r.name, _f(r.measured_ms), _f(r.prediction.iter_ms), err, r.prediction.method)
    console.print(loo)
    for c in w.crossovers:
        console.print(f"- {c.strategy}: {c.verdict}; {c.reason}")
    if w.memory:
        console.print(f"- memory ({w.memory.gpu_mem_gb:g} GiB): {w.memory.reasoning}")
    for n in w.notes:
        console.print(f"- note: {n}")


def _f(v: float | None) -> str:
    return "" if v is None else f"{v:,.1f}"


def main(argv: list[str] | None = None) -> int:
    """CLI entry point."""
    parser = argparse.ArgumentParser(prog="python -m analysis.predict", description=__doc__)
    parser.add_argument("logdir", type=Path, help="measured runs (run directories, log files)")
    parser.add_argument("--link", type=parse_rate, help="target link, e.g. 100mbit, 10gbit")
    parser.add_argument("--nodes", type=int, help="target node count (default: as measured)")
    parser.add_argument("--ranks-per-node", type=int, help="ranks per node (default: as measured)")
    parser.add_argument("--model", type=parse_model, help="tiny|small|large or L,H,S / L,H,A,S")
    parser.add_argument(
        "--strategies",
        nargs="+",
        default=list(STRATEGIES),
        choices=list(STRATEGIES),
        help="strategies to predict",
    )
    parser.add_argument("--gpu-mem-gb", type=float, help="memory per rank for the size crossover")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args(argv)
    if not args.logdir.exists():
        parser.error(f"{args.logdir} does not exist")
    runs, rows = _load(args.logdir)
    try:
        w = run_what_if(
            runs,
            rows,
            args.link,
            args.nodes,
            args.model,
            args.strategies,
            args.gpu_mem_gb,
            args.ranks_per_node,
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(to_json(w), indent=2, default=str))
    else:
        _print(w)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


# ---------------------------------------------------------------------------- report sections


@dataclass(frozen=True)
class ReportSections:
    """Markdown of the report's model-driven sections, and the leave-one-out behind them."""

    scaling: list[str]
    """"Scaling predictions" lines."""
    recommendations: list[str]
    """Model-driven "Recommendations" lines."""
    loo: list[LooResult]
    """Leave-one-out results (fill ``predicted_iter_ms``/``prediction_error`` with them)."""


REPORT_RATES_MBIT = (100.0, 1000.0, 10000.0)
"""Link rates of the report's what-if table."""

REPORT_GPU_MEM_GB = (16.0, 40.0, 80.0)
"""GPU memories of the report's memory crossover."""


def _ms(v: float | None) -> str:
    return "n/a" if v is None else f"{v:,.1f}"


def _calibration_lines(cal: Calibration) -> list[str]:
    md = ["Calibration (all runs):", ""]
    for fit in cal.compute.values():
        md.append(
            f"- compute '{fit.kind}' from {', '.join(fit.runs)}: forward "
            f"{fit.fwd_ms_per_layer_mb:.2f} + backward {fit.bwd_ms_per_layer_mb:.2f} ms per layer "
            f"and micro-batch ({fit.fwd_ms_per_gflop:.1f} + {fit.bwd_ms_per_gflop:.1f} ms per "
            f"forward GFLOP); optimizer {fit.optimizer_ms_per_mparam:.1f} ms per million "
            f"parameters updated; untimed 'other' {fit.other_ms:.1f} ms/iteration"
        )
    for fit in (cal.intra, cal.inter):
        if fit is not None:
            md.append(f"- {fit.link} collectives: {fit.source}")
    md += [f"- assumption: {a}" for a in cal.assumptions]
    return [*md, ""]


def _memory_lines(rows: Sequence[RunMetrics], runs: Sequence[LoadedRun]) -> list[str]:
    by_name = {r.name: r for r in runs}
    table, timed = [], []
    for row in rows:
        run = by_name.get(row.name)
        if run is None or comm.plan(run.setup)[0] is None or row.status != "completed":
            continue
        mem = memory_estimate(run.setup)
        timed.append((row, mem))
    if not timed:
        return []
    md = ["Memory per rank, model (ZeRO paper state + Korthikanti activations) vs measured:", ""]
    for row, mem in timed:
        model_diff = meas_diff = "n/a"
        base = next(
            (x for x in timed if x[0].strategy == "baseline" and x[0].setup_key == row.setup_key),
            None,
        )
        if base is not None:
            model_diff = f"{(mem.total_bytes - base[1].total_bytes) / 2**20:+.1f}"
            if row.peak_mem_mb is not None and base[0].peak_mem_mb is not None:
                meas_diff = f"{row.peak_mem_mb - base[0].peak_mem_mb:+.1f}"
        table.append(
            [
                row.name,
                f"{mem.state_bytes / 2**20:.1f}",
                f"{mem.activation_bytes / 2**20:.1f}",
                f"{mem.total_bytes / 2**20:.1f}",
                _ms(row.peak_mem_mb),
                model_diff,
                meas_diff,
            ]
        )
    md += _md_table(
        [
            "run",
            "state MiB",
            "activations MiB",
            "model MiB",
            "measured peak MiB",
            "model vs baseline",
            "measured vs baseline",
        ],
        table,
    )
    rss = [row for row, _ in timed if "RSS" in (row.mem_kind or "")]
    if rss:
        peak = max(r.peak_mem_mb or 0.0 for r in rss)
        state = max(m.total_bytes for _, m in timed) / 2**20
        md += [
            "",
            f"Not meaningful here: the measured figures are process RSS on CPU (up to "
            f"{peak:,.0f} MiB) while the model's whole tensor memory is at most {state:,.1f} "
            "MiB; the RSS is dominated by the Python/torch runtime, and its differences "
            "between strategies are of the same size as the model's and of either sign. "
            "Compare on an accelerator (max allocated) to check these formulas.",
        ]
    return [*md, ""]


def _md_table(headers: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    return out + ["| " + " | ".join(r) + " |" for r in rows]


def report_sections(runs: Sequence[LoadedRun], rows: Sequence[RunMetrics]) -> ReportSections:
    """The "Scaling predictions" and model-driven "Recommendations" of the report."""
    obs = observations_from(runs, rows)
    if not obs:
        text = (
            "No completed run with timers and a known layout: nothing to calibrate the model "
            "on. A baseline run with DeepSpeed wall_clock_breakdown true would provide it."
        )
        return ReportSections([text, ""], [], [])
    loo = leave_one_out(obs)
    cal = calibrate(obs)
    md = [
        "Model (analysis.predict): iteration = compute (forward/backward ms per FLOP, calibrated "
        "per compute kind from DeepSpeed's fwd/bwd_inner timers) + pipeline bubble (p-1)/(m+p-1) "
        "+ optimizer (ms per million parameters updated) + untimed constant + exposed "
        "communication (every collective of the communication plan: wire MB x (host + 8000 / "
        "(e x R)) ms, R in Mbit/s; with a collective benchmark, each call's measured time at "
        "its size, whose wire part (e of that collective from its largest messages) scales "
        "with 1/R and whose rest is kept). A run of the same layout measured elsewhere anchors "
        "the prediction (its time minus its modelled communication plus the target's).",
        "",
        *_calibration_lines(cal),
        "Leave-one-out: each run (the mean of its repeats, when repeated) predicted from the "
        "other runs of the same model and batch.",
        "",
    ]
    table = []
    for r in loo:
        p = r.prediction
        how = p.method + (f" on {', '.join(p.anchors)}" if p.anchors else "")
        err = f"{r.error:+.1%}" if r.error is not None else "n/a"
        name = r.name + (f" (mean of {r.repeats})" if r.repeats > 1 else "")
        table.append([name, how, f"{r.measured_ms:,.1f}", _ms(p.iter_ms), err])
    md += _md_table(["run", "predicted from", "measured ms", "predicted ms", "error"], table)
    md.append("")
    for r in loo:
        borrowed = [a for a in r.prediction.assumptions if a.startswith("no ")]
        if borrowed and r.error is not None:
            md.append(f"- {r.name} ({r.error:+.0%}): {borrowed[0]}.")
    anchored = [
        abs(r.error) for r in loo if r.error is not None and r.prediction.method == "anchored"
    ]
    if anchored:
        md.append(
            f"- Anchored predictions (communication re-evaluated for another link or node count): "
            f"largest error {max(anchored):.1%} over {len(anchored)} runs."
        )
    md.append("")

    multi = [o for o in obs if (o.setup.nodes or 1) > 1]
    ref = (multi or obs)[0].setup
    rpn = max(1, (ref.world_size or 1) // (ref.nodes or 1))
    nodes = max(ref.nodes or 1, 2)
    rate0 = ref.link_mbit or (cal.inter.rate_mbit if cal.inter else None) or 1000.0
    md += [
        f"Predictions for link rates and node counts not necessarily run ({nodes} nodes x "
        f"{rpn} rank(s) unless stated; a = anchored on a measured run, c = components):",
        "",
    ]
    heads = [f"{r:g} Mbit/s" for r in REPORT_RATES_MBIT] + [f"{2 * nodes} nodes @ {rate0:g}"]
    table = []
    preds: dict[tuple[str, float], Prediction] = {}
    for st in STRATEGIES:
        cells = [st]
        for rate in REPORT_RATES_MBIT:
            try:
                p = predict(what_if(ref, st, nodes, rpn, rate), cal)
            except ValueError as exc:
                cells.append(f"n/a ({exc})")
                continue
            preds[(st, rate)] = p
            cells.append(f"{_ms(p.iter_ms)} {p.method[0] if p.iter_ms else ''}".strip())
        try:
            p = predict(what_if(ref, st, 2 * nodes, rpn, rate0), cal)
            cells.append(f"{_ms(p.iter_ms)} {p.method[0] if p.iter_ms else ''}".strip())
        except ValueError as exc:
            cells.append(f"n/a ({exc})")
        table.append(cells)
    md += _md_table(["strategy", *heads], table)
    md += [
        "",
        f"With {2 * nodes} nodes the data-parallel degree and the micro-batches per rank "
        "change, so no run anchors those figures: they come from the components.",
        "",
    ]

    base = what_if(ref, "baseline", nodes, rpn, rate0)
    crosses = [bandwidth_crossover(base, z, cal) for z in (1, 2, 3)]
    if (base.num_layers or 0) % 2 == 0 and (base.world_size or 1) % 2 == 0:
        crosses.append(crossover(base, what_if(ref, "pipeline", nodes, rpn, rate0), cal))
    md += ["Crossover link rates vs the baseline (time model T = A + B / R solved for R):", ""]
    md += [
        f"- **{c.strategy}**: {c.verdict}"
        + (f" {c.rate_mbit:,.0f} Mbit/s" if c.rate_mbit else "")
        + f". {c.reason}."
        for c in crosses
    ]
    md.append("")
    md += _memory_lines(rows, runs)
    mems = [memory_crossover(base, g, base.world_size or 2) for g in REPORT_GPU_MEM_GB]
    md += [
        "Memory crossover (family l = 3h/128, s = min(h, 1024), a = h/64, GPT-2 vocabulary, "
        f"micro-batch {base.micro_batch_size}, bf16 Adam, {base.world_size} ranks):",
        "",
    ]
    md += [f"- {m.gpu_mem_gb:g} GiB: {m.reasoning}" for m in mems]
    md.append("")
    recs = _recommendations(ref, rate0, preds, crosses, mems, cal, loo)
    return ReportSections(md, recs, loo)


def _recommendations(
    ref: RunSetup,
    rate0: float,
    preds: dict[tuple[str, float], Prediction],
    crosses: list[BandwidthCrossover],
    mems: list[MemoryCrossover],
    cal: Calibration,
    loo: list[LooResult],
) -> list[str]:
    out = []
    at = {st: p for (st, r), p in preds.items() if r == rate0 and p.iter_ms is not None}
    if at:
        best = min(at.values(), key=lambda p: p.iter_ms or 0.0)
        others = ", ".join(
            f"{p.setup.strategy} {p.iter_ms:,.0f}" for p in at.values() if p is not best
        )
        out.append(
            f"- Model, {ref.model}, {best.label}: **{best.setup.strategy}** at "
            f"{best.iter_ms:,.0f} ms/iteration ({best.method}); the others: {others} ms."
        )
    for c in crosses:
        if c.verdict in ("above", "below"):
            edge = REPORT_RATES_MBIT[0] if c.verdict == "below" else REPORT_RATES_MBIT[-1]
            pz, pb = preds.get((c.strategy, edge)), preds.get(("baseline", edge))
            at_edge = ""
            if pz and pb and pz.iter_ms and pb.iter_ms:
                at_edge = f"; at {edge:g} Mbit/s {pz.iter_ms:,.0f} vs {pb.iter_ms:,.0f} ms"
            out.append(
                f"- {c.strategy} becomes no slower than the baseline {c.verdict} "
                f"{c.rate_mbit:,.0f} Mbit/s (model{at_edge})."
            )
        elif c.verdict == "never":
            out.append(
                f"- {c.strategy} is slower than the baseline at every link rate for this "
                f"model: it moves {c.extra_mb:+.2f} MB/iteration and is "
                f"{c.fixed_ms_diff:+.0f} ms slower even at infinite bandwidth; choose it "
                "only for memory."
            )
        elif c.verdict == "unknown":
            if c.per_rate_diff is not None and c.fixed_ms_diff is not None and c.extra_mb:
                trend = "gains" if c.per_rate_diff < 0 else "loses"
                question = (
                    "whether it stays faster on a fast link"
                    if c.per_rate_diff < 0
                    else "whether it is ever faster"
                )
                out.append(
                    f"- {c.strategy} vs the baseline across link rates: it moves "
                    f"{c.extra_mb:+.2f} MB/iteration, so it {trend} ground as the link slows; "
                    f"at infinite bandwidth the model puts it at {c.fixed_ms_diff:+.0f} ms, "
                    f"within the measurement noise, so {question} is not decidable from these "
                    "runs; longer runs of both would decide."
                )
            else:
                out.append(
                    f"- {c.strategy} vs the baseline across link rates: not decidable from "
                    "these runs (within the measurement noise); longer runs of both would "
                    "decide."
                )
    for m in mems:
        if m.dp_first_misfit is not None:
            out.append(
                f"- With {m.gpu_mem_gb:g} GiB per GPU, DP stops fitting at "
                f"{m.dp_first_misfit.params / 1e9:,.2f}B parameters; then ZeRO-3 or PP is "
                "necessary (memory formulas, not measured here)."
            )
    missing = []
    if cal.inter is None or "netbench" not in cal.inter.source:
        missing.append(
            "a collective benchmark (python -m launchers.netbench) on the cluster "
            "would replace the assumed wire efficiency"
        )
    for kind in ("tp", "zero3"):
        fit = cal.compute.get(kind)
        if fit is None or len(fit.runs) < 2:
            missing.append(
                f"a second {kind} run (another link or node count) would let "
                f"leave-one-out check the {kind} compute calibration"
            )
    if any(r.prediction.method == "components" and (r.error or 0) < -0.2 for r in loo):
        missing.append(
            "strategies predicted from components with errors beyond 20% are not "
            "reliable until a run of that strategy calibrates them"
        )
    if missing:
        out.append("- Data that would firm this up: " + "; ".join(missing) + ".")
    return out
