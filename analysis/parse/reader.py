"""Parse Megatron / Megatron-DeepSpeed / DeepSpeed training logs into typed records.

``parse_lines`` is the core; ``parse_text`` and ``parse_file`` (streaming, chunked) wrap it;
``merge_runs`` joins the per-node files of one run.  Nothing here raises on log content: what
cannot be read becomes a line in ``ParsedRun.problems``.  How a file is read, how DeepSpeed
timers find their iteration, interleaved nodes and records that are not one line:
docs/parsing.md ("The line machine").  ``strict()`` makes a handler's exception propagate
(tests).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, fields
from functools import partial
from itertools import islice
from pathlib import Path
from typing import BinaryIO

from analysis.parse.bulk import Bulk
from analysis.parse.extract import line_end
from analysis.parse.lines import (
    COMPOSE,
    MAX_LINE_CHARS,
    TIME_STAMP,
    demux_tagged,
    split_prefix,
    strip_prefix,
)
from analysis.parse.machine import Core
from analysis.parse.merge import merge_runs
from analysis.parse.records import RECORD_LISTS, ParsedRun, TimerTable
from analysis.parse.rules import KW, OMPI_PEEK_BYTES, OMPI_TAG_BYTES, strict
from analysis.parse.tables import RecordTable

__all__ = [
    "merge_runs",
    "parse_file",
    "parse_lines",
    "parse_stream",
    "parse_text",
    "strict",
    "strip_prefix",
]


def parse_lines(lines: Iterable[str], source: str) -> list[ParsedRun]:
    """Parse log lines (with or without trailing newlines) into one ParsedRun per training run.

    Never raises on content; always returns at least one run.
    """
    core = Core(source)
    try:
        for lineno, line in enumerate(demux_tagged(lines), start=1):
            core.offer(lineno, line)
    except (OSError, UnicodeError) as exc:
        core.run.problems.append(f"reading stopped: {exc}")
    return core.finish()


def parse_text(text: str, source: str = "<text>") -> list[ParsedRun]:
    """Parse a whole log held in a string."""
    return parse_lines(text.splitlines(), source)


def parse_file(path: str | Path, bulk: bool = True) -> list[ParsedRun]:
    """Parse one log file, streaming it in chunks (memory grows with the records, not the
    lines).  ``bulk=False`` reads every line through the line path (``drive_file``; the result is
    the same, only slower).

    An unreadable file gives one incomplete run whose problems say why.
    """
    source = str(path)
    try:
        with open(path, "rb") as fh:
            return parse_stream(fh, source, bulk)
    except OSError as exc:
        core = Core(source)
        core.run.problems.append(f"cannot read {source}: {exc.strerror or exc}")
        return core.finish()


CHUNK_BYTES = 8 << 20
"""Bytes read at a time (whole lines are handed on; the rest waits for the next read)."""


class _Demuxed:
    """The lines of an ``mpirun --tag-output`` log put back together (``demux_tagged``), as a
    binary file read in parts of whole lines."""

    def __init__(self, fh: BinaryIO) -> None:
        text = (line.decode("utf-8", "replace").removesuffix("\n") for line in fh)
        self.lines = demux_tagged(text)

    def seekable(self) -> bool:
        return False

    def read(self, _n: int = -1) -> bytes:
        return "".join(line + "\n" for line in islice(self.lines, 1 << 14)).encode()


_STAMPS = re.compile(b"\n" + TIME_STAMP.encode())
"""A newline and the collector's time stamp at the start of the line after it."""
_COMPOSED = re.compile(b"\n(" + COMPOSE.encode() + b")")
"""A newline and ``docker compose``'s prefix of the line after it."""


