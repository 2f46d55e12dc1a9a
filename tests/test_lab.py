"""The emulated lab: pure naming/shaping/hostfile logic everywhere, real namespaces as root."""

from __future__ import annotations

import ipaddress
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from analysis.theory.formulas import parse_rate
from launchers.lab import cluster as labmod
from launchers.lab import cpu as labcpu
from launchers.lab import net as labnet
from launchers.lab import tools as labtools
from launchers.lab.cluster import Lab
from launchers.lab.net import (
    LabError,
    LinkShape,
    bridge_name,
    check_lab_id,
    hostfile_text,
    lab_id_of,
    namespace_name,
    new_lab_id,
    plan_nodes,
    port_name,
    subnet_for,
)
from launchers.run import cgroup

ROOT = Path(__file__).resolve().parents[1]

# ----------------------------------------------------------------------------- pure


@pytest.mark.parametrize(
    ("text", "mbit"),
    [
        ("100mbit", 100.0),
        ("1gbit", 1000.0),
        ("1000mbit", 1000.0),
        ("500kbit", 0.5),
        ("2.5Gbit", 2500.0),
        ("100mbit/s", 100.0),
        ("none", None),
        ("unshaped", None),
    ],
    ids=lambda v: str(v),
)
def test_parse_rate(text: str, mbit: float | None) -> None:
    assert parse_rate(text) == mbit


@pytest.mark.parametrize("text", ["fast", "100", "100mb", "-1mbit", ""])
def test_parse_rate_rejects_with_examples(text: str) -> None:
    with pytest.raises(ValueError, match=r"write e\.g\. '100mbit'"):
        parse_rate(text)


