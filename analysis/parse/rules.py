"""What the log parser recognises (keywords, record patterns, the iteration-field table), the
per-stream and per-run state, wrapped records joined back (failures: ``failures``; the run's
config summary: ``merge``)."""

from __future__ import annotations

import re
from array import array
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from analysis.parse.keywords import Keywords
from analysis.parse.lines import OMPI_TAG_MARK, to_float
from analysis.parse.records import (
    Failure,
    IterationTable,
    MemoryTable,
    PipelineStepTable,
    TimerTable,
)
from analysis.parse.storage import DeepSpeedBlocks

STRICT: ContextVar[bool] = ContextVar("analysis.parse.reader strict mode", default=False)
"""Strict mode (``strict()``): a handler's exception propagates instead of becoming a problem."""


@contextmanager
def strict(on: bool = True) -> Iterator[None]:
    """Within this block, parsers created here let a handler's exception propagate.

    By default the parser never raises on log content: an exception inside a line handler is a
    bug of the parser, and it becomes a problem string (``internal parser error``) so that one
    odd line never costs a report.  Tests run in strict mode so that such a bug fails them
    instead of hiding behind a problem string.
    """
    token = STRICT.set(on)
    try:
        yield
    finally:
        STRICT.reset(token)


# Substrings one of which every line that can matter during training contains (see module
# doc).  Lines of the start-up phase need none of them: they are all parsed.
_KEYWORDS: tuple[str, ...] = (
    "|",  # iteration lines of every era, `time (ms) |` lines, `memory (MB) |`
    "(ms)",  # `time across ranks (ms):` headers, NCCL watchdog `Timeout(ms)=`
    "(s)",  # PipelineEngine `iter time (s)` (not a bare "s)": `**kwargs)` is everywhere)
    "iteration",  # key=value iteration lines
    "Error",  # XxxError lines: exceptions, OOM, NCCL and gloo errors
    "*** JOB",  # slurmstepd: error: *** JOB 12 ON n1 CANCELLED AT ... [DUE TO TIME LIMIT]
    "*** STEP",
    "Traceback",
    "Kill",  # `Killed`
    "KILL",  # SIGKILL
    "exits",  # deepspeed launcher: `exits successfully` / `exits with return code = N`
    "ssh exited",  # pdsh: `pdsh@h: node1: ssh exited with exit code 255` (node lost)
    "# run outcome",
    "MemAlloc",  # DeepSpeed ThroughputTimer memory
    "Max_MA",  # DeepSpeed see_memory_usage
)
KW = Keywords(_KEYWORDS)
"""How the readers look for them (``analysis.parse.reader``, ``analysis.parse.bulk``)."""
LATE_CONFIG_LINES = 5_000
"""Lines read in full after training began in one stream of an interleaved multi-node log while
the set-up lines of another stream (Megatron's argument dump, the padded vocabulary) were still
missing: pdsh interleaves nodes, so rank 0's set-up can come after the last rank's first
iteration line."""
OMPI_TAG_BYTES = OMPI_TAG_MARK.encode()
OMPI_PEEK_BYTES = 1 << 20
"""How much of a file is looked at for mpirun's ``--tag-output`` marks."""
TRACEBACK_MAX_LINES = 2000
JSON_MAX_LINES = 5000

