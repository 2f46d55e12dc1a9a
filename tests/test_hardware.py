"""MFU against the dense peak table, the GPUs recorded in run.json, and CUDA tensor memory per
rank: logs in Megatron-DeepSpeed's and Megatron-Core's own line shapes, through the report."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import ClassVar

import pytest

from analysis.metrics import hardware as mfu
from analysis.report import build as report
from analysis.runs.record import from_json
from analysis.theory import hardware
from analysis.theory.formulas import flops_per_iteration
from launchers.run import execute, gpus

MODEL = {"num_layers": 32, "hidden_size": 4096, "seq_length": 4096, "vocab": 50304}
"""A 7B-class GPT (the Polaris log's shape), global batch 32 on 8 GPUs."""
GBS, WORLD = 32, 8


def args_block(precision: str, zero: int = 1, model: dict[str, int] = MODEL, micro: int = 1) -> str:
    """Megatron's argument dump (``print_args``) for ``model``, in ``precision``."""
    values = {
        "bf16": precision == "bf16",
        "fp16": precision == "fp16",
        "data_parallel_size": WORLD,
        "ffn_hidden_size": 4 * model["hidden_size"],
        "global_batch_size": GBS,
        "hidden_size": model["hidden_size"],
        "log_interval": 10,
        "max_position_embeddings": model["seq_length"],
        "micro_batch_size": micro,
        "num_attention_heads": 32,
        "num_layers": model["num_layers"],
        "pipeline_model_parallel_size": 1,
        "seq_length": model["seq_length"],
        "tensor_model_parallel_size": 1,
        "train_iters": 100,
        "world_size": WORLD,
        "zero_stage": zero,
    }
    lines = ["------------------------ arguments ------------------------"]
    lines += [f"  {k} {'.' * (48 - len(k))} {v}" for k, v in values.items()]
    lines.append("-------------------- end of arguments ---------------------")
    return "\n".join(lines)


def iteration_ms(tflops: float, m: dict[str, int] = MODEL) -> float:
    """The iteration time at which model ``m`` runs at ``tflops`` per GPU."""
    flops = flops_per_iteration(
        GBS, m["seq_length"], m["num_layers"], m["hidden_size"], m["vocab"], None, False
    )
    return flops / (tflops * 1e12 * WORLD) * 1000.0


def ds_line(i: int, ms: float, tflops: float) -> str:
    """A Megatron-DeepSpeed iteration line (argonne-lcf fork on Polaris, A100: the shape of
    tests/fixtures/external/alcf-polaris-2024-zero2-tp2.log)."""
    return (
        f"     iteration {i:8d}/     100 | consumed samples: {i * GBS:12d} | consumed tokens: "
        f"{i * GBS * 4096:12d} | elapsed time per iteration (ms): {ms:.1f} | learning rate: "
        f"3.000E-04 | global batch size:    {GBS} | lm loss: 6.119983E+00 | loss scale: 1.0 | "
        "actual seqlen:  4096 | number of skipped iterations:   0 | number of nan iterations:"
        f"   0 | samples per second: {GBS / ms * 1000:.3f} | tokens per gpu per second(tgs): "
        f"{GBS * 4096 / ms * 1000 / WORLD:.3f} | TFLOPs: {tflops:.2f} |"
    )


def core_line(i: int, ms: float, tflops: float) -> str:
    """A Megatron-Core (training.py) iteration line: ``throughput per GPU (TFLOP/s/GPU)``."""
    return (
        f" [2024-03-01 10:00:{i % 60:02d}] iteration {i:8d}/     100 | consumed samples: "
        f"{i * GBS:12d} | elapsed time per iteration (ms): {ms:.1f} | throughput per GPU "
        f"(TFLOP/s/GPU): {tflops:.1f} | learning rate: 1.500000E-04 | global batch size: "
        f"{GBS:5d} | lm loss: 7.100000E+00 | loss scale: 1.0 | grad norm: 2.345 | number of "
        "skipped iterations:   0 | number of nan iterations:   0 |"
    )


MEMORY = (
    "[Rank {rank}] (after 10 iterations) memory (MB) | allocated: {a:.9f} | max allocated: "
    "{m:.9f} | reserved: {r:.1f} | max reserved: {mr:.1f}"
)
"""Megatron's ``report_memory`` line on CUDA (the Polaris log's shape)."""


def write_log(
    path: Path,
    precision: str = "bf16",
    tflops: float = 147.4,
    dialect: str = "ds",
    memory: dict[int, float] | None = None,
    zero: int = 1,
    model: dict[str, int] = MODEL,
    micro: int = 1,
) -> Path:
    """A CUDA training log: arguments, padded vocabulary, accelerator, 10 windows of 10
    iterations (the first a slow warm-up) at ``tflops`` per GPU, and memory lines per rank."""
    line = ds_line if dialect == "ds" else core_line
    ms = iteration_ms(tflops, model)
    out = [
        "[2024-04-04 09:35:35,959] [INFO] [real_accelerator.py:191:get_accelerator] Setting "
        "ds_accelerator to cuda (auto detect)",
        args_block(precision, zero, model, micro),
        " > padded vocab (size: 50257) with 47 dummy tokens (new size: 50304)",
        line(10, ms * 2.6, tflops / 2.6),
    ]
    for rank, peak in (memory or {}).items():
        out.append(MEMORY.format(rank=rank, a=peak * 0.6, m=peak, r=peak * 1.1, mr=peak * 1.2))
    out += [line(i, ms, tflops) for i in range(20, 101, 10)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(out) + "\n")
    return path


def summary(out: Path) -> dict[str, dict]:
    runs = json.loads((out / "summary.json").read_text())["runs"]
    return {r["name"]: r for r in runs}


# -- the table -----------------------------------------------------------------------------------


def test_table_has_every_model_with_a_source_and_dense_figures():
    names = {g.name for g in hardware.GPUS}
    assert {"V100 SXM2", "A100 40GB", "A100 80GB", "H100 SXM", "H100 PCIe", "H200", "GH200",
            "L40S", "A10", "RTX 3090", "RTX 4090", "MI250X", "MI300X"} <= names  # fmt: skip
    for g in hardware.GPUS:
        assert g.source and set(g.peaks) <= set(hardware.DTYPES), g.name
    h100 = hardware.peak("NVIDIA H100 80GB HBM3", "bf16")
    assert h100.tflops == 989.0  # dense, never the sparse 1979
    assert h100.label == "989 TFLOP/s dense bf16, H100 SXM"
    assert hardware.peak("NVIDIA H100 PCIe", "fp8").tflops == 1513.0
    assert hardware.peak("AMD Instinct MI300X", "bf16").tflops == 1307.4


@pytest.mark.parametrize(
    ("name", "memory", "model"),
    [
        ("NVIDIA H100 80GB HBM3", None, "H100 SXM"),
        ("NVIDIA H100 PCIe", None, "H100 PCIe"),
        ("NVIDIA A100-SXM4-80GB", None, "A100 80GB"),
        ("NVIDIA A100-PCIE-40GB", None, "A100 40GB"),
        ("NVIDIA A100-SXM4", 81920, "A100 80GB"),
        ("Tesla V100-SXM2-32GB", None, "V100 SXM2"),
        ("NVIDIA GH200 480GB", None, "GH200"),
        ("NVIDIA H200", None, "H200"),
        ("NVIDIA A10", None, "A10"),
        ("NVIDIA GeForce RTX 4090", None, "RTX 4090"),
        ("AMD Instinct MI250X", None, "MI250X"),
        ("h100 sxm", None, "H100 SXM"),
    ],
)
def test_device_names_match_their_model(name, memory, model):
    gpu, why = hardware.match_gpu(name, memory)
    assert gpu is not None and gpu.name == model, why


@pytest.mark.parametrize("name", ["NVIDIA A10G", "NVIDIA H100", "Intel Data Center GPU Max"])
def test_unknown_or_ambiguous_names_give_no_peak_and_say_why(name):
    pk = hardware.peak(name, "bf16")
    assert pk.tflops is None and name in pk.reason


def test_dtype_rule():
    assert hardware.peak("NVIDIA A100-SXM4-80GB", "fp32").label == (
        "19.5 TFLOP/s dense fp32, A100 80GB"  # fp32 without tensor cores unless tf32 is stated
    )
    unknown = hardware.peak("NVIDIA A100-SXM4-80GB", None)  # never an fp32 guess
    assert unknown.tflops is None and unknown.reason == hardware.DTYPE_UNKNOWN
    assert hardware.peak("NVIDIA A100-SXM4-80GB", "tf32").tflops == 156.0
    assert hardware.peak("AMD Instinct MI250X", "fp32").label.endswith("fp32 matrix, MI250X")
    v100 = hardware.peak("Tesla V100-SXM2-32GB", "bf16")
    assert v100.tflops is None and "no bf16 figure" in v100.reason


# -- the acceptance case, and the GPU from --gpu -------------------------------------------------


def test_bf16_log_on_a100_80gb_at_147_4_tflops(tmp_path, capsys):
    """A bf16 Megatron-DeepSpeed log printing 147.4 TFLOPs per GPU in steady state, on an A100
    80 GB named with --gpu: MFU 147.4 / 312 = 47.24%, printed as 47.2% (47.3% would need 147.6);
    the analyzer's own TFLOP/s over the same windows agrees with the printed one."""
    write_log(tmp_path / "logs" / "a100_bf16.log")
    out = tmp_path / "report"
    assert report.main([str(tmp_path / "logs"), "--out", str(out), "--gpu",
                        "NVIDIA A100-SXM4-80GB"]) == 0  # fmt: skip
    row = summary(out)["a100_bf16"]
    assert row["gpu"] == "A100 80GB" and row["peak_tflops"] == 312.0
    assert row["precision"] == "bf16"
    assert row["tflops_printed"] == pytest.approx(147.4)
    assert row["tflops"] == pytest.approx(147.4, abs=0.01)
    assert row["mfu"] == pytest.approx(47.24, abs=0.01)
    assert row["mfu_printed"] == pytest.approx(100 * 147.4 / 312)
    text = (out / "report.md").read_text()
    assert "MFU 47.2% of 312 TFLOP/s dense bf16, A100 80GB" in text
    assert "47.2%" in capsys.readouterr().out  # the console table's MFU column


def test_megatron_core_tflops_dialect(tmp_path):
    write_log(tmp_path / "logs" / "core.log", dialect="core", tflops=400.0)
    out = tmp_path / "report"
    report.main([str(tmp_path / "logs"), "--out", str(out), "--gpu", "H100 SXM"])
    row = summary(out)["core"]
    assert row["tflops_printed"] == pytest.approx(400.0)
    assert row["mfu_printed"] == pytest.approx(100 * 400 / 989)
    assert row["mfu"] == pytest.approx(100 * 400 / 989, abs=0.01)
    assert "of 989 TFLOP/s dense bf16, H100 SXM" in (out / "report.md").read_text()


@pytest.mark.parametrize(("precision", "peak"), [("bf16", 312.0), ("fp16", 312.0), ("fp32", 19.5)])
def test_dtype_from_the_run(tmp_path, precision, peak):
    write_log(tmp_path / "logs" / "run.log", precision=precision, tflops=15.0)
    out = tmp_path / "report"
    report.main([str(tmp_path / "logs"), "--out", str(out), "--gpu", "A100 80GB"])
    row = summary(out)["run"]
    assert row["precision"] == precision  # from the log's --bf16/--fp16 (neither: fp32)
    assert row["peak_tflops"] == peak
    assert row["mfu"] == pytest.approx(100 * 15.0 / peak, abs=0.01)


def test_unknown_gpu_gives_no_mfu_and_the_reason(tmp_path):
    write_log(tmp_path / "logs" / "run.log")
    out = tmp_path / "report"
    report.main([str(tmp_path / "logs"), "--out", str(out), "--gpu", "NVIDIA A10G"])
    row = summary(out)["run"]
    assert row["mfu"] is None and row["peak_tflops"] is None and row["gpu"] is None
    assert "not in the peak table" in row["na_reasons"]["mfu"]
    assert "MFU n/a: 'NVIDIA A10G' is not in the peak table" in (out / "report.md").read_text()


def test_no_gpu_known_says_so(tmp_path):
    write_log(tmp_path / "logs" / "run.log")
    out = tmp_path / "report"
    report.main([str(tmp_path / "logs"), "--out", str(out)])
    row = summary(out)["run"]
    assert row["mfu"] is None and "give --gpu NAME" in row["na_reasons"]["mfu"]


def test_peak_tflops_given(tmp_path):
    write_log(tmp_path / "logs" / "run.log", tflops=100.0)
    out = tmp_path / "report"
    report.main([str(tmp_path / "logs"), "--out", str(out), "--peak-tflops", "200"])
    row = summary(out)["run"]
    assert row["mfu"] == pytest.approx(50.0, abs=0.01)
    assert row["peak_label"] == "200 TFLOP/s bf16 (as given, --peak-tflops)"


# -- the GPU from run.json -----------------------------------------------------------------------

SMI = "NVIDIA A100-SXM4-80GB, 81920 MiB, 550.54.15\nNVIDIA A100-SXM4-80GB, 81920 MiB, 550.54.15\n"


def test_launcher_records_the_gpus_of_every_node_on_cuda_only():
    calls = []

    def runner(argv):
        calls.append(argv)
        return (0, SMI) if argv[0] == "nvidia-smi" else (255, "ssh: connect: No route to host")

    doc = {"spec": {"device": "cuda", "cluster": {"hosts": ["localhost", "node1"]}},
           "provenance": {"torch": "2.11.0"}}  # fmt: skip
    prov = gpus.provenance_with_gpus(doc, runner)
    assert prov is not None and prov["torch"] == "2.11.0"
    assert prov["gpus"][:2] == [
        {"node": "localhost", "index": i, "name": "NVIDIA A100-SXM4-80GB",
         "memory_total_mib": 81920, "driver_version": "550.54.15"}
        for i in range(2)
    ]  # fmt: skip
    assert prov["gpus"][2] == {
        "node": "node1",
        "error": "nvidia-smi: ssh: connect: No route to host",
    }
    assert calls[1][:2] == ["ssh", "-o"] and calls[1][-3:] == gpus.QUERY
    record = from_json({"provenance": prov}, "run.json")  # the record reads it back
    assert record.provenance.gpus[0].name == "NVIDIA A100-SXM4-80GB"
    calls.clear()
    assert gpus.provenance_with_gpus({"spec": {"device": "cpu"}}, runner) is None and not calls


def test_known_gpu_from_run_json():
    record = from_json(
        {"provenance": {"gpus": [{"node": "n0", "index": 0, "name": "NVIDIA H100 80GB HBM3",
                                  "memory_total_mib": 81559, "driver_version": "580.65"}]}},
        "run.json",
    )  # fmt: skip

    class Row:  # the fields with_mfu reads, as a RunMetrics has them
        precision, device, tflops, tflops_printed = "bf16", "cuda", 405.5, 405.0
        na_reasons: ClassVar[dict[str, str]] = {}

    pk = mfu.peak_of(Row, record, mfu.HardwareGiven())
    assert pk.label == "989 TFLOP/s dense bf16, H100 SXM"
    mixed = from_json(
        {"provenance": {"gpus": [{"node": "a", "name": "NVIDIA H100 80GB HBM3"},
                                 {"node": "b", "name": "NVIDIA H100 PCIe"}]}}, "run.json"
    )  # fmt: skip
    assert "different GPUs" in mfu.peak_of(Row, mixed, mfu.HardwareGiven()).reason
    Row.device = "cpu"
    assert mfu.peak_of(Row, None, mfu.HardwareGiven()).reason == "CPU run: no GPU"
    assert mfu.peak_of(Row, None, mfu.HardwareGiven(gpu="H100 SXM")).tflops is None
    assert mfu.peak_of(Row, None, mfu.HardwareGiven(peak_tflops=2.0)).tflops == 2.0


def test_known_gpu_from_run_json_through_the_report(tmp_path):
    """A run directory whose run.json holds what the launcher recorded: the report finds its
    GPU without --gpu; the spec's precision (fp16) picks the peak's dtype."""
    run_dir = tmp_path / "logs" / "h100_fp16"
    write_log(run_dir / "launcher.log", precision="fp16", tflops=494.5)
    prov = gpus.provenance_with_gpus(
        {"spec": {"device": "cuda", "cluster": {"hosts": ["localhost"]}}},
        lambda argv: (0, "NVIDIA H100 80GB HBM3, 81559 MiB, 580.65.06\n"),
    )
    doc = {"name": "h100_fp16", "spec": {"device": "cuda", "model": {"precision": "fp16"}},
           "provenance": prov, "outcome": {"status": "completed"}}  # fmt: skip
    (run_dir / "run.json").write_text(json.dumps(doc))
    out = tmp_path / "report"
    report.main([str(tmp_path / "logs"), "--out", str(out)])
    row = summary(out)["h100_fp16"]
    assert (row["gpu"], row["peak_tflops"], row["precision"]) == ("H100 SXM", 989.0, "fp16")
    assert row["mfu"] == pytest.approx(50.0, abs=0.01)
    assert "MFU 50.0% of 989 TFLOP/s dense fp16, H100 SXM" in (out / "report.md").read_text()


# -- GPU tensor memory -----------------------------------------------------------------------

SMALL = {"num_layers": 24, "hidden_size": 2048, "seq_length": 2048, "vocab": 50304}
"""A 1.3B GPT: its Adam state fits an 80 GB GPU without ZeRO."""


def test_cuda_memory_per_rank_beside_the_model_state(tmp_path):
    """Baseline and ZeRO-1/2/3 on 8 GPUs, each printing Megatron's CUDA memory line per rank:
    the allocated and reserved peaks per rank, the analytic model state of the run's stage
    beside them, and the saving against the baseline in tensor memory."""
    logs = tmp_path / "logs"
    peaks = {"baseline": 26000.0, "zero1": 12500.0, "zero2": 9800.0, "zero3": 6100.0}
    for stage, (name, peak) in enumerate(peaks.items()):
        memory = {rank: peak - 8 * rank for rank in range(2)}  # ranks 0 and 1 print
        write_log(logs / f"{name}.log", tflops=120.0, memory=memory, zero=stage, model=SMALL)
    out = tmp_path / "report"
    report.main([str(logs), "--out", str(out), "--gpu", "A100 80GB"])
    rows = summary(out)
    base, z2 = rows["baseline"], rows["zero2"]
    assert [m["rank"] for m in z2["mem_per_rank"]] == [0, 1]
    assert z2["mem_per_rank"][1]["allocated_mb"] == pytest.approx(9792.0)
    assert z2["mem_per_rank"][0]["reserved_mb"] == pytest.approx(9800.0 * 1.2)
    assert z2["mem_per_rank"][0]["after_iteration"] == 10
    psi = z2["num_parameters"]
    assert z2["model_state_mb"] == pytest.approx((2 * psi + 14 * psi / 8) / 2**20)
    assert base["model_state_mb"] == pytest.approx(16 * psi / 2**20)
    assert z2["mem_saving_pct"] == pytest.approx(100 * (26000 - 9800) / 26000)
    text = (out / "report.md").read_text()
    section = text[text.index("## GPU: MFU and tensor memory") : text.index("## Time breakdown")]
    assert "| zero2 | zero2 | 1 | 9,792 | 11,750 | 4,706 | 5,086 |" in section
    saved = base["model_state_mb"] - z2["model_state_mb"]
    assert (
        f"- zero2: peak allocated 9,800 MiB, saves 16,200 MiB (62.3%) of tensor memory against "
        f"baseline (the model state predicts {saved:,.0f} MiB)."
    ) in section
    assert "model state per rank at DP 8, MiB: DP 20,078; ZeRO-1 6,902; ZeRO-2 4,706; " in section


H200_RUNS = Path(__file__).parent / "fixtures" / "gpu-h200"
"""Four real run directories of ``make gpu-check`` on one H200 (bf16, micro-batch 1, world size
1, upstream f4157bea, torch 2.11 + CUDA 13): small baseline completed, three large runs cut by
a 70 s limit (tensorboard/ dropped, paths renamed)."""


def test_report_on_real_h200_runs(tmp_path):
    """MFU against the H200 that run.json names, tensor memory from DeepSpeed's memory lines, and
    runs cut by their time limit shown with what they logged but kept out of every ratio."""
    out = tmp_path / "report"
    assert report.main([str(H200_RUNS), "--out", str(out)]) == 0
    rows = summary(out)
    small = rows["small-baseline"]
    assert (small["status"], small["gpu"], small["precision"]) == ("completed", "H200", "bf16")
    assert (small["micro_batch_size"], small["gas"], small["iter_ms_n"]) == (1, 8, 5)
    assert small["iter_ms_mean"] == pytest.approx(599.3, abs=0.05)  # iterations 3-12
    assert small["tflops"] == pytest.approx(3.8165, abs=1e-4)
    # Activation checkpointing on: MFU leaves the recomputed forward out (3 of 4 forward-pass
    # equivalents), HFU and Megatron's TFLOPs count it.
    assert small["tflops_model"] == pytest.approx(small["tflops"] * 3 / 4, rel=1e-12)
    assert small["mfu"] == pytest.approx(100 * small["tflops"] * 0.75 / 989.0, rel=1e-9)
    assert small["hfu"] == pytest.approx(100 * small["tflops"] / 989.0, rel=1e-9)
    assert small["peak_mem_mb"] == pytest.approx(1308.90, abs=0.01)  # max allocated, rank 0
    assert small["speedup"] == pytest.approx(1.0)
    large = rows["large-baseline"]
    assert (large["status"], large["failure_kind"], large["last_iteration"]) == (
        "failed",
        "time_limit",
        8,
    )
    assert large["iter_ms_mean"] == pytest.approx(2423.1, abs=0.05)
    assert large["hfu"] == pytest.approx(2.2088, abs=1e-4) and large["speedup"] is None
    assert large["mfu"] == pytest.approx(2.2088 * 0.75, abs=1e-4)
    zero3 = rows["large-zero3"]
    assert zero3["iter_ms_mean"] is None and zero3["mfu"] is None
    assert zero3["peak_mem_mb"] == pytest.approx(8496.28, abs=0.01)
    text = (out / "report.md").read_text()
    row = (
        "| small-baseline | H200 | 989 TFLOP/s dense bf16, H200 | 3.8 | 0.3% | 0.4% | 3.84 | 0.4% |"
    )
    assert row in text
    assert small["na_reasons"]["predicted_iter_ms"] == (
        "leave-one-out: no other completed timed run of this model and batch to predict it from"
    )
    assert (
        "- **large / 1 node, 1 rank / one machine**: no run to compare (failed runs stay out of "
        "every ratio); 2 timed before they stopped (fastest large-baseline failed: 2,423.1 "
        "ms/iteration, not in any ratio); 0 timed run(s), 3 not completed."
    ) in text
    assert small["provenance"].startswith(
        "upstream f4157bea, DeepSpeed 0.19.6, torch 2.11.0 + CUDA 13.0 from system ("
    )
    assert (
        "Python 3.12.3; 1 x NVIDIA H200 (143,771 MiB, driver 580.159.04); torch 2.11.0 is "
        in (small["provenance"])
    )
    assert f"Every run: {small['provenance']}." in text  # (the same for all four: said once)
    assert small["na_reasons"]["comm_ms"].startswith("dp = 1: the gradient all-reduce exchanges")
    # One machine, one rank: nothing calibrates a link, and the report says so, not "noise".
    assert "No time can be predicted at any of them: nothing here calibrates an inter-node " in text
    assert "| baseline | n/a | n/a |" not in text  # (no table of n/a)
    assert "within the measurement noise" not in text
    assert (
        "- zero1 vs the baseline across link rates: not predicted: the time model cannot "
        "evaluate both setups (baseline: no calibration for inter-node collectives (all_reduce "
        "gradients);"
    ) in text


def test_report_on_a_real_h200_run_from_tensorboard_alone(tmp_path, capsys):
    """The same small run without its log: times from TensorBoard's iteration-time (float32),
    and memory as TensorBoard has it, the current allocation at each logged iteration: shown as
    a lower bound of the peak, never as a peak, and kept out of the allocated - state column."""
    out = tmp_path / "report"
    assert report.main([str(H200_RUNS.parent / "gpu-h200-tensorboard"), "--out", str(out)]) == 0
    row = summary(out)["small-baseline"]
    assert (row["status"], row["gpu"], row["iter_ms_n"]) == ("completed", "H200", 5)
    assert row["iter_ms_mean"] == pytest.approx(599.2774, abs=1e-4)  # the log: 599.26
    assert row["mfu"] == pytest.approx(100 * row["tflops"] * 0.75 / 989.0, rel=1e-9)
    assert row["peak_mem_is_peak"] is False
    assert ">= 929" in capsys.readouterr().out  # the console table's peak column
    assert row["peak_mem_mb"] == pytest.approx(929.3325, abs=1e-4)  # the log's peak: 1,308.90
    assert row["na_reasons"]["peak_mem_mb"].startswith(
        "the largest current allocation in TensorBoard's mem-allocated-bytes (rank not recorded"
    )
    text = (out / "report.md").read_text()
    assert (
        "| small-baseline | baseline | not recorded | >= 929 (current) | 1,704 | 974 | n/a |"
        in text
    )
    assert "- small-baseline: no allocator peak recorded (only current allocations, as in " in text


def test_cpu_runs_have_no_gpu_section(tmp_path):
    from conftest import LAB_LOGS

    out = tmp_path / "report"
    report.build(LAB_LOGS, out)
    assert "## GPU" not in (out / "report.md").read_text()
    row = summary(out)["2n_dp2_1000mbit"]
    assert row["mfu"] is None and row["na_reasons"]["mfu"] == "CPU run: no GPU"


def test_a_batch_that_does_not_split_over_twice_the_ranks_still_gives_a_report(tmp_path):
    """8 GPUs, global batch 32, micro-batch 4: the prediction at 2 nodes (16 ranks) cannot split
    the batch; the report says so instead of failing (it used to raise ValueError)."""
    write_log(tmp_path / "logs" / "run.log", micro=4)
    out = tmp_path / "report"
    assert report.main([str(tmp_path / "logs"), "--out", str(out), "--gpu", "A100 80GB"]) == 0
    row = summary(out)["run"]
    assert row["micro_batch_size"] == 4 and row["mfu"] == pytest.approx(47.24, abs=0.01)
    text = (out / "report.md").read_text()
    assert "No crossover link rates or memory crossover at 2 nodes: global batch(32) % " in text


def test_the_executor_records_the_gpus_when_a_cuda_run_starts(tmp_path, monkeypatch):
    """execute.run on a CUDA run directory: run.json gets provenance.gpus from nvidia-smi (a
    stand-in printing an H100's line) before the launcher starts; the report reads it back."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text('#!/bin/sh\necho "NVIDIA H100 80GB HBM3, 81559 MiB, 580.65.06"\n')
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    run_dir = tmp_path / "h100"
    run_dir.mkdir()
    spec = {"launcher": "local", "device": "cuda", "cluster": {"hosts": ["localhost"]}}
    doc = {"name": "h100", "spec": spec, "outcome": {"status": "generated"}}
    (run_dir / "run.json").write_text(json.dumps(doc))
    (run_dir / "launch.sh").write_text("exit 0\n")
    execute.run(run_dir, stall_s=30, show_progress=False)
    record = json.loads((run_dir / "run.json").read_text())
    assert record["provenance"]["gpus"] == [
        {"node": "localhost", "index": 0, "name": "NVIDIA H100 80GB HBM3",
         "memory_total_mib": 81559, "driver_version": "580.65.06"}
    ]  # fmt: skip
    name, memory, _ = mfu.recorded_gpu(from_json(record, "run.json"))
    assert hardware.peak(name, "bf16", memory).label == "989 TFLOP/s dense bf16, H100 SXM"


POLARIS = Path(__file__).parent / "fixtures" / "external" / "alcf-polaris-2024-zero2-tp2.log"


def test_real_polaris_log_dtype_unknown_then_given(tmp_path):
    """The Polaris A100 log (real Megatron-DeepSpeed lines: TFLOPs printed, CUDA memory of two
    ranks) prints no argument dump: its dtype is unknown, so no MFU (an fp32 guess gave 504%);
    with --dtype bf16 the printed TFLOPs are 31.5% of the A100's 312."""
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / POLARIS.name).write_bytes(POLARIS.read_bytes())
    out = tmp_path / "report"
    report.main([str(logs), "--out", str(out), "--gpu", "NVIDIA A100-SXM4-40GB"])
    row = summary(out)[POLARIS.stem]
    assert row["device"] == "cuda" and row["precision"] is None and row["gpu"] == "A100 40GB"
    assert row["mfu_printed"] is None and row["na_reasons"]["mfu"] == hardware.DTYPE_UNKNOWN
    assert [m["reserved_mb"] for m in row["mem_per_rank"]] == [32994.0, 35824.0]
    out2 = tmp_path / "report2"
    report.main([str(logs), "--out", str(out2), "--gpu", "A100 40GB", "--dtype", "bf16"])
    row = summary(out2)[POLARIS.stem]
    assert row["peak_label"] == "312 TFLOP/s dense bf16, A100 40GB"
    assert row["mfu_printed"] == pytest.approx(100 * row["tflops_printed"] / 312)
    assert (
        "- alcf-polaris-2024-zero2-tp2: MFU n/a: no TFLOP/s for this run (model dimensions, "
        "padded vocabulary, batch or world size unknown); Megatron's printed TFLOPs give 31.5% "
        "of 312 TFLOP/s dense bf16, A100 40GB."
    ) in (out2 / "report.md").read_text()
