"""The doctor's verdicts: one finding per check and node (versions, upstream commit, data,
accelerator, CUDA, interface names, disk), judged against what the run expects.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from launchers.config import gpu, probe, wheelhouse
from launchers.doctor.transport import (
    COLUMNS,
    MIN_FREE_BYTES,
    ProbeRequest,
    Reply,
    Route,
    Status,
)

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
    wheelhouse: wheelhouse.Found | None = None
    """A built wheelhouse on this node (what ``make setup WHEELS=`` would give a node)."""
    pins: dict[str, str] = field(default_factory=dict)
    """requirements.txt's pins (normalized name: version)."""

    def lacks(self, what: str, node_python: str) -> str:
        """The fix for a node without ``what`` (``name==version`` of a pin, or ``upstream``)."""
        found = self.wheelhouse
        name = what.split("==")[0]
        offer = wheelhouse.offer(name, found.manifest, found.folder, node_python) if found else ""
        return offer or (
            "`make setup` there; without network there: `make wheelhouse` on a machine with "
            "network, copy the folder to the node, then `make setup WHEELS=<folder>` there"
        )


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
    node_python = ".".join(str(facts["python"]["version"]).split(".")[:2])
    for name in probe.PACKAGES:
        have, pin = facts["packages"].get(name), exp.pins.get(name)
        cell = _same(name, have, ref["packages"].get(name), name, fix)
        if cell.status == "fail" and pin is not None and ref["packages"].get(name) == pin:
            has = f"it has {have}" if have else "not installed"
            lacks = exp.lacks(f"{name}=={pin}", node_python)
            cell = Finding(
                name, "fail", cell.text, f"the node lacks {name}=={pin} ({has}): {lacks}"
            )
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
    node_python = ".".join(str(facts["python"]["version"]).split(".")[:2])
    if want == exp.pinned_commit and (not up.get("present") or up.get("commit") != want):
        offer = exp.lacks("upstream", node_python)
        if exp.wheelhouse and offer.startswith("`make setup WHEELS="):
            fix = f"the node lacks upstream at {want[:8]}: {offer}"
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
