"""The run record: the typed, versioned content of a run directory's ``run.json``.

``launchers`` writes it (``run.render`` at generation, ``run.execute`` and the lab
sessions as the run goes); ``analysis`` reads it. Both go through :func:`from_json` and
:func:`to_json` here, so the document has one definition.

Frozen dataclasses, not pydantic models: the analyzer runs on machines that only hold logs (no
DeepSpeed, hence no pydantic), the rest of the project's records are frozen dataclasses with a
docstring under each field, and the few checks needed (types, known keys, the version rule) fit
in one small decoder that names the file and the field path of what is wrong.

Versions (``schema_version``):

- 1: a document without the key (written before the record was typed). Its network link rate
  may be spelled ``rate_mbit``, ``rate_mbps`` or ``mbit`` and its one-way latency
  ``latency_ms``; :func:`from_json` reads them as ``link_mbit`` and ``delay_ms``. Nowhere else
  are old spellings read.
- 2 (:data:`SCHEMA_VERSION`): the current document. Only ``link_mbit`` and ``delay_ms``.

Every field is optional (a run directory is written in steps, and tests and users write partial
documents); a field that is present must have its type, and a key not listed here is an error.
"""

from __future__ import annotations

import dataclasses
import types
from dataclasses import dataclass, field
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

SCHEMA_VERSION = 2
"""Version :func:`to_json` writes; a document without ``schema_version`` is version 1."""

OutcomeStatus = Literal["generated", "running", "completed", "failed", "interrupted"]
"""Run status in run.json: ``generated`` before it runs, ``running`` while it runs."""

_OLD_LINK_KEYS = ("rate_mbit", "rate_mbps", "mbit")
"""Version-1 spellings of ``network.link_mbit``."""
_OLD_DELAY_KEYS = ("latency_ms",)
"""Version-1 spellings of ``network.delay_ms``."""


class RunRecordError(ValueError):
    """A run.json document that does not fit :class:`RunRecord`; the message names the file,
    the field path and what would fix it."""


@dataclass(frozen=True)
class Upstream:
    """The upstream Megatron-DeepSpeed checkout the run was generated against."""

    commit: str | None = None
    """``git rev-parse HEAD`` of the checkout (None: not a git checkout)."""
    patch: str | None = None
    """Patch applied to it (None: upstream as is)."""


@dataclass(frozen=True)
class Provenance:
    """Where and with what a run was generated."""

    upstream: Upstream | None = None
    """Upstream checkout."""
    deepspeed: str | None = None
    """Installed DeepSpeed version."""
    torch: str | None = None
    """Installed torch version."""
    python: str | None = None
    """Python version of the generator."""
    hostname: str | None = None
    """Machine that generated the run directory."""
    hostfile_text: str | None = None
    """The hostfile as written (also needed to rebuild the spec)."""
    environment: dict[str, str] = field(default_factory=dict)
    """Environment variables that change a run (NCCL, DeepSpeed, CUDA ones), by name."""
    created: str | None = None
    """UTC ISO time the run directory was generated."""


@dataclass(frozen=True)
class Outcome:
    """How the run ended (``launchers.run.execute.Outcome`` as written), or that it has not."""

    status: OutcomeStatus | None = None
    """``generated``, ``running``, ``completed``, ``failed`` or ``interrupted``."""
    kind: str | None = None
    """Failure kind (``oom``, ``nccl``, ``exception``, ``killed``, ``hang``, ``time_limit``,
    ``cancelled``, ``node_fail``, ``other``), None when completed."""
    reason: str | None = None
    """One line saying why, quoting the log line when there is one."""
    exit_codes: dict[str, int | None] = field(default_factory=dict)
    """Exit code per launcher process (None if it had to be killed)."""
    start: str | None = None
    """UTC ISO time the first process started."""
    end: str | None = None
    """UTC ISO time the last process ended."""
    wall_s: float | None = None
    """Wall-clock seconds from start to end."""
    last_iteration: int | None = None
    """Last iteration number seen in the output."""
    train_iters: int | None = None
    """Planned iterations (from the iteration lines)."""
    failure_line: str | None = None
    """``file:line`` of the log line that identified the failure."""


@dataclass(frozen=True)
class Repeat:
    """Where a run sits in a repeated matrix."""

    group: str
    """Shared by every run of one repeated matrix."""
    round: int
    """1-based round."""
    rounds: int
    """Rounds the matrix was asked for."""


