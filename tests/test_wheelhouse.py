"""The wheelhouse (``make wheelhouse``, ``make setup WHEELS=``), the doctor's verdict on what it
would give a node, and ``make setup TORCH=system`` on an interpreter that is itself a venv.

Nothing here downloads: the wheelhouse is built from a local index the test writes (a wheel with
a dependency, and an sdist-only package with an in-tree build backend), with pip's configured
indexes turned off, and upstream is a small git repository made here.
"""

from __future__ import annotations

import base64
import ensurepip
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from launchers.config import gpu, probe, provided, torch_check, upstream, wheelhouse
from launchers.config.presets import default_paths
from launchers.doctor import transport, verdicts

ROOT = Path(__file__).resolve().parents[1]
PYTHON = wheelhouse.this_python()
TARGET = wheelhouse.Target(PYTHON, "manylinux_2_28_x86_64")


def make_wheel(
    folder: Path, name: str, version: str, requires: tuple[str, ...] = (), extras: str = ""
) -> Path:
    """A pure-Python wheel of module ``name`` that defines ``VERSION`` (``extras``: the extra it
    provides)."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}.py": f"VERSION = {version!r}\n",
        f"{dist}/METADATA": "Metadata-Version: 2.1\n"
        f"Name: {name}\nVersion: {version}\n"
        + (f"Provides-Extra: {extras}\n" if extras else "")
        + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    files[f"{dist}/RECORD"] = "\n".join([*record, f"{dist}/RECORD,,"]) + "\n"
    out = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(out, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    return out


BACKEND = '''
"""In-tree PEP 517 backend: a wheel of the module beside it, without setuptools."""
import base64, hashlib, os, zipfile
NAME, VERSION = "mdswsrc", "0.1"
def _files():
    dist = f"{NAME}-{VERSION}.dist-info"
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, NAME + ".py")) as f:
        code = f.read()
    return dist, {NAME + ".py": code,
        dist + "/METADATA": f"Metadata-Version: 2.1\\nName: {NAME}\\nVersion: {VERSION}\\n",
        dist + "/WHEEL": "Wheel-Version: 1.0\\nGenerator: t\\nRoot-Is-Purelib: true\\n"
        "Tag: py3-none-any\\n"}
def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    dist, files = _files()
    rows = []
    for p, t in files.items():
        d = base64.urlsafe_b64encode(hashlib.sha256(t.encode()).digest()).rstrip(b"=").decode()
        rows.append(f"{p},sha256={d},{len(t.encode())}")
    files[dist + "/RECORD"] = "\\n".join(rows + [dist + "/RECORD,,"]) + "\\n"
    name = f"{NAME}-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as z:
        for p, t in files.items():
            z.writestr(p, t)
    return name
def get_requires_for_build_wheel(config_settings=None):
    return []
'''


def make_sdist(folder: Path) -> Path:
    """``mdswsrc-0.1.tar.gz``: a source distribution only (as deepspeed is on PyPI), built by
    ``backend.py`` inside it (no build requirement to download)."""
    files = {
        "pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "backend"\n'
        'backend-path = ["."]\n',
        "backend.py": BACKEND,
        "mdswsrc.py": "BUILT_WITHOUT_OPS = True\n",
        "PKG-INFO": "Metadata-Version: 2.1\nName: mdswsrc\nVersion: 0.1\n",
    }
    out = folder / "mdswsrc-0.1.tar.gz"
    with tarfile.open(out, "w:gz") as tar:
        for path, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"mdswsrc-0.1/{path}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out


def git(*args: str, cwd: Path | None = None) -> str:
    env = dict(
        os.environ,
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@t",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@t",
    )
    res = subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, env=env, check=True
    )
    return res.stdout.strip()


@pytest.fixture
def offline_pip(monkeypatch):
    """pip with none of this machine's configured indexes, find-links or constraints."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    for name in ("PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_CONSTRAINT"):
        monkeypatch.delenv(name, raising=False)


