"""Upstream's GPU prerequisites: NVIDIA apex with its C++/CUDA extensions, and a CUDA toolkit.

On CUDA the pinned upstream (``f4157bea``) needs more than the torch wheel brings. Every line
below was read in that commit (``UPSTREAM_NEEDS`` holds them, the README quotes them):

- apex is imported unconditionally when DeepSpeed's accelerator is CUDA:
  ``megatron/model/__init__.py:8-10`` (``MixedFusedLayerNorm``, ``apex.normalization``'s
  ``MixedFusedRMSNorm``), ``megatron/model/fused_layer_norm.py:26`` (module level) and ``:46``
  (the ``fused_layer_norm_cuda`` extension), ``megatron/optimizer/__init__.py:4-6``
  (``apex.optimizers.FusedAdam``), ``megatron/utils.py:13-15`` and
  ``megatron/optimizer/clip_grads.py:12-14`` (``amp_C``);
- ``megatron/initialize.py:98`` compiles the fused softmax kernels on every CUDA run (rank 0 first,
  ``:149-157``), and ``megatron/fused_kernels/__init__.py:22-24`` runs ``<CUDA_HOME>/bin/nvcc -V``
  (``:104-106``) before it looks at ``--no-masked-softmax-fusion``: every GPU node needs the CUDA
  toolkit's ``nvcc`` under ``CUDA_HOME`` (torch's ``cpp_extension.CUDA_HOME``), with no switch;
- ``megatron/core/tensor_parallel/layers.py:49-53`` imports apex's
  ``fused_weight_gradient_mlp_cuda`` if it can, and ``:592-600`` raises in ``ColumnParallelLinear``
  when it cannot while gradient-accumulation fusion is on (upstream's default);
  ``megatron/arguments.py:986-990`` has the switch, ``--no-gradient-accumulation-fusion``, which
  the resolver uses (recorded as an adjustment) when the extension is missing.

NVIDIA apex is not on PyPI (the PyPI package named ``apex`` is unrelated: never install it).
``python -m launchers.config.gpu setup`` (``make setup DEVICE=cuda``) builds it from git
(``APEX_REPO``, a URL, local path or mirror) at :data:`APEX_COMMIT` with ``APEX_CPP_EXT=1
APEX_CUDA_EXT=1`` into the venv, when a CUDA toolkit of torch's CUDA version is present; otherwise
it stops and says which toolkit and how to point ``CUDA_HOME`` at it.
``python -m launchers.config.gpu needs`` lists the prerequisites; ``python -m launchers doctor``
checks
them on every node.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launchers.config import apex_ext, probe
from launchers.config.spec import Adjustment, RunSpec
from launchers.config.upstream import (
    UpstreamError,
    cache_root,
    checkout_pinned,
    run_git,
    upstream_dir,
)

APEX_DEFAULT_REPO = "https://github.com/NVIDIA/apex.git"
"""Where setup clones apex from unless ``APEX_REPO`` says otherwise."""

APEX_COMMIT = "6424da3b4faa6c8f062da4a48c424fff3f02d42d"
"""NVIDIA/apex master of 2026-07-08. The 25.09 release still passes ``-gencode
arch=compute_70`` to ``fused_weight_gradient_mlp_cuda``, which CUDA 13's nvcc no longer accepts;
commit 26bba57d removed the per-extension arch flags, and torch 2.14.1 is built with CUDA 13.0."""

APEX_EXTENSIONS: dict[str, str] = {
    "amp_C": "megatron/utils.py:15, megatron/optimizer/clip_grads.py:14 (import amp_C)",
    "fused_layer_norm_cuda": "megatron/model/fused_layer_norm.py:46 (MixedFusedLayerNorm)",
    "fused_weight_gradient_mlp_cuda": (
        "megatron/core/tensor_parallel/layers.py:592 (ColumnParallelLinear with gradient "
        "accumulation fusion)"
    ),
}
"""apex's compiled extensions upstream imports on CUDA, with the line that needs each."""

