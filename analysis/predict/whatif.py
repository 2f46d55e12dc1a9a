"""What-if setups (another strategy, cluster, link or model) and the crossovers solved on the
calibrated model: the link rate where a strategy overtakes another, the model size where one
stops fitting in memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Literal

from analysis.predict.calibration import Calibration
from analysis.predict.prediction import predict
from analysis.runs.load import derive_model_name
from analysis.theory import comm
from analysis.theory.costs import memory_estimate
from analysis.theory.formulas import gpt_parameters, padded_vocab_size, zero_state_bytes
from analysis.theory.presets import model_table, strategy_table
from analysis.theory.setup import RunSetup

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


def _affine(setup: RunSetup, cal: Calibration) -> tuple[float, float] | str:
    """(A, B) with T(R) = A + B / R, from the model at two rates (it is exactly affine); else
    why the model cannot evaluate ``setup``."""
    r1, r2 = PROBE_RATES_MBIT
    p1 = predict(replace(setup, link_mbit=r1), cal)
    t2 = predict(replace(setup, link_mbit=r2), cal).iter_ms
    if p1.iter_ms is None or t2 is None:
        return f"{setup.strategy}: {p1.reason or 'no prediction'}"
    b = (p1.iter_ms - t2) / (1 / r1 - 1 / r2)
    return p1.iter_ms - b / r1, b


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
    if isinstance(fa, str) or isinstance(fz, str):
        why = [f for f in (fa, fz) if isinstance(f, str)]
        return BandwidthCrossover(
            name,
            "unknown",
            None,
            None,
            None,
            extra,
            f"the time model cannot evaluate both setups ({'; '.join(why)})",
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
