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

import atexit
import contextlib
import ipaddress
import os
import re
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
from pathlib import Path
from types import FrameType
from typing import Any, Literal

from launchers.lab.cpu import (
    CPU_CGROUP_PARENT,
    PID_NAMESPACE,
    CpuCgroup,
    default_node_cpus,
    remove_cgroups,
)
from launchers.lab.faults import Faults
from launchers.lab.net import (
    COUNTERS,
    ENV_KEY_RE,
    HOST_OCTET,
    MAX_NODES,
    NODE_INTERFACE,
    PREFIX,
    SSH_PORT,
    SSHD,
    LabError,
    LabNode,
    LinkShape,
    bridge_name,
    check_lab_id,
    creation_lock,
    hostfile_text,
    is_of_lab,
    kill_namespace_processes,
    lab_id_of,
    list_links,
    list_namespaces,
    new_lab_id,
    plan_nodes,
    run_command,
    state_dir_of,
    subnet_for,
    taken_networks,
)
from launchers.lab.tools import check_prerequisites
from launchers.run.cgroup import cpu_controller_roots, cpu_limit_lines


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


def remove_lab(lab_id: str) -> list[str]:
    """Remove every trace of lab ``lab_id`` (processes, namespaces, links, state); idempotent.

    Returns the problems met (empty when everything is gone).
    """
    check_lab_id(lab_id)
    problems: list[str] = []
    namespaces = [ns for ns in list_namespaces() if is_of_lab(ns, lab_id)]
    for ns in namespaces:
        kill_namespace_processes(ns)
    for link in list_links():
        if link.startswith(PREFIX) and lab_id_of(link) == lab_id and link != bridge_name(lab_id):
            run_command(["ip", "link", "del", link], check=False)
    for ns in namespaces:
        proc = run_command(["ip", "netns", "del", ns], check=False)
        if proc.returncode != 0 and ns in list_namespaces():
            problems.append(f"ip netns del {ns}: {proc.stderr.strip()}")
    if bridge_name(lab_id) in list_links():
        run_command(["ip", "link", "del", bridge_name(lab_id)], check=False)
    problems += remove_cgroups(lab_id)
    shutil.rmtree(state_dir_of(lab_id), ignore_errors=True)
    left = [n for n in list_namespaces() + list_links() if is_of_lab(n, lab_id)]
    if left:
        problems.append(f"still present after teardown: {', '.join(left)}")
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
        print(f"launchers.lab.cluster: {err}", file=sys.stderr)
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

    ``faults`` (``launchers.lab.faults``): nodes given fewer cores or a slower link than the
    rest; checked here, before anything is made; a slow node requires the CPU budget.
    """

    def __init__(
        self,
        nodes: int = 2,
        shape: LinkShape | None = None,
        name: str | None = None,
        ssh: bool = True,
        node_cpus: float | Literal["auto"] | None = "auto",
        faults: Faults | None = None,
    ) -> None:
        if not 2 <= nodes <= MAX_NODES:
            raise ValueError(f"nodes({nodes}) must be within 2..{MAX_NODES}")
        if node_cpus != "auto" and node_cpus is not None and not 0 < node_cpus <= 1024:
            raise ValueError(f"node_cpus({node_cpus}) must be > 0 (cores), 'auto' or None")
        self.faults = faults or Faults()
        budget = default_node_cpus() if node_cpus == "auto" else node_cpus
        self.faults.check(nodes, shape or LinkShape(), budget)
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
            with creation_lock():
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
        self.subnet = subnet_for(self.id, taken_networks())
        self.nodes = plan_nodes(self.id, self.subnet, self.node_count)
        self.state_dir.mkdir(mode=0o700)

    def _create_network(self) -> None:
        assert self.subnet is not None
        br = bridge_name(self.id)
        run_command(["ip", "link", "add", br, "type", "bridge", "stp_state", "0"])
        _disable_ipv6_here(br)
        run_command(["ip", "addr", "add", f"{self.host_address}/24", "dev", br])
        run_command(["ip", "link", "set", br, "up"])
        self._limit_segments(br, None)  # the host's own traffic to the nodes (ssh)
        for node in self.nodes:
            ns = node.namespace
            run_command(["ip", "netns", "add", ns])
            run_command(["ip", "-n", ns, "link", "set", "lo", "up"])
            # No IPv6 on the lab links: router/neighbour solicitations would add bytes to the
            # counters that serve as ground truth. The default applies to eth0 created below.
            if shutil.which("sysctl"):
                run_command(["ip", "netns", "exec", ns, "sysctl", "-q", "-w",
                      "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"],
                     check=False)  # fmt: skip
            run_command(["ip", "link", "add", node.host_interface, "type", "veth",
                  "peer", "name", node.interface, "netns", ns])  # fmt: skip
            _disable_ipv6_here(node.host_interface)
            run_command(["ip", "link", "set", node.host_interface, "master", br])
            run_command(["ip", "link", "set", node.host_interface, "up"])
            run_command(
                ["ip", "-n", ns, "addr", "add", f"{node.address}/24", "dev", node.interface]
            )
            run_command(["ip", "-n", ns, "link", "set", node.interface, "up"])
            shape = self.faults.shape_of(node.index, self.shape)
            self._limit_segments(node.interface, ns, shape)
            self._limit_segments(node.host_interface, None, shape)
            for argv in [
                *shape.tc_commands(node.interface, ns, uplink=True),
                *shape.tc_commands(node.host_interface, None, uplink=False),
            ]:
                proc = run_command(argv, check=False)
                if proc.returncode != 0 and "netem" in argv and "unknown" in proc.stderr:
                    raise LabError(
                        "this kernel has no netem qdisc (sch_netem, CONFIG_NET_SCH_NETEM), needed "
                        "for delay and loss: load it with 'modprobe sch_netem', or shape the "
                        "rate only (delay_ms=0, loss_pct=0)"
                    )
                if proc.returncode != 0:
                    raise LabError(f"command failed: {shlex.join(argv)}\n{proc.stderr.strip()}")
                self.shaping_commands.append(shlex.join(argv))

    def _limit_segments(self, dev: str, netns: str | None, shape: LinkShape | None = None) -> None:
        """Apply ``LinkShape.segmentation_commands`` of ``shape`` (default the lab's); where this
        iproute2 or kernel cannot, say so in ``describe`` (tbf then splits super-packets itself:
        right, only dearer)."""
        for argv in (shape or self.shape).segmentation_commands(dev, netns):
            proc = run_command(argv, check=False)
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
                node_cpus = self.faults.cpus_of(node.index, cpus)
                self.cgroups.append(CpuCgroup.create(node.namespace, node_cpus))
        except LabError as err:
            if self.node_cpus != "auto" or self.faults.slow_nodes:
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
        ) + "".join(f"; {f.spelling}: a slow node planted" for f in self.faults.slow_nodes)

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
            run_command(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)]
            )
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
            proc = run_command(self.ssh_argv(node.index, ["true"]), check=False, timeout=20)
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
            if not ENV_KEY_RE.match(key):
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

    @contextlib.contextmanager
    def unshaped(self) -> Iterator[None]:
        """The links without rate, delay or loss while inside (the segment limits stay): what
        the hosts alone cost, for ``launchers.lab.session``'s host-time benchmark. The shaping is
        put back on the way out, also after an error; ``describe`` is unchanged."""
        self._require_nodes()
        if not self.shaping_commands:
            yield
            return
        for node in self.nodes:
            for dev, ns in ((node.interface, node.namespace), (node.host_interface, None)):
                run_command(["tc", *(["-n", ns] if ns else []), "qdisc", "del", "dev", dev, "root"],
                     check=False)  # fmt: skip
        try:
            yield
        finally:
            for command in self.shaping_commands:
                run_command(shlex.split(command))

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
            out = run_command(["ip", "netns", "exec", node.namespace, "cat", *files]).stdout.split()
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
            "link_mbit": self.shape.rate_mbit,
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
            "faults": self.faults.describe(
                [n.name for n in self.nodes], self.shape, self.describe_cpu()["cpus"]
            ),
        }

    def describe_cpu(self) -> dict[str, Any]:
        """run.json's ``network.node_cpu``: the cores each node may use (None: no budget; a slow
        node's own in its entry), how, and each node's ``cpu.stat`` (throttled periods show the
        budget binding)."""
        budget = default_node_cpus() if self.node_cpus == "auto" else self.node_cpus
        cpus = budget if self.cgroups else None  # a slow node's own is in ``faults``
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