def make_upstream(tmp_path: Path, monkeypatch) -> tuple[Path, str]:
    """A small git repository standing in for upstream (and apex): the pinned commit, then one
    more."""
    repo = tmp_path / "upstream"
    repo.mkdir()
    git("init", "-q", cwd=repo)
    (repo / "pretrain_gpt.py").write_text("# the entry point\n")
    git("add", ".", cwd=repo)
    git("commit", "-qm", "pinned", cwd=repo)
    commit = git("rev-parse", "HEAD", cwd=repo)
    (repo / "later.py").write_text("# after the pin\n")
    git("add", ".", cwd=repo)
    git("commit", "-qm", "later", cwd=repo)
    monkeypatch.setattr(wheelhouse, "PINNED_COMMIT", commit)
    monkeypatch.setattr(wheelhouse, "APEX_COMMIT", commit)  # the same small repository as apex
    return repo, commit


def copy_pip(index: Path) -> None:
    """pip itself into ``index``, as ensurepip carries it."""
    for bundled in (Path(ensurepip.__file__).parent / "_bundled").glob("pip-*.whl"):
        shutil.copy(bundled, index)


@pytest.fixture
def house(tmp_path, monkeypatch, offline_pip):
    """A wheelhouse built from a local index and a local upstream repository."""
    index = tmp_path / "index"
    index.mkdir()
    make_wheel(index, "mdswdep", "2.0")
    make_wheel(index, "mdswdemo", "1.0", requires=("mdswdep",))
    make_sdist(index)
    copy_pip(index)
    repo, commit = make_upstream(tmp_path, monkeypatch)
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("# pins\nmdswdemo==1.0\nmdswsrc==0.1  # sdist only\n")
    folder = tmp_path / "house"
    said: list[str] = []
    manifest = wheelhouse.build(
        folder,
        requirements,
        TARGET,
        repo=str(repo),
        index_args=("--no-index", "--find-links", str(index)),
        apex=str(repo),
        log=said.append,
    )
    return folder, requirements, manifest, commit, said


def test_build_downloads_pins_and_dependencies_builds_sdists_and_bundles_upstream(house):
    folder, _, manifest, commit, said = house
    files = {e["file"]: e for e in manifest["files"]}
    assert set(files) == {
        "mdswdemo-1.0-py3-none-any.whl",
        "mdswdep-2.0-py3-none-any.whl",
        "mdswsrc-0.1-py3-none-any.whl",
        "sdist/mdswsrc-0.1.tar.gz",
        *(f for f in files if f.startswith("pip-")),
    }
    assert any(f.startswith("pip-") for f in files), "pip itself is in the wheelhouse"
    assert files["mdswsrc-0.1-py3-none-any.whl"]["kind"] == "built-wheel"
    assert files["mdswsrc-0.1-py3-none-any.whl"]["built_from"] == "sdist/mdswsrc-0.1.tar.gz"
    assert files["mdswdep-2.0-py3-none-any.whl"] | {"sha256": ""} == {
        "file": "mdswdep-2.0-py3-none-any.whl",
        "name": "mdswdep",
        "version": "2.0",
        "kind": "wheel",
        "pinned": False,
        "sha256": "",
        "bytes": (folder / "mdswdep-2.0-py3-none-any.whl").stat().st_size,
    }
    for entry in [*manifest["files"], manifest["upstream"]]:
        assert wheelhouse.sha256(folder / entry["file"]) == entry["sha256"]
    assert manifest["target"] == {"python": PYTHON, "platform": "manylinux_2_28_x86_64"}
    assert manifest["requirements"]["pins"] == {"mdswdemo": "1.0", "mdswsrc": "0.1"}
    assert manifest["upstream"]["commit"] == commit
    assert manifest["apex"] | {"sha256": "", "bytes": 0} == {
        "commit": commit, "source": str(folder.parent / "upstream"), "file": "apex.bundle",
        "sha256": "", "bytes": 0,
    }  # fmt: skip
    assert json.loads((folder / "manifest.json").read_text()) == manifest
    assert any("building a wheel of mdswsrc-0.1.tar.gz" in line for line in said)
    size = sum(e["bytes"] for e in [*files.values(), manifest["upstream"], manifest["apex"]])
    assert wheelhouse.summary(folder, manifest).startswith(
        f"wheelhouse: {folder}: {len(files) + 2} files, {size / 2**20:.1f} MiB, Python {PYTHON} "
        "manylinux_2_28_x86_64, "
    )
    del manifest["apex"]
    assert f": {len(files) + 1} files, " in wheelhouse.summary(folder, manifest)


