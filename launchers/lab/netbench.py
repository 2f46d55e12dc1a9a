"""Collective benchmark: all-reduce, all-gather, reduce-scatter and send/recv over the cluster.

``python -m launchers.lab.netbench`` starts ``lab.netbench_worker`` on every rank through the
real ``deepspeed`` launcher, in one of three places:

- ``--lab N --link 100mbit``: an emulated lab (``lab.cluster``), reached through pdsh over ssh
  like a real cluster, or per node with ``--no_ssh`` (``deepspeed --no_ssh --node_rank i``);
  ``netbench.json`` then carries the lab's description and its interface counters;
- ``--hostfile H --master_addr A``: a real cluster (pdsh over ssh, the user's own keys);
- neither: ``--nproc`` ranks on this machine (loopback).

Bandwidths follow nccl-tests (``PERFORMANCE.md`` there): ``algbw = S / t`` and ``busbw = algbw x
factor`` with factor ``2(n-1)/n`` for all-reduce, ``(n-1)/n`` for all-gather and reduce-scatter,
``1`` for send/recv, ``S`` the op's nccl-tests size (see ``_netbench_worker.make_op``). Both are
reported in Gbit/s (``x 8 / 1e9``, the unit of link rates) and GB/s (``/ 1e9``). The all-reduce
busbw of a large message approaches the link rate: 0.1 Gbit/s on a 100 Mbit/s link.

Output ``<out>/netbench.json``: ``{"backend", "world_size", "nodes", "network", "results": [{"op",
"bytes", "time_ms", "algbw_gbps", "busbw_gbps", "iters", ...}], ...}``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, get_args

from rich.console import Console
from rich.table import Table

from analysis.theory import formulas
from analysis.theory.formulas import ring_factor
from launchers.lab.cluster import Lab
from launchers.lab.net import DEFAULT_BURST_MS, LinkShape

Op = Literal["all_reduce", "all_gather", "reduce_scatter", "sendrecv"]
"""Benchmarked operations (nccl-tests names, with underscores)."""

OPS: tuple[Op, ...] = get_args(Op)
"""Every op, in report order."""

BACKEND_NOTES: dict[str, dict[str, str]] = {
    "gloo": {
        "reduce_scatter": (
            "gloo's reduce_scatter sends the whole buffer from every rank, like an all-reduce "
            "(lab counters, 2 ranks: 16.8 MB sent per 16 MiB op, vs 8.4 MB for (n-1)/n): its "
            "busbw in the nccl-tests convention reads about half the link rate"
        ),
        "all_gather": (
            "gloo's all_gather moves the optimal (n-1)/n volume but does not fully overlap "
            "sending and receiving: busbw 0.5-0.7 of the link rate on a 2-node lab"
        ),
        "all_reduce": "ring all-reduce: busbw approaches the link rate (0.93-0.96 on a lab)",
    },
}
"""What the lab's counters showed about each backend's ops; written into netbench.json."""

SWEEP: dict[str, str] = {
    "ops": ",".join(OPS),
    "min_bytes": "1K",
    "max_bytes": "64M",
    "factor": "4",
    "pause_ms": "0",
    "max_iters": "50",
}
"""Defaults of ``python -m launchers.lab.netbench``: every op, 1 KiB to 64 MiB, back to back."""

AFTER_PAUSE: dict[str, str] = {
    "ops": "all_reduce",
    "min_bytes": "16K",
    "max_bytes": "256K",
    "factor": "2",
    "pause_ms": "20",
    "max_iters": "30",
}
"""``--after-pause``: messages of tensor parallelism's size (a tiny GPT's per-layer all-reduce is
64 KB) sent after a pause long enough to refill any shaper's bucket, as a training step sends
them between computations. On a faithful link their busbw is near the link rate too."""

PROJECT_ROOT = Path(__file__).resolve().parents[2]
"""Directory holding the ``launchers`` package; ranks start there (pdsh ``cd``s to it too)."""

LAB_MASTER_PORT = 29500
"""Rendezvous port inside a lab (a fresh network namespace: nothing else listens there)."""


def parse_size(text: str | int) -> int:
    """Bytes from ``1K``, ``64M``, ``1MiB``, ``4096`` (binary units, as nccl-tests' ``-b/-e``)."""
    try:
        return formulas.parse_size(text)
    except ValueError as exc:
        message = f"size {text!r} not understood: write e.g. 1K, 16M, 64M"
        raise argparse.ArgumentTypeError(message) from exc


def bandwidths(op: Op, nbytes: int, seconds: float, world: int) -> tuple[float, float]:
    """``(algbw, busbw)`` in Gbit/s for ``nbytes`` moved by ``op`` in ``seconds``."""
    if seconds <= 0:
        raise ValueError(f"seconds({seconds}) must be > 0")
    algbw = nbytes * 8 / seconds / 1e9
    return algbw, algbw * ring_factor(op, world)


def element_count(op: Op, nbytes: int, world: int, itemsize: int) -> int:
    """Elements of the op's main buffer: whole elements, divisible by ``world`` when split."""
    unit = itemsize * (world if op in ("all_gather", "reduce_scatter") else 1)
    count = (nbytes // unit) * (unit // itemsize)
    if count <= 0:
        raise ValueError(f"{op} of {nbytes} bytes over {world} ranks: need >= {unit} bytes")
    return count


def size_sweep(min_bytes: int, max_bytes: int, factor: int = 4, op: Op = "all_reduce",
               world: int = 1, itemsize: int = 4) -> list[int]:  # fmt: skip
    """Sizes ``min, min*factor, ...`` up to ``max_bytes`` (included), each a whole buffer."""
    if factor < 2 or min_bytes < 1 or max_bytes < min_bytes:
        raise ValueError(
            f"need factor({factor}) >= 2 and 1 <= min({min_bytes}) <= max({max_bytes})"
        )
    sizes, size = [], min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= factor
    if sizes[-1] != max_bytes:
        sizes.append(max_bytes)
    unit = itemsize * (world if op in ("all_gather", "reduce_scatter") else 1)
    return sorted({max(unit, s // unit * unit) for s in sizes})


def choose_iters(warmup_s: float, budget_s: float, min_iters: int, max_iters: int) -> int:
    """Timed iterations for one size: about ``budget_s`` of work, within the bounds.

    Large messages on slow links take seconds each (64 MB all-reduce at 100 Mbit/s: ~5 s), so
    they get ``min_iters``; small ones fill the budget up to ``max_iters``.
    """
    if not 1 <= min_iters <= max_iters:
        raise ValueError(f"need 1 <= min_iters({min_iters}) <= max_iters({max_iters})")
    if warmup_s <= 0:
        return max_iters
    return max(min_iters, min(max_iters, math.ceil(budget_s / warmup_s)))


def plan_iterations(
    estimate_s: float | None, budget_s: float, warmup: int, min_iters: int, max_iters: int
) -> tuple[int, int | None]:
    """``(warm-up, timed iterations)`` for one size from an estimate of one iteration's time.

    No estimate (first size of an op): ``warmup`` passes, iterations chosen after them (None).
    An estimate over the budget (a large message on a slow link, where the connections are
    already warm from the smaller sizes): no warm-up and ``min_iters``, so a 64 MB sweep at
    100 Mbit/s stays around a minute; otherwise ``warmup`` passes and ``choose_iters``.
    """
    if estimate_s is None:
        return warmup, None
    if estimate_s >= budget_s:
        return 0, min_iters
    return warmup, choose_iters(estimate_s, budget_s, min_iters, max_iters)


# ----------------------------------------------------------------------------- launching


def deepspeed_command() -> list[str]:
    """The real ``deepspeed`` launcher of this interpreter's environment."""
    script = Path(sys.executable).parent / "deepspeed"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "deepspeed.launcher.runner"]


def worker_args(out: Path, options: Mapping[str, str]) -> list[str]:
    """``--module launchers.lab.netbench_worker`` and its flags (argv after the launcher's own)."""
    argv = ["--module", "launchers.lab.netbench_worker", "--out", str(out.resolve())]
    for key, value in options.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    return argv


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _launch(argv: Sequence[str], log: Path, env: Mapping[str, str]) -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as handle:
        handle.write(f"$ {shlex.join(argv)}\n".encode())
        handle.flush()
        return subprocess.Popen(
            list(argv), cwd=PROJECT_ROOT, env=dict(env), stdout=handle, stderr=subprocess.STDOUT
        )


def _wait_all(procs: Sequence[subprocess.Popen], logs: Sequence[Path], timeout_s: float) -> None:
    """Wait for every process; stop the rest when one fails or time runs out."""
    deadline = time.monotonic() + timeout_s
    try:
        while any(p.poll() is None for p in procs):
            failed = [p for p in procs if p.returncode not in (None, 0)]
            if failed or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    bad = [(p, log) for p, log in zip(procs, logs, strict=True) if p.returncode != 0]
    if bad:
        tails = "\n".join(f"--- {log} (exit {p.returncode})\n{_tail(log)}" for p, log in bad)
        raise RuntimeError(f"netbench ranks failed or timed out after {timeout_s:g} s:\n{tails}")


def _tail(path: Path, lines: int = 15) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return ""


def run_on_lab(
    lab: Lab, out: Path, options: Mapping[str, str], timeout_s: float = 1800
) -> dict[str, Any]:
    """Run the benchmark across a running ``lab.cluster.Lab``; write and return netbench.json.

    The file gets the lab's description (link, shaping, CPU budget) and interface counters
    beside rank 0's results, for callers that read it rather than the return value (sessions).

    With ssh (the lab's default) the host runs ``deepspeed --hostfile`` and pdsh reaches the
    nodes; without, each node runs ``deepspeed --no_ssh --node_rank i`` inside its namespace.
    """
    out.mkdir(parents=True, exist_ok=True)
    hostfile = lab.write_hostfile(out / "hostfile")
    before = lab.counters()
    started = time.time()
    if lab.ssh:
        argv = [*deepspeed_command(), *lab.deepspeed_args(hostfile, LAB_MASTER_PORT)]
        argv += worker_args(out, options)
        logs = [out / "launcher.log"]
        procs = [_launch(argv, logs[0], lab.launcher_env())]
    else:
        procs, logs = [], []
        for node in lab.nodes:
            argv = [*deepspeed_command(), "--hostfile", str(hostfile), "--no_ssh",
                    "--node_rank", str(node.index), "--master_addr", lab.master_addr,
                    "--master_port", str(LAB_MASTER_PORT), *worker_args(out, options)]  # fmt: skip
            logs.append(out / f"{node.name}.log")
            procs.append(_launch(lab.wrap(node.index, argv), logs[-1], os.environ))
    _wait_all(procs, logs, timeout_s)
    after = lab.counters()
    doc = _read_worker_output(out, logs)
    doc["network"] = lab.describe()
    doc["counters"] = {
        "before": before,
        "after": after,
        "delta": {
            node: {key: after[node][key] - before[node][key] for key in after[node]}
            for node in after
        },
    }
    doc["elapsed_s"] = round(time.time() - started, 3)
    write_result(out, doc)
    return doc


def run_launcher(
    out: Path,
    options: Mapping[str, str],
    hostfile: Path | None,
    master_addr: str | None,
    nproc: int,
    timeout_s: float = 1800,
) -> dict[str, Any]:
    """Run on a real cluster (``hostfile``) or on this machine (``nproc`` local ranks)."""
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    if hostfile is not None:
        launcher = ["--hostfile", str(hostfile)]
        if master_addr:
            launcher += ["--master_addr", master_addr]
    else:
        launcher = ["--num_gpus", str(nproc), "--master_port", str(_free_port())]
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if not _has_cuda():
        env.setdefault("DS_ACCELERATOR", "cpu")
        env.setdefault("OMP_NUM_THREADS", "1")
    argv = [*deepspeed_command(), *launcher, *worker_args(out, options)]
    log = out / "launcher.log"
    started = time.time()
    _wait_all([_launch(argv, log, env)], [log], timeout_s)
    doc = _read_worker_output(out, [log])
    doc["elapsed_s"] = round(time.time() - started, 3)
    return doc


def _has_cuda() -> bool:
    try:
        import torch  # heavy (~2 s), and only to ask whether this machine has a GPU
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def _read_worker_output(out: Path, logs: Sequence[Path]) -> dict[str, Any]:
    path = out / "netbench.json"
    if not path.exists():
        tails = "\n".join(f"--- {log}\n{_tail(log)}" for log in logs)
        raise RuntimeError(f"rank 0 wrote no {path}; the logs end with:\n{tails}")
    return json.loads(path.read_text(encoding="utf-8"))


def write_result(out: Path, doc: Mapping[str, Any]) -> Path:
    """Write ``netbench.json`` (the analyzer's input) into ``out``."""
    path = out / "netbench.json"
    path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    return path


def largest(doc: Mapping[str, Any], op: Op) -> dict[str, Any] | None:
    """The result row of ``op`` at its largest size (None when the op was not run)."""
    rows = [row for row in doc.get("results", []) if row["op"] == op]
    return max(rows, key=lambda row: row["bytes"]) if rows else None


def render_table(doc: Mapping[str, Any]) -> Any:
    """A rich table of the results, titled with backend, ranks, link and pause.

    On a shaped link a last column gives busbw as a fraction of the link rate.
    """
    network = doc.get("network") or {}
    link = network.get("link") or "link not described"
    rate_mbit = network.get("link_mbit")
    pause = f" · {doc['pause_ms']:g} ms pause before each call" if doc.get("pause_ms") else ""
    title = (
        f"netbench: {doc.get('backend')} · {doc.get('world_size')} ranks on "
        f"{doc.get('nodes') or '?'} nodes · {link}{pause}"
    )
    table = Table(title=title, caption="algbw = S/t; busbw = algbw x 2(n-1)/n | (n-1)/n | 1")
    headers = ["op", "size", "time ms", "algbw Gbit/s", "busbw Gbit/s", "busbw GB/s", "iters"]
    for header in headers + (["busbw / link"] if rate_mbit else []):
        table.add_column(header, justify="left" if header == "op" else "right", no_wrap=True)
    for row in doc.get("results", []):
        cells = [
            row["op"],
            _human_bytes(row["bytes"]),
            f"{row['time_ms']:.3f}",
            f"{row['algbw_gbps']:.4f}",
            f"{row['busbw_gbps']:.4f}",
            f"{row['busbw_gbps'] / 8:.5f}",
            str(row["iters"]),
        ]
        if rate_mbit:
            cells.append(f"{row['busbw_gbps'] * 1e3 / rate_mbit:.2f}")
        table.add_row(*cells)
    return table


def _human_bytes(nbytes: int) -> str:
    for unit, size in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= size and nbytes % size == 0:
            return f"{nbytes // size}{unit}"
    return f"{nbytes}B" if nbytes < 1024 else f"{nbytes / 1024:.1f}K"


def parse_cli(argv: Sequence[str] | None = None) -> tuple[argparse.Namespace, dict[str, str]]:
    """``python -m launchers.lab.netbench`` flags, checked, and the worker's options from them.

    ``--after-pause`` fills the ``AFTER_PAUSE`` values, else ``SWEEP``'s, for every flag not
    given explicitly.
    """
    parser = argparse.ArgumentParser(
        prog="python -m launchers.lab.netbench", description=__doc__.split("\n")[0]
    )
    where = parser.add_argument_group("where")
    where.add_argument("--lab", type=int, metavar="N", help="run on an emulated lab of N nodes")
    where.add_argument("--link", default="100mbit", help="lab link rate (100mbit, 1gbit, none)")
    where.add_argument("--delay-ms", type=float, default=0.0, help="lab one-way delay, ms")
    where.add_argument("--burst-ms", type=float, help="lab tbf bucket, ms at the rate (1)")
    where.add_argument(
        "--node-cpus",
        type=float,
        help="lab: cores per node (default: this machine's cores / 4; 0: no budget)",
    )
    where.add_argument("--no_ssh", "--no-ssh", action="store_true", help="lab: per node, no ssh")
    where.add_argument("--hostfile", type=Path, help="real cluster: DeepSpeed hostfile")
    where.add_argument("--master_addr", "--master-addr", help="real cluster: rank 0's address")
    where.add_argument("--nproc", type=int, default=2, help="local ranks (no lab, no hostfile)")
    what = parser.add_argument_group("what")
    what.add_argument("--out", type=Path, help="output directory (default logs/netbench/<time>)")
    what.add_argument("--ops", help="comma list of ops (all)")
    what.add_argument("--min-bytes", type=parse_size, help="smallest size (1K)")
    what.add_argument("--max-bytes", type=parse_size, help="largest size (64M)")
    what.add_argument("--factor", type=int, help="size step (4)")
    what.add_argument("--budget-s", type=float, default=1.0, help="timed seconds per size (1)")
    what.add_argument("--min-iters", type=int, default=3, help="fewest timed iterations (3)")
    what.add_argument("--max-iters", type=int, help="most timed iterations (50)")
    what.add_argument("--timeout-s", type=float, default=1800, help="whole-run time limit")
    what.add_argument("--pause-ms", type=float, help="sleep before each call, ms, like compute (0)")
    what.add_argument(
        "--after-pause",
        action="store_true",
        help=f"small messages after a pause: all_reduce {AFTER_PAUSE['min_bytes']}-"
        f"{AFTER_PAUSE['max_bytes']} in steps of x{AFTER_PAUSE['factor']}, each after a "
        f"{AFTER_PAUSE['pause_ms']} ms pause (flags given explicitly still apply)",
    )
    args = parser.parse_args(argv)
    for key, value in (AFTER_PAUSE if args.after_pause else SWEEP).items():
        if getattr(args, key) is None:
            setattr(args, key, parse_size(value) if key.endswith("bytes") else value)
    if args.lab is not None and args.hostfile is not None:
        parser.error("--lab and --hostfile exclude each other: a lab writes its own hostfile")
    if not 0 <= float(args.pause_ms) <= 60_000:
        parser.error(f"--pause-ms {args.pause_ms}: must be within 0..60000 ms")
    if args.node_cpus is not None and args.node_cpus < 0:
        parser.error(f"--node-cpus {args.node_cpus:g}: cores per node, > 0 (0: no budget)")
    options = {
        "ops": args.ops,
        "min_bytes": str(args.min_bytes),
        "max_bytes": str(args.max_bytes),
        "factor": str(args.factor),
        "budget_s": str(args.budget_s),
        "min_iters": str(args.min_iters),
        "max_iters": str(args.max_iters),
        "pause_ms": str(args.pause_ms),
    }
    return args, options


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m launchers.lab.netbench``."""
    args, options = parse_cli(argv)
    out = args.out or Path("logs/netbench") / datetime.now().strftime("%Y%m%d-%H%M%S")
    if args.lab is not None:
        burst_ms = DEFAULT_BURST_MS if args.burst_ms is None else args.burst_ms
        shape = LinkShape.parse(args.link, delay_ms=args.delay_ms, burst_ms=burst_ms)
        cpus = "auto" if args.node_cpus is None else (args.node_cpus or None)
        with Lab(args.lab, shape, ssh=not args.no_ssh, node_cpus=cpus) as lab:
            doc = run_on_lab(lab, out, options, args.timeout_s)
    else:
        doc = run_launcher(
            out, options, args.hostfile, args.master_addr, args.nproc, args.timeout_s
        )
    path = write_result(out, doc)
    Console(width=None if sys.stdout.isatty() else 120).print(render_table(doc))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
