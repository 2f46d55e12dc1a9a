"""Large logs for the parser benchmark, each with what was written (the ground truth).

Six generators, each writing about ``size_mb`` MiB and returning a ``Written`` record:

- ``write_noise``: a multi-node run whose log is mostly NCCL chatter (NCCL_DEBUG=INFO with the
  COLL subsystem prints one line per collective); the content is sparse.
- ``write_dense``: one long two-node run built from a real lab log (``2n_dp2_1000mbit_node0/1``
  in ``../shared/lab-logs``: Megatron-DeepSpeed f4157bea, DeepSpeed 0.19.6, log interval 5).
  Its start-up lines, its DeepSpeed per-step timer lines (both groups), its iteration lines, its
  Megatron ``(min, max)`` timer blocks and its memory report are replayed window after window
  with the iteration numbers and consumed samples/tokens rewritten, the two nodes' lines
  prefixed by pdsh (``node0: `` / ``node1: ``), and about as many NCCL INFO lines as content
  lines interleaved (a timer block stays together, as pdsh prints what it read from a node,
  except 1 in 50 that the other node's lines split). About 1.5M iterations per GB.
  With ``collector="kubectl"``, the same as ``kubectl logs --timestamps`` collects it: an RFC
  3339 time stamp before every line (the ``stamped`` log of the benchmark); ``"compose"``: as
  ``docker compose logs`` collects one container per node (``node0-1  | ``, the launcher's
  lines in node0's; the ``compose`` log).
- ``write_ranks``: a 64-rank run shaped differently: ``srun --label`` prefixes (`` 12: ``),
  ``--log-interval 1``, every rank printing DeepSpeed's per-step timers (three names, another
  order), a Megatron-LM style iteration line (``throughput per GPU``, ``grad norm``), per-rank
  ``times across ranks`` timer blocks (``--timing-log-option all``), per-rank memory reports
  every 10 iterations and DeepSpeed ``MemAllocated`` lines, bare torch warnings between them.
  Every rank printing DeepSpeed's timers every step is more than upstream prints (rank 0 only):
  a stress shape, about 8 million DeepSpeed lines per GB.
- ``write_all_ranks``: the same 64 ranks as upstream prints them with ``--timing-log-option
  all``: the last rank's iteration line and a ``times across ranks`` block of every rank's
  time for each of the three timers Megatron prints under DeepSpeed (193 lines an iteration),
  rank 0's DeepSpeed line, the memory report of the 8 data-parallel rank 0s once, an
  occasional torch warning.
- ``write_interval1``: the last node's own log file (bare lines) of the real two-node run
  above at log interval 1: each iteration line followed by its ``(min, max)`` timer block,
  about 1.6M iterations per GB.
- ``write_pipeline``: the lab's PP=2 run (``pp2.log``, one machine, bare lines) at log
  interval 1 with ``steps_per_print`` 1, as the launcher writes it: DeepSpeed's PipelineEngine
  ``steps:`` line and Megatron's iteration line every step.
"""

from __future__ import annotations

import os
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Written:
    """What a generator wrote."""

    iterations: int
    """Iterations of the run (the last iteration number)."""
    iteration_lines: int
    """Megatron iteration lines (one per logging window)."""
    timer_blocks: int
    """Timer blocks: DeepSpeed lines plus Megatron blocks."""
    memory_reports: int
    """Megatron ``memory (MB)`` reports."""
    lines: int
    """Lines in the file."""
    noise_lines: int
    """Lines no parser record comes from (NCCL INFO, warnings)."""


def kubectl_stamp(n: int) -> str:
    """The time stamp ``kubectl logs --timestamps`` writes before line ``n`` (RFC 3339 with
    nanoseconds, trailing zeros dropped, as Go's RFC3339Nano), a line every 1.237 ms."""
    sec, frac = divmod(n * 1237, 10**6)
    hours, rest = divmod(sec, 3600)
    digits = f"{frac:06d}".rstrip("0")
    return f"2026-11-28T{hours % 24:02d}:{rest // 60:02d}:{rest % 60:02d}" + (
        f".{digits}Z " if digits else "Z "
    )