def test_setup_installs_from_it_alone_and_clones_upstream_from_the_bundle(house, tmp_path):
    folder, requirements, _, commit, _ = house
    verified = wheelhouse.verify(folder, requirements)
    make_wheel(folder, "mdswdep", "3.0")  # a stray newer file: the manifest's 2.0 is installed
    constraints = tmp_path / "constraints.txt"
    constraints.write_text(wheelhouse.constraints(verified))
    assert "mdswdep==2.0\n" in constraints.read_text()
    target = tmp_path / "site"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-index",
            "--find-links",
            str(folder),
            "-c",
            str(constraints),
            "--target",
            str(target),
            "-r",
            str(requirements),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    installed = sorted(p.name for p in target.glob("*.dist-info"))
    assert installed == ["mdswdemo-1.0.dist-info", "mdswdep-2.0.dist-info", "mdswsrc-0.1.dist-info"]
    clone = tmp_path / "md"
    upstream.checkout_pinned(
        str(folder / wheelhouse.BUNDLE_NAME),
        clone,
        commit,
        what="upstream",
        hint="",
        dir_variable="MEGATRON_DEEPSPEED_DIR",
        log=lambda _m: None,
    )
    assert git("rev-parse", "HEAD", cwd=clone) == commit
    assert (clone / "pretrain_gpt.py").is_file() and not (clone / "later.py").exists()


def test_a_damaged_copy_a_missing_pin_or_manifest_is_refused_with_the_fix(house, tmp_path):
    folder, requirements, *_ = house
    wheel = folder / "mdswdep-2.0-py3-none-any.whl"
    data = bytearray(wheel.read_bytes())
    data[-1] ^= 0xFF
    wheel.write_bytes(bytes(data))
    with pytest.raises(wheelhouse.WheelhouseError, match=r"mdswdep-2.0-py3-none-any.whl: sha256"):
        wheelhouse.verify(folder, requirements)
    more = tmp_path / "more.txt"
    more.write_text(requirements.read_text() + "mdswother==1.0\n")
    with pytest.raises(wheelhouse.WheelhouseError, match=r"lacks mdswother==1.0 of .*more.txt"):
        wheelhouse.verify(folder, more)
    (folder / "manifest.json").unlink()
    with pytest.raises(wheelhouse.WheelhouseError, match="not a complete wheelhouse; run `make "):
        wheelhouse.verify(folder, requirements)


def test_check_for_cuda_requires_the_apex_bundle(house):
    folder, requirements, manifest, *_ = house
    assert wheelhouse.verify(folder, requirements, apex=True)["apex"] == manifest["apex"]
    without = json.loads((folder / "manifest.json").read_text())
    del without["apex"]
    (folder / "manifest.json").write_text(json.dumps(without))
    with pytest.raises(wheelhouse.WheelhouseError, match="has no apex bundle, which `make setup "):
        wheelhouse.verify(folder, requirements, apex=True)
    assert "apex" not in wheelhouse.verify(folder, requirements)


def test_apex_pin_is_the_one_setup_builds():
    assert wheelhouse.APEX_COMMIT == gpu.APEX_COMMIT
    assert wheelhouse.APEX_DEFAULT_REPO == gpu.APEX_DEFAULT_REPO


def test_check_refuses_another_python_or_platform_before_pip_runs():
    manifest = {"target": {"python": "3.11", "platform": "manylinux_2_28_x86_64"}}
    assert wheelhouse.fit_problem(manifest, "3.11", "x86_64", (2, 36)) == ""
    assert "is for Python 3.11, this interpreter is 3.12" in wheelhouse.fit_problem(
        manifest, "3.12", "x86_64", (2, 36)
    )
    assert "this machine is aarch64" in wheelhouse.fit_problem(manifest, "3.11", "aarch64", None)
    assert "this machine has glibc 2.17" in wheelhouse.fit_problem(
        manifest, "3.11", "x86_64", (2, 17)
    )


