"""Problems of a run as ``analysis.runs.load`` finds them: a stable code, the file or field it is
about, and the message the report prints. Code selects on the code, never on the words."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

UnreadCode = Literal[
    "unreadable_json",
    "not_an_object",
    "invalid_run_json",
    "no_log",
    "no_training_output",
    "truncated_lines",
    "cut_short",
]
"""Problems that mean a run's files could not be read as written: a file that does not read
(``unreadable_json``, ``not_an_object``, ``invalid_run_json``: run.json is JSON but not a run
record), no log (``no_log``), or logs that are unusable or damaged (``no_training_output``,
``truncated_lines``, ``cut_short``)."""

ProblemCode = Literal[
    UnreadCode,
    "log",
    "logs_disagree",
    "no_ds_config",
    "no_cmd",
    "setup_unknown",
    "inconsistent_setup",
]
"""What kind of problem a run has: an :data:`UnreadCode`, any other note of the parser
(``log``), per-node logs that disagree (``logs_disagree``), side files missing next to bare
logs (``no_ds_config``, ``no_cmd``), a setup field no source gives (``setup_unknown``) or sources
that contradict each other (``inconsistent_setup``)."""

UNREAD_CODES: frozenset[str] = frozenset(get_args(UnreadCode))
"""The :data:`UnreadCode` values: the report lists runs with such a problem on their own, so a
figure missing because a file was unreadable is never silent."""


@dataclass(frozen=True)
class Problem:
    """One thing missing or inconsistent about a run, as ``analysis.runs.load`` found it."""

    code: ProblemCode
    """Stable identifier of the kind of problem (what code selects on)."""
    field: str | None
    """The file or setup field it is about (``run.json``, ``ds_config.json``, ``log``,
    ``model``, ...), None when it is about the run as a whole."""
    message: str
    """The problem in words, as the report prints it."""

    def __str__(self) -> str:
        return self.message

    @classmethod
    def of_parser(cls, text: str) -> Problem:
        """A problem string of the parser (``ParsedRun.problems``) with its code: lines over the
        length limit, a log that ends inside a block, no training output, or another note."""
        if "were truncated" in text:
            return cls("truncated_lines", "log", text)
        if "cut short" in text:
            return cls("cut_short", "log", text)
        if text == "no training output recognised":
            return cls("no_training_output", "log", text)
        return cls("log", "log", text)
