"""The one reader of the preset files (``megatron_configs/``), for the launcher and the analyzer.

A model preset is one YAML file (``tiny.yaml`` ...: ``description``, ``model:``, ``training:``);
the strategies are the entries of ``strategies.yaml``. The documents are pydantic models that
forbid unknown keys; every value is converted by :func:`coerce` (the rule ``--set key=value``
follows too), and a file that does not read says which file, which key and what was expected
(:class:`PresetError`). ``launchers.config.presets`` builds its run specs from these documents;
:func:`model_table` and :func:`strategy_table` are the shapes the analyzer names runs by.
"""

from __future__ import annotations

import functools
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

CONFIG_DIR = Path(__file__).resolve().parents[2] / "megatron_configs"
"""Directory of the preset YAML files."""

STRATEGIES_FILE = "strategies.yaml"
"""The strategy registry inside :data:`CONFIG_DIR`; every other ``*.yaml`` there is a model."""

CORE_STRATEGIES = ("baseline", "pipeline", "tensor", "zero1", "zero2", "zero3")
"""The six strategies every model is compared on (``matrix --strategies core``)."""


class PresetError(ValueError):
    """A preset file or an override that cannot be used; says which file/key and the fix."""


# ---------------------------------------------------------------------------------- values

_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


def type_name(kind: Any) -> str:
    """How a value's expected type is written in messages (``one of fp32, fp16, bf16``)."""
    if get_origin(kind) is Literal:
        return "one of " + ", ".join(map(str, get_args(kind)))
    return getattr(kind, "__name__", str(kind))


def coerce(key: str, value: Any, kind: Any) -> Any:
    """Convert ``value`` (a string from the command line, or a YAML scalar) to ``kind``.

    Raises ``ValueError`` with what was expected; callers add the file or flag.
    """
    expected = type_name(kind)
    if get_origin(kind) in (Union, types.UnionType):
        if value is None and type(None) in get_args(kind):
            return None
        kind = next(a for a in get_args(kind) if a is not type(None))
    if get_origin(kind) is Literal:
        allowed = get_args(kind)
        for option in allowed:
            if value == option or (isinstance(value, str) and value == str(option)):
                return option
        raise ValueError(f"{key} must be {expected}; got {value!r}")
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in _TRUE | _FALSE:
            return value.lower() in _TRUE
        raise ValueError(f"{key} must be true or false; got {value!r}")
    if kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str):
            try:
                return int(value, 10)
            except ValueError:
                pass
        raise ValueError(f"{key} must be an integer; got {value!r}")
    if kind is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ValueError(f"{key} must be a number; got {value!r}")
    if kind is str:
        if isinstance(value, str) and value:
            return value
        raise ValueError(f"{key} must be a non-empty string; got {value!r}")
    raise TypeError(f"no coercion for {key}: {kind!r}")  # a new field type; extend coerce


class _Section(BaseModel):
    """A mapping of known keys, each value converted by :func:`coerce`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*", mode="before")
    @classmethod
    def _coerce(cls, value: Any, info: ValidationInfo) -> Any:
        assert info.field_name is not None
        return coerce(info.field_name, value, cls.model_fields[info.field_name].annotation)


# ------------------------------------------------------------------------------- documents

Precision = Literal["fp32", "fp16", "bf16"]
"""Training precision."""


class ModelSection(_Section):
    """A model preset's ``model:`` section: the GPT and its batch."""

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
    """Tokenizer vocabulary before Megatron's padding."""
    micro_batch_size: int
    """Samples per rank per micro-step (``--micro-batch-size``)."""
    global_batch_size: int
    """Samples per optimizer step over all data-parallel ranks (``--global-batch-size``)."""
    precision: Precision
    """Training precision."""
    ffn_hidden_size: int | None = None
    """MLP hidden size f (``--ffn-hidden-size``); absent: Megatron's 4h."""


class TrainingSection(_Section):
    """A model preset's ``training:`` section; a key left out takes the launcher's default."""

    train_iters: int
    """Optimizer steps (``--train-iters``)."""
    log_interval: int
    """Steps between Megatron iteration lines (``--log-interval``)."""
    activation_checkpointing: bool
    """Recompute activations in backward (``--checkpoint-activations``)."""
    seed: int = Field(default=None)
    """Random seed (``--seed``)."""
    lr: float = Field(default=None)
    """Peak learning rate (``--lr``)."""
    min_lr: float = Field(default=None)
    """Final learning rate of the cosine decay (``--min-lr``)."""
    lr_warmup_iters: int = Field(default=None)
    """Linear warm-up steps (``--lr-warmup-iters``)."""
    weight_decay: float = Field(default=None)
    """AdamW weight decay (``--weight-decay``)."""
    clip_grad: float = Field(default=None)
    """Gradient-norm clipping (``--clip-grad``)."""

    def given(self) -> dict[str, Any]:
        """The keys the file sets, with their values."""
        return self.model_dump(exclude_unset=True)


