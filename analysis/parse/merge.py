"""A parsed run finished (timers attributed to iterations, the summary, the failure) and the
per-node files of one run merged into one ``ParsedRun``.
"""

from __future__ import annotations

from typing import Any

from analysis.parse.records import Failure, ParsedRun, PipelineStep, PipelineStepTable
from analysis.parse.rules import RunState
from analysis.parse.storage import (
    DeepSpeedBlocks,
    attribute_blocks,
    merge_attribution,
    merge_iterations,
)

_SUMMARY_KEYS = (
    "num_layers",
    "hidden_size",
    "num_attention_heads",
    "seq_length",
    "micro_batch_size",
    "global_batch_size",
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "data_parallel_size",
    "zero_stage",
    "world_size",
    "padded_vocab_size",
    "num_parameters",
)

DS_BATCH_KEYS = (
    ("global_batch_size", "train_batch_size"),
    ("micro_batch_size", "train_micro_batch_size_per_gpu"),
)
"""Summary keys the DeepSpeed config gives when nothing else does: (key, its name there)."""


def run_summary(run: RunState) -> tuple[dict[str, Any], list[str]]:
    """The config dict: Megatron's typed args plus the summary keys (None when unknown)."""
    problems: list[str] = []
    config: dict[str, Any] = dict(run.args)
    sources = (run.args, run.world, run.cmd_args)
    for key in _SUMMARY_KEYS:
        config[key] = next((s[key] for s in sources if s.get(key) is not None), None)
    zero = run.ds_config.get("zero_optimization")
    ds_stage = zero.get("stage") if isinstance(zero, dict) else None
    if not isinstance(ds_stage, int):
        ds_stage = run.ds_engine.get("zero_optimization_stage")
    if isinstance(ds_stage, int):
        if config["zero_stage"] is not None and config["zero_stage"] != ds_stage:
            problems.append(
                f"zero stage: Megatron argument says {config['zero_stage']}, DeepSpeed's config "
                f"says {ds_stage}; using DeepSpeed's"
            )
        config["zero_stage"] = ds_stage
    for name, ds_name in DS_BATCH_KEYS:
        value = run.ds_config.get(ds_name)
        if config[name] is None and isinstance(value, int):
            config[name] = value
    if run.vocab:
        config["padded_vocab_size"] = run.vocab["padded_vocab_size"]
        config["vocab_size"] = run.vocab["vocab_size"]
    if run.cmd_args:
        config["launcher_args"] = dict(run.cmd_args)
    config["train_iters"] = run.train_iters
    if run.train_iters is None:
        given = (s["train_iters"] for s in sources if isinstance(s.get("train_iters"), int))
        config["train_iters"] = next(given, None)
    if run.params:
        config["num_parameters_by_rank"] = dict(run.params)
    config["num_parameters"], why = num_parameters_of(config, run.params)
    if why:
        problems.append(why)
    return config, problems


def num_parameters_of(config: dict[str, Any], params: dict[str, int]) -> tuple[int | None, str]:
    """Parameters of the model as printed, when the log states it for the whole model.

    Megatron prints ``number of parameters on (tensor, pipeline) model parallel rank (t, p)``
    per model-parallel rank.  With tp = pp = 1 that is the model's count.  With model
    parallelism the per-rank counts do not add up to it (tensor-parallel ranks each hold the
    replicated layer norms and biases; with pipelining the tied word embedding lives on the
    first and the last stage), so the count is left unknown and the per-rank counts are kept
    in ``num_parameters_by_rank``.
    """
    if not params:
        return None, ""
    tp = config.get("tensor_model_parallel_size") or 1
    pp = config.get("pipeline_model_parallel_size") or 1
    if tp * pp == 1 and len(params) == 1:
        return next(iter(params.values())), ""
    return None, (
        f"num_parameters not derivable from the log: with tp({tp}) * pp({pp}) = {tp * pp} "
        f"model-parallel ranks the per-rank counts {sorted(params.items())} count replicated "
        "and tied weights more than once; see num_parameters_by_rank"
    )


def is_pipeline(config: dict[str, Any], has_steps: bool) -> bool:
    pp = config.get("pipeline_model_parallel_size")
    return has_steps or (isinstance(pp, int) and pp > 1)