ITER_RE = re.compile(r"(?<![\w-])iteration\s*(=?)\s*(\d+)(?:\s*/\s*(\d+))?\s*(\S?)")
GLUE_RE = re.compile(r"(?<![\w-])iteration\s+\d+\s*/\s*\d+")
RANK_RE = re.compile(r"\[Rank (\d+)\]")
MEM_HEAD_RE = re.compile(r"(?:\[Rank \d+\] )?(?:\(?after \d+ iterations?\)? )?memory \(MB\)")
AFTER_RE = re.compile(r"\(after (\d+) iterations?\)")
STEPS_RE = re.compile(
    r"steps:\s*(\d+)\s+loss:\s*(\S+)(?:.*?)iter time \(s\):\s*(\S+)(?:\s+samples/sec:\s*(\S+))?"
)
TIMER_HEAD_RE = re.compile(r"(\(min, max\) time|max time|times) across ranks \(ms\):")
TIMER_LINE_RE = re.compile(r"^\s*(\S.*?) \.*: \(?\s*([-\d.eE+]+)(?:\s*,\s*([-\d.eE+]+))?\)?\s*$")
TIMER_RANK_RE = re.compile(r"^\s+rank\s+(\d+):\s*([-\d.eE+]+)\s*$")
TIMER_NAME_RE = re.compile(r"^\s{1,3}(\S[^:]*):\s*$")
ARG_RE = re.compile(r"^\s+(\S+) \.+ ?(.*)$")
DS_LOGGER_RE = re.compile(r"^\[[^\]]*\] \[[A-Z]+\] \[[^\]]*\] ?")
DS_CFG_LINE_RE = re.compile(r"^\s+(\w+) (\.*) ?(.*)$")
MEMALLOC_RE = re.compile(r"MemAllocated=([\d.]+)\s*GB.*?MaxMemAllocated=([\d.]+)\s*GB")
SEE_MEM_RE = re.compile(
    r"MA ([\d.]+) GB\s+Max_MA ([\d.]+) GB\s+CA ([\d.]+) GB\s+Max_CA ([\d.]+) GB"
)
PARAMS_RE = re.compile(
    r"number of parameters on (?:\(tensor, pipeline\) )?model parallel rank "
    r"\(?(\d+)(?:, (\d+))?\)?: (\d+)"
)
VOCAB_RE = re.compile(r"padded vocab \(size: (\d+)\) with (\d+) dummy tokens \(new size: (\d+)\)")
VERSION_RE = re.compile(r"^(torch|deepspeed) (?:version|info) \.+ ([^,\s]+)")
DS_INFO_RE = re.compile(r"DeepSpeed info: version=([^,\s]+)")
GIT_RE = re.compile(r"git_hash=(\S+)(?: git_branch=(\S+))?")

ITER_FIELDS: dict[str, str] = {
    "lm loss": "lm_loss",
    "loss": "lm_loss",
    "loss scale": "loss_scale",
    "grad norm": "grad_norm",
    "number of skipped iterations": "skipped",
    "skipped iterations": "skipped",
    "skipped": "skipped",
    "number of nan iterations": "nan",
    "nan iterations": "nan",
    "global batch size": "global_batch_size",
    "batch size": "global_batch_size",
    "learning rate": "learning_rate",
    "lr": "learning_rate",
    "consumed samples": "consumed_samples",
    "consumed tokens": "consumed_tokens",
    "samples per second": "samples_per_s",
    "samples per sec": "samples_per_s",
    "samples/sec": "samples_per_s",
    "samples/s": "samples_per_s",
    "samples per s": "samples_per_s",
    "tflops": "tflops",
    "tflops per gpu": "tflops",
    "tflop/s/gpu": "tflops",
    "throughput per gpu (tflop/s/gpu)": "tflops",
    "model tflops": "tflops",
    "tokens per gpu per second (tgs)": "tokens_per_gpu_per_s",
    "tgs": "tokens_per_gpu_per_s",
}
"""Iteration-line keys (as ``norm_key`` writes them) -> ``Iteration`` field; the elapsed time,
whose unit is in its key, is read apart (``to_elapsed_ms``)."""
INT_FIELDS = frozenset(
    ("skipped", "nan", "global_batch_size", "consumed_samples", "consumed_tokens")
)

# Megatron's minmax block names use dashes; DeepSpeed's use underscores.  A single-line
# `time (ms) | ...` block without `[Rank N]` is Megatron's (older Megatron's Timers.log) when a
# name has a dash or a space or is one of Megatron's own plain names.
MEGATRON_PLAIN_NAMES = frozenset(("optimizer", "allreduce", "batch generator"))


@dataclass
class StreamState:
    """Per-prefix state of an open multi-line block."""

    mode: str | None = None
    """``args``, ``timer``, ``traceback``, ``listtb`` (a traceback printed as a Python list),
    ``json``, ``engine``, ``wrap`` (a hard-wrapped record) or None."""
    timer_kind: str = ""
    """Header kind of an open Megatron timer block; ``iteration`` or ``timer`` for the record
    of an open ``wrap`` block."""
    timer_values: dict[str, Any] = field(default_factory=dict)
    """Values collected so far in an open timer block."""
    timer_name: str | None = None
    """Current timer name in a ``times across ranks`` (per-rank) block."""
    start_line: int = 0
    """Line where the open block started."""
    lines: int = 0
    """Lines consumed by the open block."""
    buf: list[str] = field(default_factory=list)
    """Lines of an open JSON dump, wrapped record (kept whole: their widths tell a cut at a
    fixed width from a word wrap) or list-printed traceback (from its ``[``)."""
    depth: int = 0
    """Brace depth of an open JSON dump."""
    chained: bool = False
    """A ``During handling of the above exception`` line was seen after an exception."""
    key: str = ""
    """The stream's key (launcher prefixes)."""


