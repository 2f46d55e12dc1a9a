"""Run discovery: turn a directory of run directories and bare log files into ``LoadedRun``s.

Two kinds of input, found recursively under LOGDIR:

- a *run directory* (written by ``launchers``): any directory holding ``run.json``; its ``*.log``
  files (``launcher.log``, ``node0.log``, ...) are the logs of ONE run, merged with
  ``analysis.parse.reader.merge_runs``; ``ds_config.json``, ``launch.sh`` and ``netbench.json`` sit
  next to them;
- *bare log files* (like the lab logs): ``<stem>.log`` is a run named by its stem; files whose
  stems differ only by a ``_node<N>`` suffix are the per-node logs of one run and are merged;
  ``<stem>.json`` next to a log is its DeepSpeed config and ``<stem>.cmd`` its command line.

The run's setup (model, strategy, cluster, network) is resolved field by field from, in order of
trust: ``run.json`` spec, the command line, the DeepSpeed config, the parser's ``config`` (the
log's own argument dump), the run name. Every field says where it came from; a field no source
gives stays ``None`` and the problem is recorded. Nothing here is guessed from typical values.
"""

from __future__ import annotations

import itertools
import json
import re
import shlex
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal

import numpy as np

from analysis.parse.reader import merge_runs, parse_file, parse_stream
from analysis.parse.records import ParsedRun, int_values
from analysis.runs.problems import Problem
from analysis.runs.record import Outcome, RunRecord, RunRecordError, from_json
from analysis.runs.tensorboard import TENSORBOARD_DIR, event_files, event_folders, read_events
from analysis.theory.formulas import RATE_IN_NAME, padded_vocab_size, parse_rate
from analysis.theory.presets import model_table
from analysis.theory.setup import Precision, RunSetup

Status = Literal["completed", "failed", "incomplete", "interrupted", "running"]
"""Run status: the parser's three plus the launcher's ``interrupted``/``running`` (run.json)."""

MODEL_PRESETS: dict[str, tuple[int, int, int, int]] = {
    name: shape.dims for name, shape in model_table().items()
}
"""Known model presets as (layers, hidden, heads, seq), read from ``megatron_configs``."""

NODE_SUFFIX = re.compile(r"^(?P<stem>.+)_node(?P<node>\d+)$")
"""A per-node log's name (``dp2_node1``): the run's stem and the node's number."""
_ACCELERATOR_RE = re.compile(
    r"\bDS_ACCELERATOR=(cpu|cuda)\b|ds_accelerator to (?:be )?(cpu|cuda)\b"
)
"""The accelerator a log states: the environment the pdsh runner exports to every node
(``export DS_ACCELERATOR=cpu``), or DeepSpeed's ``Setting ds_accelerator to cpu``."""


@dataclass(frozen=True)
class LoadedRun:
    """One run as found on disk: its parsed logs, its resolved setup and side files."""

    name: str
    """Run name: run.json ``name``, else the directory or log stem."""
    path: str
    """Where it was found, relative to LOGDIR (POSIX)."""
    kind: Literal["run_dir", "log_files"]
    """A launcher run directory or bare log file(s)."""
    parsed: ParsedRun | None
    """Merged parse of all its log files (None when there were no logs)."""
    setup: RunSetup
    """Resolved setup."""
    status: Status
    """run.json outcome when present, else the parser's status."""
    failure_kind: str | None = None
    """Failure kind (parser's closed set, or run.json ``outcome.kind``)."""
    failure_reason: str | None = None
    """Failure message or run.json ``outcome.reason``."""
    record: RunRecord | None = None
    """run.json as a typed record (None: no run.json, or one that does not read as a record)."""
    netbench: dict[str, Any] | None = None
    """netbench.json as read (measured collective bandwidth)."""
    log_files: tuple[str, ...] = ()
    """Log files that fed the run, relative to LOGDIR."""
    event_files: tuple[str, ...] = ()
    """TensorBoard event files of the run (upstream's ``--tensorboard-dir``), relative to
    LOGDIR; the run is read from them when it has no log file."""
    last_write: float | None = None
    """When its log files were last written (the newest mtime, seconds since the epoch): for a
    log still being written, the time of its last line."""
    problems: tuple[Problem, ...] = ()
    """What was missing or inconsistent, each with its code."""


def _read_json(path: Path, problems: list[Problem]) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        what = f"{path.name}: unreadable JSON ({exc.__class__.__name__}: {exc})"
        problems.append(Problem("unreadable_json", path.name, what))
        return None
    if not isinstance(data, dict):
        what = f"{path.name}: not a JSON object (top level is {type(data).__name__})"
        problems.append(Problem("not_an_object", path.name, what))
        return None
    return data


