"""Typed run specification: model, strategy, cluster, paths, and the one validator.

A :class:`RunSpec` is the single source of truth for a run. The Megatron argv, the DeepSpeed JSON,
the launcher command and the run's name are pure projections of it (``launchers.config.project``).
Each dataclass checks its own field ranges in ``__post_init__``; everything that relates several
fields (parallelism arithmetic, batch divisibility, DeepSpeed/upstream constraints) lives in
:func:`validate`, whose messages show the rule with the numbers.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, get_args

from pydantic import ConfigDict, TypeAdapter, ValidationError

from analysis.runs.record import describe_error
from analysis.theory.formulas import (
    Normalization,
    gpt_parameters,
    gpt_parameters_on_rank,
    padded_vocab_size,
)

Precision = Literal["fp32", "fp16", "bf16"]
"""Training precision. fp16 uses DeepSpeed's dynamic loss scaling."""

Device = Literal["cpu", "cuda"]
"""Accelerator DeepSpeed runs on (``DS_ACCELERATOR``)."""

LauncherMode = Literal["local", "pdsh", "openmpi", "slurm", "no_ssh"]
"""How the ``deepspeed`` launcher reaches the hosts: ``local`` (one host, no ssh), ``pdsh``
(DeepSpeed's default multi-node runner), ``openmpi``, ``slurm``, or ``no_ssh`` (the same script is
started on every node with its own ``--node_rank``)."""

Offload = Literal["none", "optimizer", "optimizer+params"]
"""ZeRO-Offload target: nothing, optimizer state to CPU (ZeRO >= 2), or also parameters (ZeRO-3)."""

ZeroStage = Literal[0, 1, 2, 3]
"""DeepSpeed ZeRO stage."""


PRECISIONS: tuple[str, ...] = get_args(Precision)
DEVICES: tuple[str, ...] = get_args(Device)
LAUNCHER_MODES: tuple[str, ...] = get_args(LauncherMode)
OFFLOADS: tuple[str, ...] = get_args(Offload)
ZERO_STAGES: tuple[int, ...] = get_args(ZeroStage)
TIMING_LOG_OPTIONS: tuple[str, ...] = ("minmax", "max", "all")
"""Megatron's ``--timing-log-option`` choices (upstream ``megatron/arguments.py``)."""


SPEC_DOCUMENT = ConfigDict(extra="forbid")
"""How run.json's ``spec`` sections are read back (:func:`spec_from_json`): a key that is not a
field is an error."""


