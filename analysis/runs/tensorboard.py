"""Upstream's TensorBoard event files as a run: the records the log parser produces.

Upstream Megatron-DeepSpeed (``--tensorboard-dir`` with ``--log-timers-to-tensorboard``,
``--log-memory-to-tensorboard``, ...; ``megatron/training.py`` ``training_log``) writes, from
its last rank only:

- ``lm-loss-training/lm loss``, ``learning-rate/learning-rate``, ``batch-size/batch-size``,
  ``grad-norm/grad-norm``, ``loss-scale/loss-scale``, ``steps-vs-samples/y=samples,x=steps``
  every ``--tensorboard-log-interval`` iterations (1 in generated runs): the loss of that
  iteration, where the text log prints the mean over its log interval;
- ``iteration-time/iteration-time`` (s per iteration, mean over the log interval) at every
  logged iteration;
- the timers as ``<name>-time`` (s per iteration, max over ranks, accumulated since the last
  logged iteration and divided by the iterations so far: at a logged iteration exactly the text
  log's max / 1000);
- ``mem-allocated-bytes`` and ``mem-reserved-bytes`` (CUDA only: current, no peak);
- every argument as text (``write_args_to_tensorboard``).

Throughput (``throughput/tflops``, samples/s, tokens/s) goes only to Weights & Biases
(``add_scalar_to_wandb``): the TFLOPs column is n/a for a run read from events, and the
samples/s here is the global batch over the iteration time (what upstream computes).

The events are read through tensorboard's own ``EventAccumulator``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from analysis.parse.records import Iteration, Memory, ParsedRun, TimerBlock

TENSORBOARD_DIR = "tensorboard"
"""Folder of a run directory with upstream's event files (``launchers``' ``--tensorboard-dir``)."""
EVENT_GLOB = "events.out.tfevents.*"
"""How TensorBoard names its event files."""

ITERATION_TIME = "iteration-time/iteration-time"
"""Seconds per iteration at each logged iteration (with ``--log-timers-to-tensorboard``)."""
LOSS = "lm-loss-training/lm loss"
"""Training loss of each iteration."""
TIMER_SUFFIX = "-time"
"""Upstream's ``Timers.write`` tag: the timer's name and this."""
NOT_TIMERS = ("iteration-time/",)
"""Tags ending in ``-time`` that are not timers."""
TFLOPS_NA = (
    "TFLOPs: upstream sends throughput/tflops (and samples/s, tokens/s) only to Weights & "
    "Biases, not to TensorBoard; samples/s is the global batch over the iteration time"
)
"""Why a run read from events has no TFLOPs."""
MEMORY_NA = (
    "memory: no mem-allocated-bytes in the events (upstream's --log-memory-to-tensorboard "
    "reads torch.cuda.memory_stats(): CUDA runs only)"
)
"""Why a CPU run read from events has no memory rows."""


def event_files(folder: Path) -> list[Path]:
    """The event files directly in ``folder``, sorted by name (their write time)."""
    return sorted(p for p in Path(folder).glob(EVENT_GLOB) if p.is_file())


def event_folders(paths: Iterable[Path]) -> list[Path]:
    """Folders that hold event files, among ``paths`` (files of a directory walk)."""
    return sorted({p.parent for p in paths if p.is_file() and p.match(EVENT_GLOB)})


def _value(text: str) -> Any:
    """An argument as upstream wrote it (``str(value)``) back as a Python value."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text


def read_events(folder: Path) -> ParsedRun:
    """The run in ``folder``'s event files, as the parser's records (see module doc)."""
    # tensorboard is imported here: it is heavy and only needed when a run has event files.
    from tensorboard.backend.event_processing.event_accumulator import (
        DEFAULT_SIZE_GUIDANCE,
        EventAccumulator,
    )

    guidance = {**DEFAULT_SIZE_GUIDANCE, "scalars": 0, "tensors": 0}  # 0: keep every event
    acc = EventAccumulator(str(folder), size_guidance=guidance)
    acc.Reload()
    tags = acc.Tags()
    scalars: dict[str, dict[int, float]] = {
        tag: {e.step: float(e.value) for e in acc.Scalars(tag)} for tag in tags.get("scalars", [])
    }
    args: dict[str, Any] = {}
    for tag in tags.get("tensors", []):  # add_text: one string tensor per argument
        events = acc.Tensors(tag)
        if events and events[-1].tensor_proto.string_val:
            raw = events[-1].tensor_proto.string_val[0].decode("utf-8", errors="replace")
            args[tag.removesuffix("/text_summary")] = _value(raw)
    return events_run(scalars, args, [str(p) for p in event_files(folder)])


