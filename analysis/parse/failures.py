"""How the log parser recognises a failure: exceptions and tracebacks (also printed as a
Python list), the launcher's exit codes, ssh exits and the run outcome marker; functions of the run
state that ``analysis.parse.machine.Core`` calls (it keeps the traceback blocks, which are
per-stream state of its own).
"""

from __future__ import annotations

import ast
import re
import warnings

from analysis.parse.records import Failure, FailureKind
from analysis.parse.rules import (
    EXC_NAME_SUFFIX,
    EXC_RE,
    FAILURE_KINDS,
    OUTCOME_RE,
    RC_RE,
    SSH_RC_RE,
    RunState,
    classify_failure,
)


def fail(run: RunState, kind: FailureKind, message: str, lineno: int, stream: str | None) -> None:
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
        run.further_failures.append(Failure(kind=kind, message=message, line=lineno))
        run.problems.append(f"line {lineno}: further failure ({kind}): {message}")


def list_traceback_end(run: RunState, key: str, body: str, lineno: int, eof: bool) -> None:
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
        m = EXC_RE.match(stripped)
        if m and m.group(1).endswith(EXC_NAME_SUFFIX) and piece[:1] not in (" ", "\t"):
            last = stripped
    if last is None:
        run.problems.append(
            f"line {lineno}: traceback printed as a list without a final exception line"
            + (" (log cut short?)" if eof else "")
        )
        return
    fail(run, classify_failure(last, "exception"), last, lineno, key)


def outcome(run: RunState, key: str, text: str, lineno: int) -> None:
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
    run.ended = True
    run.content_streams.add(key)


def launcher_exit(run: RunState, key: str, text: str, lineno: int) -> None:
    if "exits successfully" in text:
        run.exited_ok += 1
        run.ended = True
        run.content_streams.add(key)
        return
    m = RC_RE.search(text)
    if m is None:
        return
    code = int(m.group(1))
    run.exit_codes.append(code)
    if code != 0:
        kind: FailureKind = "killed" if code in (-9, 137) else "other"
        fail(run, kind, f"exits with return code = {code}", lineno, key)
    run.ended = True
    run.content_streams.add(key)


def ssh_exit(run: RunState, key: str, text: str, lineno: int) -> None:
    """pdsh's word on a remote node: 255 is ssh's own failure (the node or its connection
    was lost, e.g. the node's launcher was killed); 137 a remote SIGKILL."""
    m = SSH_RC_RE.search(text)
    if m is None:
        return
    code = int(m.group(2))
    run.exit_codes.append(code)
    if code != 0:
        kind: FailureKind = "killed" if code in (255, 137) else "other"
        what = "connection to the node lost" if code == 255 else "remote command failed"
        fail(run, kind, f"{m.group(1)}: ssh exited with exit code {code} ({what})",
                   lineno, key)  # fmt: skip
    run.ended = True
    run.content_streams.add(key)
