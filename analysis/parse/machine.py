"""The log parser's state machine: one ``Core`` per log, fed line by line (or by the bulk
scanner), keeping one stream state per rank/node prefix. See docs/parsing.md.
"""

from __future__ import annotations

import json
import shlex
from array import array
from typing import Any

from analysis.parse.failures import fail, launcher_exit, list_traceback_end, outcome, ssh_exit
from analysis.parse.lines import (
    MAX_LINE_CHARS,
    norm_key,
    parse_pairs,
    split_prefix,
    to_float,
    to_int,
    typed_value,
)
from analysis.parse.merge import finished_run
from analysis.parse.records import (
    Failure,
    FailureKind,
    Iteration,
    Memory,
    ParsedRun,
    PipelineStep,
    TimerBlock,
)
from analysis.parse.rules import (
    AFTER_RE,
    ARG_RE,
    DS_CFG_LINE_RE,
    DS_INFO_RE,
    DS_LOGGER_RE,
    EXC_NAME_SUFFIX,
    EXC_RE,
    GIT_RE,
    GLUE_RE,
    INT_FIELDS,
    ITER_FIELDS,
    ITER_RE,
    JSON_MAX_LINES,
    KILLED_RE,
    MEGATRON_PLAIN_NAMES,
    MEM_HEAD_RE,
    MEMALLOC_RE,
    NCCL_RE,
    OOM_RE,
    PARAMS_RE,
    RANK_RE,
    SEE_MEM_RE,
    SLURM_RE,
    STEPS_RE,
    STRICT,
    TIMER_HEAD_RE,
    TIMER_LINE_RE,
    TIMER_NAME_RE,
    TIMER_RANK_RE,
    TRACEBACK_MAX_LINES,
    VERSION_RE,
    VOCAB_RE,
    WRAP_MAX_LINES,
    RunState,
    StreamState,
    classify_failure,
    continues_record,
    join_wrapped,
    record_complete,
    to_elapsed_ms,
    to_tflops,
)