def collector(peek: bytes) -> Callable[[bytes], bytes] | None:
    """How to take off what a collector wrote on most lines of ``peek`` (a file's start), a
    block of lines at a time, so that the bulk path reads the records: a time stamp (taken
    off), or ``docker compose``'s prefix (and a stamp after it) written as pdsh's ``name: `` for
    the names ``split_prefix`` reads so (the same stream key, the same content)."""
    lines = peek.count(b"\n")
    if 2 * len(_STAMPS.findall(b"\n" + peek)) > lines:
        return partial(_STAMPS.sub, b"\n")
    found = _COMPOSED.findall(b"\n" + peek)
    heads = {h: n for h in found if _pdsh_name((n := h.split(b" ", 1)[0]).decode())}
    if 2 * len(found) <= lines or not heads:
        return None
    names = b"(" + b"|".join(map(re.escape, sorted(set(heads.values())))) + b") +\\| "
    stamped = re.compile(b"\n" + names + TIME_STAMP.encode())
    either = re.compile(b"\n" + names + b"(?:" + TIME_STAMP.encode() + b")?")

    def rewrite(block: bytes) -> bytes:
        if stamped.search(block) is not None:  # (docker compose logs -t)
            return either.sub(b"\n\\1: ", block)
        for head, name in heads.items():  # (each a bytes.replace: faster than a pattern)
            block = block.replace(b"\n" + head, b"\n" + name + b": ")
        return block

    return rewrite


def _pdsh_name(name: str) -> bool:
    """Whether ``split_prefix`` reads ``name: `` as pdsh's prefix before any text."""
    return all(split_prefix(f"{name}: {x}") == (name, x) for x in ("x", "1.0 |"))


def parse_stream(fh: BinaryIO, source: str, bulk: bool = True) -> list[ParsedRun]:
    """Parse a log from an open binary file (``parse_file`` without the opening)."""
    core = Core(source)
    rewrite: Callable[[bytes], bytes] | None = None
    try:
        if fh.seekable():
            peek = fh.read(OMPI_PEEK_BYTES)
            fh.seek(0)
            if OMPI_TAG_BYTES in peek:  # mpirun --tag-output cuts lines: put them back first
                fh = _Demuxed(fh)  # type: ignore[assignment]
            else:
                rewrite = collector(peek)
        drive_file(core, fh, bulk, rewrite)
    except OSError as exc:
        core.run.problems.append(f"cannot read {source}: {exc.strerror or exc}")
    return core.finish()


# -- merging per-node files -------------------------------------------------------------------


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


def _iter_json(paths: Iterable[str]) -> Iterator[str]:
    """The ``--json`` document in pieces: one log parsed at a time, one record a line."""
    encode = json.JSONEncoder(allow_nan=False, default=str).encode
    yield '{"logs": ['
    for i, p in enumerate(paths):
        yield ("," if i else "") + f'\n {{"path": {encode(p)}, "runs": ['
        for j, run in enumerate(parse_file(p)):
            yield ("," if j else "") + "\n  {"
            for k, f in enumerate(fields(run)):
                value = getattr(run, f.name)
                yield ("," if k else "") + f"\n   {encode(f.name)}: "
                if f.name not in RECORD_LISTS:
                    yield encode(asdict(value) if f.name == "failure" and value else value)
                    continue
                yield "["
                sep = "\n    "
                if isinstance(value, RecordTable | TimerTable):  # a block of records at a time
                    texts = value.json_blocks(",\n    ")
                else:  # further_failures: a list
                    texts = [",\n    ".join(encode(asdict(r)) for r in value)] if value else []
                for text in texts:
                    yield sep + text
                    sep = ",\n    "
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
    from rich.console import Console  # (only here: ``--json`` and the library do not load it)

    console = Console(highlight=False)
    for p in ns.logs:
        runs = parse_file(p)
        header = f"{p}: {len(runs)} run(s)"
        lines = [header] + [f"  run {i + 1}: {_summary_line(r)}" for i, r in enumerate(runs)]
        for r in runs:
            lines.extend(f"    problem: {x}" for x in r.problems[:5])
        for line in lines:
            console.print(line, markup=False)
    return 0