WGRAD_EXTENSION = "fused_weight_gradient_mlp_cuda"
"""The one extension upstream has a switch for (``--no-gradient-accumulation-fusion``)."""


@dataclass(frozen=True)
class UpstreamNeed:
    """One GPU prerequisite of the pinned upstream and the line that imposes it."""

    what: str
    """The prerequisite."""
    where: str
    """File and line in upstream ``f4157bea``."""
    switch: str
    """Upstream's option that avoids it, or an empty string when there is none."""


UPSTREAM_NEEDS: tuple[UpstreamNeed, ...] = (
    UpstreamNeed(
        "apex.normalization (MixedFusedRMSNorm; MixedFusedLayerNorm imports "
        "apex.normalization.fused_layer_norm at module level)",
        "megatron/model/__init__.py:8-10, megatron/model/fused_layer_norm.py:26",
        "",
    ),
    UpstreamNeed(
        "apex extension fused_layer_norm_cuda", "megatron/model/fused_layer_norm.py:46", ""
    ),
    UpstreamNeed("apex.optimizers.FusedAdam", "megatron/optimizer/__init__.py:4-6", ""),
    UpstreamNeed(
        "apex.multi_tensor_apply and the amp_C extension",
        "megatron/utils.py:13-15, megatron/optimizer/clip_grads.py:12-14",
        "",
    ),
    UpstreamNeed(
        "nvcc under CUDA_HOME (fused softmax kernels compiled on every CUDA run)",
        "megatron/initialize.py:98,149-157, megatron/fused_kernels/__init__.py:22-24,104-106",
        "",
    ),
    UpstreamNeed(
        "apex extension fused_weight_gradient_mlp_cuda",
        "megatron/core/tensor_parallel/layers.py:49-53,592-600",
        "--no-gradient-accumulation-fusion (megatron/arguments.py:986-990)",
    ),
)
"""What the pinned upstream needs on CUDA beyond the torch wheel (README's GPU section)."""


class GpuSetupError(RuntimeError):
    """A GPU prerequisite is missing or cannot be built; the message says what to do."""


# --- the CUDA toolkit and apex, as a node's probe reports them ----------------------------------


_RELEASE = re.compile(r"release (\d+)\.(\d+)")


def parse_nvcc_release(text: str | None) -> tuple[int, int] | None:
    """``(13, 0)`` from ``nvcc -V`` output ('Cuda compilation tools, release 13.0, V13.0.88')."""
    match = _RELEASE.search(text or "")
    return (int(match[1]), int(match[2])) if match else None


def parse_cuda_version(text: str | None) -> tuple[int, int] | None:
    """``(13, 0)`` from torch's ``torch.version.cuda`` ('13.0'); None for a CPU build."""
    if not text:
        return None
    parts = str(text).split(".")
    try:
        return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        return None


def toolkit_hint(torch_cuda: tuple[int, int]) -> str:
    """How to provide the toolkit torch needs."""
    major, minor = torch_cuda
    return (
        f"install the CUDA {major}.{minor} toolkit (nvcc and headers, e.g. NVIDIA's "
        f"cuda-toolkit-{major}-{minor} package) and point CUDA_HOME at the directory holding "
        f"bin/nvcc, e.g. `export CUDA_HOME=/usr/local/cuda-{major}.{minor}`, on every node "
        "(DeepSpeed's runner does not forward CUDA_HOME: set it in the nodes' environment or a "
        "DS_ENV_FILE)"
    )


