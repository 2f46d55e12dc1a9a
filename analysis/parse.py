"""Parse Megatron / Megatron-DeepSpeed / DeepSpeed training logs into typed records.

``parse_lines`` is the core; ``parse_text`` and ``parse_file`` (streaming, chunked, fast path
for noise) wrap it; ``merge_runs`` joins the per-node files of one run.  Nothing here raises on
log content: what cannot be read becomes a line in ``ParsedRun.problems``.

How a file is read
  Until a run's training starts (first iteration, ``steps:`` or DeepSpeed timer line, or
  Megatron's ``training ...``), after it ends (final iteration, launcher exit, failure), and
  while a multi-line block is open (argument dump, traceback, JSON dump), every line is
  parsed.  In between, only lines holding one of ``_KEYWORDS`` are parsed; a line without one
  of a stream (launcher prefix) whose Megatron timer block is open only continues or closes
  that block.  ``iteration`` is a keyword of
  its own (``iteration=N`` lines have no ``|``) only until the run's first iteration line:
  once that line holds ``|``, the run's iteration lines are found by ``|``.  A new run that
  starts in the middle of training output without any of those lines is still split off
  when the iteration counter goes back.  ``analysis.scan`` is the file reader: it finds
  keyword lines with ``bytes.find`` over whole chunks (what makes a 1 GB log of NCCL chatter
  cheap) and reads the frequent lines of a training phase in bulk, with the same result.

Attribution of DeepSpeed ``wall_clock_breakdown`` lines to iterations
  The plain engine prints one line per optimizer step and per timer group, before Megatron's
  iteration line of that step; with ``--log-interval L``, the L blocks of one group printed
  before ``iteration N`` are iterations N-L+1..N.  When the count of blocks between two
  iteration lines does not match the difference of their numbers, the blocks stay
  unattributed (and a problem says so).  PipelineEngine timers are printed every
  ``steps_per_print`` steps as totals: ``pipe_*`` groups right after the ``steps: N`` line
  (attributed to N), the others before it (attributed to the next ``steps:`` line).

Interleaved nodes (pdsh, srun, torchrun prefixes)
  Lines are told apart by their launcher prefix (``split_prefix``'s stream key), and what
  depends on the order of lines is kept per stream: a stream's set-up lines end when that
  stream's training output begins, a boundary line (argument dump, ``using world size``,
  launcher command) starts a new run only when its own stream already trained, failed or
  printed the same kind of line, and timer blocks are placed among the iteration lines of
  their own stream. Rank 0's set-up lines may come after the last rank's first iteration
  line: while the argument dump is missing, every line is read for up to
  ``_LATE_CONFIG_LINES`` lines after training began.

Records that are not one line
  A hard-wrapped iteration or timer record is joined back (see ``_join_wrapped``), timers
  glued after an iteration record are read as a ``time (ms)`` line, and a traceback printed
  as a Python list (``['Traceback (most recent call last):\n', ...]``) fails the run with the
  list's last exception. ``strict()`` makes a handler's exception propagate (tests).
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import re
import shlex
import sys
import warnings
from array import array
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, BinaryIO, get_args

from analysis._lines import (
    MAX_LINE_CHARS,
    OMPI_TAG_MARK,
    demux_tagged,
    norm_key,
    parse_pairs,
    split_prefix,
    strip_prefix,
    to_float,
    to_int,
    typed_value,
)
from analysis.records import (
    Failure,
    FailureKind,
    Iteration,
    IterationTable,
    Memory,
    MemoryTable,
    ParsedRun,
    PipelineStep,
    RecordTable,
    TimerBlock,
    TimerTable,
    block_dict,
)
from analysis.scan import Keywords, drive_file
from analysis.storage import (
    DeepSpeedBlocks,
    IterIndex,
    attribute_blocks,
    merge_attribution,
    merge_iterations,
)

__all__ = [
    "merge_runs",
    "parse_file",
    "parse_lines",
    "parse_stream",
    "parse_text",
    "strict",
    "strip_prefix",
]

_STRICT: ContextVar[bool] = ContextVar("analysis.parse strict mode", default=False)
"""Strict mode (``strict()``): a handler's exception propagates instead of becoming a problem."""


@contextmanager
def strict(on: bool = True) -> Iterator[None]:
    """Within this block, parsers created here let a handler's exception propagate.

    By default the parser never raises on log content: an exception inside a line handler is a
    bug of the parser, and it becomes a problem string (``internal parser error``) so that one
    odd line never costs a report.  Tests run in strict mode so that such a bug fails them
    instead of hiding behind a problem string.
    """
    token = _STRICT.set(on)
    try:
        yield
    finally:
        _STRICT.reset(token)


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
_KW = Keywords(_KEYWORDS)
"""How the readers look for them (``analysis.scan``)."""
_LATE_CONFIG_LINES = 5_000
"""Lines read in full after training began in one stream of an interleaved multi-node log while
the set-up lines of another stream (Megatron's argument dump, the padded vocabulary) were still
missing: pdsh interleaves nodes, so rank 0's set-up can come after the last rank's first
iteration line."""
_OMPI_TAG_BYTES = OMPI_TAG_MARK.encode()
_OMPI_PEEK_BYTES = 1 << 20
"""How much of a file is looked at for mpirun's ``--tag-output`` marks."""
_TRACEBACK_MAX_LINES = 2000
_JSON_MAX_LINES = 5000

_ITER_RE = re.compile(r"(?<![\w-])iteration\s*(=?)\s*(\d+)(?:\s*/\s*(\d+))?\s*(\S?)")
_GLUE_RE = re.compile(r"(?<![\w-])iteration\s+\d+\s*/\s*\d+")
_RANK_RE = re.compile(r"\[Rank (\d+)\]")
_MEM_HEAD_RE = re.compile(r"(?:\[Rank \d+\] )?(?:\(?after \d+ iterations?\)? )?memory \(MB\)")
_AFTER_RE = re.compile(r"\(after (\d+) iterations?\)")
_STEPS_RE = re.compile(
    r"steps:\s*(\d+)\s+loss:\s*(\S+)(?:.*?)iter time \(s\):\s*(\S+)(?:\s+samples/sec:\s*(\S+))?"
)
_TIMER_HEAD_RE = re.compile(r"(\(min, max\) time|max time|times) across ranks \(ms\):")
_TIMER_LINE_RE = re.compile(r"^\s*(\S.*?) \.*: \(?\s*([-\d.eE+]+)(?:\s*,\s*([-\d.eE+]+))?\)?\s*$")
_TIMER_RANK_RE = re.compile(r"^\s+rank\s+(\d+):\s*([-\d.eE+]+)\s*$")
_TIMER_NAME_RE = re.compile(r"^\s{1,3}(\S[^:]*):\s*$")
_ARG_RE = re.compile(r"^\s+(\S+) \.+ ?(.*)$")
_DS_LOGGER_RE = re.compile(r"^\[[^\]]*\] \[[A-Z]+\] \[[^\]]*\] ?")
_DS_CFG_LINE_RE = re.compile(r"^\s+(\w+) (\.*) ?(.*)$")
_MEMALLOC_RE = re.compile(r"MemAllocated=([\d.]+)\s*GB.*?MaxMemAllocated=([\d.]+)\s*GB")
_SEE_MEM_RE = re.compile(
    r"MA ([\d.]+) GB\s+Max_MA ([\d.]+) GB\s+CA ([\d.]+) GB\s+Max_CA ([\d.]+) GB"
)
_PARAMS_RE = re.compile(
    r"number of parameters on (?:\(tensor, pipeline\) )?model parallel rank "
    r"\(?(\d+)(?:, (\d+))?\)?: (\d+)"
)
_VOCAB_RE = re.compile(r"padded vocab \(size: (\d+)\) with (\d+) dummy tokens \(new size: (\d+)\)")
_VERSION_RE = re.compile(r"^(torch|deepspeed) (?:version|info) \.+ ([^,\s]+)")
_DS_INFO_RE = re.compile(r"DeepSpeed info: version=([^,\s]+)")
_GIT_RE = re.compile(r"git_hash=(\S+)(?: git_branch=(\S+))?")
_EXC_RE = re.compile(r"^(?:[A-Za-z_]\w*\.)*(_?[A-Z]\w*)(?::(?:\s.*)?)?$")
_EXC_NAME_SUFFIX = ("Error", "Exception", "Interrupt", "Exit", "Failure", "Timeout")
_RC_RE = re.compile(r"exits with return code = (-?\d+)")
_SSH_RC_RE = re.compile(r"([\w.\-]+): ssh exited with exit code (\d+)")
_OUTCOME_RE = re.compile(
    r"# run outcome:\s*(completed|failed|incomplete|interrupted)(?:\s+kind=(\w+))?"
    r"(?:\s+reason=(.*))?$"
)
_KILLED_RE = re.compile(r"\bKilled\b|\bSIGKILL\b|Signal 9\b")
_SLURM_RE = re.compile(r"\*\*\* (?:JOB|STEP) \S+ ON \S+ CANCELLED AT")
_OOM_RE = re.compile(
    r"CUDA out of memory|OutOfMemoryError|DefaultCPUAllocator|can't allocate memory"
    r"|not enough memory|out of memory|MemoryError|Unable to allocate"
)
_NCCL_RE = re.compile(
    r"NCCL error|nccl\w*Error|\bNCCL\b.*\b(?:failure|failed|timeout)|Watchdog caught collective"
    r"|Gloo connectFullMesh failed|third_party/gloo|Connection (?:closed|reset) by peer"
    r"|DistBackendError|ProcessGroupNCCL.*(?:timed out|Timeout)"
)
_FAILURE_KINDS = frozenset(get_args(FailureKind))

