"""Relative amounts as users write them (5% or 0.05): options, configs and `opperf compare` read them alike.

A bottom module: it imports nothing of the package, so every layer may use it.
"""

from __future__ import annotations

import math
from typing import Any


def parse_fraction(value: Any) -> float:
    """A relative amount written as a percentage or a fraction; ValueError unless a number > 0.

    >>> parse_fraction("5%"), parse_fraction("0.05"), parse_fraction(0.25)
    (0.05, 0.05, 0.25)
    """
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"not a number: a {type(value).__name__}")  # never the value: it may be huge
    text = str(value).strip()
    number = float(text[:-1]) / 100.0 if text.endswith("%") else float(text)
    if not (number > 0 and math.isfinite(number)):
        raise ValueError(f"not above zero: {value!r}")
    return number


def parse_width(value: Any, flag: str) -> "int | None":
    """A terminal width as users write it: 'auto' -> 0 (decided from the terminal), 'full' -> None
    (no limit), 'N' -> N columns (at least 40); a ValueError naming `flag` otherwise.

    >>> parse_width("auto", "--width"), parse_width("full", "--width"), parse_width(" 120 ", "--width")
    (0, None, 120)
    """
    text = str(value).strip().lower()
    if text in ("auto", "full"):
        return 0 if text == "auto" else None
    if text.isdigit() and int(text) >= 40:
        return int(text)
    raise ValueError(f"{flag}={value}: expected auto, full or a number of columns >= 40")
