"""Communication volume per iteration, derived from the run's setup (never from the logs).

The model follows what DeepSpeed 0.19.6 and upstream Megatron-DeepSpeed really issue, checked
in their source (citations next to each rule), not the ZeRO paper's idealised volumes:

- ZeRO-0 (plain DP): one all-reduce of the gradients per optimizer step, at the gradient-
  accumulation boundary (``deepspeed/runtime/engine.py`` ``DeepSpeedEngine.allreduce_gradients``
  -> ``buffered_allreduce_fallback``).
- ZeRO-1/2: gradients are all-REDUCED, not reduce-scattered (``deepspeed/runtime/zero/
  stage_1_and_2.py`` ``average_tensor``: ``use_multi_rank_bucket_allreduce`` defaults to True,
  so every bucket goes to ``allreduce_and_scatter``); ZeRO-1 once per step, ZeRO-2 on every
  micro-step (``allreduce_gradients`` calls ``overlapping_partition_gradients_reduce_epilogue``
  whenever gradients are partitioned). After ``step()`` the updated parameter partitions are
  all-gathered (``all_gather_dp_groups``).
- ZeRO-3: per micro-step, parameters larger than ``stage3_param_persistence_threshold`` (1e5
  elements by default, ``deepspeed/runtime/zero/config.py``) are all-gathered in forward and
  again in backward, gradients are reduce-scattered; the small "persistent" parameters are
  all-gathered once per step after the optimizer (``stage3.py`` ``_post_step``).
- PP: hidden states ``b*s*h`` forward and their gradients backward per micro-batch between
  adjacent stages (the attention mask is not sent: upstream ``pretrain_gpt.py`` stores it in
  ``args.attn_mask``); plus an all-reduce of the tied word-embedding gradient between first and
  last stage once per step (``deepspeed/runtime/pipe/engine.py`` ``_exec_reduce_tied_grads``).
- TP: per micro-batch and layer, two all-reduces of ``b*s*h`` in forward (attention and MLP
  row-parallel outputs) and two in backward (column-parallel input gradients); plus one for the
  vocab-parallel embedding (forward) and one for the LM-head input (backward), and three small
  fp32 all-reduces of ``b*s`` in the vocab-parallel cross-entropy.

Gradients and parameters travel in DeepSpeed's ``communication_data_type`` (fp16/bf16 when
enabled, else fp32: ``engine.py`` ``communication_data_type``); activations in the model dtype.

Bytes on the wire per rank, ring algorithms (nccl-tests conventions): all-reduce 2(n-1)/n * S,
all-gather and reduce-scatter (n-1)/n * S, send/recv S. Scalar collectives (loss averaging,
gradient norm) are a few bytes and are left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Literal

from analysis.theory.formulas import gpt_parameter_tensors, ring_factor
from analysis.theory.setup import RunSetup

Op = Literal["all_reduce", "all_gather", "reduce_scatter", "send_recv"]
Backend = Literal["nccl", "gloo"]
"""Collective kinds, as named by nccl-tests and netbench.json."""

Group = Literal["dp", "tp", "pp", "tied-embedding"]
"""Which process group a collective runs in."""

Link = Literal["inter-node", "intra-node", "unknown"]
"""Which link a collective's traffic crosses."""

DEFAULT_REDUCE_BUCKET = 500_000_000
"""DeepSpeed ``reduce_bucket_size`` default, elements (``zero/config.py``)."""
DEFAULT_PERSISTENCE_THRESHOLD = 100_000
"""DeepSpeed ``stage3_param_persistence_threshold`` default, elements (``zero/config.py``)."""
DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
"""Bytes per element."""


@dataclass(frozen=True)
class Collective:
    """One kind of collective a rank takes part in during an iteration (optimizer step)."""

    op: Op
    """Collective kind."""
    purpose: str
    """What it moves, e.g. ``gradients``, ``parameters (forward)``."""
    size_bytes: int
    """Message size S of one call, bytes (the full tensor, before ring splitting)."""
    count_per_iter: int
    """Calls per iteration."""
    group: Group
    """Process group."""
    group_size: int
    """Ranks in the group (n)."""
    link: Link
    """Link the traffic crosses."""
    source: str
    """Where in DeepSpeed/Megatron this communication is issued."""
    backend: Backend = "nccl"
    """Collective backend: ``gloo`` on CPU (DeepSpeed's CPU accelerator without oneCCL)."""

    def __post_init__(self) -> None:
        if self.size_bytes < 0 or self.count_per_iter < 0:
            raise ValueError(f"size({self.size_bytes}) and count({self.count_per_iter}) >= 0")
        if self.group_size < 2:
            raise ValueError(f"group_size({self.group_size}) < 2: no communication")

    @property
    def wire_bytes_per_rank(self) -> float:
        """Bytes one (sending) rank puts on the wire per iteration: factor * S * count.

        gloo's reduce-scatter moves what an all-reduce moves (2(n-1)/n S per rank, not
        (n-1)/n S): measured on the emulated cluster's interface counters by launchers.lab.netbench
        (16.8 MB sent per 16 MiB reduce-scatter between 2 nodes) and by ZeRO-3 runs, whose
        gradient reduce-scatter (torch reduce_scatter_tensor through deepspeed.comm) shows the
        traffic of ZeRO-2's all-reduce.
        """
        op = self.op
        if self.backend == "gloo" and op == "reduce_scatter":
            op = "all_reduce"
        return ring_factor(op, self.group_size) * self.size_bytes * self.count_per_iter


