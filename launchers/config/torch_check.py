"""The machine's own PyTorch: ``make setup TORCH=system`` and ``make gpu-check``.

HPC sites provide PyTorch built for their driver and network (``module load pytorch``, a
container). ``make setup TORCH=system`` makes the venv on top of that interpreter
(``--system-site-packages``), installs the pins but torch and torchvision
(:func:`requirements_without_torch`: pip installs only what is missing or at another version),
then ``python -m launchers.config.torch_check check`` says what it found: torch, where it comes
from, the CUDA it was built with, against the tested range (:data:`TESTED_TORCH`,
:data:`TESTED_CUDA`). Outside it is a warning that names the versions, never a silent pass; no
torch at all stops. Runs record the same facts in run.json ``provenance`` (:func:`facts`).

Standard library only (importlib.metadata: torch is not imported), so that the machine's
interpreter runs it before any project dependency is installed.
"""

from __future__ import annotations

import re
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

NOT_PINNED_HERE = ("torch", "torchvision")
"""Requirements the machine's own PyTorch provides (never reinstalled over it)."""

TESTED_TORCH = "2.14"
"""torch release line the pins were tested with (requirements.txt: torch 2.14.1 with upstream
f4157bea and DeepSpeed 0.19.6)."""

TESTED_CUDA = "13.0"
"""CUDA of the tested torch build (the 2.14.1 wheel is cu130; apex builds with that toolkit)."""


def _name(line: str) -> str:
    return re.sub(r"[-_.]+", "-", line.split("#")[0].strip().split("==")[0].split(">=")[0]).lower()


def pinned(source: Path) -> dict[str, str]:
    """``{normalized name: version}`` of the ``name==version`` lines of a requirements file."""
    out = {}
    for line in source.read_text().splitlines():
        name, sep, version = line.split("#")[0].strip().partition("==")
        if sep:
            out[_name(name)] = version.strip()
    return out


def installed(name: str) -> str | None:
    """The version of distribution ``name`` this interpreter sees, or None."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def requirements_without_torch(source: Path, target: Path, *, leave_present: bool = False) -> Path:
    """``requirements.txt`` minus :data:`NOT_PINNED_HERE`, written to ``target``; with
    ``leave_present`` minus every pin this interpreter already has too, at whatever version
    (TORCH=system installs only what is missing; a version other than the pin is kept and warned
    of by ``check``: :func:`pin_warnings`)."""
    kept = []
    for line in source.read_text().splitlines():
        name = _name(line)
        if name in NOT_PINNED_HERE or (leave_present and name and installed(name) is not None):
            continue
        kept.append(line)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("\n".join(kept) + "\n")
    return target


def present(source: Path) -> list[str]:
    """``name version`` of each pin of ``source`` but torch's that this interpreter has."""
    found = ((name, installed(name)) for name in pinned(source) if name not in NOT_PINNED_HERE)
    return [f"{name} {version}" for name, version in found if version is not None]


def pin_warnings(pins: dict[str, str]) -> list[str]:
    """One line per pin (torch aside: :func:`warnings` says more of it) installed here at another
    version than pinned, naming both."""
    out = []
    for name, version in pins.items():
        found = installed(name)
        if name != "torch" and found is not None and found.split("+")[0] != version:
            out.append(
                f"{name} {found} is installed, requirements.txt pins {version}: TORCH=system "
                f"uses what the machine has; any difference is {name} {found}'s to check"
            )
    return out


CHAIN_PTH = "system-python-venv.pth"
"""File that :func:`chain` writes into the new venv's site-packages."""


def chain(venv: Path) -> Path | None:
    """When this interpreter (``SYSTEM_PYTHON``) is itself a venv, a ``.pth`` file in ``venv``
    naming this venv's site-packages; None when it is not a venv.

    ``python -m venv --system-site-packages`` made from a venv's interpreter sees the site-packages
    of the Python that venv was made from, not the venv's own: a site's PyTorch installed in a venv
    would be silently missing (or another torch found underneath). The ``.pth`` line comes after
    the new venv's own site-packages, so the pins installed there still come first.
    """
    if sys.prefix == sys.base_prefix:
        return None
    ours = [sysconfig.get_path(key) for key in ("purelib", "platlib")]
    paths = {"base": str(venv), "platbase": str(venv)}
    target = Path(sysconfig.get_path("purelib", vars=paths)) / CHAIN_PTH
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("".join(f"{d}\n" for d in dict.fromkeys(ours)))
    return target


