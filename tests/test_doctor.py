"""The doctor: the probe on this machine, every verdict and its fix, the gate before runs, the
GPU prerequisites; and, as root, a real emulated lab with one node broken at a time.

How a lab node is broken: every node shares this machine's filesystem, so the test changes what
one node sees at the run's own paths with a bind mount inside that node's mount namespace. The
node's sshd runs under ``ip netns exec``, which gives it a mount namespace of its own (with
``/`` a slave of the host's), and every ssh session (so pdsh's, so the doctor's and the run's)
inherits it: ``nsenter --target <sshd> --mount mount --bind ...`` changes the view of that node
only, exactly as a node with its own disk would differ. Nothing on the host changes.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from launchers.cli import main as cli_main
from launchers.config import gpu, probe
from launchers.config.hostfile import parse_hostfile_text
from launchers.config.presets import default_paths, resolve_spec
from launchers.config.project import megatron_args
from launchers.config.spec import PLACEHOLDER_PATHS
from launchers.config.upstream import PINNED_COMMIT, check_upstream
from launchers.doctor import check as doctor
from launchers.doctor import transport, verdicts

ROOT = Path(__file__).resolve().parents[1]
PATHS = default_paths()
UPSTREAM = check_upstream(Path(PATHS.upstream_dir))
DATA_READY = all(
    Path(p).is_file()
    for p in (PATHS.data_path + ".bin", PATHS.data_path + ".idx", PATHS.vocab_file,
              PATHS.merge_file)
)  # fmt: skip
needs_setup = pytest.mark.skipif(
    not (UPSTREAM.ok and DATA_READY),
    reason=f"upstream or the tiny dataset not ready here ({UPSTREAM.message() or 'no data'}): "
    "run `make setup`",
)


def request(
    device: str = "cpu", logs: Path = ROOT / "logs", **ifnames: str
) -> transport.ProbeRequest:
    return transport.request_for(PATHS, device, logs, ifnames)


@pytest.fixture(scope="module")
def here() -> dict[str, Any]:
    """This machine's facts from the real probe (CPU request)."""
    reply = transport.probe_local(probe.command(sys.executable, request().to_json()))
    assert reply.facts is not None, reply.error
    return reply.facts


def expectation(facts: dict[str, Any], device: str = "cpu", **kwargs: Any) -> verdicts.Expectation:
    route = kwargs.pop("route", transport.Route("pdsh", {}, None, "pdsh over ssh"))
    return verdicts.Expectation(facts, request(device, **kwargs), PINNED_COMMIT, True, route,
                              "hostfiles/test")  # fmt: skip


def row(facts: dict[str, Any] | None, exp: verdicts.Expectation, reached: bool = True, **kw: Any):
    reply = transport.Reply(reached, facts, kw.pop("error", ""), kw.pop("exit_status", 0))
    return verdicts.judge("node1", "node1", kw.pop("slots", 1), reply, exp)


def failing(report: verdicts.NodeReport) -> dict[str, verdicts.Finding]:
    return {f.check: f for f in report.findings if f.status == "fail"}


# --------------------------------------------------------------------------- the probe here


def test_probe_reports_what_pip_reports(here: dict[str, Any]) -> None:
    for name in probe.PACKAGES:
        assert here["packages"][name] == importlib.metadata.version(name)
    assert here["python"]["executable"] == sys.executable
    assert here["python"]["version"] == ".".join(map(str, sys.version_info[:3]))
    assert here["disk"]["free_bytes"] > 0
    assert "lo" in here["interfaces"]


@needs_setup
def test_probe_reads_upstream_commit_and_data(here: dict[str, Any]) -> None:
    assert here["upstream"] == {
        "path": PATHS.upstream_dir,
        "present": True,
        "commit": PINNED_COMMIT,
    }
    assert all(f["file"] and f["size"] > 0 for f in here["files"].values())


