"""Dense peak TFLOP/s per GPU model and dtype, and matching GPU names to models (for MFU).

MFU (model FLOPs utilisation) = achieved TFLOP/s per GPU / the GPU's dense peak for the run's
dtype. Every figure below is the vendor's *dense* figure: NVIDIA datasheets print the 2:4
structured-sparsity figure first (H100 SXM bf16 "1,979 teraFLOPS*", the footnote says "with
sparsity"); the dense one is half of it and is the only one used here (Megatron-LM issues 1565
and 1276 were the sparse 1979 used for an H100 SXM).

Dtype rule (:func:`peak_dtype`): bf16 and fp16 runs use the tensor-core (matrix-core) figure
with FP32 accumulate (what mixed-precision training does; GeForce cards run FP32-accumulate
at half their FP16-accumulate rate, and the table holds the FP32-accumulate one). An fp32 run
uses the fp32 figure *without* tensor cores on NVIDIA: PyTorch leaves
``torch.backends.cuda.matmul.allow_tf32`` off by default (since 1.12) and upstream does not
turn it on, so fp32 matmuls do not use TF32; a run that states ``tf32`` gets the TF32 figure.
On AMD Instinct, fp32 GEMMs run on the matrix cores (rocBLAS/hipBLASLt MFMA), so fp32 there is
the "FP32 matrix" figure, and the label says so. A dtype the vendor gives no figure for (bf16
on a V100, tf32 or fp8 on an A100) has no peak, and the reason says so.

Names: ``nvidia-smi --query-gpu=name`` and ``torch.cuda.get_device_name`` print the same
product names (``NVIDIA H100 80GB HBM3``, ``NVIDIA A100-SXM4-80GB``, ``Tesla V100-SXM2-32GB``,
``AMD Instinct MI300X``); :func:`match_gpu` maps them to a model of :data:`GPUS`, or says why
not (never a guess: an ``NVIDIA H100`` with neither SXM/HBM3 nor PCIe/NVL in its name is not
matched, the two differ by 30%).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8")
"""Dtypes the table knows (keys of :attr:`GpuModel.peaks`)."""


@dataclass(frozen=True)
class GpuModel:
    """One GPU model and its dense peak TFLOP/s per dtype, from the vendor's datasheet."""

    name: str
    """Model name as the report prints it (``H100 SXM``)."""
    peaks: dict[str, float]
    """Dtype -> dense peak TFLOP/s (no sparsity); a dtype not listed has no vendor figure."""
    source: str
    """The vendor document the figures come from."""
    patterns: tuple[str, ...] = ()
    """Regular expressions (case-insensitive, searched in the device name) that identify it."""
    fp32_label: str = "fp32"
    """How the fp32 figure is labelled (``fp32 matrix`` where fp32 GEMMs use matrix cores)."""
    memory_gib: tuple[float, ...] = field(default=())
    """Memory sizes the model ships with, GiB (tells A100 40 GB from 80 GB by memory.total)."""


_A100 = {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0}
# NVIDIA A100 Tensor Core GPU datasheet (2021): FP32 19.5, TF32 156 | 312*, BF16 312 | 624*,
# FP16 312 | 624* (* with sparsity); the same for 40 GB and 80 GB, SXM and PCIe.
_H100_SXM = {"fp32": 67.0, "tf32": 494.5, "fp16": 989.0, "bf16": 989.0, "fp8": 1979.0}
# NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column: FP32 67, TF32 989*, BF16 1,979*,
# FP16 1,979*, FP8 3,958* teraFLOPS (* with sparsity: dense is half); the NVIDIA H100 Tensor
# Core GPU Architecture whitepaper tabulates the dense BF16/FP16 figure as 989.4 (989 here).

