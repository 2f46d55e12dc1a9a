"""Write a run directory: ``launch.sh``, ``ds_config.json``, ``hostfile``, ``run.json``.

``logs/<model>-<strategy>/<UTC timestamp>/``; an existing directory is never reused (a suffix is
added). Shell text is produced here only, from the argv lists of ``launchers.config.project``, each
token quoted by ``shlex``. Every file is written atomically (temporary file + ``os.replace``).
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import socket
import subprocess
import tempfile
import textwrap
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from analysis.runs.record import (
    Outcome,
    Provenance,
    RunRecord,
    RunRecordError,
    Upstream,
    from_json,
    to_json,
)
from launchers.config import torch_check
from launchers.config.hostfile import render_hostfile
from launchers.config.project import (
    DS_CONFIG_NAME,
    DS_ENV_NAME,
    HOSTFILE_NAME,
    NODE_RANK,
    ds_config,
    env_file_text,
    environment,
    launcher_command,
    needs_env_file,
    remote_environment,
    venv_bin,
)
from launchers.config.spec import RunSpec, SpecError, spec_from_json, spec_hash, spec_to_json

LAUNCH_NAME = "launch.sh"
"""File name of the launcher script inside a run directory."""
RUN_JSON_NAME = "run.json"
"""File name of the run record inside a run directory."""
TIMESTAMP_FORMAT = "%Y%m%dT%H%M%SZ"
"""UTC timestamp naming a run directory, e.g. ``20261122T021500Z``."""
PROVENANCE_ENV_PREFIXES = ("DS_", "NCCL_", "GLOO_", "OMP_", "MASTER_")
"""Environment variable families recorded in provenance (plus ``CUDA_VISIBLE_DEVICES``)."""


def _comment(text: str) -> str:
    """Text safe inside a ``#`` comment line (no line breaks)."""
    return " ".join(str(text).split())


def _shell_word(arg: str) -> str:
    # The symbolic node rank stays a variable; every other token is a literal.
    return '"${NODE_RANK}"' if arg == NODE_RANK else shlex.quote(arg)


def _command_lines(argv: list[str]) -> str:
    """``exec`` command, one option (with its values) per line, joined by backslashes."""
    groups: list[list[str]] = [[argv[0]]]
    for arg in argv[1:]:
        if arg.startswith("--") or arg.endswith(".py"):  # pretrain_gpt.py, its wrappers
            groups.append([arg])
        else:
            groups[-1].append(arg)
    rendered = []
    for group in groups:
        if NODE_RANK in group:
            rendered.append(" ".join(_shell_word(a) for a in group))
        else:
            rendered.append(shlex.join(group))
    return " \\\n  ".join(rendered)


def _data_vocab(spec: RunSpec) -> str:
    if spec.data_vocab_size is None:
        return "; the data's tokenizer could not be read"
    if spec.data_vocab_size == spec.model.vocab_size:
        return ""
    return f"; the data's tokenizer has {spec.data_vocab_size:,}, Megatron pads it to as many"