@dataclass(frozen=True)
class Toolkit:
    """A node's CUDA toolkit against its torch, from the probe's ``cuda`` facts."""

    torch_version: str
    """``torch.__version__``."""
    torch_cuda: tuple[int, int] | None
    """CUDA version torch was built with (None: a CPU build)."""
    cuda_home: str | None
    """``torch.utils.cpp_extension.CUDA_HOME``, the one upstream's fused kernels use."""
    nvcc: tuple[int, int] | None
    """Release of ``<CUDA_HOME>/bin/nvcc`` (None: absent or failing)."""
    detail: str
    """What running nvcc said (its release line, or the error)."""
    headers_missing: tuple[str, ...] = ()
    """CUDA library headers torch's ``ATen/cuda/CUDAContextLight.h`` includes, not found."""
    wheel_include: tuple[str, ...] = ()
    """Include directories of the torch wheel's NVIDIA packages that hold those headers."""
    better_home: str | None = None
    """Another toolkit directory (``/usr/local/cuda*``) that lacks fewer of those headers."""

    @classmethod
    def from_facts(cls, cuda: Mapping[str, Any], torch_cuda: str | None) -> Toolkit:
        """From a probe's ``cuda`` section and ``torch_cuda_build``."""
        output = str(cuda.get("nvcc_output") or "")
        release = parse_nvcc_release(output) if cuda.get("nvcc_rc") == 0 else None
        lines = output.strip().splitlines()
        said = next((ln for ln in lines if "release" in ln), lines[-1] if lines else "not run")
        headers = cuda.get("headers") or {}
        missing = list(headers.get("missing") or ())
        others = sorted((len(m), h) for h, m in (cuda.get("other_homes") or {}).items())
        better = others[0][1] if others and others[0][0] < len(missing) else None
        return cls(
            torch_version=str(cuda.get("torch_version") or "?"),
            torch_cuda=parse_cuda_version(torch_cuda),
            cuda_home=cuda.get("cuda_home"),
            nvcc=release,
            detail=f"{cuda.get('nvcc') or 'nvcc'}: {said}",
            headers_missing=tuple(missing),
            wheel_include=tuple(headers.get("wheel_include") or ()),
            better_home=better,
        )

    def summary(self) -> str:
        """A table cell: ``nvcc 13.0``, ``nvcc 12.4 != torch 13.0``, ``no nvcc``, ..."""
        if self.nvcc is None:
            return "no nvcc"
        found = f"nvcc {self.nvcc[0]}.{self.nvcc[1]}"
        if self.torch_cuda and self.nvcc[0] != self.torch_cuda[0]:
            return f"{found} != torch {self.torch_cuda[0]}.{self.torch_cuda[1]}"
        return f"{found}, headers missing" if self.headers_missing else found

    @property
    def problem(self) -> str:
        """Why upstream's kernels or apex cannot be built here (empty when they can)."""
        if self.torch_cuda is None:
            return (
                f"torch {self.torch_version} is a CPU build: upstream's kernels and apex's CUDA "
                "extensions need a CUDA build of torch (requirements.txt pins one)"
            )
        want = f"{self.torch_cuda[0]}.{self.torch_cuda[1]}"
        if self.cuda_home is None:
            return (
                f"no CUDA toolkit (torch finds no CUDA_HOME/CUDA_PATH, no nvcc on PATH, no "
                f"/usr/local/cuda); torch {self.torch_version} was built with CUDA {want}: "
                + toolkit_hint(self.torch_cuda)
            )
        if self.nvcc is None:
            return (
                f"CUDA_HOME={self.cuda_home} has no working bin/nvcc ({self.detail}); torch "
                f"{self.torch_version} was built with CUDA {want}: " + toolkit_hint(self.torch_cuda)
            )
        found = f"{self.nvcc[0]}.{self.nvcc[1]}"
        if self.nvcc[0] != self.torch_cuda[0]:
            return (
                f"the CUDA toolkit at CUDA_HOME={self.cuda_home} is {found}, torch "
                f"{self.torch_version} was built with CUDA {want}: torch builds no extension "
                "across major versions (cpp_extension._check_cuda_version); "
                + toolkit_hint(self.torch_cuda)
            )
        if self.headers_missing and self.better_home:
            return (
                f"CUDA_HOME={self.cuda_home} (torch's guess from nvcc on PATH) lacks "
                f"{', '.join(self.headers_missing)}, which torch's ATen/cuda/CUDAContextLight.h "
                f"includes in every CUDA extension; {self.better_home} is a fuller toolkit: "
                f"`export CUDA_HOME={self.better_home}` and rerun"
            )
        if self.headers_missing:
            where = (
                f"; the torch wheel's NVIDIA packages hold them in {self.wheel_include[0]}: "
                f"`export CPATH={self.wheel_include[0]}` (on every node, for upstream's kernels "
                "too), or install the full toolkit"
                if self.wheel_include
                else ": install the full toolkit (not only nvcc)"
            )
            return (
                f"CUDA_HOME={self.cuda_home} has nvcc {found} but not "
                f"{', '.join(self.headers_missing)}, which torch's ATen/cuda/CUDAContextLight.h "
                f"includes in every CUDA extension (upstream's fused kernels, apex's){where}"
            )
        return ""

    @property
    def apex_build_problem(self) -> str:
        """Why apex at :data:`APEX_COMMIT` would refuse to build here (empty when it would not)."""
        if self.problem or self.nvcc == self.torch_cuda:
            return self.problem
        assert self.nvcc is not None and self.torch_cuda is not None
        return (
            f"the CUDA toolkit at CUDA_HOME={self.cuda_home} is {self.nvcc[0]}.{self.nvcc[1]}, "
            f"torch was built with {self.torch_cuda[0]}.{self.torch_cuda[1]}: the major version "
            f"matches (upstream's fused kernels build), but apex {APEX_COMMIT[:8]}'s setup.py "
            "(check_cuda_torch_binary_vs_bare_metal) refuses any other version than torch's; "
            + toolkit_hint(self.torch_cuda)
        )


