"""Markdown pieces the report is written with."""

from __future__ import annotations

from collections.abc import Sequence


def md_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A GitHub-flavoured markdown table, one line per row (cells are written as given)."""
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    return out + ["| " + " | ".join(r) + " |" for r in rows]
