"""Numbers written for people: the one formatter of the report's tables, the repeats' notes, the
predictions and the console tables."""

from __future__ import annotations

import math
from typing import Any


def number(value: Any, digits: int = 1, missing: str = "") -> str:
    """``1,234.5``: thousands separated, ``digits`` decimals; ``missing`` for None or NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return missing
    return f"{value:,.{digits}f}"


def percent(value: float | None, digits: int = 1, missing: str = "") -> str:
    """``12.3%`` of a fraction; ``missing`` for None or NaN."""
    if value is None or math.isnan(value):
        return missing
    return f"{value:.{digits}%}"


def count(n: int | None, noun: str) -> str:
    """``1 rank``, ``2 ranks``; ``? ranks`` when ``n`` is unknown."""
    return f"{n if n is not None else '?'} {noun}{'' if n == 1 else 's'}"