class SpecError(ValueError):
    """A run specification that cannot run; the message states the rule and the numbers."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise SpecError(message)


def _positive(owner: str, **values: int) -> None:
    for key, value in values.items():
        _require(
            isinstance(value, int) and not isinstance(value, bool) and value >= 1,
            f"{owner}: {key} must be an integer >= 1, got {value!r}",
        )


def _one_of(owner: str, key: str, value: object, allowed: tuple[Any, ...]) -> None:
    _require(
        value in allowed,
        f"{owner}: {key} must be one of {', '.join(map(str, allowed))}; got {value!r}",
    )


@dataclass(frozen=True)
class ModelConfig:
    """A GPT model and its batch settings (one entry of ``megatron_configs/<name>.yaml``)."""

    __pydantic_config__ = SPEC_DOCUMENT

    name: str
    """Preset name; the first half of a run's name."""
    num_layers: int
    """Transformer layers (``--num-layers``)."""
    hidden_size: int
    """Hidden size h (``--hidden-size``)."""
    num_attention_heads: int
    """Attention heads (``--num-attention-heads``)."""
    seq_length: int
    """Tokens per sample (``--seq-length``)."""
    max_position_embeddings: int
    """Learned position embeddings (``--max-position-embeddings``); >= seq_length."""
    vocab_size: int
    """Tokenizer vocabulary before Megatron's padding (used for the parameter count and TFLOPs;
    Megatron itself reads the vocabulary from ``--vocab-file``)."""
    micro_batch_size: int
    """Samples per rank per micro-step (``--micro-batch-size``)."""
    global_batch_size: int
    """Samples per optimizer step over all data-parallel ranks (``--global-batch-size``)."""
    precision: Precision
    """Training precision."""
    ffn_hidden_size: int | None = None
    """MLP hidden size f (``--ffn-hidden-size``); None: Megatron's default 4h."""

    def __post_init__(self) -> None:
        owner = f"model {self.name!r}"
        _positive(
            owner,
            num_layers=self.num_layers,
            hidden_size=self.hidden_size,
            num_attention_heads=self.num_attention_heads,
            seq_length=self.seq_length,
            max_position_embeddings=self.max_position_embeddings,
            vocab_size=self.vocab_size,
            micro_batch_size=self.micro_batch_size,
            global_batch_size=self.global_batch_size,
        )
        _one_of(owner, "precision", self.precision, PRECISIONS)
        if self.ffn_hidden_size is not None:
            _positive(owner, ffn_hidden_size=self.ffn_hidden_size)

    def num_parameters(self, tp: int = 1, normalization: Normalization = "layernorm") -> int:
        """Parameters of one model replica (:func:`gpt_parameters`), the vocabulary padded as
        Megatron pads it for ``tp`` (multiple of 128 * TP), s the learned positions
        (``max_position_embeddings``)."""
        vocab = padded_vocab_size(self.vocab_size, tp)
        return gpt_parameters(self.num_layers, self.hidden_size, self.max_position_embeddings,
                              vocab, normalization, ffn=self.ffn_hidden_size)  # fmt: skip


@dataclass(frozen=True)
class Strategy:
    """A parallelism strategy (one entry of ``megatron_configs/strategies.yaml``).

    The data-parallel degree is not part of the preset: it follows from the cluster,
    dp = world_size / (tp * pp).
    """

    __pydantic_config__ = SPEC_DOCUMENT

    name: str
    """Preset name; the second half of a run's name."""
    tp: int
    """Tensor-parallel degree (``--tensor-model-parallel-size``)."""
    pp: int
    """Pipeline-parallel degree (``--pipeline-model-parallel-size``)."""
    zero_stage: ZeroStage
    """DeepSpeed ZeRO stage (``--zero-stage`` and ``zero_optimization.stage``)."""
    offload: Offload = "none"
    """ZeRO-Offload of optimizer state (and parameters) to CPU memory."""
    description: str = ""
    """One line for ``python -m launchers list``."""

    def __post_init__(self) -> None:
        owner = f"strategy {self.name!r}"
        _positive(owner, tp=self.tp, pp=self.pp)
        _one_of(owner, "zero_stage", self.zero_stage, ZERO_STAGES)
        _one_of(owner, "offload", self.offload, OFFLOADS)


@dataclass(frozen=True)
class Host:
    """One line of a hostfile."""

    name: str
    """Host name as ssh/pdsh reach it (letters, digits, ``.``, ``_``, ``-``)."""
    slots: int
    """Ranks started on this host (GPUs, or processes on CPU)."""

    def __post_init__(self) -> None:
        _positive(f"host {self.name!r}", slots=self.slots)


@dataclass(frozen=True)
class Cluster:
    """The hosts a run uses, read from a DeepSpeed hostfile (``launchers.config.hostfile``)."""

    hostfile: str
    """Path of the hostfile as given (a copy is written into the run directory)."""
    hosts: tuple[Host, ...]
    """Hosts in file order; the first one is the default master address."""
    text: str = field(default="", repr=False, compare=False)
    """The hostfile's text, copied into the run directory and its provenance."""

    def __post_init__(self) -> None:
        _require(len(self.hosts) >= 1, f"cluster {self.hostfile}: no hosts")
        names = [h.name for h in self.hosts]
        _require(len(set(names)) == len(names), f"cluster {self.hostfile}: duplicate hosts")

    @property
    def world_size(self) -> int:
        """Total ranks: the sum of the slots."""
        return sum(h.slots for h in self.hosts)

    @property
    def slots(self) -> tuple[int, ...]:
        """Slots per host, in file order."""
        return tuple(h.slots for h in self.hosts)


