"""Upstream's fused masked-softmax kernels against the CUDA toolkit that would compile them.

The pinned upstream (``f4157bea``) compiles three softmax extensions on rank 0 at start-up
(``megatron/initialize.py:149-157`` calls ``fused_kernels.load``), all of them under ``if
args.masked_softmax_fusion:`` (``megatron/fused_kernels/__init__.py:74``), and always with
``-gencode arch=compute_70,code=sm_70`` (``:52``). CUDA 13 dropped sm 7.0 (Volta): its nvcc stops
with ``nvcc fatal : Unsupported gpu architecture 'compute_70'`` and every run fails before its
first iteration. Upstream's own switch, ``--no-masked-softmax-fusion``
(``megatron/arguments.py:899-903``), builds none of them; the attention softmax then runs as
PyTorch's unfused scale, mask and softmax (``FusedScaleMaskSoftmax.forward_torch_softmax``): more
kernels and a full score tensor written and read between them, so slower attention and more
activation memory per layer. The resolver turns the fusion off where the toolkit is CUDA 13 or
newer and records why; ``--set masked_softmax_fusion=true|false`` forces either way.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from launchers.config import probe as node_probe
from launchers.config.gpu import parse_cuda_version, parse_nvcc_release
from launchers.config.spec import Adjustment, RunSpec

KEY = "masked_softmax_fusion"
"""The ``--set`` key and the adjustment's key."""

FIRST_CUDA_WITHOUT_SM70 = 13
"""CUDA major version whose nvcc rejects ``compute_70`` (CUDA 13.0 removed sm 7.0)."""


@dataclass(frozen=True)
class CudaToolkit:
    """The CUDA version that would compile upstream's kernels, and where it was read."""

    version: tuple[int, int]
    """(major, minor)."""
    source: str
    """Where it came from: ``nvcc 13.0 (/usr/local/cuda/bin/nvcc)`` or torch's build version."""


def find_nvcc(environ: Mapping[str, str]) -> str | None:
    """The nvcc torch's ``cpp_extension`` would use: ``$CUDA_HOME``/``$CUDA_PATH``, else the one
    on ``PATH``, else ``/usr/local/cuda`` (its ``_find_cuda_home`` order); None if none exists."""
    home = environ.get("CUDA_HOME") or environ.get("CUDA_PATH")
    if home:
        candidate: str | None = os.path.join(home, "bin", "nvcc")
    else:
        candidate = shutil.which("nvcc", path=environ.get("PATH", "")) or "/usr/local/cuda/bin/nvcc"
    return candidate if candidate and os.access(candidate, os.X_OK) else None


def torch_cuda_of(python: str) -> str | None:
    """``torch.version.cuda`` of ``python``'s torch, read without importing torch (the probe's
    reader, run by that interpreter when it is not this one)."""
    if python == sys.executable:
        return node_probe.torch_cuda_build()
    request = {"device": "cpu", "upstream_dir": "/nonexistent", "logs": "/"}
    try:
        proc = subprocess.run(node_probe.command(python, request), capture_output=True,
                              text=True, timeout=120)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    facts = node_probe.parse_output(proc.stdout) or {}
    return facts.get("torch_cuda_build")


def compiling_toolkit(python: str, environ: Mapping[str, str] | None = None) -> CudaToolkit | None:
    """The CUDA version that compiles upstream's kernels for ``python``: ``nvcc -V`` where an nvcc
    answers, else the CUDA ``python``'s torch was built with; None when ``python`` is not on this
    machine (a dry run with another machine's paths: the doctor checks the nodes) or neither says.
    """
    if not os.access(python, os.X_OK):
        return None
    env = os.environ if environ is None else environ
    nvcc = find_nvcc(env)
    if nvcc:
        try:
            proc = subprocess.run([nvcc, "-V"], capture_output=True, text=True, timeout=60)
            release = parse_nvcc_release(proc.stdout) if proc.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired):
            release = None
        if release:
            return CudaToolkit(release, f"nvcc {release[0]}.{release[1]} ({nvcc})")
    built = parse_cuda_version(torch_cuda_of(python))
    if built:
        where = "no nvcc answered" if nvcc is None else f"{nvcc} -V gave no release"
        return CudaToolkit(built, f"torch.version.cuda {built[0]}.{built[1]} of {python} ({where})")
    return None


def softmax_adjustments(
    python: str,
    forced: bool | None,
    device: str,
    toolkit: Callable[[str], CudaToolkit | None] | None = None,
) -> list[Adjustment]:
    """The ``masked_softmax_fusion`` adjustment of a run, if any.

    ``forced``: the ``--set masked_softmax_fusion`` value (None: not given). Forced off, the run
    passes ``--no-masked-softmax-fusion`` on any device; forced on, it keeps upstream's default
    even on CUDA 13. Otherwise, on CUDA, the toolkit (``toolkit``, default
    :func:`compiling_toolkit`) decides: 13 or newer turns the fusion off.
    """
    if forced is True:
        return []
    if forced is False:
        return [Adjustment(KEY, True, False, "--set masked_softmax_fusion=false: upstream's "
                           "softmax runs unfused (--no-masked-softmax-fusion)")]  # fmt: skip
    if device != "cuda":
        return []
    found = (toolkit or compiling_toolkit)(python)
    if found is None or found.version[0] < FIRST_CUDA_WITHOUT_SM70:
        return []
    return [
        Adjustment(
            KEY,
            True,
            False,
            f"the CUDA toolkit is {found.source}: upstream's fused softmax kernels "
            "(megatron/fused_kernels/__init__.py:52) always pass -gencode arch=compute_70, "
            "which CUDA 13 dropped (nvcc fatal: Unsupported gpu architecture 'compute_70'), so "
            "the run passes --no-masked-softmax-fusion; attention's scale, mask and softmax then "
            "run unfused in PyTorch (more kernels, the score tensor written and read between "
            "them: slower attention, more activation memory). --set masked_softmax_fusion=true "
            "keeps the fusion",
        )
    ]


def masked_softmax_fusion(spec: RunSpec) -> bool:
    """Whether the run keeps upstream's fused masked softmax (no adjustment turned it off)."""
    return not any(a.key == KEY for a in spec.adjustments)
