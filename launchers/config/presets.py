"""Preset registries (``megatron_configs/*.yaml``) and resolution of a request into a RunSpec.

Models are one YAML file each (``tiny.yaml`` ...); strategies are the entries of
``strategies.yaml``, read by ``analysis.theory.presets`` (every key and type checked, the file,
the key and the fix named).
:func:`resolve_spec` layers preset < environment < ``--set key=value`` overrides, applies the
device's required settings (recorded as adjustments with their reasons) and builds the validated
:class:`~launchers.config.spec.RunSpec`.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, get_type_hints

from analysis.theory.formulas import padded_vocab_size
from analysis.theory.presets import (
    CONFIG_DIR,
    CORE_STRATEGIES,
    STRATEGIES_FILE,
    PresetError,
    coerce,
    model_files,
    read_model_file,
    read_strategies,
)
from launchers.config.gpu import cuda_adjustments
from launchers.config.hostfile import HostfileError, check_host_name
from launchers.config.project import remote_value_problems
from launchers.config.softmax_fusion import KEY as SOFTMAX_KEY
from launchers.config.softmax_fusion import softmax_adjustments
from launchers.config.spec import (
    Adjustment,
    Cluster,
    Device,
    LauncherMode,
    ModelConfig,
    RunPaths,
    RunSpec,
    SpecError,
    Strategy,
    Training,
)
from launchers.config.upstream import tiny_data, upstream_dir


@dataclass(frozen=True)
class ModelPreset:
    """A model preset file: the model and its training defaults."""

    model: ModelConfig
    """Architecture, batch and precision (``model:`` section)."""
    training: Training
    """Iterations, logging and schedule defaults (``training:`` section)."""
    description: str
    """One line for ``python -m launchers list``."""
    source: str
    """File the preset was read from (for messages)."""


# ---------------------------------------------------------------------------------------------
# Typed keys of --set (converted by analysis.theory.presets.coerce, as the preset files are).


def _field_types(cls: type) -> dict[str, Any]:
    hints = get_type_hints(cls, globalns=vars(sys.modules[cls.__module__]))
    return {f.name: hints[f.name] for f in fields(cls)}


MODEL_KEYS = {k: t for k, t in _field_types(ModelConfig).items() if k != "name"}
"""Overridable model keys and their types."""
TRAINING_KEYS = _field_types(Training)
"""Overridable training keys and their types."""
PATH_KEYS = _field_types(RunPaths)
"""Overridable path keys (all strings)."""
RUN_KEYS: dict[str, Any] = {"master_addr": str, "master_port": int, "masked_softmax_fusion": bool}
"""Overridable rendezvous keys, and upstream's fused masked softmax forced on or off
(``launchers.config.softmax_fusion``)."""

OVERRIDE_KEYS: dict[str, Any] = MODEL_KEYS | TRAINING_KEYS | PATH_KEYS | RUN_KEYS
"""Every key ``--set key=value`` accepts, with its type."""

# ---------------------------------------------------------------------------------------------
# Loading the registries


def _build(path: Path, where: str, cls: type, **values: Any) -> Any:
    try:
        return cls(**values)
    except SpecError as exc:
        raise PresetError(f"{path}: {where}: {exc}") from None
    except TypeError as exc:  # a required key is missing
        raise PresetError(f"{path}: {where}: missing key ({exc})") from None


def load_model_file(path: Path) -> ModelPreset:
    """Read one model preset file (its name is the file's stem): the document
    ``analysis.theory.presets`` reads, built into the spec's model and training."""
    doc = read_model_file(path)
    return ModelPreset(
        model=_build(path, "model", ModelConfig, name=path.stem, **doc.model.model_dump()),
        training=_build(path, "training", Training, **doc.training.given()),
        description=doc.description,
        source=str(path),
    )


def load_models(config_dir: Path = CONFIG_DIR) -> dict[str, ModelPreset]:
    """Every model preset in ``config_dir``, by name."""
    files = model_files(config_dir)
    if not files:
        raise PresetError(f"{config_dir}: no model presets (*.yaml)")
    return {p.stem: load_model_file(p) for p in files}


def load_strategies(config_dir: Path = CONFIG_DIR) -> dict[str, Strategy]:
    """Every strategy preset in ``config_dir/strategies.yaml``, by name."""
    path = config_dir / STRATEGIES_FILE
    return {
        name: _build(path, name, Strategy, name=name, **entry.model_dump())
        for name, entry in read_strategies(config_dir).items()
    }


def _pick(registry: Mapping[str, Any], name: str, what: str) -> Any:
    if name not in registry:
        raise PresetError(f"unknown {what} {name!r}; valid: {', '.join(registry)}")
    return registry[name]


def get_model(name: str, config_dir: Path = CONFIG_DIR) -> ModelPreset:
    """The model preset ``name``; an unknown name lists the valid ones."""
    return _pick(load_models(config_dir), name, "model")


def get_strategy(name: str, config_dir: Path = CONFIG_DIR) -> Strategy:
    """The strategy preset ``name``; an unknown name lists the valid ones."""
    return _pick(load_strategies(config_dir), name, "strategy")


def expand_strategies(text: str, config_dir: Path = CONFIG_DIR) -> list[str]:
    """``core``, ``all``, or a comma-separated list of strategy names (each checked)."""
    registry = load_strategies(config_dir)
    if text == "all":
        return list(registry)
    if text == "core":
        return list(CORE_STRATEGIES)
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise PresetError("no strategy given; use core, all, or names separated by commas")
    for name in names:
        _pick(registry, name, "strategy")
    return names


# ---------------------------------------------------------------------------------------------
# Overrides and defaults


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    """``["key=value", ...]`` (from ``--set``) to typed values; unknown keys list the valid ones."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep:
            raise PresetError(f"--set {item!r}: expected key=value")
        if key not in OVERRIDE_KEYS:
            raise PresetError(
                f"--set {item!r}: unknown key {key!r}; valid keys: {', '.join(OVERRIDE_KEYS)}"
            )
        try:
            out[key] = coerce(key, raw, OVERRIDE_KEYS[key])
        except ValueError as exc:
            raise PresetError(f"--set {item!r}: {exc}") from None
    return out


def default_paths(env: Mapping[str, str] | None = None) -> RunPaths:
    """Upstream checkout, the tiny dataset built by setup, and this environment's executables.

    Upstream and the cache follow ``launchers.config.upstream`` (``MEGATRON_DEEPSPEED_DIR``,
    ``XDG_CACHE_HOME``); ``DATA_PATH``, ``VOCAB_FILE``, ``MERGE_FILE`` point at other data.
    """
    env = os.environ if env is None else env
    data = tiny_data()
    bin_dir = Path(sys.executable).parent  # the venv's bin/: symlinks kept on purpose
    return RunPaths(
        upstream_dir=str(upstream_dir()),
        data_path=env.get("DATA_PATH") or str(data.data_prefix),
        vocab_file=env.get("VOCAB_FILE") or str(data.vocab_file),
        merge_file=env.get("MERGE_FILE") or str(data.merge_file),
        python=str(bin_dir / Path(sys.executable).name),
        deepspeed=str(bin_dir / "deepspeed"),
    )


def tokenizer_vocab_size(vocab_file: str) -> int | None:
    """Tokens of a GPT-2-format ``vocab.json`` as upstream's ``GPT2BPETokenizer`` counts them
    (``len(encoder)``); None when the file cannot be read as such (checked again before a run)."""
    try:
        with open(vocab_file, encoding="utf-8") as f:
            vocab = json.load(f)
    except (OSError, ValueError):
        return None
    return len(vocab) if isinstance(vocab, dict) and vocab else None


def _vocab_adjustment(
    model: dict[str, Any], tp: int, data_vocab: int | None, explicit: set[str]
) -> list[Adjustment]:
    """The preset's vocabulary, unless the data's tokenizer is larger than it (padded): then the
    model is built for the data's, and the record says that this is not the preset's shape."""
    padded = padded_vocab_size(model["vocab_size"], tp)
    if data_vocab is None or data_vocab <= padded or "vocab_size" in explicit:
        return []
    change = Adjustment(
        "vocab_size",
        model["vocab_size"],
        data_vocab,
        f"the data's tokenizer has {data_vocab} tokens, more than the preset's "
        f"{model['vocab_size']} padded to {padded}: the model has "
        f"{padded_vocab_size(data_vocab, tp)} embedding rows, NOT the shape the preset names",
    )
    model["vocab_size"] = data_vocab
    return [change]


def detect_device() -> Device:
    """``cuda`` when torch sees a GPU, else ``cpu`` (imports torch: only call when needed)."""
    import torch  # heavy (~2 s): imported only when the device must be detected

    return "cuda" if torch.cuda.is_available() else "cpu"


def _micro_batch_adjustment(model: dict[str, Any]) -> list[Adjustment]:
    """Micro-batch 1 on every device: upstream's attention fails with a larger one."""
    if model["micro_batch_size"] == 1:
        return []
    requested, model["micro_batch_size"] = model["micro_batch_size"], 1
    return [
        Adjustment(
            "micro_batch_size",
            requested,
            1,
            "upstream's non-flash attention fails with a micro-batch > 1 ('view size is not "
            "compatible with input tensor's size and stride' in CoreAttention, seen on CPU and "
            "on an H200); the global batch is reached by gradient accumulation",
        )
    ]


def _cpu_adjustments(
    model: dict[str, Any], training: dict[str, Any], explicit: set[str]
) -> list[Adjustment]:
    """Settings DeepSpeed's CPU accelerator and upstream need (UPSTREAM.md, "CPU runs")."""
    changes: list[Adjustment] = []
    if model["precision"] == "fp16" and "precision" not in explicit:
        changes.append(
            Adjustment(
                "precision",
                "fp16",
                "fp32",
                "DeepSpeed's CPU accelerator trains in fp32 or bf16; the preset's fp16 is for GPUs",
            )
        )
        model["precision"] = "fp32"
    if training["activation_checkpointing"] and "activation_checkpointing" not in explicit:
        changes.append(
            Adjustment(
                "activation_checkpointing",
                True,
                False,
                "off by default on CPU: memory is not the limit there and recompute only adds "
                "time (--set activation_checkpointing=true to force it)",
            )
        )
        training["activation_checkpointing"] = False
    return changes


def resolve_spec(
    model: str,
    strategy: str | Strategy,
    cluster: Cluster,
    overrides: Mapping[str, Any] | None = None,
    *,
    device: Device | None = None,
    launcher: LauncherMode | None = None,
    env: Mapping[str, str] | None = None,
    paths: RunPaths | None = None,
    config_dir: Path = CONFIG_DIR,
) -> RunSpec:
    """Build the validated spec for ``model`` x ``strategy`` (a preset name, or a
    :class:`Strategy` built by the caller) on ``cluster``.

    ``overrides`` are typed values (see :func:`parse_overrides`); they win over the environment,
    which wins over the presets. ``device`` defaults to :func:`detect_device`, ``launcher`` to
    ``local`` for one host and ``pdsh`` otherwise; ``paths`` replaces :func:`default_paths`.
    """
    overrides = dict(overrides or {})
    unknown = set(overrides) - set(OVERRIDE_KEYS)
    if unknown:
        raise PresetError(
            f"unknown override key(s) {', '.join(sorted(unknown))}; "
            f"valid keys: {', '.join(OVERRIDE_KEYS)}"
        )
    preset = get_model(model, config_dir)
    chosen = strategy if isinstance(strategy, Strategy) else get_strategy(strategy, config_dir)
    device = device or detect_device()
    launcher = launcher or ("local" if len(cluster.hosts) == 1 else "pdsh")

    model_values = {k: getattr(preset.model, k) for k in MODEL_KEYS}
    model_values |= {k: v for k, v in overrides.items() if k in MODEL_KEYS}
    training_values = {k: getattr(preset.training, k) for k in TRAINING_KEYS}
    training_values |= {k: v for k, v in overrides.items() if k in TRAINING_KEYS}
    adjustments = _micro_batch_adjustment(model_values)
    if device == "cpu":
        adjustments += _cpu_adjustments(model_values, training_values, set(overrides))

    paths = paths or default_paths(env)
    path_values = {k: v for k, v in overrides.items() if k in PATH_KEYS}
    for key in ("data_path", "vocab_file", "merge_file", "upstream_dir"):
        if key in path_values:
            path_values[key] = os.path.abspath(path_values[key])  # ranks cd to upstream_dir
    paths = replace(paths, **path_values)
    if device == "cuda":  # apex's extensions, as this machine's interpreter finds them
        adjustments += cuda_adjustments(paths.python)
    adjustments += softmax_adjustments(paths.python, overrides.get(SOFTMAX_KEY), device)
    data_vocab = tokenizer_vocab_size(paths.vocab_file)
    adjustments += _vocab_adjustment(model_values, chosen.tp, data_vocab, set(overrides))

    master_addr = overrides.get("master_addr", cluster.hosts[0].name)
    try:
        check_host_name(master_addr, "master_addr")
    except HostfileError as exc:
        raise PresetError(f"--set {exc}") from None

    spec = RunSpec(
        model=ModelConfig(name=preset.model.name, **model_values),
        strategy=chosen,
        cluster=cluster,
        training=Training(**training_values),
        device=device,
        launcher=launcher,
        paths=paths,
        master_addr=master_addr,
        master_port=overrides.get("master_port", 29500),
        adjustments=tuple(adjustments),
        data_vocab_size=data_vocab,
    )
    problems = remote_value_problems(spec, os.environ if env is None else env)
    if problems:
        raise PresetError(
            f"run {spec.name} through {launcher}: values that cannot reach the remote ranks "
            "intact (refused before anything starts):\n  " + "\n  ".join(problems)
        )
    return spec