def test_probe_output_is_found_behind_launcher_prefixes() -> None:
    line = probe.MARKER + json.dumps({"hostname": "n"})
    assert probe.parse_output(f"banner\n10.0.0.2: {line}\n") == {"hostname": "n"}
    assert probe.parse_output("no marker here\n") is None
    assert probe.parse_output(probe.MARKER + "{not json\n") is None


def test_probe_runs_on_the_standard_library_alone(tmp_path: Path) -> None:
    """A node whose interpreter has none of the venv's packages (``-S``: no site-packages)."""
    python, *rest = probe.command(sys.executable, request(logs=tmp_path).to_json())
    reply = transport.probe_local([python, "-S", *rest])
    assert reply.facts is not None, reply.error
    assert reply.facts["packages"] == {name: None for name in probe.PACKAGES}
    assert reply.facts["torch_cuda_build"] is None


# --------------------------------------------------------------------------- verdicts


@needs_setup
def test_a_node_like_this_one_passes(here: dict[str, Any]) -> None:
    report = row(here, expectation(here))
    assert report.ok, report.findings
    assert report.finding("upstream").text == PINNED_COMMIT[:8]


@needs_setup
@pytest.mark.parametrize(
    ("change", "check", "fix"),
    [
        (lambda f: f["packages"].update(deepspeed="0.16.9"), "deepspeed",
         r"deepspeed 0\.16\.9 there, .* on the launching node: install the pinned requirements"),
        (lambda f: f["packages"].update(torch=None), "torch", "torch is not installed there"),
        (lambda f: f["python"].update(version="3.8.10"), "python", "python 3.8.10 there"),
        (lambda f: f["upstream"].update(commit="0" * 40), "upstream",
         rf"at 0{{40}}, the launching node's at {PINNED_COMMIT}: `git -C .* checkout --detach"),
        (lambda f: f["upstream"].update(present=False), "upstream", "no pretrain_gpt.py in"),
        (lambda f: f["files"]["vocab_file"].update(file=False, size=None), "data",
         "missing vocab_file .*: run `make setup` on that node"),
        (lambda f: f["files"]["data_path (.bin)"].update(size=1), "data", "other files than here"),
        (lambda f: f["disk"].update(free_bytes=10 << 20), "disk", "free space or give --logs"),
        (lambda f: f["disk"].update(writable=False), "disk", "not writable"),
        (lambda f: f["launcher_script"].update(exists=False), "deepspeed",
         "the deepspeed launcher .* is missing"),
    ],
    ids=["deepspeed-version", "no-torch", "python-version", "upstream-commit", "no-upstream",
         "no-vocab", "other-data", "disk-full", "read-only", "no-launcher"],
)  # fmt: skip
def test_each_broken_fact_fails_its_cell_with_the_fix(here, change, check, fix) -> None:
    broken = json.loads(json.dumps(here))
    change(broken)
    report = row(broken, expectation(here))
    bad = failing(report)
    assert list(bad) == [check], report.findings
    assert __import__("re").search(fix, bad[check].fix), bad[check].fix


def test_unreachable_node_names_host_and_ssh_fix(here: dict[str, Any]) -> None:
    said = "ssh: connect to host node1 port 22: Connection refused\nssh exited with exit code 255"
    report = row(None, expectation(here), reached=False, error=said)
    assert failing(report) == {"reach": report.finding("reach")}
    assert report.finding("reach").fix.startswith("ssh: connect to host node1 port 22")
    assert "make `ssh node1 true` work" in report.finding("reach").fix
    lab = expectation(here, route=transport.Route("lab-ssh", {}, None, "lab"))
    assert "recreate the lab" in row(None, lab, reached=False, error=said).finding("reach").fix
    by_hand = expectation(here, route=transport.Route("ssh", {}, None, "no_ssh", required=False))
    assert row(None, by_hand, reached=False, error=said).ok  # no_ssh nodes start by hand


