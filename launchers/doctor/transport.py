"""What the doctor asks each node and how it reaches it: the probe request, the route
(pdsh, ssh, a lab's namespaces, or here), and the replies collected in parallel.
"""

from __future__ import annotations

import concurrent.futures
import os
import shlex
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from rich.console import Console

from launchers.config import probe
from launchers.config.spec import RunPaths

CACHE_TTL_S = 300.0
"""Seconds a passing result is reused for the same hostfile and request."""

MIN_FREE_BYTES = 1 << 30
"""Free disk a node needs where the logs go: a run's logs are megabytes, but a full disk makes
the run fail late (the executor, the ranks' compile caches, DeepSpeed's checkpoints)."""

CONNECT_TIMEOUT_S = 10
"""ssh/pdsh connection timeout per node."""

PROBE_TIMEOUT_S = 300
"""Time a node's probe may take (CUDA: importing torch and every apex extension)."""

IFNAME_VARIABLES = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
"""Variables that name the interface collectives bind to."""

Transport = Literal["local", "pdsh", "ssh", "lab-ssh", "lab-netns"]
"""How the probe reaches the nodes: this machine, DeepSpeed's pdsh over ssh, plain ssh
(openmpi, slurm and no_ssh hostfiles), the lab's pdsh over ssh, or the lab's namespaces."""

Status = Literal["ok", "warn", "fail", "n/a"]
"""A cell's verdict: ``fail`` refuses the run, ``warn`` is shown, ``n/a`` was not checked."""

COLUMNS = (
    "reach",
    "python",
    "torch",
    "deepspeed",
    "transformers",
    "upstream",
    "data",
    "accelerator",
    "cuda",
    "ifname",
    "disk",
)
"""The table's checks, in order."""

STYLES: dict[str, str] = {"ok": "green", "warn": "yellow", "fail": "bold red", "n/a": "dim"}
"""Rich style per status."""


def plain_text(show: Callable[[Any], None], width: int = 200) -> str:
    """What ``show(console)`` prints to a Rich console, as plain text (the doctor's tables)."""
    with open(os.devnull, "w") as sink:
        console = Console(width=width, record=True, file=sink)
        show(console)
    return "\n".join(line.rstrip() for line in console.export_text().splitlines()) + "\n"


class DoctorError(RuntimeError):
    """A node is not ready; the message names the node, what is wrong and the fix."""


# --- what is asked and how ---------------------------------------------------------------------


@dataclass(frozen=True)
class ProbeRequest:
    """What every node is asked about (the probe's JSON argument)."""

    device: str
    """``cpu`` or ``cuda``: on CUDA the probe imports torch and apex."""
    upstream_dir: str
    """Upstream checkout the run ``cd``s to."""
    files: dict[str, str]
    """Dataset and tokenizer files by label."""
    logs: str
    """Where the run directories go (free disk is checked there)."""
    deepspeed: str
    """The ``deepspeed`` launcher script (``launch.sh`` runs it on every ``no_ssh`` node)."""
    ifnames: dict[str, str] = field(default_factory=dict)
    """``NCCL_SOCKET_IFNAME``/``GLOO_SOCKET_IFNAME`` values the ranks will get, when set."""

    def to_json(self) -> dict[str, Any]:
        """The probe's argument."""
        return asdict(self)


def request_for(
    paths: RunPaths, device: str, logs: Path, ifnames: Mapping[str, str]
) -> ProbeRequest:
    """The probe request for a run with these paths."""
    return ProbeRequest(
        device=device,
        upstream_dir=paths.upstream_dir,
        files={
            "data_path (.bin)": paths.data_path + ".bin",
            "data_path (.idx)": paths.data_path + ".idx",
            "vocab_file": paths.vocab_file,
            "merge_file": paths.merge_file,
        },
        logs=str(Path(logs).absolute()),
        deepspeed=paths.deepspeed,
        ifnames={k: v for k, v in ifnames.items() if k in IFNAME_VARIABLES and v},
    )


@dataclass(frozen=True)
class Route:
    """How the probe reaches the nodes of one hostfile."""

    transport: Transport
    """The path the run will use."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment of the pdsh/ssh command on this machine (the lab's ssh config)."""
    lab: Any = None
    """The running ``launchers.lab.cluster.Lab`` for lab transports."""
    description: str = ""
    """For the table's title."""
    required: bool = True
    """An unreachable node fails the check (``no_ssh`` nodes are started by hand: a warning)."""


@dataclass(frozen=True)
class Reply:
    """What came back from one node."""

    reached: bool
    """The transport got there and the command ran (whatever its exit status)."""
    facts: dict[str, Any] | None
    """The probe's facts, when it printed them."""
    error: str = ""
    """What the transport or the node said when something went wrong."""
    exit_status: int | None = None
    """The command's exit status when known (127: the interpreter is not there)."""


# --- transports ----------------------------------------------------------------------------------


def _run(argv: Sequence[str], env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        list(argv),
        capture_output=True,
        text=True,
        env=None if env is None else {**os.environ, **env},
        timeout=PROBE_TIMEOUT_S + CONNECT_TIMEOUT_S + 30,
        stdin=subprocess.DEVNULL,
    )


def _reply(proc: subprocess.CompletedProcess, lost: Callable[[str], bool] | None = None) -> Reply:
    """A node's reply from a finished command (ssh exits 255 when it could not connect)."""
    facts = probe.parse_output(proc.stdout)
    said = "\n".join(
        ln
        for ln in (proc.stdout + "\n" + proc.stderr).splitlines()
        if ln.strip() and probe.MARKER not in ln
    )
    if facts is not None:
        return Reply(True, facts, "", proc.returncode)
    unreachable = lost(said) if lost else proc.returncode == 255
    return Reply(
        not unreachable, None, said[-600:] or f"exit status {proc.returncode}", proc.returncode
    )