def apex_problems(apex: Mapping[str, str | None], need_wgrad: bool = True) -> dict[str, str]:
    """apex modules a probe could not import (``{module: error}``), those the run needs.

    ``fused_weight_gradient_mlp_cuda`` is left out when the run turned the fusion off.
    """
    return {
        name: str(error)
        for name, error in apex.items()
        if error and (need_wgrad or name != WGRAD_EXTENSION)
    }


def apex_fix(problems: Mapping[str, str], origin: str | None) -> str:
    """What to do about missing apex modules."""
    if (
        "apex.normalization" in problems
        and origin
        and "No module named 'apex'" not in str(problems["apex.normalization"])
    ):
        return (
            f"the 'apex' at {origin} is not NVIDIA apex (PyPI's 'apex' is unrelated): "
            "`pip uninstall apex`, then `make setup DEVICE=cuda`"
        )
    return "build NVIDIA apex with its C++/CUDA extensions: `make setup DEVICE=cuda` on that node"


def local_facts(python: str | None = None, device: str = "cuda") -> dict[str, Any]:
    """Run the doctor's probe on this machine with ``python`` (default: this interpreter)."""
    request = {"device": device, "upstream_dir": str(upstream_dir()), "logs": "."}
    proc = subprocess.run(
        probe.command(python or sys.executable, request),
        capture_output=True,
        text=True,
        timeout=600,
    )
    facts = probe.parse_output(proc.stdout)
    if facts is None:
        raise GpuSetupError(f"the probe failed ({proc.returncode}): {proc.stderr[-500:]}")
    return facts


# --- the resolver's adjustment ------------------------------------------------------------------


