"""Emulated cluster: N nodes on one machine, as network namespaces on a shaped Linux bridge.

Each node is a network namespace ``mdsl<id>-n<i>`` holding one end of a veth pair, named ``eth0``
in every node (interface names are per namespace, so every node's ``GLOO_SOCKET_IFNAME`` is the
same); the other end, ``mdsl<id>-v<i>``, is a port of the lab's bridge ``mdsl<id>-br`` in the root
namespace, which also carries the host's own address on the lab network so that the host (and so
the real ``deepspeed`` launcher, through pdsh over ssh) reaches every node.

Addresses come from ``10.200.X.0/24``: nodes ``.1``..``.N``, the host ``.254``. ``X`` is derived
from the lab id and chosen under a lock among the /24s that no route of the machine uses, so two
labs never collide and nothing outside the lab is ever addressed.

Shaping (``tc``), per node link, like a switch port of a full-duplex NIC:

- uplink (node -> bridge): egress of ``eth0`` inside the namespace: ``netem`` (delay, loss) when
  asked, with ``tbf`` (rate) under it;
- downlink (bridge -> node): egress of the bridge port ``mdsl<id>-v<i>``: ``tbf`` only.

Every tbf bucket holds 1 ms at the rate (``LinkShape.burst_bytes``), so a message sent after an
idle spell, as a collective after compute, pays the rate past its first millisecond; offload
packets are limited to half the bucket (``LinkShape.segment_bytes``, ``ip link set ...
gso_max_size``) so that a small bucket costs no throughput.

CPU: each node gets the same budget whatever the node count (``default_node_cpus``: this
machine's cores / 4), a cgroup per node with a CFS quota holding the node's sshd and every
process ``Lab.wrap`` starts, and so all they start; ``describe()["node_cpu"]`` records it.

Shaping both directions (rather than only the uplink, or an ifb on ingress) keeps every node's
receive side at the link rate too, which matters with more than two nodes (two senders into one
receiver); an ifb would need a redirect filter per port for the same result. ``delay_ms`` and
``loss_pct`` are applied once per direction (on the uplink), so between two nodes the one-way
delay is ``delay_ms`` and a ping's RTT is ``2 x delay_ms``.

Manual use: ``python -m launchers.lab up --nodes 2 --link 100mbit [--slurm]`` (prints the lab's
name and hostfile, with ``--slurm`` its Slurm cluster's ``SLURM_CONF``, keeps it until Ctrl-C),
``python -m launchers.lab list``, ``python -m launchers.lab down NAME`` and ``down --all`` (every
leftover lab of this project, found by the ``mdsl`` prefix).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import fcntl
import ipaddress
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Literal

from analysis.formulas import parse_rate

PREFIX = "mdsl"
"""Prefix of every namespace, interface and state directory a lab creates (``down --all`` key)."""

NODE_INTERFACE = "eth0"
"""Name of each node's interface inside its namespace (the same in every node)."""

SUBNET_BASE = ipaddress.IPv4Network("10.200.0.0/16")
"""Private range the labs' /24s are taken from; used only inside the lab namespaces and bridge."""

HOST_OCTET = 254
"""Last octet of the host's address on the lab bridge."""

MAX_NODES = 64
"""Most nodes per lab (interface names stay <= 15 characters, addresses inside one /24)."""

SSH_PORT = 22
"""Port each node's sshd listens on (on the node's own address, inside its namespace)."""

SSHD = "/usr/sbin/sshd"
"""sshd must be started by absolute path (it re-executes itself)."""

INSTALL_HINT = "apt-get install -y iproute2 openssh-server openssh-client pdsh util-linux"
"""Debian packages the lab needs (iproute2 for ip/tc; the rest, unshare too, for the ssh path)."""

MTU = 1500
"""MTU of every lab link (the veth default); each packet on the wire is at most this plus 14."""

FRAME_BYTES = MTU + 14
"""Largest packet tbf sees on a lab link: an MTU-sized IP packet plus its Ethernet header."""

MSS = MTU - 52
"""TCP payload per frame: MTU minus IPv4 (20) and TCP (20 + 12 of timestamps) headers."""

GSO_MAX_BYTES = 65536
"""The veth's default (and largest usual) offload packet, bytes."""

DEFAULT_BURST_MS = 1.0
"""Default tbf bucket, ms at the link rate (see ``LinkShape.burst_bytes``)."""

_ID_RE = re.compile(r"^[a-z0-9]{1,6}$")
_ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

CounterName = Literal["tx_bytes", "rx_bytes", "tx_packets", "rx_packets"]
"""Interface statistics read from ``/sys/class/net/<if>/statistics``."""

COUNTERS: tuple[CounterName, ...] = ("tx_bytes", "rx_bytes", "tx_packets", "rx_packets")
"""Counters ``Lab.counters`` returns, per node."""


class LabError(RuntimeError):
    """A lab could not be created, used or removed; the message says what would fix it."""


# ----------------------------------------------------------------------------- link shape