def _ssh_lost(text: str) -> bool:
    markers = (
        "ssh: ",
        "Connection refused",
        "Connection timed out",
        "No route to host",
        "Could not resolve hostname",
        "Permission denied",
        "Host key verification failed",
        "connect to host",
        "ssh exited with exit code 255",
        "Connection closed",
    )
    return any(m in text for m in markers)


def probe_pdsh(
    hosts: Sequence[str], command: Sequence[str], env: Mapping[str, str]
) -> dict[str, Reply]:
    """Every host through ``pdsh -R ssh``, as DeepSpeed's PDSHRunner reaches them.

    pdsh prefixes each line with ``host: ``; ``-S`` returns the largest remote exit status.
    """
    if shutil.which("pdsh") is None:
        why = "pdsh is not installed on this node (DeepSpeed's default multi-node runner needs it)"
        return {h: Reply(False, None, why) for h in hosts}
    argv = [
        "pdsh",
        "-S",
        "-t",
        str(CONNECT_TIMEOUT_S),
        "-u",
        str(PROBE_TIMEOUT_S),
        "-f",
        "1024",
        "-w",
        ",".join(hosts),
        shlex.join(command).replace("%", "%%"),  # pdsh substitutes %h, %n, ...: %% is a '%'
    ]
    proc = _run(argv, {"PDSH_RCMD_TYPE": "ssh", **env})
    lines: dict[str, list[str]] = {h: [] for h in hosts}
    labels = pdsh_labels(hosts)
    for line in (proc.stdout + "\n" + proc.stderr).splitlines():
        text = (
            line.removeprefix(line.split(": ", 1)[0] + ": ") if line.startswith("pdsh@") else line
        )
        label, sep, rest = text.partition(": ")
        if sep and label in labels:
            lines[labels[label]].append(rest)
    replies = {}
    for host in hosts:
        text = "\n".join(lines[host])
        replies[host] = _reply(
            subprocess.CompletedProcess(argv, proc.returncode, text, ""),
            lost=lambda said: probe.MARKER not in said and _ssh_lost(said),
        )
    return replies


def pdsh_labels(hosts: Sequence[str]) -> dict[str, str]:
    """Output label -> host: pdsh labels a host name by its first component (``node1`` for
    ``node1.cluster.org``) but an address in full; a short name two hosts share stays ambiguous
    and is not used."""
    labels = {h: h for h in hosts}
    short = [h.split(".", 1)[0] for h in hosts]
    for host, name in zip(hosts, short, strict=True):
        if short.count(name) == 1 and name not in labels:
            labels[name] = host
    return labels


def _parallel(hosts: Sequence[str], one: Callable[[str], Reply]) -> dict[str, Reply]:
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(32, len(hosts))) as pool:
        return dict(zip(hosts, pool.map(one, hosts), strict=True))


def probe_ssh(hosts: Sequence[str], command: Sequence[str]) -> dict[str, Reply]:
    """Every host through plain ssh (mpirun's and srun's nodes are ssh-reachable too)."""

    def one(host: str) -> Reply:
        argv = [
            "ssh",
            "-o",
            "BatchMode=yes",
            "-o",
            f"ConnectTimeout={CONNECT_TIMEOUT_S}",
            host,
            shlex.join(command),
        ]
        return _reply(_run(argv), lost=lambda said: _ssh_lost(said))

    return _parallel(hosts, one)


def probe_lab_netns(lab: Any, command: Sequence[str]) -> dict[str, Reply]:
    """Every lab node inside its namespace with the ranks' environment (``no_ssh`` labs)."""
    hosts = [node.address for node in lab.nodes]

    def one(host: str) -> Reply:
        index = hosts.index(host)
        return _reply(_run(lab.wrap(index, command)), lost=lambda said: "netns" in said)

    return _parallel(hosts, one)


def probe_local(command: Sequence[str]) -> Reply:
    """This machine."""
    return _reply(_run(command), lost=lambda said: False)


def run_on(route: Route, host: str, command: Sequence[str]) -> Reply:
    """``command`` on one host of ``route`` (each host its own command: the link test's pairs),
    the way :func:`collect` reaches every host with the same one."""
    if route.transport in ("pdsh", "lab-ssh"):
        return probe_pdsh([host], command, route.env)[host]
    if route.transport == "ssh":
        return probe_ssh([host], command)[host]
    if route.transport == "lab-netns":
        index = [node.address for node in route.lab.nodes].index(host)
        return _reply(_run(route.lab.wrap(index, command)), lost=lambda said: "netns" in said)
    return probe_local(command)


def collect(
    hosts: Sequence[str], request: ProbeRequest, python: str, route: Route
) -> tuple[dict[str, Reply], Reply]:
    """The nodes' replies and the launching node's own, probed at the same time."""
    command = probe.command(python, request.to_json())
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        here = pool.submit(probe_local, command)
        if route.transport == "local":
            replies = {h: here.result() for h in hosts}
        elif route.transport in ("pdsh", "lab-ssh"):
            replies = probe_pdsh(hosts, command, route.env)
        elif route.transport == "ssh":
            replies = probe_ssh(hosts, command)
        else:
            replies = probe_lab_netns(route.lab, command)
        return replies, here.result()
