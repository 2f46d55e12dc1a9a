"""One rank of the collective benchmark (started by a launcher: deepspeed, torchrun, or per node).

Reads the usual ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT`` (and DeepSpeed's
``CROSS_SIZE`` for the node count), times every op at every size, and rank 0 writes
``<out>/netbench.json``. ``python -m launchers.lab.netbench`` starts it and adds the network.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from launchers.lab.netbench import (
    BACKEND_NOTES,
    OPS,
    Op,
    bandwidths,
    choose_iters,
    element_count,
    parse_size,
    plan_iterations,
    size_sweep,
)

DTYPE = torch.float32
"""Element type of every buffer (4 bytes; sizes are rounded down to whole elements)."""


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _collective(name: str) -> Callable[..., Any]:
    """The non-deprecated spelling of a tensor collective where this torch has it."""
    modern = {"all_gather": "all_gather_single", "reduce_scatter": "reduce_scatter_single"}
    legacy = {"all_gather": "all_gather_into_tensor", "reduce_scatter": "reduce_scatter_tensor"}
    return getattr(dist, modern[name], None) or getattr(dist, legacy[name])


def make_op(op: Op, nbytes: int, world: int, rank: int, device: torch.device) -> Callable[[], None]:
    """A closure running ``op`` once on buffers of the nccl-tests size ``nbytes``.

    Sizes follow nccl-tests: all-reduce and send/recv move ``nbytes`` buffers; all-gather's
    ``nbytes`` is the gathered output (each rank contributes ``nbytes / world``);
    reduce-scatter's is each rank's input (each rank keeps ``nbytes / world``).
    """
    count = element_count(op, nbytes, world, DTYPE.itemsize)
    if op == "all_reduce":
        buf = torch.full((count,), float(rank + 1), dtype=DTYPE, device=device)
        return lambda: dist.all_reduce(buf)
    if op == "all_gather":
        out = torch.empty(count, dtype=DTYPE, device=device)
        part = torch.full((count // world,), float(rank + 1), dtype=DTYPE, device=device)
        gather = _collective("all_gather")
        return lambda: gather(out, part)
    if op == "reduce_scatter":
        full = torch.full((count,), float(rank + 1), dtype=DTYPE, device=device)
        part = torch.empty(count // world, dtype=DTYPE, device=device)
        scatter = _collective("reduce_scatter")
        return lambda: scatter(part, full)
    if op == "sendrecv":
        # nccl-tests sendrecv: every rank sends to the next and receives from the previous at
        # once, so each link carries nbytes each way (full duplex); busbw factor 1. The receive
        # is posted first: with gloo, send-then-receive ran one direction at a time (half the
        # link rate on a 2-node lab), receive-then-send runs both at once.
        send = torch.full((count,), float(rank + 1), dtype=DTYPE, device=device)
        recv = torch.empty(count, dtype=DTYPE, device=device)
        peer_to, peer_from = (rank + 1) % world, (rank - 1) % world

        def sendrecv() -> None:
            works = [dist.irecv(recv, peer_from), dist.isend(send, peer_to)]
            for work in works:
                work.wait()

        return sendrecv
    raise ValueError(f"unknown op {op!r}; valid: {', '.join(OPS)}")


def _max_over_ranks(values: list[float], device: torch.device) -> list[float]:
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.tolist()


def _timed(
    run: Callable[[], None], count: int, device: torch.device, pause_s: float = 0.0
) -> list[float]:
    """Seconds of ``count`` passes of ``run`` on this rank, each started after a barrier.

    ``pause_s`` > 0 sleeps that long before each pass (before the barrier, so the ranks still
    start together), as a training step computes between its collectives: a shaper that lets
    a burst through after an idle spell shows here, and not in back-to-back passes.
    """
    times = []
    for _ in range(count):
        if pause_s > 0:
            time.sleep(pause_s)
        dist.barrier()
        start = time.perf_counter()
        run()
        _sync(device)
        times.append(time.perf_counter() - start)
    return times


def measure(
    op: Op,
    nbytes: int,
    args: argparse.Namespace,
    world: int,
    rank: int,
    device: torch.device,
    estimate_s: float | None = None,
) -> dict[str, Any]:
    """Time ``op`` at ``nbytes``: warm-up (unless the size is known to be slow), then iterations.

    ``estimate_s`` (from the previous size, identical on every rank) sets the warm-up and
    iteration counts (``plan_iterations``); without it, one warm-up pass is timed to choose
    them. An iteration's time is the slowest rank's (ranks start together after a barrier);
    the reported time is the mean over iterations, as nccl-tests reports it: a training step
    pays the sum of its calls, so a collective whose time is bimodal (gloo's all-gather on the
    emulated link alternates between line rate and ~2/3 of it) must count at its expected cost,
    not at whichever mode the median of a few samples lands on. The median, min and max are
    kept beside it.
    """
    run = make_op(op, nbytes, world, rank, device)
    warmup, iters = plan_iterations(
        estimate_s, args.budget_s, args.warmup, args.min_iters, args.max_iters
    )
    pause_s = args.pause_ms / 1e3
    warm = _timed(run, warmup, device, pause_s)
    if iters is None:
        (warm_s,) = _max_over_ranks([max(warm, default=0.0)], device)
        iters = choose_iters(warm_s + pause_s, args.budget_s, args.min_iters, args.max_iters)
    times = _max_over_ranks(_timed(run, iters, device, pause_s), device)
    seconds = statistics.fmean(times)
    algbw, busbw = bandwidths(op, nbytes, seconds, world)
    return {
        "op": op,
        "bytes": nbytes,
        "time_ms": seconds * 1e3,
        "algbw_gbps": algbw,
        "busbw_gbps": busbw,
        "iters": iters,
        "algbw_GBps": algbw / 8,
        "busbw_GBps": busbw / 8,
        "time_ms_median": statistics.median(times) * 1e3,
        "time_ms_min": min(times) * 1e3,
        "time_ms_max": max(times) * 1e3,
        "warmup": warmup,
        "pause_ms": args.pause_ms,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Worker flags (``python -m launchers.lab.netbench`` passes them through)."""
    parser = argparse.ArgumentParser(prog="python -m launchers.lab.netbench_worker")
    parser.add_argument("--out", required=True, type=Path, help="directory for netbench.json")
    parser.add_argument("--ops", default=",".join(OPS), help=f"comma list of {', '.join(OPS)}")
    parser.add_argument("--min-bytes", default="1K", type=parse_size)
    parser.add_argument("--max-bytes", default="64M", type=parse_size)
    parser.add_argument("--factor", default=4, type=int, help="size step (default 4)")
    parser.add_argument("--warmup", default=1, type=int, help="warm-up iterations per size")
    parser.add_argument("--budget-s", default=1.0, type=float, help="target seconds per size")
    parser.add_argument("--min-iters", default=3, type=int)
    parser.add_argument("--max-iters", default=50, type=int)
    parser.add_argument("--backend", default="auto", choices=["auto", "gloo", "nccl"])
    parser.add_argument("--timeout-s", default=600, type=float, help="per-collective timeout")
    parser.add_argument(
        "--pause-ms", default=0.0, type=float, help="sleep before each call, ms (like compute)"
    )
    args, _unknown = parser.parse_known_args(argv)  # launchers add --local_rank
    args.ops = [op.strip() for op in args.ops.split(",") if op.strip()]
    if not 0 <= args.pause_ms <= 60_000:
        parser.error(f"--pause-ms {args.pause_ms:g} must be within 0..60000")
    for op in args.ops:
        if op not in OPS:
            parser.error(f"unknown op {op!r}; valid: {', '.join(OPS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the sweep on this rank; rank 0 writes the results."""
    args = parse_args(argv)
    warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")
    backend = args.backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    nodes = int(os.environ.get("CROSS_SIZE") or os.environ.get("GROUP_WORLD_SIZE") or 0) or None
    results: list[dict[str, Any]] = []
    unsupported: dict[str, str] = {}
    for op in args.ops:
        estimate_s: float | None = None
        previous: dict[str, Any] | None = None
        for nbytes in size_sweep(args.min_bytes, args.max_bytes, args.factor, op, world):
            if previous is not None:
                estimate_s = previous["time_ms"] / 1e3 * nbytes / previous["bytes"]
            try:
                row = measure(op, nbytes, args, world, rank, device, estimate_s)
            except (RuntimeError, NotImplementedError) as err:
                if "not supported" not in str(err).lower() and "unsupported" not in str(err):
                    raise
                unsupported[op] = f"{backend}: {err}"
                break
            results.append(row)
            previous = row
            if rank == 0:
                print(
                    f"netbench {op:>14} {nbytes:>10} B  {row['time_ms']:10.3f} ms  "
                    f"algbw {row['algbw_gbps']:8.4f}  busbw {row['busbw_gbps']:8.4f} Gbit/s  "
                    f"x{row['iters']}",
                    flush=True,
                )
    if rank == 0:
        doc = {
            "backend": backend,
            "world_size": world,
            "nodes": nodes,
            "network": None,
            "results": results,
            "unsupported": unsupported,
            "notes": {
                op: note for op, note in BACKEND_NOTES.get(backend, {}).items() if op in args.ops
            },
            "torch": torch.__version__,
            "dtype": str(DTYPE).removeprefix("torch."),
            "pause_ms": args.pause_ms,
        }
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "netbench.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