def _header(spec: RunSpec) -> list[str]:
    m, s, t = spec.model, spec.strategy, spec.training
    hosts = ", ".join(f"{h.name}({h.slots})" for h in spec.cluster.hosts)
    offload = "" if s.offload == "none" else f", offload {s.offload}"
    lines = [
        f"Run {spec.name}: model {m.name} ({m.num_layers} layers, hidden {m.hidden_size}, "
        f"{m.num_attention_heads} heads, seq {m.seq_length}, {spec.num_parameters:,} parameters), "
        f"{m.precision}, micro-batch {m.micro_batch_size}, global batch {m.global_batch_size}, "
        f"gradient accumulation {spec.gradient_accumulation_steps}.",
        f"Vocabulary: {spec.padded_vocab_size:,} embedding rows ({m.vocab_size:,} tokens padded "
        f"for tp {s.tp}){_data_vocab(spec)}.",
        f"Strategy {s.name}: tp {s.tp} x pp {s.pp} x dp {spec.dp}, ZeRO-{s.zero_stage}{offload}; "
        f"world size {spec.world_size} on {hosts}; device {spec.device}.",
    ]
    if spec.launcher == "local":
        lines.append("Launch: `bash launch.sh` on this machine (deepspeed launcher, no ssh).")
    elif spec.launcher == "no_ssh":
        ranks = ", ".join(f"{i}={h.name}" for i, h in enumerate(spec.cluster.hosts))
        lines.append(
            "Launch: on EVERY node, `bash launch.sh NODE_RANK` (or NODE_RANK=N bash launch.sh); "
            f"node ranks {ranks}; rendezvous at {spec.master_addr}:{spec.master_port}."
        )
    else:
        lines.append(
            f"Launch: `bash launch.sh` on the first host; the deepspeed launcher starts the ranks "
            f"through {spec.launcher}. Every host needs the same paths (upstream, data, this run "
            "directory)."
        )
    breakdown = (
        "DeepSpeed's wall-clock breakdown (rank 0)"
        if s.pp == 1
        else "no DeepSpeed breakdown with PP (PipelineEngine) but its 'steps:' lines"
    )
    lines.append(
        f"Expect {t.train_iters} iterations: an iteration line every {t.log_interval} "
        f"({t.train_iters // t.log_interval} lines, from the last rank), Megatron timers "
        f"(--timing-log-level 2), {breakdown}."
    )
    if spec.schedule_timers:
        lines.append(
            "The ranks start pretrain_gpt.py through launchers/run/schedule_timers.py: the "
            "schedule's forward-compute and backward-compute timers on (every rank's, with "
            "--timing-log-option all)."
        )
    for a in spec.adjustments:
        lines.append(f"Adjusted {a.key}: {a.requested} -> {a.applied} ({a.reason}).")
    lines.append("Output goes to stdout/stderr: the executor captures it.")
    return ["# " + part for line in lines for part in textwrap.wrap(_comment(line), 96)]


def render_launch_script(spec: RunSpec, run_dir: str) -> str:
    """The text of ``launch.sh``."""
    out = ["#!/usr/bin/env bash", *_header(spec), "set -euo pipefail", ""]
    if spec.launcher == "no_ssh":
        last = len(spec.cluster.hosts) - 1
        ranks = "|".join(str(i) for i in range(last + 1))
        out += [
            "# This node's rank: first argument, or NODE_RANK from the environment.",
            'NODE_RANK="${1:-${NODE_RANK:-}}"',
            'case "${NODE_RANK}" in',
            f"  {ranks}) ;;",
            "  *)",
            f"    echo \"launch.sh: give this node's rank (0..{last}) as the first argument or in "
            "NODE_RANK; got '${NODE_RANK}'\" >&2",
            "    exit 2",
            "    ;;",
            "esac",
            "",
        ]
    out.append(f"cd -- {shlex.quote(spec.paths.upstream_dir)}")
    out += [
        "# The venv's interpreter first: upstream's Makefile builds its C++ dataset helpers with",
        "# the python3 it finds on PATH.",
        f'export PATH={shlex.quote(venv_bin(spec))}:"${{PATH}}"',
    ]
    for key, value in environment(spec, run_dir).items():
        if key == "DS_ENV_FILE":  # a caller's own env file (the lab's) carries these variables
            out += [
                'if [ -z "${DS_ENV_FILE:-}" ]; then',
                f"  export DS_ENV_FILE={shlex.quote(value)}",
                "fi",
            ]
        else:
            out.append(f"export {key}={shlex.quote(value)}")
    out.append("exec " + _command_lines(launcher_command(spec, run_dir)))
    return "\n".join(out) + "\n"


def render_files(spec: RunSpec, run_dir: str, path: str | None = None) -> dict[str, str]:
    """Every file of a run directory, by name (``run.json`` is added by the writer).

    ``path``: the ``PATH`` that follows the venv's ``bin`` on remote nodes (``deepspeed_env``;
    default: this process's ``PATH``).
    """
    files = {
        LAUNCH_NAME: render_launch_script(spec, run_dir),
        DS_CONFIG_NAME: json.dumps(ds_config(spec), indent=2) + "\n",
        HOSTFILE_NAME: render_hostfile(spec.cluster),
    }
    if needs_env_file(spec):
        files[DS_ENV_NAME] = env_file_text(spec, remote_environment(spec, path))
    return files


def node_commands(spec: RunSpec, run_dir: str) -> list[tuple[str, str]]:
    """For ``no_ssh``: (host, shell command line) to start on each node."""
    return [
        (host.name, shlex.join(["bash", os.path.join(run_dir, LAUNCH_NAME), str(rank)]))
        for rank, host in enumerate(spec.cluster.hosts)
    ]