@dataclass(frozen=True)
class RunPaths:
    """Where the code, the data and the executables are (same paths on every node)."""

    __pydantic_config__ = SPEC_DOCUMENT

    upstream_dir: str
    """Checkout of microsoft/Megatron-DeepSpeed (holds ``pretrain_gpt.py``)."""
    data_path: str
    """Indexed dataset prefix (``--data-path``; files ``<prefix>.bin`` and ``<prefix>.idx``)."""
    vocab_file: str
    """GPT-2 BPE ``vocab.json`` (``--vocab-file``)."""
    merge_file: str
    """GPT-2 BPE ``merges.txt`` (``--merge-file``)."""
    python: str
    """Python interpreter of the environment that has torch and deepspeed."""
    deepspeed: str
    """The ``deepspeed`` launcher script of that environment."""

    def __post_init__(self) -> None:
        for key, value in asdict(self).items():
            _require(isinstance(value, str) and value != "", f"paths: {key} must be a path")


PLACEHOLDER_PATHS = RunPaths(
    upstream_dir="/opt/Megatron-DeepSpeed",
    data_path="/data/tiny/tiny_text_document",
    vocab_file="/data/tiny/vocab.json",
    merge_file="/data/tiny/merges.txt",
    python="/venv/bin/python",
    deepspeed="/venv/bin/deepspeed",
)
"""Machine-independent paths for golden files and examples (nothing exists there)."""


@dataclass(frozen=True)
class Adjustment:
    """A value the resolver changed from what the preset or the user asked, and why."""

    __pydantic_config__ = SPEC_DOCUMENT

    key: str
    """Setting that changed (an override key, e.g. ``micro_batch_size``)."""
    requested: Any
    """Value from the preset or the command line."""
    applied: Any
    """Value the run uses."""
    reason: str
    """Why (e.g. the upstream failure the requested value causes on this device)."""


@dataclass(frozen=True)
class Training:
    """Schedule and optimizer settings; defaults are those of the lab runs in UPSTREAM.md."""

    __pydantic_config__ = SPEC_DOCUMENT

    train_iters: int
    """Optimizer steps (``--train-iters``)."""
    log_interval: int
    """Steps between Megatron iteration lines (``--log-interval``) and DeepSpeed prints."""
    activation_checkpointing: bool
    """Recompute activations in backward (``--checkpoint-activations``)."""
    seed: int = 1234
    """Random seed (``--seed``; Megatron's default)."""
    lr: float = 1.0e-3
    """Peak learning rate (``--lr``)."""
    min_lr: float = 1.0e-4
    """Final learning rate of the cosine decay (``--min-lr``)."""
    lr_warmup_iters: int = 2
    """Linear warm-up steps (``--lr-warmup-iters``)."""
    weight_decay: float = 0.01
    """AdamW weight decay (``--weight-decay``)."""
    clip_grad: float = 1.0
    """Gradient-norm clipping (``--clip-grad`` and DeepSpeed ``gradient_clipping``)."""

    def __post_init__(self) -> None:
        _positive("training", train_iters=self.train_iters, log_interval=self.log_interval)
        _require(
            isinstance(self.lr_warmup_iters, int) and self.lr_warmup_iters >= 0,
            f"training: lr_warmup_iters must be an integer >= 0, got {self.lr_warmup_iters!r}",
        )
        _require(self.lr > 0, f"training: lr must be > 0, got {self.lr!r}")
        _require(
            0 <= self.min_lr <= self.lr,
            f"training: 0 <= min_lr({self.min_lr}) <= lr({self.lr}) does not hold",
        )
        _require(
            self.weight_decay >= 0, f"training: weight_decay must be >= 0, got {self.weight_decay}"
        )
        _require(self.clip_grad >= 0, f"training: clip_grad must be >= 0, got {self.clip_grad}")