def test_parse_rate_rejects_zero() -> None:
    with pytest.raises(ValueError, match="must be > 0"):
        parse_rate("0mbit")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rate_mbit": 0}, r"rate_mbit\(0\) must be > 0"),
        ({"delay_ms": -1}, r"delay_ms\(-1\)"),
        ({"loss_pct": 100}, r"loss_pct\(100\)"),
    ],
)
def test_link_shape_invariants(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        LinkShape(**kwargs)


@pytest.mark.parametrize(
    ("shape", "label"),
    [
        (LinkShape(100), "100mbit"),
        (LinkShape(1000), "1gbit"),
        (LinkShape(2500), "2500mbit"),
        (LinkShape(None), "unshaped"),
        (LinkShape(100, delay_ms=5, loss_pct=0.5), "100mbit-5ms-loss0.5"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_link_shape_label(shape: LinkShape, label: str) -> None:
    assert shape.label == label


def test_tc_commands_rate_only_shapes_both_ends_with_tbf() -> None:
    shape = LinkShape.parse("100mbit")
    up = shape.tc_commands("eth0", "mdslab-n0", uplink=True)
    down = shape.tc_commands("mdslab-v0", None, uplink=False)
    # 1 ms at 100 Mbit/s: 12500 bytes, well under a 64 KiB offload super-packet.
    tbf = ["tbf", "rate", "100000kbit", "burst", "12500", "latency", "50ms"]
    assert up == [["tc", "-n", "mdslab-n0", "qdisc", "replace", "dev", "eth0", "root", "handle",
                   "1:", *tbf]]  # fmt: skip
    assert down == [["tc", "qdisc", "replace", "dev", "mdslab-v0", "root", "handle", "1:", *tbf]]


@pytest.mark.parametrize(
    ("shape", "burst"),
    [
        (LinkShape(1000), 125_000),  # 1 ms at 1 Gbit/s
        (LinkShape(100), 12_500),
        (LinkShape(100, burst_ms=0.5), 6_250),
        (LinkShape(10), 3_028),  # 1 ms is 1250 bytes: the floor of two full frames
        (LinkShape(0.5), 3_028),
    ],
    ids=["1gbit", "100mbit", "100mbit-0.5ms", "10mbit-floor", "500kbit-floor"],
)
def test_tc_burst_is_time_at_the_rate_with_a_frame_floor(shape: LinkShape, burst: int) -> None:
    assert shape.burst_bytes() == burst
    args = shape.tbf_args()
    assert args[args.index("burst") + 1] == str(burst)
    assert burst >= 2 * (labnet.MTU + 14)


@pytest.mark.parametrize(
    ("shape", "size", "segs"),
    [
        (LinkShape(100), 6_250, 4),  # half of 12.5 KB: 4 segments of 1448 B
        (LinkShape(1000), 62_500, 43),
        (LinkShape(1000, burst_ms=0.25), 15_625, 10),
        (LinkShape(10000), 65_536, 45),  # never above the veth's 64 KiB
        (LinkShape(10), 1_514, 1),  # the 2-frame bucket: one frame per packet
    ],
    ids=["100mbit", "1gbit", "1gbit-0.25ms", "10gbit", "10mbit"],
)
def test_offload_packets_are_at_most_half_the_bucket(shape: LinkShape, size: int, segs: int):
    assert shape.segment_bytes() == size
    assert size <= shape.burst_bytes() or size == labnet.MTU + 14
    assert shape.segmentation_commands("eth0", "ns") == [
        ["ip", "-n", "ns", "link", "set", "dev", "eth0", "gso_max_size", str(size),
         "gso_max_segs", str(segs)]]  # fmt: skip
    assert shape.segmentation_commands("v0", None)[0][:5] == ["ip", "link", "set", "dev", "v0"]
    assert LinkShape().segmentation_commands("eth0", None) == []


def test_burst_of_unshaped_link_and_bounds() -> None:
    assert LinkShape().burst_bytes() == 0 and LinkShape().tbf_args() == []
    assert LinkShape.parse("1gbit", burst_ms=2).burst_bytes() == 250_000
    for bad in (0, -1, 1001):
        with pytest.raises(ValueError, match=rf"burst_ms\({bad}\) must be within"):
            LinkShape(100, burst_ms=bad)


def test_tc_commands_delay_and_loss_only_on_uplink() -> None:
    shape = LinkShape(100, delay_ms=20, loss_pct=1)
    up = shape.tc_commands("eth0", "ns", uplink=True)
    assert [cmd[cmd.index("dev") + 2 :][:4] for cmd in up] == [
        ["root", "handle", "1:", "netem"],
        ["parent", "1:1", "handle", "10:"],
    ]
    assert up[0][-4:] == ["delay", "20ms", "loss", "1%"]
    down = shape.tc_commands("v0", None, uplink=False)
    assert len(down) == 1 and "netem" not in down[0] and "tbf" in down[0]


def test_unshaped_link_has_no_tc_commands() -> None:
    assert LinkShape().tc_commands("eth0", "ns", uplink=True) == []


def test_names_fit_ifnamsiz_and_map_back_to_the_lab() -> None:
    lab_id = "abc123"
    names = [namespace_name(lab_id, 63), port_name(lab_id, 63), bridge_name(lab_id)]
    assert names == ["mdslabc123-n63", "mdslabc123-v63", "mdslabc123-br"]
    assert all(len(name) <= 15 for name in names)
    assert {lab_id_of(name) for name in names} == {lab_id}
    # A short id is not confused with a longer one that starts the same way.
    assert lab_id_of(port_name("ab", 0)) == "ab"
    assert lab_id_of("mdslabc-n0") == "abc"
    assert lab_id_of("eth0-x") is None


def test_new_lab_ids_are_valid_and_names_of_two_labs_are_disjoint() -> None:
    first, second = new_lab_id(), new_lab_id()
    while second == first:
        second = new_lab_id()
    assert check_lab_id(first) == first and len(first) == 6
    subnet = ipaddress.IPv4Network("10.200.1.0/24")
    a = {v for n in plan_nodes(first, subnet, 4) for v in (n.namespace, n.host_interface)}
    b = {v for n in plan_nodes(second, subnet, 4) for v in (n.namespace, n.host_interface)}
    assert not a & b


@pytest.mark.parametrize("bad", ["ABC", "toolong7", "a-b", ""])
def test_check_lab_id_rejects(bad: str) -> None:
    with pytest.raises(ValueError, match="1-6 characters of a-z and 0-9"):
        check_lab_id(bad)


def test_subnet_skips_taken_networks() -> None:
    first = subnet_for("ab", [])
    assert first.subnet_of(ipaddress.IPv4Network("10.200.0.0/16")) and first.prefixlen == 24
    assert subnet_for("ab", []) == first  # derived from the id
    taken = [first, first.supernet(new_prefix=23)]
    second = subnet_for("ab", taken)
    assert not any(second.overlaps(net) for net in taken)


def test_subnet_exhausted_says_how_to_clean_up() -> None:
    with pytest.raises(LabError, match="down --all"):
        subnet_for("ab", [ipaddress.IPv4Network("10.200.0.0/16")])


def test_plan_nodes_and_hostfile_text() -> None:
    nodes = plan_nodes("ab", ipaddress.IPv4Network("10.200.7.0/24"), 3)
    assert [(n.name, n.address, n.interface) for n in nodes] == [
        ("node0", "10.200.7.1", "eth0"),
        ("node1", "10.200.7.2", "eth0"),
        ("node2", "10.200.7.3", "eth0"),
    ]
    text = hostfile_text(nodes, slots=2, title="mdslab")
    lines = text.splitlines()
    assert lines[0].startswith("# Emulated lab mdslab: 3 nodes")
    assert [line for line in lines if not line.startswith("#")] == [
        "10.200.7.1 slots=2",
        "10.200.7.2 slots=2",
        "10.200.7.3 slots=2",
    ]


def test_plan_nodes_bounds() -> None:
    with pytest.raises(ValueError, match=r"nodes\(1\) must be within 2..64"):
        plan_nodes("ab", ipaddress.IPv4Network("10.200.7.0/24"), 1)


def test_lab_api_before_up_says_how_to_use_it() -> None:
    with pytest.raises(LabError, match="with Lab"):
        Lab().hostfile_text()


def test_committed_hostfile_template_is_comment_only() -> None:
    text = (ROOT / "hostfiles" / "lab-2node").read_text()
    assert all(line.startswith("#") or not line.strip() for line in text.splitlines())


# ----------------------------------------------------------------------------- root


def _lab_skip_reason(ssh: bool) -> str | None:
    try:
        labtools.check_prerequisites(ssh)
    except LabError as err:
        return str(err)
    return None


def _require_lab(ssh: bool = False) -> None:
    reason = _lab_skip_reason(ssh)
    if reason:
        pytest.skip(reason)


def _ours(lab_id: str) -> list[str]:
    names = labnet.list_namespaces() + labnet.list_links()
    for root, _ in cgroup.cpu_controller_roots():
        names += [p.name for p in (root / labcpu.CPU_CGROUP_PARENT).glob("mdsl*") if p.is_dir()]
    return [name for name in names if lab_id_of(name) == lab_id and name.startswith("mdsl")]


RECEIVER = """
import socket, sys, time
srv = socket.socket()
srv.bind((sys.argv[1], 5201))
srv.listen(1)
print("ready", flush=True)
conn, _ = srv.accept()
total, start = 0, None
while True:
    chunk = conn.recv(1 << 20)
    if not chunk:
        break
    start = start or time.perf_counter()
    total += len(chunk)
print(total, time.perf_counter() - start, flush=True)
"""

SENDER = """
import socket, sys
with socket.create_connection((sys.argv[1], 5201)) as sock:
    sock.sendall(bytes(int(sys.argv[2])))
"""

ECHO = """
import socket, sys
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.bind((sys.argv[1], 5202))
print("ready", flush=True)
for _ in range(int(sys.argv[2])):
    data, peer = sock.recvfrom(64)
    sock.sendto(data, peer)
"""

PINGER = """
import socket, statistics, sys, time
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.settimeout(2)
rtts = []
for i in range(int(sys.argv[2])):
    start = time.perf_counter()
    sock.sendto(b"%d" % i, (sys.argv[1], 5202))
    sock.recvfrom(64)
    rtts.append((time.perf_counter() - start) * 1e3)
print(statistics.median(rtts), flush=True)
"""


def _serve(lab: Lab, node: int, code: str, *args: str) -> subprocess.Popen:
    argv = lab.wrap(node, [sys.executable, "-c", code, *args])
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def _rtt_ms(lab: Lab, count: int = 20) -> float:
    server = _serve(lab, 1, ECHO, lab.nodes[1].address, str(count))
    argv = lab.wrap(0, [sys.executable, "-c", PINGER, lab.nodes[1].address, str(count)])
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout
    server.wait(timeout=10)
    return float(out)


@pytest.fixture(scope="module")
def lab100() -> Lab:
    _require_lab(ssh=True)
    with Lab(nodes=2, shape=LinkShape.parse("100mbit")) as lab:
        yield lab


@pytest.mark.root
def test_nodes_reach_each_other(lab100: Lab) -> None:
    assert _rtt_ms(lab100) < 50


@pytest.mark.root
def test_shaped_throughput_and_counters(lab100: Lab) -> None:
    nbytes = 12_500_000  # 1 s at 100 Mbit/s
    before = lab100.counters()
    receiver = _serve(lab100, 1, RECEIVER, lab100.nodes[1].address)
    sender = lab100.wrap(0, [sys.executable, "-c", SENDER, lab100.nodes[1].address, str(nbytes)])
    subprocess.run(sender, check=True, timeout=60)
    out, _ = receiver.communicate(timeout=60)
    received, seconds = out.split()
    assert int(received) == nbytes
    mbit = nbytes * 8 / float(seconds) / 1e6
    # TCP/IP and Ethernet headers take ~5% of the 100 Mbit/s link (1448 of 1514 bytes).
    assert 85 <= mbit <= 115, f"measured {mbit:.1f} Mbit/s on a 100 Mbit/s link"
    after = lab100.counters()
    sent = after["node0"]["tx_bytes"] - before["node0"]["tx_bytes"]
    got = after["node1"]["rx_bytes"] - before["node1"]["rx_bytes"]
    # The payload plus headers (~4.5% at MTU 1500), ACKs go the other way.
    assert nbytes <= sent <= nbytes * 1.08
    assert nbytes <= got <= nbytes * 1.08
    # veth segmentation offload: packet counters count super-packets of up to 64 KiB.
    assert after["node0"]["tx_packets"] - before["node0"]["tx_packets"] >= nbytes // 65536


@pytest.mark.root
def test_pdsh_over_ssh_runs_on_every_node(lab100: Lab) -> None:
    hosts = ",".join(node.address for node in lab100.nodes)
    proc = subprocess.run(
        ["pdsh", "-w", hosts, "ip", "-4", "-o", "addr", "show", "dev", "eth0"],
        env=lab100.launcher_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    lines = sorted(proc.stdout.splitlines())
    assert len(lines) == 2
    for node, line in zip(lab100.nodes, lines, strict=True):
        # "<host>: 2: eth0    inet <address>/24 ...": each node answers with its own address.
        assert line.startswith(f"{node.address}: ") and f"inet {node.address}/24" in line


@pytest.mark.root
def test_ssh_env_file_carries_the_node_environment(lab100: Lab) -> None:
    env = lab100.launcher_env(extra={"MDS_EXTRA": "1"})
    assert f"-F {lab100.ssh_config_path}" in env["PDSH_SSH_ARGS_APPEND"]
    lines = Path(env["DS_ENV_FILE"]).read_text().splitlines()
    assert "GLOO_SOCKET_IFNAME=eth0" in lines and "DS_ACCELERATOR=cpu" in lines
    assert "MDS_EXTRA=1" in lines


@pytest.mark.root
def test_describe_and_hostfile(lab100: Lab) -> None:
    info = lab100.describe()
    assert info["link_mbit"] == 100.0 and info["link"] == "100mbit"
    assert [n["address"] for n in info["nodes"]] == [n.address for n in lab100.nodes]
    assert len(info["shaping"]) == 4 and all("tbf" in cmd for cmd in info["shaping"])
    # Bridge, then each node's two veth ends: offload packets of at most half the bucket.
    assert len(info["segmentation"]) == 5
    assert all("gso_max_size 6250" in cmd for cmd in info["segmentation"]), info["segmentation"]
    assert info["burst_bytes"] == 12_500 and info["burst_ms"] == 1.0
    shown = subprocess.run(["ip", "-n", lab100.nodes[0].namespace, "-d", "link", "show", "eth0"],
                           capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert "gso_max_size 6250 " in shown
    json.dumps(info)
    lines = [ln for ln in lab100.hostfile_text().splitlines() if not ln.startswith("#")]
    assert lines == [f"{n.address} slots=1" for n in lab100.nodes]
    assert lab100.master_addr == lab100.nodes[0].address


@pytest.mark.root
def test_wrap_runs_inside_the_node_namespace(lab100: Lab) -> None:
    argv = lab100.wrap(1, ["sh", "-c", "echo $GLOO_SOCKET_IFNAME $MDS_X"], {"MDS_X": "y"})
    start = argv.index("ip")  # after the cgroup join, when the lab has a CPU budget
    assert argv[start : start + 4] == ["ip", "netns", "exec", lab100.nodes[1].namespace]
    assert subprocess.run(argv, capture_output=True, text=True).stdout.split() == ["eth0", "y"]


@pytest.mark.root
def test_a_pkill_in_one_node_reaches_no_other_node(lab100: Lab) -> None:
    """DeepSpeed's pdsh runner stops a run with ``pkill -f <launch command>`` on every node: in
    a lab that must not kill what matches in other nodes, other labs, or on the host."""
    marker = f"mdsl-pkill-probe-{lab100.id}"
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)", marker]
    host = subprocess.Popen(sleeper)
    other = subprocess.Popen(lab100.ssh_argv(1, sleeper))
    try:
        deadline = time.monotonic() + 20
        while (
            len(labnet.command_words(["pgrep", "-f", marker])) < 2 and time.monotonic() < deadline
        ):
            time.sleep(0.2)
        argv = lab100.ssh_argv(0, ["ps", "-e", "-o", "pid=,comm="])
        ps = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout
        assert "python" not in ps and "sshd" in ps  # node 0 sees its own processes only
        subprocess.run(lab100.ssh_argv(0, ["pkill", "-f", marker]), timeout=30)
        time.sleep(1)
        assert host.poll() is None and other.poll() is None, "a pkill in node0 reached them"
    finally:
        host.kill()
        other.kill()
        subprocess.run(lab100.ssh_argv(1, ["pkill", "-f", marker]), timeout=30)


@pytest.mark.root
def test_session_sweep_stops_leftovers_and_spares_the_sshd(lab100: Lab) -> None:
    from launchers.lab.session import LabSession

    stray = subprocess.Popen(
        lab100.ssh_argv(1, [sys.executable, "-c", "import time; time.sleep(60)"])
    )
    ns = lab100.nodes[1].namespace
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not any(
        "time.sleep" in Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
        for pid in labnet.namespace_pids(ns)
        if Path(f"/proc/{pid}/cmdline").exists()
    ):
        time.sleep(0.2)
    found = LabSession(lab=lab100, ssh=True).sweep(grace_s=3)
    stray.wait(timeout=30)
    assert any("time.sleep" in f["command"] for f in found), found
    assert all(Path(f"/proc/{pid}").exists() for pid in lab100.daemon_pids())
    assert len(lab100.daemon_pids()) == 2 * len(lab100.nodes)  # unshare + sshd per node
    subprocess.run(lab100.ssh_argv(1, ["true"]), timeout=30, check=True)


def _cgroup_of(text: str) -> str:
    """The cpu controller's line of /proc/<pid>/cgroup (v1 ``N:cpu:/path``, v2 ``0::/path``)."""
    lines = [ln.split(":", 2) for ln in text.splitlines()]
    v1 = [path for _, ctrl, path in lines if "cpu" in ctrl.split(",")]
    return (v1 or [path for num, ctrl, path in lines if num == "0"])[0]


@pytest.mark.root
def test_every_node_process_is_in_its_node_cgroup(lab100: Lab) -> None:
    if not lab100.cgroups:
        pytest.skip(f"no CPU budget on this machine: {lab100.cpu_note}")
    cpu = lab100.describe()["node_cpu"]
    assert cpu["cpus"] == labcpu.default_node_cpus() and "CFS quota" in cpu["mechanism"]
    for node, group in zip(lab100.nodes, lab100.cgroups, strict=True):
        want = f"/{labcpu.CPU_CGROUP_PARENT}/{node.namespace}"
        # ssh: the node's sshd is in the group, so is everything pdsh starts through it.
        show = ["cat", "/proc/self/cgroup"]
        for argv in (lab100.ssh_argv(node.index, show), lab100.wrap(node.index, show)):
            out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True)
            assert _cgroup_of(out.stdout).endswith(want), (argv[0], out.stdout)
        assert group.path.name == node.namespace and group.cpus == cpu["cpus"]
        assert str(group.path) == cpu["nodes"][node.name]["cgroup"]


BUSY = """
import os, resource, sys, time
wall = float(sys.argv[1])
start = time.monotonic()
child = os.fork()
while time.monotonic() - start < wall:
    pass
if child == 0:
    os._exit(0)
os.waitpid(child, 0)
used = sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF,
           resource.RUSAGE_CHILDREN) for f in ("ru_utime", "ru_stime"))
print(used, time.monotonic() - start)
"""


@pytest.mark.root
def test_cpu_budget_caps_what_a_node_computes() -> None:
    """Two busy processes in a node of 0.1 core get 0.1 core between them, however idle the
    machine (the bound is an upper one: other jobs can only take more away)."""
    _require_lab()
    if not cgroup.cpu_controller_roots():
        pytest.skip("no cpu cgroup controller mounted on this machine")
    with Lab(nodes=2, shape=LinkShape.parse("100mbit"), ssh=False, node_cpus=0.1) as lab:
        before = lab.cgroups[0].stat()
        argv = lab.wrap(0, [sys.executable, "-c", BUSY, "3"])
        used, wall = map(float, subprocess.run(argv, capture_output=True, text=True,
                                                timeout=60, check=True).stdout.split())  # fmt: skip
        after = lab.cgroups[0].stat()
        assert lab.describe()["node_cpu"]["cpus"] == 0.1
    assert used <= 0.1 * wall * 1.25 + 0.05, f"{used:.2f} s of CPU in {wall:.2f} s at 0.1 core"
    assert after["nr_throttled"] > before.get("nr_throttled", 0)


def test_cpu_limit_lines_and_bounds() -> None:
    assert cgroup.cpu_limit_lines(0.5, 2) == {"cpu.max": "50000 100000"}
    assert cgroup.cpu_limit_lines(1.5, 1) == {"cpu.cfs_period_us": "100000",
                                              "cpu.cfs_quota_us": "150000"}  # fmt: skip
    assert cgroup.cpu_limit_lines(0.001, 2) == {"cpu.max": "1000 100000"}  # the kernel's floor
    with pytest.raises(ValueError, match="cpus"):
        cgroup.cpu_limit_lines(0, 2)
    with pytest.raises(ValueError, match=r"node_cpus\(-1\)"):
        Lab(nodes=2, node_cpus=-1)


def test_cpu_controller_roots_prefer_v2_then_v1(tmp_path: Path) -> None:
    v2 = tmp_path / "unified"
    v2.mkdir()
    (v2 / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "cgroup.controllers").write_text("hugetlb\n")
    mounts = (
        f"cgroup {tmp_path}/cpu cgroup rw,relatime,cpu 0 0\n"
        f"cgroup {tmp_path}/cpuacct cgroup rw,relatime,cpuacct 0 0\n"
        f"cgroup2 {bare} cgroup2 rw 0 0\n"
        f"cgroup2 {v2} cgroup2 rw 0 0\n"
        "tmpfs /run tmpfs rw 0 0\n"
    )
    assert cgroup.cpu_controller_roots(mounts) == [(v2, 2), (tmp_path / "cpu", 1)]
    assert cgroup.cpu_controller_roots("") == []


@pytest.mark.root
def test_two_labs_at_once_do_not_collide(lab100: Lab) -> None:
    with Lab(nodes=3, shape=LinkShape.parse("1gbit"), ssh=False) as other:
        assert other.id != lab100.id
        assert not other.subnet.overlaps(lab100.subnet)
        assert {n.namespace for n in other.nodes}.isdisjoint(n.namespace for n in lab100.nodes)
        assert _rtt_ms(other) < 50 and _rtt_ms(lab100) < 50
    assert _ours(other.id) == []


@pytest.mark.root
def test_delay_shows_in_rtt() -> None:
    _require_lab()
    try:
        lab = Lab(nodes=2, shape=LinkShape(rate_mbit=None, delay_ms=20), ssh=False).up()
    except LabError as err:
        if "netem" in str(err):
            pytest.skip(str(err))
        raise
    try:
        rtt = _rtt_ms(lab)
    finally:
        lab.down()
    # 20 ms each way: RTT 40 ms.
    assert 40 <= rtt <= 50


@pytest.mark.root
def test_teardown_after_exception_leaves_nothing() -> None:
    _require_lab(ssh=True)
    with pytest.raises(RuntimeError, match="boom"), Lab(nodes=2) as lab:
        lab_id = lab.id
        cgroups = 2 if lab.cgroups else 0
        assert len(_ours(lab_id)) == 2 + 2 + 1 + cgroups  # namespaces, ports, bridge, cgroups
        raise RuntimeError("boom")
    assert _ours(lab_id) == []
    assert not labnet.state_dir_of(lab_id).exists()
    assert lab_id not in labmod.existing_labs()


HOLDER = """
import sys, time
from launchers.lab.cluster import Lab
with Lab(nodes=2) as lab:
    print(lab.id, flush=True)
    time.sleep(60)
"""


@pytest.mark.root
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_teardown_on_signal_leaves_nothing(sig: signal.Signals) -> None:
    _require_lab(ssh=True)
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    lab_id = proc.stdout.readline().strip()
    assert lab_id and _ours(lab_id)
    proc.send_signal(sig)
    code = proc.wait(timeout=30)
    # Torn down, then the signal's usual end: SIGTERM's default action; for SIGINT the
    # KeyboardInterrupt, which Python turns into death by SIGINT at exit.
    assert code == -sig
    assert _ours(lab_id) == []
    assert not labnet.state_dir_of(lab_id).exists()


@pytest.mark.root
def test_cli_up_list_down() -> None:
    _require_lab()
    lab_id = "t" + new_lab_id()[:5]
    up = subprocess.Popen(
        [sys.executable, "-m", "launchers.lab", "up", "--name", lab_id, "--no_ssh",
         "--link", "100mbit"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while lab_id not in labmod.existing_labs() or not _ours(lab_id):
            assert time.monotonic() < deadline and up.poll() is None
            time.sleep(0.2)
        time.sleep(0.5)
        listed = subprocess.run(
            [sys.executable, "-m", "launchers.lab", "list"], cwd=ROOT, capture_output=True,
            text=True, check=True,
        ).stdout  # fmt: skip
        assert f"mdsl{lab_id}\t2 namespaces" in listed
        down = subprocess.run(
            [sys.executable, "-m", "launchers.lab", "down", f"mdsl{lab_id}"], cwd=ROOT,
            capture_output=True, text=True,
        )  # fmt: skip
        assert down.returncode == 0 and "removed" in down.stdout
        assert _ours(lab_id) == []
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(timeout=30)
    assert _ours(lab_id) == []


class _LabStarted(Exception):
    """Raised in place of bringing a lab up: the run got past its checks."""


@pytest.mark.parametrize(
    ("nodes", "slots", "started"), [(2, 2, True), (4, 1, True), (3, 1, False), (2, 1, False)]
)
def test_lab_runs_are_checked_against_nodes_x_slots(monkeypatch, capsys, nodes, slots, started):
    """``hybrid`` (TP2 x PP2) needs 4 ranks: the lab's nodes x slots, not the placeholder
    hostfile's (localhost, 2 slots), decide before the lab starts."""
    from launchers import cli

    def no_lab(args):
        raise _LabStarted(f"{args.lab_nodes} x {args.lab_slots}")

    monkeypatch.setattr(cli, "_lab_session", no_lab)
    monkeypatch.setattr(cli, "preflight", lambda spec, allow: [])
    monkeypatch.setattr(cli, "lab_available", lambda ssh=True: (True, ""))  # also when not root
    argv = ["run", "--model", "tiny", "--strategy", "hybrid", "--net", "100mbit",
            "--lab-nodes", str(nodes), "--lab-slots", str(slots), "--logs", "unused"]  # fmt: skip
    if started:
        with pytest.raises(_LabStarted, match=f"{nodes} x {slots}"):
            cli.main(argv)
    else:
        assert cli.main(argv) != 0
        err = capsys.readouterr().err
        assert f"world_size({nodes * slots})" in err and "multiple of tp * pp = 4" in err