# ---------------------------------------------------------------------------------------------
# Provenance and run.json


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def upstream_commit(upstream_dir: str) -> str | None:
    """``git rev-parse HEAD`` of the upstream checkout (None when not a git checkout)."""
    try:
        result = subprocess.run(
            ["git", "-C", upstream_dir, "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() or None if result.returncode == 0 else None


def provenance(spec: RunSpec, now: datetime) -> Provenance:
    """Where and with what a run was generated."""
    env = {
        k: v
        for k, v in sorted(os.environ.items())
        if k.startswith(PROVENANCE_ENV_PREFIXES) or k == "CUDA_VISIBLE_DEVICES"
    }
    found = torch_check.facts()
    return Provenance(
        upstream=Upstream(commit=upstream_commit(spec.paths.upstream_dir), patch=None),
        deepspeed=_version("deepspeed"),
        torch=_version("torch"),
        torch_cuda=found["torch_cuda"],
        torch_origin=found["torch_origin"],
        torch_warnings=torch_check.warnings(found) or None,
        python=platform.python_version(),
        hostname=socket.gethostname(),
        hostfile_text=render_hostfile(spec.cluster),
        environment=env,
        created=now.astimezone(timezone.utc).isoformat(timespec="seconds"),
    )


def run_record(spec: RunSpec, run_dir: str, prov: Provenance) -> RunRecord:
    """The content of ``run.json`` at generation time."""
    return RunRecord(
        name=spec.name,
        spec_hash=spec_hash(spec),
        spec=spec_to_json(spec),
        command=launcher_command(spec, run_dir),
        provenance=prov,
        outcome=Outcome(status="generated"),
    )


# ---------------------------------------------------------------------------------------------
# Writing


def write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same directory, synced and
    renamed over it (``os.replace``): never a half-written file. A failed write or rename
    removes the temporary file and leaves the previous file as it was."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def planned_run_dir(spec: RunSpec, logs_root: str | Path, now: datetime) -> Path:
    """``<logs_root>/<name>/<timestamp>`` (absolute), before any suffix for collisions."""
    stamp = now.astimezone(timezone.utc).strftime(TIMESTAMP_FORMAT)
    return Path(logs_root).absolute() / spec.name / stamp


def _create_run_dir(base: Path) -> Path:
    base.parent.mkdir(parents=True, exist_ok=True)
    candidate, suffix = base, 1
    while True:
        try:
            candidate.mkdir()  # exclusive: two generators never share a directory
            return candidate
        except FileExistsError:
            suffix += 1
            candidate = base.with_name(f"{base.name}-{suffix}")


def render_run_dir(spec: RunSpec, logs_root: str | Path, now: datetime | None = None) -> Path:
    """Create the run directory for ``spec`` under ``logs_root`` and return its path."""
    now = now or datetime.now(timezone.utc)
    run_dir = _create_run_dir(planned_run_dir(spec, logs_root, now))
    for name, text in render_files(spec, str(run_dir)).items():
        write_atomic(run_dir / name, text, 0o755 if name == LAUNCH_NAME else 0o644)
    record = run_record(spec, str(run_dir), provenance(spec, now))
    write_atomic(run_dir / RUN_JSON_NAME, json.dumps(to_json(record), indent=2) + "\n")
    return run_dir


def read_run_record(run_dir: str | Path) -> RunRecord:
    """The ``run.json`` of a run directory, as a :class:`RunRecord`."""
    path = Path(run_dir) / RUN_JSON_NAME
    try:
        return from_json(json.loads(path.read_text(encoding="utf-8")), str(path))
    except (OSError, json.JSONDecodeError) as exc:
        raise SpecError(f"{path}: cannot read the run record: {exc}") from None
    except RunRecordError as exc:
        raise SpecError(f"not a run record: {exc}") from None


def load_run_spec(run_dir: str | Path) -> RunSpec:
    """The resolved :class:`RunSpec` a run directory was generated from."""
    record = read_run_record(run_dir)
    if record.spec is None:
        raise SpecError(f"{Path(run_dir) / RUN_JSON_NAME}: spec: missing; regenerate the run")
    text = (record.provenance.hostfile_text if record.provenance else None) or ""
    return spec_from_json(record.spec, text, str(Path(run_dir) / RUN_JSON_NAME))