@dataclass(frozen=True)
class RunSpec:
    """Everything that determines a run; validated once by :func:`validate` on construction."""

    model: ModelConfig
    """Model architecture, batch and precision."""
    strategy: Strategy
    """Parallelism strategy (TP, PP, ZeRO, offload)."""
    cluster: Cluster
    """Hosts and slots; fixes the world size and so the data-parallel degree."""
    training: Training
    """Iterations, logging, schedule."""
    device: Device
    """Accelerator."""
    launcher: LauncherMode
    """How the ``deepspeed`` launcher starts the ranks."""
    paths: RunPaths
    """Code, data and executables."""
    master_addr: str
    """Rendezvous address (the first host unless overridden)."""
    master_port: int = 29500
    """Rendezvous TCP port."""
    adjustments: tuple[Adjustment, ...] = ()
    """Values the resolver changed from the preset or the request, with reasons."""
    ssh_check: bool = True
    """Let DeepSpeed's runner check ssh to every host first (pdsh). Off in the emulated lab,
    whose ssh needs the lab's own client config, which that check does not use; the lab checks
    ssh to every node itself when it starts."""
    network: str = ""
    """The network the run is on, when the project set it up (``emulated 2 nodes x 100mbit``);
    empty on a real cluster, whose network is what it is."""
    data_vocab_size: int | None = None
    """Tokens in the data's vocabulary (``vocab_file``) as Megatron's tokenizer counts them, None
    when it could not be read. Megatron pads them to :attr:`padded_vocab_size` (dummy rows), so
    the model has the shape its preset names whatever the data's tokenizer, as long as it is
    not larger."""
    profile_steps: tuple[int, int] | None = None
    """Iterations (1-based, first and last included) that upstream's PyTorch profiler records on
    every rank (``--profile pt --profile_steps A,B``; the traces land in the run's
    ``tensorboard/``); None: no profiler. :func:`steady_profile_steps` chooses them."""
    timing_log_option: str = "minmax"
    """Megatron's ``--timing-log-option``: ``minmax`` (each timer's min and max over ranks),
    ``max``, or ``all`` (every rank's time, which the report reads to name straggler ranks)."""
    schedule_timers: bool = False
    """Whether the ranks start through ``launchers/run/schedule_timers.py``, which gives upstream's
    schedule the timers it reads from the model's config: ``forward-compute`` and
    ``backward-compute`` per rank (never timed under DeepSpeed otherwise). On with ``--timers
    all``: between an iteration's collectives they are a rank's own work."""

    def __post_init__(self) -> None:
        _one_of("run", "device", self.device, DEVICES)
        _one_of("run", "launcher", self.launcher, LAUNCHER_MODES)
        _one_of("run", "timing_log_option", self.timing_log_option, TIMING_LOG_OPTIONS)
        _require(
            isinstance(self.schedule_timers, bool),
            f"run: schedule_timers must be true or false, got {self.schedule_timers!r}",
        )
        _require(
            isinstance(self.master_port, int) and 1 <= self.master_port <= 65535,
            f"run: master_port must be an integer in 1..65535, got {self.master_port!r}",
        )
        validate(self)

    @property
    def name(self) -> str:
        """``<model>-<strategy>``: the run directory's parent under ``logs/``."""
        return f"{self.model.name}-{self.strategy.name}"

    @property
    def world_size(self) -> int:
        """Total ranks."""
        return self.cluster.world_size

    @property
    def dp(self) -> int:
        """Data-parallel degree, world_size / (tp * pp) (exact once validated)."""
        return self.world_size // (self.strategy.tp * self.strategy.pp)

    @property
    def gradient_accumulation_steps(self) -> int:
        """Micro-steps per optimizer step: global / (micro * dp)."""
        return self.model.global_batch_size // (self.model.micro_batch_size * self.dp)

    @property
    def normalization(self) -> Normalization:
        """RMSNorm on CPU with PP > 1 (torch LayerNorm rejects ``sequence_parallel=`` there)."""
        return "rmsnorm" if self.device == "cpu" and self.strategy.pp > 1 else "layernorm"

    @property
    def padded_vocab_size(self) -> int:
        """Embedding rows: the model's ``vocab_size`` padded as Megatron pads for this TP
        (multiple of 128 * TP); the run passes ``--make-vocab-size-divisible-by`` so that
        Megatron pads the data's tokenizer to exactly this."""
        return padded_vocab_size(self.model.vocab_size, self.strategy.tp)

    @property
    def num_parameters(self) -> int:
        """Parameters of one replica (:func:`gpt_parameters`), as this run builds it."""
        m = self.model
        return gpt_parameters(m.num_layers, m.hidden_size, m.max_position_embeddings,
                              self.padded_vocab_size, self.normalization,
                              ffn=m.ffn_hidden_size)  # fmt: skip

    @property
    def parameters_per_stage(self) -> list[int]:
        """What upstream prints per (tensor, pipeline) rank, by pipeline stage (the same on
        every tensor rank): :func:`gpt_parameters_on_rank`."""
        m, s = self.model, self.strategy
        return [
            gpt_parameters_on_rank(m.num_layers, m.hidden_size, m.max_position_embeddings,
                                   self.padded_vocab_size, self.normalization, s.tp, s.pp, stage,
                                   ffn=m.ffn_hidden_size)
            for stage in range(s.pp)
        ]  # fmt: skip


