"""Pre-flight doctor: is every node of a hostfile ready for the run, checked the way the run goes?

``python -m launchers doctor --hosts HOSTFILE`` (``make doctor HOSTS=...``) runs a small probe
(``launchers.config.probe``, standard library only, sent as ``python -c``) on every node through
the path the run will use: pdsh over ssh (DeepSpeed's default runner, with the same
``PDSH_RCMD_TYPE``/``PDSH_SSH_ARGS_APPEND``), plain ssh for the other multi-node launchers, the
lab's pdsh/ssh or its namespaces (``ip netns exec``) for an emulated cluster, or this machine for
one local host. The probe runs the interpreter at the run's own path (DeepSpeed's pdsh runner
starts ``sys.executable`` on every node, and ``launch.sh`` ``cd``s to upstream's path), so a node
with another venv, upstream or dataset at those paths is seen as the run would see it.

One table, a row per node: reachability; python, torch, deepspeed and transformers against the
launching node; upstream at the pinned commit at the same path; the dataset and tokenizer files;
the accelerator and its device count against the hostfile's slots; on CUDA apex and its
extensions and ``nvcc`` under ``CUDA_HOME`` (``launchers.config.gpu``); ``NCCL_SOCKET_IFNAME`` /
``GLOO_SOCKET_IFNAME`` against the node's interfaces; free disk for the logs. Every failing cell
comes with the fix.

A multi-node run and a matrix call :func:`check_before_run` before anything starts (before any
run directory, lab benchmark or launcher), unless ``--skip-doctor``. A passing result is cached
per hostfile and request for :data:`CACHE_TTL_S` seconds, so a matrix, or the next ``make``
target, does not probe again.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from launchers.config import gpu, probe, wheelhouse
from launchers.config.hostfile import HOSTFILE_DIR, HostfileError, lab_directive, load_hostfile
from launchers.config.presets import (
    PATH_KEYS,
    PresetError,
    default_paths,
    detect_device,
    parse_overrides,
)
from launchers.config.spec import DEVICES, LAUNCHER_MODES, Cluster, RunPaths, RunSpec, SpecError
from launchers.config.upstream import PINNED_COMMIT, cache_root
from launchers.doctor import links
from launchers.doctor.transport import (
    CACHE_TTL_S,
    COLUMNS,
    IFNAME_VARIABLES,
    STYLES,
    DoctorError,
    ProbeRequest,
    Route,
    collect,
    plain_text,
    request_for,
)
from launchers.doctor.verdicts import Expectation, Finding, NodeReport, judge, shown_commit
from launchers.lab.bringup import lab_session
from launchers.lab.faults import lab_faults
from launchers.lab.net import LabError

EXIT_USAGE = 2
"""Exit status for a request that cannot run (as ``python -m launchers``)."""

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
            + [f"{p} {ref['packages'].get(p)}" for p in probe.PACKAGES]
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
        return plain_text(self.show, width)


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
    hosts = [h.name for h in cluster.hosts]
    started = time.monotonic()
    replies, here = collect(hosts, request, python, route)
    seconds = time.monotonic() - started
    if here.facts is None or "error" in here.facts:
        raise DoctorError(
            f"the probe failed on this (the launching) node with {python}: "
            f"{(here.facts or {}).get('error') or here.error}: run `make setup`"
        )
    exp = Expectation(here.facts, request, PINNED_COMMIT, need_wgrad, route, cluster.hostfile,
                      wheelhouse.found(), wheelhouse.pins(wheelhouse.REQUIREMENTS))  # fmt: skip
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


def measure_links(
    cluster: Cluster, python: str, launcher: str, session: Any = None, port: int | None = None
) -> links.LinkReport | None:
    """The link test of ``cluster`` (``launchers.doctor.links``) through the run's path; None
    for one host."""
    if len(cluster.hosts) < 2:
        return None
    hosts = [h.name for h in cluster.hosts]
    names = {n.address: n.name for n in session.lab.nodes} if session is not None else {}
    return links.measure(hosts, [names.get(h, h) for h in hosts], route_for(launcher, session),
                         python, port=port or links.DEFAULT_PORT)  # fmt: skip


def check_before_run(
    specs: Sequence[RunSpec],
    logs: Path,
    session: Any = None,
    *,
    out: Callable[[str], None] = print,
    check_links: bool = False,
) -> Report:
    """Refuse (``DoctorError``, after printing the table) unless every node is ready, and with
    ``check_links`` unless no link is slow.

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
        link_report = (
            measure_links(spec.cluster, spec.paths.python, spec.launcher, session)
            if check_links
            else None
        )
        if link_report is not None and not link_report.ok:
            link_report.show()
            raise DoctorError(
                f"doctor: {link_report.findings()[0]}; nothing was started (fix the link, or "
                "leave out --doctor-links / LINKS=1 to start anyway)"
            )
        if link_report is not None:
            out(f"doctor: {link_report.heading()}; {link_report.rule()}: no slow link")
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
    paths = paths_for(parse_overrides(args.set))
    device = args.device or detect_device()
    adjustments = gpu.cuda_adjustments(paths.python) if device == "cuda" else []
    need = device == "cuda" and not adjustments

    def once(cluster: Cluster, session: Any, launcher: str) -> int:
        report = doctor_for(cluster, paths, device, launcher, Path(args.logs), session,
                            need_wgrad=need, use_cache=False)  # fmt: skip
        for a in adjustments:
            print(f"note: the runs will pass --no-gradient-accumulation-fusion: {a.reason}")
        report.show()
        reached = all(n.finding("reach").status != "fail" for n in report.nodes)
        if args.links and not reached:
            print("links: not measured: a node is not reached (see the table above)")
            return 1
        link_report = (
            measure_links(cluster, paths.python, launcher, session, args.links_port)
            if args.links
            else None
        )
        if link_report is not None:
            print()
            link_report.show()
        elif args.links:
            print("links: n/a: one host, no link to measure")
        return 0 if report.ok and (link_report is None or link_report.ok) else 1

    lab = lab_directive(args.hosts) or ((args.lab_nodes, args.net) if args.net else None)
    net = args.net or (lab[1] if lab else None)
    nodes = lab[0] if lab else args.lab_nodes
    faults = lab_faults(args.slow_node, args.slow_link, net, nodes, args.node_cpus)
    if lab is not None:
        ssh = args.launcher != "no_ssh"
        cpus = "auto" if args.node_cpus is None else (args.node_cpus or None)
        with lab_session(nodes, net, ssh=ssh, node_cpus=cpus, faults=faults) as session:
            return once(session.cluster(), session, "pdsh" if ssh else "no_ssh")
    cluster = load_hostfile(args.hosts)
    return once(cluster, None, args.launcher or ("local" if len(cluster.hosts) == 1 else "pdsh"))