def _cmd_flags(cmd: str) -> dict[str, str | bool]:
    """``--flag value`` / ``--flag`` pairs of a command line (last occurrence wins)."""
    first_line = cmd.strip().splitlines()[0] if cmd.strip() else ""
    try:
        tokens = shlex.split(first_line)
    except ValueError:
        tokens = first_line.split()
    flags: dict[str, str | bool] = {}
    for i, tok in enumerate(tokens):
        if tok.startswith("--"):
            key = tok[2:].split("=", 1)[0].replace("_", "-")
            if "=" in tok:
                flags[key] = tok.split("=", 1)[1]
            elif i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
                flags[key] = tokens[i + 1]
            else:
                flags[key] = True
    return flags


def derive_strategy(tp: int, pp: int, zero_stage: int, offload: bool = False) -> str:
    """Strategy name from the parallel layout: one axis -> its name; several -> ``hybrid-...``."""
    parts = []
    if tp > 1:
        parts.append(f"tp{tp}")
    if pp > 1:
        parts.append(f"pp{pp}")
    if zero_stage > 0:
        parts.append(f"zero{zero_stage}")
    if offload:
        parts.append("offload")
    if not parts:
        return "baseline"
    if len(parts) == 1:
        single = parts[0]
        if single.startswith("tp"):
            return "tensor"
        if single.startswith("pp"):
            return "pipeline"
        return single
    return "hybrid-" + "-".join(parts)


def derive_model_name(layers: int, hidden: int, heads: int, seq: int) -> str:
    """Preset name matching (layers, hidden, heads, seq), else a descriptive custom name."""
    for name, dims in MODEL_PRESETS.items():
        if dims == (layers, hidden, heads, seq):
            return name
    return f"custom-l{layers}-h{hidden}-a{heads}-s{seq}"


def _as_int(value: Any) -> int | None:
    try:
        return int(value) if value is not None and value is not True else None
    except (TypeError, ValueError):
        return None


def _precision(fp16: Any, bf16: Any) -> Precision | None:
    if fp16 is None and bf16 is None:
        return None
    if fp16:
        return "fp16"
    if bf16:
        return "bf16"
    return "fp32"


def as_record(
    run_json: RunRecord | dict[str, Any] | None,
    problems: list[Problem],
    source: str = "run.json",
) -> RunRecord | None:
    """The run record of a run.json document (as is when already typed); None when there is
    none or it does not read as one (the error, naming the field, is added to ``problems``)."""
    if run_json is None or isinstance(run_json, RunRecord):
        return run_json
    try:
        return from_json(run_json, source)
    except RunRecordError as exc:
        problems.append(Problem("invalid_run_json", source, str(exc)))
        return None