def test_missing_interpreter_on_the_node(here: dict[str, Any]) -> None:
    said = "bash: line 1: /work/venv/bin/python: No such file or directory"
    report = row(None, expectation(here), reached=True, error=said, exit_status=127)
    assert list(failing(report)) == ["python"]
    assert "the run starts that interpreter on every node" in report.finding("python").fix


def test_cuda_on_a_cpu_only_node(here: dict[str, Any]) -> None:
    facts = dict(here)
    facts["cuda"] = {"torch_version": "2.14.1+cu130", "available": False, "count": 0,
                     "cuda_home": None, "apex": {m: "ModuleNotFoundError: No module named 'apex'"
                                                 for m in probe.APEX_MODULES}}  # fmt: skip
    report = row(facts, expectation(here, "cuda"), slots=2)
    bad = failing(report)
    assert {"accelerator", "cuda"} <= set(bad)
    assert bad["accelerator"].text == "0 GPUs < slots 2"
    assert "sees no GPU for slots=2" in bad["accelerator"].fix
    assert "make setup DEVICE=cuda" in bad["cuda"].fix and "no CUDA toolkit" in bad["cuda"].fix


def test_pypi_apex_is_named_as_the_wrong_package(here: dict[str, Any]) -> None:
    facts = dict(here)
    facts["cuda"] = {"torch_version": "2.14.1", "count": 1, "cuda_home": None,
                     "apex_origin": "/venv/lib/site-packages/apex/__init__.py",
                     "apex": {"apex.normalization": "ModuleNotFoundError: No module named "
                              "'apex.normalization'"}}  # fmt: skip
    fix = row(facts, expectation(here, "cuda")).finding("cuda").fix
    assert "is not NVIDIA apex (PyPI's 'apex' is unrelated): `pip uninstall apex`" in fix


@pytest.mark.parametrize(
    ("variable", "value", "ok"),
    [
        ("NCCL_SOCKET_IFNAME", "eth", True),  # NCCL: a prefix
        ("NCCL_SOCKET_IFNAME", "=eth", False),  # '=': the exact name
        ("NCCL_SOCKET_IFNAME", "=eth0", True),
        ("NCCL_SOCKET_IFNAME", "ib0,eth1", False),
        ("NCCL_SOCKET_IFNAME", "^docker,lo", True),  # exclusions leave the rest
        ("GLOO_SOCKET_IFNAME", "eth", False),  # gloo: exact names
        ("GLOO_SOCKET_IFNAME", "eth0", True),
    ],
)
def test_interface_names_follow_nccl_and_gloo_grammar(variable: str, value: str, ok: bool) -> None:
    assert verdicts.interface_matches(variable, value, ["eth0", "lo"])[0] is ok


def test_unknown_interface_fails_with_the_interfaces_the_node_has(here: dict[str, Any]) -> None:
    exp = expectation(here, NCCL_SOCKET_IFNAME="ib9")
    cell = row(here, exp).finding("ifname")
    assert cell.status == "fail" and "NCCL_SOCKET_IFNAME=ib9 selects no interface" in cell.fix
    assert "lo" in cell.fix


# --------------------------------------------------------------------------- through pdsh


def test_unresolvable_hosts_through_pdsh_are_named() -> None:
    if shutil.which("pdsh") is None:
        pytest.skip("pdsh not installed (apt-get install -y pdsh)")
    cluster = parse_hostfile_text("nohost-a.invalid slots=1\nnohost-b.invalid slots=1\n", "hf")
    route = transport.Route("pdsh", {}, None, "pdsh over ssh")
    report = doctor.diagnose(cluster, request(), sys.executable, route)
    assert not report.ok
    for node in report.nodes:
        cell = node.finding("reach")
        assert cell.status == "fail" and f"Could not resolve hostname {node.host}" in cell.fix
    text = report.render()
    assert "nohost-a.invalid: reach: ssh: Could not resolve hostname" in text
    assert "2 of 2 node(s) not ready" in text


