"""Line-level helpers of the log parser: prefixes, the ``key: value |`` grammar, typed values.

Everything here is pure and never raises on any input string.
"""

from __future__ import annotations

import ast
import contextlib
import math
import re
from collections.abc import Iterable, Iterator

MAX_LINE_CHARS = 64 * 1024
"""Lines longer than this are truncated before parsing (and the truncation is reported)."""

_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")

TIME_STAMP = (
    r"(?:\d{4}-\d\d-\d\d[T ]|[A-Z][a-z]{2} [ \d]\d )?\d\d:\d\d:\d\d(?:[.,]\d{1,9})?"
    r"(?:Z|[+-]\d\d:?\d\d)?[ \t]"
)
"""A time stamp that a log collector writes at the start of every line, and the one blank after
it: RFC 3339 (``kubectl logs --timestamps``, ``docker logs -t``), ISO 8601 with a space, or
moreutils ``ts``'s ``Nov 28 10:00:00`` (its default) and ``00:01:05`` (``ts -s``, ``-i``).  Taken
off before the launcher prefixes, and no part of the stream key.  (A bracketed one, ``[2026-11-22
01:30:03,047] [INFO]``, is DeepSpeed's logger, printed by the program: content.)"""
_STAMP_RE = re.compile(TIME_STAMP)

COMPOSE = r"(?:[A-Za-z][A-Za-z0-9_.-]{0,62} +|\d[A-Za-z0-9_.-]{0,62}  +)\| "
"""``docker compose logs``'s prefix: the container's name, padded with blanks, then ``| ``
(``node0-1  | ``; a name that starts with a digit, at least two blanks: a hard-wrapped
record's ``26.740 | tokens`` stays content).  Taken off first (a time stamp, ``--timestamps``,
comes after it); the name is the stream's first label."""
_COMPOSE_RE = re.compile(COMPOSE)

# Launcher prefixes, tried repeatedly at the start of a line:
#   srun --label            "0: " / " 12: "
#   mpirun --tag-output     "[1,0]<stdout>:" (Open MPI: [job,rank]<stream>)
#   torchrun --tee / --log  "[default0]:"
#   torch >= 2.2 rank tags  "[rank3]:"
#   pdsh                    "host: " (checked in split_prefix so that "steps: 30" or
#                           "RuntimeError: ..." stay content)
_PREFIX_RE = re.compile(
    r"(?:\s{0,4}(?P<srun>\d{1,5}):\s"
    r"|\[\d{1,9},(?P<ompi>\d{1,6})\]<std(?:out|err)>:"
    r"|\[(?P<tag>default\d+|rank\d+)\]:\s?"
    r"|(?P<host>[A-Za-z0-9][A-Za-z0-9_.-]{0,62}):\s)"
)
_HOST_SUFFIX_REJECT = ("Error", "Exception", "Warning", "Interrupt", "Exit", ".py")
_HOST_MARK_RE = re.compile(r"[0-9.-]")
_TIMER_KEY_RE = re.compile(r"[a-z]+(?:-[a-z]+)+")
_VALUE_PIPE_RE = re.compile(r"\s*[-+]?[\d.]+(?:[eE][-+]?\d+)?\s*(?:\||$)")


def split_prefix(line: str) -> tuple[str, str]:
    """Split a raw log line into (stream key, content).

    The stream key names the launcher prefixes that were removed (``node1|rank3``, or ``""``),
    so that lines of several nodes or ranks interleaved in one file can be told apart. ANSI
    escape codes are removed everywhere, ``docker compose``'s prefix (``COMPOSE``) and then a
    collector's time stamp at the start (``TIME_STAMP``); timestamps such as ``[2026-11-22
    01:30:03,047]`` are content and stay.
    """
    if "\x1b" in line:
        line = _ANSI_RE.sub("", line)
    key = ""
    if line[:1].isalnum() and (m := _COMPOSE_RE.match(line)) is not None:
        key, line = m.group()[: m.group().index(" ")], line[m.end() :]
    if line[:1].isdigit() or line[:1].isupper():
        stamp = _STAMP_RE.match(line)
        if stamp is not None:
            line = line[stamp.end() :]
    for _ in range(4 - bool(key)):  # (four prefixes at most, compose's among them)
        m = _PREFIX_RE.match(line)
        if m is None:
            break
        label = m.group("srun") or m.group("ompi") or m.group("tag") or m.group("host")
        if m.group("host") is not None and (
            # a pdsh host name carries a digit, a dash or a dot (``node01``, ``10.0.0.2``) or is
            # ``localhost``; content keys (``steps``, ``NOTE``, ``torch.OutOfMemoryError``) not
            (label != "localhost" and not _HOST_MARK_RE.search(label))
            or label.endswith(_HOST_SUFFIX_REJECT)
            # `backward-send: 0.86 |`: a Megatron timer key at the start of a wrapped line
            or (_TIMER_KEY_RE.fullmatch(label) and _VALUE_PIPE_RE.match(line, m.end()))
        ):
            break
        key = f"{key}|{label}" if key else label
        line = line[m.end() :]
    return key, line


