"""The wheelhouse: what ``make setup`` downloads, in one folder, for a node with no network.

``make wheelhouse`` (``python -m launchers.config.wheelhouse build``), on a machine with network:

1. the pins of ``requirements.txt`` for a target Python and platform (``pip download --no-deps``
   with ``--python-version``/``--platform``): a wheel where the index has one, else the sdist;
2. a wheel built from each sdist-only pin (deepspeed: ``pip wheel`` with ``DS_BUILD_OPS=0``, as
   setup installs it; the sdist is kept under ``sdist/``);
3. every dependency, wheels only, for that target (``pip download -r requirements.txt
   --only-binary=:all:``, the built wheels found in the folder), and pip itself;
4. upstream at the pinned commit as a git bundle (:data:`BUNDLE_NAME`), cloned from the source
   ``make setup`` clones from (``MEGATRON_DEEPSPEED_REPO``, else the GitHub URL); with
   ``--apex`` (``make wheelhouse DEVICE=cuda``) NVIDIA apex at its pinned commit too
   (:data:`APEX_BUNDLE_NAME`, from ``APEX_REPO``), which ``make setup DEVICE=cuda`` builds;
5. :data:`MANIFEST_NAME`: the target, every file with its distribution name, version, kind and
   sha256, and the bundles' commits. It is written last: a folder without it is incomplete.

For a node with its own PyTorch (``make wheelhouse TORCH=system``) step 3 is pip's resolution
instead (:func:`resolve`), and only what the node needs is downloaded: torch, torchvision and
what only they require are left out, and with ``HAVE=<the node's pip freeze>`` what the node has
and what only that requires too (:mod:`launchers.config.provided`); the manifest lists each left
out (``leaves_out``), and only ``make setup TORCH=system`` takes such a wheelhouse.

Setup downloads nothing else: the tokenizer and the dataset are generated on the node
(``launchers.config.upstream``).

``make setup WHEELS=dir`` first runs ``check`` (:func:`verify`): the manifest is there, every file
has its sha256, every pin has a wheel, and this interpreter is the target's Python on a platform
the wheels fit (with ``--system``: but what it leaves to the node, which must have what its
freeze listed); it writes a constraints file of the manifest's versions (nothing it leaves out is
constrained), then pip installs with
``--no-index --find-links dir`` and that file, and upstream (and apex, with ``DEVICE=cuda``) is
cloned from its bundle.

Standard library only: ``make setup WHEELS=dir`` runs it with a venv that has nothing installed.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from launchers.config import provided
from launchers.config.upstream import PINNED_COMMIT, UpstreamError, cache_root, upstream_repo

MANIFEST_NAME = "manifest.json"
"""The manifest inside a wheelhouse."""

BUNDLE_NAME = "megatron-deepspeed.bundle"
"""Upstream at the pinned commit, as a git bundle (``git clone`` reads it as a repository)."""

SDIST_DIR = "sdist"
"""Sub-folder of the sdists wheels were built from (pip's ``--find-links`` does not look in it)."""

FORMAT = 1
"""Manifest format version."""

APEX_BUNDLE_NAME = "apex.bundle"
"""NVIDIA apex at :data:`APEX_COMMIT`, for ``make setup DEVICE=cuda`` (``make wheelhouse
DEVICE=cuda``)."""

APEX_ARCHIVE_NAME = "apex.tar.gz"
"""NVIDIA apex's tree at :data:`APEX_COMMIT` (``git archive``), where the source clone cannot be
bundled: ``APEX_REPO`` may name this file (``launchers.config.gpu`` extracts it and checks the
commit id git recorded in it)."""
APEX_COMMIT = "6424da3b4faa6c8f062da4a48c424fff3f02d42d"
"""``launchers.config.gpu.APEX_COMMIT`` (the tests compare them; spelled out here because this
module imports nothing that needs a package installed)."""

APEX_DEFAULT_REPO = "https://github.com/NVIDIA/apex.git"
"""Where apex comes from unless ``APEX_REPO`` says otherwise (as ``launchers.config.gpu``)."""

EXTRA = ("pip",)
"""Installed by setup besides the requirements (``pip install --upgrade pip``)."""

SDIST_SUFFIXES = (".tar.gz", ".zip", ".tar.bz2", ".tgz")
"""File names of source distributions."""


class WheelhouseError(RuntimeError):
    """A wheelhouse could not be built, or does not fit this machine; says what to do."""


def normalize(name: str) -> str:
    """PEP 503 form of a distribution name (``PyYAML`` -> ``pyyaml``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(requirements: Path) -> dict[str, str]:
    """``{normalized name: version}`` of the ``name==version`` lines of a requirements file."""
    out = {}
    for number, raw in enumerate(requirements.read_text().splitlines(), 1):
        line = raw.split("#")[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        if not sep or not version.strip() or ";" in line or "[" in name:
            raise WheelhouseError(
                f"{requirements}:{number}: {raw.strip()!r} is not a plain name==version pin: "
                "the wheelhouse takes exact pins only"
            )
        out[normalize(name.strip())] = version.strip()
    return out


def dist_of(filename: str) -> tuple[str, str]:
    """(normalized name, version) from a wheel's or an sdist's file name."""
    if filename.endswith(".whl"):
        parts = filename[: -len(".whl")].split("-")
        if len(parts) < 5:
            raise WheelhouseError(f"{filename}: not a wheel file name (name-version-...-tags.whl)")
        return normalize(parts[0]), parts[1]
    for suffix in SDIST_SUFFIXES:
        if filename.endswith(suffix):
            name, _, version = filename[: -len(suffix)].rpartition("-")
            if name and version:
                return normalize(name), version
    raise WheelhouseError(f"{filename}: neither a wheel nor an sdist file name")


def wheel_fits(filename: str, python: str) -> bool:
    """Whether a wheel built here installs on any platform of Python ``python`` (pure Python:
    ``none-any``, for ``py3`` or that Python's ``cpXY``)."""
    parts = filename[: -len(".whl")].split("-")
    tags = parts[-3:]
    cp = "cp" + python.replace(".", "")
    pythons = set(tags[0].split("."))
    return tags[1] == "none" and tags[2] == "any" and bool(pythons & {"py3", cp})


def this_python() -> str:
    """``major.minor`` of the running interpreter."""
    return f"{sys.version_info[0]}.{sys.version_info[1]}"


def sha256(path: Path) -> str:
    """Hex sha256 of a file."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def default_dir(python: str, plat: str) -> Path:
    """``<cache>/wheelhouse/py<python>-<platform>``: outside the checkout, never committed."""
    return cache_root() / "wheelhouse" / f"py{python}-{plat}"


REQUIREMENTS = Path(__file__).resolve().parents[2] / "requirements.txt"
"""This checkout's pins."""


@dataclass(frozen=True)
class Found:
    """A complete wheelhouse on this machine."""

    folder: Path
    """Where it is."""
    manifest: dict
    """Its manifest."""


def found() -> Found | None:
    """The wheelhouse ``make setup WHEELS=`` would use here: ``$MDS_WHEELHOUSE``, else the
    default folder of this interpreter's Python and this machine's architecture; None when none
    has a readable manifest."""
    if env := os.environ.get("MDS_WHEELHOUSE"):
        candidates = [Path(env).expanduser()]
    else:
        root = cache_root() / "wheelhouse"
        candidates = sorted(root.glob(f"py{this_python()}-*_{platform.machine()}"))
    for folder in candidates:
        try:
            return Found(folder, load(folder))
        except WheelhouseError:
            continue
    return None


# --- building ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """The machine the wheelhouse is for."""

    python: str
    """``major.minor`` of its Python."""
    platform: str
    """pip platform tag, e.g. ``manylinux_2_28_x86_64`` (pip adds the older manylinux tags)."""

    def platforms(self) -> list[str]:
        """:attr:`platform` and the older manylinux tags its machines also run: pip's
        ``--platform manylinux_2_28_x86_64`` alone would take no ``manylinux_2_17`` wheel."""
        match = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", self.platform)
        if not match:
            return [self.platform]
        minor, arch = int(match.group(1)), match.group(2)
        out = [f"manylinux_2_{m}_{arch}" for m in range(minor, 4, -1)]
        legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
        return out + [f"{name}_{arch}" for floor, name in legacy.items() if minor >= floor]

    def pip_args(self) -> list[str]:
        """``pip download`` options that select wheels for this target."""
        cp = "cp" + self.python.replace(".", "")
        tags = [arg for plat in self.platforms() for arg in ("--platform", plat)]
        return [
            "--python-version",
            self.python,
            *tags,
            "--implementation",
            "cp",
            "--abi",
            cp,
            "--abi",
            "abi3",
            "--abi",
            "none",
        ]


_SAVED = re.compile(r"^\s*(?:Saved|File was already downloaded) (.+)$", re.MULTILINE)
"""pip download's line for each file it put (or found) in the folder."""


def pip_download(python: str, args: list[str], log=print) -> list[Path]:
    """``python -m pip download ARGS``; the files it saved or found, or a WheelhouseError."""
    cmd = [python, "-m", "pip", "download", "--progress-bar", "off", *args]
    platforms = [b for a, b in itertools.pairwise(args) if a == "--platform"]
    shown = [a for a in args if a != "--platform" and a not in platforms]
    log(f"wheelhouse: pip download {' '.join(shown)} (platforms {', '.join(platforms[:2])}, ...)")
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        tail = "\n".join((res.stdout + res.stderr).strip().splitlines()[-12:])
        raise WheelhouseError(
            f"pip download failed (exit {res.returncode}):\n{tail}\nCheck that the package index "
            "is reachable and serves these versions for the target (PY=, PLATFORM=)"
        )
    return [Path(p.strip()) for p in _SAVED.findall(res.stdout)]


def build_wheel(python: str, sdist: Path, out: Path, target: Target, log=print) -> Path:
    """A wheel of ``sdist`` into ``out`` (``DS_BUILD_OPS=0``: DeepSpeed compiles no op); it must
    be pure Python, since it is built here, not on the target."""
    cmd = [
        python,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--progress-bar",
        "off",
        "--wheel-dir",
        str(out),
        str(sdist),
    ]
    log(f"wheelhouse: building a wheel of {sdist.name} (DS_BUILD_OPS=0)")
    env = dict(os.environ, DS_BUILD_OPS="0")
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    name, version = dist_of(sdist.name)
    built = [p for p in out.glob("*.whl") if dist_of(p.name) == (name, version)]
    if res.returncode != 0 or not built:
        tail = "\n".join((res.stdout + res.stderr).strip().splitlines()[-12:])
        raise WheelhouseError(f"pip wheel {sdist.name} failed (exit {res.returncode}):\n{tail}")
    if not wheel_fits(built[0].name, target.python):
        raise WheelhouseError(
            f"{built[0].name}, built from {sdist.name} on this machine, is not pure Python: it "
            f"would not install on Python {target.python} {target.platform}; run `make "
            "wheelhouse` on a machine of the target's platform and Python"
        )
    return built[0]


def bundle(repo: str, path: Path, commit: str, what: str, log=print) -> Path:
    """``path``: a git bundle of ``commit``'s history from ``repo`` (a URL or a local path), its
    one branch and HEAD pointing at it, so that ``git clone`` of the file checks it out."""
    with tempfile.TemporaryDirectory(prefix="mds-bundle-") as tmp:
        bare = Path(tmp) / "repo.git"
        log(f"wheelhouse: cloning {repo} for the {what} bundle")
        _git(["clone", "--quiet", "--bare", repo, str(bare)], repo, what)
        if not _has_commit(bare, commit):
            _git(["-C", str(bare), "fetch", "--quiet", repo, commit], repo, what)
        _git(["-C", str(bare), "update-ref", "refs/heads/pinned", commit], repo, what)
        _git(["-C", str(bare), "symbolic-ref", "HEAD", "refs/heads/pinned"], repo, what)
        path.unlink(missing_ok=True)
        create = ["bundle", "create", "--quiet", str(path), "HEAD", "refs/heads/pinned"]
        _git(["-C", str(bare), *create], repo, what)
    log(f"wheelhouse: {path.name}: {what} at {commit[:12]} from {repo}")
    return path


def archive(repo: str, path: Path, commit: str, what: str, log=print) -> Path:
    """``path``: ``git archive`` of ``commit``'s tree in the local clone ``repo``, a gzipped tar
    under ``<what>/`` whose pax header git writes the commit id into (``git get-tar-commit-id``)."""
    path.unlink(missing_ok=True)
    cmd = ["-C", repo, "archive", "--format=tar.gz", f"--prefix={what}/", "-o", str(path), commit]
    _git(cmd, repo, what)
    log(f"wheelhouse: {path.name}: {what}'s tree at {commit[:12]} from {repo}")
    return path


def apex_source(repo: str, folder: Path, log=print) -> Path:
    """apex at :data:`APEX_COMMIT` in ``folder``: a bundle of its history, or, where ``repo`` is a
    local clone that lacks part of it (``git bundle`` stops), a source tarball of the pinned tree
    (:data:`APEX_ARCHIVE_NAME`), which the manifest checks by sha256 and commit id alike."""
    try:
        return bundle(repo, folder / APEX_BUNDLE_NAME, APEX_COMMIT, "apex", log)
    except UpstreamError as exc:
        if not Path(repo).is_dir():
            raise
        (folder / APEX_BUNDLE_NAME).unlink(missing_ok=True)
        log(f"wheelhouse: no apex bundle ({exc}); the pinned tree as a source tarball instead")
        return archive(repo, folder / APEX_ARCHIVE_NAME, APEX_COMMIT, "apex", log)


def _has_commit(repo: Path, commit: str) -> bool:
    cmd = ["git", "-C", str(repo), "cat-file", "-e", f"{commit}^{{commit}}"]
    return subprocess.run(cmd, capture_output=True, check=False).returncode == 0


_SOURCES = {
    "upstream": ("MEGATRON_DEEPSPEED_REPO", "microsoft/Megatron-DeepSpeed"),
    "apex": ("APEX_REPO", "NVIDIA/apex"),
}
"""The variable naming each bundle's source, and the repository it must hold."""


def _git(args: list[str], repo: str, what: str) -> None:
    res = subprocess.run(["git", *args], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        variable, name = _SOURCES[what]
        raise UpstreamError(
            f"git {' '.join(args[:3])} failed: {res.stderr.strip()}. Set {variable} to a "
            f"reachable URL or local clone of {name} (now {repo}) and rerun `make wheelhouse`"
        )


def build(
    folder: Path,
    requirements: Path,
    target: Target,
    *,
    repo: str | None = None,
    python: str = sys.executable,
    index_args: tuple[str, ...] = (),
    apex: str | None = None,
    torch_system: bool = False,
    have: Path | None = None,
    log=print,
) -> dict:
    """Fill ``folder`` (see the module docstring) and write its manifest; return the manifest.

    ``index_args`` go to every pip call (e.g. ``--no-index --find-links DIR`` for a local index);
    ``apex``: also a bundle of NVIDIA apex at :data:`APEX_COMMIT` from that source;
    ``torch_system``: leave out torch, torchvision and what only they require; ``have``: the
    node's ``pip freeze``, whose packages (and what only they require) are left out too
    (:mod:`launchers.config.provided`).
    """
    wanted = pins(requirements)
    try:
        node = provided.read_have(have) if have else {}
    except provided.ProvidedError as exc:
        raise WheelhouseError(str(exc)) from None
    left_pins = {n for n in wanted if (torch_system and n in provided.TORCH) or n in node}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MANIFEST_NAME).unlink(missing_ok=True)
    started = time.monotonic()
    to_fetch = folder / ".pins-to-fetch.txt"
    to_fetch.write_text("".join(f"{n}=={v}\n" for n, v in wanted.items() if n not in left_pins))
    first = pip_download(
        python,
        ["--no-deps", "--dest", str(folder), *target.pip_args(), *index_args, "-r", str(to_fetch)],
        log,
    )
    to_fetch.unlink()
    built: dict[str, str] = {}
    for sdist in (p for p in first if not p.name.endswith(".whl")):
        kept = folder / SDIST_DIR / sdist.name
        kept.parent.mkdir(exist_ok=True)
        if sdist.resolve() != kept.resolve():
            shutil.move(str(sdist), kept)
        wheel = build_wheel(python, kept, folder, target, log)
        built[wheel.name] = kept.name
    binary = ["--only-binary=:all:", "--find-links", str(folder), *target.pip_args(), *index_args]
    leaves_out: list[dict] = []
    if torch_system or node:
        # The node's own pins are not resolved (one may be an sdist, which is not built), the
        # others at their pins (-c); torch's are, for the closure to leave out.
        theirs = left_pins - (set(provided.TORCH) if torch_system else set())
        to_resolve = folder / ".pins-to-resolve.txt"
        to_resolve.write_text("".join(f"{n}=={v}\n" for n, v in wanted.items() if n not in theirs))
        args = [*binary, "-c", str(requirements), "-r", str(to_resolve), *EXTRA]
        graph = resolve(python, args, log)
        to_resolve.unlink()
        roots = set(wanted) | {normalize(e) for e in EXTRA}
        parts = provided.split(graph, roots, torch_system=torch_system, have=set(node))
        versions = {**wanted, **{n: d.version for n, d in graph.items()}}
        leaves_out = [
            {
                "name": n,
                "version": versions[n],
                "why": why,
                "node_has": node.get(n),
                "listed": n in node,
            }
            for why, names in (("torch", parts.torch), ("node", parts.node | (theirs - set(graph))))
            for n in sorted(names)
        ]
        kept = [f"{n}=={graph[n].version}" for n in sorted(parts.keep)]
        files = pip_download(python, ["--no-deps", "--dest", str(folder), *binary, *kept], log)
        ours = sum(e["why"] == "torch" for e in leaves_out)
        log(
            f"wheelhouse: leaves out {ours} distributions of the node's PyTorch and "
            f"{len(leaves_out) - ours} the node has or only they need; holds {len(parts.keep)}"
        )
    else:
        args = ["--dest", str(folder), *binary, "-r", str(requirements), *EXTRA]
        files = pip_download(python, args, log)
    listed = {p.name for p in files}
    for stale in sorted(p for p in folder.glob("*.whl") if p.name not in listed):
        log(f"wheelhouse: removing {stale.name}, which this build does not list")
        stale.unlink()
    by_name: dict[str, dict] = {}
    for path in sorted({(folder / p.name) for p in files}):
        name, version = dist_of(path.name)
        kind = "built-wheel" if path.name in built else "wheel"
        entry = {
            "file": path.name,
            "name": name,
            "version": version,
            "kind": kind,
            "pinned": name in wanted,
            "bytes": path.stat().st_size,
            "sha256": sha256(path),
        }
        if path.name in built:
            entry["built_from"] = f"{SDIST_DIR}/{built[path.name]}"
        by_name[name] = entry
    missing = [
        f"{n}=={v}"
        for n, v in wanted.items()
        if n not in left_pins and by_name.get(n, {}).get("version") != v
    ]
    if missing:
        raise WheelhouseError(
            f"pip download did not give wheels of {', '.join(missing)} for Python {target.python}"
            f" {target.platform}: check the pins and the target"
        )
    for sdist_name in built.values():
        path = folder / SDIST_DIR / sdist_name
        name, version = dist_of(sdist_name)
        by_name[f"{name} (sdist)"] = {
            "file": f"{SDIST_DIR}/{sdist_name}",
            "name": name,
            "version": version,
            "kind": "sdist",
            "pinned": True,
            "bytes": path.stat().st_size,
            "sha256": sha256(path),
        }
    source = repo or upstream_repo()
    upstream_bundle = bundle(source, folder / BUNDLE_NAME, PINNED_COMMIT, "upstream", log)
    manifest = {
        "format": FORMAT,
        "target": {"python": target.python, "platform": target.platform},
        "requirements": {
            "file": requirements.name,
            "sha256": sha256(requirements),
            "pins": wanted,
        },
        "files": sorted(by_name.values(), key=lambda e: e["file"]),
        "torch_system": torch_system,
        "have": {"file": str(have), "sha256": sha256(have), "packages": len(node)}
        if have
        else None,
        "leaves_out": leaves_out,
        "upstream": _bundle_entry(upstream_bundle, PINNED_COMMIT, source),
        "generated_data": "the tokenizer and the dataset are generated by setup on the node",
        "seconds": round(time.monotonic() - started, 1),
    }
    (folder / APEX_ARCHIVE_NAME).unlink(missing_ok=True)
    if apex:
        manifest["apex"] = _bundle_entry(apex_source(apex, folder, log), APEX_COMMIT, apex)
    else:
        (folder / APEX_BUNDLE_NAME).unlink(missing_ok=True)
    tmp = folder / f"{MANIFEST_NAME}.tmp"
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(tmp, folder / MANIFEST_NAME)
    return manifest


def resolve(python: str, args: list[str], log=print) -> dict[str, provided.Resolved]:
    """pip's resolution of ``args`` for the target, downloading no wheel where the index serves
    its metadata (``pip install --dry-run --ignore-installed --report``): every distribution with
    its version and ``Requires-Dist``."""
    with tempfile.TemporaryDirectory(prefix="mds-resolve-") as tmp:
        report = Path(tmp) / "report.json"
        cmd = [python, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
               "--progress-bar", "off", "--report", str(report), *args]  # fmt: skip
        log("wheelhouse: resolving the pins for the target (pip install --dry-run --report)")
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if res.returncode != 0:
            tail = "\n".join((res.stdout + res.stderr).strip().splitlines()[-12:])
            raise WheelhouseError(
                f"pip could not resolve the pins for the target (exit {res.returncode}):\n{tail}"
            )
        try:
            return provided.from_report(json.loads(report.read_text()))
        except (ValueError, provided.ProvidedError) as exc:
            raise WheelhouseError(f"pip's resolution report: {exc}") from None


def _bundle_entry(path: Path, commit: str, source: str) -> dict:
    return {"commit": commit, "source": source, "file": path.name,
            "bytes": path.stat().st_size, "sha256": sha256(path)}  # fmt: skip


# --- checking, for setup and the doctor ----------------------------------------------------


def load(folder: Path) -> dict:
    """The manifest of ``folder``, or a WheelhouseError saying how to get one."""
    path = folder / MANIFEST_NAME
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise WheelhouseError(
            f"{path} does not exist: {folder} is not a complete wheelhouse; run `make wheelhouse "
            f"WHEELHOUSE={folder}` on a machine with network (and copy the folder here)"
        ) from None
    except ValueError as exc:
        raise WheelhouseError(f"{path}: not JSON ({exc}): rerun `make wheelhouse`") from None
    if manifest.get("format") != FORMAT:
        raise WheelhouseError(
            f"{path}: format {manifest.get('format')!r}, this checkout reads {FORMAT}: rerun "
            "`make wheelhouse`"
        )
    return manifest


def glibc() -> tuple[int, int] | None:
    """This machine's glibc version, or None (musl, or not Linux)."""
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError, AttributeError):
        return None
    match = re.match(r"glibc (\d+)\.(\d+)", text)
    return (int(match.group(1)), int(match.group(2))) if match else None


def fit_problem(manifest: dict, python: str, machine: str, libc: tuple[int, int] | None) -> str:
    """Why the wheelhouse's wheels do not install on Python ``python`` here (empty when they do)."""
    target = manifest["target"]
    fix = (
        f"`make wheelhouse PY={python} PLATFORM=manylinux_2_28_{machine}` on a machine with network"
    )
    if target["python"] != python:
        return (
            f"the wheelhouse is for Python {target['python']}, this interpreter is {python}: {fix}"
        )
    match = re.match(r"manylinux_(\d+)_(\d+)_(\w+)$", target["platform"])
    if match:
        arch, need = match.group(3), (int(match.group(1)), int(match.group(2)))
        if arch != machine:
            return f"the wheelhouse is for {target['platform']}, this machine is {machine}: {fix}"
        if libc is not None and libc < need:
            return (
                f"the wheelhouse is for {target['platform']} (glibc {need[0]}.{need[1]} or newer), "
                f"this machine has glibc {libc[0]}.{libc[1]}: {fix.replace('2_28', '2_17')}"
            )
    return ""


def verify(
    folder: Path,
    requirements: Path,
    *,
    skip: tuple[str, ...] = (),
    apex: bool = False,
    system: bool = False,
) -> dict:
    """The manifest of ``folder`` after checking it against this interpreter and ``requirements``:
    it fits (:func:`fit_problem`), every pin but ``skip`` and what the manifest leaves to the node
    has a wheel at its version, every file is there with its sha256, the bundles hold the pinned
    commits (``apex``: an apex bundle is there too). A wheelhouse that leaves something to the node
    needs ``system`` (``make setup TORCH=system``: torch and torchvision are skipped too), and this
    interpreter must have every package the node's freeze listed (:func:`node_lacks`). A
    WheelhouseError otherwise."""
    manifest = load(folder)
    python = this_python()
    if problem := fit_problem(manifest, python, platform.machine(), glibc()):
        raise WheelhouseError(f"{folder}: {problem}")
    leaves = manifest.get("leaves_out") or []
    if leaves and not system:
        raise WheelhouseError(
            f"{folder} leaves {len(leaves)} distributions to the node (built with TORCH=system or "
            f"HAVE=): install it with `make setup TORCH=system WHEELS={folder}`, or rebuild it "
            "without TORCH=system and HAVE= for a venv of its own"
        )
    if lacks := node_lacks(manifest):
        raise WheelhouseError(
            f"{folder} leaves {', '.join(lacks)} to the node (its freeze listed them), and "
            f"{sys.executable} has none of them: rebuild with HAVE= of this node's `python3 -m "
            "pip freeze`"
        )
    skip = (*skip, *(e["name"] for e in leaves), *(provided.TORCH if system else ()))
    wheels = {e["name"]: e["version"] for e in manifest["files"] if e["kind"] != "sdist"}
    lacking = [
        f"{name}=={version}"
        for name, version in pins(requirements).items()
        if name not in skip and wheels.get(name) != version
    ]
    if lacking:
        raise WheelhouseError(
            f"{folder} lacks {', '.join(lacking)} of {requirements}: it was built for other pins; "
            f"rerun `make wheelhouse WHEELHOUSE={folder}`"
        )
    if apex and "apex" not in manifest:
        raise WheelhouseError(
            f"{folder} has no apex bundle, which `make setup DEVICE=cuda` builds from: rerun "
            f"`make wheelhouse DEVICE=cuda WHEELHOUSE={folder}`"
        )
    bundles = {"upstream": PINNED_COMMIT, "apex": APEX_COMMIT}
    for what in (w for w in bundles if w in manifest):
        if manifest[what]["commit"] != bundles[what]:
            raise WheelhouseError(
                f"{folder}/{manifest[what]['file']} holds {what} {manifest[what]['commit'][:12]}, "
                f"this checkout pins {bundles[what][:12]}: rerun `make wheelhouse "
                f"WHEELHOUSE={folder}`"
            )
    for entry in [*manifest["files"], *(manifest[w] for w in bundles if w in manifest)]:
        path = folder / entry["file"]
        if not path.is_file():
            raise WheelhouseError(f"{path} is missing (listed in {MANIFEST_NAME}): copy it again")
        if sha256(path) != entry["sha256"]:
            raise WheelhouseError(
                f"{path}: sha256 differs from {MANIFEST_NAME} (a damaged or partial copy): copy it "
                "again from the machine that ran `make wheelhouse`"
            )
    return manifest


def node_lacks(manifest: dict) -> list[str]:
    """The distributions the manifest leaves to the node because its freeze (HAVE) listed them,
    that this interpreter does not have."""
    out = []
    for entry in manifest.get("leaves_out") or []:
        if not entry.get("listed"):
            continue
        try:
            metadata.version(entry["name"])
        except metadata.PackageNotFoundError:
            out.append(entry["name"])
    return out


def constraints(manifest: dict, *, skip: tuple[str, ...] = ()) -> str:
    """pip constraints (``name==version``) of every wheel in the manifest but ``skip``: the
    install takes exactly these versions, whatever else lies in the folder."""
    lines = sorted(
        f"{e['name']}=={e['version']}"
        for e in manifest["files"]
        if e["kind"] != "sdist" and e["name"] not in skip
    )
    return "\n".join(lines) + "\n"


def offer(name: str, manifest: dict | None, folder: Path | None, python: str) -> str:
    """What ``make setup WHEELS=`` would give a node that lacks pin ``name`` (or upstream, for
    ``name="upstream"``), for the doctor's fix; empty when no wheelhouse holds it."""
    if manifest is None or folder is None:
        return ""
    target = manifest["target"]
    if target["python"] != python:
        return (
            f"the wheelhouse {folder} is for Python {target['python']}, not this node's "
            f"{python}: `make wheelhouse PY={python}` first"
        )
    if name == "upstream":
        held = f"upstream {manifest['upstream']['commit'][:8]} ({manifest['upstream']['file']})"
    else:
        entry = next((e for e in manifest["files"] if e["name"] == normalize(name)), None)
        if entry is None:
            return ""
        held = f"{entry['name']} {entry['version']}"
    return (
        f"`make setup {'TORCH=system ' if manifest.get('leaves_out') else ''}WHEELS={folder}` "
        f"there, no network needed (the wheelhouse holds {held} for "
        f"Python {target['python']} {target['platform']}; copy it to the node first without a "
        "shared filesystem)"
    )


def summary(folder: Path, manifest: dict) -> str:
    """What ``make wheelhouse`` says when done: files, size, target, time, what to run next."""
    files = [*manifest["files"], *(manifest[w] for w in ("upstream", "apex") if w in manifest)]
    size = sum(e["bytes"] for e in files)
    target = manifest["target"]
    leaves = manifest.get("leaves_out") or []
    setup = "make setup TORCH=system" if leaves else "make setup"
    left = f", leaving {len(leaves)} distributions to the node" if leaves else ""
    return (
        f"wheelhouse: {folder}: {len(files)} files, {size / 2**20:.1f} MiB, Python "
        f"{target['python']} {target['platform']}{left}, {manifest['seconds']:.0f} s; `{setup} "
        f"WHEELS={folder}` installs from it with no network"
    )


def main(argv: list[str] | None = None) -> int:
    """``build`` (make wheelhouse), ``check`` (make setup WHEELS=), ``default-dir``."""
    ap = argparse.ArgumentParser(prog="python -m launchers.config.wheelhouse", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    here = this_python()
    b = sub.add_parser("build", help="download the pins, build sdist-only ones, bundle upstream")
    b.add_argument("--dir", type=Path, help="default: <cache>/wheelhouse/py<PY>-<PLATFORM>")
    b.add_argument("--requirements", type=Path, default=Path("requirements.txt"))
    b.add_argument("--python", default=here, help="target Python major.minor")
    b.add_argument("--platform", default=f"manylinux_2_28_{platform.machine()}")
    b.add_argument("--apex", action="store_true", help="also NVIDIA apex (APEX_REPO), for CUDA")
    b.add_argument(
        "--torch-system", action="store_true", help="leave out torch and what only it requires"
    )
    b.add_argument("--have", type=Path, help="the node's pip freeze: leave out what it has")
    c = sub.add_parser("check", help="verify a wheelhouse for this interpreter; write constraints")
    c.add_argument("dir", type=Path)
    c.add_argument("--requirements", type=Path, default=Path("requirements.txt"))
    c.add_argument("--constraints", type=Path, help="write the manifest's versions here")
    c.add_argument("--apex", action="store_true", help="require the apex bundle (DEVICE=cuda)")
    c.add_argument("--system", action="store_true", help="on the node's PyTorch (TORCH=system)")
    c.add_argument(
        "--skip", action="append", default=[], help="a name not to require or constrain (again)"
    )
    d = sub.add_parser("default-dir", help="print the default folder for a target")
    d.add_argument("--python", default=here)
    d.add_argument("--platform", default=f"manylinux_2_28_{platform.machine()}")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "default-dir":
            print(default_dir(args.python, args.platform))
        elif args.cmd == "build":
            target = Target(args.python, args.platform)
            folder = (args.dir or default_dir(target.python, target.platform)).absolute()
            apex = (os.environ.get("APEX_REPO") or APEX_DEFAULT_REPO) if args.apex else None
            built = build(
                folder,
                args.requirements,
                target,
                apex=apex,
                torch_system=args.torch_system,
                have=args.have,
            )
            print(summary(folder, built))
        else:
            skip = tuple(normalize(s) for s in args.skip)
            manifest = verify(
                args.dir, args.requirements, skip=skip, apex=args.apex, system=args.system
            )
            if args.constraints:
                args.constraints.parent.mkdir(parents=True, exist_ok=True)
                args.constraints.write_text(constraints(manifest, skip=skip))
            leaves = manifest.get("leaves_out") or []
            print(
                f"wheelhouse: {args.dir} ok for Python {manifest['target']['python']} "
                f"{manifest['target']['platform']}: {len(manifest['files'])} files and the "
                f"{' and '.join(w for w in ('upstream', 'apex') if w in manifest)} bundle, sha256 "
                f"checked{f'; {len(leaves)} distributions left to the node' if leaves else ''}"
            )
    except (WheelhouseError, UpstreamError) as exc:
        print(f"wheelhouse: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