@dataclass(frozen=True)
class LinkShape:
    """How every node's link to the lab bridge is shaped."""

    rate_mbit: float | None = None
    """Link rate in Mbit/s (1e6 bit/s) each way; None leaves the link unshaped (veth speed)."""
    delay_ms: float = 0.0
    """One-way delay added to every packet a node sends, ms (node-to-node RTT is twice this)."""
    loss_pct: float = 0.0
    """Percentage of packets a node sends that are dropped (0 <= loss < 100)."""
    burst_ms: float = DEFAULT_BURST_MS
    """tbf bucket as time at the rate, ms (how long the link may run above the rate after an
    idle spell); the bucket never holds less than two full frames."""

    def __post_init__(self) -> None:
        if self.rate_mbit is not None and not self.rate_mbit > 0:
            raise ValueError(f"rate_mbit({self.rate_mbit}) must be > 0, or None for unshaped")
        if not 0 <= self.delay_ms <= 60_000:
            raise ValueError(f"delay_ms({self.delay_ms}) must be within 0..60000")
        if not 0 <= self.loss_pct < 100:
            raise ValueError(f"loss_pct({self.loss_pct}) must be within 0 <= loss < 100")
        if not 0 < self.burst_ms <= 1000:
            raise ValueError(f"burst_ms({self.burst_ms}) must be within 0 < burst <= 1000")

    @classmethod
    def parse(
        cls,
        rate: str,
        delay_ms: float = 0.0,
        loss_pct: float = 0.0,
        burst_ms: float = DEFAULT_BURST_MS,
    ) -> LinkShape:
        """Build from a rate spelling (``100mbit``, ``1gbit``, ``none``) plus the other fields."""
        return cls(parse_rate(rate), delay_ms=delay_ms, loss_pct=loss_pct, burst_ms=burst_ms)

    @property
    def label(self) -> str:
        """Short name for run names and tables: ``100mbit``, ``1gbit``, ``unshaped``."""
        if self.rate_mbit is None:
            base = "unshaped"
        elif self.rate_mbit >= 1000 and self.rate_mbit % 1000 == 0:
            base = f"{self.rate_mbit / 1000:g}gbit"
        else:
            base = f"{self.rate_mbit:g}mbit"
        extra = (f"-{self.delay_ms:g}ms" if self.delay_ms else "") + (
            f"-loss{self.loss_pct:g}" if self.loss_pct else ""
        )
        return base + extra

    def burst_bytes(self) -> int:
        """``tbf`` bucket size, bytes: ``burst_ms`` of traffic at the rate, at least 2 frames.

        The bucket bounds how far a link runs ahead of its rate after an idle spell (a
        collective after compute): a message of the bucket's size leaves at host speed, a larger
        one pays the rate for the rest. It need not hold the veth's 64 KiB offload super-packets:
        the lab limits them to half the bucket (``segment_bytes``), and tbf would split a larger
        one into frames itself. It must hold one frame with its headers (tbf drops larger
        non-offload packets) and cover the scheduling delay of tbf's timer at the rate (high
        resolution timers, but a loaded machine runs them late). Bulk TCP payload rates measured
        on a 2-core machine under a load of 6-13 (1448/1514 of the rate is the most TCP gets):
        100 Mbit/s: 95.9 Mbit/s at 1 ms, 91.6-93.1 at 0.5 ms, 90.4-94.5 at 0.25 ms; 1 Gbit/s:
        910-940 at 1 ms, 831-868 at 0.5 ms, 775-912 at 0.25 ms. Hence the default of 1 ms.
        """
        if self.rate_mbit is None:
            return 0
        return max(2 * FRAME_BYTES, int(self.rate_mbit * 1e6 / 8 * self.burst_ms / 1e3))

    def segment_bytes(self) -> int:
        """Largest packet a node's stack hands the shaped link: half the bucket, between one
        frame and the veth's 64 KiB (``segmentation_commands``).

        tbf would split a larger offload super-packet into frames itself (``tbf_segment``),
        but then every frame costs a trip through veth, bridge and the receiver's stack: with a
        0.25 ms bucket at 1 Gbit/s a bulk stream reached 408-474 Mbit/s that way on a loaded
        2-core machine, 775-912 with 15 KB segments. Packets of half the bucket keep that cost
        low and never need splitting; 0 when unshaped (the veth's defaults stay).
        """
        if self.rate_mbit is None:
            return 0
        return min(GSO_MAX_BYTES, max(MTU, self.burst_bytes() // 2))

    def segmentation_commands(self, dev: str, netns: str | None) -> list[list[str]]:
        """``ip link`` argv limiting ``dev``'s offload packets to ``segment_bytes`` (empty when
        unshaped). Sockets read the limit when they connect: set before any traffic."""
        size = self.segment_bytes()
        if not size:
            return []
        segs = max(1, size // MSS)
        return [["ip", *(["-n", netns] if netns else []), "link", "set", "dev", dev,
                 "gso_max_size", str(size), "gso_max_segs", str(segs)]]  # fmt: skip

    def tbf_args(self) -> list[str]:
        """``tbf`` parameters for this rate (empty when unshaped).

        ``burst``: ``burst_bytes``; ``latency 50ms`` bounds the queue like a switch buffer would.
        """
        if self.rate_mbit is None:
            return []
        return ["tbf", "rate", f"{round(self.rate_mbit * 1000)}kbit", "burst",
                str(self.burst_bytes()), "latency", "50ms"]  # fmt: skip

    def netem_args(self) -> list[str]:
        """``netem`` parameters for delay and loss (empty when neither is set)."""
        if not self.delay_ms and not self.loss_pct:
            return []
        args = ["netem", "limit", "100000"]
        if self.delay_ms:
            args += ["delay", f"{self.delay_ms:g}ms"]
        if self.loss_pct:
            args += ["loss", f"{self.loss_pct:g}%"]
        return args

    def tc_commands(self, dev: str, netns: str | None, uplink: bool) -> list[list[str]]:
        """The ``tc`` argv lists that shape ``dev`` (inside ``netns`` when given).

        ``uplink`` (the node's own egress) gets netem (delay, loss) with tbf as its child; the
        downlink (bridge port egress) gets tbf only, so delay and loss count once per direction.
        """
        tc = ["tc", *(["-n", netns] if netns else []), "qdisc", "replace", "dev", dev]
        netem = self.netem_args() if uplink else []
        tbf = self.tbf_args()
        if netem and tbf:
            return [
                [*tc, "root", "handle", "1:", *netem],
                [*tc, "parent", "1:1", "handle", "10:", *tbf],
            ]
        if netem or tbf:
            return [[*tc, "root", "handle", "1:", *(netem or tbf)]]
        return []


# ----------------------------------------------------------------------------- names


def new_lab_id() -> str:
    """A random 6-hex-digit lab id (24 bits; creation also checks it is not in use)."""
    return secrets.token_hex(3)


def check_lab_id(lab_id: str) -> str:
    """Return ``lab_id`` if usable in interface names (1-6 of ``a-z0-9``), else raise."""
    if not _ID_RE.match(lab_id):
        raise ValueError(
            f"lab name {lab_id!r} must be 1-6 characters of a-z and 0-9 (it goes into interface "
            "names, which Linux limits to 15 characters)"
        )
    return lab_id


def namespace_name(lab_id: str, index: int) -> str:
    """Network namespace of node ``index``: ``mdsl<id>-n<i>``."""
    return f"{PREFIX}{lab_id}-n{index}"


def bridge_name(lab_id: str) -> str:
    """The lab's bridge in the root namespace: ``mdsl<id>-br``."""
    return f"{PREFIX}{lab_id}-br"


def port_name(lab_id: str, index: int) -> str:
    """Bridge-side end of node ``index``'s veth pair: ``mdsl<id>-v<i>``."""
    return f"{PREFIX}{lab_id}-v{index}"


def lab_id_of(name: str) -> str | None:
    """The lab id inside a namespace/interface/lab name of ours, or None if it is not ours."""
    match = re.match(rf"^{PREFIX}([a-z0-9]{{1,6}})(?:-(?:n\d+|v\d+|br))?$", name)
    if match:
        return match[1]
    return name if _ID_RE.match(name) else None


def _is_of_lab(name: str, lab_id: str) -> bool:
    """Whether a namespace or interface name belongs to lab ``lab_id``."""
    return name.startswith(f"{PREFIX}{lab_id}-") and lab_id_of(name) == lab_id


def state_dir_of(lab_id: str) -> Path:
    """Directory holding a lab's keys, configs, hostfile and logs (removed on teardown)."""
    return Path(tempfile.gettempdir()) / f"{PREFIX}{lab_id}"


@dataclass(frozen=True)
class LabNode:
    """One emulated node."""

    index: int
    """Node rank in the hostfile (0 is the master)."""
    name: str
    """Readable name, ``node<i>``."""
    namespace: str
    """Network namespace holding the node (``ip netns exec <namespace> ...``)."""
    interface: str
    """The node's interface inside its namespace (``GLOO_SOCKET_IFNAME``)."""
    host_interface: str
    """The bridge-side end of the node's veth pair, in the root namespace."""
    address: str
    """The node's IPv4 address (its host name in the hostfile)."""

    def __post_init__(self) -> None:
        for field_name in ("namespace", "interface", "host_interface"):
            value = getattr(self, field_name)
            if not 0 < len(value) <= 15:
                raise ValueError(f"{field_name} {value!r} must be 1-15 characters (IFNAMSIZ)")
        ipaddress.IPv4Address(self.address)


def plan_nodes(lab_id: str, subnet: ipaddress.IPv4Network, count: int) -> tuple[LabNode, ...]:
    """Names and addresses of a lab's nodes (pure; ``Lab`` creates them)."""
    if not 2 <= count <= MAX_NODES:
        raise ValueError(f"nodes({count}) must be within 2..{MAX_NODES}")
    return tuple(
        LabNode(
            index=i,
            name=f"node{i}",
            namespace=namespace_name(lab_id, i),
            interface=NODE_INTERFACE,
            host_interface=port_name(lab_id, i),
            address=str(subnet.network_address + i + 1),
        )
        for i in range(count)
    )


def subnet_for(lab_id: str, taken: Sequence[ipaddress.IPv4Network]) -> ipaddress.IPv4Network:
    """The first free /24 of ``SUBNET_BASE``, starting at one derived from ``lab_id``."""
    start = int.from_bytes(lab_id.encode(), "big") % 256
    for step in range(256):
        third = (start + step) % 256
        candidate = ipaddress.IPv4Network(f"10.200.{third}.0/24")
        if not any(candidate.overlaps(net) for net in taken):
            return candidate
    raise LabError(
        "every /24 of 10.200.0.0/16 is in use by a route of this machine: remove leftover labs "
        "with 'python -m launchers.lab down --all'"
    )


def hostfile_text(nodes: Sequence[LabNode], slots: int = 1, title: str = "") -> str:
    """DeepSpeed hostfile naming the nodes by address: ``<address> slots=<slots>`` lines."""
    if slots < 1:
        raise ValueError(f"slots({slots}) must be >= 1")
    lines = [
        f"# Emulated lab {title}: {len(nodes)} nodes (network namespaces on one machine).".replace(
            "  ", " "
        ),
        "# Written per lab by launchers.lab: addresses are per lab. Columns: host slots=ranks.",
    ]
    lines += [f"{node.address} slots={slots}" for node in nodes]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- commands


def _run(
    argv: Sequence[str], check: bool = True, timeout: float = 30
) -> subprocess.CompletedProcess:
    """Run argv (no shell); on failure raise LabError with the command and its stderr."""
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as err:
        raise LabError(f"{argv[0]} not found: install it ({INSTALL_HINT})") from err
    if check and proc.returncode != 0:
        raise LabError(
            f"command failed ({proc.returncode}): {shlex.join(argv)}\n{proc.stderr.strip()}"
        )
    return proc


def _lines(argv: Sequence[str]) -> list[str]:
    return _run(argv, check=False).stdout.split()


def list_namespaces() -> list[str]:
    """Names of all network namespaces (``ip netns list``)."""
    out = _run(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def list_links() -> list[str]:
    """Names of all interfaces of the root namespace (``ip -o link``), without ``@peer``."""
    out = _run(["ip", "-o", "link", "show"], check=False).stdout
    names = []
    for line in out.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            names.append(parts[1].strip().split("@")[0])
    return names


def _taken_networks() -> list[ipaddress.IPv4Network]:
    """Networks the root namespace routes or holds addresses in (the default route excluded)."""
    taken: list[ipaddress.IPv4Network] = []
    for argv in (["ip", "-4", "-j", "route", "show", "table", "all"], ["ip", "-4", "-j", "addr"]):
        try:
            data = json.loads(_run(argv, check=False).stdout or "[]")
        except json.JSONDecodeError:
            continue
        for item in data:
            entries = [item] if "dst" in item else item.get("addr_info", [])
            for entry in entries:
                dst = entry.get("dst") or (
                    f"{entry['local']}/{entry.get('prefixlen', 32)}" if "local" in entry else None
                )
                if not dst or dst == "default":
                    continue
                with contextlib.suppress(ValueError):
                    net = ipaddress.IPv4Network(dst if "/" in dst else f"{dst}/32", strict=False)
                    if net.prefixlen > 0:
                        taken.append(net)
    return taken


def existing_labs() -> list[str]:
    """Ids of labs of ours present on the machine (namespaces, links or state directories)."""
    found: set[str] = set()
    for name in list_namespaces() + list_links():
        if name.startswith(PREFIX) and (lab_id := lab_id_of(name)) and name != lab_id:
            found.add(lab_id)
    for path in Path(tempfile.gettempdir()).glob(f"{PREFIX}*"):
        if path.is_dir() and (lab_id := lab_id_of(path.name)) and path.name != lab_id:
            found.add(lab_id)
    for root, _ in cpu_controller_roots():
        for path in (root / CPU_CGROUP_PARENT).glob(f"{PREFIX}*"):
            if path.is_dir() and (lab_id := lab_id_of(path.name)) and path.name != lab_id:
                found.add(lab_id)
    return sorted(found)


@contextlib.contextmanager
def _creation_lock() -> Iterator[None]:
    """Serialise lab creation on this machine (id and subnet choice must not race)."""
    path = Path(tempfile.gettempdir()) / "mds-bench-lab.lock"
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _namespace_pids(namespace: str) -> list[int]:
    return [int(pid) for pid in _lines(["ip", "netns", "pids", namespace]) if pid.isdigit()]


def _kill_namespace_processes(namespace: str) -> None:
    """Stop every process still inside one of our namespaces (it would keep the namespace)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = _namespace_pids(namespace)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and _namespace_pids(namespace):
            time.sleep(0.05)


def remove_lab(lab_id: str) -> list[str]:
    """Remove every trace of lab ``lab_id`` (processes, namespaces, links, state); idempotent.

    Returns the problems met (empty when everything is gone).
    """
    check_lab_id(lab_id)
    problems: list[str] = []
    namespaces = [ns for ns in list_namespaces() if _is_of_lab(ns, lab_id)]
    for ns in namespaces:
        _kill_namespace_processes(ns)
    for link in list_links():
        if link.startswith(PREFIX) and lab_id_of(link) == lab_id and link != bridge_name(lab_id):
            _run(["ip", "link", "del", link], check=False)
    for ns in namespaces:
        proc = _run(["ip", "netns", "del", ns], check=False)
        if proc.returncode != 0 and ns in list_namespaces():
            problems.append(f"ip netns del {ns}: {proc.stderr.strip()}")
    if bridge_name(lab_id) in list_links():
        _run(["ip", "link", "del", bridge_name(lab_id)], check=False)
    problems += remove_cgroups(lab_id)
    shutil.rmtree(state_dir_of(lab_id), ignore_errors=True)
    left = [n for n in list_namespaces() + list_links() if _is_of_lab(n, lab_id)]
    if left:
        problems.append(f"still present after teardown: {', '.join(left)}")
    return problems


# ----------------------------------------------------------------------------- CPU budget

CPU_CGROUP_PARENT = "mds-bench-lab"
"""Our directory under the cpu controller's root; one child per lab node (``mdsl<id>-n<i>``)."""

CPU_BUDGET_NODES = 4
"""Default budget: the machine's cores divided by this many nodes (0.5 core each on 2 cores),
the same whatever the lab's node count, so that a node of a 4-node lab computes as fast as one of
a 2-node lab, as separate machines would. Labs of more nodes than this oversubscribe the cores."""

CFS_PERIOD_US = 100_000
"""Scheduler period the quota is given in (the kernel's default, 100 ms)."""

PID_NAMESPACE = ["unshare", "--pid", "--mount-proc", "--kill-child"]
"""Each node's sshd runs as PID 1 of its own PID namespace (with its own /proc), as on a machine
of its own: DeepSpeed's pdsh runner stops a run with ``pdsh -w <nodes> pkill -f '<python> -u -m
deepspeed.launcher.launch'``, which in a shared PID namespace also kills every other lab's
launchers and the host's pdsh (their command lines match). ``--kill-child``: when ``unshare``
is stopped, its sshd (and so the whole namespace) goes too."""

JOIN_CGROUP = 'echo $$ > "$0" && exec "$@"'
"""``sh -c`` script: move this shell into the cgroup whose ``cgroup.procs`` is ``$0``, then exec
the command (its pid, and every child it forks, stay in the group)."""


def default_node_cpus() -> float:
    """Cores per node when none is asked: ``os.cpu_count() / CPU_BUDGET_NODES``."""
    return (os.cpu_count() or 1) / CPU_BUDGET_NODES


def cpu_controller_roots(mounts: str | None = None) -> list[tuple[Path, Literal[1, 2]]]:
    """Where the cpu controller can be used: cgroup v2 mounts whose root offers ``cpu``, then
    cgroup v1 hierarchies mounted with the ``cpu`` option (from ``/proc/mounts``)."""
    if mounts is None:
        try:
            mounts = Path("/proc/mounts").read_text()
        except OSError:
            return []
    v2: list[tuple[Path, Literal[1, 2]]] = []
    v1: list[tuple[Path, Literal[1, 2]]] = []
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        path, kind, options = Path(fields[1]), fields[2], fields[3].split(",")
        if kind == "cgroup2":
            with contextlib.suppress(OSError):
                if "cpu" in (path / "cgroup.controllers").read_text().split():
                    v2.append((path, 2))
        elif kind == "cgroup" and "cpu" in options:
            v1.append((path, 1))
    return v2 + v1


def cpu_limit_lines(cpus: float, version: Literal[1, 2]) -> dict[str, str]:
    """Control files and values giving ``cpus`` cores: v2 ``cpu.max`` = "quota period", v1
    ``cpu.cfs_period_us`` then ``cpu.cfs_quota_us`` (both in µs per ``CFS_PERIOD_US``)."""
    if not cpus > 0:
        raise ValueError(f"cpus({cpus}) must be > 0")
    quota = max(1000, round(cpus * CFS_PERIOD_US))
    if version == 2:
        return {"cpu.max": f"{quota} {CFS_PERIOD_US}"}
    return {"cpu.cfs_period_us": str(CFS_PERIOD_US), "cpu.cfs_quota_us": str(quota)}


@dataclass(frozen=True)
class CpuCgroup:
    """A cgroup limiting one lab node to a number of cores (CFS bandwidth control)."""

    path: Path
    """The node's cgroup directory."""
    version: Literal[1, 2]
    """cgroup v2 (``cpu.max``) or v1 (``cpu.cfs_quota_us``)."""
    cpus: float
    """Cores the node's processes may use together, per scheduler period."""

    @classmethod
    def create(cls, name: str, cpus: float) -> CpuCgroup:
        """Make ``<cpu root>/mds-bench-lab/<name>`` with the limit set, or raise LabError."""
        problems = []
        roots = cpu_controller_roots()
        for root, version in roots:
            parent = root / CPU_CGROUP_PARENT
            path = parent / name
            try:
                if version == 2:
                    _write_control(root / "cgroup.subtree_control", "+cpu")
                    parent.mkdir(exist_ok=True)
                    _write_control(parent / "cgroup.subtree_control", "+cpu")
                else:
                    parent.mkdir(exist_ok=True)
                path.mkdir()
                for control, value in cpu_limit_lines(cpus, version).items():
                    _write_control(path / control, value)
                return cls(path, version, cpus)
            except OSError as err:
                with contextlib.suppress(OSError):
                    path.rmdir()
                problems.append(f"{root}: {err.strerror or err}")
        raise LabError(
            "a CPU budget per node needs a writable cpu cgroup (root, and cgroup v2 with the cpu "
            "controller or cgroup v1's cpu hierarchy): "
            + ("; ".join(problems) or "no cpu controller mounted (see /proc/mounts)")
            + "; or run the lab without a budget (node_cpus=None, --node-cpus 0)"
        )

    def join(self, argv: Sequence[str]) -> list[str]:
        """argv that moves itself into this group, then runs ``argv`` (children inherit it).

        On cgroup v2 a process is in one group only: a memory cgroup the executor puts it in
        first (``--mem-limit``) is left by this move.
        """
        return ["sh", "-c", JOIN_CGROUP, str(self.path / "cgroup.procs"), *argv]

    def stat(self) -> dict[str, int]:
        """``cpu.stat`` counters (periods, throttled periods and time; v2 also usage)."""
        out: dict[str, int] = {}
        with contextlib.suppress(OSError):
            for line in (self.path / "cpu.stat").read_text().splitlines():
                key, _, value = line.partition(" ")
                if value.strip().isdigit():
                    out[key] = int(value)
        return out

    def describe(self) -> dict[str, Any]:
        """The group as run.json records it."""
        return {"cgroup": str(self.path), "cgroup_version": self.version, "cpu_stat": self.stat()}


def _write_control(path: Path, value: str) -> None:
    with open(path, "w") as handle:
        handle.write(value)


def _cgroup_pids(path: Path) -> list[int]:
    with contextlib.suppress(OSError):
        return [int(p) for p in (path / "cgroup.procs").read_text().split()]
    return []


def remove_cgroups(lab_id: str) -> list[str]:
    """Remove the CPU cgroups of lab ``lab_id`` (killing what is left in them); the problems."""
    problems = []
    for root, _ in cpu_controller_roots():
        for path in sorted((root / CPU_CGROUP_PARENT).glob(f"{PREFIX}{lab_id}-n*")):
            if not path.is_dir() or not _is_of_lab(path.name, lab_id):
                continue
            for pid in _cgroup_pids(path):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 5
            while True:
                try:
                    path.rmdir()
                    break
                except OSError as err:
                    if time.monotonic() > deadline:
                        problems.append(f"cgroup {path}: {err.strerror or err}")
                        break
                    time.sleep(0.05)
    return problems


# ----------------------------------------------------------------------------- signals

_ACTIVE: list[Lab] = []
_PREVIOUS_HANDLERS: dict[int, Any] = {}
_ATEXIT_REGISTERED = False


def _teardown_active() -> None:
    """Tear down every lab of this process (signal handlers, atexit)."""
    problems = []
    for lab in reversed(list(_ACTIVE)):
        try:
            lab.down()
        except LabError as err:
            problems.append(str(err))
    if problems:
        raise LabError("; ".join(problems))


def _on_signal(signum: int, frame: FrameType | None) -> None:
    """Tear every lab of this process down, then behave as the previous handler would."""
    previous = _PREVIOUS_HANDLERS.get(signum, signal.SIG_DFL)
    try:
        _teardown_active()
    except LabError as err:  # still end as the signal asks; say what is left
        print(f"launchers.lab: {err}", file=sys.stderr)
    _PREVIOUS_HANDLERS.pop(signum, None)
    signal.signal(signum, previous)
    if callable(previous):
        previous(signum, frame)
    elif previous != signal.SIG_IGN:
        os.kill(os.getpid(), signum)


def _install_handlers() -> None:
    global _ATEXIT_REGISTERED
    if not _ATEXIT_REGISTERED:
        atexit.register(_teardown_active)
        _ATEXIT_REGISTERED = True
    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers can only be set from the main thread; atexit still applies
    for sig in (signal.SIGINT, signal.SIGTERM):
        if sig not in _PREVIOUS_HANDLERS:
            _PREVIOUS_HANDLERS[sig] = signal.getsignal(sig)
            signal.signal(sig, _on_signal)


def _restore_handlers() -> None:
    if _ACTIVE or threading.current_thread() is not threading.main_thread():
        return
    for sig, previous in list(_PREVIOUS_HANDLERS.items()):
        if signal.getsignal(sig) is _on_signal:
            signal.signal(sig, previous)
        del _PREVIOUS_HANDLERS[sig]


# ----------------------------------------------------------------------------- the lab


def check_prerequisites(ssh: bool) -> None:
    """Raise LabError naming what is missing to run a lab (root, ip, tc, sshd, ssh, pdsh)."""
    if os.geteuid() != 0:
        raise LabError("the lab needs root (network namespaces, veth, tc): run it with sudo")
    tools = ["ip", "tc"] + (["ssh", "ssh-keygen", "pdsh", "unshare"] if ssh else [])
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if ssh and not os.access(SSHD, os.X_OK):
        missing.append(SSHD)
    if missing:
        raise LabError(f"missing {', '.join(missing)}: {INSTALL_HINT}")


LAB_LAUNCHERS: dict[str, str] = {
    "pdsh": "DeepSpeed's pdsh runner over the lab's ssh (the default)",
    "no_ssh": "launch.sh NODE_RANK started inside each node's namespace",
    "openmpi": "DeepSpeed's openmpi runner: mpirun over the lab's ssh",
    "slurm": "DeepSpeed's slurm runner: srun inside a salloc allocation of the lab's Slurm cluster",
}
"""Launchers a lab serves, and how. Any other is refused: a lab never runs a request through a
launcher other than the one asked for."""

LAB_TRANSPORTS: dict[str, str] = {
    "pdsh": "ssh",
    "no_ssh": "netns-exec",
    "openmpi": "openmpi",
    "slurm": "slurm",
}
"""run.json's ``network.transport`` per lab launcher: how the ranks reached the nodes."""

LAUNCHER_TOOLS: dict[str, tuple[tuple[str, ...], str]] = {
    "pdsh": (("ssh", "ssh-keygen", "pdsh", SSHD), INSTALL_HINT),
    "no_ssh": ((), INSTALL_HINT),
    "openmpi": (("ssh", "ssh-keygen", SSHD, "pdsh", "mpirun", "ompi_info"),
                "apt-get install -y openmpi-bin openssh-server openssh-client pdsh"),
    "slurm": (("munged", "slurmctld", "slurmd", "sinfo", "squeue", "scontrol", "scancel",
               "salloc", "srun", "nsenter", "unshare"), "apt-get install -y slurm-wlm munge"),
}  # fmt: skip
"""Executables each lab launcher needs beyond ``ip`` and ``tc``, and the Debian packages."""


def lab_launcher(requested: str | None) -> str:
    """The launcher a lab runs a request with: the one asked for, or pdsh when none was.

    Raises LabError for a launcher the lab cannot serve (``local`` starts every rank on this
    machine outside the nodes), naming those it serves: never another one in its place.
    """
    if requested is None:
        return "pdsh"
    if requested not in LAB_LAUNCHERS:
        why = {
            "local": "it starts every rank on this machine, outside the lab's nodes and links"
        }.get(requested, "the lab does not know it")
        served = "; ".join(f"{name}: {how}" for name, how in LAB_LAUNCHERS.items())
        raise LabError(
            f"launcher {requested!r} cannot run on the lab: {why}. The lab serves {served}"
        )
    return requested


def missing_launcher_tools(launcher: str) -> list[str]:
    """Executables ``launcher`` needs in a lab that this machine lacks."""
    tools, _ = LAUNCHER_TOOLS[lab_launcher(launcher)]
    return [t for t in tools if not _executable(t)]


def _executable(tool: str) -> bool:
    """Whether ``tool`` (a name on PATH, or an absolute path) can be run."""
    return os.access(tool, os.X_OK) if "/" in tool else shutil.which(tool) is not None


def check_launcher(launcher: str) -> None:
    """Raise LabError saying what is missing for a lab run with ``launcher`` (root included)."""
    check_prerequisites(ssh=False)
    missing = missing_launcher_tools(launcher)
    if missing:
        hint = LAUNCHER_TOOLS[launcher][1]
        raise LabError(
            f"launcher {launcher} in the lab needs {', '.join(missing)}, missing here: {hint} "
            "(the lab does not fall back to another launcher)"
        )


class Lab:
    """An emulated cluster, created on ``__enter__`` and removed on ``__exit__``.

    Teardown also runs on exceptions, SIGINT, SIGTERM (then the signal's previous behaviour
    follows) and at interpreter exit. ``ssh=True`` runs sshd inside every node so the real
    ``deepspeed --hostfile`` launcher reaches the nodes through pdsh; ``ssh=False`` is for
    ``deepspeed --no_ssh`` per node through ``wrap``.

    ``node_cpus``: cores each node may use (a cgroup per node with a CFS quota, holding the
    node's sshd and every process ``wrap`` starts, and so everything they start): ``"auto"``
    (default) gives ``default_node_cpus()`` where a cpu cgroup can be made and no budget (said in
    ``describe``) where not; a number requires it; None gives no budget (nodes share the cores).
    """

    def __init__(
        self,
        nodes: int = 2,
        shape: LinkShape | None = None,
        name: str | None = None,
        ssh: bool = True,
        node_cpus: float | Literal["auto"] | None = "auto",
    ) -> None:
        if not 2 <= nodes <= MAX_NODES:
            raise ValueError(f"nodes({nodes}) must be within 2..{MAX_NODES}")
        if node_cpus != "auto" and node_cpus is not None and not 0 < node_cpus <= 1024:
            raise ValueError(f"node_cpus({node_cpus}) must be > 0 (cores), 'auto' or None")
        self.node_cpus = node_cpus
        self.cgroups: list[CpuCgroup] = []
        self.cpu_note = ""
        self.node_count = nodes
        self.shape = shape or LinkShape()
        self.requested_name = check_lab_id(name) if name is not None else None
        self.ssh = ssh
        self.id = ""
        self.subnet: ipaddress.IPv4Network | None = None
        self.nodes: tuple[LabNode, ...] = ()
        self.shaping_commands: list[str] = []
        self.segmentation: list[str] = []
        self._sshd: list[subprocess.Popen] = []
        self._is_up = False

    # -- life cycle

    def __enter__(self) -> Lab:
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def up(self) -> Lab:
        """Create namespaces, bridge, veths, addresses, shaping and (ssh) the sshds."""
        if self._is_up:
            return self
        check_prerequisites(self.ssh)
        _ACTIVE.append(self)
        _install_handlers()
        try:
            with _creation_lock():
                self._claim_id_and_subnet()
                self._is_up = True
                self._create_network()
                self._create_cgroups()
            if self.ssh:
                self._start_ssh()
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> None:
        """Remove everything this lab created; safe to call twice; raises if something stays."""
        if self in _ACTIVE:
            _ACTIVE.remove(self)
        _restore_handlers()
        if not self._is_up:
            return
        self._is_up = False
        for proc in self._sshd:
            if proc.poll() is None:
                proc.terminate()
        for proc in self._sshd:
            try:
                proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._sshd = []
        problems = remove_lab(self.id)
        if problems:
            raise LabError(
                f"lab {self.name} not fully removed: {'; '.join(problems)}. "
                f"Retry with 'python -m launchers.lab down {self.id}'"
            )

    def _claim_id_and_subnet(self) -> None:
        present = set(existing_labs())
        if self.requested_name is not None:
            if self.requested_name in present:
                raise LabError(
                    f"lab {PREFIX}{self.requested_name} already exists: remove it with "
                    f"'python -m launchers.lab down {self.requested_name}' or pick another name"
                )
            self.id = self.requested_name
        else:
            self.id = new_lab_id()
            while self.id in present:
                self.id = new_lab_id()
        self.subnet = subnet_for(self.id, _taken_networks())
        self.nodes = plan_nodes(self.id, self.subnet, self.node_count)
        self.state_dir.mkdir(mode=0o700)

    def _create_network(self) -> None:
        assert self.subnet is not None
        br = bridge_name(self.id)
        _run(["ip", "link", "add", br, "type", "bridge", "stp_state", "0"])
        _disable_ipv6_here(br)
        _run(["ip", "addr", "add", f"{self.host_address}/24", "dev", br])
        _run(["ip", "link", "set", br, "up"])
        self._limit_segments(br, None)  # the host's own traffic to the nodes (ssh)
        for node in self.nodes:
            ns = node.namespace
            _run(["ip", "netns", "add", ns])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            # No IPv6 on the lab links: router/neighbour solicitations would add bytes to the
            # counters that serve as ground truth. The default applies to eth0 created below.
            if shutil.which("sysctl"):
                _run(["ip", "netns", "exec", ns, "sysctl", "-q", "-w",
                      "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"],
                     check=False)  # fmt: skip
            _run(["ip", "link", "add", node.host_interface, "type", "veth",
                  "peer", "name", node.interface, "netns", ns])  # fmt: skip
            _disable_ipv6_here(node.host_interface)
            _run(["ip", "link", "set", node.host_interface, "master", br])
            _run(["ip", "link", "set", node.host_interface, "up"])
            _run(["ip", "-n", ns, "addr", "add", f"{node.address}/24", "dev", node.interface])
            _run(["ip", "-n", ns, "link", "set", node.interface, "up"])
            self._limit_segments(node.interface, ns)
            self._limit_segments(node.host_interface, None)
            for argv in [
                *self.shape.tc_commands(node.interface, ns, uplink=True),
                *self.shape.tc_commands(node.host_interface, None, uplink=False),
            ]:
                proc = _run(argv, check=False)
                if proc.returncode != 0 and "netem" in argv and "unknown" in proc.stderr:
                    raise LabError(
                        "this kernel has no netem qdisc (sch_netem, CONFIG_NET_SCH_NETEM), needed "
                        "for delay and loss: load it with 'modprobe sch_netem', or shape the "
                        "rate only (delay_ms=0, loss_pct=0)"
                    )
                if proc.returncode != 0:
                    raise LabError(f"command failed: {shlex.join(argv)}\n{proc.stderr.strip()}")
                self.shaping_commands.append(shlex.join(argv))

    def _limit_segments(self, dev: str, netns: str | None) -> None:
        """Apply ``LinkShape.segmentation_commands``; where this iproute2 or kernel cannot, say
        so in ``describe`` (tbf then splits super-packets itself: right, only dearer)."""
        for argv in self.shape.segmentation_commands(dev, netns):
            proc = _run(argv, check=False)
            if proc.returncode == 0:
                self.segmentation.append(shlex.join(argv))
            else:
                self.segmentation.append(f"failed: {shlex.join(argv)}: {proc.stderr.strip()}")

    def _create_cgroups(self) -> None:
        """One CPU cgroup per node (``node_cpus``), or the reason there is none."""
        if self.node_cpus is None:
            self.cpu_note = "no budget asked: the nodes share the machine's cores"
            return
        cpus = default_node_cpus() if self.node_cpus == "auto" else float(self.node_cpus)
        try:
            for node in self.nodes:
                self.cgroups.append(CpuCgroup.create(node.namespace, cpus))
        except LabError as err:
            if self.node_cpus != "auto":
                raise
            for group in self.cgroups:
                with contextlib.suppress(OSError):
                    group.path.rmdir()
            self.cgroups = []
            self.cpu_note = f"no budget: {err}"
            print(f"lab {self.name}: nodes share the machine's cores ({err})", file=sys.stderr)
            return
        self.cpu_note = (
            f"{cpus:g} cores per node, the same whatever the node count "
            f"({os.cpu_count()} on this machine)"
        )

    def in_node_cgroup(self, node_index: int, argv: Sequence[str]) -> list[str]:
        """argv that joins node ``node_index``'s CPU cgroup, then runs ``argv`` (no budget:
        ``argv`` itself)."""
        if not self.cgroups:
            return list(argv)
        return self.cgroups[node_index].join(argv)

    # -- ssh

    @property
    def state_dir(self) -> Path:
        """The lab's private directory (keys, configs, hostfile, logs); removed on teardown."""
        if not self.id:
            raise LabError("the lab is not up: use it as 'with Lab(...) as lab:'")
        return state_dir_of(self.id)

    @property
    def ssh_config_path(self) -> Path:
        """ssh client configuration reaching every node as root with the lab's key."""
        return self.state_dir / "ssh_config"

    def _start_ssh(self) -> None:
        key = self.state_dir / "id_ed25519"
        host_key = self.state_dir / "ssh_host_ed25519_key"
        for path, comment in ((key, f"{PREFIX}{self.id}"), (host_key, f"{PREFIX}{self.id}-host")):
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])
        (self.state_dir / "authorized_keys").write_text(
            (key.with_suffix(".pub")).read_text(), encoding="utf-8"
        )
        (self.state_dir / "authorized_keys").chmod(0o600)
        self.ssh_config_path.write_text(self._ssh_client_config(), encoding="utf-8")
        # sshd's privilege-separation directory (normally made by the service unit at boot).
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        for node in self.nodes:
            config = self.state_dir / f"sshd_config.{node.name}"
            config.write_text(self._sshd_config(node, host_key), encoding="utf-8")
            log = open(self.state_dir / f"sshd.{node.name}.log", "ab")  # noqa: SIM115
            with log:
                sshd = ["ip", "netns", "exec", node.namespace, *PID_NAMESPACE,
                        SSHD, "-D", "-e", "-f", str(config)]  # fmt: skip
                self._sshd.append(
                    subprocess.Popen(
                        self.in_node_cgroup(node.index, sshd),
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=log,
                    )
                )
        for node, proc in zip(self.nodes, self._sshd, strict=True):
            self._wait_for_sshd(node, proc)
        for node in self.nodes:
            proc = _run(self.ssh_argv(node.index, ["true"]), check=False, timeout=20)
            if proc.returncode != 0:
                raise LabError(
                    f"ssh into {node.name} ({node.address}) failed: {proc.stderr.strip()}; "
                    f"see {self.state_dir}/sshd.{node.name}.log"
                )

    def daemon_pids(self) -> list[int]:
        """The lab's own processes inside the nodes (each sshd and its ``unshare`` parent): what
        a sweep of leftovers must spare."""
        pids = []
        for proc in self._sshd:
            pids.append(proc.pid)
            with contextlib.suppress(OSError):
                children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text()
                pids += [int(pid) for pid in children.split()]
        return pids

    def _wait_for_sshd(self, node: LabNode, proc: subprocess.Popen, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                log = (self.state_dir / f"sshd.{node.name}.log").read_text(errors="replace")
                raise LabError(f"sshd in {node.name} exited ({proc.returncode}): {log.strip()}")
            with socket.socket() as sock:
                sock.settimeout(0.5)
                if sock.connect_ex((node.address, SSH_PORT)) == 0:
                    return
            time.sleep(0.1)
        raise LabError(f"sshd in {node.name} not listening on {node.address}:{SSH_PORT}")

    def _sshd_config(self, node: LabNode, host_key: Path) -> str:
        return "\n".join(
            [
                f"# sshd of lab {self.name}, {node.name}: only on the node's lab address.",
                f"ListenAddress {node.address}:{SSH_PORT}",
                f"HostKey {host_key}",
                f"AuthorizedKeysFile {self.state_dir / 'authorized_keys'}",
                f"PidFile {self.state_dir / f'sshd.{node.name}.pid'}",
                "PermitRootLogin prohibit-password",
                "PubkeyAuthentication yes",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "UsePAM no",
                # The key lives in a private temporary directory, not under ~/.ssh.
                "StrictModes no",
                "PrintMotd no",
                "PrintLastLog no",
                "UseDNS no",
                "MaxStartups 100:30:200",
                "MaxSessions 100",
                "",
            ]
        )

    def _ssh_client_config(self) -> str:
        lines = [f"# ssh client configuration of lab {self.name} (used with ssh -F)."]
        for node in self.nodes:
            lines += [
                f"Host {node.address} {node.name}",
                f"  HostName {node.address}",
                "  User root",
                f"  IdentityFile {self.state_dir / 'id_ed25519'}",
                "  IdentitiesOnly yes",
                "  StrictHostKeyChecking no",
                "  UserKnownHostsFile /dev/null",
                "  LogLevel ERROR",
                "  BatchMode yes",
                "  ConnectTimeout 10",
            ]
        return "\n".join(lines) + "\n"

    def ssh_argv(self, node_index: int, argv: Sequence[str]) -> list[str]:
        """argv running ``argv`` on a node over the lab's ssh (the remote shell gets it quoted)."""
        self._require_ssh()
        node = self.nodes[node_index]
        return ["ssh", "-F", str(self.ssh_config_path), node.address, shlex.join(argv)]

    def _require_ssh(self) -> None:
        if not self.ssh or not self._is_up:
            raise LabError("this needs a running lab created with ssh=True (the default)")

    # -- what callers use

    @property
    def name(self) -> str:
        """The lab's name: ``mdsl<id>`` (prefix of all its namespaces and interfaces)."""
        return f"{PREFIX}{self.id}"

    @property
    def master_addr(self) -> str:
        """Address of node 0 (``--master_addr``)."""
        self._require_nodes()
        return self.nodes[0].address

    @property
    def host_address(self) -> str:
        """The host's own address on the lab bridge."""
        assert self.subnet is not None
        return str(self.subnet.network_address + HOST_OCTET)

    def _require_nodes(self) -> None:
        if not self.nodes:
            raise LabError("the lab is not up: use it as 'with Lab(...) as lab:'")

    def node_env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """Environment every rank on a node needs (the same on every node), plus ``extra``.

        ``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME`` bind collectives to the lab link;
        ``DS_ACCELERATOR=cpu`` and ``OMP_NUM_THREADS=1`` are the CPU settings; ``PATH`` starts
        with this interpreter's directory (the venv's ``bin``).
        """
        env = {
            "GLOO_SOCKET_IFNAME": NODE_INTERFACE,
            "NCCL_SOCKET_IFNAME": NODE_INTERFACE,
            "DS_ACCELERATOR": "cpu",
            "OMP_NUM_THREADS": "1",
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        }
        env.update(extra or {})
        for key in env:
            if not _ENV_KEY_RE.match(key):
                raise ValueError(f"environment variable name {key!r} is not a valid name")
        return env

    def wrap(
        self, node_index: int, argv: Sequence[str], env: Mapping[str, str] | None = None
    ) -> list[str]:
        """argv running ``argv`` inside node ``node_index`` with ``node_env(env)`` (no ssh)."""
        self._require_nodes()
        if not 0 <= node_index < len(self.nodes):
            raise IndexError(f"node_index({node_index}) must be within 0..{len(self.nodes) - 1}")
        if not argv or "=" in argv[0]:
            raise ValueError(f"argv must start with a program name, got {list(argv)[:1]}")
        assigns = [f"{key}={value}" for key, value in self.node_env(env).items()]
        inside = ["ip", "netns", "exec", self.nodes[node_index].namespace, "env", *assigns, *argv]
        return self.in_node_cgroup(node_index, inside)

    def hostfile_text(self, slots: int = 1) -> str:
        """DeepSpeed hostfile of this lab (node addresses as host names)."""
        self._require_nodes()
        return hostfile_text(self.nodes, slots, title=f"{self.name} ({self.shape.label})")

    def write_hostfile(self, path: Path | None = None, slots: int = 1) -> Path:
        """Write ``hostfile_text`` to ``path`` (default: the lab's state directory)."""
        target = path or self.state_dir / "hostfile"
        target.write_text(self.hostfile_text(slots), encoding="utf-8")
        return target

    def write_deepspeed_env(self, extra: Mapping[str, str] | None = None) -> Path:
        """Write the node environment as a DeepSpeed env file (``KEY=VALUE`` lines).

        DeepSpeed's runner exports only ``PYTHON*``, ``MLFLOW*``, ``MV2*``, ``UCX*`` (and on CUDA
        ``NCCL*``) from the launcher's environment to pdsh ranks, plus every line of the file
        named by ``DS_ENV_FILE`` (default ``.deepspeed_env`` in ``~`` or the current directory).
        It wraps values in double quotes for the remote shell, so quotes, ``$``, backquotes and
        backslashes cannot be passed and are rejected here.
        """
        env = self.node_env(extra)
        bad = {k: v for k, v in env.items() if re.search(r"[\"$`\\\n]", v)}
        if bad:
            raise ValueError(f"values with quotes, $, ` or \\ cannot pass through pdsh: {bad}")
        path = self.state_dir / "deepspeed_env"
        path.write_text("".join(f"{k}={v}\n" for k, v in env.items()), encoding="utf-8")
        return path

    def launcher_env(
        self, extra: Mapping[str, str] | None = None, base: Mapping[str, str] | None = None
    ) -> dict[str, str]:
        """Environment for the host's ``deepspeed --hostfile`` process (ssh path).

        ``PDSH_SSH_ARGS_APPEND=-F <ssh_config>``: pdsh adds it to every ssh command line, and
        DeepSpeed's PDSHRunner keeps it (it only appends ``-p`` when ``--ssh_port`` is given);
        ``DS_ENV_FILE`` (an absolute path: the runner joins it to ``~`` and ``.``, which keeps an
        absolute path as is) carries ``node_env(extra)`` to every rank.
        """
        self._require_ssh()
        env = dict(os.environ if base is None else base)
        append = env.get("PDSH_SSH_ARGS_APPEND", "")
        env["PDSH_SSH_ARGS_APPEND"] = f"{append} -F {self.ssh_config_path}".strip()
        env["PDSH_RCMD_TYPE"] = "ssh"
        env["DS_ENV_FILE"] = str(self.write_deepspeed_env(extra))
        return env

    def openmpi_env(
        self, extra: Mapping[str, str] | None = None, base: Mapping[str, str] | None = None
    ) -> dict[str, str]:
        """Environment for the host's ``deepspeed --launcher openmpi`` (mpirun over the lab's ssh).

        ``OMPI_MCA_plm_rsh_args=-F <ssh_config>``: mpirun starts its ``orted`` on every node
        with ssh and these arguments; ``OMPI_MCA_oob_tcp_if_include``: the lab's subnet, so every
        ``orted`` calls mpirun back on the host's address on this lab's bridge (not on another
        lab's); as root Open MPI refuses to start unless ``OMPI_ALLOW_RUN_AS_ROOT`` and
        ``OMPI_ALLOW_RUN_AS_ROOT_CONFIRM`` are 1. ``DS_ENV_FILE`` carries ``node_env(extra)``:
        DeepSpeed's OpenMPIRunner passes each of its lines to the ranks with ``mpirun -x``.
        """
        self._require_ssh()
        env = dict(os.environ if base is None else base)
        append = env.get("OMPI_MCA_plm_rsh_args", "")
        env["OMPI_MCA_plm_rsh_args"] = f"{append} -F {self.ssh_config_path}".strip()
        env["OMPI_MCA_oob_tcp_if_include"] = str(self.subnet)
        if os.geteuid() == 0:
            env["OMPI_ALLOW_RUN_AS_ROOT"] = env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
        env["DS_ENV_FILE"] = str(self.write_deepspeed_env(extra))
        return env

    def deepspeed_args(self, hostfile: Path, master_port: int = 29500) -> list[str]:
        """Launcher flags for the ssh path: hostfile, master address and port, no ssh check.

        ``--no_ssh_check``: DeepSpeed's check runs a bare ``ssh HOST hostname`` that ignores
        ``PDSH_SSH_ARGS_APPEND`` and so cannot use the lab's key; ``up`` already checked ssh
        to every node with it. ``--master_addr`` avoids the runner's ``ssh HOST hostname -I``.
        """
        return ["--hostfile", str(hostfile), "--master_addr", self.master_addr,
                "--master_port", str(master_port), "--no_ssh_check"]  # fmt: skip

    def counters(self) -> dict[str, dict[str, int]]:
        """Byte and packet counters of every node's interface, read inside its namespace.

        Bytes include the Ethernet/IP/TCP headers. Packets are as the kernel sees them: offload
        packets of up to ``LinkShape.segment_bytes`` (half the tbf bucket) on a shaped link, of
        up to 64 KiB unshaped; not frames.
        """
        self._require_nodes()
        result: dict[str, dict[str, int]] = {}
        for node in self.nodes:
            files = [f"/sys/class/net/{node.interface}/statistics/{c}" for c in COUNTERS]
            out = _run(["ip", "netns", "exec", node.namespace, "cat", *files]).stdout.split()
            result[node.name] = {
                name: int(value) for name, value in zip(COUNTERS, out, strict=True)
            }
        return result

    def describe(self) -> dict[str, Any]:
        """The network as run.json's ``"network"`` value (link, nodes, addresses, tc commands)."""
        self._require_nodes()
        return {
            "kind": "emulated",
            "lab": self.name,
            "link": self.shape.label,
            "rate_mbit": self.shape.rate_mbit,
            "delay_ms": self.shape.delay_ms,
            "loss_pct": self.shape.loss_pct,
            "topology": "bridge",
            "transport": "ssh" if self.ssh else "netns-exec",
            "subnet": str(self.subnet),
            "host_address": self.host_address,
            "nodes": [
                {
                    "name": n.name,
                    "namespace": n.namespace,
                    "interface": n.interface,
                    "host_interface": n.host_interface,
                    "address": n.address,
                }
                for n in self.nodes
            ],
            "shaping": list(self.shaping_commands),
            "segmentation": list(self.segmentation),
            "burst_bytes": self.shape.burst_bytes() or None,
            "burst_ms": self.shape.burst_ms if self.shape.rate_mbit is not None else None,
            "node_cpu": self.describe_cpu(),
        }

    def describe_cpu(self) -> dict[str, Any]:
        """run.json's ``network.node_cpu``: the cores each node may use (None: no budget), how,
        and each node's ``cpu.stat`` (throttled periods show the budget binding)."""
        cpus = self.cgroups[0].cpus if self.cgroups else None
        return {
            "cpus": cpus,
            "machine_cpus": os.cpu_count(),
            "mechanism": (
                f"cgroup v{self.cgroups[0].version} CFS quota "
                f"{cpu_limit_lines(cpus, self.cgroups[0].version)} per node"
                if self.cgroups and cpus
                else None
            ),
            "note": self.cpu_note,
            "nodes": {n.name: g.describe() for n, g in zip(self.nodes, self.cgroups, strict=False)},
        }


def _disable_ipv6_here(interface: str) -> None:
    """Turn IPv6 off on one of our root-namespace interfaces (see ``_create_network``)."""
    path = Path("/proc/sys/net/ipv6/conf") / interface / "disable_ipv6"
    with contextlib.suppress(OSError):
        path.write_text("1")


# ----------------------------------------------------------------------------- CLI


@contextlib.contextmanager
def _slurm(lab: Lab, args: argparse.Namespace) -> Iterator[None]:
    """``up --slurm``: the lab's Slurm cluster for as long as the lab is up."""
    if not args.slurm:
        yield
        return
    from launchers.lab_slurm import SlurmCluster

    with SlurmCluster(lab):
        yield


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m launchers.lab up|down|list``."""
    parser = argparse.ArgumentParser(
        prog="python -m launchers.lab", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="create a lab and keep it until Ctrl-C / SIGTERM")
    up.add_argument("--nodes", type=int, default=2, help="number of nodes (default 2)")
    up.add_argument("--link", default="none", help="rate: 100mbit, 1gbit, none (default none)")
    up.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay per node, ms")
    up.add_argument("--loss-pct", type=float, default=0.0, help="packet loss per node, percent")
    up.add_argument("--burst-ms", type=float, default=DEFAULT_BURST_MS,
                    help=f"tbf bucket, ms at the rate (default {DEFAULT_BURST_MS:g})")  # fmt: skip
    up.add_argument("--node-cpus", type=float, default=None,
                    help="cores per node (default: cores / 4; 0: no budget)")  # fmt: skip
    up.add_argument("--name", default=None, help="lab id, 1-6 of a-z0-9 (default: random)")
    up.add_argument("--no_ssh", "--no-ssh", action="store_true", help="no sshd in the nodes")
    up.add_argument(
        "--slurm", action="store_true", help="also a Slurm cluster (slurmctld, a slurmd per node)"
    )
    down = sub.add_parser("down", help="remove a lab by name, or every lab of ours with --all")
    down.add_argument("name", nargs="?", help="lab name (mdsl<id>) or id")
    down.add_argument("--all", action="store_true", help="remove every leftover mdsl* lab")
    sub.add_parser("list", help="list labs present on this machine")
    args = parser.parse_args(argv)

    if args.command == "list":
        for lab_id in existing_labs():
            namespaces = [ns for ns in list_namespaces() if lab_id_of(ns) == lab_id]
            print(f"{PREFIX}{lab_id}\t{len(namespaces)} namespaces\t{' '.join(namespaces)}")
        return 0
    if args.command == "down":
        if args.all == bool(args.name):
            parser.error("down takes a lab name or --all (one of the two)")
        ids = existing_labs() if args.all else [lab_id_of(args.name) or args.name]
        status = 0
        for lab_id in ids:
            problems = remove_lab(check_lab_id(lab_id))
            print(f"{PREFIX}{lab_id}: " + ("removed" if not problems else "; ".join(problems)))
            status |= bool(problems)
        return status
    shape = LinkShape.parse(args.link, args.delay_ms, args.loss_pct, args.burst_ms)
    if args.node_cpus is not None and args.node_cpus < 0:
        parser.error(f"--node-cpus {args.node_cpus:g}: cores per node, > 0 (0: no budget)")
    cpus = "auto" if args.node_cpus is None else (args.node_cpus or None)
    with (
        Lab(args.nodes, shape, name=args.name, ssh=not args.no_ssh, node_cpus=cpus) as lab,
        _slurm(lab, args),
    ):
        hostfile = lab.write_hostfile()
        print(json.dumps(lab.describe(), indent=2))
        print(f"hostfile: {hostfile}")
        if lab.ssh:
            env = lab.launcher_env(base={})
            print(f"ssh: ssh -F {lab.ssh_config_path} {lab.master_addr}")
            print("launcher env: " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()))
        if args.slurm:
            conf = lab.state_dir / "slurm" / "slurm.conf"
            print(f"slurm: SLURM_CONF={conf} sinfo   (salloc, srun, sbatch, squeue, scancel)")
        print(f"remove: Ctrl-C, or 'python -m launchers.lab down {lab.id}'", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
    return 0


if __name__ == "__main__":
    sys.exit(main())