class ModelFile(BaseModel):
    """A model preset file (its name is the file's stem)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    description: str = ""
    """One line for ``python -m launchers list``."""
    model: ModelSection
    """Architecture, batch and precision."""
    training: TrainingSection
    """Iterations, logging and schedule."""


class StrategyEntry(_Section):
    """One entry of ``strategies.yaml``; the data-parallel degree follows from the cluster."""

    tp: int
    """Tensor-parallel degree (``--tensor-model-parallel-size``)."""
    pp: int
    """Pipeline-parallel degree (``--pipeline-model-parallel-size``)."""
    zero_stage: Literal[0, 1, 2, 3]
    """DeepSpeed ZeRO stage."""
    offload: Literal["none", "optimizer", "optimizer+params"] = "none"
    """ZeRO-Offload of optimizer state (and parameters) to CPU memory."""
    description: str = ""
    """One line for ``python -m launchers list``."""


# --------------------------------------------------------------------------------- reading


def read_yaml(path: Path) -> dict[str, Any]:
    """The top-level mapping of a YAML file."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PresetError(f"{path}: cannot read: {exc}") from None
    except yaml.YAMLError as exc:
        raise PresetError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise PresetError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def _section_message(name: str, section: type[BaseModel], errors: list[Any]) -> str | None:
    """The first problem of one section (errors located by key within it): an unknown key or a
    wrong value, else the keys it misses; None when it has none."""
    for e in errors:
        if e["type"] == "extra_forbidden":
            return (
                f"{name}.{e['loc'][0]}: unknown key; valid keys: {', '.join(section.model_fields)}"
            )
        if e["type"] != "missing":
            return f"{name}.{e['loc'][0]}: {e.get('ctx', {}).get('error', e['msg'])}"
    missing = [str(e["loc"][0]) for e in errors if e["type"] == "missing"]
    return f"{name}: missing key(s) {', '.join(missing)}" if missing else None


def _file_message(exc: ValidationError) -> str:
    """The first problem of a model preset file: unknown top-level keys, a section that is not
    a mapping, then each section's first problem."""
    errors = exc.errors()
    top = [
        str(e["loc"][0]) for e in errors if len(e["loc"]) == 1 and e["type"] == "extra_forbidden"
    ]
    if top:
        valid = ", ".join(sorted(ModelFile.model_fields))
        return f"unknown top-level key(s) {', '.join(sorted(top))}; valid: {valid}"
    for e in errors:
        if e["loc"] == ("description",):
            return f"description: {e['msg']}"
    for name, section in (("model", ModelSection), ("training", TrainingSection)):
        if any(e["loc"] == (name,) for e in errors):
            return f"{name}: expected a mapping of keys to values"
        inside = [e | {"loc": e["loc"][1:]} for e in errors if e["loc"][0] == name]
        message = _section_message(name, section, inside)
        if message:
            return message
    return str(exc)  # (not reached: every error is in a section)


def read_model_file(path: Path) -> ModelFile:
    """One model preset file, checked key by key."""
    data = read_yaml(path)
    try:
        return ModelFile.model_validate({"training": {}} | data)
    except ValidationError as exc:
        raise PresetError(f"{path}: {_file_message(exc)}") from None


def model_files(config_dir: Path = CONFIG_DIR) -> list[Path]:
    """The model preset files of ``config_dir``, by name."""
    return sorted(p for p in config_dir.glob("*.yaml") if p.name != STRATEGIES_FILE)


def read_strategies(config_dir: Path = CONFIG_DIR) -> dict[str, StrategyEntry]:
    """Every entry of ``config_dir/strategies.yaml``, by name, in file order."""
    path = config_dir / STRATEGIES_FILE
    out = {}
    for name, entry in read_yaml(path).items():
        if not isinstance(entry, dict):
            raise PresetError(f"{path}: {name}: expected a mapping of keys to values")
        try:
            out[str(name)] = StrategyEntry.model_validate(entry)
        except ValidationError as exc:
            message = _section_message(str(name), StrategyEntry, exc.errors())
            raise PresetError(f"{path}: {message or exc}") from None
    return out


# ------------------------------------------------------------------------ the analyzer's view


@dataclass(frozen=True)
class ModelShape:
    """The shape of a model preset, as the analyzer needs it."""

    dims: tuple[int, int, int, int]
    """``(num_layers, hidden_size, num_attention_heads, seq_length)``: what names a preset in a
    log."""
    max_position_embeddings: int
    """Learned positions (>= seq_length)."""
    vocab_size: int
    """Tokenizer vocabulary before Megatron's padding."""


@functools.cache
def model_table(config_dir: Path = CONFIG_DIR) -> dict[str, ModelShape]:
    """Model presets by name (file stem), read from ``megatron_configs/<name>.yaml``."""
    table = {}
    for path in model_files(config_dir):
        m = read_model_file(path).model
        dims = (m.num_layers, m.hidden_size, m.num_attention_heads, m.seq_length)
        table[path.stem] = ModelShape(dims, m.max_position_embeddings, m.vocab_size)
    return table


@functools.cache
def strategy_table(config_dir: Path = CONFIG_DIR) -> dict[str, StrategyEntry]:
    """Strategy presets by name, read from ``megatron_configs/strategies.yaml``."""
    return read_strategies(config_dir)