def test_platform_tags_include_the_older_manylinux_ones():
    tags = wheelhouse.Target("3.11", "manylinux_2_28_x86_64").platforms()
    assert tags[0] == "manylinux_2_28_x86_64" and "manylinux_2_17_x86_64" in tags
    assert {"manylinux2014_x86_64", "manylinux1_x86_64"} <= set(tags)
    assert "manylinux_2_31_x86_64" not in tags


def test_pins_must_be_exact():
    with pytest.raises(wheelhouse.WheelhouseError, match=r"r.txt:2: 'numpy>=2' is not a plain"):
        wheelhouse.pins(_text("six==1.17.0\nnumpy>=2\n"))
    assert wheelhouse.pins(_text("PyYAML==6.0.3  # c\n\n")) == {"pyyaml": "6.0.3"}


def _text(text: str) -> Path:
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"wheelhouse-test-{os.getpid()}" / "r.txt"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return path


def test_make_setup_wheels_checks_then_installs_with_no_index_and_clones_the_bundle(tmp_path):
    venv = tmp_path / "v"
    res = subprocess.run(
        ["make", "-n", "setup", "WHEELS=wh", f"VENV={venv}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    lines = res.stdout.splitlines()
    check = next(
        i for i, line in enumerate(lines) if "launchers.config.wheelhouse check wh" in line
    )
    pips = [i for i, line in enumerate(lines) if " -m pip install" in line]
    assert pips and check < pips[0]
    assert all("--no-index --find-links wh -c" in lines[i] for i in pips)
    assert all("PIP_CONFIG_FILE=/dev/null" in lines[i] for i in pips)
    assert any(
        f"MEGATRON_DEEPSPEED_REPO={ROOT}/wh/megatron-deepspeed.bundle" in line for line in lines
    )
    system = ["make", "-n", "setup", "WHEELS=wh", f"VENV={venv}", "TORCH=system"]
    res = subprocess.run(system, cwd=ROOT, capture_output=True, text=True, check=True)
    checks = [" ".join(line.split()) for line in res.stdout.splitlines() if "check wh" in line]
    assert checks == [
        f"{venv}/bin/python -m launchers.config.wheelhouse check wh --system --constraints "
        f"{venv}/wheelhouse-constraints.txt"
    ]
    build = ["make", "-n", "wheelhouse", "TORCH=system", "HAVE=node.txt", "PY=3.12"]
    res = subprocess.run(build, cwd=ROOT, capture_output=True, text=True, check=True)
    assert "--python 3.12 " in res.stdout and "--torch-system --have node.txt" in res.stdout
    cuda = ["make", "-n", "setup", "WHEELS=wh", f"VENV={venv}", "DEVICE=cuda"]
    res = subprocess.run(cuda, cwd=ROOT, capture_output=True, text=True, check=True)
    assert "launchers.config.wheelhouse check wh --apex" in " ".join(res.stdout.split())
    assert f"APEX_REPO={ROOT}/wh/apex.bundle {venv}/bin/python -m launchers.config.gpu setup" in (
        res.stdout
    )


# --- the doctor ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def facts() -> dict:
    """This machine's probe facts."""
    request = transport.request_for(default_paths(), "cpu", ROOT / "logs", {})
    reply = transport.probe_local(probe.command(sys.executable, request.to_json()))
    assert reply.facts is not None, reply.error
    return reply.facts


def _node(facts: dict, exp: verdicts.Expectation, **packages: str | None) -> dict:
    node = json.loads(json.dumps(facts))
    node["packages"].update(packages)
    row = verdicts.judge("node2", "node2", 1, transport.Reply(True, node, "", 0), exp)
    return {f.check: f for f in row.findings}


def _expectation(facts: dict, found: wheelhouse.Found | None) -> verdicts.Expectation:
    request = transport.request_for(default_paths(), "cpu", ROOT / "logs", {})
    route = transport.Route("pdsh", {}, None, "pdsh over ssh")
    pins = {name: facts["packages"][name] for name in probe.PACKAGES}
    return verdicts.Expectation(
        facts, request, upstream.PINNED_COMMIT, True, route, "hosts", found, pins
    )


def _manifest(python: str) -> dict:
    return {
        "target": {"python": python, "platform": "manylinux_2_28_x86_64"},
        "files": [{"name": "deepspeed", "version": "0.19.6", "kind": "built-wheel"}],
        "upstream": {"commit": upstream.PINNED_COMMIT, "file": wheelhouse.BUNDLE_NAME},
    }


def test_doctor_says_what_the_wheelhouse_would_give_a_node_that_lacks_a_pin(facts, tmp_path):
    if facts["packages"].get("deepspeed") is None:
        pytest.skip("deepspeed is not installed here: run `make setup`")
    pin = facts["packages"]["deepspeed"]
    node_python = ".".join(facts["python"]["version"].split(".")[:2])
    found = wheelhouse.Found(tmp_path / "wh", _manifest(node_python))
    cell = _node(facts, _expectation(facts, found), deepspeed=None)["deepspeed"]
    assert cell.status == "fail"
    assert cell.fix.startswith(
        f"the node lacks deepspeed=={pin} (not installed): `make setup WHEELS={tmp_path / 'wh'}`"
        " there, no network needed (the wheelhouse holds deepspeed 0.19.6 for Python"
    )
    cell = _node(facts, _expectation(facts, found), deepspeed="0.19.7")["deepspeed"]
    assert f"lacks deepspeed=={pin} (it has 0.19.7): `make setup WHEELS=" in cell.fix
    found.manifest["leaves_out"] = [{"name": "torch", "why": "torch", "listed": False}]
    cell = _node(facts, _expectation(facts, found), deepspeed=None)["deepspeed"]
    assert f"`make setup TORCH=system WHEELS={tmp_path / 'wh'}` there" in cell.fix
    del found.manifest["leaves_out"]
    other = wheelhouse.Found(tmp_path / "wh", _manifest("2.7"))
    cell = _node(facts, _expectation(facts, other), deepspeed=None)["deepspeed"]
    assert f"is for Python 2.7, not this node's {node_python}: `make wheelhouse PY=" in cell.fix
    cell = _node(facts, _expectation(facts, None), deepspeed=None)["deepspeed"]
    assert "`make wheelhouse` on a machine with network" in cell.fix
    assert "`make setup WHEELS=<folder>` there" in cell.fix


def test_doctor_offers_the_wheelhouse_for_a_node_without_upstream(facts, tmp_path):
    node_python = ".".join(facts["python"]["version"].split(".")[:2])
    found = wheelhouse.Found(tmp_path / "wh", _manifest(node_python))
    exp = _expectation(facts, found)
    if exp.reference["upstream"].get("commit") != upstream.PINNED_COMMIT:
        pytest.skip("upstream is not at the pinned commit here: run `make setup`")
    node = json.loads(json.dumps(facts))
    node["upstream"] = {"path": "/nowhere", "present": False, "commit": None}
    row = verdicts.judge("node2", "node2", 1, transport.Reply(True, node, "", 0), exp)
    cell = next(f for f in row.findings if f.check == "upstream")
    assert cell.status == "fail"
    assert f"the node lacks upstream at {upstream.PINNED_COMMIT[:8]}: `make setup WHEELS=" in (
        cell.fix
    )
    assert f"holds upstream {upstream.PINNED_COMMIT[:8]} ({wheelhouse.BUNDLE_NAME})" in cell.fix


# --- TORCH=system on a venv ----------------------------------------------------------------


def test_system_python_that_is_a_venv_is_seen_through_the_new_venv(tmp_path):
    base = getattr(sys, "_base_executable", sys.executable)
    site = tmp_path / "site"
    subprocess.run([base, "-m", "venv", "--without-pip", str(site)], check=True)
    site_python = site / "bin" / "python"
    purelib = subprocess.run(
        [str(site_python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(purelib) / "site_torch_marker.py").write_text("WHERE = 'site venv'\n")
    venv = tmp_path / "venv"
    subprocess.run(
        [str(site_python), "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
        check=True,
    )
    probe_import = [str(venv / "bin" / "python"), "-c", "import site_torch_marker"]
    plain = subprocess.run(probe_import, capture_output=True, text=True, check=False)
    assert plain.returncode != 0, "a venv made from a venv does not see that venv's packages"
    res = subprocess.run(
        [str(site_python), "-m", "launchers.config.torch_check", "chain", str(venv)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert f"{site_python} is a venv" in res.stdout
    assert subprocess.run(probe_import, capture_output=True, check=False).returncode == 0
    order = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import sys; print(sys.path)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert order.index(str(venv)) < order.index(purelib), "the venv's own packages come first"
    shutil.rmtree(site)


def test_chain_does_nothing_for_an_interpreter_that_is_not_a_venv(tmp_path):
    base = getattr(sys, "_base_executable", sys.executable)
    res = subprocess.run(
        [base, "-m", "launchers.config.torch_check", "chain", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert res.stdout == "" and not list(tmp_path.rglob(torch_check.CHAIN_PTH))


# --- a node's own PyTorch and packages: TORCH=system, HAVE= -----------------------------------


@pytest.fixture
def torch_index(tmp_path, monkeypatch, offline_pip) -> tuple[Path, Path, Path]:
    """A local index with stand-ins for torch and torchvision (each with a dependency of its own
    and one shared with a pin), a pin that needs a dependency with an extra, and pins naming them.
    """
    index = tmp_path / "index"
    index.mkdir()
    make_wheel(index, "torch", "9.0", requires=("mdswtri==1.0", "mdswdep>=2"))
    make_wheel(index, "torchvision", "9.1", requires=("torch==9.0", "mdswimg"))
    make_wheel(index, "mdswtri", "1.0")
    make_wheel(index, "mdswimg", "1.0")
    make_wheel(index, "mdswdep", "2.0")
    make_wheel(index, "mdswdemo", "1.0", requires=("mdswdep", "mdswopt[fast]"))
    make_wheel(index, "mdswopt", "1.0", requires=('mdswfast; extra == "fast"',), extras="fast")
    make_wheel(index, "mdswfast", "1.0")
    make_sdist(index)
    copy_pip(index)
    repo, _ = make_upstream(tmp_path, monkeypatch)
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("torch==9.0\ntorchvision==9.1\nmdswdemo==1.0\nmdswsrc==0.1\n")
    return index, repo, requirements


def _build(tmp_path: Path, index: Path, repo: Path, requirements: Path, **kw) -> dict:
    args = ("--no-index", "--find-links", str(index))
    return wheelhouse.build(
        tmp_path / "house", requirements, TARGET, repo=str(repo), index_args=args,
        log=lambda _m: None, **kw,
    )  # fmt: skip


def test_torch_system_leaves_out_torch_and_what_only_it_requires(torch_index, tmp_path):
    index, repo, requirements = torch_index
    manifest = _build(tmp_path, index, repo, requirements, torch_system=True)
    folder = tmp_path / "house"
    names = {e["name"] for e in manifest["files"]}
    assert names == {"mdswdemo", "mdswdep", "mdswopt", "mdswfast", "mdswsrc", "pip"}
    left = {e["name"]: e for e in manifest["leaves_out"]}
    assert set(left) == {"torch", "torchvision", "mdswtri", "mdswimg"}
    assert {e["why"] for e in left.values()} == {"torch"} and left["mdswtri"]["version"] == "1.0"
    assert not [p for p in folder.glob("*.whl") if p.name.startswith(("torch", "mdswtri"))]
    assert manifest["torch_system"] is True and manifest["have"] is None
    checked = wheelhouse.verify(folder, requirements, system=True)
    text = wheelhouse.constraints(checked)
    assert "mdswdep==2.0\n" in text and "torch" not in text and "mdswtri" not in text
    with pytest.raises(wheelhouse.WheelhouseError, match="make setup TORCH=system WHEELS="):
        wheelhouse.verify(folder, requirements)
    assert "leaving 4 distributions to the node" in wheelhouse.summary(folder, manifest)
    assert " MiB, " in wheelhouse.summary(folder, manifest)


def test_have_leaves_out_what_the_node_has_and_what_only_that_requires(torch_index, tmp_path):
    index, repo, requirements = torch_index
    have = tmp_path / "freeze.txt"
    have.write_text("# pip freeze\nmdswopt==0.9\nmdswsrc @ file:///src\n-e git+x#egg=y\ntorch\n")
    manifest = _build(tmp_path, index, repo, requirements, torch_system=True, have=have)
    names = {e["name"] for e in manifest["files"]}
    assert names == {"mdswdemo", "mdswdep", "pip"}
    left = {e["name"]: (e["why"], e["node_has"], e["listed"]) for e in manifest["leaves_out"]}
    assert left["mdswopt"] == ("node", "0.9", True)  # the node's 0.9 is used, not the pin's
    assert left["mdswfast"] == ("node", None, False)  # needed only by mdswopt[fast]
    assert left["mdswsrc"] == ("node", None, True) and left["torch"] == ("torch", None, True)
    assert manifest["have"]["packages"] == 3
    with pytest.raises(wheelhouse.WheelhouseError, match="leaves mdswopt, mdswsrc to the node"):
        wheelhouse.verify(tmp_path / "house", requirements, system=True)
    have.write_text("mdswdemo==1.0\nnumpy>=2\n")
    with pytest.raises(wheelhouse.WheelhouseError, match=r"freeze.txt:2: 'numpy>=2' is not a `pip"):
        _build(tmp_path, index, repo, requirements, have=have)


def test_the_closure_follows_extras_and_stops_at_what_is_provided():
    def dist(name: str, *requires: str, extras: tuple[str, ...] = ()) -> provided.Resolved:
        edges = tuple(provided.edge(r) for r in requires)
        return provided.Resolved(name, "1", edges, frozenset(extras))

    graph = {
        d.name: d
        for d in (
            dist("torch", "triton", "sympy", "filelock", 'numpy; extra == "opt"'),
            dist("triton"), dist("sympy", "mpmath"), dist("mpmath"), dist("filelock"),
            dist("numpy"), dist("app", "filelock", "lib[fast]"),
            dist("lib", 'fastdep ; python_version >= "3" and extra == "fast"', 'slowdep; extra == "slow"'),  # noqa: E501
            dist("fastdep"), dist("slowdep"), dist("have-it", "only-theirs"), dist("only-theirs"),
        )
    }  # fmt: skip
    roots = {"torch", "app", "have-it"}
    parts = provided.split(graph, roots, torch_system=True, have={"have-it", "absent"})
    assert parts.keep == {"app", "filelock", "lib", "fastdep"}
    assert parts.torch == {"torch", "triton", "sympy", "mpmath"}
    assert parts.node == {"have-it", "only-theirs", "numpy", "slowdep"}
    everything = provided.split(graph, roots, torch_system=False, have=set())
    assert everything.keep == set(graph) - {"numpy", "slowdep"} and not everything.torch
    assert provided.edge("Foo.Bar[X,y] (>=1) ; extra == 'z'") == provided.Edge(
        "foo-bar", frozenset({"x", "y"}), frozenset({"z"})
    )


def test_system_setup_uses_the_pins_the_interpreter_has_and_warns_of_other_versions(tmp_path):
    source = tmp_path / "requirements.txt"
    source.write_text("torch==2.14.1\npytest==0.0.1\nmdsw-not-installed==1.0\n")
    out = torch_check.requirements_without_torch(source, tmp_path / "r.txt", leave_present=True)
    assert out.read_text() == "mdsw-not-installed==1.0\n"
    assert torch_check.present(source) == [f"pytest {pytest.__version__}"]
    (warning,) = torch_check.pin_warnings(torch_check.pinned(source))
    assert warning.startswith(
        f"pytest {pytest.__version__} is installed, requirements.txt pins 0.0.1"
    )
    assert torch_check.pin_warnings({"pytest": pytest.__version__}) == []
