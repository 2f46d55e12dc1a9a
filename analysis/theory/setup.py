"""What a run was: the setup that ``analysis.runs.load`` resolves from every source of a run
(run.json, the command line, the DeepSpeed config, the log), and that the byte, time and memory
models (``comm``, ``costs``, ``calibration``, ``prediction``, ``whatif``) read."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from analysis.theory.units import count

Precision = Literal["fp32", "fp16", "bf16"]
"""Training precision of weights and activations."""


@dataclass(frozen=True)
class RunSetup:
    """What a run was: model, batch, parallelism, cluster and network, each field optional."""

    model: str | None = None
    """Preset name (``tiny``/``small``/``large``) or ``custom-l{l}-h{h}-a{a}-s{s}``."""
    num_layers: int | None = None
    """Transformer layers ``l``."""
    hidden_size: int | None = None
    """Hidden size ``h``."""
    num_attention_heads: int | None = None
    """Attention heads ``a``."""
    seq_length: int | None = None
    """Sequence length ``s`` (tokens per sample)."""
    max_position_embeddings: int | None = None
    """Learned position embeddings (``--max-position-embeddings``, >= s; default s)."""
    ffn_hidden_size: int | None = None
    """MLP hidden size (Megatron default 4h)."""
    vocab_size: int | None = None
    """Tokenizer vocabulary before padding, when known."""
    padded_vocab_size: int | None = None
    """Vocabulary after Megatron's padding to a multiple of 128 x TP (``V`` in the formulas)."""
    normalization: str | None = None
    """``layernorm`` (weight + bias, 2h parameters) or ``rmsnorm`` (weight only, h)."""
    micro_batch_size: int | None = None
    """Samples per micro-batch per data-parallel rank ``b``."""
    global_batch_size: int | None = None
    """Samples per optimizer step over all data-parallel ranks ``B``."""
    precision: Precision | None = None
    """Weights/activation precision."""
    activation_checkpointing: bool | None = None
    """Full activation recompute (adds one forward pass to the FLOPs)."""
    strategy: str | None = None
    """Strategy name (``baseline``, ``pipeline``, ``tensor``, ``zero1``..., ``hybrid-...``)."""
    tp: int | None = None
    """Tensor-model-parallel size."""
    pp: int | None = None
    """Pipeline-model-parallel size."""
    dp: int | None = None
    """Data-parallel size (world / (tp * pp))."""
    zero_stage: int | None = None
    """DeepSpeed ZeRO stage 0-3."""
    offload: bool | None = None
    """ZeRO optimizer/parameter offload to CPU."""
    world_size: int | None = None
    """Total ranks."""
    nodes: int | None = None
    """Number of machines (1 for a single machine, e.g. ``deepspeed --num_gpus N``)."""
    device: Literal["cpu", "cuda"] | None = None
    """Accelerator: on ``cpu`` DeepSpeed reports process RSS as memory."""
    train_iters: int | None = None
    """Iterations the run was asked to train."""
    log_interval: int | None = None
    """Megatron's ``--log-interval``: iteration lines are averages over that many iterations."""
    steps_per_print: int | None = None
    """DeepSpeed ``steps_per_print`` (PipelineEngine timer totals cover that many steps)."""
    wall_clock_breakdown: bool | None = None
    """DeepSpeed per-step timers enabled."""
    reduce_bucket_size: int | None = None
    """ZeRO ``reduce_bucket_size`` in elements (DeepSpeed default 5e8)."""
    param_persistence_threshold: int | None = None
    """ZeRO-3 ``stage3_param_persistence_threshold`` in elements (DeepSpeed default 1e5)."""
    communication_data_type: str | None = None
    """DeepSpeed ``communication_data_type`` override, when set."""
    link_mbit: float | None = None
    """Inter-node link rate, Mbit/s (run.json network, else the run name, e.g. ``1000mbit``)."""
    latency_ms: float | None = None
    """Emulated one-way latency, ms, when known."""
    node_cpus: float | None = None
    """Cores each node may use, when capped (the lab's per-node CPU budget, run.json
    ``network.node_cpu.cpus``); None when the nodes' compute is not known to be bounded."""
    sources: dict[str, str] = field(default_factory=dict)
    """Field name -> where its value came from (``run.json``, ``cmd``, ``ds_config``, ``log``,
    ``name``, ``derived``)."""

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "world_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name}({value}) must be >= 1")
        if None not in (self.tp, self.pp, self.dp, self.world_size) and (
            self.tp * self.pp * self.dp != self.world_size  # type: ignore[operator]
        ):
            raise ValueError(
                f"tp({self.tp}) * pp({self.pp}) * dp({self.dp}) != world_size({self.world_size})"
            )
        if self.zero_stage is not None and self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_stage({self.zero_stage}) not in 0..3")

    @property
    def positions(self) -> int | None:
        """Learned positions in the parameter count: ``max_position_embeddings``, else s."""
        return self.max_position_embeddings or self.seq_length

    @property
    def gas(self) -> int | None:
        """Gradient-accumulation steps = B / (b * dp) (micro-batches per step per replica)."""
        if None in (self.global_batch_size, self.micro_batch_size, self.dp):
            return None
        return self.global_batch_size // (self.micro_batch_size * self.dp)  # type: ignore[operator]

    @property
    def setup_key(self) -> str:
        """Runs are compared only within one key: model, cluster shape and network."""
        nodes = count(self.nodes or None, "node")
        world = count(self.world_size, "rank")
        link = f"{self.link_mbit:g} Mbit/s" if self.link_mbit is not None else "unknown link"
        if self.nodes == 1:
            link = "one machine"
        return f"{self.model or 'unknown model'} / {nodes}, {world} / {link}"