def add_parser(sub: Any) -> None:
    """Register ``doctor`` on ``python -m launchers``' subcommands."""
    add_arguments(sub.add_parser("doctor", help="check every node of a hostfile before a run"))


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The doctor's options (``python -m launchers doctor``, ``python -m launchers.doctor``)."""
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
    p.add_argument("--node-cpus", type=float, help="cores per lab node (as run --node-cpus)")
    p.add_argument("--slow-node", metavar="NODE:cpu=CORES", help="lab: e.g. node2:cpu=0.25")
    p.add_argument("--slow-link", metavar="NODE:RATE", help="lab: e.g. node3:10mbit")
    p.add_argument(
        "--links",
        action="store_true",
        help="also measure every pair of nodes' link and name the slow ones (a few seconds)",
    )
    p.add_argument(
        "--links-port",
        type=int,
        default=links.DEFAULT_PORT,
        help=f"TCP port the link test listens on, on every node (default {links.DEFAULT_PORT})",
    )
    p.set_defaults(func=cmd_doctor)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m launchers.doctor`` (the same as ``python -m launchers doctor``)."""
    parser = argparse.ArgumentParser(
        prog="python -m launchers.doctor",
        description="Check every node of a hostfile before a run.",
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (SpecError, HostfileError, PresetError, LabError, DoctorError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