GPUS: tuple[GpuModel, ...] = (
    GpuModel(
        "V100 SXM2",
        {"fp32": 15.7, "fp16": 125.0},
        "NVIDIA Tesla V100 GPU Accelerator datasheet (2020), V100 SXM2: single precision 15.7, "
        "tensor performance 125 TFLOPS (no bf16, tf32 or fp8)",
        (r"V100 SXM",),
        memory_gib=(16, 32),
    ),
    GpuModel(
        "V100 PCIe",
        {"fp32": 14.0, "fp16": 112.0},
        "NVIDIA Tesla V100 GPU Accelerator datasheet (2020), V100 PCIe: single precision 14, "
        "tensor performance 112 TFLOPS",
        (r"V100 PCIE",),
        memory_gib=(16, 32),
    ),
    GpuModel(
        "V100S PCIe",
        {"fp32": 16.4, "fp16": 130.0},
        "NVIDIA Tesla V100S datasheet: single precision 16.4, tensor performance 130 TFLOPS",
        (r"V100S",),
        memory_gib=(32,),
    ),
    GpuModel(
        "A100 40GB",
        _A100,
        "NVIDIA A100 Tensor Core GPU datasheet (2021), A100 40GB PCIe / SXM columns",
        (r"A100.*40\s*GB",),
        memory_gib=(40,),
    ),
    GpuModel(
        "A100 80GB",
        _A100,
        "NVIDIA A100 Tensor Core GPU datasheet (2021), A100 80GB PCIe / SXM columns",
        (r"A100.*80\s*GB",),
        memory_gib=(80,),
    ),
    GpuModel(
        "H100 SXM",
        _H100_SXM,
        "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column (sparse figures halved)",
        (r"H100.*(SXM|HBM3)",),
        memory_gib=(80,),
    ),
    GpuModel(
        "H100 PCIe",
        {"fp32": 51.0, "tf32": 378.0, "fp16": 756.0, "bf16": 756.0, "fp8": 1513.0},
        "NVIDIA H100 Tensor Core GPU datasheet, H100 PCIe column: FP32 51, TF32 756*, "
        "BF16/FP16 1,513*, FP8 3,026* (* with sparsity: dense is half; whitepaper: 756 dense)",
        (r"H100.*PCIE",),
        memory_gib=(80,),
    ),
    GpuModel(
        "H100 NVL",
        {"fp32": 60.0, "tf32": 417.5, "fp16": 835.5, "bf16": 835.5, "fp8": 1670.5},
        "NVIDIA H100 Tensor Core GPU datasheet, H100 NVL column: FP32 60, TF32 835*, "
        "BF16/FP16 1,671*, FP8 3,341* (* with sparsity: dense is half)",
        (r"H100.*NVL",),
        memory_gib=(94,),
    ),
    GpuModel(
        "H200",
        _H100_SXM,
        "NVIDIA H200 Tensor Core GPU datasheet, H200 SXM column: FP32 67, TF32 989*, "
        "BF16/FP16 1,979*, FP8 3,958* (* with sparsity: dense is half)",
        (r"(?<!G)H200(?!.*NVL)",),
        memory_gib=(141,),
    ),
    GpuModel(
        "H200 NVL",
        {"fp32": 60.0, "tf32": 417.5, "fp16": 835.5, "bf16": 835.5, "fp8": 1670.5},
        "NVIDIA H200 Tensor Core GPU datasheet, H200 NVL column: FP32 60, TF32 835*, "
        "BF16/FP16 1,671*, FP8 3,341* (* with sparsity: dense is half)",
        (r"(?<!G)H200.*NVL",),
        memory_gib=(141,),
    ),
    GpuModel(
        "GH200",
        _H100_SXM,
        "NVIDIA GH200 Grace Hopper Superchip datasheet: GPU FP32 67, TF32 989*, "
        "BF16/FP16 1,979*, FP8 3,958* (* with sparsity: dense is half)",
        (r"GH200",),
        memory_gib=(96, 144),
    ),
    GpuModel(
        "L40S",
        {"fp32": 91.6, "tf32": 183.0, "fp16": 362.05, "bf16": 362.05, "fp8": 733.0},
        "NVIDIA L40S GPU datasheet: FP32 91.6, TF32 183 | 366*, BF16/FP16 362.05 | 733*, "
        "FP8 733 | 1,466* teraFLOPS (* with sparsity)",
        (r"L40S",),
        memory_gib=(48,),
    ),
    GpuModel(
        "A10",
        {"fp32": 31.2, "tf32": 62.5, "fp16": 125.0, "bf16": 125.0},
        "NVIDIA A10 Tensor Core GPU datasheet: FP32 31.2, TF32 62.5 | 125*, "
        "BF16/FP16 125 | 250* teraFLOPS (* with sparsity)",
        (r"\bA10\b",),
        memory_gib=(24,),
    ),
    GpuModel(
        "RTX 3090",
        {"fp32": 35.6, "tf32": 35.6, "fp16": 71.0, "bf16": 71.0},
        "NVIDIA Ampere GA102 GPU Architecture whitepaper, GeForce RTX 3090: FP32 35.6, "
        "TF32 tensor 35.6, FP16/BF16 tensor with FP32 accumulate 71 (dense)",
        (r"RTX 3090(?! ?Ti)",),
        memory_gib=(24,),
    ),
    GpuModel(
        "RTX 4090",
        {"fp32": 82.6, "tf32": 82.6, "fp16": 165.2, "bf16": 165.2, "fp8": 330.3},
        "NVIDIA Ada Lovelace GPU Architecture whitepaper, GeForce RTX 4090: FP32 82.6, "
        "TF32 tensor 82.6, FP16/BF16 tensor with FP32 accumulate 165.2, FP8 with FP32 "
        "accumulate 330.3 (dense)",
        (r"RTX 4090",),
        memory_gib=(24,),
    ),
    GpuModel(
        "MI250X",
        {"fp32": 95.7, "fp16": 383.0, "bf16": 383.0},
        "AMD Instinct MI250X accelerator datasheet: FP32 matrix 95.7 (vector 47.9), "
        "FP16/BF16 383 TFLOPS (no sparsity, no tf32 or fp8)",
        (r"MI250X",),
        fp32_label="fp32 matrix",
        memory_gib=(128,),
    ),
    GpuModel(
        "MI300X",
        {"fp32": 163.4, "tf32": 653.7, "fp16": 1307.4, "bf16": 1307.4, "fp8": 2614.9},
        "AMD Instinct MI300X accelerator datasheet: FP32 matrix 163.4 (vector 81.7), "
        "TF32 653.7, FP16/BF16 1,307.4, FP8 2,614.9 TFLOPS dense (sparsity doubles them)",
        (r"MI300X",),
        fp32_label="fp32 matrix",
        memory_gib=(192,),
    ),
)
"""The dense-peak table (V100 ... MI300X); add a model with its datasheet in ``source``."""