def validate(spec: RunSpec) -> None:
    """Check every cross-field rule; raise one :class:`SpecError` listing all violations.

    Each message states the rule with the numbers, e.g. ``tp(2) * pp(2) * dp(0) !=
    world_size(2)``, so that the fix is evident before anything starts.
    """
    m, s, c = spec.model, spec.strategy, spec.cluster
    tp, pp, world = s.tp, s.pp, c.world_size
    dp = world // (tp * pp)
    problems: list[str] = []

    def check(ok: bool, message: str) -> None:
        if not ok:
            problems.append(message)

    check(
        tp * pp * dp == world and dp >= 1,
        f"tp({tp}) * pp({pp}) * dp({dp}) != world_size({world}): strategy {s.name!r} needs a "
        f"world size that is a multiple of tp * pp = {tp * pp} "
        f"(hostfile {c.hostfile} has slots {'+'.join(map(str, c.slots))} = {world})",
    )
    check(
        m.num_attention_heads % tp == 0,
        f"num_attention_heads({m.num_attention_heads}) % tp({tp}) = "
        f"{m.num_attention_heads % tp} != 0: tensor parallelism splits the heads",
    )
    check(
        m.num_layers % pp == 0,
        f"num_layers({m.num_layers}) % pp({pp}) = {m.num_layers % pp} != 0: "
        "pipeline stages hold equal numbers of layers",
    )
    check(
        m.hidden_size % m.num_attention_heads == 0,
        f"hidden_size({m.hidden_size}) % num_attention_heads({m.num_attention_heads}) = "
        f"{m.hidden_size % m.num_attention_heads} != 0",
    )
    check(
        m.seq_length <= m.max_position_embeddings,
        f"seq_length({m.seq_length}) > max_position_embeddings({m.max_position_embeddings})",
    )
    if dp >= 1:
        per_step = m.micro_batch_size * dp
        check(
            m.global_batch_size % per_step == 0,
            f"global_batch_size({m.global_batch_size}) % (micro_batch_size({m.micro_batch_size})"
            f" * dp({dp})) = {m.global_batch_size % per_step} != 0: gradient accumulation "
            "needs a whole number of micro-steps",
        )
    check(
        not (pp > 1 and s.zero_stage >= 2),
        f"pp({pp}) > 1 with zero_stage({s.zero_stage}): ZeRO-2 and ZeRO-3 are incompatible with "
        "pipeline parallelism (DeepSpeed PipelineEngine assertion); use ZeRO 0 or 1 with PP",
    )
    check(
        s.offload == "none" or s.zero_stage >= 2,
        f"offload {s.offload!r} with zero_stage({s.zero_stage}): ZeRO-Offload needs "
        "zero_stage >= 2",
    )
    check(
        s.offload != "optimizer+params" or s.zero_stage == 3,
        f"offload 'optimizer+params' with zero_stage({s.zero_stage}): parameter offload needs "
        "zero_stage == 3",
    )
    padded = padded_vocab_size(m.vocab_size, tp)
    check(
        spec.data_vocab_size is None or spec.data_vocab_size <= padded,
        f"the data's tokenizer has {spec.data_vocab_size} tokens > vocab_size({m.vocab_size}) "
        f"padded to {padded}: Megatron would build a larger embedding than the spec says; set "
        f"vocab_size >= {spec.data_vocab_size}",
    )
    check(
        not (spec.device == "cpu" and m.precision == "fp16"),
        "precision 'fp16' on device cpu: DeepSpeed's CPU accelerator trains in fp32 or bf16 "
        "(--set precision=fp32 or precision=bf16)",
    )
    check(
        m.micro_batch_size == 1,
        f"micro_batch_size({m.micro_batch_size}) != 1: upstream's non-flash attention fails "
        "with 'view size is not compatible with input tensor's size and stride' on every device",
    )
    check(
        not (spec.device == "cpu" and spec.training.activation_checkpointing and pp > 1),
        f"activation_checkpointing with pp({pp}) > 1 on device cpu: DeepSpeed's pipeline "
        "recomputes through deepspeed.checkpointing, which needs an accelerator stream that "
        "DeepSpeed's CPU accelerator does not have (activation_checkpointing/checkpointing.py: "
        "get_accelerator().Stream is None); drop activation_checkpointing=true or use pp 1",
    )
    check(
        spec.launcher != "local" or len(c.hosts) == 1,
        f"launcher 'local' starts ranks on this machine only, but hostfile {c.hostfile} lists "
        f"{len(c.hosts)} hosts; use pdsh, openmpi, slurm or no_ssh",
    )
    if spec.profile_steps is not None:
        first, last = spec.profile_steps
        iters = spec.training.train_iters
        check(
            1 <= first <= last <= iters,
            f"profile_steps({first},{last}): 1 <= first <= last <= train_iters({iters}) does not "
            "hold; profile iterations the run makes",
        )
    if problems:
        raise SpecError(f"invalid run {spec.name}:\n  " + "\n  ".join(problems))


