"""What one rank does per iteration, for the time and memory model: the FLOPs of its pipeline
stage, the parameters its optimizer updates, its compute kind and its memory (model state per
ZeRO stage and activations).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from analysis.theory import comm
from analysis.theory.formulas import layer_macs, zero_state_bytes
from analysis.theory.setup import RunSetup

ComputeKind = Literal["base", "tp", "zero3"]
"""Compute calibration classes: TP shards matmuls and adds in-layer all-reduces; ZeRO-3 adds
partitioning hooks to forward/backward and a heavier step; everything else computes alike."""

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