def resolve_setup(
    name: str,
    run_json: RunRecord | dict[str, Any] | None,
    ds_config: dict[str, Any] | None,
    cmd: str | None,
    parsed: ParsedRun | None,
    node_files: int = 1,
    log_text: str = "",
) -> tuple[RunSetup, list[Problem]]:
    """Resolve a run's setup from every source, most trusted first; returns (setup, problems)."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    problems: list[Problem] = []

    def put(key: str, value: Any, source: str) -> None:
        if value is not None and key not in values:
            values[key] = value
            sources[key] = source

    record = as_record(run_json, problems)
    spec = (record.spec if record else None) or {}
    model = spec.get("model") or {}
    strategy = spec.get("strategy") or {}
    cluster = spec.get("cluster") or {}
    for key in (
        "num_layers",
        "hidden_size",
        "num_attention_heads",
        "seq_length",
        "max_position_embeddings",
        "ffn_hidden_size",
        "vocab_size",
        "micro_batch_size",
        "global_batch_size",
    ):
        put(key, _as_int(model.get(key)), "run.json")
    put("precision", model.get("precision"), "run.json")
    put("model", model.get("name"), "run.json")
    put("strategy", strategy.get("name"), "run.json")
    for key in ("tp", "pp", "dp", "zero_stage"):
        put(key, _as_int(strategy.get(key)), "run.json")
    if isinstance(strategy.get("offload"), bool):
        put("offload", strategy["offload"], "run.json")
    elif strategy.get("offload") not in (None, "none", ""):
        put("offload", True, "run.json")
    put("world_size", _as_int(cluster.get("world_size")), "run.json")
    if isinstance(cluster.get("hosts"), list) and cluster["hosts"]:
        put("nodes", len(cluster["hosts"]), "run.json")
    put("device", spec.get("device"), "run.json")
    put("activation_checkpointing", spec.get("activation_checkpointing"), "run.json")
    put("train_iters", _as_int(spec.get("train_iters")), "run.json")
    put("log_interval", _as_int(spec.get("log_interval")), "run.json")
    network = record.network if record else None
    if network is not None:
        put("link_mbit", network.link_mbit, "run.json network")
        put("latency_ms", network.delay_ms, "run.json network")
        cpus = (network.node_cpu or {}).get("cpus")
        if isinstance(cpus, int | float) and cpus > 0:
            put("node_cpus", float(cpus), "run.json network")

    if cmd:
        flags = _cmd_flags(cmd)
        cmd_map = {
            "num_layers": "num-layers",
            "hidden_size": "hidden-size",
            "num_attention_heads": "num-attention-heads",
            "seq_length": "seq-length",
            "max_position_embeddings": "max-position-embeddings",
            "ffn_hidden_size": "ffn-hidden-size",
            "micro_batch_size": "micro-batch-size",
            "global_batch_size": "global-batch-size",
            "tp": "tensor-model-parallel-size",
            "pp": "pipeline-model-parallel-size",
            "zero_stage": "zero-stage",
            "train_iters": "train-iters",
            "log_interval": "log-interval",
        }
        for key, flag in cmd_map.items():
            put(key, _as_int(flags.get(flag)), "cmd")
        if "fp16" in flags or "bf16" in flags:
            put("precision", "fp16" if "fp16" in flags else "bf16", "cmd")
        if "normalization" in flags:
            put("normalization", flags["normalization"], "cmd")
        if "checkpoint-activations" in flags or flags.get("recompute-granularity") == "full":
            put("activation_checkpointing", True, "cmd")
        if "DS_ACCELERATOR=cpu" in cmd:
            put("device", "cpu", "cmd")
        if "node-rank" in flags or "hostfile" in flags:
            put("nodes", node_files if node_files > 1 else None, "cmd (per-node logs)")
        elif "num-gpus" in flags or "num_gpus" in cmd:
            put("nodes", 1, "cmd (--num_gpus: one machine)")
            put("world_size", _as_int(flags.get("num-gpus")), "cmd")

    if ds_config:
        zero = ds_config.get("zero_optimization") or {}
        put("zero_stage", _as_int(zero.get("stage")), "ds_config")
        put("steps_per_print", _as_int(ds_config.get("steps_per_print")), "ds_config")
        if isinstance(ds_config.get("wall_clock_breakdown"), bool):
            put("wall_clock_breakdown", ds_config["wall_clock_breakdown"], "ds_config")
        put("reduce_bucket_size", _as_int(zero.get("reduce_bucket_size")), "ds_config")
        put(
            "param_persistence_threshold",
            _as_int(zero.get("stage3_param_persistence_threshold")),
            "ds_config",
        )
        put("communication_data_type", ds_config.get("communication_data_type"), "ds_config")
        fp16 = (ds_config.get("fp16") or {}).get("enabled")
        bf16 = (ds_config.get("bf16") or {}).get("enabled")
        put("precision", _precision(fp16, bf16), "ds_config")
        offload = zero.get("offload_optimizer") or zero.get("offload_param")
        if offload:
            device = offload.get("device") if isinstance(offload, dict) else None
            put("offload", device not in (None, "none"), "ds_config")
        micro = _as_int(ds_config.get("train_micro_batch_size_per_gpu"))
        put("micro_batch_size", micro, "ds_config")
        put("global_batch_size", _as_int(ds_config.get("train_batch_size")), "ds_config")

    if parsed is not None:
        _log_steps_per_print(parsed, put)

    config = parsed.config if parsed else {}
    for key in (
        "num_layers",
        "hidden_size",
        "num_attention_heads",
        "seq_length",
        "max_position_embeddings",
        "ffn_hidden_size",
        "micro_batch_size",
        "global_batch_size",
        "padded_vocab_size",
        "world_size",
        "train_iters",
        "log_interval",
    ):
        put(key, _as_int(config.get(key)), "log")
    put("tp", _as_int(config.get("tensor_model_parallel_size")), "log")
    put("pp", _as_int(config.get("pipeline_model_parallel_size")), "log")
    put("dp", _as_int(config.get("data_parallel_size")), "log")
    put("zero_stage", _as_int(config.get("zero_stage")), "log")
    put("normalization", config.get("normalization"), "log")
    put("precision", _precision(config.get("fp16"), config.get("bf16")), "log")
    if config.get("checkpoint_activations") or config.get("recompute_granularity") == "full":
        put("activation_checkpointing", True, "log")
    torch_version = (parsed.versions.get("torch") if parsed else None) or ""
    if torch_version.endswith("+cpu"):
        put("device", "cpu", "log (torch +cpu build)")
    accel = _ACCELERATOR_RE.search(log_text)
    if accel:
        device = "cpu" if (accel.group(1) or accel.group(2)) == "cpu" else "cuda"
        put("device", device, f"log ({accel.group(0)})")
    match = re.search(r"nnodes=(\d+)", log_text)
    if match:
        put("nodes", int(match.group(1)), "log (launcher nnodes)")

    link = RATE_IN_NAME.search(name)
    if link:
        put("link_mbit", parse_rate(link.group(0)), "name")

    # Derived fields, from what is known.
    tp, pp = values.get("tp"), values.get("pp")
    world = values.get("world_size")
    if "dp" not in values and None not in (tp, pp, world):
        put("dp", world // (tp * pp), "derived: world / (tp * pp)")
    if "world_size" not in values and None not in (tp, pp, values.get("dp")):
        put("world_size", tp * pp * values["dp"], "derived: tp * pp * dp")
    if "max_position_embeddings" not in values and "seq_length" in values:
        put("max_position_embeddings", values["seq_length"], "derived: = seq_length")
    if "ffn_hidden_size" not in values and "hidden_size" in values:
        put("ffn_hidden_size", 4 * values["hidden_size"], "derived: Megatron default 4h")
    if "normalization" not in values and values.get("num_layers") is not None:
        put("normalization", "layernorm", "derived: Megatron default")
    if "activation_checkpointing" not in values and values.get("num_layers") is not None:
        put("activation_checkpointing", False, "derived: no recompute flag")
    if "offload" not in values and values.get("zero_stage") is not None:
        put("offload", False, "derived: no offload in config")
    dims = [values.get(k) for k in ("num_layers", "hidden_size", "num_attention_heads")]
    dims.append(values.get("seq_length"))
    if "model" not in values and None not in dims:
        put("model", derive_model_name(*dims), "derived from layers/hidden/heads/seq")
    if "strategy" not in values and None not in (tp, pp, values.get("zero_stage")):
        put(
            "strategy",
            derive_strategy(tp, pp, values["zero_stage"], bool(values.get("offload"))),
            "derived from tp/pp/zero",
        )
    if "padded_vocab_size" not in values and values.get("vocab_size") is not None and tp:
        padded = padded_vocab_size(values["vocab_size"], tp)
        put("padded_vocab_size", padded, "derived: vocab padded to 128 x tp")

    for key, why in (
        ("model", "model dimensions"),
        ("strategy", "parallel layout"),
        ("world_size", "world size"),
        ("nodes", "node count"),
        ("padded_vocab_size", "padded vocabulary (needed for FLOPs and parameters)"),
    ):
        if key not in values:
            what = f"{key}: unknown ({why} not in run.json, cmd, ds_config or log)"
            problems.append(Problem("setup_unknown", key, what))
    try:
        setup = RunSetup(**values, sources=sources)
    except ValueError as exc:
        problems.append(Problem("inconsistent_setup", None, f"inconsistent setup: {exc}"))
        values.pop("dp", None)
        setup = RunSetup(**values, sources=sources)
    return setup, problems


def _log_steps_per_print(parsed: ParsedRun, put: Callable[[str, Any, str], None]) -> None:
    """DeepSpeed's ``steps_per_print`` from the log: its config dump, its engine dump, or the
    spacing of the PipelineEngine's ``steps: N`` lines (printed when N % steps_per_print == 0,
    by the same condition as its timer totals)."""
    put("steps_per_print", _as_int(parsed.ds_config.get("steps_per_print")), "log (config dump)")
    put("steps_per_print", _as_int(parsed.ds_engine.get("steps_per_print")), "log (engine dump)")
    steps = int_values(parsed.pipeline_steps, "step")
    if isinstance(steps, np.ndarray):  # (a column of millions of steps: no int each)
        d = np.diff(steps)
        gaps = {int(d.min()), int(d.max())} if len(d) else set()  # (one gap: both the same)
    else:
        gaps = {b - a for a, b in itertools.pairwise(steps)}
    if len(gaps) == 1 and (gap := gaps.pop()) > 0 and int(steps[0]) % gap == 0:
        put("steps_per_print", gap, f"log (every {gap} steps between {len(steps)} 'steps:' lines)")


def _group_bare_logs(files: Iterable[Path]) -> dict[tuple[Path, str], list[Path]]:
    groups: dict[tuple[Path, str], list[Path]] = {}
    for path in sorted(files):
        match = NODE_SUFFIX.match(path.stem)
        stem = match.group("stem") if match else path.stem
        groups.setdefault((path.parent, stem), []).append(path)
    return groups


def _status(parsed: ParsedRun | None, record: RunRecord | None) -> Status:
    status = record.outcome.status if record and record.outcome else None
    if status in ("completed", "failed", "interrupted", "running"):
        return status  # type: ignore[return-value]
    if parsed and parsed.interrupted:  # the launcher's marker in a bare log
        return "interrupted"
    return parsed.status if parsed else "incomplete"


_HEAD_CHARS = 200_000
"""Characters at the start of a log searched for launcher lines (``nnodes=``)."""


class _HeadReader:
    """A binary file that keeps the first bytes read from it (the log is read once)."""

    def __init__(self, fh: BinaryIO, keep: int) -> None:
        self.fh, self.keep, self.head = fh, keep, b""

    def read(self, n: int = -1) -> bytes:
        data = self.fh.read(n)
        if len(self.head) < self.keep:
            self.head += data[: self.keep - len(self.head)]
        return data

    def seekable(self) -> bool:
        """Whether the file can be rewound (the parser peeks at its start)."""
        return self.fh.seekable()

    def seek(self, pos: int, whence: int = 0) -> int:
        """Move in the file (what was kept of its head stays)."""
        return self.fh.seek(pos, whence)


def _parse_one(path: Path) -> tuple[list[ParsedRun], str]:
    """A log's runs and the first ``_HEAD_CHARS`` characters of its text, in one read."""
    try:
        fh = path.open("rb")
    except OSError:
        return parse_file(path), ""  # says why it cannot be read
    with fh:
        reader = _HeadReader(fh, 4 * _HEAD_CHARS)  # UTF-8: at most 4 bytes a character
        runs = parse_stream(reader, str(path))  # type: ignore[arg-type]
    return runs, reader.head.decode("utf-8", errors="replace")[:_HEAD_CHARS]