# --------------------------------------------------------------------------- cache


def test_passing_results_are_cached_for_a_short_time(monkeypatch, tmp_path, here) -> None:
    monkeypatch.setenv("MDS_CACHE_DIR", str(tmp_path))
    node = verdicts.NodeReport("n", "n", 1, (verdicts.Finding("reach", "ok", "yes"),))
    report = doctor.Report("hf", "pdsh", "cpu", here, (node,), 0.5)
    doctor.store("k", report)
    again = doctor.load_cached("k")
    assert again is not None and again.nodes == report.nodes and again.cached_at
    assert doctor.load_cached("k", now=time.time() + transport.CACHE_TTL_S + 1) is None
    bad = replace(
        report, nodes=(replace(node, findings=(verdicts.Finding("reach", "fail", "x"),)),)
    )
    doctor.store("bad", bad)
    assert doctor.load_cached("bad") is None, "a failing result must be measured again"


def test_cache_key_changes_with_what_the_result_depends_on() -> None:
    one = parse_hostfile_text("a slots=1\nb slots=1\n", "hf")
    two = parse_hostfile_text("a slots=1\nb slots=2\n", "hf")
    route = transport.Route("pdsh")
    keys = {
        doctor.cache_key(one, request(), "/py", route, True),
        doctor.cache_key(two, request(), "/py", route, True),
        doctor.cache_key(one, request("cuda"), "/py", route, True),
        doctor.cache_key(one, request(), "/other/py", route, True),
        doctor.cache_key(one, request(), "/py", transport.Route("ssh"), True),
        doctor.cache_key(one, request(), "/py", route, False),
    }
    assert len(keys) == 6


# --------------------------------------------------------------------------- the gate


@needs_setup
def test_multinode_run_with_unreachable_hosts_is_refused_before_a_run_directory(
    tmp_path: Path, capsys
) -> None:
    if shutil.which("pdsh") is None:
        pytest.skip("pdsh not installed (apt-get install -y pdsh)")
    logs = tmp_path / "logs"
    argv = ["run", "--model", "small", "--strategy", "pipeline", "--hosts",
            str(ROOT / "hostfiles" / "2node"), "--logs", str(logs), "--device", "cpu"]  # fmt: skip
    assert cli_main(argv) == 2
    out, err = capsys.readouterr()
    assert "node1: reach: ssh: Could not resolve hostname node1" in out
    assert "error: doctor: 2 of 2 nodes not ready, nothing was started; first: node1" in err
    assert "--skip-doctor" in err
    assert not logs.exists(), "no run directory before the doctor passes"


def test_skip_doctor_does_not_probe(monkeypatch, tmp_path: Path) -> None:
    called = []
    monkeypatch.setattr(doctor, "check_before_run", lambda *a, **k: called.append(a))
    monkeypatch.setattr("launchers.cli.preflight", lambda *a, **k: [])
    monkeypatch.setattr("launchers.cli.run_specs", lambda *a, **k: [])
    hosts = str(ROOT / "hostfiles" / "2node")
    base = ["run", "--model", "small", "--strategy", "pipeline", "--hosts", hosts,
            "--logs", str(tmp_path), "--device", "cpu"]  # fmt: skip
    assert cli_main([*base, "--skip-doctor"]) == 0 and not called
    assert cli_main(base) == 0 and len(called) == 1


def test_single_local_run_needs_no_doctor_but_a_matrix_does() -> None:
    local = parse_hostfile_text("localhost slots=2\n", "hf")
    spec = resolve_spec("tiny", "baseline", local, device="cpu", paths=PLACEHOLDER_PATHS)
    assert not doctor.needs_doctor([spec], matrix=False)
    assert doctor.needs_doctor([spec], matrix=True)
    two = parse_hostfile_text("a slots=1\nb slots=1\n", "hf")
    spec2 = resolve_spec("tiny", "baseline", two, device="cpu", paths=PLACEHOLDER_PATHS)
    assert doctor.needs_doctor([spec2], matrix=False)


