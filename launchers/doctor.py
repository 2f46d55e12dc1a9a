"""Pre-flight doctor: is every node of a hostfile ready for the run, checked the way the run goes?

``python -m launchers doctor --hosts HOSTFILE`` (``make doctor HOSTS=...``) runs a small probe
(``launchers._doctor_probe``, standard library only, sent as ``python -c``) on every node through
the path the run will use: pdsh over ssh (DeepSpeed's default runner, with the same
``PDSH_RCMD_TYPE``/``PDSH_SSH_ARGS_APPEND``), plain ssh for the other multi-node launchers, the
lab's pdsh/ssh or its namespaces (``ip netns exec``) for an emulated cluster, or this machine for
one local host. The probe runs the interpreter at the run's own path (DeepSpeed's pdsh runner
starts ``sys.executable`` on every node, and ``launch.sh`` ``cd``s to upstream's path), so a node
with another venv, upstream or dataset at those paths is seen as the run would see it.

One table, a row per node: reachability; python, torch, deepspeed and transformers against the
launching node; upstream at the pinned commit at the same path; the dataset and tokenizer files;
the accelerator and its device count against the hostfile's slots; on CUDA apex and its
extensions and ``nvcc`` under ``CUDA_HOME`` (``launchers.gpu``); ``NCCL_SOCKET_IFNAME`` /
``GLOO_SOCKET_IFNAME`` against the node's interfaces; free disk for the logs. Every failing cell
comes with the fix.

A multi-node run and a matrix call :func:`check_before_run` before anything starts (before any
run directory, lab benchmark or launcher), unless ``--skip-doctor``. A passing result is cached
per hostfile and request for :data:`CACHE_TTL_S` seconds, so a matrix, or the next ``make``
target, does not probe again.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from launchers import _doctor_probe, gpu
from launchers.spec import Cluster, RunPaths, RunSpec

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
    """The running ``launchers.lab.Lab`` for lab transports."""
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
    facts = _doctor_probe.parse_output(proc.stdout)
    said = "\n".join(
        ln
        for ln in (proc.stdout + "\n" + proc.stderr).splitlines()
        if ln.strip() and _doctor_probe.MARKER not in ln
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
            lost=lambda said: _doctor_probe.MARKER not in said and _ssh_lost(said),
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


def collect(
    hosts: Sequence[str], request: ProbeRequest, python: str, route: Route
) -> tuple[dict[str, Reply], Reply]:
    """The nodes' replies and the launching node's own, probed at the same time."""
    command = _doctor_probe.command(python, request.to_json())
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


# --- verdicts ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    """One cell of the table."""

    check: str
    """Column (one of :data:`COLUMNS`)."""
    status: Status
    """Verdict."""
    text: str
    """What the cell shows."""
    fix: str = ""
    """What to do, for ``fail`` and ``warn``."""


@dataclass(frozen=True)
class NodeReport:
    """One row: a node and its findings."""

    host: str
    """Host as the hostfile names it."""
    label: str
    """Name shown (the lab's node name with its address, or the host)."""
    slots: int
    """Slots the hostfile gives it."""
    findings: tuple[Finding, ...]
    """One per column."""

    @property
    def ok(self) -> bool:
        """No failing check."""
        return all(f.status != "fail" for f in self.findings)

    def finding(self, check: str) -> Finding:
        """The cell of one column."""
        return next(f for f in self.findings if f.check == check)


@dataclass(frozen=True)
class Expectation:
    """What a node must match: the launching node's facts and the run's needs."""

    reference: dict[str, Any]
    """The launching node's probe facts."""
    request: ProbeRequest
    """What was asked."""
    pinned_commit: str
    """Upstream commit the runs are pinned to."""
    need_wgrad: bool
    """The run keeps gradient-accumulation fusion (needs apex's fused_weight_gradient_mlp_cuda)."""
    route: Route
    """How the nodes were reached (for the fixes)."""
    hostfile: str
    """The hostfile (for the fixes)."""


def _same(check: str, value: Any, ref: Any, what: str, fix: str) -> Finding:
    if value is None:
        return Finding(check, "fail", "missing", f"{what} is not installed there: {fix}")
    if value != ref:
        return Finding(
            check,
            "fail",
            f"{value} (here {ref})",
            f"{what} {value} there, {ref} on the launching node: {fix}",
        )
    return Finding(check, "ok", str(value))


def _versions(facts: dict[str, Any], exp: Expectation) -> list[Finding]:
    python = facts["python"]["executable"]
    fix = (
        f"install the pinned requirements.txt into {python} on that node (`make setup` in "
        "this checkout's path there), or share the venv"
    )
    ref = exp.reference
    found = [_same("python", facts["python"]["version"], ref["python"]["version"], "python", fix)]
    for name in _doctor_probe.PACKAGES:
        cell = _same(name, facts["packages"].get(name), ref["packages"].get(name), name, fix)
        script = facts.get("launcher_script") or {}
        if name == "deepspeed" and cell.status == "ok" and script and not script.get("exists"):
            cell = Finding(
                name,
                "fail",
                f"{cell.text}, no launcher",
                f"the deepspeed launcher {script.get('path')} is missing: {fix}",
            )
        found.append(cell)
    return found


def _upstream(facts: dict[str, Any], exp: Expectation) -> Finding:
    up = facts["upstream"]
    ref_commit = exp.reference["upstream"].get("commit")
    want = ref_commit or exp.pinned_commit
    fix = (
        f"run `make setup` on that node (it clones upstream at {exp.pinned_commit[:8]} into "
        f"{up['path']}), or share that directory"
    )
    if not up.get("present"):
        return Finding("upstream", "fail", "missing", f"no pretrain_gpt.py in {up['path']}: {fix}")
    commit = up.get("commit")
    if commit != want:
        shown = (commit or "unknown")[:8]
        return Finding(
            "upstream",
            "fail",
            f"{shown} (here {str(want)[:8]})",
            f"upstream at {up['path']} is at {commit or 'an unknown commit'}, the "
            f"launching node's at {want}: `git -C {up['path']} checkout --detach "
            f"{want}` there, or {fix}",
        )
    if commit != exp.pinned_commit:
        return Finding(
            "upstream",
            "warn",
            f"{shown_commit(commit)} (not pinned)",
            f"every node is at {commit}, not the pinned {exp.pinned_commit}",
        )
    return Finding("upstream", "ok", commit[:8])


def shown_commit(commit: str | None) -> str:
    """Eight hex digits, or 'unknown'."""
    return (commit or "unknown")[:8]


def _data(facts: dict[str, Any], exp: Expectation) -> Finding:
    ref = exp.reference["files"]
    missing, differ = [], []
    for label, got in facts["files"].items():
        if not got.get("file"):
            missing.append(f"{label} {got['path']}")
        elif (ref.get(label) or {}).get("size") not in (None, got.get("size")):
            differ.append(f"{label} {got['path']} ({got['size']} bytes, here {ref[label]['size']})")
    fix = (
        "run `make setup` on that node (it builds the tiny dataset at the same path), copy the "
        "files there, or use a shared filesystem"
    )
    if missing:
        return Finding(
            "data", "fail", f"{len(missing)} missing", f"missing {'; '.join(missing)}: {fix}"
        )
    if differ:
        return Finding(
            "data", "fail", "differs", f"other files than here: {'; '.join(differ)}: {fix}"
        )
    return Finding("data", "ok", f"{len(facts['files'])} files")


def _accelerator(facts: dict[str, Any], slots: int, exp: Expectation) -> Finding:
    if exp.request.device == "cpu":
        cpus = facts.get("cpus") or 0
        if cpus < slots:
            return Finding(
                "accelerator",
                "warn",
                f"cpu x{cpus} < slots {slots}",
                f"{slots} ranks share {cpus} cores: timings will be slower",
            )
        return Finding("accelerator", "ok", f"cpu, {cpus} cores")
    cuda = facts.get("cuda") or {}
    count = cuda.get("count") or 0
    if count >= slots:
        return Finding("accelerator", "ok", f"{count} x {cuda.get('name', 'GPU')}")
    why = cuda.get("error") or (
        f"torch {cuda.get('torch_version', '?')} (CUDA {facts.get('torch_cuda_build') or 'none'})"
        " sees no GPU"
        if not count
        else f"{count} GPUs"
    )
    return Finding(
        "accelerator",
        "fail",
        f"{count} GPU{'s' * (count != 1)} < slots {slots}",
        f"{why} for slots={slots} in {exp.hostfile}: run on a node with {slots} GPU(s) (check "
        "`nvidia-smi` and the driver there), lower its slots, or use --device cpu",
    )


def _cuda(facts: dict[str, Any], exp: Expectation) -> Finding:
    if exp.request.device != "cuda":
        return Finding("cuda", "n/a", "-")
    cuda = facts.get("cuda") or {}
    if "torch_version" not in cuda:
        return Finding("cuda", "fail", "no torch", f"{cuda.get('error')}: `make setup` there")
    toolkit = gpu.Toolkit.from_facts(cuda, facts.get("torch_cuda_build"))
    missing = gpu.apex_problems(cuda.get("apex") or {}, exp.need_wgrad)
    problems, cells = [], []
    if missing:
        names = ", ".join(missing)
        cells.append(f"apex: {len(missing)} missing")
        problems.append(
            f"apex modules upstream imports on CUDA are missing ({names}; e.g. "
            f"{next(iter(missing.values()))}): " + gpu.apex_fix(missing, cuda.get("apex_origin"))
        )
    else:
        cells.append("apex ok")
    cells.append(toolkit.summary())
    if toolkit.problem:
        problems.append(
            f"upstream compiles its fused kernels with nvcc under CUDA_HOME on every "
            f"CUDA run: {toolkit.problem}"
        )
    status: Status = "fail" if problems else "ok"
    return Finding("cuda", status, ", ".join(cells), "; ".join(problems))


def interface_matches(variable: str, value: str, interfaces: Sequence[str]) -> tuple[bool, str]:
    """Whether ``value`` selects an interface the node has, and the interfaces it selects.

    NCCL's grammar: a comma-separated list of prefixes, ``=`` for exact names, ``^`` to exclude
    (an exclusion list always leaves something to choose from); gloo takes exact names.
    """
    names = [n for n in interfaces if n != "lo"] or list(interfaces)
    if variable == "NCCL_SOCKET_IFNAME":
        if value.startswith("^"):
            return True, "exclusion list"
        exact = value.startswith("=")
        wanted = [w for w in value.lstrip("=").split(",") if w]
        chosen = [
            n for n in interfaces if any(n == w if exact else n.startswith(w) for w in wanted)
        ]
    else:
        wanted = [w for w in value.split(",") if w]
        chosen = [n for n in interfaces if n in wanted]
    return bool(chosen), ",".join(chosen) or f"none of {','.join(names)}"


def _ifname(facts: dict[str, Any], exp: Expectation) -> Finding:
    if not exp.request.ifnames:
        return Finding("ifname", "n/a", "unset")
    cells, problems = [], []
    for variable, value in exp.request.ifnames.items():
        ok, _ = interface_matches(variable, value, facts.get("interfaces") or [])
        cells.append(f"{value} ok" if ok else f"{value}: no")
        if not ok:
            problems.append(
                f"{variable}={value} selects no interface of this node (it has "
                f"{', '.join(facts.get('interfaces') or [])}): set it to the cluster "
                "network's interface name on every node, or unset it"
            )
    return Finding(
        "ifname", "fail" if problems else "ok", ", ".join(dict.fromkeys(cells)), "; ".join(problems)
    )


def _disk(facts: dict[str, Any]) -> Finding:
    disk = facts["disk"]
    free = disk["free_bytes"]
    shown = f"{free / (1 << 30):.1f} GiB"
    if not disk.get("writable"):
        return Finding(
            "disk",
            "fail",
            f"{shown}, read-only",
            f"{disk['checked']} is not writable: give --logs a writable directory",
        )
    if free < MIN_FREE_BYTES:
        return Finding(
            "disk",
            "fail",
            shown,
            f"{shown} free under {disk['checked']} (< {MIN_FREE_BYTES >> 30} GiB): free "
            "space or give --logs another directory",
        )
    return Finding("disk", "ok", shown)


def _unreached(host: str, reply: Reply, exp: Expectation) -> Finding:
    lines = [ln for ln in reply.error.strip().splitlines() if "exited with exit code" not in ln]
    said = (lines or reply.error.strip().splitlines() or ["no answer"])[-1]
    if exp.route.transport in ("lab-ssh", "lab-netns"):
        fix = (
            f"the lab node's sshd or link is down ({said}): recreate the lab (`make clean-lab`, "
            "then run again)"
        )
    else:
        fix = (
            f"{said}: make `ssh {host} true` work from this node without a password "
            f"(BatchMode), or remove {host} from {exp.hostfile}"
        )
    status: Status = "fail" if exp.route.required else "warn"
    return Finding("reach", status, "unreachable", fix)


def judge(host: str, label: str, slots: int, reply: Reply, exp: Expectation) -> NodeReport:
    """The row of one node."""
    if not reply.reached:
        first = _unreached(host, reply, exp)
        rest = [Finding(c, "n/a", "-") for c in COLUMNS[1:]]
        return NodeReport(host, label, slots, (first, *rest))
    facts = reply.facts
    if facts is None or "error" in facts:
        python = exp.reference["python"]["executable"]
        said = (facts or {}).get("error") or reply.error.strip().splitlines()[-1:] or ["no output"]
        why = said if isinstance(said, str) else said[0]
        missing = reply.exit_status == 127 or "No such file" in why
        fix = (
            f"{python} is not there ({why}): the run starts that interpreter on every node; "
            "`make setup` in this checkout's path on that node"
            if missing
            else f"the probe failed with {python}: {why}"
        )
        first = Finding("reach", "ok", "yes")
        rest = [Finding("python", "fail", "missing" if missing else "failed", fix)]
        rest += [Finding(c, "n/a", "-") for c in COLUMNS[2:]]
        return NodeReport(host, label, slots, (first, *rest))
    findings = [
        Finding("reach", "ok", "yes"),
        *_versions(facts, exp),
        _upstream(facts, exp),
        _data(facts, exp),
        _accelerator(facts, slots, exp),
        _cuda(facts, exp),
        _ifname(facts, exp),
        _disk(facts),
    ]
    return NodeReport(host, label, slots, tuple(findings))


# --- the report ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Report:
    """The doctor's result for one hostfile."""

    hostfile: str
    """The hostfile checked."""
    route: str
    """How the nodes were reached."""
    device: str
    """The run's device."""
    reference: dict[str, Any]
    """The launching node's facts."""
    nodes: tuple[NodeReport, ...]
    """One row per host, in hostfile order."""
    seconds: float
    """Time the probes took."""
    cached_at: float | None = None
    """When the result was measured, if it came from the cache."""

    @property
    def ok(self) -> bool:
        """Every node passes."""
        return all(n.ok for n in self.nodes)

    def problems(self) -> list[str]:
        """``node: fix`` lines for every failing (then warning) cell."""
        lines = []
        for status in ("fail", "warn"):
            for node in self.nodes:
                lines += [
                    f"{node.label}: {f.check}: {f.fix}"
                    for f in node.findings
                    if f.status == status and f.fix
                ]
        return lines

    def heading(self) -> list[str]:
        """What was checked, how, and the launching node's versions the nodes must match."""
        ref = self.reference
        here = ", ".join(
            [f"python {ref['python']['version']}"]
            + [f"{p} {ref['packages'].get(p)}" for p in _doctor_probe.PACKAGES]
            + [f"upstream {shown_commit(ref['upstream'].get('commit'))}"]
        )
        when = f", cached {time.time() - self.cached_at:.0f} s ago" if self.cached_at else ""
        return [
            f"doctor: {self.hostfile}, device {self.device}, {len(self.nodes)} node(s) via "
            f"{self.route}: {self.seconds:.1f} s{when}",
            f"launching node {ref['hostname']}: {here}",
        ]

    def show(self, console: Any = None) -> None:
        """Print the heading, the table (a row per node), the fixes and the verdict."""
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table

        console = console or Console(width=max(Console().width, 160))
        table = Table()
        table.add_column("node", overflow="fold")
        for column in COLUMNS:
            table.add_column(column, overflow="fold")
        for node in self.nodes:
            cells = [f"[{STYLES[f.status]}]{escape(f.text)}[/]" for f in node.findings]
            table.add_row(escape(f"{node.label} slots={node.slots}"), *cells)
        for line in self.heading():
            console.print(escape(line), soft_wrap=True)
        console.print(table)
        for line in self.problems():
            console.print(escape(line), soft_wrap=True)
        bad = sum(not n.ok for n in self.nodes)
        console.print(
            "[green]every node is ready[/]"
            if not bad
            else f"[bold red]{bad} of {len(self.nodes)} node(s) not ready[/]"
        )

    def render(self, width: int = 200) -> str:
        """:meth:`show` as plain text."""
        from rich.console import Console

        with open(os.devnull, "w") as sink:
            console = Console(width=width, record=True, file=sink)
            self.show(console)
        return "\n".join(line.rstrip() for line in console.export_text().splitlines()) + "\n"


def diagnose(
    cluster: Cluster,
    request: ProbeRequest,
    python: str,
    route: Route,
    *,
    need_wgrad: bool = True,
    labels: Mapping[str, str] | None = None,
) -> Report:
    """Probe every host of ``cluster`` and judge it against this node."""
    from launchers.upstream import PINNED_COMMIT

    hosts = [h.name for h in cluster.hosts]
    started = time.monotonic()
    replies, here = collect(hosts, request, python, route)
    seconds = time.monotonic() - started
    if here.facts is None or "error" in here.facts:
        raise DoctorError(
            f"the probe failed on this (the launching) node with {python}: "
            f"{(here.facts or {}).get('error') or here.error}: run `make setup`"
        )
    exp = Expectation(here.facts, request, PINNED_COMMIT, need_wgrad, route, cluster.hostfile)
    rows = tuple(
        judge(h.name, (labels or {}).get(h.name, h.name), h.slots, replies[h.name], exp)
        for h in cluster.hosts
    )
    return Report(
        cluster.hostfile,
        route.description or route.transport,
        request.device,
        here.facts,
        rows,
        seconds,
    )


# --- cache ---------------------------------------------------------------------------------------


def cache_key(
    cluster: Cluster, request: ProbeRequest, python: str, route: Route, need_wgrad: bool
) -> str:
    """Hash of everything a result depends on: hosts and slots, request, route, interpreter."""
    doc = {
        "hosts": [[h.name, h.slots] for h in cluster.hosts],
        "request": request.to_json(),
        "python": python,
        "transport": route.transport,
        "env": route.env,
        "need_wgrad": need_wgrad,
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:20]


def cache_dir() -> Path:
    """Where passing results are kept."""
    from launchers.upstream import cache_root

    return cache_root() / "doctor"


def load_cached(key: str, ttl_s: float = CACHE_TTL_S, now: float | None = None) -> Report | None:
    """A passing report of this key measured less than ``ttl_s`` ago, else None."""
    path = cache_dir() / f"{key}.json"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        measured = float(doc["measured_at"])
        if not 0 <= (now or time.time()) - measured < ttl_s:
            return None
        nodes = tuple(
            NodeReport(
                n["host"], n["label"], n["slots"], tuple(Finding(**f) for f in n["findings"])
            )
            for n in doc["nodes"]
        )
        return Report(
            doc["hostfile"],
            doc["route"],
            doc["device"],
            doc["reference"],
            nodes,
            doc["seconds"],
            cached_at=measured,
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def store(key: str, report: Report) -> None:
    """Keep a passing report (a failing one is measured again next time, after the fix)."""
    if not report.ok:
        return
    path = cache_dir() / f"{key}.json"
    doc = asdict(report) | {"measured_at": time.time()}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(doc), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:  # a cache that cannot be written only costs a second probe
        pass


# --- the gate before runs ------------------------------------------------------------------------


def route_for(launcher: str, session: Any = None) -> Route:
    """The path a run with this launcher takes to the nodes (the lab's, when in one)."""
    if session is not None:
        lab = session.lab
        if session.ssh:
            env = lab.launcher_env({}, base={})
            keep = {k: env[k] for k in ("PDSH_SSH_ARGS_APPEND", "PDSH_RCMD_TYPE")}
            return Route("lab-ssh", keep, lab, f"pdsh over ssh (lab {lab.name})")
        return Route("lab-netns", {}, lab, f"ip netns exec (lab {lab.name})")
    if launcher == "local":
        return Route("local", {}, None, "this machine")
    if launcher == "pdsh":
        keep = {k: os.environ[k] for k in ("PDSH_SSH_ARGS_APPEND",) if k in os.environ}
        return Route("pdsh", keep, None, "pdsh over ssh")
    if launcher == "no_ssh":
        return Route("ssh", {}, None, "ssh (no_ssh: nodes are started by hand)", required=False)
    return Route("ssh", {}, None, f"ssh ({launcher} hosts)")


def ifnames_for(session: Any = None, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Interface variables the ranks get: the lab's node environment, or this environment."""
    if session is not None:
        return {k: v for k, v in session.lab.node_env().items() if k in IFNAME_VARIABLES}
    env = os.environ if env is None else env
    return {k: env[k] for k in IFNAME_VARIABLES if env.get(k)}


def lab_labels(session: Any) -> dict[str, str]:
    """Lab addresses -> ``node1 (10.200.X.2)``."""
    if session is None:
        return {}
    return {n.address: f"{n.name} ({n.address})" for n in session.lab.nodes}


def doctor_for(
    cluster: Cluster,
    paths: RunPaths,
    device: str,
    launcher: str,
    logs: Path,
    session: Any = None,
    *,
    need_wgrad: bool,
    use_cache: bool = True,
) -> Report:
    """Doctor ``cluster`` for runs with these paths, device and launcher (or on ``session``'s
    lab); from the cache when a pass is recent and ``use_cache``; a pass is stored."""
    route = route_for(launcher, session)
    request = request_for(paths, device, logs, ifnames_for(session))
    key = cache_key(cluster, request, paths.python, route, need_wgrad)
    report = load_cached(key) if use_cache else None
    if report is None:
        report = diagnose(cluster, request, paths.python, route, need_wgrad=need_wgrad,
                          labels=lab_labels(session))  # fmt: skip
        store(key, report)
    return report


def needs_doctor(specs: Sequence[RunSpec], matrix: bool) -> bool:
    """A multi-node run, or any matrix."""
    return matrix or any(len(s.cluster.hosts) > 1 or s.launcher != "local" for s in specs)


def check_before_run(
    specs: Sequence[RunSpec],
    logs: Path,
    session: Any = None,
    *,
    out: Callable[[str], None] = print,
) -> Report:
    """Refuse (``DoctorError``, after printing the table) unless every node is ready.

    Called before any run directory is made. The specs of one request share cluster, device,
    launcher and paths; the strictest (one that keeps gradient-accumulation fusion) is checked.
    """
    spec = next((s for s in specs if gpu.gradient_accumulation_fusion(s)), specs[0])
    report = doctor_for(spec.cluster, spec.paths, spec.device, spec.launcher, logs, session,
                        need_wgrad=gpu.gradient_accumulation_fusion(spec))  # fmt: skip
    if report.ok:
        age = f", cached {time.time() - report.cached_at:.0f} s ago" if report.cached_at else ""
        warnings = report.problems()
        out(
            f"doctor: {len(report.nodes)} node(s) ready via {report.route} "
            f"({report.seconds:.1f} s{age}; --skip-doctor skips this check)"
        )
        for line in warnings:
            out(f"doctor: warning: {line}")
        return report
    report.show()
    bad = [n for n in report.nodes if not n.ok]
    first = next(f for f in bad[0].findings if f.status == "fail")
    raise DoctorError(
        f"doctor: {len(bad)} of {len(report.nodes)} nodes not ready, nothing was started; first: "
        f"{bad[0].label}: {first.check}: {first.fix} (fix the nodes above, or pass --skip-doctor "
        "to start anyway)"
    )


# --- the command ---------------------------------------------------------------------------------


def paths_for(overrides: Mapping[str, Any]) -> RunPaths:
    """The run's paths with ``--set`` path overrides (as ``resolve_spec`` applies them)."""
    from launchers.presets import PATH_KEYS, default_paths

    values = {
        k: os.path.abspath(v)
        if k in ("data_path", "vocab_file", "merge_file", "upstream_dir")
        else v
        for k, v in overrides.items()
        if k in PATH_KEYS
    }
    return replace(default_paths(), **values)


def cmd_doctor(args: argparse.Namespace) -> int:
    """``python -m launchers doctor --hosts HOSTFILE``: print the table; exit 1 when not ready.

    Always probes (and refreshes the cache the runs use); a lab hostfile brings a lab up for the
    check and down after it.
    """
    from launchers.hostfile import load_hostfile
    from launchers.presets import detect_device, parse_overrides

    paths = paths_for(parse_overrides(args.set))
    device = args.device or detect_device()
    adjustments = gpu.cuda_adjustments(paths.python) if device == "cuda" else []
    need = device == "cuda" and not adjustments

    def once(cluster: Cluster, session: Any, launcher: str) -> Report:
        return doctor_for(cluster, paths, device, launcher, Path(args.logs), session,
                          need_wgrad=need, use_cache=False)  # fmt: skip

    lab = _lab_of(args.hosts) or ((args.lab_nodes, args.net) if args.net else None)
    if lab is not None:
        from launchers.session import lab_session

        ssh = args.launcher != "no_ssh"
        with lab_session(lab[0], args.net or lab[1], ssh=ssh) as session:
            report = once(session.cluster(), session, "pdsh" if ssh else "no_ssh")
    else:
        cluster = load_hostfile(args.hosts)
        report = once(
            cluster, None, args.launcher or ("local" if len(cluster.hosts) == 1 else "pdsh")
        )
    for a in adjustments:
        print(f"note: the runs will pass --no-gradient-accumulation-fusion: {a.reason}")
    report.show()
    return 0 if report.ok else 1


def _lab_of(hostfile: str) -> tuple[int, str] | None:
    from launchers.cli import lab_directive

    return lab_directive(hostfile)


def add_parser(sub: Any) -> None:
    """Register ``doctor`` on ``python -m launchers``' subcommands."""
    from launchers.cli import HOSTFILE_DIR
    from launchers.spec import DEVICES, LAUNCHER_MODES

    p = sub.add_parser("doctor", help="check every node of a hostfile before a run")
    p.add_argument("--hosts", default=str(HOSTFILE_DIR / "localhost"), help="hostfile (or a lab's)")
    p.add_argument("--device", choices=DEVICES, help="default: cuda if torch sees a GPU, else cpu")
    p.add_argument(
        "--launcher", choices=LAUNCHER_MODES, help="default: local for one host, else pdsh"
    )
    p.add_argument(
        "--logs", default="logs", help="where the runs will write (free disk is checked)"
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="path overrides as for run, e.g. --set data_path=/data/x_text_document",
    )
    p.add_argument("--net", help="check an emulated lab with links of this rate (as run --net)")
    p.add_argument("--lab-nodes", type=int, default=2, help="nodes of the emulated lab")
    p.set_defaults(func=cmd_doctor)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m launchers.doctor`` (the same as ``python -m launchers doctor``)."""
    from launchers.cli import main as cli_main

    return cli_main(["doctor", *(argv if argv is not None else sys.argv[1:])])


if __name__ == "__main__":
    raise SystemExit(main())
