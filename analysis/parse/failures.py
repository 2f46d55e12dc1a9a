"""How the log parser recognises a failure: exceptions and tracebacks (also printed as a
Python list), the launcher's exit codes, ssh exits and the run outcome marker; a mixin of
``analysis.parse.machine._Core``.
"""

from __future__ import annotations

import ast
import re
import warnings

from analysis.parse.records import (
    Failure,
    FailureKind,
)
from analysis.parse.rules import (
    _EXC_NAME_SUFFIX,
    _EXC_RE,
    _FAILURE_KINDS,
    _KILLED_RE,
    _NCCL_RE,
    _OOM_RE,
    _OUTCOME_RE,
    _RC_RE,
    _SLURM_RE,
    _SSH_RC_RE,
    _TRACEBACK_MAX_LINES,
    _classify,
    _Stream,
)


class _CoreFailures:
    """Failure recognition of the parser's state machine (module doc)."""

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
            run.further_failures.append(Failure(kind=kind, message=message, line=lineno))
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