class Core:
    """The line-by-line state machine shared by every entry point."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.runs: list[ParsedRun] = []
        self.run = RunState(source=source, first_line=1)
        self.streams: dict[str, StreamState] = {}
        self.open_blocks = 0
        self.timer_keys: set[str] = set()
        self.truncated = 0
        self.strict = STRICT.get()
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

    def _open(self, key: str, mode: str, lineno: int) -> StreamState:
        st = self.streams.get(key)
        if st is None:
            st = self.streams[key] = StreamState()
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

    def _close(self, st: StreamState) -> None:
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
            outcome(self.run, key, text, lineno)
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
            m = TIMER_HEAD_RE.search(text)
            if m:
                st = self._open(key, "timer", lineno)
                st.timer_kind = m.group(1)
                return
        if "memory (MB)" in text:
            self._megatron_memory(text, lineno)
            return
        if "MemAllocated=" in text:
            m = MEMALLOC_RE.search(text)
            if m:
                rank = RANK_RE.search(text)
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
            m = SEE_MEM_RE.search(text)
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
            launcher_exit(self.run, key, text, lineno)
            return
        if "ssh exited" in text:
            ssh_exit(self.run, key, text, lineno)
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

    def _continue_block(self, key: str, st: StreamState, text: str, lineno: int) -> bool:
        """Feed a line to the open block of its stream; False if the block ended before it."""
        st.lines += 1
        mode = st.mode
        if mode == "timer":
            m = TIMER_LINE_RE.match(text)
            if m and st.timer_kind != "times":
                a = to_float(m.group(2))
                b = to_float(m.group(3)) if m.group(3) else None
                if a is not None:
                    st.timer_values[m.group(1).strip()] = (a, b) if b is not None else a
                    return True
            if st.timer_kind == "times":
                r = TIMER_RANK_RE.match(text)
                if r and st.timer_name is not None:
                    v = to_float(r.group(2))
                    if v is not None:
                        lo, hi = st.timer_values.get(st.timer_name, (v, v))
                        st.timer_values[st.timer_name] = (min(lo, v), max(hi, v))
                    return True
                n = TIMER_NAME_RE.match(text)
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
            m = ARG_RE.match(text)
            if m:
                self.run.args[m.group(1)] = typed_value(m.group(2))
                return True
            if st.lines > 2000:
                self.run.problems.append(f"line {st.start_line}: argument dump never ended")
                self._close(st)
                return False
            return True  # interleaved text inside the dump is ignored
        if mode == "engine":
            body = DS_LOGGER_RE.sub("", text, count=1)
            if "json =" in body:
                self._close(st)
                return False
            m = DS_CFG_LINE_RE.match(body)
            if m and "print" in text:
                self.run.ds_engine[m.group(1)] = typed_value(m.group(3))
                return True
            self._close(st)
            return False
        if mode == "json":
            st.buf.append(text)
            st.depth += text.count("{") - text.count("}")
            if st.depth <= 0 or st.lines > JSON_MAX_LINES:
                self._close_block(key, st, lineno)
            return True
        if mode == "traceback":
            return self._traceback_line(key, st, text, lineno)
        if mode == "wrap":
            if continues_record(text) and st.lines <= WRAP_MAX_LINES:
                st.buf.append(text)
                joined = join_wrapped(st.buf)
                if record_complete(joined, st.timer_kind == "timer"):
                    self._close_block(key, st, lineno)
                return True
            self._close_block(key, st, lineno)
            return False
        if mode == "listtb":
            st.buf.append(text)
            if text.rstrip().endswith("]") or st.lines > TRACEBACK_MAX_LINES:
                self._close_block(key, st, lineno)
            return True
        self._close(st)
        return False

    def _close_block(self, key: str, st: StreamState, lineno: int, eof: bool = False) -> None:
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
            joined, start, kind = join_wrapped(st.buf), st.start_line, st.timer_kind
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
            list_traceback_end(self.run, key, joined, start, eof)
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
        matches = list(GLUE_RE.finditer(text))
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
        m = ITER_RE.search(text)
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
        if allow_wrap and "|" in rest and not record_complete(text):
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
            if k in ITER_FIELDS:
                name = ITER_FIELDS[k]
                if name == "lm_loss" and k == "loss" and "lm_loss" in values:
                    continue
                num = to_int(raw_value) if name in INT_FIELDS else to_float(raw_value)
                if num is None and raw_value.strip().lower() in ("nan", "inf", "-inf"):
                    self.run.problems.append(f"line {lineno}: {raw_key} printed as {raw_value}")
                values[name] = num
            elif k == "approx flops per gpu":  # GPT-NeoX: `approx flops per GPU: 112.9TFLOPS`
                values["tflops"] = to_tflops(raw_value)
            elif k.startswith(("elapsed", "iteration time", "step time", "time per iteration")):
                ms = to_elapsed_ms(k, raw_value)
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
        m = STEPS_RE.search(text)
        if m is None or len(m.group(1)) > 18:
            return  # (a step number no int64 holds is not DeepSpeed's: not a step line)
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
        if allow_wrap and not record_complete(text, timer=True):
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
        rank_m = RANK_RE.search(head)
        rank = int(rank_m.group(1)) if rank_m else None
        megatron = rank_m is None and any(
            "-" in k or " " in k or k in MEGATRON_PLAIN_NAMES for k in values
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
        starts = [m.start() for m in MEM_HEAD_RE.finditer(text)] or [0]
        for i, start in enumerate(starts):
            end = starts[i + 1] if i + 1 < len(starts) else len(text)
            head, _, body = text[start:end].partition("memory (MB)")
            values = {norm_key(k): to_float(v) for k, v in parse_pairs(body)}
            rank = RANK_RE.search(head)
            after = AFTER_RE.search(head)
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

    def _failure_line(self, key: str, text: str, lineno: int) -> bool:
        if "Traceback (most recent call last)" in text:
            start = text.find("['Traceback (most recent call last)")
            if start >= 0:
                # A traceback logged as a Python list (``logger.warning(format_exception(...))``).
                body = text[start:]
                if body.rstrip().endswith("]"):
                    list_traceback_end(self.run, key, body, lineno, eof=False)
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
            self.streams.setdefault(key, StreamState()).chained = True
            return True
        stripped = text.strip()
        if "rror" in text or "Exception" in text:
            m = EXC_RE.match(stripped)
            if m and m.group(1).endswith(EXC_NAME_SUFFIX):
                fail(self.run, classify_failure(stripped, "exception"), stripped, lineno, key)
                return True
        if "CANCELLED AT" in text and SLURM_RE.search(text):
            kind: FailureKind = "time_limit" if "TIME LIMIT" in text else "cancelled"
            fail(self.run, kind, stripped, lineno, key)
            return True
        nccl_hint = "Watchdog" in text or "rror" in text or "Gloo" in text or "by peer" in text
        if nccl_hint and NCCL_RE.search(text):
            fail(self.run, "nccl", stripped, lineno, key)
            return True
        oom_hint = "memory" in text or "Memory" in text or "Allocator" in text
        if oom_hint and OOM_RE.search(text) and "memory (MB)" not in text:
            fail(self.run, "oom", stripped, lineno, key)
            return True
        if ("Kill" in text or "KILL" in text or "Signal 9" in text) and KILLED_RE.search(text):
            fail(self.run, "killed", stripped, lineno, key)
            return True
        return False

    def _traceback_line(self, key: str, st: StreamState, text: str, lineno: int) -> bool:
        stripped = text.strip()
        if not stripped or text[:1] in (" ", "\t"):
            if st.lines > TRACEBACK_MAX_LINES:
                self.run.problems.append(f"line {st.start_line}: traceback never ended")
                self._close(st)
            return True
        if stripped.startswith(("During handling of the above exception", "The above exception")):
            st.chained = True
            return True
        if stripped.startswith("Traceback (most recent call last)"):
            return True
        m = EXC_RE.match(stripped)
        if m is None:
            return False  # other output interleaved; the traceback stays open
        run = self.run
        kind = classify_failure(stripped, "exception")
        if st.chained and run.failure is not None and run.failure_stream == key:
            # Chained exceptions: the last one printed is the one that ended the process.
            run.problems.append(
                f"line {run.failure.line}: chained into line {lineno}: {run.failure.message}"
            )
            run.failure = Failure(kind=kind, message=stripped[:2000], line=lineno)
        else:
            fail(self.run, kind, stripped, lineno, key)
        self._close(st)
        st.chained = False
        return True

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
            m = PARAMS_RE.search(text)
            if m:
                run.params[f"({m.group(1)}, {m.group(2) or 0})"] = int(m.group(3))
            return
        if "padded vocab" in text:
            m = VOCAB_RE.search(text)
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
            m = VERSION_RE.match(text.strip())
            if m:
                run.versions.setdefault(m.group(1), m.group(2))
                return
        if "DeepSpeed info:" in text:
            m = DS_INFO_RE.search(text)
            if m:
                run.versions.setdefault("deepspeed", m.group(1))
            return
        if "git_hash=" in text:
            m = GIT_RE.search(text)
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
        self.run = RunState(source=self.source, first_line=lineno)
        self.run.problems.append(f"line {lineno}: new run in the same file ({why})")

    def _finish_run(self) -> None:
        self.runs.append(finished_run(self.run))