@dataclass
class RunState:
    """A run being filled; turned into a ParsedRun by ``finished_run``."""

    source: str
    first_line: int
    iterations: IterationTable = field(default_factory=IterationTable)
    memory: MemoryTable = field(default_factory=MemoryTable)
    memory_other: MemoryTable = field(default_factory=MemoryTable)
    megatron_blocks: TimerTable = field(default_factory=TimerTable)
    # DeepSpeed blocks: (values, rank, line, iterations seen before, pipeline steps before)
    ds_blocks: DeepSpeedBlocks = field(default_factory=DeepSpeedBlocks)
    steps: PipelineStepTable = field(default_factory=PipelineStepTable)
    args: dict[str, Any] = field(default_factory=dict)
    cmd_args: dict[str, Any] = field(default_factory=dict)
    world: dict[str, int] = field(default_factory=dict)
    params: dict[str, int] = field(default_factory=dict)
    vocab: dict[str, int] = field(default_factory=dict)
    ds_config: dict[str, Any] = field(default_factory=dict)
    ds_engine: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    failure: Failure | None = None
    further_failures: list[Failure] = field(default_factory=list)
    failure_stream: str | None = None
    outcome: tuple[str, str | None, str, int] | None = None
    max_iter: int = -1
    """The highest (and last: they go up) iteration number of the run; -1 before its first."""
    train_iters: int | None = None
    reached_final: bool = False
    pipe_iterations: bool = False
    ended: bool = False
    spawned: int = 0
    exited_ok: int = 0
    iter_numbers: dict[str, array[int]] = field(default_factory=dict)
    """Stream -> numbers of the iteration lines it printed, in order (per-stream attribution
    of timer blocks: the position of one node's line among another's means nothing)."""
    training_streams: set[str] = field(default_factory=set)
    """Streams (launcher prefixes, ``split_prefix`` keys) whose training output began: their
    set-up lines are over. Another stream's set-up lines are still read (interleaved nodes)."""
    content_streams: set[str] = field(default_factory=set)
    """Streams that printed training output, a failure or an exit in this run: a boundary line
    (argument dump, ``using world size``, launcher command) of such a stream starts a new run."""
    boundaries_seen: set[tuple[str, str]] = field(default_factory=set)
    """(stream, boundary kind) already printed in this run: the same again is a relaunch."""
    config_until: int = 0
    """Line number up to which every line is read although training began (see
    ``LATE_CONFIG_LINES``); 0 once the set-up is complete."""
    args_stream: str | None = None
    """Stream that printed Megatron's argument dump (rank 0's)."""
    seen_iters: set[int] | None = None
    """The run's iteration numbers, built on first need (``has_iteration``) and kept then."""

    def has_iteration(self, number: int) -> bool:
        """Whether iteration ``number`` was read: numbers usually only grow, so one above the
        last is new; anything else is looked up in a set built on first need."""
        if number >= self.max_iter:
            return number == self.max_iter
        if self.seen_iters is None:
            self.seen_iters = set(self.iterations.column("iteration").ints().tolist())
        return number in self.seen_iters

    def begin_training(self, key: str, lineno: int, content: bool = True) -> None:
        """Stream ``key`` printed training output at ``lineno`` (``content``: a record, not
        only Megatron's ``training ...`` line)."""
        if not self.training_streams and key and not self.config_complete():
            self.config_until = lineno + LATE_CONFIG_LINES
        self.training_streams.add(key)
        if content:
            self.content_streams.add(key)
        if self.config_complete():
            self.config_until = 0

    @property
    def last_iter(self) -> int | None:
        """The run's last iteration number, None before its first."""
        return self.max_iter if self.max_iter >= 0 else None

    def end(self, key: str) -> None:
        """Stream ``key`` ended the run (a failure, an exit, the outcome marker)."""
        self.ended = True
        self.content_streams.add(key)

    def config_complete(self) -> bool:
        """Megatron's argument dump was read, and the padded vocabulary or the end of the set-up
        of the stream that printed the dump (its own training output): the spec is known."""
        return bool(self.args) and (bool(self.vocab) or self.args_stream in self.training_streams)