def steady_profile_steps(training: Training) -> tuple[int, int]:
    """The iterations a profiled run records: its last whole logging window. It lies past every
    window the steady-state rule may call warm-up (at most a third of the windows, at least the
    first: ``analysis.theory.formulas.WARMUP_CAP``); the text log's line closing it times
    exactly these iterations; and the profiler's trace export (seconds, after the last recorded
    step) and whatever the profiler leaves behind come after the last logged iteration,
    outside every window the report times.

    Raises :class:`SpecError` when the run logs fewer than two windows (the first is warm-up).
    """
    every, iters = training.log_interval, training.train_iters
    windows = iters // every
    if windows < 2:  # the last window is past the cap of windows // WARMUP_CAP from 2 on
        raise SpecError(
            f"profile: train_iters({iters}) // log_interval({every}) = {windows} logging "
            "window(s): the first is warm-up, so none is left to profile; set train_iters >= "
            f"{2 * every} (--set train_iters=...)"
        )
    return (windows - 1) * every + 1, windows * every


# ---------------------------------------------------------------------------------------------
# JSON form (run.json "spec") and back


def spec_to_json(spec: RunSpec) -> dict[str, Any]:
    """The resolved spec as plain JSON (the ``spec`` entry of ``run.json``)."""
    model = {  # (an FFN of the default 4h is left out: the specs of earlier runs keep their hash)
        k: v for k, v in asdict(spec.model).items() if not (k == "ffn_hidden_size" and v is None)
    } | {
        "num_parameters": spec.num_parameters,
        "padded_vocab_size": spec.padded_vocab_size,
        "parameters_per_stage": spec.parameters_per_stage,
        "normalization": spec.normalization,
    }
    strategy = {
        "name": spec.strategy.name,
        "tp": spec.strategy.tp,
        "pp": spec.strategy.pp,
        "dp": spec.dp,
        "zero_stage": spec.strategy.zero_stage,
        "offload": spec.strategy.offload,
        "description": spec.strategy.description,
    }
    cluster = {
        "hostfile": spec.cluster.hostfile,
        "hosts": [h.name for h in spec.cluster.hosts],
        "slots": list(spec.cluster.slots),
        "world_size": spec.world_size,
    }
    doc = {
        "name": spec.name,
        "model": model,
        "strategy": strategy,
        "cluster": cluster,
        **asdict(spec.training),
        "gradient_accumulation_steps": spec.gradient_accumulation_steps,
        "device": spec.device,
        "launcher": spec.launcher,
        "master_addr": spec.master_addr,
        "master_port": spec.master_port,
        "adjustments": [asdict(a) for a in spec.adjustments],
        "paths": asdict(spec.paths),
        "ssh_check": spec.ssh_check,
        "network": spec.network,
        "data_vocab_size": spec.data_vocab_size,
    } | ({"profile_steps": list(spec.profile_steps)} if spec.profile_steps else {})
    if spec.timing_log_option != "minmax":  # (absent at the default: hashes stay as they were)
        doc["timing_log_option"] = spec.timing_log_option
    if spec.schedule_timers:  # (absent when off, as above)
        doc["schedule_timers"] = True
    return doc