@dataclass(frozen=True)
class CommPlan:
    """All communication of one iteration, for the busiest rank."""

    collectives: tuple[Collective, ...]
    """Per-collective list (reusable by a what-if model)."""
    assumptions: tuple[str, ...]
    """What the volume assumes (dtype, defaults, what is left out)."""

    @property
    def bytes_per_iter(self) -> float:
        """Bytes the busiest rank sends per iteration (sum over collectives; p2p: see ``plan``)."""
        return sum(c.wire_bytes_per_rank for c in self.collectives)

    def bytes_for(self, *, group: Group | None = None, purpose: str | None = None) -> float:
        """Wire bytes per rank of the collectives matching group and/or purpose prefix."""
        return sum(
            c.wire_bytes_per_rank
            for c in self.collectives
            if (group is None or c.group == group)
            and (purpose is None or c.purpose.startswith(purpose))
        )


def param_tensors(setup: RunSetup, stage: int = 0) -> list[tuple[str, int]]:
    """Parameter tensors (name, elements) held by one rank of pipeline ``stage``
    (:func:`formulas.gpt_parameter_tensors` of the setup; the FFN size is the setup's,
    4h when unknown). Checked against the logs' "number of parameters on (tensor, pipeline)
    model parallel rank" lines (tp2: 447488; pp2 rmsnorm: 477952 first stage, 478080 last
    stage); ZeRO-3 buckets and persistence need the tensors."""
    layers, h = setup.num_layers, setup.hidden_size
    s = setup.positions
    v, tp, pp = setup.padded_vocab_size, setup.tp or 1, setup.pp or 1
    if None in (layers, h, s, v):
        raise ValueError("num_layers, hidden_size, seq_length and padded_vocab_size are needed")
    assert layers is not None and h is not None and s is not None and v is not None
    norm = setup.normalization or "layernorm"
    return gpt_parameter_tensors(layers, h, s, v, norm, tp, pp, stage, ffn=setup.ffn_hidden_size)


def rank_parameters(setup: RunSetup) -> int:
    """Parameters held by the busiest rank before ZeRO partitioning (stage, TP shard)."""
    return max(sum(e for _, e in param_tensors(setup, st)) for st in range(setup.pp or 1))