WRAP_MAX_LINES = 40
"""Physical lines one hard-wrapped record may span."""
_ELAPSED_RE = re.compile(r"elapsed|iteration[ _]time|step[ _]time|time[ _]per[ _]iteration", re.I)
_LAST_PAIR_RE = re.compile(r"\|[^|]*:\s*[-+\d.eE]+$")
_TAIL_PAIR_RE = re.compile(r"[\w .()/+-]*:\s*[-+\d.eE]+|[-+\d.eE]+")
_WRAP_WIDTHS = frozenset((72, 78, 79, 80, 100, 120, 128, 132, 150, 160, 200, 240, 250, 256))
"""Widths at which terminals, pagers and log viewers cut lines (a cut, not a word wrap)."""


def continues_record(text: str) -> bool:
    """Whether a line can be the continuation of a hard-wrapped iteration or timer record:
    ``key: value |`` pieces, or a last ``key: value``, and nothing that starts a record."""
    s = text.strip()
    if not s or s.startswith(("[", "time (ms)", "(min, max)", "steps:")) or "memory (MB)" in s:
        return False
    if ITER_RE.search(s) is not None:  # (also every `iteration k/N` that GLUE_RE finds)
        return False
    return "|" in s or _TAIL_PAIR_RE.fullmatch(s) is not None


def record_complete(text: str, timer: bool = False) -> bool:
    """Whether a (joined) record is whole: Megatron ends an iteration line with ``|`` and a
    timer line (``time (ms) | a: 1 | b: 2``) without; an iteration line with timers glued
    after it ends like a timer line."""
    if not timer:
        m = ITER_RE.search(text)
        timer = m is not None and "time (ms)" in text[m.end() :]
    body = text.rstrip()
    if not timer:
        # Every era prints the iteration time early in the record: without it, a line that
        # ends with `|` was wrapped right after one.
        return body.endswith("|") and _ELAPSED_RE.search(body) is not None
    # A timer line is whole when its last piece is `name: value` (not `name:`, not `|`).
    return _LAST_PAIR_RE.search(body) is not None


def join_wrapped(parts: list[str]) -> str:
    """Join the physical lines of a hard-wrapped record. A cut at a fixed width (every line
    but the last equally long, or one line of a usual terminal width) splits wherever it falls:
    joined as is; a word wrap dropped the space at the break: joined with one. A number cut in
    two (``lm loss: 5.86`` + ``6232E+00``) is joined as is either way."""
    if len(parts) == 1:
        return parts[0]
    widths = {len(p) for p in parts[:-1]}
    cut = len(widths) == 1 and (len(parts) > 2 or len(parts[0]) in _WRAP_WIDTHS)
    out = parts[0]
    for part in parts[1:]:
        split_number = re.search(r":\s*[-+\d.eE]+$", out) and re.match(r"[\d.eE+-]", part)
        out += part if cut or split_number or out.endswith(" ") else " " + part
    return out


def to_elapsed_ms(key: str, value: str) -> float | None:
    """Elapsed time in ms from a normalised key (which carries the unit) and a value."""
    num = to_float(value.rstrip("ms").rstrip())
    if num is None:
        return None
    if "(ms)" in key or key.endswith(" ms"):
        return num
    if "(s)" in key or key.endswith((" s", " sec", "(sec)")):
        return num * 1000.0
    if value.strip().endswith("ms"):
        return num
    return None


def to_tflops(value: str) -> float | None:
    """TFLOP/s from a value with its unit (``112.9TFLOPS``, ``950.1GFLOPS``); None if no unit."""
    m = re.fullmatch(r"\s*([-+\d.eE]+)\s*([TGP])FLOPS?(?:/s)?\s*", value, flags=re.I)
    if m is None:
        return None
    num = to_float(m.group(1))
    scale = {"T": 1.0, "G": 1e-3, "P": 1e3}[m.group(2).upper()]
    return num * scale if num is not None else None