def _parse_all(paths: list[Path], problems: list[Problem]) -> tuple[list[ParsedRun], str]:
    """Parse each file and merge the k-th run of every file into one run (per-node logs);
    also the heads of the files' text, joined."""
    parsed = [_parse_one(p) for p in paths]
    per_file = [runs for runs, _head in parsed]
    count = max((len(runs) for runs in per_file), default=0)
    merged = []
    for k in range(count):
        parts = [runs[k] for runs in per_file if k < len(runs)]
        merged.append(merge_runs(parts) if len(parts) > 1 else parts[0])
    if len({len(r) for r in per_file}) > 1:
        what = "log files disagree on the number of training runs they hold"
        problems.append(Problem("logs_disagree", "log", what))
    return merged, "\n".join(head for _runs, head in parsed)


def _make_runs(
    name: str,
    rel: str,
    kind: Literal["run_dir", "log_files"],
    logs: list[Path],
    root: Path,
    record: RunRecord | None,
    ds_config: dict[str, Any] | None,
    cmd: str | None,
    netbench: dict[str, Any] | None,
    problems: list[Problem],
    events: Sequence[Path] = (),
) -> list[LoadedRun]:
    parsed_runs, log_text = _parse_all(logs, problems) if logs else ([], "")
    if not logs and events:
        parsed_runs = [read_events(events[0].parent)]
    elif not logs:
        problems.append(Problem("no_log", "log", "no *.log file"))
    node_files = sum(1 for p in logs if NODE_SUFFIX.match(p.stem) or p.stem.startswith("node"))
    out = []
    for k, parsed in enumerate(parsed_runs or [None]):
        run_name = name if len(parsed_runs) <= 1 else f"{name}#{k + 1}"
        setup, setup_problems = resolve_setup(
            run_name, record, ds_config, cmd, parsed, node_files, log_text
        )
        failure = parsed.failure if parsed else None
        outcome = (record.outcome if record else None) or Outcome()
        parser = [Problem.of_parser(p) for p in (parsed.problems if parsed else [])]
        all_problems = [*problems, *setup_problems, *parser]
        out.append(
            LoadedRun(
                name=run_name,
                path=rel,
                kind=kind,
                parsed=parsed,
                setup=setup,
                status=_status(parsed, record),
                failure_kind=outcome.kind or (failure.kind if failure else None),
                failure_reason=outcome.reason or (failure.message if failure else None),
                record=record,
                netbench=netbench,
                log_files=tuple(p.relative_to(root).as_posix() for p in logs),
                event_files=tuple(p.relative_to(root).as_posix() for p in events),
                last_write=max((p.stat().st_mtime for p in [*logs] or [*events]), default=None),
                problems=tuple(all_problems),
            )
        )
    return out