@dataclass(frozen=True)
class Limits:
    """The memory cgroup the run's processes ran in."""

    memory_bytes: int | None = None
    """Memory limit, bytes."""
    memory: str | None = None
    """The same limit for people (``4.0 GiB``)."""
    cgroup: str | None = None
    """Path of the cgroup."""
    cgroup_version: int | None = None
    """cgroup v1 or v2."""


@dataclass(frozen=True)
class Network:
    """The network the run used, as the lab measured it (``launchers.lab.cluster.Lab.describe`` plus
    the session's interface counters)."""

    kind: str | None = None
    """``emulated`` (network namespaces on one machine)."""
    lab: str | None = None
    """Name of the lab."""
    link: str | None = None
    """Link shape label (``1000mbit``, ``100mbit-20ms``)."""
    link_mbit: float | None = None
    """Link rate, Mbit/s (None: unshaped)."""
    delay_ms: float | None = None
    """Emulated one-way latency, ms."""
    loss_pct: float | None = None
    """Emulated packet loss, percent."""
    topology: str | None = None
    """How the nodes are connected (``bridge``)."""
    transport: str | None = None
    """How the ranks reached the nodes (``ssh``, ``netns-exec``, ``mpirun``, ``srun``)."""
    subnet: str | None = None
    """The nodes' subnet."""
    host_address: str | None = None
    """The host's address on the bridge."""
    nodes: list[dict[str, Any]] = field(default_factory=list)
    """Each node: name, namespace, interfaces, address."""
    shaping: list[str] = field(default_factory=list)
    """``tc`` commands that shaped the link."""
    segmentation: list[str] = field(default_factory=list)
    """Offload (segmentation) commands applied, or why not."""
    burst_bytes: int | None = None
    """Token-bucket burst, bytes."""
    burst_ms: float | None = None
    """Token-bucket burst, ms at the link rate."""
    node_cpu: dict[str, Any] | None = None
    """Cores each node may use (``cpus``), how, and each node's ``cpu.stat``."""
    counters: dict[str, Any] | None = None
    """Interface byte counters per node at start, end and their difference."""
    per_iteration: dict[str, Any] | None = None
    """Bytes per steady-state iteration per node (``max_tx_bytes``, ``bytes``, ``method``)."""
    per_iteration_reason: str | None = None
    """Why ``per_iteration`` is None."""
    stopped_leftovers: list[dict[str, Any]] | None = None
    """Processes a run left inside the nodes, stopped by the session (node, pid, command)."""


@dataclass(frozen=True)
class RunRecord:
    """The run.json document."""

    schema_version: int = SCHEMA_VERSION
    """Version of this document's shape (a document without it is version 1)."""
    name: str | None = None
    """Run name (the spec's name)."""
    spec_hash: str | None = None
    """Hash of the resolved spec: runs with the same name and hash are repeats."""
    spec: dict[str, Any] | None = None
    """The resolved spec as JSON (read back by ``launchers.config.spec.spec_from_json``)."""
    command: list[str] | None = None
    """The launcher argv."""
    provenance: Provenance | None = None
    """Where and with what the run was generated."""
    outcome: Outcome | None = None
    """How the run ended."""
    repeat: Repeat | None = None
    """A round of a repeated matrix."""
    network: Network | None = None
    """The emulated network and its counters (lab runs)."""
    slurm: dict[str, Any] | None = None
    """The Slurm job (id, name, final state, reason, queue and processes after): its shape is
    Slurm's."""
    limits: Limits | None = None
    """The memory cgroup of the run."""
    stopped_leftovers: list[int] | None = None
    """Pids still in the run's cgroup after it ended, stopped by the executor."""
    record_problems: list[str] = field(default_factory=list)
    """What went wrong with run.json itself (an unreadable one kept aside)."""


# ---------------------------------------------------------------------------------------------
# Reading


def _fail(source: str, path: str, what: str, fix: str) -> RunRecordError:
    return RunRecordError(f"{source}: {path or 'document'}: {what}; {fix}")


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(tp))
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if tp is type(None):
        return "null"
    if dataclasses.is_dataclass(tp):
        return "an object"
    if origin is not None:
        return {dict: "an object", list: "a list"}.get(origin, str(tp))
    return {str: "a string", int: "an integer", float: "a number", bool: "true/false"}.get(
        tp, str(tp)
    )