def _group_link(setup: RunSetup, group: Group) -> Link:
    """Whether a group spans nodes, with Megatron's rank layout (TP fastest, then DP, then PP)
    and ranks placed node by node."""
    world, nodes = setup.world_size, setup.nodes
    tp, pp = setup.tp or 1, setup.pp or 1
    if world is None or nodes is None or world % nodes:
        return "unknown"
    if nodes == 1:
        return "intra-node"
    per_node = world // nodes
    num_pp_groups = world // pp
    if group == "tp":
        groups = [range(i * tp, (i + 1) * tp) for i in range(world // tp)]
    elif group in ("pp", "tied-embedding"):
        groups = [range(i, world, num_pp_groups) for i in range(num_pp_groups)]
    else:
        groups = [
            range(i * num_pp_groups + j, (i + 1) * num_pp_groups, tp)
            for i in range(pp)
            for j in range(tp)
        ]
    spans = any(len({r // per_node for r in g}) > 1 for g in groups)
    return "inter-node" if spans else "intra-node"


def plan(setup: RunSetup) -> tuple[CommPlan | None, str | None]:
    """Communication of one iteration from the setup; (None, reason) when it cannot be derived."""
    needed = ("num_layers", "hidden_size", "seq_length", "padded_vocab_size", "micro_batch_size")
    needed += ("tp", "pp", "dp", "zero_stage")
    missing = [k for k in needed if getattr(setup, k) is None]
    if missing or setup.gas is None:
        return None, "setup incomplete: " + ", ".join(missing or ["global batch size"])
    tp, pp, dp = setup.tp or 1, setup.pp or 1, setup.dp or 1
    zero, gas = setup.zero_stage or 0, setup.gas or 1
    b, s, h = setup.micro_batch_size or 1, setup.seq_length or 0, setup.hidden_size or 0
    layers, v = setup.num_layers or 0, setup.padded_vocab_size or 0
    precision = setup.precision or "fp32"
    recompute = bool(setup.activation_checkpointing)
    act_bytes = DTYPE_BYTES[precision]
    comm_bytes = DTYPE_BYTES.get(setup.communication_data_type or precision, act_bytes)
    assumptions = [
        f"precision {precision}{'' if setup.precision else ' (assumed: not stated)'}: "
        f"activations {act_bytes} B/element, gradients/parameters {comm_bytes} B/element",
        "ring algorithms; scalar collectives (loss, grad norm) left out",
    ]
    backend: Backend = "gloo" if setup.device == "cpu" else "nccl"
    if backend == "gloo":
        assumptions.append(
            "backend gloo (CPU): reduce-scatter moves all-reduce volume (measured on the wire)"
        )
    out: list[Collective] = []
    # The busiest rank: the pipeline stage holding the most parameters.
    stage_params = [sum(e for _, e in param_tensors(setup, st)) for st in range(pp)]
    psi = rank_parameters(setup)
    busiest = stage_params.index(psi)

    if dp > 1:
        link = _group_link(setup, "dp")
        grad_bytes = psi * comm_bytes
        if zero == 0:
            out.append(
                Collective(
                    "all_reduce", "gradients", grad_bytes, 1, "dp", dp, link,
                    "engine.py allreduce_gradients -> buffered_allreduce_fallback, once per step",
                )
            )  # fmt: skip
        elif zero in (1, 2):
            out.append(
                Collective(
                    "all_reduce", "gradients", grad_bytes, gas if zero == 2 else 1, "dp", dp, link,
                    "stage_1_and_2.py average_tensor (multi-rank bucket all-reduce); "
                    + ("every micro-step (ZeRO-2)" if zero == 2 else "at the GAS boundary"),
                )
            )  # fmt: skip
            out.append(
                Collective(
                    "all_gather", "parameters (after step)", psi * comm_bytes, 1, "dp", dp, link,
                    "stage_1_and_2.py step -> all_gather_dp_groups",
                )
            )  # fmt: skip
            bucket = setup.reduce_bucket_size or DEFAULT_REDUCE_BUCKET
            assumptions.append(
                f"ZeRO reduce bucket {bucket:,} elements: "
                f"{math.ceil(psi / bucket)} all-reduce call(s) per reduction, same bytes"
            )
        else:
            threshold = setup.param_persistence_threshold
            threshold = DEFAULT_PERSISTENCE_THRESHOLD if threshold is None else threshold
            tensors = param_tensors(setup, busiest)
            gathered = sum(e for _, e in tensors if e > threshold)
            persistent = psi - gathered
            # parameter_offload.py: the pre-forward hook fetches a module's partitioned
            # parameters (fetch_sub_module), the post-forward hook releases them, the
            # pre-backward hook fetches them again. With full recompute the checkpointed
            # forward runs once more inside backward, through the same hooks: a third gather.
            phases = ("forward", "recomputed forward", "backward") if recompute else (
                "forward", "backward")  # fmt: skip
            assumptions.append(
                f"ZeRO-3: {gathered:,} of {psi:,} parameters above the persistence threshold "
                f"({threshold:,} elements) are gathered in {', '.join(phases)} on every "
                "micro-step (no reuse across phases assumed); the rest persist"
            )
            if gathered:
                for phase in phases:
                    out.append(
                        Collective(
                            "all_gather", f"parameters ({phase})", gathered * comm_bytes, gas,
                            "dp", dp, link, "stage3 parameter fetch (partitioned_param_coord.)",
                        )
                    )  # fmt: skip
            out.append(
                Collective(
                    "reduce_scatter", "gradients", psi * comm_bytes, gas, "dp", dp, link,
                    "stage3.py __avg_scatter_grads -> reduce_scatter_coalesced, every micro-step",
                )
            )  # fmt: skip
            if persistent:
                out.append(
                    Collective(
                        "all_gather", "parameters (persistent, after step)",
                        persistent * comm_bytes, 1, "dp", dp, link, "stage3.py _post_step",
                    )
                )  # fmt: skip

    if pp > 1:
        link = _group_link(setup, "pp")
        partitioned = tp > 1
        act = b * s * h * act_bytes // (tp if partitioned else 1)
        out.append(
            Collective(
                "send_recv", "activations (forward)", act, gas, "pp", 2, link,
                "pipe/engine.py _exec_send_activations, one per micro-batch",
            )
        )  # fmt: skip
        if pp > 2:
            out.append(
                Collective(
                    "send_recv", "activation gradients (backward)", act, gas, "pp", 2, link,
                    "pipe/engine.py _exec_send_grads, one per micro-batch",
                )
            )  # fmt: skip
            assumptions.append("PP>2: a middle stage sends both activations and gradients")
        else:
            assumptions.append(
                "PP=2: the first stage sends activations, the last stage the same volume "
                "of gradients; the busiest rank sends one of the two"
            )
        if partitioned:
            assumptions.append(
                "PP with TP: activations sent partitioned (pipe_partitioned, 1/tp each); "
                "the TP all-gather that rebuilds them is left out"
            )
        out.append(
            Collective(
                "all_reduce", "tied embedding gradient", v * h // tp * comm_bytes, 1,
                "tied-embedding", 2, _group_link(setup, "tied-embedding"),
                "pipe/engine.py _exec_reduce_tied_grads, once per step",
            )
        )  # fmt: skip

    if tp > 1:
        link = _group_link(setup, "tp")
        layers_here = layers // pp
        # Embedding forward and LM-head backward: both on one rank without PP, one per end stage.
        ends = 2 if pp == 1 else 1
        # Per layer: the row-parallel outputs (attention dense, MLP fc2) all-reduce in forward,
        # the column-parallel inputs (QKV, fc1) in backward; full recompute runs the layer's
        # forward again inside backward (DeepSpeed activation_checkpointing/checkpointing.py and
        # Megatron's megatron/core/tensor_parallel/random.py: CheckpointFunction.backward calls
        # ctx.run_function again), so its 2 forward all-reduces run twice.
        per_layer = 6 if recompute else 4
        out.append(
            Collective(
                "all_reduce", "activations (TP forward + backward)", b * s * h * act_bytes,
                gas * (per_layer * layers_here + ends), "tp", tp, link,
                "megatron/core/tensor_parallel/mappings.py reduce/copy regions: 2 fwd + 2 bwd per "
                "layer" + (" + 2 in the recomputed fwd" if recompute else "")
                + ", embedding fwd, LM-head bwd",
            )
        )  # fmt: skip
        out.append(
            Collective(
                "all_reduce", "cross-entropy statistics", b * s * 4, gas * 3, "tp", tp, link,
                "megatron/core/tensor_parallel/cross_entropy.py: max, target logit, sum-exp",
            )
        )  # fmt: skip
    out = [replace(c, backend=backend) for c in out]
    return CommPlan(tuple(out), tuple(assumptions)), None


def gbps(bytes_: float, ms: float) -> float:
    """Gbit/s for ``bytes_`` in ``ms`` milliseconds: bytes * 8 / (ms / 1000) / 1e9."""
    if ms <= 0:
        raise ValueError(f"time({ms} ms) must be > 0")
    return bytes_ * 8 / (ms / 1000.0) / 1e9


def busbw_gbps(op: Op, size_bytes: float, ms: float, n: int) -> float:
    """nccl-tests bus bandwidth: algbw = S / t, busbw = algbw * ring_factor(op, n); Gbit/s."""
    return gbps(size_bytes, ms) * ring_factor(op, n)


def measured_busbw(
    netbench: dict[str, Any] | None, op: Op, size_bytes: float
) -> tuple[float | None, str]:
    """busbw (Gbit/s) from netbench.json for ``op`` at the message size nearest ``size_bytes``
    (log distance); (None, reason) without a usable measurement."""
    if not netbench:
        return None, "no netbench.json for this run"
    names = {op, op.replace("_", "")}  # nccl-tests and launchers.lab.netbench spell it "sendrecv"
    rows = [r for r in netbench.get("results") or [] if r.get("op") in names and r.get("bytes")]
    rows = [r for r in rows if isinstance(r.get("busbw_gbps"), int | float)]
    if not rows or size_bytes <= 0:
        return None, f"netbench.json has no {op} measurement"
    best = min(rows, key=lambda r: abs(math.log(r["bytes"] / size_bytes)))
    backend = netbench.get("backend", "?")
    return float(best["busbw_gbps"]), (
        f"netbench {backend} {op} at {best['bytes']:,} B (nearest to {size_bytes:,.0f} B)"
    )
