"""Setup: locating, checking and cloning upstream; the offline dataset."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from launchers.config import upstream
from launchers.config.upstream import PINNED_COMMIT, UpstreamError, check_upstream

REAL = check_upstream()
needs_upstream = pytest.mark.skipif(
    not REAL.ok, reason=f"upstream not usable here: {REAL.message()}"
)


def test_cache_dirs_follow_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("MDS_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.delenv("MEGATRON_DEEPSPEED_DIR", raising=False)
    assert upstream.upstream_dir() == tmp_path / "c" / "Megatron-DeepSpeed"
    assert upstream.tiny_data().vocab_file == tmp_path / "c" / "data" / "tiny" / "vocab.json"
    monkeypatch.setenv("MEGATRON_DEEPSPEED_DIR", str(tmp_path / "elsewhere"))
    assert upstream.upstream_dir() == tmp_path / "elsewhere"


def test_missing_upstream_says_run_make_setup(tmp_path):
    status = check_upstream(tmp_path / "nothing")
    assert not status.ok
    assert "make setup" in status.message()
    assert str(tmp_path / "nothing") in status.message()
    with pytest.raises(UpstreamError, match="run `make setup`"):
        upstream.require_upstream(tmp_path / "nothing")


def test_wrong_commit_is_named(tmp_path):
    repo = tmp_path / "md"
    repo.mkdir()
    (repo / "pretrain_gpt.py").write_text("# placeholder\n")
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run(["git", "add", "."], cwd=repo, check=True)
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"],
        cwd=repo,
        check=True,
    )
    status = check_upstream(repo)
    assert status.present and not status.ok
    assert status.commit and status.commit != PINNED_COMMIT
    assert f"not the pinned {PINNED_COMMIT[:12]}" in status.message()


def test_clone_failure_says_what_to_do(monkeypatch, tmp_path):
    monkeypatch.setenv("MEGATRON_DEEPSPEED_DIR", str(tmp_path / "md"))
    monkeypatch.setenv("MEGATRON_DEEPSPEED_REPO", str(tmp_path / "no-such-repo"))
    with pytest.raises(UpstreamError, match="Set MEGATRON_DEEPSPEED_REPO"):
        upstream.ensure_upstream(log=lambda _m: None)
    assert not (tmp_path / "md").exists(), "a failed clone must not leave a broken directory"


@needs_upstream
def test_clone_from_local_path_at_pinned_commit_then_reuse(monkeypatch, tmp_path):
    monkeypatch.setenv("MEGATRON_DEEPSPEED_DIR", str(tmp_path / "md"))
    monkeypatch.setenv("MEGATRON_DEEPSPEED_REPO", str(REAL.path))
    said: list[str] = []
    status = upstream.ensure_upstream(log=said.append)
    assert status.ok and status.commit == PINNED_COMMIT
    assert any("cloning" in m for m in said)
    said.clear()
    assert upstream.ensure_upstream(log=said.append).ok
    assert said == [f"upstream: reusing {tmp_path / 'md'} at {PINNED_COMMIT[:12]}"]


def test_corpus_is_deterministic(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    upstream.generate_corpus(a, documents=50)
    upstream.generate_corpus(b, documents=50)
    assert a.read_bytes() == b.read_bytes()
    docs = [json.loads(line) for line in a.read_text().splitlines()]
    assert len(docs) == 50 and all(d["text"].endswith(".") for d in docs)


@needs_upstream
def test_built_dataset_is_usable():
    data = upstream.tiny_data()
    if not data.exists():
        pytest.skip("tiny dataset not built: run `make setup`")
    vocab = json.loads(data.vocab_file.read_text())
    assert "<|endoftext|>" in vocab
    assert 256 < len(vocab) <= upstream.TOKENIZER_VOCAB
    merges = data.merge_file.read_text().splitlines()
    assert merges[0].startswith("#version")
    # upstream's indexed dataset: header magic of the MMap format.
    assert Path(f"{data.data_prefix}.idx").read_bytes()[:9] == b"MMIDIDX\x00\x00"


def _fresh_clone(tmp_path: Path) -> Path:
    """A checkout of the pinned commit without built helpers (git clone of the real one)."""
    clone = tmp_path / "md"
    subprocess.run(["git", "clone", "--quiet", "--no-checkout", str(REAL.path), str(clone)],
                   check=True)  # fmt: skip
    subprocess.run(["git", "-C", str(clone), "checkout", "--quiet", PINNED_COMMIT], check=True)
    return clone


@needs_upstream
@pytest.mark.slow
def test_helpers_build_with_the_venv_even_when_python3_on_path_lacks_pybind11(
    monkeypatch, tmp_path
):
    clone = _fresh_clone(tmp_path)
    assert not upstream.helpers_work(clone)[0]
    # The system's python3 as a newcomer has it: first on PATH, no pybind11.
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "python3").write_text("#!/bin/sh\necho 'No module named pybind11' >&2\nexit 1\n")
    (fake_bin / "python3").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake_bin}:{os.environ['PATH']}")
    plain = subprocess.run(["make", "-C", str(clone / "megatron" / "data")],
                           capture_output=True, text=True)  # fmt: skip
    assert plain.returncode != 0, "upstream's Makefile alone must fail here (the original bug)"
    subprocess.run(["git", "-C", str(clone), "clean", "-qfx"], check=True)

    said: list[str] = []
    library = upstream.ensure_helpers(clone, log=said.append)
    assert library == upstream.helpers_library(clone) and library.is_file()
    assert upstream.helpers_work(clone)[0]
    assert said[0].startswith(f"helpers: building {library.name} with {sys.executable}")
    assert said[-1] == (
        f"helpers: built {library} (g++, upstream's flags; works with {sys.executable})"
    )
    said.clear()
    upstream.ensure_helpers(clone, log=said.append)
    assert said == [f"helpers: reusing {library} (works with {sys.executable})"]


def test_helpers_that_do_not_import_are_named(tmp_path):
    (tmp_path / "megatron" / "data").mkdir(parents=True)
    ok, why = upstream.helpers_work(tmp_path)
    assert not ok and str(upstream.helpers_library(tmp_path)) in why
    upstream.helpers_library(tmp_path).write_bytes(b"not an ELF file")
    ok, why = upstream.helpers_work(tmp_path)
    assert not ok and "ImportError" in why


CRASH_HEADER = Path(__file__).parent / "fixtures" / "crashing-cxx" / "crash.h"


@needs_upstream
@pytest.mark.slow
def test_helpers_that_crash_when_called_are_rebuilt_another_way(monkeypatch, tmp_path):
    """On an H200 machine, modules built by the image's CXX (/opt/gcc/bin/g++) imported and then
    died of SIGSEGV in build_sample_idx, with its C++ runtime linked in too; the system's g++
    built one that works. Here a compiler whose modules die unless the runtime is linked in."""
    clone = _fresh_clone(tmp_path)
    real = shutil.which("g++")
    assert real, "g++ is needed to build upstream's helpers"
    fake = tmp_path / "bin" / "crashing-g++"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\n"
        f'case " $* " in *" -static-libstdc++ "*) exec {real} "$@";; esac\n'
        f'exec {real} -include {CRASH_HEADER} "$@"\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("CXX", str(fake))
    said: list[str] = []
    library = upstream.ensure_helpers(clone, log=said.append)
    assert said[1] == (
        f"helpers: {fake}, upstream's flags: built, but build_sample_idx died of SIGSEGV; "
        "trying the next build"
    )
    assert said[2] == (
        f"helpers: built {library} ({fake}, its C++ runtime linked in; works with {sys.executable})"
    )
    assert upstream.helpers_work(clone) == (True, "")


def test_helpers_builds_try_other_compilers_last(monkeypatch):
    monkeypatch.delenv("CXX", raising=False)
    builds = upstream.helpers_builds("g++")
    assert builds[0] == ("g++, upstream's flags", [])
    assert builds[1][1] == [
        f"CXXFLAGS={upstream.MAKEFILE_CXXFLAGS} -static-libstdc++ -static-libgcc"
    ]
    others = [extra for _, extra in builds[2:]]
    assert all(len(e) == 1 and e[0].startswith("CXX=") for e in others)
    gxx = os.path.realpath(shutil.which("g++"))
    assert gxx not in {os.path.realpath(e[0].removeprefix("CXX=")) for e in others}