def line_step(
    core: Core, block: bytes, pos: int, end: int, lineno: int, look_here: bool = False
) -> tuple[int, int]:
    """Feed the next line of ``block[pos:end]`` that can matter (``Core.active``, keywords,
    streams with an open timer block); skip the lines before it.  Returns (pos, lineno) after
    the fed line, or (end, lineno at end) when none is left.  ``look_here``: the line at
    ``pos`` most likely holds a keyword (a bulk step ended there): look for one in it first,
    before the keywords are looked for through the rest of the chunk."""
    if core.active or core.timer_keys:  # (open timer blocks: their streams' lines, each line)
        e = line_end(block, pos, end)
        core.offer(lineno, block[pos:e].decode("utf-8", "replace"))
        return e + 1, lineno + 1
    hit = -1
    if look_here:
        hit = KW.first(block, pos, line_end(block, pos, end), core.run.pipe_iterations, True)
    if hit < 0:
        hit = KW.first(block, pos, end, core.run.pipe_iterations)
    if hit < 0:
        return end, lineno + block.count(b"\n", pos, end)
    s = block.rfind(b"\n", pos, hit) + 1 or pos
    lineno += block.count(b"\n", pos, s)
    e = line_end(block, s, end)
    core.feed(lineno, block[s:e].decode("utf-8", "replace"))
    return e + 1, lineno + 1


def drive_block(
    core: Core,
    bulk: Bulk | None,
    block: bytes,
    lineno: int,
    end: int,
    rewrite: Callable[[bytes], bytes] | None,
) -> int:
    """Feed the whole lines of ``block``; return the line number after it.  Where the last
    bulk step took few lines (a log of mostly NCCL chatter), the line path, which jumps
    from keyword to keyword, reads the next ``SPARSE_BYTES``.  ``end``: where the whole
    lines end; ``rewrite``: what a collector wrote on each
    line, rewritten first (``collector``)."""
    if rewrite is not None:
        block = rewrite(b"\n" + block[:end])[1:]
        end = len(block)
    pos = 0
    stepped = False  # the last bulk step ended at ``pos``
    while pos < end:
        if bulk is not None and not core.active and not core.timer_keys and bulk.line_budget <= 0:
            pos, lineno, cut = bulk.advance(block, pos, end, lineno)
            if pos >= end:
                break
            if not cut:  # it read all it looked at: the next step starts here
                continue
            stepped = True
        start = pos
        pos, lineno = line_step(core, block, pos, end, lineno, look_here=stepped)
        stepped = False
        if bulk is not None:  # (keyword lines of a sparse stretch: fed here until it is spent)
            bulk.line_budget -= pos - start
    return lineno


def drive_file(
    core: Core, fh: BinaryIO, bulk: bool, rewrite: Callable[[bytes], bytes] | None
) -> None:
    """Feed a whole file, ``CHUNK_BYTES`` at a time; an over-long line's tail is skipped;
    ``rewrite``: see ``drive_block``."""
    fast = Bulk(core, KW) if bulk else None
    lineno = 1
    carry = b""
    skipping = False  # inside the tail of an over-long line
    seekable = fh.seekable()
    while True:
        data = fh.read(CHUNK_BYTES)
        if not data:
            break
        if seekable and not carry and not skipping and len(data) == CHUNK_BYTES:
            # The whole lines of the chunk, then read again from the first byte of the
            # line it cut (no copy of the chunk to join that line's two pieces).
            cut = data.rfind(b"\n")
            if cut >= 0:
                lineno = drive_block(core, fast, data, lineno, cut + 1, rewrite)
                if cut + 1 < len(data):
                    fh.seek(cut + 1 - len(data), 1)
                continue
        if skipping:
            nl = data.find(b"\n")
            if nl < 0:
                continue
            core.feed(lineno, carry.decode("utf-8", "replace"))  # counted as truncated there
            lineno += 1
            carry, skipping = b"", False
            data = data[nl + 1 :]
        buf = carry + data if carry else data
        cut = buf.rfind(b"\n")
        if cut < 0:
            carry = buf
            if len(carry) > MAX_LINE_CHARS * 4:
                carry, skipping = carry[: MAX_LINE_CHARS * 4], True
            continue
        lineno = drive_block(core, fast, buf, lineno, cut + 1, rewrite)
        carry = buf[cut + 1 :]
    if carry:
        core.feed(lineno, carry.decode("utf-8", "replace"))
    KW.forget()
    if fast is not None:
        fast.keywords.forget()