_DERIVED_MODEL_KEYS = (
    "num_parameters",
    "padded_vocab_size",
    "parameters_per_stage",
    "normalization",
)
"""Keys of run.json's ``spec.model`` derived from the spec (not read back)."""


@dataclass(frozen=True)
class ClusterDocument:
    """run.json's ``spec.cluster``."""

    __pydantic_config__ = SPEC_DOCUMENT

    hostfile: str
    """Path of the hostfile."""
    hosts: list[str]
    """Host names, in hostfile order."""
    slots: list[int]
    """Slots of each host."""
    world_size: int | None = None
    """Their sum (derived: not read back)."""


@dataclass(frozen=True)
class SpecDocument:
    """run.json's ``spec`` as :func:`spec_to_json` writes it, its training keys gathered under
    ``training`` and the derived model and strategy keys left out."""

    __pydantic_config__ = SPEC_DOCUMENT

    model: ModelConfig
    """The model."""
    strategy: Strategy
    """The strategy."""
    cluster: ClusterDocument
    """Hosts and slots."""
    training: Training
    """Training settings (top-level keys of the document)."""
    device: Device
    """The accelerator."""
    launcher: LauncherMode
    """The launcher mode."""
    paths: RunPaths
    """Upstream, data and executables."""
    master_addr: str
    """Rendezvous host."""
    master_port: int
    """Rendezvous port."""
    adjustments: tuple[Adjustment, ...] = ()
    """What resolution changed, and why."""
    ssh_check: bool = True
    """Whether the launcher checks ssh to every node."""
    network: str = ""
    """The network the run used (an emulated lab's label), or empty."""
    data_vocab_size: int | None = None
    """The tokenizer's vocabulary, None when it could not be read."""
    profile_steps: tuple[int, int] | None = None
    """The profiled iterations (absent: no profiler)."""
    timing_log_option: str = "minmax"
    """Megatron's ``--timing-log-option`` (absent: ``minmax``)."""
    schedule_timers: bool = False
    """Whether the schedule's compute timers were on (absent: off)."""
    name: str | None = None
    """The run's name (derived: not read back)."""
    gradient_accumulation_steps: int | None = None
    """Micro-batches per step (derived: not read back)."""


