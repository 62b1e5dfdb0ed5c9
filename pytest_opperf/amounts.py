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