# --------------------------------------------------------------------------- GPU prerequisites


NVCC_13 = """nvcc: NVIDIA (R) Cuda compiler driver
Copyright (c) 2005-2025 NVIDIA Corporation
Cuda compilation tools, release 13.0, V13.0.88
Build cuda_13.0.r13.0/compiler.36424714_0
"""


def toolkit(nvcc_output: str | None, torch_cuda: str | None = "13.0", **cuda: Any) -> gpu.Toolkit:
    facts = {"torch_version": "2.14.1", "cuda_home": "/usr/local/cuda", "nvcc": "/x/bin/nvcc",
             "nvcc_output": nvcc_output, "nvcc_rc": 0 if nvcc_output else None, **cuda}  # fmt: skip
    return gpu.Toolkit.from_facts(facts, torch_cuda)


def test_nvcc_release_is_read_from_its_banner() -> None:
    assert gpu.parse_nvcc_release(NVCC_13) == (13, 0)
    assert gpu.parse_nvcc_release("Cuda compilation tools, release 12.4, V12.4.131") == (12, 4)
    assert gpu.parse_nvcc_release("garbage") is None


def test_real_nvcc_when_present() -> None:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("no nvcc on PATH")
    out = subprocess.run([nvcc, "-V"], capture_output=True, text=True).stdout
    assert gpu.parse_nvcc_release(out) is not None


@pytest.mark.parametrize(
    ("tk", "problem", "apex_problem"),
    [
        (toolkit(NVCC_13), "", ""),
        (toolkit(NVCC_13.replace("13.0", "12.4")), "torch builds no extension across major", "x"),
        (toolkit(NVCC_13.replace("13.0", "13.1")), "", "refuses any other version than torch's"),
        (toolkit(None, cuda_home=None), "no CUDA toolkit", "x"),
        (toolkit(None), "has no working bin/nvcc", "x"),
        (toolkit(NVCC_13, None), "is a CPU build", "x"),
        (toolkit(NVCC_13, headers={"missing": ["cusparse.h"], "wheel_include": ["/w/include"]}),
         "export CPATH=/w/include", "x"),
        (toolkit(NVCC_13, headers={"missing": ["cusparse.h"]},
                 other_homes={"/usr/local/cuda-13.0": []}),
         "export CUDA_HOME=/usr/local/cuda-13.0", "x"),
    ],
    ids=["match", "major", "minor", "none", "broken-nvcc", "cpu-torch", "headers-in-wheel",
         "fuller-home"],
)  # fmt: skip
def test_toolkit_verdicts_name_the_toolkit_and_cuda_home(tk, problem, apex_problem) -> None:
    assert (problem in tk.problem) if problem else tk.problem == ""
    if apex_problem == "x":
        assert tk.apex_build_problem == tk.problem
    elif apex_problem:
        assert apex_problem in tk.apex_build_problem
    else:
        assert tk.apex_build_problem == ""
    if tk.problem and tk.torch_cuda and "CPATH" not in problem and "fuller" not in problem:
        assert "CUDA_HOME" in tk.problem


def test_missing_wgrad_extension_turns_fusion_off_with_the_reason() -> None:
    two = parse_hostfile_text("a slots=1\nb slots=1\n", "hf")
    spec = resolve_spec("small", "pipeline", two, device="cuda", paths=PLACEHOLDER_PATHS)
    assert "--no-gradient-accumulation-fusion" not in megatron_args(spec, "/r")
    adjust = gpu.cuda_adjustments("/venv/bin/python", probe=lambda _p: False)
    assert [a.key for a in adjust] == ["gradient_accumulation_fusion"]
    assert "layers.py:592" in adjust[0].reason and "make setup DEVICE=cuda" in adjust[0].reason
    off = replace(spec, adjustments=tuple(adjust))
    assert "--no-gradient-accumulation-fusion" in megatron_args(off, "/r")
    assert gpu.cuda_adjustments("/venv/bin/python", probe=lambda _p: None) == []
    assert gpu.cuda_adjustments("/venv/bin/python", probe=lambda _p: True) == []