A100 = GpuModel("A100", _A100, "NVIDIA A100 Tensor Core GPU datasheet (2021), 40GB and 80GB")
"""An A100 whose name and record do not say its memory (the peaks are the same)."""


@dataclass(frozen=True)
class Peak:
    """The denominator of an MFU: a model's dense peak for one dtype, or why there is none."""

    gpu: str | None
    """Model name (``H100 SXM``), None when the device name matched none."""
    dtype: str | None
    """Dtype the peak is for (None: the run does not say)."""
    tflops: float | None
    """Dense peak TFLOP/s per GPU, None when unknown."""
    reason: str = ""
    """Why there is no peak (empty when there is one)."""
    label: str = ""
    """``989 TFLOP/s dense bf16, H100 SXM``: what every MFU printed is out of."""
    source: str = ""
    """Where the figure comes from (datasheet, or ``--peak-tflops``)."""


def _normal(text: str) -> str:
    return re.sub(r"[\s_-]+", " ", text.strip()).upper()


def match_gpu(name: str, memory_mib: float | None = None) -> tuple[GpuModel | None, str]:
    """The model of a device name (nvidia-smi, torch, or a table name such as ``h100-sxm``),
    with the reason when none matches. ``memory_mib`` (nvidia-smi ``memory.total``) tells an
    A100 40 GB from an 80 GB when the name does not."""
    text = _normal(name)
    for gpu in GPUS:
        if text == _normal(gpu.name):
            return gpu, ""
    found = [g for g in GPUS if any(re.search(p, text, re.IGNORECASE) for p in g.patterns)]
    # (A100 40/80 GB and H100/H200 SXM share figures; the most specific pattern list wins.)
    if len(found) == 1:
        return found[0], ""
    if len(found) > 1:
        return None, f"{name!r} matches several models ({', '.join(g.name for g in found)})"
    if re.search(r"A100", text) and memory_mib:
        size = 80 if memory_mib > 60 * 1024 else 40
        return next(g for g in GPUS if g.name == f"A100 {size}GB"), ""
    if re.search(r"A100", text):
        return A100, ""  # (40 and 80 GB have the same peaks)
    if re.search(r"H100", text):
        return None, (
            f"{name!r}: H100 without SXM/HBM3, PCIe or NVL in its name (dense bf16 989 vs "
            "756 vs 835.5 TFLOP/s); give --gpu 'H100 SXM' or --peak-tflops"
        )
    known = ", ".join(g.name for g in GPUS)
    return None, f"{name!r} is not in the peak table (analysis.theory.hardware: {known})"


def peak_dtype(precision: str | None) -> str | None:
    """The table dtype of a run's precision (fp32 when its arguments have neither --bf16 nor
    --fp16, as the loader says), None when the run does not say."""
    return precision if precision in DTYPES else None


DTYPE_UNKNOWN = (
    "the run's dtype is unknown (no --bf16/--fp16 in its arguments, spec or DeepSpeed config): "
    "give --dtype"
)
"""Why a run whose precision nobody states has no peak (an fp32 guess would be 16x off)."""


def number_text(value: float) -> str:
    """``989.5`` -> ``989.5``, ``312.0`` -> ``312``."""
    return f"{value:g}"


def peak(name: str | None, precision: str | None, memory_mib: float | None = None) -> Peak:
    """The dense peak of device ``name`` for a run of ``precision`` (see :func:`peak_dtype`)."""
    dtype = peak_dtype(precision)
    if not name:
        return Peak(None, dtype, None, "GPU unknown (no GPU in run.json; give --gpu NAME)")
    gpu, why = match_gpu(name, memory_mib)
    if gpu is None:
        return Peak(None, dtype, None, why)
    if dtype is None:
        return Peak(gpu.name, None, None, DTYPE_UNKNOWN, source=gpu.source)
    value = gpu.peaks.get(dtype)
    if value is None:
        return Peak(
            gpu.name,
            dtype,
            None,
            f"{gpu.name} has no {dtype} figure in its datasheet ({gpu.source})",
            source=gpu.source,
        )
    shown = gpu.fp32_label if dtype == "fp32" else dtype
    label = f"{number_text(value)} TFLOP/s dense {shown}, {gpu.name}"
    return Peak(gpu.name, dtype, value, "", label, gpu.source)


def given_peak(tflops: float, precision: str | None, gpu: str | None = None) -> Peak:
    """A peak the user gave (``--peak-tflops``), labelled as such."""
    dtype = peak_dtype(precision)
    who = gpu or "as given"
    label = f"{number_text(tflops)} TFLOP/s{f' {dtype}' if dtype else ''} ({who}, --peak-tflops)"
    return Peak(gpu, dtype, tflops, "", label, "--peak-tflops")
