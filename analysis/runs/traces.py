"""A run directory's PyTorch profiler traces: finding them and reading each rank's spans.

Upstream's ``--profile pt`` (``megatron/profiler.py``) records the iterations of
``--profile_steps`` on every rank with ``torch.profiler`` and writes one Chrome trace per rank
through ``tensorboard_trace_handler(<--tensorboard-dir>, use_gzip=True)``:
``<host>_<pid>.<time>.pt.trace.json.gz`` in the run's ``tensorboard/``. The file name does not
say the rank; the trace's own ``distributedInfo`` (``rank``, ``world_size``, ``backend``) does,
when ``torch.distributed`` was initialised.

Only complete events (``"ph": "X"``) are kept: the profiler's operators, annotations, GPU
kernels and copies, each with its thread (or CUDA stream), its start and duration in us, and
the correlation id that ties a GPU event to the runtime call that launched it.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TRACE_DIR = "tensorboard"
"""Folder of a run directory where upstream's profiler writes (its ``--tensorboard-dir``)."""
TRACE_GLOB = "*.pt.trace.json*"
"""How ``tensorboard_trace_handler`` names its files (``.gz`` with ``use_gzip``)."""


class TraceError(ValueError):
    """A trace file that does not read as a PyTorch profiler trace; says which file, which field
    and what to do."""


@dataclass(frozen=True, slots=True)
class Span:
    """One complete event of a trace."""

    name: str
    """Operator, annotation or kernel name (``aten::mm``, ``ProfilerStep#11``, ``gloo:recv``)."""
    cat: str
    """The profiler's category (``cpu_op``, ``user_annotation``, ``kernel``, ``gpu_memcpy``)."""
    start_us: float
    """Start, us on the trace's clock."""
    dur_us: float
    """Duration, us."""
    pid: str
    """Process (the rank's process on CPU, the device for GPU events)."""
    tid: str
    """Thread (CPU events) or CUDA stream (GPU events)."""
    correlation: int | None = None
    """``args.correlation``: links a GPU kernel or copy to the CUDA runtime call that launched it
    (the same number on both); None where the event has none."""

    @property
    def end_us(self) -> float:
        """End, us."""
        return self.start_us + self.dur_us


@dataclass(frozen=True)
class RankTrace:
    """One rank's trace, as read."""

    path: str
    """The file it was read from."""
    rank: int | None
    """Global rank from the trace's ``distributedInfo``; None when the trace has none (a
    process without ``torch.distributed``)."""
    world_size: int | None
    """World size from ``distributedInfo``."""
    backend: str | None
    """Process group backend from ``distributedInfo`` (``gloo``, ``nccl``)."""
    spans: tuple[Span, ...]
    """Its complete events, in file order."""


def trace_files(run_dir: Path) -> list[Path]:
    """The profiler traces of a run directory (its ``tensorboard/`` folder), sorted by name."""
    folder = Path(run_dir) / TRACE_DIR
    return sorted(p for p in folder.glob(TRACE_GLOB) if p.is_file())


def _load(path: Path) -> Any:
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TraceError(
            f"{path}: not a readable Chrome trace ({exc}); a trace cut short while being "
            "written (a run stopped during its export) reads like this: profile the run again"
        ) from None


def _number(event: dict[str, Any], key: str, path: Path, index: int) -> float:
    value = event.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TraceError(
            f"{path}: traceEvents[{index}] ({event.get('name')!r}): field {key!r} is "
            f"{value!r}, not a number; a complete event ('ph': 'X') needs 'ts' and 'dur' in us"
        )
    return float(value)


def _correlation(event: dict[str, Any]) -> int | None:
    args = event.get("args")
    value = args.get("correlation") if isinstance(args, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def read_trace(path: Path) -> RankTrace:
    """One trace file (gzipped or not) as a :class:`RankTrace`; :class:`TraceError` names the
    file and field when it is not a profiler trace."""
    path = Path(path)
    doc = _load(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise TraceError(
            f"{path}: no 'traceEvents' list at the top level; a PyTorch profiler trace is a "
            "JSON object with one (torch.profiler's export_chrome_trace or "
            "tensorboard_trace_handler)"
        )
    spans = []
    for i, event in enumerate(doc["traceEvents"]):
        if not isinstance(event, dict) or event.get("ph") != "X":
            continue
        spans.append(
            Span(
                name=str(event.get("name", "")),
                cat=str(event.get("cat", "")),
                start_us=_number(event, "ts", path, i),
                dur_us=_number(event, "dur", path, i),
                pid=str(event.get("pid", "")),
                tid=str(event.get("tid", "")),
                correlation=_correlation(event),
            )
        )
    info = doc.get("distributedInfo")
    info = info if isinstance(info, dict) else {}
    rank, world = info.get("rank"), info.get("world_size")
    backend = info.get("backend")
    return RankTrace(
        path=str(path),
        rank=rank if isinstance(rank, int) and not isinstance(rank, bool) else None,
        world_size=world if isinstance(world, int) and not isinstance(world, bool) else None,
        backend=backend if isinstance(backend, str) else None,
        spans=tuple(spans),
    )


def run_traces(run_dir: Path) -> tuple[list[RankTrace], list[str]]:
    """Every readable rank trace in a run directory, by rank (traces without one last, by
    file), and the :class:`TraceError` message of each file that does not read (one cut short
    leaves the other ranks' traces usable)."""
    traces, unreadable = [], []
    for path in trace_files(run_dir):
        try:
            traces.append(read_trace(path))
        except TraceError as exc:
            unreadable.append(str(exc))
    return sorted(traces, key=lambda t: (t.rank is None, t.rank or 0, t.path)), unreadable