def test_resolver_records_the_adjustment_from_this_interpreter() -> None:
    two = parse_hostfile_text("a slots=1\nb slots=1\n", "hf")
    spec = resolve_spec("small", "pipeline", two, device="cuda",
                        paths=replace(PLACEHOLDER_PATHS, python=sys.executable))  # fmt: skip
    has = gpu.wgrad_extension_importable(sys.executable)
    keys = [a.key for a in spec.adjustments]
    assert ("gradient_accumulation_fusion" in keys) is (has is False)
    assert ("--no-gradient-accumulation-fusion" in megatron_args(spec, "/r")) is (has is False)


def test_upstream_needs_cite_lines_that_exist() -> None:
    if not UPSTREAM.ok:
        pytest.skip(f"upstream not ready: {UPSTREAM.message()}")
    root = Path(PATHS.upstream_dir)
    for need in gpu.UPSTREAM_NEEDS:
        for ref in need.where.split(", "):
            path, _, lines = ref.partition(":")
            text = (root / path).read_text().splitlines()
            first = int(lines.split(",")[0].split("-")[0])
            assert first <= len(text), ref
    layers = (root / "megatron/core/tensor_parallel/layers.py").read_text().splitlines()
    assert "fused_weight_gradient_mlp_cuda" in layers[595 - 1]
    assert "import fused_weight_gradient_mlp_cuda" in layers[51 - 1]
    fused = (root / "megatron/fused_kernels/__init__.py").read_text().splitlines()
    assert "cpp_extension.CUDA_HOME" in fused[24 - 1] and '"/bin/nvcc"' in fused[105 - 1]
    init = (root / "megatron/model/__init__.py").read_text().splitlines()
    assert "from apex.normalization import MixedFusedRMSNorm" in init[10 - 1]
    assert (
        "apex.normalization.fused_layer_norm"
        in ((root / "megatron/model/fused_layer_norm.py").read_text().splitlines()[26 - 1])
    )
    args = (root / "megatron/arguments.py").read_text().splitlines()
    assert "--no-gradient-accumulation-fusion" in args[986 - 1]


def test_probe_finds_headers_under_cuda_home_or_cpath(monkeypatch, tmp_path: Path) -> None:
    home, extra = tmp_path / "cuda", tmp_path / "extra"
    (home / "include").mkdir(parents=True)
    extra.mkdir()
    (home / "include" / "cuda_runtime_api.h").write_text("")
    (extra / "cusparse.h").write_text("")
    monkeypatch.delenv("CPLUS_INCLUDE_PATH", raising=False)
    monkeypatch.delenv("CPATH", raising=False)
    assert probe._headers(str(home))["missing"] == list(probe.CUDA_HEADERS[1:])
    monkeypatch.setenv("CPATH", str(extra))
    assert probe._headers(str(home))["missing"] == list(probe.CUDA_HEADERS[2:])


# --------------------------------------------------------------------------- the lab, for real


def _lab_reason() -> str:
    from launchers.lab.session import lab_available

    ok, why = lab_available(ssh=True)
    if not ok:
        return why
    if shutil.which("nsenter") is None:
        return "nsenter missing (util-linux)"
    if not (UPSTREAM.ok and DATA_READY):
        return "upstream or the tiny dataset not ready: run `make setup`"
    return ""


lab_only = pytest.mark.skipif(bool(_lab_reason()), reason=_lab_reason() or "lab ready")


@pytest.fixture(scope="module")
def lab():
    from launchers.lab.bringup import lab_session

    with lab_session(2, "1gbit", ssh=True) as session:
        yield session