def cuda_of(version: str) -> str | None:
    """``13.0`` for ``2.11.0+cu130``, None for a CPU or unsuffixed build."""
    local = version.partition("+")[2]
    if not local.startswith("cu") or not local[2:].isdigit() or len(local) < 4:
        return None
    digits = local[2:]
    return f"{digits[:-1]}.{digits[-1]}"


_CUDA_LINE = re.compile(r"^cuda\b[^=]*=\s*['\"]([0-9.]+)['\"]", re.MULTILINE)
"""``cuda: Optional[str] = '13.0'`` in ``torch/version.py``."""


def built_cuda(version_py: str) -> str | None:
    """The CUDA torch was built with, from the text of its ``torch/version.py``."""
    match = _CUDA_LINE.search(version_py)
    return match.group(1) if match else None


def facts() -> dict[str, str | None]:
    """torch's version, the CUDA of its build, and where it is installed (the venv's own, or
    the interpreter's underneath it)."""
    try:
        dist = metadata.distribution("torch")
    except metadata.PackageNotFoundError:
        return {"torch": None, "torch_cuda": None, "torch_origin": None}
    where = str(dist.locate_file(""))
    origin = "venv" if where.startswith(sys.prefix) else f"system ({where})"
    try:
        cuda = built_cuda(Path(str(dist.locate_file("torch/version.py"))).read_text())
    except OSError:
        cuda = None
    return {"torch": dist.version, "torch_cuda": cuda or cuda_of(dist.version),
            "torch_origin": origin}  # fmt: skip


def warnings(found: dict[str, str | None]) -> list[str]:
    """What differs from the tested range, each naming the versions."""
    torch = found.get("torch")
    if torch is None:
        return []
    out = []
    line = ".".join(torch.split("+")[0].split(".")[:2])
    if line != TESTED_TORCH:
        out.append(
            f"torch {torch} is outside the tested range ({TESTED_TORCH}.x, with upstream f4157bea "
            "and DeepSpeed 0.19.6): runs may work, and any difference is this torch's to check"
        )
    cuda = found.get("torch_cuda")
    if cuda is not None and cuda != TESTED_CUDA:
        out.append(
            f"torch {torch} is built with CUDA {cuda}, not the tested {TESTED_CUDA}: apex and "
            f"upstream's fused kernels need a CUDA {cuda} toolkit (nvcc) on every GPU node"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    """``check [REQUIREMENTS]``: print what was found and the warnings, torch's and each pin's
    found at another version (exit 1 without torch);
    ``requirements SOURCE TARGET``: write the pins without torch/torchvision;
    ``chain VENV``: make VENV see this interpreter's venv (:func:`chain`)."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["chain"] and len(args) == 2:
        if (pth := chain(Path(args[1]))) is not None:
            print(f"setup TORCH=system: {sys.executable} is a venv: {pth} adds its site-packages "
                  f"({sysconfig.get_path('purelib')}) under {args[1]}'s own")  # fmt: skip
        return 0
    if args[:1] == ["requirements"] and len(args) == 3:
        requirements_without_torch(Path(args[1]), Path(args[2]), leave_present=True)
        if there := present(Path(args[1])):
            print(f"setup TORCH=system: {sys.executable} has {len(there)} of the pins, used "
                  f"as they are: {', '.join(there)}")  # fmt: skip
        return 0
    if args[:1] != ["check"] or len(args) > 2:
        usage = "check [REQUIREMENTS] | requirements SRC DST | chain VENV"
        print(f"usage: python -m launchers.config.torch_check {usage}")
        return 2
    found = facts()
    if found["torch"] is None:
        why = "load the site's PyTorch (module load pytorch, its container) or `make setup`"
        print(f"torch: not installed in this interpreter: {why}", file=sys.stderr)
        return 1
    print(f"torch: {found['torch']} (CUDA {found['torch_cuda'] or 'none'}), "
          f"{found['torch_origin']}")  # fmt: skip
    for name in ("torchvision", "deepspeed"):
        try:
            print(f"{name}: {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            print(f"{name}: not installed", file=sys.stderr)
    source = Path(args[1] if len(args) == 2 else "requirements.txt")
    pins = pinned(source) if source.is_file() else {}
    for text in [*warnings(found), *pin_warnings(pins)]:
        print(f"warning: {text}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