_OMPI_TAG_RE = re.compile(r"(\[\d{1,9},\d{1,6}\]<std(?:out|err)>:)")

OMPI_TAG_MARK = "]<std"
"""Substring of every Open MPI ``--tag-output`` tag (``[1,0]<stdout>:``): the cheap test."""


def demux_tagged(lines: Iterable[str]) -> Iterator[str]:
    """Lines of an ``mpirun --tag-output`` log with each rank's lines put back together.

    mpirun tags the chunks a rank writes, not its lines: one physical line can hold the start
    of one rank's line and then another rank's whole line (``[1,0]<stdout>:size: 1 [1,1]<stdout>:
    WARNING ...``), and a line's newline can come later with a tag of its own
    (``...****[1,0]<stdout>:``). Every tagged piece is added to its rank's stream; the last piece
    of a physical line carries the newline, so it completes its rank's line, which is yielded as
    ``<tag><whole line>``. Untagged lines (mpirun's own, the launcher's) pass unchanged; pieces
    never completed are yielded at the end (or once longer than ``MAX_LINE_CHARS``).
    """
    pending: dict[str, str] = {}  # tag -> the text of that rank's line so far (no newline yet)
    for raw in lines:
        if OMPI_TAG_MARK not in raw:
            yield raw
            continue
        parts = _OMPI_TAG_RE.split(raw.rstrip("\r\n"))
        if len(parts) == 1:
            yield raw
            continue
        if parts[0]:  # untagged text before the first tag
            yield parts[0]
        pieces = list(zip(parts[1::2], parts[2::2], strict=True))
        for tag, data in pieces[:-1]:
            pending[tag] = pending.get(tag, "") + data
            if len(pending[tag]) > MAX_LINE_CHARS:  # a rank that never ends its line
                yield tag + pending.pop(tag)
        tag, data = pieces[-1]
        yield tag + pending.pop(tag, "") + data
    yield from (tag + data for tag, data in pending.items())  # what never ended


def strip_prefix(line: str) -> str:
    """Strip ANSI codes and launcher prefixes (pdsh, srun, torchrun) from one line."""
    return split_prefix(line)[1]


def to_float(text: str) -> float | None:
    """Parse a printed number; None if it is not a finite number."""
    try:
        value = float(text.strip().replace(",", ""))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def to_int(text: str) -> int | None:
    """Parse a printed integer (``8``, ``8.0``); None if it is not one."""
    value = to_float(text)
    if value is None or value != int(value):
        return None
    return int(value)


_CONSTANTS = {"True": True, "False": False, "None": None, "none": None, "null": None}


def typed_value(text: str) -> object:
    """Type a value printed by Megatron's or DeepSpeed's argument dump.

    ``4`` -> int, ``0.001`` / ``1e-08`` -> float, ``True``/``False`` -> bool, ``None`` -> None,
    ``[1]`` / ``['a']`` / ``{...}`` -> the literal when it parses, anything else -> the string.
    """
    s = text.strip()
    if s in _CONSTANTS:
        return _CONSTANTS[s]
    with contextlib.suppress(ValueError):
        return int(s)
    with contextlib.suppress(ValueError):
        value = float(s)
        return value if math.isfinite(value) else s
    if s[:1] in "[({" and len(s) <= 10_000:
        with contextlib.suppress(ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
            return ast.literal_eval(s)
    return s


def norm_key(key: str) -> str:
    """Normalise a printed key: lower case, ``-``/``_`` as spaces, single spaces."""
    return " ".join(key.lower().replace("_", " ").replace("-", " ").split())


_KV_SPLIT_RE = re.compile(r"[\s,;]+")


def parse_pairs(text: str) -> list[tuple[str, str]]:
    """The one pair grammar: ``key: value | key: value |`` (or ``key value |``, ``k=v k=v``).

    Returns (raw key, raw value) pairs in printed order. Pieces are separated by ``|``; a piece
    with ``:`` splits at its last colon (``elapsed time per iteration (ms): 201.6``); a piece
    with ``=`` and no colon is a run of ``k=v`` tokens; otherwise the last word is the value
    (oldest Megatron: ``lm loss 7.1E+00``).
    """
    pairs: list[tuple[str, str]] = []
    for piece in text.split("|"):
        piece = piece.strip()
        if not piece:
            continue
        if "=" in piece and ":" not in piece and piece.count("=") == 1:
            k, _, v = piece.partition("=")  # `consumed_samples=   835608576`
            pairs.append((k.strip(), v.strip()))
        elif "=" in piece and ":" not in piece:
            for tok in _KV_SPLIT_RE.split(piece):
                k, sep, v = tok.partition("=")
                if sep and k:
                    pairs.append((k, v))
        elif ":" in piece:
            k, _, v = piece.rpartition(":")
            pairs.append((k.strip(), v.strip()))
        else:
            k, _, v = piece.rpartition(" ")
            if k:
                pairs.append((k.strip(), v))
    return pairs
