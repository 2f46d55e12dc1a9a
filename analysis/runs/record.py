"""The run record: the typed, versioned content of a run directory's ``run.json``.

``launchers`` writes it (``run.render`` at generation, ``run.execute`` and the lab
sessions as the run goes); ``analysis`` reads it. Both go through :func:`from_json` and
:func:`to_json` here, so the document has one definition.

Frozen dataclasses with a docstring under each field, as the project's other records, read
through pydantic (a ``TypeAdapter`` over them, unknown keys forbidden, scalars strict: ``"60"``
is not a number, ``true`` not an integer); its first error becomes a :class:`RunRecordError`
that names the file, the field path and the fix.

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
from typing import Annotated, Any, Literal, Union, get_args, get_origin, get_type_hints

from pydantic import ConfigDict, StrictFloat, StrictInt, StrictStr, TypeAdapter
from pydantic import ValidationError as _PydanticError

SCHEMA_VERSION = 2
"""Version :func:`to_json` writes; a document without ``schema_version`` is version 1."""

OutcomeStatus = Literal["generated", "running", "completed", "failed", "interrupted"]
"""Run status in run.json: ``generated`` before it runs, ``running`` while it runs."""

_OLD_LINK_KEYS = ("rate_mbit", "rate_mbps", "mbit")
"""Version-1 spellings of ``network.link_mbit``."""
_OLD_DELAY_KEYS = ("latency_ms",)
"""Version-1 spellings of ``network.delay_ms``."""


DOCUMENT = ConfigDict(extra="forbid", use_attribute_docstrings=True)
"""How every section of the record is read: a key that is not a field is an error."""


class RunRecordError(ValueError):
    """A run.json document that does not fit :class:`RunRecord`; the message names the file,
    the field path and what would fix it."""


@dataclass(frozen=True)
class Upstream:
    """The upstream Megatron-DeepSpeed checkout the run was generated against."""

    __pydantic_config__ = DOCUMENT

    commit: StrictStr | None = None
    """``git rev-parse HEAD`` of the checkout (None: not a git checkout)."""
    patch: StrictStr | None = None
    """Patch applied to it (None: upstream as is)."""


@dataclass(frozen=True)
class GpuInfo:
    """One GPU of a node, as ``nvidia-smi --query-gpu=name,memory.total,driver_version`` printed
    it when the run started (or why it could not be read)."""

    __pydantic_config__ = DOCUMENT

    node: StrictStr
    """Host name of the node (the hostfile's)."""
    index: StrictInt | None = None
    """GPU index on the node (nvidia-smi's order)."""
    name: StrictStr | None = None
    """Product name (``NVIDIA H100 80GB HBM3``): what the MFU peak is looked up by."""
    memory_total_mib: StrictFloat | StrictInt | None = None
    """``memory.total`` in MiB."""
    driver_version: StrictStr | None = None
    """NVIDIA driver version."""
    error: StrictStr | None = None
    """Why the node's GPUs could not be read (no nvidia-smi, unreachable node)."""


@dataclass(frozen=True)
class Provenance:
    """Where and with what a run was generated."""

    __pydantic_config__ = DOCUMENT

    upstream: Upstream | None = None
    """Upstream checkout."""
    deepspeed: StrictStr | None = None
    """Installed DeepSpeed version."""
    torch: StrictStr | None = None
    """Installed torch version."""
    torch_cuda: StrictStr | None = None
    """CUDA version torch was built with (``torch/version.py``; None for a CPU-only build)."""
    torch_origin: StrictStr | None = None
    """Where torch comes from: ``venv``, or ``system (<site dir>)`` for the machine's own
    PyTorch under a ``--system-site-packages`` venv (``make setup TORCH=system``)."""
    torch_warnings: list[StrictStr] | None = None
    """How this torch differs from the tested range (``launchers.config.torch_check``)."""
    python: StrictStr | None = None
    """Python version of the generator."""
    hostname: StrictStr | None = None
    """Machine that generated the run directory."""
    hostfile_text: StrictStr | None = None
    """The hostfile as written (also needed to rebuild the spec)."""
    environment: dict[StrictStr, StrictStr] = field(default_factory=dict)
    """Environment variables that change a run (NCCL, DeepSpeed, CUDA ones), by name."""
    created: StrictStr | None = None
    """UTC ISO time the run directory was generated."""
    gpus: list[GpuInfo] | None = None
    """The GPUs of every node when a CUDA run started (``launchers.run.gpus``); None on CPU or
    for a run recorded before they were."""

    def describe(self) -> str:
        """One line of what ran: upstream's commit, the versions, the GPUs and the warnings
        recorded (``upstream f4157bea, DeepSpeed 0.19.6, torch 2.11.0 + CUDA 13.0 (system
        ...), Python 3.12.3; 1 x NVIDIA H200 (143,771 MiB, driver 580.159.04)``)."""
        parts = []
        if self.upstream and self.upstream.commit:
            parts.append(
                f"upstream {self.upstream.commit[:8]}" + (" + patch" * bool(self.upstream.patch))
            )
        if self.deepspeed:
            parts.append(f"DeepSpeed {self.deepspeed}")
        if self.torch:
            cuda = f" + CUDA {self.torch_cuda}" if self.torch_cuda else ""
            origin = (
                f" from {self.torch_origin}"
                if self.torch_origin and self.torch_origin != "venv"
                else ""
            )
            parts.append(f"torch {self.torch}{cuda}{origin}")
        if self.python:
            parts.append(f"Python {self.python}")
        text = ", ".join(parts)
        kinds: dict[str, int] = {}
        for g in self.gpus or []:
            if g.name:
                memory = f"{g.memory_total_mib:,.0f} MiB, " if g.memory_total_mib else ""
                key = f"{g.name} ({memory}driver {g.driver_version or '?'})"
                kinds[key] = kinds.get(key, 0) + 1
        gpus = [f"{n} x {k}" for k, n in kinds.items()]
        gpus += [f"{g.node}: GPUs not read ({g.error})" for g in self.gpus or [] if not g.name]
        if gpus:
            text += "; " + ", ".join(gpus)
        if self.torch_warnings:
            text += "; " + "; ".join(self.torch_warnings)
        return text


@dataclass(frozen=True)
class Outcome:
    """How the run ended (as ``launchers.run.execute`` writes it), or that it has not."""

    __pydantic_config__ = DOCUMENT

    status: OutcomeStatus | None = None
    """``generated``, ``running``, ``completed``, ``failed`` or ``interrupted``."""
    kind: StrictStr | None = None
    """Failure kind (``oom``, ``nccl``, ``exception``, ``killed``, ``hang``, ``time_limit``,
    ``cancelled``, ``node_fail``, ``other``), None when completed."""
    reason: StrictStr | None = None
    """One line saying why, quoting the log line when there is one."""
    exit_codes: dict[StrictStr, StrictInt | None] = field(default_factory=dict)
    """Exit code per launcher process (None if it had to be killed)."""
    start: StrictStr | None = None
    """UTC ISO time the first process started."""
    end: StrictStr | None = None
    """UTC ISO time the last process ended."""
    wall_s: StrictFloat | None = None
    """Wall-clock seconds from start to end."""
    last_iteration: StrictInt | None = None
    """Last iteration number seen in the output."""
    train_iters: StrictInt | None = None
    """Planned iterations (from the iteration lines)."""
    failure_line: StrictStr | None = None
    """``file:line`` of the log line that identified the failure."""


@dataclass(frozen=True)
class Repeat:
    """Where a run sits in a repeated matrix."""

    __pydantic_config__ = DOCUMENT

    group: StrictStr
    """Shared by every run of one repeated matrix."""
    round: StrictInt
    """1-based round."""
    rounds: StrictInt
    """Rounds the matrix was asked for."""


@dataclass(frozen=True)
class Limits:
    """The memory cgroup the run's processes ran in."""

    __pydantic_config__ = DOCUMENT

    memory_bytes: StrictInt | None = None
    """Memory limit, bytes."""
    memory: StrictStr | None = None
    """The same limit for people (``4.0 GiB``)."""
    cgroup: StrictStr | None = None
    """Path of the cgroup."""
    cgroup_version: StrictInt | None = None
    """cgroup v1 or v2."""


@dataclass(frozen=True)
class Network:
    """The network the run used, as the lab measured it (``launchers.lab.cluster.Lab.describe`` plus
    the session's interface counters)."""

    __pydantic_config__ = DOCUMENT

    kind: StrictStr | None = None
    """``emulated`` (network namespaces on one machine)."""
    lab: StrictStr | None = None
    """Name of the lab."""
    link: StrictStr | None = None
    """Link shape label (``1000mbit``, ``100mbit-20ms``)."""
    link_mbit: StrictFloat | None = None
    """Link rate, Mbit/s (None: unshaped)."""
    delay_ms: StrictFloat | None = None
    """Emulated one-way latency, ms."""
    loss_pct: StrictFloat | None = None
    """Emulated packet loss, percent."""
    topology: StrictStr | None = None
    """How the nodes are connected (``bridge``)."""
    transport: StrictStr | None = None
    """How the ranks reached the nodes (``ssh``, ``netns-exec``, ``mpirun``, ``srun``)."""
    subnet: StrictStr | None = None
    """The nodes' subnet."""
    host_address: StrictStr | None = None
    """The host's address on the bridge."""
    nodes: list[dict[StrictStr, Any]] = field(default_factory=list)
    """Each node: name, namespace, interfaces, address."""
    shaping: list[StrictStr] = field(default_factory=list)
    """``tc`` commands that shaped the link."""
    segmentation: list[StrictStr] = field(default_factory=list)
    """Offload (segmentation) commands applied, or why not."""
    burst_bytes: StrictInt | None = None
    """Token-bucket burst, bytes."""
    burst_ms: StrictFloat | None = None
    """Token-bucket burst, ms at the link rate."""
    node_cpu: dict[StrictStr, Any] | None = None
    """Cores each node may use (``cpus``), how, and each node's ``cpu.stat``."""
    faults: list[dict[StrictStr, Any]] = field(default_factory=list)
    """Faults planted in the lab (``launchers.lab.faults``): each a ``kind`` (``slow_node``,
    ``slow_link``), the ``node``, its ``spelling`` and what it and the other nodes got."""
    counters: dict[StrictStr, Any] | None = None
    """Interface byte counters per node at start, end and their difference."""
    per_iteration: dict[StrictStr, Any] | None = None
    """Bytes per steady-state iteration per node (``max_tx_bytes``, ``bytes``, ``method``)."""
    per_iteration_reason: StrictStr | None = None
    """Why ``per_iteration`` is None."""
    stopped_leftovers: list[dict[StrictStr, Any]] | None = None
    """Processes a run left inside the nodes, stopped by the session (node, pid, command)."""


@dataclass(frozen=True)
class RunRecord:
    """The run.json document."""

    __pydantic_config__ = DOCUMENT

    schema_version: StrictInt = SCHEMA_VERSION
    """Version of this document's shape (a document without it is version 1)."""
    name: StrictStr | None = None
    """Run name (the spec's name)."""
    spec_hash: StrictStr | None = None
    """Hash of the resolved spec: runs with the same name and hash are repeats."""
    spec: dict[StrictStr, Any] | None = None
    """The resolved spec as JSON (read back by ``launchers.config.spec.spec_from_json``)."""
    command: list[StrictStr] | None = None
    """The launcher argv."""
    provenance: Provenance | None = None
    """Where and with what the run was generated."""
    outcome: Outcome | None = None
    """How the run ended."""
    repeat: Repeat | None = None
    """A round of a repeated matrix."""
    network: Network | None = None
    """The emulated network and its counters (lab runs)."""
    slurm: dict[StrictStr, Any] | None = None
    """The Slurm job (id, name, final state, reason, queue and processes after): its shape is
    Slurm's."""
    limits: Limits | None = None
    """The memory cgroup of the run."""
    stopped_leftovers: list[StrictInt] | None = None
    """Pids still in the run's cgroup after it ended, stopped by the executor."""
    record_problems: list[StrictStr] = field(default_factory=list)
    """What went wrong with run.json itself (an unreadable one kept aside)."""


# ---------------------------------------------------------------------------------------------
# Reading


def _fail(source: str, path: str, what: str, fix: str) -> RunRecordError:
    return RunRecordError(f"{source}: {path or 'document'}: {what}; {fix}")


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Annotated:
        return _type_name(get_args(tp)[0])
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


def _section_of(loc: tuple[str | int, ...], root: Any) -> Any:
    """The dataclass holding the field at ``loc`` (a field path under ``root``), or None."""
    cls: Any = root
    for key in loc[:-1]:
        if not dataclasses.is_dataclass(cls) or not isinstance(key, str):
            return None
        tp = get_type_hints(cls).get(key)
        classes = [a for a in (get_args(tp) or (tp,)) if dataclasses.is_dataclass(a)]
        cls = classes[0] if classes else None
    return cls if dataclasses.is_dataclass(cls) else None


_WANTED = {
    "int_type": "an integer",
    "float_type": "a number",
    "string_type": "a string",
    "bool_type": "true/false",
}
"""pydantic error types of a scalar of the wrong type, and what to write instead."""


def describe_error(err: Any, source: str, root: Any) -> str:
    """``<source>: <field path>: <what is wrong>; <the fix>`` for one pydantic error (an item
    of ``ValidationError.errors()``) met reading a document into the dataclass ``root``."""
    loc = tuple(err["loc"])
    path = "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in loc).lstrip(".")
    kind, value = err["type"], err.get("input")
    section = _section_of(loc, root)
    if kind in ("unexpected_keyword_argument", "extra_forbidden"):
        names = ", ".join(f.name for f in dataclasses.fields(section)) if section else "its fields"
        what, fix = "unknown field", f"remove it or rename it to one of {names}"
    elif kind == "missing":
        tp = get_type_hints(section).get(str(loc[-1])) if section else None
        what, fix = "missing", f"add it ({_type_name(tp)})" if tp else "add it"
    elif kind in _WANTED:
        what, fix = f"{value!r} is not {_WANTED[kind]}", f"write {_WANTED[kind]}"
    elif kind == "literal_error":
        expected = err["ctx"]["expected"].replace(" or ", ", ")
        what, fix = f"{value!r} is not one of {expected}", "use one of those"
    elif kind in ("dict_type", "dataclass_type"):
        what, fix = f"{type(value).__name__} is not an object", "write one"
    elif kind in ("list_type", "tuple_type"):
        what, fix = f"{type(value).__name__} is not a list", "write one"
    else:
        what, fix = err["msg"], "fix it"
    return f"{source}: {path or 'document'}: {what}; {fix}"


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


_READER = TypeAdapter(RunRecord)
"""pydantic's reader (and writer) of the whole document."""


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
    try:
        record = _READER.validate_python(body)
    except _PydanticError as err:
        raise RunRecordError(describe_error(err.errors()[0], source, RunRecord)) from None
    return dataclasses.replace(record, schema_version=SCHEMA_VERSION)


# ---------------------------------------------------------------------------------------------
# Writing


def to_json(record: RunRecord) -> dict[str, Any]:
    """The run.json document of a record, current version: a section the run does not have
    (None, or no ``record_problems``) is left out; inside a section every field is written."""
    current = dataclasses.replace(record, schema_version=SCHEMA_VERSION)
    doc = _READER.dump_python(current, warnings=False)
    return {k: v for k, v in doc.items() if v is not None and v != []}
