"""The lab's network: link shape (tc tbf/netem), names of namespaces, bridge and ports,
address plan, hostfile text, and the ip/netns commands that list and clear them.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import re
import secrets
import shlex
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from analysis.theory.formulas import parse_rate

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
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
"""A valid environment variable name (``Lab.node_env`` checks every key)."""

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


def is_of_lab(name: str, lab_id: str) -> bool:
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


def run_command(
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


def command_words(argv: Sequence[str]) -> list[str]:
    """The whitespace-separated words argv prints (its failure ignored)."""
    return run_command(argv, check=False).stdout.split()


def list_namespaces() -> list[str]:
    """Names of all network namespaces (``ip netns list``)."""
    out = run_command(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def list_links() -> list[str]:
    """Names of all interfaces of the root namespace (``ip -o link``), without ``@peer``."""
    out = run_command(["ip", "-o", "link", "show"], check=False).stdout
    names = []
    for line in out.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            names.append(parts[1].strip().split("@")[0])
    return names


def taken_networks() -> list[ipaddress.IPv4Network]:
    """Networks the root namespace routes or holds addresses in (the default route excluded)."""
    taken: list[ipaddress.IPv4Network] = []
    for argv in (["ip", "-4", "-j", "route", "show", "table", "all"], ["ip", "-4", "-j", "addr"]):
        try:
            data = json.loads(run_command(argv, check=False).stdout or "[]")
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


@contextlib.contextmanager
def creation_lock() -> Iterator[None]:
    """Serialise lab creation on this machine (id and subnet choice must not race)."""
    path = Path(tempfile.gettempdir()) / "mds-bench-lab.lock"
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def namespace_pids(namespace: str) -> list[int]:
    """Processes inside a network namespace (``ip netns pids``)."""
    return [int(pid) for pid in command_words(["ip", "netns", "pids", namespace]) if pid.isdigit()]


def kill_namespace_processes(namespace: str) -> None:
    """Stop every process still inside one of our namespaces (it would keep the namespace)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = namespace_pids(namespace)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and namespace_pids(namespace):
            time.sleep(0.05)
