"""Typed records that the parser produces and the metrics consume.

These mirror the JSON contract of ``python -m analysis.parse LOG... --json`` (DESIGN.md):
``{"logs": [{"path": str, "runs": [RUN, ...]}]}``.  ``to_dict`` on each record gives that JSON.
All times are milliseconds and all memory figures MiB (bytes / 1024**2, which is what both
Megatron's ``report_memory`` and DeepSpeed's ``see_memory_usage`` print under the label "MB"),
whatever unit the log itself printed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

RunStatus = Literal["completed", "failed", "incomplete"]
"""``completed``: training reached its last iteration (or the launcher said every process exited
successfully); ``failed``: a failure was recognised; ``incomplete``: neither (log cut short)."""

FailureKind = Literal[
    "oom", "nccl", "exception", "killed", "time_limit", "cancelled", "hang", "other"
]
"""Closed set of failure kinds; ``nccl`` also covers gloo and other collective-backend errors."""

TimerSource = Literal["megatron", "deepspeed", "pipeline"]
"""Who printed a timer block: Megatron's ``Timers.log``, DeepSpeed's ``wall_clock_breakdown``
(``[Rank 0] time (ms) | ...``), or DeepSpeed's PipelineEngine (also ``time (ms)`` lines, but
totals over ``steps_per_print`` steps rather than per step)."""


@dataclass(frozen=True, slots=True)
class Failure:
    """Why a run did not complete."""

    kind: FailureKind
    """Closed classification of the failure."""
    message: str
    """The log line (prefixes stripped) that identified the failure."""
    line: int
    """1-based line number of that line in the file it came from."""


@dataclass(frozen=True, slots=True)
class Iteration:
    """One Megatron iteration line (or a PipelineEngine ``steps:`` line when no Megatron line)."""

    iteration: int
    """Iteration number as printed (1-based, the last iteration of the logging window)."""
    elapsed_ms: float | None = None
    """Mean wall time per iteration over the logging window, in ms (converted from s if needed)."""
    samples_per_s: float | None = None
    """Samples per second as printed."""
    tflops: float | None = None
    """TFLOPs per GPU as printed by Megatron (its own formula; recomputed in analysis.metrics)."""
    lm_loss: float | None = None
    """Language-model loss averaged over the window."""
    loss_scale: float | None = None
    """Dynamic loss scale (fp16) or 1.0."""
    grad_norm: float | None = None
    """Gradient norm, when printed."""
    skipped: int | None = None
    """Number of skipped iterations in the window."""
    nan: int | None = None
    """Number of NaN iterations in the window."""
    global_batch_size: int | None = None
    """Global batch size as printed."""
    learning_rate: float | None = None
    """Learning rate as printed."""
    consumed_samples: int | None = None
    """Consumed samples so far."""
    consumed_tokens: int | None = None
    """Consumed tokens so far, when printed."""
    tokens_per_gpu_per_s: float | None = None
    """Tokens per GPU per second as printed (Megatron-DeepSpeed's ``tgs``)."""
    train_iters: int | None = None
    """Total iterations planned (the N in ``iteration k/N``)."""
    line: int | None = None
    """1-based line number in the source file."""
    source: str | None = None
    """File the line came from (several files can feed one run)."""


@dataclass(frozen=True, slots=True)
class Memory:
    """One memory report, in MiB."""

    rank: int | None
    """Global rank that printed it, if the line says."""
    allocated_mb: float | None = None
    """Currently allocated tensor memory (MiB)."""
    max_allocated_mb: float | None = None
    """Peak allocated tensor memory (MiB)."""
    reserved_mb: float | None = None
    """Memory reserved by the caching allocator (MiB)."""
    max_reserved_mb: float | None = None
    """Peak reserved memory (MiB)."""
    kind: str = "megatron"
    """Which report printed it: ``megatron`` (report_memory), ``deepspeed`` (MemAllocated), or
    ``see_memory_usage`` (MA/Max_MA/CA/Max_CA in GB, converted)."""
    after_iteration: int | None = None
    """Iteration after which it was printed, when the line says (``(after 5 iterations)``)."""
    line: int | None = None
    """1-based line number in the source file."""


@dataclass(frozen=True, slots=True)
class TimerBlock:
    """One printed group of timers."""

    source: TimerSource
    """Who printed it."""
    values_ms: dict[str, float | tuple[float, float]]
    """Timer name -> ms; a ``(min, max)`` pair across ranks for Megatron minmax blocks."""
    rank: int | None = None
    """Rank that printed it (``[Rank 0]``), if stated."""
    iteration: int | None = None
    """Iteration the block belongs to, when it can be attributed (the next iteration line for
    per-step DeepSpeed timers; the preceding one for Megatron blocks)."""
    line: int | None = None
    """1-based line number in the source file."""


@dataclass(frozen=True, slots=True)
class PipelineStep:
    """DeepSpeed PipelineEngine ``steps: N loss: L iter time (s): T samples/sec: S`` line."""

    step: int
    """Optimizer step count."""
    loss: float | None
    """Loss printed by the engine."""
    iter_ms: float | None
    """Per-step time in ms (the line prints seconds)."""
    samples_per_s: float | None
    """Samples per second as printed."""
    line: int | None = None
    """1-based line number in the source file."""


@dataclass
class ParsedRun:
    """Everything one training run's log says. Mutable while the parser fills it."""

    status: RunStatus = "incomplete"
    """See ``RunStatus``."""
    failure: Failure | None = None
    """The first failure recognised, or None."""
    iterations: list[Iteration] = field(default_factory=list)
    """Iteration lines in file order, duplicates (same iteration from several ranks) removed."""
    memory: list[Memory] = field(default_factory=list)
    """Every Megatron ``memory (MB)`` report (``report_memory``: exact MiB, per rank)."""
    memory_other: list[Memory] = field(default_factory=list)
    """Coarser memory figures kept apart from ``memory``: DeepSpeed's ``MemAllocated=..GB``
    and ``see_memory_usage`` (``MA .. GB ... Max_CA .. GB``), printed in GB rounded to 2
    decimals (``Max_CA`` to a whole GB), so they must not feed a peak-memory figure."""
    timers: list[TimerBlock] = field(default_factory=list)
    """Every timer block."""
    pipeline_steps: list[PipelineStep] = field(default_factory=list)
    """PipelineEngine step lines."""
    config: dict[str, Any] = field(default_factory=dict)
    """Configuration recovered from the log: Megatron's ``arguments`` dump (typed values) and
    summary keys ``num_layers, hidden_size, num_attention_heads, seq_length, micro_batch_size,
    global_batch_size, tensor_model_parallel_size, pipeline_model_parallel_size,
    data_parallel_size, zero_stage, world_size, padded_vocab_size, num_parameters``."""
    ds_config: dict[str, Any] = field(default_factory=dict)
    """DeepSpeed's config dump, if printed."""
    ds_engine: dict[str, Any] = field(default_factory=dict)
    """DeepSpeed's ``DeepSpeedEngine configuration:`` attribute dump (typed), if printed."""
    versions: dict[str, str] = field(default_factory=dict)
    """Versions the log states (torch, deepspeed, megatron git hash)."""
    problems: list[str] = field(default_factory=list)
    """What the parser could not read or had to guess, in words (never raised)."""
    sources: list[str] = field(default_factory=list)
    """Files that fed this run."""
    first_line: int | None = None
    """1-based line where this run starts in its (first) file."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict following DESIGN.md's RUN contract (plus extra keys)."""
        d = asdict(self)
        for block in d["timers"]:
            block["values_ms"] = {
                k: (list(v) if isinstance(v, tuple) else v) for k, v in block["values_ms"].items()
            }
        return d