_SPEC_READER = TypeAdapter(SpecDocument)
"""pydantic's reader of run.json's ``spec``: JSON types strictly (``"8"`` is not an integer)."""


def spec_from_json(
    data: dict[str, Any], hostfile_text: str = "", source: str = "run.json"
) -> RunSpec:
    """Rebuild a :class:`RunSpec` from :func:`spec_to_json` output (derived keys are ignored).

    Raises :class:`SpecError` naming ``source``, the field path under ``spec`` and the fix, or
    the spec's own rule that the values break.
    """
    if not isinstance(data, dict):
        raise SpecError(f"{source}: spec: {type(data).__name__} is not an object; write one")
    training_keys = Training.__dataclass_fields__.keys()
    body: dict[str, Any] = {k: v for k, v in data.items() if k not in training_keys}
    body["training"] = {k: data[k] for k in training_keys if k in data}
    if isinstance(body.get("model"), dict):
        body["model"] = {k: v for k, v in body["model"].items() if k not in _DERIVED_MODEL_KEYS}
    if isinstance(body.get("strategy"), dict):
        body["strategy"] = {k: v for k, v in body["strategy"].items() if k != "dp"}
    try:
        doc = _SPEC_READER.validate_json(json.dumps(body), strict=True)
    except ValidationError as err:
        first = err.errors()[0]
        cause = (first.get("ctx") or {}).get("error")
        if isinstance(cause, SpecError):  # a rule of the spec's own (``__post_init__``)
            raise cause from None
        if tuple(first["loc"][:1]) == ("training",):  # training keys are top-level keys
            first = {**first, "loc": tuple(first["loc"][1:])}
        raise SpecError(describe_error(first, f"{source}: spec", SpecDocument)) from None
    if len(doc.cluster.hosts) != len(doc.cluster.slots):
        raise SpecError(
            f"{source}: spec: cluster.hosts ({len(doc.cluster.hosts)}) and cluster.slots "
            f"({len(doc.cluster.slots)}) differ in length; write one slot count per host"
        )
    hosts = tuple(Host(n, k) for n, k in zip(doc.cluster.hosts, doc.cluster.slots, strict=True))
    return RunSpec(
        model=doc.model,
        strategy=doc.strategy,
        cluster=Cluster(doc.cluster.hostfile, hosts, hostfile_text),
        training=doc.training,
        device=doc.device,
        launcher=doc.launcher,
        paths=doc.paths,
        master_addr=doc.master_addr,
        master_port=doc.master_port,
        adjustments=doc.adjustments,
        ssh_check=doc.ssh_check,
        network=doc.network,
        data_vocab_size=doc.data_vocab_size,
        profile_steps=doc.profile_steps,
        timing_log_option=doc.timing_log_option,
        schedule_timers=doc.schedule_timers,
    )


def spec_hash(spec: RunSpec) -> str:
    """Stable SHA-256 (16 hex digits) of the resolved spec, independent of the hostfile's path.

    Two runs with the same hash ran the same command on the same hosts with the same data. On
    a network the project emulates, the node addresses are assigned anew for every lab and do not
    define the run: there the hash keeps the slots per node and the network, not the addresses.
    """
    data = spec_to_json(spec)
    data["cluster"] = {k: v for k, v in data["cluster"].items() if k != "hostfile"}
    if spec.network:
        data["cluster"].pop("hosts")
        data.pop("master_addr")
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]