def _sshd_pid(session: Any, index: int) -> int:
    """The node's sshd: the one process its namespace holds between runs."""
    from launchers.lab.net import namespace_pids

    pids = namespace_pids(session.lab.nodes[index].namespace)
    assert len(pids) >= 1, "the node's sshd is not running"
    return min(pids)


@contextlib.contextmanager
def node_sees(session: Any, index: int, mounts: dict[str, Path]) -> Iterator[None]:
    """Bind ``source`` over ``target`` in node ``index``'s mount namespace only."""
    pid = _sshd_pid(session, index)
    done = []
    try:
        for target, source in mounts.items():
            subprocess.run(["nsenter", "--target", str(pid), "--mount", "mount", "--bind",
                            str(source), target], check=True, capture_output=True)  # fmt: skip
            done.append(target)
        yield
    finally:
        for target in reversed(done):
            subprocess.run(["nsenter", "--target", str(pid), "--mount", "umount", target],
                           check=False, capture_output=True)  # fmt: skip


def lab_report(session: Any, device: str = "cpu") -> doctor.Report:
    route = doctor.route_for("pdsh", session)
    req = transport.request_for(PATHS, device, ROOT / "logs", doctor.ifnames_for(session))
    report = doctor.diagnose(session.cluster(), req, sys.executable, route,
                             labels=doctor.lab_labels(session))  # fmt: skip
    print("\n" + report.render())
    return report


def only_node1_fails(report: verdicts.NodeReport | doctor.Report, check: str) -> verdicts.Finding:
    assert isinstance(report, doctor.Report)
    node0, node1 = report.nodes
    assert node0.ok, node0.findings
    bad = failing(node1)
    assert list(bad) == [check], node1.findings
    assert node1.label.startswith("node1 (")
    return bad[check]


@lab_only
@pytest.mark.root
def test_lab_healthy_nodes_pass(lab) -> None:
    report = lab_report(lab)
    assert report.ok, report.render()
    assert [n.finding("ifname").text for n in report.nodes] == ["eth0 ok", "eth0 ok"]