# Iteration-line keys (normalised by norm_key) -> Iteration field.  Elapsed time is handled
# separately because of its unit.
_ITER_FIELDS: dict[str, str] = {
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
_INT_FIELDS = frozenset(
    ("skipped", "nan", "global_batch_size", "consumed_samples", "consumed_tokens")
)

# Megatron's minmax block names use dashes; DeepSpeed's use underscores.  A single-line
# `time (ms) | ...` block without `[Rank N]` is Megatron's (older Megatron's Timers.log) when a
# name has a dash or a space or is one of Megatron's own plain names.
_MEGATRON_PLAIN_NAMES = frozenset(("optimizer", "allreduce", "batch generator"))

_SUMMARY_KEYS = (
    "num_layers",
    "hidden_size",
    "num_attention_heads",
    "seq_length",
    "micro_batch_size",
    "global_batch_size",
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "data_parallel_size",
    "zero_stage",
    "world_size",
    "padded_vocab_size",
    "num_parameters",
)


@dataclass
class _Stream:
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
    """Text of an open JSON dump or of a wrapped iteration line."""
    depth: int = 0
    """Brace depth of an open JSON dump."""
    chained: bool = False
    """A ``During handling of the above exception`` line was seen after an exception."""
    offset: int = 0
    """Where the record starts in the first line of a ``wrap``/``listtb`` block (the lines
    are kept whole: their widths tell a cut at a fixed width from a word wrap)."""
    key: str = ""
    """The stream's key (launcher prefixes)."""


@dataclass
class _Run:
    """A run being filled; turned into a ParsedRun by ``_finish``."""

    source: str
    first_line: int
    iterations: IterationTable = field(default_factory=IterationTable)
    iter_index: IterIndex = field(init=False)
    memory: MemoryTable = field(default_factory=MemoryTable)
    memory_other: MemoryTable = field(default_factory=MemoryTable)
    megatron_blocks: TimerTable = field(default_factory=TimerTable)
    # DeepSpeed blocks: (values, rank, line, iterations seen before, pipeline steps before)
    ds_blocks: DeepSpeedBlocks = field(default_factory=DeepSpeedBlocks)
    steps: list[PipelineStep] = field(default_factory=list)
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
    failure_stream: str | None = None
    outcome: tuple[str, str | None, str, int] | None = None
    last_iter: int | None = None
    max_iter: int = -1
    train_iters: int | None = None
    reached_final: bool = False
    pipe_iterations: bool = False
    training: bool = False
    ended: bool = False
    spawned: int = 0
    exited_ok: int = 0
    exit_codes: list[int] = field(default_factory=list)
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
    ``_LATE_CONFIG_LINES``); 0 once the set-up is complete."""
    args_stream: str | None = None
    """Stream that printed Megatron's argument dump (rank 0's)."""

    def begin_training(self, key: str, lineno: int, content: bool = True) -> None:
        """Stream ``key`` printed training output at ``lineno`` (``content``: a record, not
        only Megatron's ``training ...`` line)."""
        if not self.training and key and not self.config_complete():
            self.config_until = lineno + _LATE_CONFIG_LINES
        self.training = True
        self.training_streams.add(key)
        if content:
            self.content_streams.add(key)
        if self.config_complete():
            self.config_until = 0

    def config_complete(self) -> bool:
        """Megatron's argument dump was read, and the padded vocabulary or the end of the set-up
        of the stream that printed the dump (its own training output): the spec is known."""
        return bool(self.args) and (bool(self.vocab) or self.args_stream in self.training_streams)

    def __post_init__(self) -> None:
        self.iter_index = IterIndex(self.iterations)


class _Core:
    """The line-by-line state machine shared by every entry point."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.runs: list[ParsedRun] = []
        self.run = _Run(source=source, first_line=1)
        self.streams: dict[str, _Stream] = {}
        self.open_blocks = 0
        self.timer_keys: set[str] = set()
        self.truncated = 0
        self.strict = _STRICT.get()
        self.line = 0

    # -- driver interface -------------------------------------------------------------------

    @property
    def active(self) -> bool:
        """Whether every line must be fed (not only those holding a keyword).  An open
        Megatron timer block needs only the lines of its own stream (``timer_keys``)."""
        run = self.run
        return (
            self.open_blocks > len(self.timer_keys)
            or not run.training
            or run.ended
            or self.line < run.config_until
        )

    @staticmethod
    def stream_key(raw: str) -> str:
        """The stream key ``feed`` finds for a line."""
        raw = raw[:MAX_LINE_CHARS].rstrip("\r\n")
        return split_prefix(raw.replace("\x00", "") if "\x00" in raw else raw)[0]

    def feed(self, lineno: int, raw: str, dispatch: bool = True) -> None:
        """Parse one physical line (1-based ``lineno``).  ``dispatch=False``: only continue
        or close an open block of its stream (a training line without a keyword)."""
        try:
            self._feed(lineno, raw, dispatch)
        except Exception as exc:
            if self.strict:
                raise
            self.run.problems.append(f"line {lineno}: internal parser error {exc!r} (skipped)")

    def finish(self) -> list[ParsedRun]:
        """Close open blocks and return every run of the input."""
        for key, st in list(self.streams.items()):
            if st.mode is not None:
                self._close_block(key, st, st.start_line, eof=True)
        if self.truncated:
            self.run.problems.append(
                f"{self.truncated} line(s) longer than {MAX_LINE_CHARS} characters were truncated"
            )
        self._finish_run()
        return self.runs

    # -- dispatch ---------------------------------------------------------------------------

    def _feed(self, lineno: int, raw: str, dispatch: bool = True) -> None:
        self.line = lineno
        if len(raw) > MAX_LINE_CHARS:
            raw = raw[:MAX_LINE_CHARS]
            self.truncated += 1
        raw = raw.rstrip("\r\n")
        if "\x00" in raw:
            raw = raw.replace("\x00", "")
        key, text = split_prefix(raw)
        st = self.streams.get(key)
        if st is not None and st.mode is not None and self._continue_block(key, st, text, lineno):
            return
        if dispatch:
            self._dispatch(key, text, lineno)

    def _open(self, key: str, mode: str, lineno: int) -> _Stream:
        st = self.streams.get(key)
        if st is None:
            st = self.streams[key] = _Stream()
        if st.mode is None:
            self.open_blocks += 1
        st.mode = mode
        st.key = key
        if mode == "timer":
            self.timer_keys.add(key)
        else:
            self.timer_keys.discard(key)
        st.start_line = lineno
        st.lines = 0
        st.buf = []
        st.depth = 0
        st.timer_values = {}
        st.timer_name = None
        st.offset = 0
        return st

    def _close(self, st: _Stream) -> None:
        if st.mode is not None:
            self.open_blocks -= 1
        if st.mode == "timer":
            self.timer_keys.discard(st.key)
        st.mode = None
        st.buf = []
        st.timer_values = {}

    def _dispatch(self, key: str, text: str, lineno: int) -> None:
        run = self.run
        if "# run outcome" in text:
            self._outcome(key, text, lineno)
            return
        if "iteration" in text and self._iteration_line(key, text, lineno):
            if "|" in text:
                run.pipe_iterations = True
            return
        if "steps:" in text and "iter time" in text:
            self._steps(key, text, lineno)
            return
        if "time (ms)" in text and "|" in text:
            self._single_line_timers(key, text, lineno)
            return
        if "across ranks (ms)" in text:
            m = _TIMER_HEAD_RE.search(text)
            if m:
                st = self._open(key, "timer", lineno)
                st.timer_kind = m.group(1)
                return
        if "memory (MB)" in text:
            self._megatron_memory(text, lineno)
            return
        if "MemAllocated=" in text:
            m = _MEMALLOC_RE.search(text)
            if m:
                rank = _RANK_RE.search(text)
                self.run.memory_other.append(
                    Memory(
                        rank=int(rank.group(1)) if rank else None,
                        allocated_mb=float(m.group(1)) * 1024.0,
                        max_allocated_mb=float(m.group(2)) * 1024.0,
                        kind="deepspeed",
                        line=lineno,
                    )
                )
                return
        if "Max_MA" in text:
            m = _SEE_MEM_RE.search(text)
            if m:
                # see_memory_usage prints bytes / 1024**3 rounded to 2 decimals ("GB"; Max_CA
                # rounded to a whole number), so * 1024 gives MiB to that precision.
                ma, max_ma, ca, max_ca = (float(g) * 1024.0 for g in m.groups())
                run.memory_other.append(
                    Memory(
                        rank=None,
                        allocated_mb=ma,
                        max_allocated_mb=max_ma,
                        reserved_mb=ca,
                        max_reserved_mb=max_ca,
                        kind="see_memory_usage",
                        line=lineno,
                    )
                )
                return
        if self._failure_line(key, text, lineno):
            return
        if "exits" in text:
            self._launcher_exit(key, text, lineno)
            return
        if "ssh exited" in text:
            self._ssh_exit(key, text, lineno)
            return
        if (
            run.training
            and not run.ended
            and (key in run.training_streams or self.line >= run.config_until)
        ):
            # Training phase of this stream: nothing else can matter (keeps fast and slow paths
            # equal). Another stream's set-up lines are still read while every line is fed.
            return
        self._config_line(key, text, lineno)

    # -- multi-line blocks ------------------------------------------------------------------

    def _continue_block(self, key: str, st: _Stream, text: str, lineno: int) -> bool:
        """Feed a line to the open block of its stream; False if the block ended before it."""
        st.lines += 1
        mode = st.mode
        if mode == "timer":
            m = _TIMER_LINE_RE.match(text)
            if m and st.timer_kind != "times":
                a = to_float(m.group(2))
                b = to_float(m.group(3)) if m.group(3) else None
                if a is not None:
                    st.timer_values[m.group(1).strip()] = (a, b) if b is not None else a
                    return True
            if st.timer_kind == "times":
                r = _TIMER_RANK_RE.match(text)
                if r and st.timer_name is not None:
                    v = to_float(r.group(2))
                    if v is not None:
                        lo, hi = st.timer_values.get(st.timer_name, (v, v))
                        st.timer_values[st.timer_name] = (min(lo, v), max(hi, v))
                    return True
                n = _TIMER_NAME_RE.match(text)
                if n:
                    st.timer_name = n.group(1).strip()
                    return True
            self._close_block(key, st, lineno)
            return False
        if mode == "args":
            if "end of arguments" in text:
                self._close(st)
                self._config_read()
                return True
            m = _ARG_RE.match(text)
            if m:
                self.run.args[m.group(1)] = typed_value(m.group(2))
                return True
            if st.lines > 2000:
                self.run.problems.append(f"line {st.start_line}: argument dump never ended")
                self._close(st)
                return False
            return True  # interleaved text inside the dump is ignored
        if mode == "engine":
            body = _DS_LOGGER_RE.sub("", text, count=1)
            if "json =" in body:
                self._close(st)
                return False
            m = _DS_CFG_LINE_RE.match(body)
            if m and "print" in text:
                self.run.ds_engine[m.group(1)] = typed_value(m.group(3))
                return True
            self._close(st)
            return False
        if mode == "json":
            st.buf.append(text)
            st.depth += text.count("{") - text.count("}")
            if st.depth <= 0 or st.lines > _JSON_MAX_LINES:
                self._close_block(key, st, lineno)
            return True
        if mode == "traceback":
            return self._traceback_line(key, st, text, lineno)
        if mode == "wrap":
            if _continues(text) and st.lines <= _WRAP_MAX_LINES:
                st.buf.append(text)
                joined = _join_wrapped(st.buf)
                if _record_complete(joined, st.timer_kind == "timer"):
                    self._close_block(key, st, lineno)
                return True
            self._close_block(key, st, lineno)
            return False
        if mode == "listtb":
            st.buf.append(text)
            if text.rstrip().endswith("]") or st.lines > _TRACEBACK_MAX_LINES:
                self._close_block(key, st, lineno)
            return True
        self._close(st)
        return False

    def _close_block(self, key: str, st: _Stream, lineno: int, eof: bool = False) -> None:
        mode = st.mode
        if mode == "timer":
            if st.timer_values:
                self.run.megatron_blocks.append(
                    TimerBlock(
                        source="megatron",
                        values_ms=dict(st.timer_values),
                        iteration=self._last_iter(key),
                        line=st.start_line,
                    )
                )
        elif mode == "json":
            self._json_dump("\n".join(st.buf), st.start_line)
        elif mode == "wrap":
            # Closed before the handlers run: they may open a block of their own.
            joined, start, kind = _join_wrapped(st.buf), st.start_line, st.timer_kind
            self._close(st)
            if kind == "timer":
                self._single_line_timers(key, joined, start, allow_wrap=False)
            else:
                self._iteration_text(key, joined, start, allow_wrap=False)
            return
        elif mode == "listtb":
            # A list's repr is one logical line: a viewer cut it wherever the width fell.
            joined, start = "".join(st.buf)[st.offset :], st.start_line
            self._close(st)
            self._list_traceback_end(key, joined, start, eof)
            return
        elif mode == "traceback" and eof:
            self.run.problems.append(
                f"line {st.start_line}: traceback without a final exception line (log cut short?)"
            )
        elif mode == "args" and eof:
            self.run.problems.append(f"line {st.start_line}: argument dump cut short")
        self._close(st)

    # -- iterations -------------------------------------------------------------------------

    def _iteration_line(self, key: str, text: str, lineno: int) -> bool:
        matches = list(_GLUE_RE.finditer(text))
        lead = text[: matches[0].start()] if matches else ""
        if len(matches) > 1 or "time (ms)" in lead or "memory (MB)" in lead:
            # Several records glued on one line: split at each `iteration k/N`.
            head = text[: matches[0].start()]
            if head.strip(" |"):
                self._dispatch(key, head, lineno)
            for i, m in enumerate(matches):
                end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
                self._iteration_text(key, text[m.start() : end], lineno, allow_wrap=False)
            return True
        return self._iteration_text(key, text, lineno, allow_wrap=True)

    def _iteration_text(self, key: str, text: str, lineno: int, allow_wrap: bool) -> bool:
        m = _ITER_RE.search(text)
        if m is None:
            return False
        rest = text[m.end() - len(m.group(4)) :]
        head = text[: m.start()]
        if "|" in head:
            rest = head + "|" + rest  # GPT-NeoX puts `samples/sec: 7.8 |` before the iteration
        if m.group(4) not in ("|", "") and not m.group(1):
            return False  # prose: "validation loss at iteration 137650 on ..."
        if "|" not in rest and "=" not in rest:
            return False  # prose that mentions an iteration, not an iteration record
        if allow_wrap and "|" in rest and not _record_complete(text):
            st = self._open(key, "wrap", lineno)
            st.buf = [text]
            st.timer_kind = "iteration"
            return True
        glued_timers = ""
        if "time (ms)" in rest:
            # Timers glued after the record (a hard-wrapped log joined back, or an era that
            # printed them on the same line): Megatron's one-line `time (ms) | a: 1 | b: 2`.
            cut = rest.index("time (ms)")
            rest, glued_timers = rest[:cut], rest[cut:]
        number = int(m.group(2))
        total = int(m.group(3)) if m.group(3) else None
        values: dict[str, Any] = {}
        for raw_key, raw_value in parse_pairs(rest):
            k = norm_key(raw_key)
            if k in _ITER_FIELDS:
                name = _ITER_FIELDS[k]
                if name == "lm_loss" and k == "loss" and "lm_loss" in values:
                    continue
                num = to_int(raw_value) if name in _INT_FIELDS else to_float(raw_value)
                if num is None and raw_value.strip().lower() in ("nan", "inf", "-inf"):
                    self.run.problems.append(f"line {lineno}: {raw_key} printed as {raw_value}")
                values[name] = num
            elif k == "approx flops per gpu":  # GPT-NeoX: `approx flops per GPU: 112.9TFLOPS`
                values["tflops"] = _tflops(raw_value)
            elif k.startswith(("elapsed", "iteration time", "step time", "time per iteration")):
                ms = _elapsed_ms(k, raw_value)
                if ms is None:
                    self.run.problems.append(
                        f"line {lineno}: elapsed time {raw_key!r}={raw_value!r} has no readable "
                        "unit or value; left empty"
                    )
                values["elapsed_ms"] = ms
            elif k == "train iters" and total is None:
                total = to_int(raw_value)
        self._add_iteration(
            key,
            Iteration(
                iteration=number, train_iters=total, line=lineno, source=self.source, **values
            ),
        )
        if glued_timers:
            self._single_line_timers(key, glued_timers, lineno, allow_wrap=False)
        return True

    def _add_iteration(self, key: str, it: Iteration) -> None:
        run = self.run
        if it.iteration in run.iter_index:
            return  # printed by several ranks
        if it.iteration < run.max_iter:
            self._new_run(it.line or 0, "the iteration counter went back")
            run = self.run
        run.begin_training(key, it.line or 0)
        run.iter_index[it.iteration] = len(run.iterations)
        run.iterations.append(it)
        run.last_iter = it.iteration
        run.iter_numbers.setdefault(key, array("q")).append(it.iteration)
        run.max_iter = max(run.max_iter, it.iteration)
        if it.train_iters is not None:
            run.train_iters = it.train_iters
            if it.iteration >= it.train_iters:
                run.reached_final = True
                run.ended = True

    def _steps(self, key: str, text: str, lineno: int) -> None:
        m = _STEPS_RE.search(text)
        if m is None:
            return
        secs = to_float(m.group(3))
        self.run.steps.append(
            PipelineStep(
                step=int(m.group(1)),
                loss=to_float(m.group(2)),
                iter_ms=secs * 1000.0 if secs is not None else None,
                samples_per_s=to_float(m.group(4)) if m.group(4) else None,
                line=lineno,
            )
        )
        self.run.begin_training(key, lineno)

    # -- timers and memory ------------------------------------------------------------------

    def _single_line_timers(
        self, key: str, text: str, lineno: int, allow_wrap: bool = True
    ) -> None:
        if allow_wrap and not _record_complete(text, timer=True):
            # A hard-wrapped `time (ms) | ... |` line: the rest follows on the next lines.
            st = self._open(key, "wrap", lineno)
            st.buf = [text]
            st.timer_kind = "timer"
            return
        head, _, body = text.partition("time (ms)")
        values: dict[str, Any] = {}
        for k, v in parse_pairs(body):
            num = to_float(v)
            if num is not None and k:
                values[k] = num
        if not values:
            return
        rank_m = _RANK_RE.search(head)
        rank = int(rank_m.group(1)) if rank_m else None
        megatron = rank_m is None and any(
            "-" in k or " " in k or k in _MEGATRON_PLAIN_NAMES for k in values
        )
        run = self.run
        if megatron:
            run.megatron_blocks.append(
                TimerBlock(
                    source="megatron",
                    values_ms=values,
                    iteration=self._last_iter(key),
                    line=lineno,
                )
            )
        else:
            n_iter = len(run.iter_numbers.get(key, ()))
            run.ds_blocks.append((values, rank, lineno, n_iter, len(run.steps), key))
            run.content_streams.add(key)

    def _last_iter(self, key: str) -> int | None:
        """The last iteration line of stream ``key`` (Megatron prints its timer blocks from
        the rank that prints the iteration lines), else of the run."""
        numbers = self.run.iter_numbers.get(key)
        return numbers[-1] if numbers else self.run.last_iter

    def _megatron_memory(self, text: str, lineno: int) -> None:
        # Reports of several ranks can be glued on one line: split at each report's head.
        starts = [m.start() for m in _MEM_HEAD_RE.finditer(text)] or [0]
        for i, start in enumerate(starts):
            end = starts[i + 1] if i + 1 < len(starts) else len(text)
            head, _, body = text[start:end].partition("memory (MB)")
            values = {norm_key(k): to_float(v) for k, v in parse_pairs(body)}
            rank = _RANK_RE.search(head)
            after = _AFTER_RE.search(head)
            self.run.memory.append(
                Memory(
                    rank=int(rank.group(1)) if rank else None,
                    allocated_mb=values.get("allocated"),
                    max_allocated_mb=values.get("max allocated"),
                    reserved_mb=values.get("reserved"),
                    max_reserved_mb=values.get("max reserved"),
                    kind="megatron",
                    after_iteration=int(after.group(1)) if after else None,
                    line=lineno,
                )
            )

    # -- failures and outcome ---------------------------------------------------------------

    def _fail(self, kind: FailureKind, message: str, lineno: int, stream: str | None) -> None:
        run = self.run
        message = message.strip()[:2000]
        if run.reached_final:
            run.problems.append(
                f"line {lineno}: after the final iteration ({kind}, not counted as the run's "
                f"failure): {message}"
            )
            return
        run.ended = True
        run.content_streams.add(stream or "")
        if run.failure is None:
            run.failure = Failure(kind=kind, message=message, line=lineno)
            run.failure_stream = stream
        else:
            run.problems.append(f"line {lineno}: further failure ({kind}): {message}")

    def _failure_line(self, key: str, text: str, lineno: int) -> bool:
        if "Traceback (most recent call last)" in text:
            start = text.find("['Traceback (most recent call last)")
            if start >= 0:
                # A traceback logged as a Python list (``logger.warning(format_exception(...))``).
                body = text[start:]
                if body.rstrip().endswith("]"):
                    self._list_traceback_end(key, body, lineno, eof=False)
                else:
                    st = self._open(key, "listtb", lineno)
                    st.buf = [text]
                    st.offset = start
                return True
            self._open(key, "traceback", lineno)
            return True
        if "above exception" in text and text.lstrip().startswith(
            ("During handling of the above exception", "The above exception")
        ):
            self.streams.setdefault(key, _Stream()).chained = True
            return True
        stripped = text.strip()
        if "rror" in text or "Exception" in text:
            m = _EXC_RE.match(stripped)
            if m and m.group(1).endswith(_EXC_NAME_SUFFIX):
                self._fail(_classify(stripped, "exception"), stripped, lineno, key)
                return True
        if "CANCELLED AT" in text and _SLURM_RE.search(text):
            kind: FailureKind = "time_limit" if "TIME LIMIT" in text else "cancelled"
            self._fail(kind, stripped, lineno, key)
            return True
        nccl_hint = "Watchdog" in text or "rror" in text or "Gloo" in text or "by peer" in text
        if nccl_hint and _NCCL_RE.search(text):
            self._fail("nccl", stripped, lineno, key)
            return True
        oom_hint = "memory" in text or "Memory" in text or "Allocator" in text
        if oom_hint and _OOM_RE.search(text) and "memory (MB)" not in text:
            self._fail("oom", stripped, lineno, key)
            return True
        if ("Kill" in text or "KILL" in text or "Signal 9" in text) and _KILLED_RE.search(text):
            self._fail("killed", stripped, lineno, key)
            return True
        return False

    def _traceback_line(self, key: str, st: _Stream, text: str, lineno: int) -> bool:
        stripped = text.strip()
        if not stripped or text[:1] in (" ", "\t"):
            if st.lines > _TRACEBACK_MAX_LINES:
                self.run.problems.append(f"line {st.start_line}: traceback never ended")
                self._close(st)
            return True
        if stripped.startswith(("During handling of the above exception", "The above exception")):
            st.chained = True
            return True
        if stripped.startswith("Traceback (most recent call last)"):
            return True
        m = _EXC_RE.match(stripped)
        if m is None:
            return False  # other output interleaved; the traceback stays open
        run = self.run
        kind = _classify(stripped, "exception")
        if st.chained and run.failure is not None and run.failure_stream == key:
            # Chained exceptions: the last one printed is the one that ended the process.
            run.problems.append(
                f"line {run.failure.line}: chained into line {lineno}: {run.failure.message}"
            )
            run.failure = Failure(kind=kind, message=stripped[:2000], line=lineno)
        else:
            self._fail(kind, stripped, lineno, key)
        self._close(st)
        st.chained = False
        return True

    def _list_traceback_end(self, key: str, body: str, lineno: int, eof: bool) -> None:
        """The exception that ends a list-repr traceback (the last one of a chain)."""
        lines: list[str] = []
        end = body.rfind("]")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # invalid escapes in a cut repr
                value = ast.literal_eval(body[: end + 1]) if 0 < end <= 200_000 else None
        except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
            value = None
        if isinstance(value, list) and all(isinstance(x, str) for x in value):
            lines = "".join(value).splitlines()
        else:  # cut short or not a literal: the quoted pieces as printed
            lines = [x.replace("\\n", "") for x in re.findall(r"'((?:[^'\\]|\\.)*)'", body)]
        last = None
        for piece in lines:
            stripped = piece.strip()
            m = _EXC_RE.match(stripped)
            if m and m.group(1).endswith(_EXC_NAME_SUFFIX) and piece[:1] not in (" ", "\t"):
                last = stripped
        if last is None:
            self.run.problems.append(
                f"line {lineno}: traceback printed as a list without a final exception line"
                + (" (log cut short?)" if eof else "")
            )
            return
        self._fail(_classify(last, "exception"), last, lineno, key)

    def _outcome(self, key: str, text: str, lineno: int) -> None:
        m = _OUTCOME_RE.search(text.strip())
        if m is None:
            self.run.problems.append(f"line {lineno}: unreadable run outcome marker: {text[:200]}")
            return
        status, kind, reason = m.group(1), m.group(2), (m.group(3) or "").strip()
        if status == "interrupted":  # the executor's Ctrl-C/SIGTERM: a cancelled run
            kind = kind or "cancelled"
        if kind is not None and kind not in _FAILURE_KINDS:
            self.run.problems.append(f"line {lineno}: unknown failure kind {kind!r}; using other")
            kind = "other"
        self.run.outcome = (status, kind, reason or text.strip(), lineno)
        self.run.ended = True
        self.run.content_streams.add(key)

    def _launcher_exit(self, key: str, text: str, lineno: int) -> None:
        run = self.run
        if "exits successfully" in text:
            run.exited_ok += 1
            run.ended = True
            run.content_streams.add(key)
            return
        m = _RC_RE.search(text)
        if m is None:
            return
        code = int(m.group(1))
        run.exit_codes.append(code)
        if code != 0:
            kind: FailureKind = "killed" if code in (-9, 137) else "other"
            self._fail(kind, f"exits with return code = {code}", lineno, key)
        run.ended = True
        run.content_streams.add(key)

    def _ssh_exit(self, key: str, text: str, lineno: int) -> None:
        """pdsh's word on a remote node: 255 is ssh's own failure (the node or its connection
        was lost, e.g. the node's launcher was killed); 137 a remote SIGKILL."""
        m = _SSH_RC_RE.search(text)
        if m is None:
            return
        code = int(m.group(2))
        self.run.exit_codes.append(code)
        if code != 0:
            kind: FailureKind = "killed" if code in (255, 137) else "other"
            what = "connection to the node lost" if code == 255 else "remote command failed"
            self._fail(kind, f"{m.group(1)}: ssh exited with exit code {code} ({what})",
                       lineno, key)  # fmt: skip
        self.run.ended = True
        self.run.content_streams.add(key)

    # -- configuration ----------------------------------------------------------------------

    def _config_line(self, key: str, text: str, lineno: int) -> None:
        run = self.run
        if "arguments" in text and "-- arguments --" in text:
            self._boundary(key, "args", lineno, "a new argument dump")
            self._open(key, "args", lineno)
            self.run.args_stream = key
            return
        if "using world size:" in text:
            self._boundary(key, "world", lineno, "a new `using world size` line")
            for piece in text.split("using", 1)[1].split(","):
                k, _, v = piece.rpartition(":")
                num = to_int(v)
                if num is not None:
                    name = norm_key(k).replace(" ", "_")
                    run.world[name] = num
            return
        if "cmd = " in text and "runner.py" in text:
            self._boundary(key, "cmd", lineno, "a new launcher command")
            self._cmd_args(text.split("cmd = ", 1)[1], lineno)
            return
        if "spawned with command" in text:
            run.spawned += 1
            return
        if "number of parameters" in text:
            m = _PARAMS_RE.search(text)
            if m:
                run.params[f"({m.group(1)}, {m.group(2) or 0})"] = int(m.group(3))
            return
        if "padded vocab" in text:
            m = _VOCAB_RE.search(text)
            if m:
                run.vocab = {"vocab_size": int(m.group(1)), "padded_vocab_size": int(m.group(3))}
                self._config_read()
            return
        if "DeepSpeedEngine configuration" in text:
            self._open(key, "engine", lineno)
            return
        if "json = " in text:
            body = text.split("json = ", 1)[1]
            st = self._open(key, "json", lineno)
            st.buf = [body]
            st.depth = body.count("{") - body.count("}")
            if st.depth <= 0:
                self._close_block(key, st, lineno)
            return
        if "version" in text or "info ...." in text:
            m = _VERSION_RE.match(text.strip())
            if m:
                run.versions.setdefault(m.group(1), m.group(2))
                return
        if "DeepSpeed info:" in text:
            m = _DS_INFO_RE.search(text)
            if m:
                run.versions.setdefault("deepspeed", m.group(1))
            return
        if "git_hash=" in text:
            m = _GIT_RE.search(text)
            if m:
                run.versions.setdefault("megatron_git_hash", m.group(1))
                if m.group(2):
                    run.versions.setdefault("megatron_git_branch", m.group(2))
            return
        if text.strip() == "training ...":
            run.begin_training(key, lineno, content=False)

    def _cmd_args(self, cmd: str, lineno: int) -> None:
        try:
            argv = shlex.split(cmd)
        except ValueError:
            argv = cmd.split()
        script = next((i for i, a in enumerate(argv) if a.endswith(".py")), None)
        if script is None:
            return
        args = argv[script + 1 :]
        out = self.run.cmd_args
        i = 0
        while i < len(args):
            a = args[i]
            if a.startswith("--"):
                name = a[2:].replace("-", "_")
                if "=" in name:
                    name, _, v = name.partition("=")
                    out[name] = typed_value(v)
                elif i + 1 < len(args) and not args[i + 1].startswith("--"):
                    out[name] = typed_value(args[i + 1])
                    i += 1
                else:
                    out[name] = True
            i += 1

    def _json_dump(self, text: str, lineno: int) -> None:
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):
            self.run.problems.append(f"line {lineno}: DeepSpeed json config dump is not JSON")
            return
        if isinstance(value, dict):
            self.run.ds_config.update(value)

    # -- runs -------------------------------------------------------------------------------

    def _boundary(self, key: str, kind: str, lineno: int, why: str) -> None:
        """A run starts here when this stream already printed training output or a failure
        in the current run, or already printed this kind of line (a relaunch). In a multi-node
        log, one node's set-up lines may follow another node's training output."""
        run = self.run
        if key in run.content_streams or (key, kind) in run.boundaries_seen:
            self._new_run(lineno, why)
        self.run.boundaries_seen.add((key, kind))

    def _config_read(self) -> None:
        if self.run.config_complete():
            self.run.config_until = 0

    def _new_run(self, lineno: int, why: str) -> None:
        self._finish_run()
        self.run = _Run(source=self.source, first_line=lineno)
        self.run.problems.append(f"line {lineno}: new run in the same file ({why})")

    def _finish_run(self) -> None:
        self.runs.append(_finish(self.run))


_WRAP_MAX_LINES = 40
"""Physical lines one hard-wrapped record may span."""
_ELAPSED_RE = re.compile(r"elapsed|iteration[ _]time|step[ _]time|time[ _]per[ _]iteration", re.I)
_LAST_PAIR_RE = re.compile(r"\|[^|]*:\s*[-+\d.eE]+$")
_TAIL_PAIR_RE = re.compile(r"[\w .()/+-]*:\s*[-+\d.eE]+|[-+\d.eE]+")
_WRAP_WIDTHS = frozenset((72, 78, 79, 80, 100, 120, 128, 132, 150, 160, 200, 240, 250, 256))
"""Widths at which terminals, pagers and log viewers cut lines (a cut, not a word wrap)."""


def _continues(text: str) -> bool:
    """Whether a line can be the continuation of a hard-wrapped iteration or timer record:
    ``key: value |`` pieces, or a last ``key: value``, and nothing that starts a record."""
    s = text.strip()
    if not s or s.startswith(("[", "time (ms)", "(min, max)", "steps:")) or "memory (MB)" in s:
        return False
    if _GLUE_RE.search(s) is not None or _ITER_RE.search(s) is not None:
        return False
    return "|" in s or _TAIL_PAIR_RE.fullmatch(s) is not None


def _record_complete(text: str, timer: bool = False) -> bool:
    """Whether a (joined) record is whole: Megatron ends an iteration line with ``|`` and a
    timer line (``time (ms) | a: 1 | b: 2``) without; an iteration line with timers glued
    after it ends like a timer line."""
    if not timer:
        m = _ITER_RE.search(text)
        timer = m is not None and "time (ms)" in text[m.end() :]
    body = text.rstrip()
    if not timer:
        # Every era prints the iteration time early in the record: without it, a line that
        # ends with `|` was wrapped right after one.
        return body.endswith("|") and _ELAPSED_RE.search(body) is not None
    # A timer line is whole when its last piece is `name: value` (not `name:`, not `|`).
    return _LAST_PAIR_RE.search(body) is not None


def _join_wrapped(parts: list[str]) -> str:
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


def _elapsed_ms(key: str, value: str) -> float | None:
    """Elapsed time in ms from a normalised key (which carries the unit) and a value."""
    num = to_float(value.rstrip("ms").rstrip())
    if num is None:
        return None
    if "(ms)" in key or key.endswith(" ms") or key == "elapsed ms":
        return num
    if "(s)" in key or key.endswith((" s", " sec", "(sec)")):
        return num * 1000.0
    if value.strip().endswith("ms"):
        return num
    return None


def _tflops(value: str) -> float | None:
    """TFLOP/s from a value with its unit (``112.9TFLOPS``, ``950.1GFLOPS``); None if no unit."""
    m = re.fullmatch(r"\s*([-+\d.eE]+)\s*([TGP])FLOPS?(?:/s)?\s*", value, flags=re.I)
    if m is None:
        return None
    num = to_float(m.group(1))
    scale = {"T": 1.0, "G": 1e-3, "P": 1e3}[m.group(2).upper()]
    return num * scale if num is not None else None


def _classify(message: str, default: FailureKind) -> FailureKind:
    """Failure kind of an exception or error message."""
    if _OOM_RE.search(message):
        return "oom"
    if _NCCL_RE.search(message):
        return "nccl"
    if "SIGKILL" in message or "Signal 9" in message:
        return "killed"
    return default


def _attribute(run: _Run, pipeline: bool) -> tuple[TimerTable, list[str]]:
    """DeepSpeed/pipeline timer blocks with their iteration (see module doc)."""
    return attribute_blocks(run.ds_blocks, run.iter_numbers, [s.step for s in run.steps], pipeline)


def _summary(run: _Run) -> tuple[dict[str, Any], list[str]]:
    """The config dict: Megatron's typed args plus the summary keys (None when unknown)."""
    problems: list[str] = []
    config: dict[str, Any] = dict(run.args)
    sources = (run.args, run.world, run.cmd_args)
    for key in _SUMMARY_KEYS:
        config[key] = next((s[key] for s in sources if s.get(key) is not None), None)
    ds_stage = None
    zero = run.ds_config.get("zero_optimization")
    if isinstance(zero, dict) and isinstance(zero.get("stage"), int):
        ds_stage = zero["stage"]
    elif isinstance(run.ds_engine.get("zero_optimization_stage"), int):
        ds_stage = run.ds_engine["zero_optimization_stage"]
    if ds_stage is not None:
        if config["zero_stage"] is not None and config["zero_stage"] != ds_stage:
            problems.append(
                f"zero stage: Megatron argument says {config['zero_stage']}, DeepSpeed's config "
                f"says {ds_stage}; using DeepSpeed's"
            )
        config["zero_stage"] = ds_stage
    if config["global_batch_size"] is None:
        gbs = run.ds_config.get("train_batch_size")
        config["global_batch_size"] = gbs if isinstance(gbs, int) else None
    if config["micro_batch_size"] is None:
        mbs = run.ds_config.get("train_micro_batch_size_per_gpu")
        config["micro_batch_size"] = mbs if isinstance(mbs, int) else None
    if run.vocab:
        config["padded_vocab_size"] = run.vocab["padded_vocab_size"]
        config["vocab_size"] = run.vocab["vocab_size"]
    if run.cmd_args:
        config["launcher_args"] = dict(run.cmd_args)
    train_iters = run.train_iters
    if train_iters is None:
        for s in sources:
            if isinstance(s.get("train_iters"), int):
                train_iters = s["train_iters"]
                break
    config["train_iters"] = train_iters
    if run.params:
        config["num_parameters_by_rank"] = dict(run.params)
    config["num_parameters"], why = _num_parameters(config, run.params)
    if why:
        problems.append(why)
    return config, problems


def _num_parameters(config: dict[str, Any], params: dict[str, int]) -> tuple[int | None, str]:
    """Parameters of the model as printed, when the log states it for the whole model.

    Megatron prints ``number of parameters on (tensor, pipeline) model parallel rank (t, p)``
    per model-parallel rank.  With tp = pp = 1 that is the model's count.  With model
    parallelism the per-rank counts do not add up to it (tensor-parallel ranks each hold the
    replicated layer norms and biases; with pipelining the tied word embedding lives on the
    first and the last stage), so the count is left unknown and the per-rank counts are kept
    in ``num_parameters_by_rank``.
    """
    if not params:
        return None, ""
    tp = config.get("tensor_model_parallel_size") or 1
    pp = config.get("pipeline_model_parallel_size") or 1
    if tp * pp == 1 and len(params) == 1:
        return next(iter(params.values())), ""
    return None, (
        f"num_parameters not derivable from the log: with tp({tp}) * pp({pp}) = {tp * pp} "
        f"model-parallel ranks the per-rank counts {sorted(params.items())} count replicated "
        "and tied weights more than once; see num_parameters_by_rank"
    )


def _is_pipeline(config: dict[str, Any], has_steps: bool) -> bool:
    pp = config.get("pipeline_model_parallel_size")
    return has_steps or (isinstance(pp, int) and pp > 1)


def _finish(run: _Run) -> ParsedRun:
    """Turn the filled state into a ParsedRun: config, attribution, status."""
    config, problems = _summary(run)
    ds_blocks, attr_problems = _attribute(run, _is_pipeline(config, bool(run.steps)))
    timers = run.megatron_blocks
    timers.extend(ds_blocks)
    timers.sort_by_line()
    out = ParsedRun(
        iterations=run.iterations,
        memory=run.memory,
        memory_other=run.memory_other,
        timers=timers,
        pipeline_steps=run.steps,
        config=config,
        ds_config=run.ds_config,
        ds_engine=run.ds_engine,
        versions=run.versions,
        problems=run.problems + problems + attr_problems,
        sources=[run.source],
        first_line=run.first_line,
    )
    train_iters = config.get("train_iters")
    reached = run.reached_final or (
        isinstance(train_iters, int) and run.max_iter >= train_iters > 0
    )
    all_exited = run.exited_ok > 0 and run.exited_ok >= run.spawned
    if run.failure is not None:
        out.status, out.failure = "failed", run.failure
    elif reached or all_exited:
        out.status = "completed"
    if run.outcome is not None:
        status, kind, reason, line = run.outcome
        out.interrupted = status == "interrupted"
        if out.interrupted:
            status = "failed"
        if out.failure is not None and (status != "failed" or kind != out.failure.kind):
            out.problems.append(
                f"line {out.failure.line}: superseded by the run outcome marker at line {line}: "
                f"{out.failure.kind}: {out.failure.message}"
            )
        out.status = status  # type: ignore[assignment]
        out.failure = (
            Failure(kind=kind or "other", message=reason, line=line)  # type: ignore[arg-type]
            if status == "failed"
            else None
        )
    if not (
        run.iterations
        or run.steps
        or run.ds_blocks
        or run.megatron_blocks
        or run.memory
        or run.memory_other
        or run.failure
        or run.outcome
        or run.args
        or run.world
    ):
        out.problems.append("no training output recognised")
    return out


# -- entry points -----------------------------------------------------------------------------


def parse_lines(lines: Iterable[str], source: str) -> list[ParsedRun]:
    """Parse log lines (with or without trailing newlines) into one ParsedRun per training run.

    Never raises on content; always returns at least one run.
    """
    core = _Core(source)
    try:
        for lineno, line in enumerate(demux_tagged(lines), start=1):
            if core.active or _KW.has(line, core.run.pipe_iterations):
                core.feed(lineno, line)
            elif core.timer_keys and core.stream_key(line) in core.timer_keys:
                core.feed(lineno, line, dispatch=False)
    except (OSError, UnicodeError) as exc:
        core.run.problems.append(f"reading stopped: {exc}")
    return core.finish()


def parse_text(text: str, source: str = "<text>") -> list[ParsedRun]:
    """Parse a whole log held in a string."""
    return parse_lines(text.splitlines(), source)


def parse_file(path: str | Path, bulk: bool = True) -> list[ParsedRun]:
    """Parse one log file, streaming it in chunks (memory grows with the records, not the
    lines).  ``bulk=False`` reads every line through the line path (``analysis.scan``; the
    result is the same, only slower).

    An unreadable file gives one incomplete run whose problems say why.
    """
    source = str(path)
    try:
        with open(path, "rb") as fh:
            return parse_stream(fh, source, bulk)
    except OSError as exc:
        core = _Core(source)
        core.run.problems.append(f"cannot read {source}: {exc.strerror or exc}")
        return core.finish()


def _text_lines(fh: BinaryIO) -> Iterator[str]:
    """The lines of a binary file, decoded, read in chunks (any object with ``read``)."""
    rest = b""
    while chunk := fh.read(_OMPI_PEEK_BYTES):
        lines = (rest + chunk).split(b"\n")
        rest = lines.pop()
        yield from (line.decode("utf-8", "replace") + "\n" for line in lines)
    if rest:
        yield rest.decode("utf-8", "replace")


def parse_stream(fh: BinaryIO, source: str, bulk: bool = True) -> list[ParsedRun]:
    """Parse a log from an open binary file (``parse_file`` without the opening)."""
    core = _Core(source)
    try:
        if fh.seekable():
            tagged = _OMPI_TAG_BYTES in fh.read(_OMPI_PEEK_BYTES)
            fh.seek(0)
            if tagged:  # mpirun --tag-output splits lines across ranks: put them back first
                return parse_lines(_text_lines(fh), source)
        drive_file(core, _KW, fh, bulk=bulk)
    except OSError as exc:
        core.run.problems.append(f"cannot read {source}: {exc.strerror or exc}")
    return core.finish()


# -- merging per-node files -------------------------------------------------------------------


def merge_runs(runs: list[ParsedRun]) -> ParsedRun:
    """Merge the ParsedRuns of one training run read from several per-node files.

    Records are united (iterations deduplicated by number, pipeline steps by step), config
    keys take the first known value, the parameter count is recomputed from the union of the
    per-rank counts, and unattributed DeepSpeed blocks (node 0 prints them, the last node the
    iteration lines) are attributed when their count equals the final iteration number.
    Status: failed if any part failed (its failure is kept), completed if the iteration lines
    reached train_iters or every part completed, incomplete otherwise.
    """
    if not runs:
        return ParsedRun(problems=["nothing to merge"])
    if len(runs) == 1:
        return runs[0]
    out = ParsedRun(first_line=runs[0].first_line)
    seen_steps: dict[int, PipelineStep] = {}
    for part in runs:
        for st in part.pipeline_steps:
            seen_steps.setdefault(st.step, st)
        out.memory.extend(part.memory)
        out.memory_other.extend(part.memory_other)
        out.timers.extend(part.timers)
        for key, value in part.config.items():
            if out.config.get(key) is None:
                out.config[key] = value
        by_rank = out.config.get("num_parameters_by_rank")
        if isinstance(part.config.get("num_parameters_by_rank"), dict):
            merged = dict(by_rank) if isinstance(by_rank, dict) else {}
            merged.update(part.config["num_parameters_by_rank"])
            out.config["num_parameters_by_rank"] = merged
        for key, value in part.ds_config.items():
            out.ds_config.setdefault(key, value)
        for key, value in part.ds_engine.items():
            out.ds_engine.setdefault(key, value)
        for key, value in part.versions.items():
            out.versions.setdefault(key, value)
        src = ",".join(part.sources)
        out.problems.extend(f"{src}: {p}" for p in part.problems)
        out.sources.extend(part.sources)
    out.iterations = merge_iterations(p.iterations for p in runs)
    out.pipeline_steps = sorted(seen_steps.values(), key=lambda s: s.step)
    by_rank = out.config.get("num_parameters_by_rank")
    if isinstance(by_rank, dict):
        out.config["num_parameters"], why = _num_parameters(out.config, by_rank)
        if why:
            out.problems.append(why)
    pipeline = _is_pipeline(out.config, bool(out.pipeline_steps))
    last_it = out.iterations[-1].iteration if out.iterations else None
    out.problems.extend(merge_attribution(out.timers, last_it, pipeline))  # type: ignore[arg-type]
    failed = next((p for p in runs if p.status == "failed"), None)
    train_iters = out.config.get("train_iters")
    last = out.iterations[-1].iteration if out.iterations else None
    if failed is not None:
        out.status, out.failure = "failed", failed.failure
        out.interrupted = any(p.interrupted for p in runs)
    elif (isinstance(train_iters, int) and last is not None and last >= train_iters) or all(
        p.status == "completed" for p in runs
    ):
        out.status = "completed"
    return out


# -- CLI --------------------------------------------------------------------------------------


def _summary_line(run: ParsedRun) -> str:
    its = run.iterations
    last = f"{its[-1].iteration}/{its[-1].train_iters}" if its else "-"
    times = [it.elapsed_ms for it in its if it.elapsed_ms is not None]
    mean = f"{sum(times) / len(times):.1f} ms" if times else "n/a"
    fail = (
        f" {run.failure.kind} at line {run.failure.line}: {run.failure.message}"
        if (run.failure)
        else ""
    )
    return (
        f"{run.status:10} iterations {len(its):4d} (last {last}) mean printed elapsed {mean}; "
        f"timer blocks {len(run.timers)}, memory reports {len(run.memory)}, "
        f"problems {len(run.problems)}{fail}"
    )


def _json_value(v: Any) -> str:
    """One number (or None) as JSON, as ``json`` writes it."""
    if v is None:
        return "null"
    if type(v) is float:
        if v != v or v in (math.inf, -math.inf):
            raise ValueError(f"out of range float value in the JSON output: {v!r}")
        return float.__repr__(v)
    if type(v) is int:
        return int.__repr__(v)
    return json.dumps(v, allow_nan=False, default=str)


def _json_records(records: Any, encode: Any) -> Iterator[str]:
    """The elements of a record list as JSON texts (column tables row by row, without an
    object per record)."""
    if isinstance(records, RecordTable):
        names = [json.dumps(f) for f in records._names]
        template = "{" + ", ".join(f"{n}: %s" for n in names) + "}"
        for row in records.rows():
            yield template % tuple(map(_json_value, row))
    elif isinstance(records, TimerTable):
        templates = []
        for source, names, shape in records.groups:
            parts = []
            for n, k in zip(names, shape, strict=True):
                value = "[" + ", ".join(["%s"] * k) + "]" if k else "%s"
                parts.append(f"{json.dumps(n).replace('%', '%%')}: {value}")
            src = json.dumps(source).replace("%", "%%")
            templates.append(
                f'{{"source": {src}, "values_ms": {{{", ".join(parts)}}}, '
                '"rank": %s, "iteration": %s, "line": %s}'
            )
        for g, flat, rank, it, line in records.rows():
            yield templates[g] % (*map(_json_value, flat), _json_value(rank), _json_value(it),
                                  _json_value(line))  # fmt: skip
    else:
        for r in records:
            yield encode(block_dict(r) if isinstance(r, TimerBlock) else asdict(r))


def _iter_json(paths: Iterable[str]) -> Iterator[str]:
    """The ``--json`` document in pieces: one log parsed at a time, one record a line."""
    encode = json.JSONEncoder(allow_nan=False, default=str).encode
    lists = ("iterations", "memory", "memory_other", "timers", "pipeline_steps")
    yield '{"logs": ['
    for i, p in enumerate(paths):
        yield ("," if i else "") + f'\n {{"path": {encode(p)}, "runs": ['
        for j, run in enumerate(parse_file(p)):
            yield ("," if j else "") + "\n  {"
            for k, f in enumerate(fields(run)):
                value = getattr(run, f.name)
                yield ("," if k else "") + f"\n   {encode(f.name)}: "
                if f.name not in lists:
                    yield encode(asdict(value) if f.name == "failure" and value else value)
                    continue
                yield "["
                chunk: list[str] = []
                first = True
                for text in _json_records(value, encode):
                    chunk.append(text)
                    if len(chunk) >= 2048:
                        yield ("" if first else ",") + "\n    " + ",\n    ".join(chunk)
                        chunk, first = [], False
                if chunk:
                    yield ("" if first else ",") + "\n    " + ",\n    ".join(chunk)
                yield "]"
            yield "}"
        yield "]}"
    yield "\n]}\n"


def main(argv: list[str] | None = None) -> int:
    """``python -m analysis.parse LOG... [--json]``; exit 0 even when logs are unreadable."""
    ap = argparse.ArgumentParser(
        prog="python -m analysis.parse", description=__doc__.split("\n")[0]
    )
    ap.add_argument("logs", nargs="+", help="log files")
    ap.add_argument("--json", action="store_true", help='print {"logs": [...]} as JSON')
    ns = ap.parse_args(argv)
    if ns.json:
        write = sys.stdout.write
        for text in _iter_json(ns.logs):
            write(text)
        return 0
    try:
        from rich.console import Console

        console: Any = Console(highlight=False)
    except ImportError:  # pragma: no cover - rich is a project dependency
        console = None
    for p in ns.logs:
        runs = parse_file(p)
        header = f"{p}: {len(runs)} run(s)"
        lines = [header] + [f"  run {i + 1}: {_summary_line(r)}" for i, r in enumerate(runs)]
        for r in runs:
            lines.extend(f"    problem: {x}" for x in r.problems[:5])
        for line in lines:
            if console is not None:
                console.print(line, markup=False)
            else:
                print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
