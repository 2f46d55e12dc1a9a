"""The line machine ``Core``: one per log, fed line by line (or by the bulk reader), with one
block state per stream (launcher prefix). See docs/parsing.md, "The line machine".
"""

from __future__ import annotations

import json
import shlex
from array import array
from typing import Any

from analysis.parse import failures, rules
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
from analysis.parse.records import Failure, Iteration, Memory, ParsedRun, PipelineStep, TimerBlock
from analysis.parse.rules import RunState, StreamState

GB_MEMORY = (
    ("MemAllocated=", rules.MEMALLOC_RE, "deepspeed", ("allocated_mb", "max_allocated_mb")),
    (
        "Max_MA",
        rules.SEE_MEM_RE,
        "see_memory_usage",
        ("allocated_mb", "max_allocated_mb", "reserved_mb", "max_reserved_mb"),
    ),
)
"""Memory lines in GB (text that marks one, its pattern, its ``Memory.kind``, the fields of its
groups), kept in MiB: DeepSpeed's ``MemAllocated=`` lines and ``see_memory_usage`` (bytes /
1024**3 rounded to 2 decimals, ``Max_CA`` to a whole number: * 1024 is MiB to that precision)."""


class Core:
    """The line-by-line state machine shared by every entry point."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.runs: list[ParsedRun] = []
        self.run = RunState(source=source, first_line=1)
        self.streams: dict[str, StreamState] = {}
        self.block_keys: set[str] = set()
        """Streams with an open block other than a Megatron timer block: every line is fed."""
        self.timer_keys: set[str] = set()
        """Streams with an open Megatron timer block: their lines are fed."""
        self.truncated = 0
        self.strict = rules.STRICT.get()
        self.line = 0

    # -- driver interface -------------------------------------------------------------------

    @property
    def active(self) -> bool:
        """Whether every line must be fed (not only those holding a keyword).  An open
        Megatron timer block needs only the lines of its own stream (``timer_keys``)."""
        run = self.run
        return (
            bool(self.block_keys)
            or not run.training_streams
            or run.ended
            or self.line < run.config_until
        )

    @staticmethod
    def clean(raw: str) -> str:
        """A physical line as the machine reads it: cut at ``MAX_LINE_CHARS``, without its
        line end and NUL bytes."""
        raw = raw[:MAX_LINE_CHARS].rstrip("\r\n")
        return raw.replace("\x00", "") if "\x00" in raw else raw

    def offer(self, lineno: int, raw: str) -> None:
        """Feed a line if it can matter (``active``, a keyword), else only to the open Megatron
        timer block of its stream, if any."""
        if self.active or rules.KW.has(raw, self.run.pipe_iterations):
            self.feed(lineno, raw)
        elif self.timer_keys and split_prefix(self.clean(raw))[0] in self.timer_keys:
            self.feed(lineno, raw, dispatch=False)

    def feed(self, lineno: int, raw: str, dispatch: bool = True) -> None:
        """Parse one physical line (1-based ``lineno``).  ``dispatch=False``: only continue
        or close an open block of its stream (a training line without a keyword)."""
        try:
            self.line = lineno
            if len(raw) > MAX_LINE_CHARS:
                self.truncated += 1
            key, text = split_prefix(self.clean(raw))
            st = self.streams.get(key)
            if st is not None and st.mode is not None and self._continue_block(key, st, text):
                return
            if dispatch:
                self._dispatch(key, text, lineno)
        except Exception as exc:
            if self.strict:
                raise
            self.run.problems.append(f"line {lineno}: internal parser error {exc!r} (skipped)")

    def finish(self) -> list[ParsedRun]:
        """Close open blocks and return every run of the input."""
        for key, st in list(self.streams.items()):
            if st.mode is not None:
                self._close_block(key, st, eof=True)
        if self.truncated:
            self.run.problems.append(
                f"{self.truncated} line(s) longer than {MAX_LINE_CHARS} characters were truncated"
            )
        self.runs.append(finished_run(self.run))
        return self.runs

    # -- dispatch ---------------------------------------------------------------------------

    def _open(self, key: str, mode: str, lineno: int, **state: Any) -> StreamState:
        """Open a block of ``mode`` in stream ``key`` (``state``: its first fields)."""
        (self.timer_keys if mode == "timer" else self.block_keys).add(key)
        (self.block_keys if mode == "timer" else self.timer_keys).discard(key)
        old = self.streams.get(key)
        chained = old is not None and old.chained
        st = StreamState(mode=mode, key=key, start_line=lineno, chained=chained, **state)
        self.streams[key] = st
        return st

    def _close(self, st: StreamState) -> None:
        self.block_keys.discard(st.key)
        self.timer_keys.discard(st.key)
        st.mode = None  # (the next block of the stream gets a fresh state)

    def _dispatch(self, key: str, text: str, lineno: int) -> None:
        run = self.run
        if "# run outcome" in text:
            failures.outcome(run, key, text, lineno)
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
            m = rules.TIMER_HEAD_RE.search(text)
            if m:
                self._open(key, "timer", lineno, timer_kind=m.group(1))
                return
        if "memory (MB)" in text:
            self._megatron_memory(text, lineno)
            return
        for mark, pattern, kind, names in GB_MEMORY:
            m = pattern.search(text) if mark in text else None
            if m:
                rank = rules.RANK_RE.search(text) if kind == "deepspeed" else None
                values = {n: float(v) * 1024.0 for n, v in zip(names, m.groups(), strict=True)}
                rank_of = int(rank.group(1)) if rank else None
                run.memory_other.append(Memory(rank=rank_of, kind=kind, line=lineno, **values))
                return
        if self._failure_line(key, text, lineno):
            return
        if "exits" in text or "ssh exited" in text:
            failures.exit_line(run, key, text, lineno)
            return
        if (
            run.training_streams
            and not run.ended
            and (key in run.training_streams or self.line >= run.config_until)
        ):
            # Training phase of this stream: nothing else can matter (keeps fast and slow paths
            # equal). Another stream's set-up lines are still read while every line is fed.
            return
        self._config_line(key, text, lineno)

    # -- multi-line blocks ------------------------------------------------------------------

    def _continue_block(self, key: str, st: StreamState, text: str) -> bool:
        """Feed a line to the open block of its stream; False if the block ended before it."""
        st.lines += 1
        mode = st.mode
        if mode == "timer":
            return self._timer_line(key, st, text)
        if mode == "traceback":
            return self._traceback_line(key, st, text)
        if mode == "args":
            if "end of arguments" in text:
                self._close(st)
                self._config_read()
            elif m := rules.ARG_RE.match(text):
                self.run.args[m.group(1)] = typed_value(m.group(2))
            elif st.lines > 2000:
                self.run.problems.append(f"line {st.start_line}: argument dump never ended")
                self._close(st)
                return False
            return True  # (interleaved text inside the dump is ignored)
        if mode == "engine":
            body = rules.DS_LOGGER_RE.sub("", text, count=1)
            m = rules.DS_CFG_LINE_RE.match(body) if "json =" not in body else None
            if m and "print" in text:
                self.run.ds_engine[m.group(1)] = typed_value(m.group(3))
                return True
            self._close(st)
            return False
        if mode == "wrap" and (st.lines > rules.WRAP_MAX_LINES or not rules.continues_record(text)):
            self._close_block(key, st)
            return False
        st.buf.append(text)  # json, listtb, wrap: read once whole
        if mode == "json":
            st.depth += text.count("{") - text.count("}")
            done = st.depth <= 0 or st.lines > rules.JSON_MAX_LINES
        elif mode == "wrap":
            done = rules.record_complete(rules.join_wrapped(st.buf), st.timer_kind == "timer")
        else:
            done = text.rstrip().endswith("]") or st.lines > rules.TRACEBACK_MAX_LINES
        if done:
            self._close_block(key, st)
        return True

    def _timer_line(self, key: str, st: StreamState, text: str) -> bool:
        """A line of an open Megatron timer block (``_continue_block``)."""
        if st.timer_kind != "times":
            m = rules.TIMER_LINE_RE.match(text)
            a = to_float(m.group(2)) if m else None
            if m and a is not None:
                b = to_float(m.group(3)) if m.group(3) else None
                st.timer_values[m.group(1).strip()] = (a, b) if b is not None else a
                return True
        else:
            r = rules.TIMER_RANK_RE.match(text)
            if r and st.timer_name is not None:
                v = to_float(r.group(2))
                if v is not None:
                    lo, hi = st.timer_values.get(st.timer_name, (v, v))
                    st.timer_values[st.timer_name] = (min(lo, v), max(hi, v))
                return True
            n = rules.TIMER_NAME_RE.match(text)
            if n:
                st.timer_name = n.group(1).strip()
                return True
        self._close_block(key, st)
        return False

    def _close_block(self, key: str, st: StreamState, eof: bool = False) -> None:
        """Close the open block of a stream and read what it held (``eof``: the log ended)."""
        mode, start, buf = st.mode, st.start_line, st.buf
        self._close(st)  # (first: a record read here may open a block of its own)
        if mode == "timer" and st.timer_values:
            self._megatron_block(key, st.timer_values, start)
        elif mode == "json":
            try:
                value = json.loads("\n".join(buf))
            except (ValueError, RecursionError):
                value = None
                self.run.problems.append(f"line {start}: DeepSpeed json config dump is not JSON")
            if isinstance(value, dict):
                self.run.ds_config.update(value)
        elif mode == "wrap":
            read = self._single_line_timers if st.timer_kind == "timer" else self._iteration_text
            read(key, rules.join_wrapped(buf), start, allow_wrap=False)
        elif mode == "listtb":  # a list's repr is one logical line, cut wherever the width fell
            failures.list_traceback_end(self.run, key, "".join(buf), start, eof)
        elif mode == "traceback" and eof:
            self.run.problems.append(
                f"line {start}: traceback without a final exception line (log cut short?)"
            )
        elif mode == "args" and eof:
            self.run.problems.append(f"line {start}: argument dump cut short")

    # -- iterations -------------------------------------------------------------------------

    def _iteration_line(self, key: str, text: str, lineno: int) -> bool:
        matches = list(rules.GLUE_RE.finditer(text))
        head = text[: matches[0].start()] if matches else ""
        if len(matches) > 1 or "time (ms)" in head or "memory (MB)" in head:
            # Several records glued on one line: split at each `iteration k/N`.
            if head.strip(" |"):
                self._dispatch(key, head, lineno)
            ends = [m.start() for m in matches[1:]] + [len(text)]
            for m, end in zip(matches, ends, strict=True):
                self._iteration_text(key, text[m.start() : end], lineno, allow_wrap=False)
            return True
        return self._iteration_text(key, text, lineno, allow_wrap=True)

    def _iteration_text(self, key: str, text: str, lineno: int, allow_wrap: bool) -> bool:
        m = rules.ITER_RE.search(text)
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
        if allow_wrap and "|" in rest and not rules.record_complete(text):
            self._open(key, "wrap", lineno, buf=[text], timer_kind="iteration")
            return True
        # Timers glued after the record (a hard-wrapped log joined back, or an era that
        # prints them on one line): Megatron's one-line `time (ms) | a: 1 | b: 2`.
        rest, cut, glued_timers = rest.partition("time (ms)")
        number = int(m.group(2))
        total = int(m.group(3)) if m.group(3) else None
        values: dict[str, Any] = {}
        problem = self.run.problems.append
        for raw_key, raw_value in parse_pairs(rest):
            k = norm_key(raw_key)
            name = rules.ITER_FIELDS.get(k)
            if name is not None:
                if name == "lm_loss" and k == "loss" and "lm_loss" in values:
                    continue
                num = to_int(raw_value) if name in rules.INT_FIELDS else to_float(raw_value)
                if num is None and raw_value.strip().lower() in ("nan", "inf", "-inf"):
                    problem(f"line {lineno}: {raw_key} printed as {raw_value}")
                values[name] = num
            elif k == "approx flops per gpu":  # GPT-NeoX: `approx flops per GPU: 112.9TFLOPS`
                values["tflops"] = rules.to_tflops(raw_value)
            elif k.startswith(("elapsed", "iteration time", "step time", "time per iteration")):
                ms = rules.to_elapsed_ms(k, raw_value)
                if ms is None:
                    problem(
                        f"line {lineno}: elapsed time {raw_key!r}={raw_value!r} has no readable "
                        "unit or value; left empty"
                    )
                values["elapsed_ms"] = ms
            elif k == "train iters" and total is None:
                total = to_int(raw_value)
        it = Iteration(
            iteration=number, train_iters=total, line=lineno, source=self.source, **values
        )
        self._add_iteration(key, it)
        if cut:
            self._single_line_timers(key, cut + glued_timers, lineno, allow_wrap=False)
        return True

    def _add_iteration(self, key: str, it: Iteration) -> None:
        run = self.run
        if run.has_iteration(it.iteration):
            return  # printed by several ranks
        if it.iteration < run.max_iter:
            self._new_run(it.line or 0, "the iteration counter went back")
            run = self.run
        run.begin_training(key, it.line or 0)
        if run.seen_iters is not None:
            run.seen_iters.add(it.iteration)
        run.iterations.append(it)
        run.iter_numbers.setdefault(key, array("q")).append(it.iteration)
        run.max_iter = max(run.max_iter, it.iteration)
        if it.train_iters is not None:
            run.train_iters = it.train_iters
            if it.iteration >= it.train_iters:
                run.reached_final = True
                run.ended = True

    def _steps(self, key: str, text: str, lineno: int) -> None:
        m = rules.STEPS_RE.search(text)
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
        if allow_wrap and not rules.record_complete(text, timer=True):
            # A hard-wrapped `time (ms) | ... |` line: the rest follows on the next lines.
            self._open(key, "wrap", lineno, buf=[text], timer_kind="timer")
            return
        head, _, body = text.partition("time (ms)")
        values: dict[str, Any] = {}
        for k, v in parse_pairs(body):
            num = to_float(v)
            if num is not None and k:
                values[k] = num
        if not values:
            return
        rank_m = rules.RANK_RE.search(head)
        if rank_m is None and any(
            "-" in k or " " in k or k in rules.MEGATRON_PLAIN_NAMES for k in values
        ):
            self._megatron_block(key, values, lineno)
            return
        run = self.run
        n_iter = len(run.iter_numbers.get(key, ()))
        rank = int(rank_m.group(1)) if rank_m else None
        run.ds_blocks.append((values, rank, lineno, n_iter, len(run.steps), key))
        run.content_streams.add(key)

    def _megatron_block(self, key: str, values: dict[str, Any], lineno: int) -> None:
        """A Megatron timer block, of the last iteration line of its stream (Megatron prints
        its timer blocks from the rank that prints the iteration lines), else of the run."""
        numbers = self.run.iter_numbers.get(key)
        iteration = numbers[-1] if numbers else self.run.last_iter
        self.run.megatron_blocks.append(
            TimerBlock(source="megatron", values_ms=values, iteration=iteration, line=lineno)
        )

    def _megatron_memory(self, text: str, lineno: int) -> None:
        # Reports of several ranks can be glued on one line: split at each report's head.
        starts = [m.start() for m in rules.MEM_HEAD_RE.finditer(text)] or [0]
        for start, end in zip(starts, [*starts[1:], len(text)], strict=True):
            head, _, body = text[start:end].partition("memory (MB)")
            values = {norm_key(k): to_float(v) for k, v in parse_pairs(body)}
            rank = rules.RANK_RE.search(head)
            after = rules.AFTER_RE.search(head)
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

    # -- failures ---------------------------------------------------------------------------

    def _failure_line(self, key: str, text: str, lineno: int) -> bool:
        if "Traceback (most recent call last)" in text:
            start = text.find("['Traceback (most recent call last)")
            if start < 0:
                self._open(key, "traceback", lineno)
            elif text.rstrip().endswith("]"):
                # A traceback logged as a Python list (``logger.warning(format_exception(...))``).
                failures.list_traceback_end(self.run, key, text[start:], lineno, eof=False)
            else:
                self._open(key, "listtb", lineno, buf=[text[start:]])
            return True
        if "above exception" in text and text.lstrip().startswith(failures.CHAINED):
            self.streams.setdefault(key, StreamState()).chained = True
            return True
        return failures.failure_line(self.run, key, text, lineno)

    def _traceback_line(self, key: str, st: StreamState, text: str) -> bool:
        stripped = text.strip()
        if not stripped or text[:1] in (" ", "\t"):
            if st.lines > rules.TRACEBACK_MAX_LINES:
                self.run.problems.append(f"line {st.start_line}: traceback never ended")
                self._close(st)
            return True
        if stripped.startswith(failures.CHAINED):
            st.chained = True
            return True
        if stripped.startswith("Traceback (most recent call last)"):
            return True
        if failures.EXC_RE.match(stripped) is None:
            return False  # other output interleaved; the traceback stays open
        run = self.run
        kind = failures.classify_failure(stripped, "exception")
        if st.chained and run.failure is not None and run.failure_stream == key:
            # Chained exceptions: the last one printed is the one that ended the process.
            run.problems.append(
                f"line {run.failure.line}: chained into line {self.line}: {run.failure.message}"
            )
            run.failure = Failure(kind=kind, message=stripped[:2000], line=self.line)
        else:
            failures.fail(run, kind, stripped, self.line, key)
        self._close(st)
        st.chained = False
        return True

    # -- configuration ----------------------------------------------------------------------

    def _config_line(self, key: str, text: str, lineno: int) -> None:
        run = self.run
        if "arguments" in text and "-- arguments --" in text:
            self._boundary(key, "args", lineno, "a new argument dump")
            self._open(key, "args", lineno)
            self.run.args_stream = key  # (the new run's; ``run`` may be the one that ended)
        elif "using world size:" in text:
            self._boundary(key, "world", lineno, "a new `using world size` line")
            for piece in text.split("using", 1)[1].split(","):
                k, _, v = piece.rpartition(":")
                num = to_int(v)
                if num is not None:  # (the new run's when the line started one)
                    self.run.world[norm_key(k).replace(" ", "_")] = num
        elif "cmd = " in text and "runner.py" in text:
            self._boundary(key, "cmd", lineno, "a new launcher command")
            self._cmd_args(text.split("cmd = ", 1)[1])
        elif "spawned with command" in text:
            run.spawned += 1
        elif "number of parameters" in text:
            m = rules.PARAMS_RE.search(text)
            if m:
                run.params[f"({m.group(1)}, {m.group(2) or 0})"] = int(m.group(3))
        elif "padded vocab" in text:
            m = rules.VOCAB_RE.search(text)
            if m:
                run.vocab = {"vocab_size": int(m.group(1)), "padded_vocab_size": int(m.group(3))}
                self._config_read()
        elif "DeepSpeedEngine configuration" in text:
            self._open(key, "engine", lineno)
        elif "json = " in text:
            body = text.split("json = ", 1)[1]
            st = self._open(key, "json", lineno, buf=[body])
            st.depth = body.count("{") - body.count("}")
            if st.depth <= 0:
                self._close_block(key, st)
        elif ("version" in text or "info ...." in text) and (
            m := rules.VERSION_RE.match(text.strip())
        ):
            run.versions.setdefault(m.group(1), m.group(2))
        elif "DeepSpeed info:" in text:
            m = rules.DS_INFO_RE.search(text)
            if m:
                run.versions.setdefault("deepspeed", m.group(1))
        elif "git_hash=" in text:
            m = rules.GIT_RE.search(text)
            if m:
                run.versions.setdefault("megatron_git_hash", m.group(1))
                if m.group(2):
                    run.versions.setdefault("megatron_git_branch", m.group(2))
        elif text.strip() == "training ...":
            run.begin_training(key, lineno, content=False)

    def _cmd_args(self, cmd: str) -> None:
        """The options after the script of the launcher's command line."""
        try:
            argv = shlex.split(cmd)
        except ValueError:
            argv = cmd.split()
        script = next((i for i, a in enumerate(argv) if a.endswith(".py")), None)
        args = argv[script + 1 :] if script is not None else []
        for i, a in enumerate(args):
            if not a.startswith("--"):
                continue  # (a value, read with its option)
            name, eq, v = a[2:].partition("=")
            name = name.replace("-", "_")  # (the option's name only: values keep their dashes)
            if eq:
                self.run.cmd_args[name] = typed_value(v)
            elif i + 1 < len(args) and not args[i + 1].startswith("--"):
                self.run.cmd_args[name] = typed_value(args[i + 1])
            else:
                self.run.cmd_args[name] = True

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
        self.runs.append(finished_run(self.run))
        self.run = RunState(source=self.source, first_line=lineno)
        self.run.problems.append(f"line {lineno}: new run in the same file ({why})")