@lab_only
@pytest.mark.root
def test_lab_node_with_another_deepspeed(
    lab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run's interpreter on node1 finds another deepspeed release installed; with no
    wheelhouse on this machine the fix is the pinned install (test_wheelhouse covers the offer
    of a wheelhouse)."""
    monkeypatch.setenv("MDS_WHEELHOUSE", str(tmp_path / "no-wheelhouse"))
    dist = importlib.metadata.distribution("deepspeed")
    real = Path(str(dist.locate_file(""))) / f"deepspeed-{dist.version}.dist-info"
    assert real.is_dir(), real
    other = tmp_path / real.name
    shutil.copytree(real, other)
    meta = (other / "METADATA").read_text().replace(f"Version: {dist.version}", "Version: 0.16.9")
    (other / "METADATA").write_text(meta)
    with node_sees(lab, 1, {str(real.resolve()): other}):
        cell = only_node1_fails(lab_report(lab), "deepspeed")
    assert cell.text == f"0.16.9 (here {dist.version})"
    assert cell.fix.startswith(
        f"the node lacks deepspeed=={dist.version} (it has 0.16.9): `make setup` there; "
        "without network there: `make wheelhouse`"
    ), cell.fix
    assert lab_report(lab).ok, "the mount is gone: node1 is healthy again"


@lab_only
@pytest.mark.root
def test_lab_node_without_the_dataset(lab, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with node_sees(lab, 1, {str(Path(PATHS.data_path).parent.resolve()): empty}):
        cell = only_node1_fails(lab_report(lab), "data")
    assert cell.text == "4 missing" and "run `make setup` on that node" in cell.fix


@lab_only
@pytest.mark.root
def test_lab_node_with_upstream_at_another_commit(lab, tmp_path: Path) -> None:
    other = tmp_path / "Megatron-DeepSpeed"
    subprocess.run(["git", "clone", "-q", "--no-checkout", PATHS.upstream_dir, str(other)],
                   check=True)  # fmt: skip
    subprocess.run(["git", "-C", str(other), "checkout", "-q", "--detach", f"{PINNED_COMMIT}~1"],
                   check=True)  # fmt: skip
    parent = subprocess.run(["git", "-C", str(other), "rev-parse", "HEAD"], capture_output=True,
                            text=True, check=True).stdout.strip()  # fmt: skip
    with node_sees(lab, 1, {str(Path(PATHS.upstream_dir).resolve()): other}):
        cell = only_node1_fails(lab_report(lab), "upstream")
    assert cell.text == f"{parent[:8]} (here {PINNED_COMMIT[:8]})"
    assert f"checkout --detach {PINNED_COMMIT}" in cell.fix


@lab_only
@pytest.mark.root
def test_lab_cuda_on_cpu_only_nodes(lab) -> None:
    report = lab_report(lab, device="cuda")
    for node in report.nodes:
        bad = failing(node)
        assert bad["accelerator"].text == "0 GPUs < slots 1", node.findings
        assert "sees no GPU for slots=1" in bad["accelerator"].fix
        assert "apex" in bad["cuda"].text and "make setup DEVICE=cuda" in bad["cuda"].fix


@lab_only
@pytest.mark.root
def test_lab_node_unreachable_over_ssh(lab) -> None:
    """Runs last on the module's lab: node1's sshd is stopped for good (SIGKILL to the node's
    ``unshare``, which ignores SIGTERM while it waits; ``--kill-child`` takes sshd with it)."""
    os.kill(_sshd_pid(lab, 1), signal.SIGKILL)
    time.sleep(0.5)
    report = lab_report(lab)
    cell = only_node1_fails(report, "reach")
    assert "Connection refused" in cell.fix and "recreate the lab" in cell.fix
    assert all(f.status == "n/a" for f in report.nodes[1].findings[1:])


@lab_only
@pytest.mark.root
def test_lab_without_ssh_is_checked_inside_its_namespaces() -> None:
    """``--launcher no_ssh`` labs start each node with ``ip netns exec``: the doctor does too."""
    from launchers.lab.bringup import lab_session

    with lab_session(2, "none", ssh=False) as session:
        route = doctor.route_for("no_ssh", session)
        assert route.transport == "lab-netns"
        req = transport.request_for(PATHS, "cpu", ROOT / "logs", doctor.ifnames_for(session))
        report = doctor.diagnose(session.cluster(), req, sys.executable, route,
                                 labels=doctor.lab_labels(session))  # fmt: skip
    print("\n" + report.render())
    assert report.ok, report.render()
    assert report.route.startswith("ip netns exec (lab ")


@pytest.mark.skipif(shutil.which("pdsh") is None, reason="pdsh is not installed")
def test_pdsh_probe_gives_the_remote_shell_every_value_literally(tmp_path, monkeypatch) -> None:
    # pdsh substitutes %n, %h, %u in the command it sends; a data path with '%n', '$HOME' and a
    # command substitution must reach the node's shell as it is. pdsh runs `ssh`: here an ssh
    # that hands the remote command line to a local shell, as sshd does.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    ssh = bindir / "ssh"
    ssh.write_text('#!/bin/sh\nfor last; do :; done\nexec /bin/sh -c "$last"\n')
    ssh.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    marker = tmp_path / "marker"
    value = f"d $HOME %n %h 100% it's/$(touch {marker})/`touch {marker}`"
    command = [sys.executable, "-c", "import sys; print(repr(sys.argv[1]))", value]
    said = transport.probe_pdsh(["nodeA"], command, {})["nodeA"].error
    assert repr(value) in said, said
    assert not marker.exists(), "a value was executed by the remote shell"
