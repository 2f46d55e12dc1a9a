"""The GPUs of a CUDA run's nodes, read with ``nvidia-smi`` when the run starts (run.json
``provenance.gpus``), so that the report can put its TFLOP/s against the hardware's peak
(``analysis.theory.hardware``). On CPU nothing is queried or recorded.

Each node is asked once: the launching machine directly, another host of the hostfile through
``ssh -o BatchMode=yes`` (the way DeepSpeed's pdsh runner reaches it, with a short connect
timeout). A node that cannot be asked gets an entry with the ``error`` instead of its GPUs.
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Callable, Sequence
from typing import Any

QUERY = ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"]
"""The query (memory.total prints as ``81559 MiB``)."""

TIMEOUT_S = 20.0
"""Seconds one node's query may take (ssh connect included)."""

LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")
"""Host names that mean the launching machine."""

Runner = Callable[[list[str]], tuple[int, str]]
"""Runs an argv, returns (exit status, stdout + stderr)."""


def run_command(argv: list[str]) -> tuple[int, str]:
    """The default :data:`Runner`: subprocess with :data:`TIMEOUT_S`."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    except FileNotFoundError:
        return 127, f"{argv[0]}: not found"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 124, str(exc)
    return proc.returncode, proc.stdout + (proc.stderr if proc.returncode else "")


def parse_query(node: str, text: str) -> list[dict[str, Any]]:
    """The GPU entries of one node's ``nvidia-smi`` CSV output (``name, 81559 MiB, 580.65``)."""
    out: list[dict[str, Any]] = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3 or not parts[0]:
            continue
        name, memory, driver = parts
        mib: float | int | None = None
        number = memory.split()[0] if memory else ""
        try:
            mib = int(number)
        except ValueError:
            try:
                mib = float(number)
            except ValueError:
                mib = None
        out.append(
            {
                "node": node,
                "index": len(out),
                "name": name,
                "memory_total_mib": mib,
                "driver_version": driver or None,
            }
        )
    return out


def node_argv(host: str) -> list[str]:
    """The query on ``host``: here for the launching machine, else over ssh."""
    if host in LOCAL_NAMES or host in (socket.gethostname(), socket.getfqdn()):
        return list(QUERY)
    return ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", host, *QUERY]


def query(hosts: Sequence[str], runner: Runner = run_command) -> list[dict[str, Any]]:
    """run.json ``provenance.gpus`` entries for ``hosts`` (each host once, in order)."""
    out: list[dict[str, Any]] = []
    for host in dict.fromkeys(hosts or ["localhost"]):
        rc, text = runner(node_argv(host))
        found = parse_query(host, text) if rc == 0 else []
        if found:
            out += found
        else:
            why = text.strip().splitlines()[-1][:300] if text.strip() else f"exit status {rc}"
            out.append({"node": host, "error": f"nvidia-smi: {why}"})
    return out


def provenance_with_gpus(
    doc: dict[str, Any], runner: Runner = run_command
) -> dict[str, Any] | None:
    """run.json's ``provenance`` with ``gpus`` added, for a CUDA run; None on CPU."""
    spec = doc.get("spec") or {}
    if spec.get("device") != "cuda":
        return None
    hosts = (spec.get("cluster") or {}).get("hosts") or ["localhost"]
    return {**(doc.get("provenance") or {}), "gpus": query(hosts, runner)}
