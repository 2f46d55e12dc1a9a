"""Generated Megatron argv through upstream's own ``parse_args`` + ``validate_args``.

For every valid model x strategy x device, the arguments ``launch.sh`` passes to
``pretrain_gpt.py`` are parsed by the pinned upstream exactly as ``initialize_megatron`` does
(``megatron.arguments.parse_args`` with ``deepspeed.add_config_arguments``, then
``validate_args`` with pretrain_gpt's ``args_defaults``) with WORLD_SIZE set to the spec's world
size, so a renamed or removed upstream flag fails here. All cases run in one subprocess (upstream
imports torch and DeepSpeed once) with upstream's directory first on ``sys.path``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from launchers.config.hostfile import parse_hostfile_text
from launchers.config.presets import load_models, load_strategies, resolve_spec
from launchers.config.project import launcher_command, script_index
from launchers.config.spec import PLACEHOLDER_PATHS, RunSpec

pytestmark = pytest.mark.upstream

RUN_DIR = "/RUNS/run"
DRIVER = r"""
import contextlib, io, json, os, sys
cases = json.load(sys.stdin)
sys.path.insert(0, os.environ["UPSTREAM_DIR"])
from megatron.arguments import parse_args, validate_args
results = {}
for case in cases:
    os.environ["WORLD_SIZE"] = str(case["world_size"])
    os.environ["RANK"] = "0"
    sys.argv = ["pretrain_gpt.py", *case["argv"]]
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            args = parse_args(None, ignore_unknown_args=False)
            validate_args(args, {"tokenizer_type": "GPT2BPETokenizer"})
        keys = ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                "data_parallel_size", "zero_stage", "fp16", "bf16", "deepspeed",
                "deepspeed_config", "ds_pipeline_enabled", "normalization",
                "checkpoint_activations", "deepspeed_activation_checkpointing", "cpu_optimizer",
                "micro_batch_size", "global_batch_size", "gradient_accumulation_fusion",
                "train_iters", "log_interval", "timing_log_level", "eval_iters")
        results[case["id"]] = {"ok": True, "args": {k: getattr(args, k, None) for k in keys}}
    except BaseException as exc:  # argparse exits, upstream asserts
        results[case["id"]] = {"ok": False, "error": repr(exc), "output": out.getvalue()[-3000:]}
print("RESULTS " + json.dumps(results))
"""

PATHS = PLACEHOLDER_PATHS


def _specs() -> dict[str, RunSpec]:
    specs = {}
    for model in load_models():
        for name, strategy in load_strategies().items():
            world = max(2, strategy.tp * strategy.pp)
            hosts = parse_hostfile_text("".join(f"n{i} slots=1\n" for i in range(world)), "hf")
            for device in ("cpu", "cuda"):
                specs[f"{model}-{name}-{device}"] = resolve_spec(
                    model, name, hosts, device=device, launcher="pdsh", paths=PATHS
                )
    return specs


SPECS = _specs()


def _upstream_dir() -> Path | None:
    try:
        from launchers.config.upstream import check_upstream
    except ImportError:  # the setup module is optional for this test
        return None
    status = check_upstream()
    return status.path if status.present else None


@pytest.fixture(scope="module")
def upstream_results() -> dict[str, Any]:
    upstream = _upstream_dir()
    if upstream is None:
        pytest.skip("upstream Megatron-DeepSpeed not found: run `make setup`")
    if importlib.util.find_spec("deepspeed") is None:
        pytest.skip("deepspeed is not installed in this environment")
    cases = []
    for case_id, spec in SPECS.items():
        argv = launcher_command(spec, RUN_DIR)
        cases.append(
            {"id": case_id, "world_size": spec.world_size, "argv": argv[script_index(argv) + 1 :]}
        )
    env = os.environ | {"UPSTREAM_DIR": str(upstream), "DS_ACCELERATOR": "cpu"}
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        env=env,
        cwd=upstream,
        timeout=600,
    )
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULTS ")), None)
    assert line is not None, f"driver failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return json.loads(line.removeprefix("RESULTS "))


@pytest.mark.parametrize("case_id", list(SPECS), ids=list(SPECS))
def test_upstream_accepts_generated_args(upstream_results: dict[str, Any], case_id: str) -> None:
    spec = SPECS[case_id]
    result = upstream_results[case_id]
    assert result["ok"], f"{result['error']}\n{result['output']}"
    args = result["args"]
    s, m = spec.strategy, spec.model
    assert args["tensor_model_parallel_size"] == s.tp
    assert args["pipeline_model_parallel_size"] == s.pp
    assert args["data_parallel_size"] == spec.dp
    assert args["zero_stage"] == s.zero_stage
    assert args["ds_pipeline_enabled"] == (s.pp > 1)
    assert (args["fp16"], args["bf16"]) == (m.precision == "fp16", m.precision == "bf16")
    assert args["deepspeed"] and args["deepspeed_config"] == f"{RUN_DIR}/ds_config.json"
    assert args["micro_batch_size"] == m.micro_batch_size
    assert args["global_batch_size"] == m.global_batch_size
    assert args["checkpoint_activations"] == spec.training.activation_checkpointing
    assert args["cpu_optimizer"] == (s.offload != "none")
    assert args["gradient_accumulation_fusion"] == (spec.device == "cuda")
    expected_norm = "rmsnorm" if spec.device == "cpu" and s.pp > 1 else "layernorm"
    assert args["normalization"] == expected_norm
    assert (args["train_iters"], args["log_interval"]) == (
        spec.training.train_iters,
        spec.training.log_interval,
    )
    assert (args["timing_log_level"], args["eval_iters"]) == (2, 0)