def compose_prefix(line: str) -> str:
    """``line`` of the dense log as ``docker compose logs`` prints it: pdsh's ``nodeN: `` as
    the container's ``nodeN-1  | ``; the launcher's own lines in node0's container."""
    host, sep, rest = line.partition(": ")
    if sep and host in ("node0", "node1"):
        return f"{host}-1  | {rest}"
    return f"node0-1  | {line}"


class _Out:
    """Buffered writer that counts lines; ``collector``: what a log collector writes on each
    (``kubectl``: a time stamp before it, ``compose``: ``compose_prefix``)."""

    def __init__(self, path: Path, collector: str = "") -> None:
        self.fh = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed by close()
        self.parts: list[str] = []
        self.size = 0
        self.lines = 0
        self._pending = 0
        self.collector = collector

    def add(self, lines: list[str]) -> None:
        if self.collector == "kubectl":
            lines = [kubectl_stamp(self.lines + i) + ln for i, ln in enumerate(lines)]
        elif self.collector == "compose":
            lines = list(map(compose_prefix, lines))
        text = "\n".join(lines) + "\n"
        self.parts.append(text)
        self.size += len(text)
        self.lines += len(lines)
        self._pending += len(text)
        if self._pending > 8 << 20:
            self.fh.write("".join(self.parts))
            self.parts, self._pending = [], 0

    def close(self) -> None:
        self.fh.write("".join(self.parts))
        self.fh.flush()
        os.fsync(self.fh.fileno())  # time the parser, not the kernel writing the log back
        self.fh.close()


# -- noise-dominated --------------------------------------------------------------------------

_NOISE_HEADER = """\
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
node0: training ..."""