def finished_run(run: RunState) -> ParsedRun:
    """Turn the filled state into a ParsedRun: config, attribution, status."""
    config, problems = run_summary(run)
    steps = run.steps.column("step").ints()
    pipeline = is_pipeline(config, bool(run.steps))
    ds_blocks, attr_problems = attribute_blocks(run.ds_blocks, run.iter_numbers, steps, pipeline)
    timers = run.megatron_blocks
    timers.extend(ds_blocks)
    del ds_blocks
    run.ds_blocks = DeepSpeedBlocks()  # they are in ``timers`` now: let the rest go
    timers.sort_by_line()
    out = ParsedRun(
        iterations=run.iterations,
        memory=run.memory,
        memory_other=run.memory_other,
        timers=timers,
        pipeline_steps=run.steps,
        config=config,
        ds_config=run.ds_config,
        ds_engine=run.ds_engine,
        versions=run.versions,
        problems=run.problems + problems + attr_problems,
        further_failures=list(run.further_failures),
        sources=[run.source],
        first_line=run.first_line,
    )
    train_iters = config.get("train_iters")
    reached = run.reached_final or (
        isinstance(train_iters, int) and run.max_iter >= train_iters > 0
    )
    all_exited = run.exited_ok > 0 and run.exited_ok >= run.spawned
    if run.failure is not None:
        out.status, out.failure = "failed", run.failure
    elif reached or all_exited:
        out.status = "completed"
    if run.outcome is not None:
        status, kind, reason, line = run.outcome
        out.interrupted = status == "interrupted"
        if out.interrupted:
            status = "failed"
        if out.failure is not None and (status != "failed" or kind != out.failure.kind):
            out.problems.append(
                f"line {out.failure.line}: superseded by the run outcome marker at line {line}: "
                f"{out.failure.kind}: {out.failure.message}"
            )
        out.status = status  # type: ignore[assignment]
        out.failure = (
            Failure(kind=kind or "other", message=reason, line=line)  # type: ignore[arg-type]
            if status == "failed"
            else None
        )
    found = (run.iterations, run.steps, run.megatron_blocks, run.memory, run.memory_other)
    if not (any(found) or run.failure or run.outcome or run.args or run.world):
        out.problems.append("no training output recognised")
    return out


# -- entry points -----------------------------------------------------------------------------


def merge_runs(runs: list[ParsedRun]) -> ParsedRun:
    """Merge the ParsedRuns of one training run read from several per-node files.

    Records are united (iterations deduplicated by number, pipeline steps by step), config
    keys take the first known value, the parameter count is recomputed from the union of the
    per-rank counts, and unattributed DeepSpeed blocks (node 0 prints them, the last node the
    iteration lines) are attributed when their count equals the final iteration number.
    Status: failed if any part failed (its failure is kept), completed if the iteration lines
    reached train_iters or every part completed, incomplete otherwise.
    """
    if not runs:
        return ParsedRun(problems=["nothing to merge"])
    if len(runs) == 1:
        return runs[0]
    out = ParsedRun(first_line=runs[0].first_line)
    seen_steps: dict[int, PipelineStep] = {}
    for part in runs:
        for st in part.pipeline_steps:
            seen_steps.setdefault(st.step, st)
        out.memory.extend(part.memory)
        out.memory_other.extend(part.memory_other)
        out.timers.extend(part.timers)
        for key, value in part.config.items():
            if out.config.get(key) is None:
                out.config[key] = value
        by_rank = out.config.get("num_parameters_by_rank")
        if isinstance(part.config.get("num_parameters_by_rank"), dict):
            merged = dict(by_rank) if isinstance(by_rank, dict) else {}
            merged.update(part.config["num_parameters_by_rank"])
            out.config["num_parameters_by_rank"] = merged
        for key, value in part.ds_config.items():
            out.ds_config.setdefault(key, value)
        for key, value in part.ds_engine.items():
            out.ds_engine.setdefault(key, value)
        for key, value in part.versions.items():
            out.versions.setdefault(key, value)
        src = ",".join(part.sources)
        out.problems.extend(f"{src}: {p}" for p in part.problems)
        out.further_failures.extend(part.further_failures)
        out.sources.extend(part.sources)
    out.iterations = merge_iterations(p.iterations for p in runs)
    out.pipeline_steps = PipelineStepTable(sorted(seen_steps.values(), key=lambda s: s.step))
    by_rank = out.config.get("num_parameters_by_rank")
    if isinstance(by_rank, dict):
        out.config["num_parameters"], why = num_parameters_of(out.config, by_rank)
        if why:
            out.problems.append(why)
    pipeline = is_pipeline(out.config, bool(out.pipeline_steps))
    last = out.iterations[-1].iteration if out.iterations else None
    out.problems.extend(merge_attribution(out.timers, last, pipeline))  # type: ignore[arg-type]
    failed = next((p for p in runs if p.status == "failed"), None)
    train_iters = out.config.get("train_iters")
    if failed is not None:
        out.status, out.failure = "failed", failed.failure
        out.interrupted = any(p.interrupted for p in runs)
    elif (isinstance(train_iters, int) and last is not None and last >= train_iters) or all(
        p.status == "completed" for p in runs
    ):
        out.status = "completed"
    return out
