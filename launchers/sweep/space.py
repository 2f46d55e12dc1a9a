"""The sweep's search space: every TP x PP x DP x ZeRO x micro-batch (x recompute on GPU)
configuration of a model on a cluster, the axes a user narrows, and each configuration resolved
and checked by the same validation as a single run (``resolve_spec``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from launchers.config.presets import PresetError
from launchers.config.spec import ZERO_STAGES, Cluster, RunSpec, SpecError, Strategy


class SweepError(ValueError):
    """A sweep request that cannot run; the message names the option and the fix."""


@dataclass(frozen=True)
class Axes:
    """What the user narrowed; None on an axis: every value that can be valid."""

    tp: tuple[int, ...] | None = None
    """``TP=1,2``: tensor-parallel degrees. Unset: the divisors of the ranks of the smallest
    node (TP stays inside a node); given, values across nodes are allowed."""
    pp: tuple[int, ...] | None = None
    """``PP=1,2``: pipeline degrees. Unset: every divisor of the world size."""
    zero: tuple[int, ...] | None = None
    """``ZERO=0,1``: ZeRO stages. Unset: 0-3 (validation drops 2 and 3 under PP > 1)."""
    mbs: tuple[int, ...] | None = None
    """``MBS=1,2``: micro-batch sizes. Unset: every divisor of global batch / DP."""
    recompute: tuple[bool, ...] | None = None
    """Activation recompute settings. Unset: off and on with a GPU, off on CPU."""


def parse_axis(
    name: str, text: str | None, allowed: Sequence[int] | None = None
) -> tuple[int, ...] | None:
    """``"1,2"`` -> (1, 2); None or empty -> None; a clear error naming the option otherwise."""
    if text is None or not text.strip():
        return None
    values: list[int] = []
    for part in text.split(","):
        try:
            value = int(part.strip())
        except ValueError:
            raise SweepError(
                f"{name}={text!r}: {part.strip()!r} is not an integer; write e.g. {name}=1,2"
            ) from None
        ok = value in allowed if allowed is not None else value >= 1
        if not ok:
            want = ", ".join(map(str, allowed)) if allowed is not None else "integers >= 1"
            raise SweepError(f"{name}={text!r}: {value} is not one of {want}")
        values.append(value)
    return tuple(dict.fromkeys(values))


def divisors(n: int) -> tuple[int, ...]:
    """Divisors of ``n`` in increasing order."""
    return tuple(d for d in range(1, n + 1) if n % d == 0)


@dataclass(frozen=True)
class Config:
    """One point of the search space."""

    tp: int
    """Tensor-parallel degree."""
    pp: int
    """Pipeline-parallel degree."""
    dp: int
    """Data-parallel degree: world / (tp x pp)."""
    zero: int
    """ZeRO stage."""
    mbs: int
    """Micro-batch size."""
    recompute: bool
    """Full activation recompute."""

    @property
    def name(self) -> str:
        """Strategy name of its runs, e.g. ``tp1-pp2-dp2-z1-mb1`` (``-rc`` with recompute)."""
        rc = "-rc" if self.recompute else ""
        return f"tp{self.tp}-pp{self.pp}-dp{self.dp}-z{self.zero}-mb{self.mbs}{rc}"

    def strategy(self) -> Strategy:
        """The run's strategy."""
        return Strategy(
            name=self.name,
            tp=self.tp,
            pp=self.pp,
            zero_stage=self.zero,  # type: ignore[arg-type]
            description=f"sweep point: TP {self.tp}, PP {self.pp}, DP {self.dp}, "
            f"ZeRO {self.zero}, micro-batch {self.mbs}" + (", recompute" if self.recompute else ""),
        )

    def overrides(self) -> dict[str, Any]:
        """The ``--set`` values the configuration fixes."""
        return {"micro_batch_size": self.mbs, "activation_checkpointing": self.recompute}


@dataclass
class Point:
    """A configuration, its resolved spec, or why it cannot run."""

    config: Config
    """Where in the space."""
    spec: RunSpec | None = None
    """Resolved and validated, None when invalid."""
    invalid: str = ""
    """The validation's message (the rule with the numbers) when it cannot run."""
    notes: list[str] = field(default_factory=list)
    """What the sweep decided about it (memory, anchor, ...)."""


SWEEP_KEYS = ("micro_batch_size", "activation_checkpointing")
"""``--set`` keys the sweep itself varies (``MBS=``, recompute)."""


def candidates(
    num_layers: int,
    global_batch: int,
    slots: Sequence[int],
    device: str,
    axes: Axes,
) -> list[Config]:
    """Every configuration of the axes whose TP x PP divides the world size.

    PP divides the world size (validation then checks that it divides the layers), TP the ranks
    of a node unless ``axes.tp`` names other values, DP the rest; micro-batch sizes divide
    global batch / DP; recompute is varied on GPU only (on CPU it is off: DeepSpeed's pipeline
    cannot recompute there and the activations of the CPU presets are not what limits them).
    """
    world = sum(slots)
    tps = axes.tp or divisors(min(slots))
    pps = axes.pp or tuple(p for p in divisors(world) if num_layers % p == 0)
    zeros = axes.zero or ZERO_STAGES
    rcs = axes.recompute or ((False, True) if device == "cuda" else (False,))
    out = []
    for tp in tps:
        for pp in pps:
            if world % (tp * pp):
                continue
            dp = world // (tp * pp)
            mbss = axes.mbs or divisors(global_batch // dp if global_batch % dp == 0 else 1)
            for zero in zeros:
                for mbs in mbss:
                    for rc in rcs:
                        out.append(Config(tp, pp, dp, zero, mbs, rc))
    return out


Resolver = Callable[[Strategy, Mapping[str, Any], Cluster], RunSpec]
"""Builds a validated spec of a strategy with overrides on a cluster (``resolve_spec``)."""


def resolve_points(
    configs: Sequence[Config], cluster: Cluster, overrides: Mapping[str, Any], resolve: Resolver
) -> list[Point]:
    """Each configuration resolved as a single run would be; invalid ones keep the message."""
    clash = sorted(set(overrides) & set(SWEEP_KEYS))
    if clash:
        raise SweepError(
            f"SET {', '.join(clash)}: the sweep varies these itself; narrow them with MBS=... "
            "(micro-batch) or --recompute instead"
        )
    points = []
    for c in configs:
        try:
            spec = resolve(c.strategy(), {**overrides, **c.overrides()}, cluster)
        except (SpecError, PresetError) as exc:
            message = str(exc).split("\n", 1)[-1].strip()
            points.append(Point(c, None, " ".join(message.split())))
            continue
        asked = c.overrides()
        changed = [a for a in spec.adjustments if a.key in asked and a.applied != asked[a.key]]
        if changed:  # the resolver would run another configuration than this one
            a = changed[0]
            points.append(Point(c, None, f"{a.key} {a.requested} -> {a.applied}: {a.reason}"))
            continue
        points.append(Point(c, spec))
    return points
