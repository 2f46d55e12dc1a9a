"""Tests of analysis.parse.reader against the real lab logs and realistic snippets of other formats.

Expected values were read by hand from the log text (line numbers with ``grep -n``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import LAB_LOGS

from analysis.parse import reader
from analysis.parse.lines import demux_tagged
from analysis.parse.reader import merge_runs, parse_file, parse_text, strip_prefix

REPO = Path(__file__).parents[1]


pytestmark = pytest.mark.usefixtures("strict_parse")


def _one(name: str):
    runs = parse_file(LAB_LOGS / name)
    assert len(runs) == 1, [r.problems for r in runs]
    return runs[0]


# -- real logs --------------------------------------------------------------------------------


def test_dp2_values_checked_by_hand():
    run = _one("dp2.log")
    assert run.status == "completed" and run.failure is None
    assert [it.iteration for it in run.iterations] == [5, 10, 15, 20, 25, 30]
    it5, it30 = run.iterations[0], run.iterations[-1]
    assert it5.elapsed_ms == 201.6
    assert it5.lm_loss == pytest.approx(5.866232)
    assert it5.samples_per_s == 39.677 and it5.tflops == 0.01
    assert it5.tokens_per_gpu_per_s == 2539.303
    assert it5.global_batch_size == 8 and it5.consumed_samples == 40
    assert it5.skipped == 0 and it5.nan == 0 and it5.learning_rate == 9.747e-4
    assert it5.train_iters == 30
    assert it30.lm_loss == pytest.approx(3.488154) and it30.elapsed_ms == 214.0
    megatron_mem = [m for m in run.memory if m.kind == "megatron"]
    assert len(megatron_mem) == 1
    assert megatron_mem[0].rank == 0 and megatron_mem[0].after_iteration == 5
    assert megatron_mem[0].max_allocated_mb == 505.13671875
    assert [m.kind for m in run.memory] == ["megatron"]
    see = [m for m in run.memory_other if m.kind == "see_memory_usage"]
    assert see and see[0].allocated_mb == pytest.approx(0.43 * 1024)
    ds = [t for t in run.timers if t.source == "deepspeed"]
    assert len(ds) == 60  # two groups (microstep and global) per step, 30 steps
    assert ds[0].values_ms["fwd_microstep"] == 143.20 and ds[0].rank == 0
    assert ds[0].iteration == 1 and ds[-1].iteration == 30
    assert ds[1].values_ms == {
        "fwd": 143.21,
        "bwd": 93.31,
        "bwd_inner": 77.85,
        "bwd_allreduce": 15.34,
        "step": 8.08,
    }
    meg = [t for t in run.timers if t.source == "megatron"]
    assert meg[0].iteration is None  # set-up timers before training
    assert meg[0].values_ms["model-and-optimizer-setup"] == (630.34, 631.46)
    assert meg[1].iteration == 5
    assert meg[1].values_ms == {
        "forward-backward": (188.85, 189.42),
        "batch-generator": (6.96, 7.02),
        "optimizer": (8.24, 9.94),
    }
    c = run.config
    assert (c["num_layers"], c["hidden_size"], c["num_attention_heads"], c["seq_length"]) == (
        4,
        128,
        4,
        128,
    )
    assert c["data_parallel_size"] == 2 and c["world_size"] == 2 and c["zero_stage"] == 0
    assert c["tensor_model_parallel_size"] == 1 and c["pipeline_model_parallel_size"] == 1
    assert c["micro_batch_size"] == 1 and c["global_batch_size"] == 8
    assert c["num_parameters"] == 875264 and c["padded_vocab_size"] == 512
    assert c["data_path"] == ["/home/user/lab-data/tiny_text_document"]  # typed list
    assert c["lr"] == 0.001 and c["deepspeed"] is True and c["load"] is None
    assert run.versions == {
        "torch": "2.13.0+cpu",
        "deepspeed": "0.19.6",
        "megatron_git_hash": "f635b9d",
        "megatron_git_branch": "master",
    }
    assert run.problems == []


@pytest.mark.parametrize(
    ("name", "zero", "tp", "elapsed5", "loss30", "groups"),
    [
        ("tp2.log", 0, 2, 473.9, 3.464682, 2),
        ("zero1.log", 1, 1, 218.7, 3.488154, 3),
        ("zero2.log", 2, 1, 246.8, 3.488154, 3),
        ("zero3.log", 3, 1, 463.6, 3.433478, None),
    ],
    ids=["tp2", "zero1", "zero2", "zero3"],
)
def test_single_machine_logs(name, zero, tp, elapsed5, loss30, groups):
    run = _one(name)
    assert run.status == "completed"
    assert len(run.iterations) == 6
    assert run.iterations[0].elapsed_ms == elapsed5
    assert run.iterations[-1].lm_loss == pytest.approx(loss30)
    assert run.config["zero_stage"] == zero
    assert run.config["tensor_model_parallel_size"] == tp
    ds = [t for t in run.timers if t.source == "deepspeed" and t.iteration is not None]
    if groups is not None:
        assert len(ds) == 30 * groups
    assert {t.iteration for t in ds} == set(range(1, 31))


def test_zero1_optimizer_group_and_zero3_setup_block():
    z1 = _one("zero1.log")
    first = next(t for t in z1.timers if "optimizer_allgather" in t.values_ms)
    assert first.values_ms == {
        "optimizer_allgather": 6.69,
        "optimizer_gradients": 0.91,
        "optimizer_step": 6.04,
    }
    assert first.iteration == 1
    z3 = _one("zero3.log")
    init = next(t for t in z3.timers if "init_optimizer_state" in t.values_ms)
    assert init.iteration is None  # one-off set-up timer, not a step


def test_tp2_memory_of_both_ranks_and_params_not_summed():
    run = _one("tp2.log")
    mem = {m.rank: m.max_allocated_mb for m in run.memory if m.kind == "megatron"}
    assert mem == {1: 482.3203125, 0: 483.56640625}
    # per-rank counts of a TP model do not add up to the model's count: unknown, with a reason
    assert run.config["num_parameters"] is None
    assert run.config["num_parameters_by_rank"] == {"(1, 0)": 447488, "(0, 0)": 447488}
    assert any("num_parameters not derivable" in p for p in run.problems)


def test_pp2_steps_and_missing_megatron_step_timers():
    run = _one("pp2.log")
    assert run.status == "completed"
    assert [(s.step, s.loss, s.iter_ms, s.samples_per_s) for s in run.pipeline_steps] == [
        (10, 4.6757, 233.0, 34.389),
        (20, 3.8398, 203.0, 39.506),
        (30, 3.5580, 232.0, 34.413),
    ]
    assert run.iterations[0].elapsed_ms == 237.9
    assert run.iterations[0].lm_loss == pytest.approx(5.892451)
    # With PP>1 no Megatron step timer prints: only the set-up block, no DeepSpeed blocks.
    assert [list(t.values_ms) for t in run.timers] == [
        ["model-and-optimizer-setup", "train/valid/test-data-iterators-setup"]
    ]
    assert run.config["pipeline_model_parallel_size"] == 2
    mem = {m.rank: m.max_allocated_mb for m in run.memory if m.kind == "megatron"}
    assert mem == {1: 486.64453125, 0: 484.35546875}


@pytest.mark.parametrize(
    ("name", "kind", "message", "line"),
    [
        (
            "pp2_layernorm_FAIL.log",
            "exception",
            "TypeError: LayerNorm.__init__() got an unexpected keyword argument "
            "'sequence_parallel'",
            475,
        ),
        (
            "pp2_rmsnorm_wallclock_FAIL.log",
            "exception",
            "AssertionError: bwd_microstep timer has already been started",
            550,
        ),
    ],
    ids=["layernorm", "rmsnorm-wallclock"],
)
def test_failing_logs(name, kind, message, line):
    run = _one(name)
    assert run.status == "failed"
    assert (run.failure.kind, run.failure.message, run.failure.line) == (kind, message, line)
    assert run.iterations == []
    # the launcher's non-zero exit that follows is kept as a further problem, not the cause
    assert any("return code = 1" in p for p in run.problems)


def test_rmsnorm_fail_keeps_the_gloo_consequence_as_a_problem():
    run = _one("pp2_rmsnorm_wallclock_FAIL.log")
    assert any(
        p.startswith("line 588: further failure (nccl)") and "Connection closed by peer" in p
        for p in run.problems
    )
    # The same failure as a record, for the launcher's root-cause choice (no string scraping).
    further = [f for f in run.further_failures if f.line == 588]
    assert [(f.kind, "Connection closed by peer" in f.message) for f in further] == [("nccl", True)]


@pytest.mark.parametrize("strategy", ["dp2", "pp2", "zero2"])
def test_two_node_pair_and_merge(strategy):
    node0 = _one(f"2n_{strategy}_1000mbit_node0.log")
    node1 = _one(f"2n_{strategy}_1000mbit_node1.log")
    assert node0.iterations == [] and len(node1.iterations) == 6
    assert node0.status == node1.status == "completed"  # each launcher: exits successfully
    merged = merge_runs([node0, node1])
    assert merged.status == "completed" and merged.failure is None
    assert [it.iteration for it in merged.iterations] == [5, 10, 15, 20, 25, 30]
    assert merged.config["world_size"] == 2 and merged.config["num_layers"] == 4
    assert merged.sources == [str(LAB_LOGS / f"2n_{strategy}_1000mbit_node{n}.log") for n in (0, 1)]
    ds = [t for t in merged.timers if t.source in ("deepspeed", "pipeline")]
    if strategy == "pp2":
        assert [s.step for s in merged.pipeline_steps] == [10, 20, 30]
        assert ds == []
        assert merged.config["num_parameters_by_rank"] == {"(0, 0)": 477952, "(0, 1)": 478080}
        assert merged.config["num_parameters"] is None
    else:
        # node0's per-step DeepSpeed blocks get attributed once node1's iterations are known
        assert ds and all(t.iteration is not None for t in ds)
        assert ds[0].iteration == 1 and ds[-1].iteration == 30
        assert merged.config["num_parameters"] == 875264
    if strategy == "dp2":
        assert merged.iterations[0].elapsed_ms == 299.2
        assert ds[0].values_ms["fwd_microstep"] == 230.93


@pytest.mark.parametrize("strategy", ["dp2", "zero2"])
def test_node1_training_before_node0_setup_in_one_file(tmp_path, strategy):
    """pdsh can print the last rank's iteration lines before rank 0's set-up lines (its
    launcher command, argument dump, padded vocabulary): one run, nothing lost, and rank 0's
    DeepSpeed blocks attributed as for per-node files."""
    node0 = (LAB_LOGS / f"2n_{strategy}_1000mbit_node0.log").read_text().splitlines()
    node1 = (LAB_LOGS / f"2n_{strategy}_1000mbit_node1.log").read_text().splitlines()
    path = tmp_path / "pdsh.log"
    path.write_text("\n".join([f"n1: {x}" for x in node1] + [f"n0: {x}" for x in node0]) + "\n")
    runs = parse_file(path)
    assert len(runs) == 1, [r.problems for r in runs]
    run = runs[0]
    pair = merge_runs([_one(f"2n_{strategy}_1000mbit_node{n}.log") for n in (0, 1)])
    assert run.status == "completed"
    for key in ("num_layers", "padded_vocab_size", "zero_stage", "world_size", "num_parameters"):
        assert run.config[key] == pair.config[key], key
    ds = [(t.iteration, t.values_ms) for t in run.timers if t.source == "deepspeed"]
    assert ds == [(t.iteration, t.values_ms) for t in pair.timers if t.source == "deepspeed"]
    assert ds[0][0] == 1 and ds[-1][0] == 30


def test_merge_failed_part_wins():
    ok = _one("dp2.log")
    bad = _one("pp2_layernorm_FAIL.log")
    merged = merge_runs([ok, bad])
    assert merged.status == "failed" and merged.failure == bad.failure


# -- synthetic snippets of other eras and formats ---------------------------------------------

# Megatron-DeepSpeed (this upstream, megatron/training.py training_log)
MDS = (
    " iteration        5/      30 | consumed samples:           40 | consumed tokens:    "
    "     5120 | elapsed time per iteration (ms): 201.6 | learning rate: 9.747E-04 | global "
    "batch size:     8 | lm loss: 5.866232E+00 | loss scale: 1.0 | actual seqlen:   128 | "
    "number of skipped iterations:   0 | number of nan iterations:   0 | samples per second: "
    "39.677 | tokens per gpu per second (tgs): 2539.303 | TFLOPs: 0.01 |"
)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        pytest.param(
            MDS,
            {"iteration": 5, "elapsed_ms": 201.6, "lm_loss": 5.866232, "train_iters": 30},
            id="megatron-deepspeed",
        ),
        # Megatron-LM core (training.py of 2023-2024): grad norm, loss scale, TFLOP/s/GPU
        pytest.param(
            " [2024-03-01 10:00:00] iteration      100/    1000 | consumed samples:        "
            "12800 | elapsed time per iteration (ms): 512.3 | throughput per GPU (TFLOP/s/GPU):"
            " 150.2 | learning rate: 1.500000E-04 | global batch size:   128 | lm loss: "
            "7.100000E+00 | loss scale: 4096.0 | grad norm: 2.345 | number of skipped "
            "iterations:   0 | number of nan iterations:   0 |",
            {
                "iteration": 100,
                "elapsed_ms": 512.3,
                "tflops": 150.2,
                "grad_norm": 2.345,
                "loss_scale": 4096.0,
                "global_batch_size": 128,
                "lm_loss": 7.1,
            },
            id="megatron-lm-core",
        ),
        # Older Megatron printed seconds
        pytest.param(
            " iteration      200/  500000 | elapsed time per iteration (s): 1.23 | learning "
            "rate: 1.500E-04 | lm loss: 6.500000E+00 | loss scale: 65536.0 |",
            {"iteration": 200, "elapsed_ms": 1230.0, "lm_loss": 6.5, "loss_scale": 65536.0},
            id="seconds-to-ms",
        ),
        # Oldest Megatron (2019): no colons
        pytest.param(
            " iteration      100/  500000 | elapsed time per iteration (ms) 512.3 | learning "
            "rate 1.5E-04 | lm loss 7.1E+00 |",
            {"iteration": 100, "elapsed_ms": 512.3, "learning_rate": 1.5e-4, "lm_loss": 7.1},
            id="no-colons",
        ),
        pytest.param(
            " iteration       10/     100 | elapsed time per iteration (ms): 300.0 | lm-loss: "
            "4.25 |",
            {"iteration": 10, "lm_loss": 4.25, "elapsed_ms": 300.0},
            id="lm-dash-loss",
        ),
        pytest.param(
            "iteration=100 loss=2.5 elapsed_ms=123.4 tflops=88.5 samples_per_second=12.5",
            {
                "iteration": 100,
                "lm_loss": 2.5,
                "elapsed_ms": 123.4,
                "tflops": 88.5,
                "samples_per_s": 12.5,
                "train_iters": None,
            },
            id="key-value",
        ),
    ],
)
def test_iteration_line_formats(line, expected):
    run = parse_text("training ...\n" + line + "\n")[0]
    assert len(run.iterations) == 1, run.problems
    it = run.iterations[0]
    for key, value in expected.items():
        got = getattr(it, key)
        assert got == (pytest.approx(value) if isinstance(value, float) else value), key


@pytest.mark.parametrize(
    "prefix",
    [
        "node3: ",
        "10.0.0.2: ",
        "[default0]:",
        "[rank3]: ",
        "0: ",
        " 12: ",
        "gpu-a: [rank1]: ",
        "\x1b[32m",
        "[1,1]<stdout>:",
        "[12,0]<stderr>: ",
    ],
    ids=[
        "pdsh",
        "pdsh-ip",
        "torchrun-tee",
        "rank-tag",
        "srun",
        "srun-padded",
        "pdsh+rank",
        "ansi",
        "mpirun-tag",
        "mpirun-tag-stderr",
    ],
)
def test_prefixes_do_not_change_values(prefix):
    plain = parse_text("training ...\n" + MDS + "\n")[0].iterations
    prefixed = parse_text(prefix + "training ...\n" + prefix + MDS + "\n")[0].iterations
    assert [(i.iteration, i.elapsed_ms, i.lm_loss) for i in prefixed] == [
        (i.iteration, i.elapsed_ms, i.lm_loss) for i in plain
    ]


@pytest.mark.parametrize(
    ("line", "content"),
    [
        ("node1: steps: 30 loss: 3.5", "steps: 30 loss: 3.5"),
        ("steps: 30 loss: 3.5", "steps: 30 loss: 3.5"),
        ("RuntimeError: boom", "RuntimeError: boom"),
        (
            "torch.OutOfMemoryError: CUDA out of memory",
            "torch.OutOfMemoryError: CUDA out of memory",
        ),
        ("\x1b[93m [WARNING] \x1b[0m async_io", " [WARNING]  async_io"),
        ("[2026-11-22 01:30:03,047] [INFO] x", "[2026-11-22 01:30:03,047] [INFO] x"),
        (
            "[rank0]:[E1122 01:00:00 ProcessGroupNCCL.cpp:616] x",
            "[E1122 01:00:00 ProcessGroupNCCL.cpp:616] x",
        ),
        ("[1,0]<stdout>:[2026-11-22 01:30:03,047] [INFO] x", "[2026-11-22 01:30:03,047] [INFO] x"),
        ("[1,1]<stderr>:RuntimeError: boom", "RuntimeError: boom"),
        (
            "2026-11-28T10:00:00.1234Z node1:     optimizer ...: (1.5, 2.0)",
            "    optimizer ...: (1.5, 2.0)",
        ),
        ("2026-11-28 10:00:00,123 [Rank 0] time (ms) | fwd: 1", "[Rank 0] time (ms) | fwd: 1"),
        ("Nov 28 10:00:00  0:   rank  1: 3.5", "  rank  1: 3.5"),
        ("2026-11-28T10:00:00+01:00 iteration 5/ 30 |", "iteration 5/ 30 |"),
        ("00:01:05.250 node0: [Rank 0] x", "[Rank 0] x"),
        (" 12: 10:00:00 x", "10:00:00 x"),
        ("node0-1  | 2026-11-28T10:00:00.123Z node0: x", "x"),
        ("ab_node_1 | iteration 5/ 30 |", "iteration 5/ 30 |"),
        ("iteration 5/ 30  | x", "iteration 5/ 30  | x"),
        ("10.0.0.2-1  | [Rank 0] x", "[Rank 0] x"),
        (
            "26.740 | tokens per gpu per second (tgs): 1711.333 |",
            "26.740 | tokens per gpu per second (tgs): 1711.333 |",
        ),
    ],
    ids=[
        "pdsh-steps",
        "steps-content",
        "exception",
        "dotted-exception",
        "ansi",
        "timestamp",
        "rank-then-bracket",
        "mpirun-tag",
        "mpirun-tag-exception",
        "kubectl-then-pdsh",
        "iso-with-comma",
        "ts-then-srun",
        "rfc3339-offset",
        "ts-relative",
        "srun-then-content-time",
        "compose-stamp-pdsh",
        "compose-v1",
        "bar-in-content",
        "compose-digit-name",
        "wrapped-value-bar",
    ],
)
def test_strip_prefix(line, content):
    assert strip_prefix(line) == content


@pytest.mark.parametrize("collector", ["kubectl", "compose", "compose-t"])
@pytest.mark.parametrize("name", ["dp2.log", "2n_dp2_1000mbit_node1.log", "pp2.log"])
def test_collector_time_stamps_change_nothing(tmp_path, monkeypatch, name, collector):
    """A log collected with ``kubectl logs --timestamps`` (or piped through ``ts``), or with
    ``docker compose logs`` (``-t``: a stamp after the container's prefix) reads as the log
    itself, in both readers, also read in parts that cut lines: Megatron's timer names without
    the stamp or the prefix, every record."""
    plain = (LAB_LOGS / name).read_text()
    p = tmp_path / name
    want = [r.to_dict() | {"sources": []} for r in parse_text(plain, str(p))]
    stamps = [f"2026-11-28T10:{k // 60 % 60:02d}:{k % 60:02d}.{k * 7919 % 10**6}Z " for k in
              range(len(plain.splitlines()))]  # fmt: skip
    if collector != "kubectl":
        head = "trainer-1   | "
        stamps = [head + t if collector == "compose-t" else head for t in stamps]
    stamped = "".join(t + line + "\n" for t, line in zip(stamps, plain.splitlines(), strict=True))
    p.write_text(stamped)
    for got in (parse_text(stamped, str(p)), parse_file(p), parse_file(p, bulk=False)):
        assert [r.to_dict() | {"sources": []} for r in got] == want
    monkeypatch.setattr(reader, "CHUNK_BYTES", 1000)  # (lines cut between reads)
    assert [r.to_dict() | {"sources": []} for r in parse_file(p)] == want
    timers = {n for r in parse_file(p) for b in r.timers for n in b.values_ms}
    assert "forward-backward" in timers or name == "pp2.log"


def test_glued_and_interleaved_iteration_lines():
    second = MDS.replace("5/      30", "10/      30").replace("201.6", "186.6")
    text = "training ...\n" + MDS + second + "\n"
    its = parse_text(text)[0].iterations
    assert [(i.iteration, i.elapsed_ms) for i in its] == [(5, 201.6), (10, 186.6)]
    # the same iteration line printed by two ranks (interleaved nodes) is kept once
    text = "training ...\nnode0: " + MDS + "\nnode1: " + MDS + "\nnode1: " + second + "\n"
    assert [i.iteration for i in parse_text(text)[0].iterations] == [5, 10]


def test_wrapped_iteration_line_is_joined():
    cut = MDS.index("lm loss: 5.86") + len("lm loss: 5.86")
    text = "training ...\n" + MDS[:cut] + "\n" + MDS[cut:] + "\n"
    it = parse_text(text)[0].iterations[0]
    assert it.lm_loss == pytest.approx(5.866232) and it.tflops == 0.01


def test_timer_forms():
    text = "\n".join(
        [
            "training ...",
            MDS,
            # older Megatron Timers.log: one line
            "time (ms) | forward-compute: 12.30 | backward-compute: 20.10 | optimizer: 3.00",
            # Megatron `max` option
            "max time across ranks (ms):",
            "    forward-backward ...............................: 188.85",
            # older DeepSpeed names
            "[Rank 0] time (ms) | forward_microstep: 10.00 | backward_microstep: 20.00 | "
            "backward_inner_microstep: 15.00 | backward_allreduce_microstep: 5.00 | "
            "step_microstep: 1.00",
            "[Rank 0] time (ms) | forward: 10.0 | backward: 20.0 | step: 1.0",
        ]
    )
    run = parse_text(text)[0]
    meg = [t for t in run.timers if t.source == "megatron"]
    assert meg[0].values_ms == {"forward-compute": 12.3, "backward-compute": 20.1, "optimizer": 3.0}
    assert meg[1].values_ms == {"forward-backward": 188.85}
    assert all(t.iteration == 5 for t in meg)
    ds = [t for t in run.timers if t.source == "deepspeed"]
    assert list(ds[0].values_ms) == [
        "forward_microstep",
        "backward_microstep",
        "backward_inner_microstep",
        "backward_allreduce_microstep",
        "step_microstep",
    ]
    assert ds[1].values_ms == {"forward": 10.0, "backward": 20.0, "step": 1.0}
    assert ds[0].iteration == 6  # printed after iteration 5's line: the next step


def test_pipeline_timers_are_pipeline_source():
    text = "\n".join(
        [
            "using world size: 2, data-parallel-size: 1, tensor-model-parallel size: 1, "
            "pipeline-model-parallel size: 2",
            "training ...",
            "[Rank 0] time (ms) | batch_input: 1.00 | forward_microstep: 50.00 | "
            "backward_microstep: 60.00 | step_microstep: 5.00",
            "steps: 10 loss: 4.6757 iter time (s): 0.266 samples/sec: 30.105",
            "[Rank 0] time (ms) | pipe_send_output: 3.00 | pipe_send_grad: 1.00 | "
            "pipe_recv_input: 2.00 | pipe_recv_grad: 4.00",
        ]
    )
    run = parse_text(text)[0]
    assert [t.source for t in run.timers] == ["pipeline", "pipeline"]
    assert [t.iteration for t in run.timers] == [10, 10]
    assert run.pipeline_steps[0].iter_ms == 266.0


def test_memory_forms():
    text = "\n".join(
        [
            "[2024-01-01 00:00:00,000] [INFO] [timer.py:264:stop] epoch=0/micro_step=40/"
            "global_step=10, RunningAvgSamplesPerSec=34.1, CurrSamplesPerSec=35.0, "
            "MemAllocated=0.4GB, MaxMemAllocated=1.5GB",
            "MA 0.43 GB         Max_MA 0.5 GB         CA 0.43 GB         Max_CA 1 GB ",
            "[Rank 3] (after 100 iterations) memory (MB) | allocated: 1024.5 | max allocated: "
            "2048.0 | reserved: 3000.0 | max reserved: 3100.0",
        ]
    )
    run = parse_text(text)[0]
    # the GB-rounded DeepSpeed figures are kept apart from Megatron's exact reports
    mem = run.memory_other + run.memory
    assert [m.kind for m in run.memory] == ["megatron"]
    assert (mem[0].kind, mem[0].allocated_mb, mem[0].max_allocated_mb) == (
        "deepspeed",
        0.4 * 1024,
        1.5 * 1024,
    )
    assert (mem[1].kind, mem[1].max_allocated_mb, mem[1].max_reserved_mb) == (
        "see_memory_usage",
        512.0,
        1024.0,
    )
    assert (mem[2].rank, mem[2].after_iteration, mem[2].max_reserved_mb) == (3, 100, 3100.0)


def test_deepspeed_config_dump_and_engine():
    text = "\n".join(
        [
            "[2024-01-01 00:00:00,000] [INFO] [config.py:1000:print] DeepSpeedEngine "
            "configuration:",
            "[2024-01-01 00:00:00,000] [INFO] [config.py:1004:print]   gradient_accumulation_steps "
            ". 4",
            "[2024-01-01 00:00:00,000] [INFO] [config.py:1004:print]   zero_optimization_stage "
            "...... 2",
            "[2024-01-01 00:00:00,000] [INFO] [config.py:990:print_user_config]   json = {",
            '    "train_batch_size":8,',
            '    "zero_optimization":{',
            '        "stage":2',
            "    }",
            "}",
            "------------------------ arguments ------------------------",
            "  zero_stage ...................................... 1",
            "  num_layers ...................................... 24",
            "-------------------- end of arguments ---------------------",
        ]
    )
    run = parse_text(text)[0]
    assert run.ds_engine == {"gradient_accumulation_steps": 4, "zero_optimization_stage": 2}
    assert run.ds_config == {"train_batch_size": 8, "zero_optimization": {"stage": 2}}
    assert run.config["zero_stage"] == 2  # DeepSpeed's own config wins over the Megatron arg
    assert run.config["global_batch_size"] == 8 and run.config["num_layers"] == 24
    assert any("Megatron argument says 1" in p for p in run.problems)


RUN_END = MDS.replace("5/      30", "30/      30")


@pytest.mark.parametrize(
    ("tail", "status", "kind", "message"),
    [
        (
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
            "failed",
            "oom",
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        ),
        (
            "RuntimeError: [enforce fail at alloc_cpu.cpp:117] . DefaultCPUAllocator: can't "
            "allocate memory: you tried to allocate 1073741824 bytes.",
            "failed",
            "oom",
            None,
        ),
        (
            "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1269, "
            "unhandled system error",
            "failed",
            "nccl",
            None,
        ),
        (
            "[rank0]:[E1122 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective "
            "operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, Timeout(ms)=600000) ran for "
            "600010 milliseconds before timing out.",
            "failed",
            "nccl",
            None,
        ),
        (
            "RuntimeError: Gloo connectFullMesh failed with [../third_party/gloo/gloo/transport/"
            "tcp/pair.cc:144] no error",
            "failed",
            "nccl",
            None,
        ),
        ("Killed", "failed", "killed", "Killed"),
        (
            "[2024-01-01 00:00:00,000] [ERROR] [launch.py:341:sigkill_handler] ['python'] exits "
            "with return code = -9",
            "failed",
            "killed",
            "exits with return code = -9 (died of SIGKILL: Killed)",
        ),
        (  # a rank's segmentation fault, as upstream's C++ helpers died on a GPU machine
            "[2026-11-28 17:03:10,533] [ERROR] [launch.py:341:sigkill_handler] ['python'] exits "
            "with return code = -11",
            "failed",
            "other",
            "exits with return code = -11 (died of SIGSEGV: Segmentation fault)",
        ),
        (
            "slurmstepd: error: *** JOB 1234 ON node01 CANCELLED AT 2024-01-01T00:00:00 DUE TO "
            "TIME LIMIT ***",
            "failed",
            "time_limit",
            None,
        ),
        (
            "slurmstepd: error: *** STEP 1234.0 ON node01 CANCELLED AT 2024-01-01T00:00:00 ***",
            "failed",
            "cancelled",
            None,
        ),
        (
            "# run outcome: failed kind=hang reason=no output for 600 s",
            "failed",
            "hang",
            "no output for 600 s",
        ),
        (
            "# run outcome: failed kind=cancelled reason=interrupted by the user",
            "failed",
            "cancelled",
            "interrupted by the user",
        ),
    ],
    ids=[
        "cuda-oom",
        "cpu-oom",
        "nccl-error",
        "nccl-watchdog",
        "gloo",
        "killed",
        "rc-9",
        "rc-11-segfault",
        "slurm-time-limit",
        "slurm-cancelled",
        "marker-hang",
        "marker-cancelled",
    ],
)
def test_failures_mid_training(tail, status, kind, message):
    text = "training ...\n" + MDS + "\n" + tail + "\n"
    run = parse_text(text)[0]
    assert run.status == status
    assert run.failure.kind == kind and run.failure.line == 3
    if message is not None:
        assert run.failure.message == message


def test_traceback_message_is_the_exception_line_and_chains_take_the_last():
    text = "\n".join(
        [
            "training ...",
            "[rank1]: Traceback (most recent call last):",
            '[rank1]:   File "pretrain_gpt.py", line 360, in <module>',
            "[rank1]:     pretrain(",
            "[rank1]: KeyError: 'x'",
            "[rank1]: ",
            "[rank1]: During handling of the above exception, another exception occurred:",
            "[rank1]: ",
            "[rank1]: Traceback (most recent call last):",
            '[rank1]:   File "pretrain_gpt.py", line 362, in <module>',
            "[rank1]: ValueError: bad value",
        ]
    )
    run = parse_text(text)[0]
    assert (run.failure.kind, run.failure.message, run.failure.line) == (
        "exception",
        "ValueError: bad value",
        11,
    )


def test_teardown_noise_after_final_iteration_keeps_completed():
    text = "\n".join(
        [
            "training ...",
            RUN_END,
            "[W1122 destroy_process_group() was not called before program exit, which can leak "
            "resources.",
            "Traceback (most recent call last):",
            '  File "atexit.py", line 1, in <module>',
            "RuntimeError: Connection reset by peer",
            "[2024-01-01 00:00:00,000] [INFO] [launch.py:367:main] Process 1 exits successfully.",
        ]
    )
    run = parse_text(text)[0]
    assert run.status == "completed" and run.failure is None
    assert any("after the final iteration" in p and "Connection reset" in p for p in run.problems)


def test_outcome_marker_wins_over_the_final_iteration():
    text = "training ...\n" + RUN_END + "\n# run outcome: failed kind=hang reason=no exit\n"
    run = parse_text(text)[0]
    assert run.status == "failed" and run.failure.kind == "hang"


def test_interrupted_marker_is_a_cancelled_run_that_a_bare_log_reports_as_interrupted(tmp_path):
    # The launcher's own last line after Ctrl-C: read from a bare log (no run.json beside it),
    # the run is interrupted, as its run directory says, not failed.
    text = (
        "training ...\n" + MDS + "\nTraceback (most recent call last):\nKeyboardInterrupt\n"
        "# run outcome: interrupted kind=cancelled reason=interrupted by signal SIGINT\n"
    )
    run = parse_text(text)[0]
    assert run.interrupted and run.status == "failed" and run.failure.kind == "cancelled"
    assert run.failure.message == "interrupted by signal SIGINT"
    (tmp_path / "run.log").write_text(text)
    from analysis.report import build as report

    _runs, rows, _model = report.summarize(tmp_path, [])
    assert [r.status for r in rows] == ["interrupted"]
    plain = parse_text("training ...\n" + MDS + "\n# run outcome: failed kind=hang reason=x\n")
    assert not plain[0].interrupted


def test_several_runs_in_one_file():
    relaunch = (
        "[2024-01-01 00:00:00,000] [INFO] [runner.py:630:main] cmd = python -u -m "
        "deepspeed.launcher.launch pretrain_gpt.py --num-layers 2 --hidden-size 64"
    )
    text = "\n".join(["training ...", MDS, "Killed", relaunch, "training ...", RUN_END])
    runs = parse_text(text)
    assert [r.status for r in runs] == ["failed", "completed"]
    assert runs[1].config["num_layers"] == 2 and runs[1].first_line == 4
    # the iteration counter going back also starts a new run
    text = "training ...\n" + RUN_END + "\n" + MDS + "\n"
    assert [len(r.iterations) for r in parse_text(text)] == [1, 1]


def test_launcher_command_options_keep_dashes_in_their_values():
    """Only an option's name is spelled with underscores; a value keeps its dashes."""
    cmd = (
        "[2024-01-01 00:00:00,000] [INFO] [runner.py:630:main] cmd = python -u -m "
        "deepspeed.launcher.launch pretrain_gpt.py --num-layers 2 --lr=-1e-4 "
        "--data-path=/data/my-corpus_text_document --split 98,2,0 --lr-decay-style cos-x"
    )
    (run,) = parse_text("\n".join([cmd, "training ...", RUN_END]))
    assert run.config["launcher_args"] == {
        "num_layers": 2,
        "lr": -1e-4,
        "data_path": "/data/my-corpus_text_document",
        "split": "98,2,0",
        "lr_decay_style": "cos-x",
    }


@pytest.mark.parametrize(
    "text",
    ["", "\n\n", "\x00\x01\x02garbage\xff", "iteration", "| | | :", "Traceback (most recent"],
    ids=["empty", "blank", "binary", "word", "pipes", "cut-traceback"],
)
def test_never_raises_and_always_one_run(text):
    runs = parse_text(text)
    assert len(runs) == 1 and runs[0].status == "incomplete"


@pytest.mark.parametrize("size", [300_000, 3_000_000], ids=["in-one-chunk", "over-chunks"])
def test_huge_line_is_truncated_and_reported(tmp_path, size):
    p = tmp_path / "huge.log"
    p.write_text("training ...\n| " + "x" * size + "\n" + MDS + "\n")
    run = parse_file(p)[0]
    assert [i.iteration for i in run.iterations] == [5] and run.iterations[0].line == 3
    assert any("1 line(s) longer than 65536 characters were truncated" in x for x in run.problems)


def test_parse_file_equals_parse_text(tmp_path):
    text = "\n".join(["training ...", "node0: NCCL INFO noise"] * 50 + [MDS, "Killed"])
    p = tmp_path / "a.log"
    p.write_text(text)
    assert [r.to_dict() | {"sources": []} for r in parse_file(p)] == [
        r.to_dict() | {"sources": []} for r in parse_text(text, str(p))
    ]
    assert parse_file(p)[0].failure.line == 102


def test_key_value_iteration_lines_in_both_readers(tmp_path):
    """``iteration=N`` lines (no ``|``) are read by the file reader's fast path too; once a
    run's iteration lines carry ``|``, a stray ``iteration`` word is not a record (module doc),
    in the file reader and in parse_text alike; ``**kwargs)`` noise is not a keyword."""
    noise = "node0:   return func(*args, **kwargs)"
    kv = [f"iteration={i} loss=2.5 elapsed_ms={100 + i}.0" for i in range(1, 6)]
    pipe = [f" iteration {i:4d}/  10 | elapsed time per iteration (ms): 200.0 |" for i in (1, 2)]
    cases = {
        "kv.log": ["training ...", *[x for line in kv for x in (noise, line)]],
        "pipe.log": ["training ...", pipe[0], "iteration=7 loss=1.0 elapsed_ms=9.0", pipe[1]],
    }
    for name, lines in cases.items():
        path = tmp_path / name
        path.write_text("\n".join(lines) + "\n")
        from_file, from_text = parse_file(path)[0], parse_text(path.read_text(), str(path))[0]
        assert from_file.to_dict() == from_text.to_dict(), name
    kv_run = parse_file(tmp_path / "kv.log")[0]
    got = [(i.iteration, i.elapsed_ms) for i in kv_run.iterations]
    assert got == [(i, 100.0 + i) for i in range(1, 6)]
    assert [i.iteration for i in parse_file(tmp_path / "pipe.log")[0].iterations] == [1, 2]


def test_missing_file_is_a_problem_not_an_exception(tmp_path):
    runs = parse_file(tmp_path / "nope.log")
    assert runs[0].status == "incomplete" and "cannot read" in runs[0].problems[0]


def test_cli_json_contract(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "analysis.parse",
            str(LAB_LOGS / "dp2.log"),
            str(tmp_path / "x.log"),
            "--json",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    doc = json.loads(out.stdout)
    assert [e["path"] for e in doc["logs"]] == [str(LAB_LOGS / "dp2.log"), str(tmp_path / "x.log")]
    run = doc["logs"][0]["runs"][0]
    assert run["status"] == "completed" and run["failure"] is None
    assert set(run["iterations"][0]) >= {
        "iteration",
        "elapsed_ms",
        "samples_per_s",
        "tflops",
        "lm_loss",
        "loss_scale",
        "grad_norm",
        "skipped",
        "nan",
        "global_batch_size",
    }
    assert set(run["memory"][0]) >= {
        "rank",
        "allocated_mb",
        "max_allocated_mb",
        "reserved_mb",
        "max_reserved_mb",
    }
    meg = next(t for t in run["timers"] if t["iteration"] == 5 and t["source"] == "megatron")
    assert meg["values_ms"]["forward-backward"] == [188.85, 189.42]
    assert "cannot read" in doc["logs"][1]["runs"][0]["problems"][0]
    human = subprocess.run(
        [sys.executable, "-m", "analysis.parse", str(LAB_LOGS / "pp2_layernorm_FAIL.log")],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "failed" in human.stdout and "exception at line 475" in human.stdout


@pytest.mark.parametrize(
    ("code", "kind"),
    [(255, "killed"), (137, "killed"), (2, "other")],
    ids=["lost", "sigkill", "rc2"],
)
def test_pdsh_ssh_exit_names_the_lost_node(tmp_path, code, kind):
    # pdsh's own line when a node's launcher dies (seen in lab runs with a killed node).
    text = (
        " iteration        2/      10 | consumed samples:           16 | elapsed time per "
        "iteration (ms): 201.6 | lm loss: 5.866232E+00 |\n"
        + "training noise line\n" * 50
        + f"pdsh@vm: 10.200.49.2: ssh exited with exit code {code}\n"
    )
    path = tmp_path / "launcher.log"
    path.write_text(text)
    for run in (parse_text(text)[0], parse_file(path)[0]):
        assert run.status == "failed"
        assert run.failure is not None and run.failure.kind == kind
        assert run.failure.message.startswith(f"10.200.49.2: ssh exited with exit code {code}")
        assert run.failure.line == 52


# -- tracebacks printed as Python lists, hard-wrapped records ----------------------------------

LIST_TB = (
    "['Traceback (most recent call last):\\n', '  File \"pretrain_gpt.py\", line 356, in "
    "<module>\\n    pretrain(train_valid_test_datasets_provider,\\n', 'RuntimeError: CUDA error: "
    "an illegal memory access was encountered\\n']"
)


@pytest.mark.parametrize(
    "lines",
    [
        ["WARNING:megatron.core.utils:" + LIST_TB],
        ["WARNING:megatron.core.utils:", LIST_TB],
        ["node1: WARNING:megatron.core.utils:" + LIST_TB[:90], "node1: " + LIST_TB[90:]],
    ],
    ids=["one-line", "next-line", "wrapped-prefixed"],
)
def test_list_repr_traceback_is_a_failure(lines):
    """``logger.warning(traceback.format_exception(...))`` prints the traceback as a list: the
    run failed, with the last exception of the list as its message."""
    run = parse_text("\n".join(["training ...", MDS, *lines]) + "\n")[0]
    assert run.status == "failed"
    assert run.failure.kind == "exception"
    assert run.failure.message == (
        "RuntimeError: CUDA error: an illegal memory access was encountered"
    )


def test_record_wrapped_over_several_lines_keeps_every_value():
    """A record cut at a fixed width over three lines (every line but the last of one width),
    and one word-wrapped with its timers glued on: all values are read."""

    def values(text):
        its = parse_text("training ...\n" + text + "\n")[0].iterations
        return [(i.iteration, i.elapsed_ms, i.lm_loss, i.samples_per_s, i.tflops) for i in its]

    width = 60
    cut = [MDS[i : i + width] for i in range(0, len(MDS), width)]
    assert len(cut) >= 3
    assert values("\n".join(cut)) == values(MDS)
    words = (MDS.rstrip(" |") + " | time (ms) | forward-compute: 12.30 | optimizer: 3.00").split(
        " "
    )
    lines, line = [], ""
    for word in words:
        if len(line) + len(word) + 1 > 70:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    lines.append(line)
    run = parse_text("\n".join(["training ...", *lines]) + "\n")[0]
    assert run.iterations[0].lm_loss == pytest.approx(5.866232) and run.iterations[0].tflops == 0.01
    assert [t.values_ms for t in run.timers] == [{"forward-compute": 12.3, "optimizer": 3.0}]


def _mpirun_tagged(lines_by_rank: dict[int, list[str]], cut: int) -> str:
    """What ``mpirun --tag-output`` writes: every write of a rank tagged, not every line. Each
    line is written as two chunks (text, then its newline: ``python -u``'s print), and rank 1's
    line is cut once more at ``cut`` with rank 0's chunks in between."""
    tag = "[1,{}]<stdout>:".format
    out = ["# started 2026-11-23T18:43:42+00:00: bash launch.sh\n"]
    zero, one = lines_by_rank[0], lines_by_rank[1]
    for i, line in enumerate(one):
        head, tail = line[:cut], line[cut:]
        out.append(tag(1) + head)  # no newline: the next chunk continues the physical line
        if i < len(zero):
            out.append(tag(0) + zero[i])
            out.append(tag(0) + "\n")  # rank 0's line ends here
        out.append(tag(1) + tail)
        out.append(tag(1) + "\n")
    return "".join(out)


@pytest.mark.parametrize("cut", [5, 100, 200], ids=["in-iteration", "in-elapsed", "in-loss"])
def test_mpirun_tagged_chunks_are_put_back_into_lines(tmp_path: Path, cut: int) -> None:
    second = MDS.replace("5/      30", "10/      30").replace("201.6", "186.6")
    text = _mpirun_tagged({0: ["training ...", "[Rank 0] step"], 1: [MDS, second]}, cut=cut)
    assert text.count("]<stdout>:") == 10 and "[1,0]<stdout>:training ...[1,0]<stdout>:\n" in text
    log = tmp_path / "launcher.log"
    log.write_text(text)
    for run in (parse_text(text)[0], parse_file(log)[0]):
        assert [(i.iteration, i.elapsed_ms, i.lm_loss) for i in run.iterations] == [
            (5, 201.6, 5.866232),
            (10, 186.6, 5.866232),
        ]
    assert [strip_prefix(line) for line in demux_tagged(text.splitlines(keepends=True))] == [
        "# started 2026-11-23T18:43:42+00:00: bash launch.sh\n", "training ...",
        MDS, "[Rank 0] step", second,
    ]  # fmt: skip


def test_demux_tagged_flushes_what_never_ended() -> None:
    assert list(demux_tagged(["[1,0]<stdout>:no newline yet[1,1]<stdout>:done\n"])) == [
        "[1,1]<stdout>:done",
        "[1,0]<stdout>:no newline yet",
    ]
    assert list(demux_tagged(["plain line\n", "[rank0]: not mpirun\n"])) == [
        "plain line\n",
        "[rank0]: not mpirun\n",
    ]


def test_world_size_line_that_starts_a_run_belongs_to_the_new_run() -> None:
    """A relaunch in the same file whose first line is ``using world size``: the new run gets
    its own sizes, the first run keeps its own."""
    it = (
        " iteration {i}/      2 | consumed samples: {s} | elapsed time per iteration (ms): 100.0 |"
        " global batch size: 8 | lm loss: 1.0E+01 | number of skipped iterations: 0 |\n"
    )
    world = (
        "using world size: {w}, data-parallel-size: {w}, tensor-model-parallel size: 1, "
        "pipeline-model-parallel size: 1\n"
    )
    one = world.format(w=2) + it.format(i=1, s=8) + it.format(i=2, s=16)
    two = world.format(w=4) + it.format(i=1, s=8) + it.format(i=2, s=16)
    runs = parse_text(one + two)
    assert [r.config.get("world_size") for r in runs] == [2, 4]
    assert [r.config.get("data_parallel_size") for r in runs] == [2, 4]
    assert [len(r.iterations) for r in runs] == [2, 2]