def events_run(
    scalars: dict[str, dict[int, float]], args: dict[str, Any], sources: list[str]
) -> ParsedRun:
    """The parser's records from scalar series (tag -> step -> value) and the arguments."""
    problems: list[str] = []
    times = scalars.get(ITERATION_TIME, {})
    loss = scalars.get(LOSS, {})
    batch = scalars.get("batch-size/batch-size", {})
    gbs = args.get("global_batch_size")
    iterations: list[Iteration] = []
    previous = 0
    for step in sorted(times):
        window = [loss[s] for s in loss if previous < s <= step]
        batch_size = batch.get(step, gbs if isinstance(gbs, int) else None)
        seconds = times[step]
        iterations.append(
            Iteration(
                iteration=step,
                elapsed_ms=seconds * 1000.0,
                samples_per_s=batch_size / seconds if batch_size and seconds > 0 else None,
                lm_loss=sum(window) / len(window) if window else None,
                loss_scale=scalars.get("loss-scale/loss-scale", {}).get(step),
                grad_norm=scalars.get("grad-norm/grad-norm", {}).get(step),
                global_batch_size=int(batch_size) if batch_size else None,
                learning_rate=scalars.get("learning-rate/learning-rate", {}).get(step),
                consumed_samples=_int(scalars.get("steps-vs-samples/y=samples,x=steps", {}), step),
                train_iters=args.get("train_iters")
                if isinstance(args.get("train_iters"), int)
                else None,
                source="tensorboard",
            )
        )
        previous = step
    if not times:
        problems.append(
            f"no {ITERATION_TIME} in the events (upstream writes it with "
            "--log-timers-to-tensorboard)"
        )
    problems.append(TFLOPS_NA)
    timer_tags = [t for t in scalars if t.endswith(TIMER_SUFFIX) and not t.startswith(NOT_TIMERS)]
    timers = [
        TimerBlock(
            source="megatron",
            values_ms={
                t.removesuffix(TIMER_SUFFIX): scalars[t][step] * 1000.0
                for t in timer_tags
                if step in scalars[t]
            },
            iteration=step,
        )
        for step in sorted(times)
        if any(step in scalars[t] for t in timer_tags)
    ]
    allocated = scalars.get("mem-allocated-bytes", {})
    reserved = scalars.get("mem-reserved-bytes", {})
    memory = [
        Memory(
            rank=None,
            allocated_mb=allocated[step] / 2**20,
            reserved_mb=reserved[step] / 2**20 if step in reserved else None,
            after_iteration=step,
        )
        for step in sorted(allocated)
        if step in times
    ]
    if not allocated:
        problems.append(MEMORY_NA)
    config = dict(args)
    world = args.get("world_size")
    tp, pp = args.get("tensor_model_parallel_size"), args.get("pipeline_model_parallel_size")
    if isinstance(world, int) and isinstance(tp, int) and isinstance(pp, int) and tp * pp:
        config.setdefault("data_parallel_size", world // (tp * pp))
    train_iters = args.get("train_iters")
    last = max(times, default=0)
    completed = isinstance(train_iters, int) and last >= train_iters
    return ParsedRun(
        status="completed" if completed else "incomplete",
        iterations=iterations,
        memory=memory,
        timers=timers,
        config=config,
        problems=problems,
        sources=sources,
    )


def _int(series: dict[int, float], step: int) -> int | None:
    value = series.get(step)
    return int(value) if value is not None else None