def _raw_name(run_json: dict[str, Any] | None) -> str | None:
    """The name of a run.json that is not a valid record (its problem is reported), if it has
    one: the report still tells the run by its name."""
    name = (run_json or {}).get("name")
    return name if isinstance(name, str) else None


def discover(logdir: Path, exclude: Iterable[Path] = ()) -> list[LoadedRun]:
    """Every run under ``logdir`` (a directory or one log file), sorted by name.

    ``exclude`` are directories to skip (the report's own output directory).
    """
    logdir = Path(logdir)
    if logdir.is_file():
        root, candidates = logdir.parent, [logdir]
    else:
        root = logdir
        excluded = [Path(p).resolve() for p in exclude]
        candidates = [
            p
            for p in sorted(logdir.rglob("*"))
            if not any(p.resolve().is_relative_to(e) for e in excluded)
        ]
    run_dirs = sorted({p.parent for p in candidates if p.name == "run.json"})
    runs: list[LoadedRun] = []
    for run_dir in run_dirs:
        problems: list[Problem] = []
        run_json = _read_json(run_dir / "run.json", problems)
        ds_path = run_dir / "ds_config.json"
        ds_config = _read_json(ds_path, problems) if ds_path.exists() else None
        launch = run_dir / "launch.sh"
        nb_path = run_dir / "netbench.json"
        netbench = _read_json(nb_path, problems) if nb_path.exists() else None
        logs = sorted(run_dir.glob("*.log"))
        events = event_files(run_dir / TENSORBOARD_DIR)
        record = as_record(run_json, problems)
        name = record.name if record else _raw_name(run_json)
        name = name or run_dir.name
        rel = run_dir.relative_to(root).as_posix() if run_dir != root else "."
        runs += _make_runs(
            name,
            rel,
            "run_dir",
            logs,
            root,
            record,
            ds_config,
            launch.read_text() if launch.exists() else None,
            netbench,
            problems,
            events,
        )
    # A collective benchmark's own directory (netbench.json, no run.json; sessions put them
    # under <logs>/netbench/) holds launcher logs of the benchmark, not of a training run.
    bench_dirs = {p.parent for p in candidates if p.name == "netbench.json"} - set(run_dirs)
    bench_dirs |= {p.parent for p in candidates if "netbench" in p.relative_to(root).parts[:-1]}
    bare = [
        p
        for p in candidates
        if p.suffix == ".log"
        and p.is_file()
        and not any(p.is_relative_to(d) for d in run_dirs)
        and p.parent not in bench_dirs
    ]
    for (parent, stem), logs in _group_bare_logs(bare).items():
        problems = []
        first = logs[0]
        json_path = first.with_suffix(".json")
        cmd_path = first.with_suffix(".cmd")
        ds_config = _read_json(json_path, problems) if json_path.exists() else None
        cmd = cmd_path.read_text() if cmd_path.exists() else None
        if ds_config is None:
            what = "no DeepSpeed config next to the log"
            problems.append(Problem("no_ds_config", json_path.name, what))
        if cmd is None:
            what = "no command line (.cmd) next to the log"
            problems.append(Problem("no_cmd", cmd_path.name, what))
        rel = (parent / stem).relative_to(root).as_posix()
        runs += _make_runs(stem, rel, "log_files", logs, root, None, ds_config, cmd, None, problems)
    # A folder of event files outside a run directory (upstream's --tensorboard-dir, copied
    # alone): a run named by the folder (by its parent when the folder is ``tensorboard``).
    for folder in event_folders(candidates):
        if any(folder.is_relative_to(d) for d in run_dirs):
            continue
        named = folder.parent if folder.name == TENSORBOARD_DIR and folder != root else folder
        rel = folder.relative_to(root).as_posix() if folder != root else "."
        events = event_files(folder)
        runs += _make_runs(
            named.name, rel, "log_files", [], root, None, None, None, None, [], events
        )
    return sorted(runs, key=lambda r: r.name)
