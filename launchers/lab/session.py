"""A session of runs on an emulated cluster (``launchers.lab.cluster``): what every run on the
lab needs, and what the lab measures around each run.

By default the real ``deepspeed --hostfile`` launcher on this host reaches every node through
pdsh over ssh, exactly as on a cluster; ``--launcher no_ssh`` starts ``launch.sh <node_rank>``
inside each node's namespace instead. The session measures the collective bandwidth once
(``netbench.json``, copied into every run directory so the report shows it beside the inferred
figures) and records the ground truth of each run in run.json's ``"network"``: the link, and the
bytes each node's interface sent and received during the run and per steady-state iteration.
The runs themselves go through ``launchers.run.matrix`` with the session as its ``Session``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from analysis.runs.record import Outcome
from analysis.theory.formulas import steady_windows
from launchers.config.hostfile import parse_hostfile_text
from launchers.config.project import remote_environment
from launchers.config.spec import Cluster, RunSpec
from launchers.lab import netbench
from launchers.lab.cluster import Lab
from launchers.lab.net import namespace_pids
from launchers.lab.tools import LAB_TRANSPORTS
from launchers.run.render import write_atomic

NETBENCH_OPTIONS = {
    "ops": "all_reduce,all_gather,reduce_scatter,sendrecv",
    "min_bytes": str(1 << 10),
    "max_bytes": str(16 << 20),
    "factor": "4",
    "budget_s": "1.0",
    "min_iters": "2",
    "max_iters": "50",
}
"""Collective benchmark of a lab session: 1 KiB to 16 MiB (a 64 MiB all-reduce alone takes ~6 s
per operation at 100 Mbit/s; 16 MiB is past the size where the link rate is reached)."""


HOST_TIME_OPTIONS = {
    **NETBENCH_OPTIONS,
    "min_bytes": str(4 << 10),
    "max_bytes": str(4 << 20),
    "pause_ms": "20",
    "min_iters": "5",
    "max_iters": "20",
}
"""Host-time benchmark of a shaped lab session, run with the shaping lifted
(``Lab.unshaped``): each call after a 20 ms pause, as training sends its collectives between
computations. A call's time there is what the hosts cost (gloo, copies, waking up under the
node's CPU budget) without the wire; on a link this cost and the wire time overlap, and the
what-if model takes the larger of the two (``analysis.predict.calibration.LinkFit.time_ms``)."""


QUICK_NETBENCH = {"budget_s": "0.3", "min_iters": "2", "max_iters": "8"}
"""What ``quick`` changes in both benchmarks (``make demo``): a third of the time per size and
fewer calls; the large sizes, bound by ``min_iters`` on a slow link, cost the same."""


def _cmdline(pid: int) -> str:
    with contextlib.suppress(OSError):
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:300]
    return ""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def lab_available(ssh: bool = True) -> tuple[bool, str]:
    """Whether this machine can host a lab, and if not, why (for the fallback message)."""
    if os.geteuid() != 0:
        return False, "not root (network namespaces need root)"
    missing = [t for t in ("ip", "tc") if shutil.which(t) is None]
    if ssh:
        missing += [t for t in ("sshd", "pdsh", "ssh-keygen") if shutil.which(t) is None]
        if shutil.which("sshd") is None and Path("/usr/sbin/sshd").exists():
            missing.remove("sshd")
    if missing:
        return False, f"missing {', '.join(missing)} (Debian: iproute2, openssh-server, pdsh)"
    return True, ""


@dataclass
class LabSession:
    """A running lab and what every run on it needs."""

    lab: Lab
    """The lab (entered)."""
    ssh: bool
    """The nodes run sshd (pdsh and openmpi reach them through it)."""
    launcher: str = ""
    """The lab launcher every run uses (``launchers.lab.tools.LAB_LAUNCHERS``); by default pdsh over
    ssh, or ``no_ssh`` per node in each namespace when the nodes have no sshd."""
    netbench: Path | None = None
    """The session's ``netbench.json``, once measured."""
    samples: list[tuple[int, dict[str, dict[str, int]]]] = field(default_factory=list)
    """(iteration, counters) sampled during the current run."""
    start: dict[str, dict[str, int]] | None = None
    """Counters when the current run started."""
    slots: int = 1
    """Ranks per node."""

    def __post_init__(self) -> None:
        self.launcher = self.launcher or ("pdsh" if self.ssh else "no_ssh")

    @property
    def label(self) -> str:
        """What the spec records as its network (with the planted faults: a run with one is
        not a repeat of a run without)."""
        label = f"emulated {len(self.lab.nodes)} nodes x {self.lab.shape.label}"
        return f"{label}, {self.lab.faults.label}" if self.lab.faults else label

    def cluster(self) -> Cluster:
        """The lab's hostfile as a ``Cluster`` (``slots`` per node)."""
        return parse_hostfile_text(self.lab.hostfile_text(slots=self.slots), f"lab {self.lab.name}")

    def adapt(self, spec: RunSpec) -> RunSpec:
        """The spec as it runs on this lab."""
        return replace(
            spec,
            launcher=self.launcher,
            master_addr=self.lab.master_addr,
            ssh_check=self.launcher == "no_ssh",
            network=self.label,
        )

    def measure_bandwidth(self, logs: Path, quick: bool = False) -> Path | None:
        """Run the collective benchmark once for the session (``quick``: with
        :data:`QUICK_NETBENCH`); never fails the session."""
        out = logs / "netbench" / f"{self.lab.name}-{self.lab.shape.label}"
        print(f"lab {self.lab.name}: measuring collective bandwidth ({out})", flush=True)
        options = NETBENCH_OPTIONS | (QUICK_NETBENCH if quick else {})
        try:
            netbench.run_on_lab(self.lab, out, options, timeout_s=900)
        except Exception as e:  # the runs stay useful without a measured figure
            print(f"lab {self.lab.name}: collective benchmark failed: {e}", file=sys.stderr)
            return None
        path = out / "netbench.json"
        self.netbench = path if path.exists() else None
        if self.netbench is not None and self.lab.shaping_commands:
            self.measure_host_time(out, quick)
        return self.netbench

    def measure_host_time(self, out: Path, quick: bool = False) -> None:
        """Add the host-time benchmark (``HOST_TIME_OPTIONS``, links unshaped; ``quick``: with
        :data:`QUICK_NETBENCH`) to the session's netbench.json under ``host_time``; on failure
        say so there and go on."""
        assert self.netbench is not None
        print(f"lab {self.lab.name}: measuring the hosts' time per call (links unshaped)",
              flush=True)  # fmt: skip
        doc = json.loads(self.netbench.read_text(encoding="utf-8"))
        # Not putting the shaping back raises out of here: no run may go on unshaped links.
        with self.lab.unshaped():
            try:
                options = HOST_TIME_OPTIONS | (QUICK_NETBENCH if quick else {})
                host = netbench.run_on_lab(self.lab, out / "host", options, 600)
            except Exception as e:  # the bandwidth figures stay useful without it
                print(f"lab {self.lab.name}: host-time benchmark failed: {e}", file=sys.stderr)
                host = {"error": str(e)}
        doc["host_time"] = {
            "link": "unshaped",
            "pause_ms": float(HOST_TIME_OPTIONS["pause_ms"]),
            "results": host.get("results") or [],
            "elapsed_s": host.get("elapsed_s"),
            **({"error": host["error"]} if "error" in host else {}),
        }
        write_atomic(self.netbench, json.dumps(doc, indent=2) + "\n")

    def hooks(self, spec: RunSpec, run_dir: Path) -> dict[str, Any]:
        """Keyword arguments for ``launchers.run.execute.run`` on this lab."""
        self.samples, self.start = [], None
        if self.netbench is not None:
            shutil.copy2(self.netbench, run_dir / "netbench.json")

        def on_start() -> None:
            self.start = self.lab.counters()

        def on_iteration(k: int) -> None:
            with contextlib.suppress(Exception):
                self.samples.append((k, self.lab.counters()))

        def on_end() -> dict[str, Any]:
            leftovers = self.sweep()
            doc = self.ground_truth(self.lab.counters())
            if leftovers:
                doc["stopped_leftovers"] = leftovers
            return doc

        hooks: dict[str, Any] = {"on_start": on_start, "on_iteration": on_iteration,
                                 "on_end": on_end}  # fmt: skip
        return hooks | self.launch_hooks(spec, run_dir)

    def launch_hooks(self, spec: RunSpec, run_dir: Path) -> dict[str, Any]:
        """How the executor starts a run here: ``wrap`` per node, or the launcher's ``env``."""
        if self.launcher == "no_ssh":
            return {"wrap": lambda i, argv: self.lab.wrap(i, argv, remote_environment(spec))}
        if self.launcher == "openmpi":
            return {"env": self.lab.openmpi_env(remote_environment(spec), base={})}
        return {"env": self.lab.launcher_env(remote_environment(spec), base={})}

    def settle(self, run_dir: Path, outcome: Outcome) -> Outcome:
        """The run's outcome once what ran it had its say (a scheduler's job state); as is."""
        return outcome

    def keep_pids(self) -> set[int]:
        """Processes of the lab itself, which outlive every run (each node's sshd)."""
        return set(self.lab.daemon_pids())

    def sweep(self, grace_s: float = 5.0) -> list[dict[str, Any]]:
        """Stop every process a run left inside the nodes (all but the lab's own sshd).

        The executor stops the launcher's process group, and DeepSpeed's pdsh runner forwards
        the stop to the nodes over ssh; a node whose link is down never gets it, so its ranks
        would outlive the run. Returns what had to be stopped (node, pid, command).
        """
        keep = self.keep_pids()
        found: list[dict[str, Any]] = []
        for sig in (signal.SIGTERM, signal.SIGKILL):
            alive = []
            for node in self.lab.nodes:
                for pid in namespace_pids(node.namespace):
                    if pid in keep:
                        continue
                    alive.append(pid)
                    if sig == signal.SIGTERM:
                        found.append({"node": node.name, "pid": pid, "command": _cmdline(pid)})
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, sig)
            if not alive:
                break
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline and any(_alive(pid) for pid in alive):
                time.sleep(0.1)
        return found

    def ground_truth(self, end: dict[str, dict[str, int]]) -> dict[str, Any]:
        """run.json's ``"network"``: the lab, bytes per node during the run and per iteration.

        Per iteration: counters sampled when the first and the last iteration lines after the
        first logging window appeared, divided by the iterations between them, so start-up
        traffic (rendezvous, parameter broadcast, data-index building) is left out.
        """
        doc = self.lab.describe()
        doc["transport"] = LAB_TRANSPORTS[self.launcher]
        delta = {
            node: {k: end[node][k] - self.start[node][k] for k in end[node]}
            for node in end
            if self.start and node in self.start
        }
        doc["counters"] = {"start": self.start, "end": end, "delta": delta}
        steady = steady_windows(self.samples)
        if len(steady) >= 2:
            (k0, c0), (k1, c1) = steady[0], steady[-1]
            per = {
                node: {
                    "tx_bytes": (c1[node]["tx_bytes"] - c0[node]["tx_bytes"]) / (k1 - k0),
                    "rx_bytes": (c1[node]["rx_bytes"] - c0[node]["rx_bytes"]) / (k1 - k0),
                }
                for node in c1
            }
            doc["per_iteration"] = {
                "from_iteration": k0,
                "to_iteration": k1,
                "bytes": per,
                "max_tx_bytes": max(v["tx_bytes"] for v in per.values()),
                "method": "interface counters sampled at the iteration lines; includes "
                "Ethernet/IP/TCP headers and the ssh-carried log output",
            }
        else:
            doc["per_iteration"] = None
            doc["per_iteration_reason"] = (
                f"only {len(self.samples)} iteration lines were seen: need 3 or more to leave "
                "out the first logging window"
            )
        return doc
