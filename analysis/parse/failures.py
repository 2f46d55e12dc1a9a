"""How a failure is recognised and recorded: exception lines, the failures one line tells (NCCL,
OOM, a kill, Slurm's cancel), tracebacks printed as a Python list, exit codes and the run outcome
marker; functions of the run state (``Core`` keeps the traceback blocks, per-stream state of its
own).
"""

from __future__ import annotations

import ast
import contextlib
import re
import signal
import warnings
from typing import get_args

from analysis.parse.records import Failure, FailureKind
from analysis.parse.rules import RunState

EXC_RE = re.compile(r"^(?:[A-Za-z_]\w*\.)*(_?[A-Z]\w*)(?::(?:\s.*)?)?$")
EXC_NAME_SUFFIX = ("Error", "Exception", "Interrupt", "Exit", "Failure", "Timeout")
CHAINED = ("During handling of the above exception", "The above exception")
"""How a traceback chained to the one before it starts."""
RC_RE = re.compile(r"exits with return code = (-?\d+)")
SSH_RC_RE = re.compile(r"([\w.\-]+): ssh exited with exit code (\d+)")
OUTCOME_RE = re.compile(
    r"# run outcome:\s*(completed|failed|incomplete|interrupted)(?:\s+kind=(\w+))?"
    r"(?:\s+reason=(.*))?$"
)
OOM_RE = re.compile(
    r"CUDA out of memory|OutOfMemoryError|DefaultCPUAllocator|can't allocate memory"
    r"|not enough memory|out of memory|MemoryError|Unable to allocate"
)
NCCL_RE = re.compile(
    r"NCCL error|nccl\w*Error|\bNCCL\b.*\b(?:failure|failed|timeout)|Watchdog caught collective"
    r"|Gloo connectFullMesh failed|third_party/gloo|Connection (?:closed|reset) by peer"
    r"|DistBackendError|ProcessGroupNCCL.*(?:timed out|Timeout)"
)
FAILURE_KINDS = frozenset(get_args(FailureKind))

ONE_LINE: tuple[tuple[tuple[str, ...], re.Pattern[str], FailureKind], ...] = (
    (("CANCELLED AT",), re.compile(r"\*\*\* (?:JOB|STEP) \S+ ON \S+ CANCELLED AT"), "cancelled"),
    (("Watchdog", "rror", "Gloo", "by peer"), NCCL_RE, "nccl"),
    (("memory", "Memory", "Allocator"), OOM_RE, "oom"),
    (("Kill", "KILL", "Signal 9"), re.compile(r"\bKilled\b|\bSIGKILL\b|Signal 9\b"), "killed"),
)
"""Failures a line tells without an exception name, tried in order: (texts one of which the
line holds, its pattern, its kind)."""


def classify_failure(message: str, default: FailureKind) -> FailureKind:
    """Failure kind of an exception or error message."""
    if OOM_RE.search(message):
        return "oom"
    if NCCL_RE.search(message):
        return "nccl"
    if "SIGKILL" in message or "Signal 9" in message:
        return "killed"
    return default


def fail(run: RunState, kind: FailureKind, message: str, lineno: int, stream: str | None) -> None:
    """The run's failure, or a further one; after the final iteration only a problem."""
    message = message.strip()[:2000]
    if run.reached_final:
        run.problems.append(
            f"line {lineno}: after the final iteration ({kind}, not counted as the run's "
            f"failure): {message}"
        )
        return
    run.end(stream or "")
    if run.failure is None:
        run.failure = Failure(kind=kind, message=message, line=lineno)
        run.failure_stream = stream
    else:
        run.further_failures.append(Failure(kind=kind, message=message, line=lineno))
        run.problems.append(f"line {lineno}: further failure ({kind}): {message}")


def is_exception(stripped: str) -> bool:
    """Whether a stripped line is an exception line (``torch.OutOfMemoryError: ...``)."""
    m = EXC_RE.match(stripped)
    return m is not None and m.group(1).endswith(EXC_NAME_SUFFIX)


def failure_line(run: RunState, key: str, text: str, lineno: int) -> bool:
    """Record the failure a line tells on its own, if any (an exception line, ``ONE_LINE``)."""
    stripped = text.strip()
    if ("rror" in text or "Exception" in text) and is_exception(stripped):
        fail(run, classify_failure(stripped, "exception"), stripped, lineno, key)
        return True
    for marks, pattern, kind in ONE_LINE:
        if any(mark in text for mark in marks) and pattern.search(text):
            if kind == "oom" and "memory (MB)" in text:
                continue  # Megatron's memory report
            if kind == "cancelled" and "TIME LIMIT" in text:
                kind = "time_limit"
            fail(run, kind, stripped, lineno, key)
            return True
    return False


def list_traceback_end(run: RunState, key: str, body: str, lineno: int, eof: bool) -> None:
    """The exception that ends a list-repr traceback (the last one of a chain)."""
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
        if piece[:1] not in (" ", "\t") and is_exception(piece.strip()):
            last = piece.strip()
    if last is None:
        run.problems.append(
            f"line {lineno}: traceback printed as a list without a final exception line"
            + (" (log cut short?)" if eof else "")
        )
        return
    fail(run, classify_failure(last, "exception"), last, lineno, key)


def outcome(run: RunState, key: str, text: str, lineno: int) -> None:
    """The ``# run outcome: STATUS [kind=K] [reason=...]`` marker the launchers write."""
    m = OUTCOME_RE.search(text.strip())
    if m is None:
        run.problems.append(f"line {lineno}: unreadable run outcome marker: {text[:200]}")
        return
    status, kind, reason = m.group(1), m.group(2), (m.group(3) or "").strip()
    if status == "interrupted":  # the executor's Ctrl-C/SIGTERM: a cancelled run
        kind = kind or "cancelled"
    if kind is not None and kind not in FAILURE_KINDS:
        run.problems.append(f"line {lineno}: unknown failure kind {kind!r}; using other")
        kind = "other"
    run.outcome = (status, kind, reason or text.strip(), lineno)
    run.end(key)


def exit_line(run: RunState, key: str, text: str, lineno: int) -> None:
    """The launcher's ``exits successfully`` / ``exits with return code = N`` (-9 and 137 are
    a kill), or pdsh's word on a remote node, ``host: ssh exited with exit code N`` (255 is
    ssh's own failure: the node or its connection was lost, e.g. its launcher was killed; 137
    a remote SIGKILL)."""
    if "exits" in text:
        if "exits successfully" in text:
            run.exited_ok += 1
            run.end(key)
            return
        m = RC_RE.search(text)
        if m is None:
            return
        code = int(m.group(1))
        killed, message = code in (-9, 137), f"exits with return code = {code}"
        with contextlib.suppress(ValueError):  # Popen's -N: ended by signal N
            sig = signal.Signals(-code) if code < 0 else None
            message += f" (died of {sig.name}: {signal.strsignal(sig)})" if sig else ""
    else:
        m = SSH_RC_RE.search(text)
        if m is None:
            return
        code = int(m.group(2))
        what = "connection to the node lost" if code == 255 else "remote command failed"
        killed = code in (255, 137)
        message = f"{m.group(1)}: ssh exited with exit code {code} ({what})"
    if code != 0:
        fail(run, "killed" if killed else "other", message, lineno, key)
    run.end(key)