def _decode(tp: Any, value: Any, path: str, source: str) -> Any:
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _decode(arg, value, path, source)
            except RunRecordError:
                if len(args) == 2 and type(None) in args:
                    raise
        raise _fail(source, path, f"{value!r} is not {_type_name(tp)}", "write it as such")
    if origin is Literal:
        if value in get_args(tp):
            return value
        raise _fail(source, path, f"{value!r} is not {_type_name(tp)}", "use one of those")
    if dataclasses.is_dataclass(tp):
        return _decode_object(tp, value, path, source)
    ok = {
        str: isinstance(value, str),
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, int | float) and not isinstance(value, bool),
    }.get(tp)
    if ok is not None:
        if not ok:
            raise _fail(
                source, path, f"{value!r} is not {_type_name(tp)}", f"write {_type_name(tp)}"
            )
        return float(value) if tp is float else value
    if origin is dict:
        if not isinstance(value, dict):
            raise _fail(source, path, f"{type(value).__name__} is not an object", "write one")
        _key, item = get_args(tp)
        return {k: _decode(item, v, f"{path}.{k}", source) for k, v in value.items()}
    if origin is list:
        if not isinstance(value, list):
            raise _fail(source, path, f"{type(value).__name__} is not a list", "write one")
        (item,) = get_args(tp)
        return [_decode(item, v, f"{path}[{i}]", source) for i, v in enumerate(value)]
    raise TypeError(f"no decoder for {tp!r}")  # a field type this module does not handle


def _decode_object(cls: Any, value: Any, path: str, source: str) -> Any:
    if not isinstance(value, dict):
        raise _fail(
            source, path, f"{type(value).__name__} is not an object", f"write a {cls.__name__}"
        )
    hints = get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in value:
        if key not in hints:
            raise _fail(
                source,
                f"{path}.{key}" if path else key,
                "unknown field",
                f"remove it or rename it to one of {', '.join(names)}",
            )
    kwargs = {}
    for f in dataclasses.fields(cls):
        sub = f"{path}.{f.name}" if path else f.name
        if f.name in value:
            kwargs[f.name] = _decode(hints[f.name], value[f.name], sub, source)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise _fail(source, sub, "missing", f"add it ({_type_name(hints[f.name])})")
    return cls(**kwargs)


def _upgrade_v1_network(network: Any, source: str) -> Any:
    """Version 1's other spellings of the link rate and the latency, as version 2's."""
    if not isinstance(network, dict):
        return network
    out = dict(network)
    for new, olds in (("link_mbit", _OLD_LINK_KEYS), ("delay_ms", _OLD_DELAY_KEYS)):
        found = [k for k in (new, *olds) if out.get(k) is not None]
        values = {out[k] for k in found}
        if len(values) > 1:
            raise _fail(
                source,
                "network",
                f"{' and '.join(found)} disagree ({', '.join(map(repr, values))})",
                f"keep only {new}",
            )
        for old in olds:
            if old in out:
                value = out.pop(old)
                if value is not None:
                    out[new] = value
                else:
                    out.setdefault(new, None)
    return out


def from_json(doc: Any, source: str) -> RunRecord:
    """The :class:`RunRecord` of a parsed run.json document; ``source`` names it in errors.

    Raises :class:`RunRecordError` (a ``ValueError``) naming the file, the field path and what
    would fix it.
    """
    if not isinstance(doc, dict):
        raise _fail(source, "", f"top level is {type(doc).__name__}", "write a JSON object")
    version = doc.get("schema_version", 1)
    if isinstance(version, bool) or version not in (1, SCHEMA_VERSION):
        raise _fail(
            source,
            "schema_version",
            f"{version!r} is not a known version",
            f"use {SCHEMA_VERSION} (or leave it out for version 1)",
        )
    body = {k: v for k, v in doc.items() if k != "schema_version"}
    if version == 1 and "network" in body:
        body["network"] = _upgrade_v1_network(body["network"], source)
    record = _decode_object(RunRecord, body, "", source)
    return dataclasses.replace(record, schema_version=SCHEMA_VERSION)


# ---------------------------------------------------------------------------------------------
# Writing


def _encode(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {k: _encode(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_encode(v) for v in value]
    return value


def to_json(record: RunRecord) -> dict[str, Any]:
    """The run.json document of a record, current version: a section the run does not have
    (None, or no ``record_problems``) is left out; inside a section every field is written."""
    doc = _encode(dataclasses.replace(record, schema_version=SCHEMA_VERSION))
    return {k: v for k, v in doc.items() if v is not None and v != []}
