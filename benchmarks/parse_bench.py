"""Throughput and memory of ``analysis.parse.parse_file`` on a large multi-node log.

Writes a realistic log (default 1 GB) to a temporary directory: two nodes' output interleaved
through pdsh (``node0: `` / ``node1: `` prefixes), NCCL INFO chatter (NCCL_DEBUG=INFO with the
COLL subsystem prints one line per collective, which is what makes real logs this large), gloo
and torch warnings, DeepSpeed ``wall_clock_breakdown`` lines, Megatron timer blocks, memory
reports and iteration lines, then a launcher exit.  Streams it through ``parse_file`` and
prints MB/s and peak RSS.

    python benchmarks/parse_bench.py [--size-mb 1024] [--tracemalloc] [--keep PATH]
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analysis.parse import parse_file

_HEADER = """\
[2026-11-22 01:29:57,285] [INFO] [runner.py:630:main] cmd = /usr/bin/python3 -u -m \
deepspeed.launcher.launch --world_info=e30= --master_addr=10.0.0.1 --master_port=29500 \
pretrain_gpt.py --tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 --num-layers 24 \
--hidden-size 1024 --num-attention-heads 16 --seq-length 1024 --micro-batch-size 2 \
--global-batch-size 16 --train-iters {iters} --zero-stage 1
node0: using world size: 16, data-parallel-size: 16, sequence-parallel size: 1, \
tensor-model-parallel size: 1, pipeline-model-parallel size: 1
node0: ------------------------ arguments ------------------------
node0:   num_layers ...................................... 24
node0:   hidden_size ..................................... 1024
node0:   train_iters ..................................... {iters}
node0: -------------------- end of arguments ---------------------
node0:  > number of parameters on (tensor, pipeline) model parallel rank (0, 0): 354823168
node0: training ...
"""

_NOISE = (
    "node{n}: node{n}:{pid}:{tid} [{r}] NCCL INFO AllReduce: opCount {op:x} "
    "sendbuff 0x7f2c{op:08x} recvbuff 0x7f2c{op:08x} count 1048576 datatype 7 op 0 root 0 "
    "comm 0x55d1c0a3e2b0 [nranks=16] stream 0x55d1bf0c9a40",
    "node{n}: node{n}:{pid}:{tid} [{r}] NCCL INFO AllGather: opCount {op:x} "
    "sendbuff 0x7f2c{op:08x} recvbuff 0x7f2c00000000 count 524288 datatype 7 op 0 root 0 "
    "comm 0x55d1c0a3e2b0 [nranks=16] stream 0x55d1bf0c9a40",
    "node{n}: node{n}:{pid}:{tid} [{r}] NCCL INFO Channel 02/0 : {r}[{r}] -> 8[0] [send] via "
    "NET/Socket/0",
    "node{n}: [W1122 01:36:06.160200179 ProcessGroupGloo.cpp:{op}] Warning: Unable to resolve "
    "hostname to a (local) address. Using the loopback address as fallback.",
    "node{n}: /opt/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py:83: "
    "FutureWarning: `torch.distributed.all_gather_into_tensor` is deprecated.",
    "node{n}:   return func(*args, **kwargs)",
)
_NOISE_WEIGHTS = (40, 25, 6, 2, 1, 1)


def _iteration_block(rng: random.Random, it: int, iters: int) -> list[str]:
    lines = []
    lines.append(
        f"node0: [Rank 0] time (ms) | fwd_microstep: {rng.uniform(50, 90):.2f} | bwd_microstep: "
        f"{rng.uniform(60, 110):.2f} | bwd_inner_microstep: {rng.uniform(50, 90):.2f} | "
        f"bwd_allreduce_microstep: {rng.uniform(5, 25):.2f} | step_microstep: "
        f"{rng.uniform(5, 15):.2f}"
    )
    lines.append(
        f"node0: [Rank 0] time (ms) | fwd: {rng.uniform(50, 90):.2f} | bwd: "
        f"{rng.uniform(60, 110):.2f} | bwd_inner: {rng.uniform(50, 90):.2f} | bwd_allreduce: "
        f"{rng.uniform(5, 25):.2f} | step: {rng.uniform(5, 15):.2f}"
    )
    lines.append(
        f"node1:  iteration {it:8d}/{iters:8d} | consumed samples: {it * 16:12d} | consumed "
        f"tokens: {it * 16384:12d} | elapsed time per iteration (ms): {rng.uniform(180, 240):.1f}"
        f" | learning rate: 9.747E-04 | global batch size:    16 | lm loss: "
        f"{rng.uniform(2, 6):.6E} | loss scale: 1.0 | actual seqlen:  1024 | number of skipped "
        f"iterations:   0 | number of nan iterations:   0 | samples per second: "
        f"{rng.uniform(60, 90):.3f} | tokens per gpu per second (tgs): 4096.000 | TFLOPs: 120.5 |"
    )
    lines.append("node1: (min, max) time across ranks (ms):")
    lines.append(
        f"node1:     forward-backward ...............................: "
        f"({rng.uniform(150, 200):.2f}, {rng.uniform(200, 210):.2f})"
    )
    lines.append(
        f"node1:     optimizer ......................................: "
        f"({rng.uniform(5, 10):.2f}, {rng.uniform(10, 12):.2f})"
    )
    return lines


def write_log(path: Path, size_mb: float, seed: int = 0) -> int:
    """Write about ``size_mb`` MiB of log to ``path``; return the number of iterations."""
    rng = random.Random(seed)
    target = int(size_mb * 1024 * 1024)
    noise_per_iter = 400  # NCCL COLL lines between two iteration lines (16 ranks, ~25 per rank)
    approx_iter_bytes = noise_per_iter * 170 + 1200
    iters = max(1, target // approx_iter_bytes)
    written = 0
    with open(path, "w", encoding="utf-8") as fh:
        head = _HEADER.format(iters=iters)
        fh.write(head)
        written += len(head)
        it = 0
        op = 0
        while written < target and it < iters:
            it += 1
            parts = []
            for _ in range(noise_per_iter):
                op += 1
                tmpl = rng.choices(_NOISE, _NOISE_WEIGHTS)[0]
                n = rng.randint(0, 1)
                parts.append(tmpl.format(n=n, pid=1000 + n, tid=2000 + op % 7, r=op % 8, op=op))
            parts.extend(_iteration_block(rng, it, iters))
            text = "\n".join(parts) + "\n"
            fh.write(text)
            written += len(text)
        tail = (
            "node0: [2026-11-22 02:30:19,060] [INFO] [launch.py:367:main] Process 30444 exits "
            "successfully.\nnode1: [2026-11-22 02:30:19,062] [INFO] [launch.py:367:main] "
            "Process 30445 exits successfully.\n"
        )
        fh.write(tail)
        fh.flush()
        os.fsync(fh.fileno())  # time the parser, not the kernel writing this log back to disk
    return it


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-mb", type=float, default=1024.0, help="log size in MiB (default 1024)")
    ap.add_argument("--tracemalloc", action="store_true", help="also report Python heap peak")
    ap.add_argument("--keep", type=Path, help="write the log here and keep it")
    ns = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="parse-bench-") as tmp:
        path = ns.keep or Path(tmp) / "bench.log"
        t0 = time.perf_counter()
        iters = write_log(path, ns.size_mb)
        size = path.stat().st_size
        print(
            f"wrote {size / 2**20:.0f} MiB ({iters} iterations) in {time.perf_counter() - t0:.1f} s"
        )
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        if ns.tracemalloc:
            tracemalloc.start()
        t0 = time.perf_counter()
        runs = parse_file(path)
        dt = time.perf_counter() - t0
        heap_peak = tracemalloc.get_traced_memory()[1] / 2**20 if ns.tracemalloc else None
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
        run = runs[0]
        ok = (
            len(runs) == 1
            and len(run.iterations) == iters
            and run.status == "completed"
            and len(run.timers) == 3 * iters
        )
        print(
            f"parsed {size / 1e6:.0f} MB in {dt:.2f} s: {size / 1e6 / dt:.0f} MB/s; "
            f"peak RSS {rss:.0f} MiB (before parsing {rss_before:.0f} MiB)"
            + (f"; Python heap peak {heap_peak:.0f} MiB" if heap_peak is not None else "")
        )
        print(
            f"runs {len(runs)}, iterations {len(run.iterations)}, timer blocks {len(run.timers)}, "
            f"status {run.status}: {'as written' if ok else 'MISMATCH with what was written'}"
        )
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
