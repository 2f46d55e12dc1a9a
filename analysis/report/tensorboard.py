"""The report as TensorBoard runs: ``<report>/tensorboard/<run>/``, one per analysed run.

Each run's setup is its hyperparameters and its results are metrics, through TensorBoard's
HParams plugin: ``tensorboard --logdir <report>/tensorboard`` compares the strategies in the
HParams table and parallel-coordinates views. The folder holds the experiment (every
hyperparameter and metric, once) at its top and, per run, the session's hyperparameters and one
scalar event (step 0) per known metric; an unknown metric (n/a in the report) is left out of
that run.

Written with tensorboard's own event writer and HParams protos (``summary_v2.hparams_pb`` and
``hparams_config_pb``, which need no TensorFlow).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from analysis.metrics.rows import RunMetrics

HPARAMS: dict[str, str] = {
    "model": "model",
    "strategy": "strategy",
    "tp": "tp",
    "pp": "pp",
    "dp": "dp",
    "zero_stage": "zero stage",
    "nodes": "nodes",
    "world_size": "world size",
    "link_mbit": "link (Mbit/s)",
    "device": "device",
    "precision": "precision",
}
"""Setup as hyperparameters: RunMetrics field -> display name."""

METRICS: dict[str, tuple[str, str]] = {
    "iter_ms_mean": ("ms_per_iteration", "ms/iteration (mean, steady state)"),
    "iter_ms_ci95_lo": ("ms_per_iteration_ci95_lo", "ms/iteration 95% interval, low"),
    "iter_ms_ci95_hi": ("ms_per_iteration_ci95_hi", "ms/iteration 95% interval, high"),
    "samples_per_s": ("samples_per_s", "samples/s"),
    "tflops": ("tflops", "TFLOP/s per rank"),
    "mfu": ("mfu", "MFU"),
    "peak_mem_mb": ("peak_memory_mb", "peak memory (MB)"),
    "busbw_gbps_timers": ("busbw_gbps", "bus bandwidth (GB/s, timers)"),
    "busbw_gbps_measured": ("busbw_gbps_measured", "bus bandwidth (GB/s, netbench)"),
    "speedup": ("speedup", "speedup vs baseline"),
}
"""Results as metrics: RunMetrics field -> (tag, display name)."""

NA = "n/a"
"""A text hyperparameter's value where the run does not know it."""


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _finite(value: Any) -> float | None:
    return float(value) if _number(value) and math.isfinite(value) else None


def hparam_values(rows: list[RunMetrics]) -> list[dict[str, Any]]:
    """Each row's hyperparameters: a field numeric in every row stays a number; one that is
    missing or text somewhere is text everywhere (one type per hyperparameter)."""
    numeric = {key: all(_number(getattr(r, key)) for r in rows) for key in HPARAMS}
    return [
        {key: (getattr(r, key) if numeric[key] else str(getattr(r, key) or NA)) for key in HPARAMS}
        for r in rows
    ]


def run_folder(name: str, taken: set[str]) -> str:
    """A folder name for a run (its name, path-safe, unique among ``taken``)."""
    base = re.sub(r"[^\w.@+=-]+", "_", name).strip("._") or "run"
    folder, n = base, 1
    while folder in taken:
        n += 1
        folder = f"{base}-{n}"
    taken.add(folder)
    return folder


def write_tensorboard(rows: list[RunMetrics], out: Path) -> list[Path]:
    """Write the runs under ``out`` (created); returns the run folders written."""
    # tensorboard's writer and protos: imported here, only when the report is written.
    from tensorboard.compat.proto import summary_pb2
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.plugins.hparams import plugin_data_pb2
    from tensorboard.plugins.hparams import summary_v2 as hp
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    def write(folder: Path, summaries: list[Any]) -> None:
        writer = EventFileWriter(str(folder))
        for summary in summaries:
            writer.add_event(Event(wall_time=0.0, step=0, summary=summary))
        writer.close()

    out.mkdir(parents=True, exist_ok=True)
    values = hparam_values(rows)
    hparams = [
        hp.HParam(key, hp.Discrete(sorted({v[key] for v in values})), display_name=HPARAMS[key])
        for key in HPARAMS
    ]
    metrics = [hp.Metric(tag, display_name=label) for tag, label in METRICS.values()]
    config = hp.hparams_config_pb(hparams, metrics, time_created_secs=0.0)
    # The HParams views tick the hyperparameters that differ first (then by name): say which.
    data = plugin_data_pb2.HParamsPluginData.FromString(
        config.value[0].metadata.plugin_data.content
    )
    for info in data.experiment.hparam_infos:
        info.differs = len({v[info.name] for v in values}) > 1
    config.value[0].metadata.plugin_data.content = data.SerializeToString()
    write(out, [config])
    taken: set[str] = set()
    folders = []
    for row, hparam in zip(rows, values, strict=True):
        folder = out / run_folder(row.name, taken)
        scalars = [
            summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)])
            for key, (tag, _label) in METRICS.items()
            if (value := _finite(getattr(row, key))) is not None
        ]
        start = hp.hparams_pb(hparam, trial_id=row.name, start_time_secs=0.0)
        write(folder, [start, *scalars])
        folders.append(folder)
    return folders