_NCCL_COLL = (
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
_NCCL_COLL_WEIGHTS = (40, 25, 6, 2, 1, 1)


def _noise_iteration(it: int, iters: int, rng: random.Random, op: int) -> tuple[list[str], int]:
    """400 chatter lines, then the iteration's records; and the op counter after them."""
    parts = []
    for _ in range(400):  # NCCL COLL lines between two iteration lines (16 ranks)
        op += 1
        tmpl = rng.choices(_NCCL_COLL, _NCCL_COLL_WEIGHTS)[0]
        n = rng.randint(0, 1)
        parts.append(tmpl.format(n=n, pid=1000 + n, tid=2000 + op % 7, r=op % 8, op=op))
    u = rng.uniform
    parts += [
        f"node0: [Rank 0] time (ms) | fwd_microstep: {u(50, 90):.2f} | bwd_microstep: "
        f"{u(60, 110):.2f} | bwd_inner_microstep: {u(50, 90):.2f} | "
        f"bwd_allreduce_microstep: {u(5, 25):.2f} | step_microstep: {u(5, 15):.2f}",
        f"node0: [Rank 0] time (ms) | fwd: {u(50, 90):.2f} | bwd: {u(60, 110):.2f} | "
        f"bwd_inner: {u(50, 90):.2f} | bwd_allreduce: {u(5, 25):.2f} | step: {u(5, 15):.2f}",
        f"node1:  iteration {it:8d}/{iters:8d} | consumed samples: {it * 16:12d} | consumed "
        f"tokens: {it * 16384:12d} | elapsed time per iteration (ms): {u(180, 240):.1f} | "
        f"learning rate: 9.747E-04 | global batch size:    16 | lm loss: {u(2, 6):.6E} | "
        "loss scale: 1.0 | actual seqlen:  1024 | number of skipped iterations:   0 | "
        f"number of nan iterations:   0 | samples per second: {u(60, 90):.3f} | tokens per "
        "gpu per second (tgs): 4096.000 | TFLOPs: 120.5 |",
        "node1: (min, max) time across ranks (ms):",
        f"node1:     forward-backward ...............................: "
        f"({u(150, 200):.2f}, {u(200, 210):.2f})",
        f"node1:     optimizer ......................................: "
        f"({u(5, 10):.2f}, {u(10, 12):.2f})",
    ]
    return parts, op


def write_noise(path: Path, size_mb: float, seed: int = 0) -> Written:
    """Noise-dominated: 400 NCCL/warning lines per iteration, 16 ranks on 2 nodes, 3 timer
    blocks per iteration (2 DeepSpeed lines, 1 Megatron block), a launcher exit at the end."""
    probe = random.Random(seed + 1)  # the size of an iteration, measured on 20 of them
    sample = sum(len("\n".join(_noise_iteration(1, 10**7, probe, 10**6)[0])) + 1 for _ in range(20))
    iters = max(1, int(size_mb * 2**20 * 20 / sample))
    rng = random.Random(seed)
    out = _Out(path)
    out.add(_NOISE_HEADER.format(iters=iters).split("\n"))
    op = 0
    for it in range(1, iters + 1):
        parts, op = _noise_iteration(it, iters, rng, op)
        out.add(parts)
    out.add(
        [
            "node0: [2026-11-22 02:30:19,060] [INFO] [launch.py:367:main] Process 30444 exits "
            "successfully.",
            "node1: [2026-11-22 02:30:19,062] [INFO] [launch.py:367:main] Process 30445 exits "
            "successfully.",
        ]
    )
    out.close()
    return Written(iters, iters, 3 * iters, 0, out.lines, op)


# -- content-dense, from the real lab log -----------------------------------------------------

_DENSE_NCCL = (
    "node{n}: node{n}:{pid}:{tid} [0] NCCL INFO AllReduce: opCount {op:x} sendbuff "
    "0x7f2c{op:08x} recvbuff 0x7f2c{op:08x} count 218880 datatype 7 op 0 root 0 comm "
    "0x55d1c0a3e2b0 [nranks=2] stream 0x55d1bf0c9a40",
    "node{n}: node{n}:{pid}:{tid} [0] NCCL INFO Channel 0{c}/0 : {n}[0] -> {m}[0] [send] via "
    "NET/Socket/0",
    "node{n}: node{n}:{pid}:{tid} [0] NCCL INFO Connected all rings",
    "node{n}: node{n}:{pid}:{tid} [0] NCCL INFO Using network Socket",
)
_DENSE_NCCL_WEIGHTS = (1, 3, 3, 3)


@dataclass
class _LabRun:
    """The pieces of the real two-node lab run that the dense generator replays."""

    runner: str
    """node0's first line (the runner's ``cmd = ...``), train iterations as ``{iters}``."""
    head0: list[str]
    """node0's lines up to ``training ...`` (after the runner line), train_iters templated."""
    head1: list[str]
    """node1's lines before its first timer block (after its runner line)."""
    setup_block: list[str]
    """node1's set-up timer block printed before the first iteration line."""
    ds_windows: list[list[str]]
    """node0's DeepSpeed timer lines, one list per logging window."""
    memory: list[str]
    """node0's memory report lines (printed after the first window)."""
    iter_lines: list[str]
    """node1's iteration lines."""
    blocks: list[list[str]]
    """node1's Megatron timer block after each iteration line."""
    tail0: list[str]
    """node0's lines after its last timer line."""
    tail1: list[str]
    """node1's lines after its last timer block."""
    interval: int
    """Log interval of the run."""


def _read_lab(lab: Path) -> _LabRun:
    n0 = (lab / "2n_dp2_1000mbit_node0.log").read_text().splitlines()
    n1 = (lab / "2n_dp2_1000mbit_node1.log").read_text().splitlines()
    n0 = [ln for ln in n0 if not ln.startswith("RC=")]  # the lab's own footer, not output
    n1 = [ln for ln in n1 if not ln.startswith("RC=")]
    start = n0.index("training ...") + 1
    ds = [i for i, ln in enumerate(n0) if "] time (ms) |" in ln]
    memory = [ln for ln in n0[start:] if "memory (MB)" in ln]
    its = [i for i, ln in enumerate(n1) if ln.startswith(" iteration ")]
    interval = int(re.search(r"--log-interval (\d+)", n0[0]).group(1))  # type: ignore[union-attr]
    per_window = 2 * interval
    ds_lines = [n0[i] for i in ds]
    windows = [ds_lines[k : k + per_window] for k in range(0, len(ds_lines), per_window)]
    first_block = next(i for i, ln in enumerate(n1) if "across ranks" in ln)
    blocks = []
    for j, i in enumerate(its):
        end = (
            its[j + 1]
            if j + 1 < len(its)
            else next(k for k in range(i + 1, len(n1)) if not n1[k].startswith(("(min", "    ")))
        )
        blocks.append(n1[i + 1 : end])
    iters_re = re.compile(r"(train_iters \.+ )30$|(--train-iters )30\b")

    def templ(line: str) -> str:
        line = line.replace("{", "{{").replace("}", "}}")
        return iters_re.sub(lambda m: (m.group(1) or m.group(2)) + "{iters}", line)

    return _LabRun(
        runner=templ(n0[0]),
        head0=[templ(ln) for ln in n0[1:start]],
        head1=[templ(ln) for ln in n1[1:first_block]],
        setup_block=n1[first_block : its[0]],
        ds_windows=windows,
        memory=memory,
        iter_lines=[n1[i] for i in its],
        blocks=blocks,
        tail0=n0[ds[-1] + 1 :],
        tail1=n1[its[-1] + 1 + len(blocks[-1]) :],
        interval=interval,
    )


_ITER_NUM_RE = re.compile(
    r"^ iteration +\d+/ +\d+ \| consumed samples: +\d+ \| consumed tokens: +\d+ \|"
)


def _dense_window(
    run: _LabRun, w: int, iters: int, rng: random.Random, op: int
) -> tuple[list[str], int]:
    """The lines of logging window ``w`` (its DeepSpeed lines, iteration line, timer block and
    NCCL lines between them), and the NCCL op counter after it."""
    step = run.interval
    k = w % len(run.iter_lines)
    it = (w + 1) * step
    content = ["node0: " + ln for ln in run.ds_windows[k % len(run.ds_windows)]]
    if w == 0:
        content += ["node0: " + ln for ln in run.memory]
    head = (
        f" iteration {it:8d}/{iters:8d} | consumed samples: {it * 8:12d} | "
        f"consumed tokens: {it * 8 * 128:12d} |"
    )
    content.append("node1: " + _ITER_NUM_RE.sub(head, run.iter_lines[k]))
    content += ["node1: " + ln for ln in run.blocks[k]]
    lines: list[str] = []
    # A timer block is one write of one process, which pdsh prints as it read it: its lines
    # stay together, except in 1 block of 50 (a read that ended inside the write), where only
    # the other node's lines come between them.
    split = rng.random() < 0.02
    for line in content:
        inside = line.startswith("node1:     ")
        while (split or not inside) and rng.random() < 0.5:
            op += 1
            n = 0 if inside else rng.randint(0, 1)
            tmpl = rng.choices(_DENSE_NCCL, _DENSE_NCCL_WEIGHTS)[0]
            lines.append(
                tmpl.format(n=n, m=1 - n, pid=1069 + n, tid=1100 + op % 5, c=op % 2, op=op)
            )
        lines.append(line)
    return lines, op


def write_dense(
    path: Path, size_mb: float, lab: Path, seed: int = 0, collector: str = ""
) -> Written:
    """Content-dense: the real two-node run replayed (module doc); ``collector``: as a log
    collector writes it (``_Out``; the same size in all)."""
    size_mb *= {"kubectl": 0.8, "compose": 0.9}.get(collector, 1.0)  # (what it adds)
    run = _read_lab(lab)
    step = run.interval
    probe = random.Random(seed + 1)  # the size of a window, measured on 500 of them
    sample = sum(
        len("\n".join(_dense_window(run, w, 10**7, probe, 10**6)[0])) + 1 for w in range(500)
    )
    windows = max(2, int(size_mb * 2**20 * 500 / sample))
    iters = windows * step
    rng = random.Random(seed)
    out = _Out(path, collector)
    out.add([run.runner.format(iters=iters)])
    out.add(["node0: " + ln.format(iters=iters) for ln in run.head0])
    out.add(["node1: " + ln.format(iters=iters) for ln in run.head1])
    out.add(["node1: " + ln for ln in run.setup_block])
    op = 0
    for w in range(windows):
        lines, op = _dense_window(run, w, iters, rng, op)
        out.add(lines)
    out.add(["node0: " + ln for ln in run.tail0] + ["node1: " + ln for ln in run.tail1])
    out.close()
    blocks = windows * (2 * step + 1) + 1  # + the set-up block before the first iteration
    return Written(iters, windows, blocks, len(run.memory), out.lines, op)


# -- 64 ranks, log interval 1, other prefixes and dialects ------------------------------------

_RANKS_HEADER = """\
 0: [2026-11-22 03:00:00,001] [INFO] [launch.py:168:main] nnodes=8, num_local_procs=8, node_rank=0
 0: using world size: 64, data-parallel-size: 8, context-parallel size: 1, tensor-model-parallel \
size: 4, pipeline-model-parallel size: 2
 0: ------------------------ arguments ------------------------
 0:   hidden_size ..................................... 4096
 0:   log_interval .................................... 1
 0:   num_attention_heads ............................. 32
 0:   num_layers ...................................... 32
 0:   seq_length ...................................... 4096
 0:   train_iters ..................................... {iters}
 0: -------------------- end of arguments ---------------------
 0: [after dataloaders are built] datetime: 2026-11-22 03:01:00
 0: training ..."""


def memory_report(rank: int, it: int, mb: tuple[str, str, str, str]) -> str:
    """Megatron's memory report of one rank after ``it`` iterations, ``srun --label`` prefix:
    allocated, max allocated, reserved and max reserved MiB as printed."""
    return (
        f"{rank:2d}: [Rank {rank}] (after {it} iterations) memory (MB) | allocated: {mb[0]} | "
        f"max allocated: {mb[1]} | reserved: {mb[2]} | max reserved: {mb[3]}"
    )


def _ranks_iteration(
    it: int, iters: int, ranks: int, rng: random.Random
) -> tuple[list[str], int, int]:
    """The lines of iteration ``it`` of the 64-rank log; (lines, chatter lines, memory reports)."""
    u = rng.uniform
    noise = memory = 0
    lines = []
    order = list(range(ranks))
    rng.shuffle(order)
    for r in order:  # ranks finish their step in any order
        lines.append(
            f"{r:2d}: [Rank {r}] time (ms) | forward: {u(900, 1300):.2f} | backward: "
            f"{u(1800, 2600):.2f} | optimizer_step: {u(40, 90):.2f}"
        )
        if rng.random() < 0.05:
            lines.append(
                f"{r:2d}: /usr/lib/python3/dist-packages/torch/autograd/graph.py:824: "
                "UserWarning: c10d::allreduce_: an autograd kernel was not registered"
            )
            noise += 1
    lines.append(
        f"{ranks - 1:2d}:  [2026-11-22 03:{it // 60 % 60:02d}:{it % 60:02d}] iteration "
        f"{it:8d}/{iters:8d} | consumed samples: {it * 512:12d} | elapsed time per iteration"
        f" (ms): {u(3000, 3400):.1f} | throughput per GPU (TFLOP/s/GPU): {u(180, 200):.1f} | "
        f"learning rate: {3e-4 * (1 - it / (iters + 1)):.6E} | global batch size:   512 | "
        f"lm loss: {u(1.8, 2.4):.6E} | loss scale: 1.0 | grad norm: {u(0.2, 0.9):.3f} | "
        "number of skipped iterations:   0 | number of nan iterations:   0 |"
    )
    lines.append(f"{ranks - 1:2d}: times across ranks (ms):")
    for name in ("forward-backward", "optimizer"):
        lines.append(f"{ranks - 1:2d}:   {name}:")
        for r in range(0, ranks, 16):  # 'all' prints every rank; every 16th here
            lines.append(f"{ranks - 1:2d}:      rank {r:2d}: {u(2900, 3300):.2f}")
    if it % 10 == 0:
        for r in range(ranks):
            mb = (u(20000, 22000), u(30000, 32000), u(34000, 36000), u(36000, 38000))
            lines.append(memory_report(r, it, tuple(f"{x:.1f}" for x in mb)))  # type: ignore[arg-type]
        memory += ranks
        lines.append(
            f" 0: [2026-11-22 03:00:00,000] [INFO] [logging.py:128:log_dist] [Rank 0] step="
            f"{it}, skipped=0, lr=[0.0003], mom=[(0.9, 0.95)]"
        )
        lines.append(
            " 0: [Rank 0] MemAllocated=21.5GB MaxMemAllocated=31.2GB CA=34.6GB MaxCA=36.0GB"
        )
    return lines, noise, memory


def _iterations_for(
    size_mb: float, lines_of: Callable[[int, random.Random], list[str]], seed: int
) -> int:
    """Iterations that fill about ``size_mb`` MiB, each printing ``lines_of(it, rng)``: the
    size of an iteration measured on 100 of them (at least 2)."""
    probe = random.Random(seed + 1)
    sample = sum(len("\n".join(lines_of(it, probe))) + 1 for it in range(1, 101))
    return max(2, int(size_mb * 2**20 * 100 / sample))


_RankIteration = Callable[[int, int, int, random.Random], tuple[list[str], int, int]]
"""(iteration, train iterations, ranks, rng) -> (its lines, chatter lines, memory reports)."""


def _write_64_ranks(
    path: Path, size_mb: float, ranks: int, seed: int, iteration: _RankIteration
) -> tuple[int, int, int, int]:
    """A 64-rank log whose iterations print ``iteration``'s lines: (iterations, lines,
    chatter lines, memory reports)."""
    iters = _iterations_for(size_mb, lambda it, rng: iteration(it, 10**7, ranks, rng)[0], seed)
    rng = random.Random(seed)
    out = _Out(path)
    out.add(_RANKS_HEADER.format(iters=iters).split("\n"))
    memory = noise = 0
    for it in range(1, iters + 1):
        lines, n, m = iteration(it, iters, ranks, rng)
        noise += n
        memory += m
        out.add(lines)
    out.add([" 0: [after training is done] datetime: 2026-11-22 09:00:00"])
    out.close()
    return iters, out.lines, noise, memory


def write_ranks(path: Path, size_mb: float, ranks: int = 64, seed: int = 0) -> Written:
    """64 ranks, log interval 1, srun labels, per-rank timers and memory (module doc)."""
    iters, lines, noise, memory = _write_64_ranks(path, size_mb, ranks, seed, _ranks_iteration)
    return Written(iters, iters, iters * (ranks + 1), memory, lines, noise)


# -- 64 ranks as upstream prints them with --timing-log-option all ----------------------------


def _all_ranks_iteration(
    it: int, iters: int, ranks: int, rng: random.Random
) -> tuple[list[str], int, int]:
    """The lines of iteration ``it`` of the ``--timing-log-option all`` log; (lines, chatter
    lines, memory reports)."""
    u = rng.uniform
    noise = 0
    lines = [
        f"{0:2d}: [Rank 0] time (ms) | fwd: {u(900, 1300):.2f} | bwd: {u(1800, 2600):.2f} | "
        f"bwd_inner: {u(1500, 2200):.2f} | bwd_allreduce: {u(200, 400):.2f} | "
        f"step: {u(40, 90):.2f}",
        f"{ranks - 1:2d}:  [2026-11-22 03:{it // 60 % 60:02d}:{it % 60:02d}] iteration "
        f"{it:8d}/{iters:8d} | consumed samples: {it * 512:12d} | elapsed time per iteration"
        f" (ms): {u(3000, 3400):.1f} | throughput per GPU (TFLOP/s/GPU): {u(180, 200):.1f} | "
        f"learning rate: {3e-4 * (1 - it / (iters + 1)):.6E} | global batch size:   512 | "
        f"lm loss: {u(1.8, 2.4):.6E} | loss scale: 1.0 | grad norm: {u(0.2, 0.9):.3f} | "
        "number of skipped iterations:   0 | number of nan iterations:   0 |",
        f"{ranks - 1:2d}: times across ranks (ms):",
    ]
    for name, lo, hi in (
        ("forward-backward", 2900, 3300),
        ("batch-generator", 1, 9),
        ("optimizer", 40, 90),
    ):
        lines.append(f"{ranks - 1:2d}:   {name}:")
        lines += [f"{ranks - 1:2d}:      rank {r:2d}: {u(lo, hi):.2f}" for r in range(ranks)]
    if rng.random() < 0.05:
        # Another rank's warning, anywhere (the last rank prints its block in one write).
        r = rng.randrange(ranks - 1)
        lines.insert(
            rng.randrange(len(lines)),
            f"{r:2d}: /usr/lib/python3/dist-packages/torch/autograd/graph.py:824: "
            "UserWarning: c10d::allreduce_: an autograd kernel was not registered",
        )
        noise += 1
    memory = 0
    if it == 1:  # Megatron's memory report, once, after the first log interval, by the
        # data-parallel rank 0 of each tensor x pipeline rank
        heads = range(0, ranks, ranks // 8)
        lines += [memory_report(r, it, ("21351.5", "30911.7", "35802.2", "37669.5")) for r in heads]
        memory = len(heads)
    return lines, noise, memory


def write_all_ranks(path: Path, size_mb: float, ranks: int = 64, seed: int = 0) -> Written:
    """64 ranks as upstream prints them with ``--timing-log-option all`` (module doc)."""
    iters, lines, noise, memory = _write_64_ranks(path, size_mb, ranks, seed, _all_ranks_iteration)
    return Written(iters, iters, 2 * iters, memory, lines, noise)


# -- one node's own log, log interval 1 -------------------------------------------------------


def write_interval1(path: Path, size_mb: float, lab: Path) -> Written:
    """The last node's own log of a long run at log interval 1 (module doc)."""
    run = _read_lab(lab)
    n1 = (lab / "2n_dp2_1000mbit_node1.log").read_text().splitlines()
    runner = n1[0].replace("--log-interval 5", "--log-interval 1")
    sample = sum(len(ln) + 1 for k in range(len(run.iter_lines)) for ln in
                 [run.iter_lines[k], *run.blocks[k]]) / len(run.iter_lines)  # fmt: skip
    iters = max(2, int(size_mb * 2**20 / sample))
    out = _Out(path)
    out.add([runner.replace("--train-iters 30", f"--train-iters {iters}")])
    out.add([ln.format(iters=iters) for ln in run.head1])
    out.add(run.setup_block)
    for it in range(1, iters + 1):
        k = it % len(run.iter_lines)
        head = (
            f" iteration {it:8d}/{iters:8d} | consumed samples: {it * 8:12d} | "
            f"consumed tokens: {it * 8 * 128:12d} |"
        )
        out.add([_ITER_NUM_RE.sub(head, run.iter_lines[k]), *run.blocks[k]])
    out.add(run.tail1)
    out.close()
    return Written(iters, iters, iters + 1, 0, out.lines, 0)


# -- a pipeline run, a step line every step -----------------------------------------------------


def write_pipeline(path: Path, size_mb: float, lab: Path) -> Written:
    """The lab's PP=2 run (one machine) at log interval 1 (module doc)."""
    src = (lab / "pp2.log").read_text().splitlines()
    src = [ln for ln in src if not ln.startswith("RC=")]  # the lab's own footer, not output
    its = [i for i, ln in enumerate(src) if ln.startswith(" iteration ")]
    steps = [ln for ln in src if ln.startswith("steps: ")]
    memory = [ln for ln in src[its[0] :] if "memory (MB)" in ln]
    tail = src[its[-1] + 1 :]
    per_step = (sum(len(src[i]) for i in its) / len(its)) + len(steps[0]) + 2
    iters = max(2, int(size_mb * 2**20 / per_step))

    def head_line(ln: str) -> str:
        ln = re.sub(r"(train_iters \.+ )30$", rf"\g<1>{iters}", ln)
        ln = re.sub(r"(log_interval \.+ )5$", r"\g<1>1", ln)
        return ln.replace("--train-iters 30", f"--train-iters {iters}").replace(
            "--log-interval 5", "--log-interval 1"
        )

    out = _Out(path)
    out.add([head_line(ln) for ln in src[: its[0]]])
    step_re = re.compile(r"^steps: \d+ ")
    for it in range(1, iters + 1):
        k = it % len(its)
        head = (
            f" iteration {it:8d}/{iters:8d} | consumed samples: {it * 8:12d} | "
            f"consumed tokens: {it * 8 * 128:12d} |"
        )
        out.add(
            [
                step_re.sub(f"steps: {it} ", steps[it % len(steps)]),
                _ITER_NUM_RE.sub(head, src[its[k]]),
                *(memory if it == 1 else []),
            ]
        )
    out.add(tail)
    out.close()
    return Written(iters, iters, 1, len(memory), out.lines, 0)  # (the set-up block)