def wgrad_extension_importable(python: str) -> bool | None:
    """Whether ``python`` finds apex's ``fused_weight_gradient_mlp_cuda`` (None: cannot tell).

    Looked up without importing (``importlib.util.find_spec``): in this process when ``python`` is
    this interpreter, else in a subprocess; None when ``python`` does not exist here (a dry run
    with another machine's paths).
    """
    if python == sys.executable:
        return importlib.util.find_spec(WGRAD_EXTENSION) is not None
    if not os.access(python, os.X_OK):
        return None
    code = (
        f"import importlib.util, sys; sys.exit(importlib.util.find_spec({WGRAD_EXTENSION!r}) "
        "is None)"
    )
    try:
        proc = subprocess.run([python, "-c", code], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.returncode == 0


def cuda_adjustments(
    python: str, probe: Callable[[str], bool | None] | None = None
) -> list[Adjustment]:
    """Adjustments a CUDA run needs from this machine's environment (``resolve_spec``).

    Without apex's ``fused_weight_gradient_mlp_cuda`` upstream's ``ColumnParallelLinear`` raises
    at start-up while gradient-accumulation fusion is on (its default); upstream's own switch
    turns the fusion off. When ``python`` does not exist here (a dry run with other paths),
    nothing changes: the doctor checks every node before a run.
    """
    found = (probe or wgrad_extension_importable)(python)
    if found is not False:
        return []
    return [
        Adjustment(
            "gradient_accumulation_fusion",
            True,
            False,
            f"apex's {WGRAD_EXTENSION} extension is not importable by {python}; with the fusion "
            "on, upstream's ColumnParallelLinear raises (megatron/core/tensor_parallel/"
            "layers.py:592), so the run passes --no-gradient-accumulation-fusion (build apex "
            "with `make setup DEVICE=cuda` to keep the fusion)",
        )
    ]


def gradient_accumulation_fusion(spec: RunSpec) -> bool:
    """Whether the run keeps upstream's gradient-accumulation fusion (CUDA, not turned off)."""
    if spec.device != "cuda":
        return False
    return not any(a.key == "gradient_accumulation_fusion" for a in spec.adjustments)


def apex_repo() -> str:
    """Git URL or local path to clone apex from."""
    return os.environ.get("APEX_REPO") or APEX_DEFAULT_REPO


def apex_dir() -> Path:
    """Where setup keeps the apex source: ``$APEX_DIR`` or ``<cache>/apex``."""
    return Path(os.environ.get("APEX_DIR") or cache_root() / "apex").expanduser()


def tar_commit(archive: Path) -> str:
    """The commit id ``git archive`` recorded in ``archive``'s pax header (``git
    get-tar-commit-id``); empty when it records none."""
    with tarfile.open(archive) as tar:
        return str(tar.pax_headers.get("comment", "")).strip()


def extract_apex(archive: Path, log: Callable[[str], None] = print) -> Path:
    """apex from a source tarball of its tree (``make wheelhouse`` where the clone could not be
    bundled) into :func:`apex_dir`, after checking the commit id git recorded in it."""
    try:
        commit = tar_commit(archive)
    except (OSError, tarfile.TarError) as exc:
        raise GpuSetupError(f"APEX_REPO={archive}: not a readable tarball ({exc})") from None
    if commit != APEX_COMMIT:
        raise GpuSetupError(
            f"APEX_REPO={archive} holds apex {commit[:12] or '(no commit id recorded)'}, this "
            f"checkout pins {APEX_COMMIT[:12]}: rerun `make wheelhouse DEVICE=cuda`"
        )
    path = apex_dir()
    if (path / ".apex-commit").is_file() and (path / ".apex-commit").read_text() == commit:
        log(f"apex: reusing {path} at {commit[:12]}")
        return path
    tmp = path.parent / f"{path.name}.tmp"
    shutil.rmtree(path, ignore_errors=True)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with tarfile.open(archive) as tar:
        top = {m.name.split("/", 1)[0] for m in tar.getmembers()}
        tar.extractall(tmp, filter="data")
    if len(top) != 1:
        raise GpuSetupError(f"APEX_REPO={archive}: expected one top folder, found {sorted(top)}")
    (tmp / top.pop()).rename(path)
    tmp.rmdir()
    (path / ".apex-commit").write_text(commit)
    log(f"apex: extracted {archive.name} ({commit[:12]}, the commit id it records) into {path}")
    return path


def ensure_apex_source(log: Callable[[str], None] = print) -> Path:
    """Clone ``APEX_REPO`` at :data:`APEX_COMMIT` into :func:`apex_dir` (reused when there); a
    ``.tar.gz`` file there is a source tarball of the pinned tree (:func:`extract_apex`)."""
    if apex_repo().endswith((".tar.gz", ".tar")) and Path(apex_repo()).is_file():
        return extract_apex(Path(apex_repo()), log)
    path = apex_dir()
    head = run_git(["rev-parse", "HEAD"], cwd=path).stdout if (path / ".git").exists() else ""
    if head.strip() == APEX_COMMIT:
        log(f"apex: reusing {path} at {APEX_COMMIT[:12]}")
        return path
    hint = "Set APEX_REPO to a reachable URL or a local clone of NVIDIA/apex"
    try:
        checkout_pinned(apex_repo(), path, APEX_COMMIT, what="apex", hint=hint,
                        dir_variable="APEX_DIR", log=log)  # fmt: skip
    except UpstreamError as exc:
        raise GpuSetupError(str(exc)) from None
    log(f"apex: checked out {APEX_COMMIT[:12]} in {path}")
    return path


def build_command(source: Path) -> list[str]:
    """pip's build of apex with its C++ and CUDA extensions into this interpreter's environment.

    apex's README: ``APEX_CPP_EXT=1 APEX_CUDA_EXT=1 pip install -v --no-build-isolation .``;
    ``--no-build-isolation`` so the extensions compile against the installed torch, ``--no-deps``
    so nothing else of the pinned environment changes.
    """
    return [sys.executable, "-m", "pip", "install", "-v", "--no-build-isolation", "--no-deps",
            str(source)]  # fmt: skip


def build_environment(toolkit: Toolkit, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Variables of the apex build: the two extension switches and ``CUDA_HOME``."""
    env = dict(os.environ if base is None else base)
    env |= {"APEX_CPP_EXT": "1", "APEX_CUDA_EXT": "1"}
    if toolkit.cuda_home:
        env["CUDA_HOME"] = toolkit.cuda_home
    return env


def setup(log: Callable[[str], None] = print) -> int:
    """``make setup DEVICE=cuda``: stop with what is missing, or build apex; exit status."""
    facts = local_facts()
    cuda = facts.get("cuda") or {}
    if "error" in facts or ("error" in cuda and "torch_version" not in cuda):
        log(f"setup DEVICE=cuda stopped: {facts.get('error') or cuda.get('error')}")
        return 1
    missing = apex_problems(cuda.get("apex") or {})
    if not missing:
        log(f"apex: every module upstream imports on CUDA imports ({', '.join(APEX_EXTENSIONS)})")
        return 0
    log("apex: missing " + "; ".join(f"{k} ({v})" for k, v in missing.items()))
    toolkit = Toolkit.from_facts(cuda, facts.get("torch_cuda_build"))
    built = ".".join(map(str, toolkit.torch_cuda)) if toolkit.torch_cuda else "none (CPU build)"
    log(f"cuda: torch {toolkit.torch_version} built with CUDA {built}; "
        f"CUDA_HOME={toolkit.cuda_home} ({toolkit.detail})")  # fmt: skip
    if toolkit.apex_build_problem:
        log(f"setup DEVICE=cuda stopped: {toolkit.apex_build_problem}")
        return 1
    try:
        source = ensure_apex_source(log)
    except GpuSetupError as exc:
        log(f"setup DEVICE=cuda stopped: {exc}")
        return 1
    cmd = build_command(source)
    env = build_environment(toolkit)
    arch = env.get("TORCH_CUDA_ARCH_LIST")
    log(
        f"apex: building with APEX_CPP_EXT=1 APEX_CUDA_EXT=1 CUDA_HOME={toolkit.cuda_home}"
        + (f" TORCH_CUDA_ARCH_LIST={arch}" if arch else "")
        + f": {' '.join(cmd)}. This takes a long time; without a visible GPU apex compiles for "
        "every architecture of its list unless TORCH_CUDA_ARCH_LIST names yours (e.g. 8.0)"
    )
    res = subprocess.run(cmd, env=env, check=False)
    if res.returncode != 0:
        log(f"setup DEVICE=cuda: the apex build failed (exit {res.returncode}); output above")
        return 1
    missing = apex_problems((local_facts().get("cuda") or {}).get("apex") or {})
    if missing:
        log(
            "apex: built but not importable: " + "; ".join(f"{k} ({v})" for k, v in missing.items())
        )
        return 1
    log("apex: built; every module upstream imports on CUDA imports")
    return 0


def extension_command(source: Path, names: Sequence[str]) -> list[str]:
    """``apex_ext.py``: only ``names`` of apex's extensions, for this machine's GPU, into this
    environment's site-packages."""
    target = sysconfig.get_paths()["purelib"]
    return [sys.executable, str(Path(apex_ext.__file__)), str(source), target, *names]


def build_needed(log: Callable[[str], None] = print) -> int:
    """``make gpu-check``'s apex step: the extensions upstream imports (:data:`APEX_EXTENSIONS`)
    that do not import yet, and only those, for the sm of the GPU at hand; apex's Python part
    installed without extensions first. Exit status."""
    facts = local_facts()
    cuda = facts.get("cuda") or {}
    if "error" in facts or ("error" in cuda and "torch_version" not in cuda):
        log(f"apex: stopped: {facts.get('error') or cuda.get('error')}")
        return 1
    missing = apex_problems(cuda.get("apex") or {})
    if not missing:
        log(f"apex: every module upstream imports on CUDA imports ({', '.join(APEX_EXTENSIONS)})")
        return 0
    toolkit = Toolkit.from_facts(cuda, facts.get("torch_cuda_build"))
    if toolkit.apex_build_problem:
        log(f"apex: stopped: {toolkit.apex_build_problem}")
        return 1
    try:
        source = ensure_apex_source(log)
    except GpuSetupError as exc:
        log(f"apex: stopped: {exc}")
        return 1
    env = build_environment(toolkit)
    if any(name.startswith("apex.") for name in missing):
        plain = {k: v for k, v in env.items() if k not in ("APEX_CPP_EXT", "APEX_CUDA_EXT")}
        log(f"apex: the Python package, no extensions: {' '.join(build_command(source))}")
        if subprocess.run(build_command(source), env=plain, check=False).returncode != 0:
            log("apex: pip install of the Python package failed; output above")
            return 1
    names = [name for name in APEX_EXTENSIONS if name in missing]
    if names:
        cmd = extension_command(source, names)
        log(f"apex: {' '.join(cmd)}")
        if subprocess.run(cmd, env=env, check=False).returncode != 0:
            log("apex: the extension build failed; output above")
            return 1
    left = apex_problems((local_facts().get("cuda") or {}).get("apex") or {})
    if left:
        log("apex: still not importable: " + "; ".join(f"{k} ({v})" for k, v in left.items()))
        return 1
    log("apex: built; every module upstream imports on CUDA imports")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m launchers.config.gpu setup|build-needed|needs``."""
    ap = argparse.ArgumentParser(
        prog="python -m launchers.config.gpu", description=__doc__.split("\n")[0]
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("setup", help="build NVIDIA apex with its extensions, or say what is missing")
    sub.add_parser("needs", help="upstream's GPU prerequisites and the lines that need them")
    sub.add_parser(
        "build-needed", help="build only the apex extensions upstream needs, for this GPU's sm"
    )
    args = ap.parse_args(argv)
    if args.cmd == "needs":
        for need in UPSTREAM_NEEDS:
            switch = f"switch: {need.switch}" if need.switch else "no switch"
            print(f"- {need.what}: {need.where} ({switch})")
        return 0
    if args.cmd == "build-needed":
        return build_needed()
    return setup()


if __name__ == "__main__":
    raise SystemExit(main())
