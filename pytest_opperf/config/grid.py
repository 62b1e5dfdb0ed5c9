"""A config's parameter values: lists and {min, max, step|mul} ranges, their types, the grid they span.

A range is never listed to be counted or checked: its length is arithmetic and its type is
read from its ends and step, so `--opperf-max-cases` refuses a huge grid before expanding it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any, Iterator, Optional

from pytest_opperf.record import plain  # keeps integer grids integer: 2 * 2.0 ** 3 -> 16
from pytest_opperf.config.yamlfile import ConfigError, describe, finite

RANGE_KEYS = {"min", "max", "step", "mul"}
SCALAR_TYPES = (int, float, str, bool)


def parse_params(path: Path, spec: Any, prefix: str = "params") -> dict[str, list]:
    """A `params:` (or `knobs:`) mapping: lower-case name -> its list of values or its Range."""
    if not isinstance(spec, dict):
        raise ConfigError(path, prefix, f"expected a mapping of parameter -> values, got {describe(spec)}")
    out: dict[str, list] = {}
    for name, value in spec.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ConfigError(path, f"{prefix}.{name}", "parameter names must be identifiers")
        column = name.lower()
        key = f"{prefix}.{name}"
        if column in out:
            raise ConfigError(path, key, f"given twice (names are case-insensitive: {column!r})")
        if isinstance(value, dict):
            out[column] = Range.parse(path, key, value)
        elif isinstance(value, list):
            if not value:
                raise ConfigError(path, key, "expected at least one value")
            for i, v in enumerate(value):
                if not isinstance(v, SCALAR_TYPES):
                    raise ConfigError(path, f"{key}[{i}]", f"expected a number or string, got {describe(v)}")
            out[column] = list(value)
        elif isinstance(value, SCALAR_TYPES):
            out[column] = [value]
        else:
            raise ConfigError(path, key, f"expected a list, a value or {{min, max, step|mul}}, got {describe(value)}")
    return out


def distinct(params: dict, keep: set = frozenset()) -> dict:
    """Each list's repeated values dropped, except in the parameters named in `keep`.

    A zipped parameter keeps its repeats: its i-th value pairs with the i-th of its group, so
    m: [128, 128, 256] zipped with n: [1, 2, 3] is the shapes (128, 1), (128, 2), (256, 3).
    """
    return {n: v if n in keep or isinstance(v, Range) else list(dict.fromkeys(v)) for n, v in params.items()}


def check_types(path: Path, params: dict, cases: Optional[list[dict]], types: dict) -> None:
    """Every value of a parameter has the op's type for it (a float is accepted for a float column).

    A range is checked by its ends and step, never value by value: it may be far too long to list.
    """
    def ok(value, kind) -> bool:
        if isinstance(value, bool):
            return False
        if kind is float:
            return isinstance(value, (int, float))
        return isinstance(value, kind)

    for name, values in params.items():
        kind = types.get(name)
        if kind is None:
            continue
        if isinstance(values, Range):
            _check_range_type(path, values, kind)
            continue
        for i, value in enumerate(values):
            if not ok(value, kind):
                key = f"params.{name}" if len(values) == 1 else f"params.{name}[{i}]"
                raise ConfigError(path, key, f"expected {kind.__name__} values for this parameter, got {describe(value)}")
    for i, row in enumerate(cases or []):
        for name, value in row.items():
            kind = types.get(name)
            if kind is not None and not ok(value, kind):
                raise ConfigError(path, f"cases[{i}].{name}", f"expected {kind.__name__}, got {describe(value)}")


def _check_range_type(path: Path, rng: Range, kind: type) -> None:
    """A range yields numbers; for an int parameter, ints exactly when min and step (or mul) are ints."""
    if kind is float:
        return
    if kind is not int:
        raise ConfigError(path, rng.key, f"expected {kind.__name__} values for this parameter, got a range of numbers")
    fields = [("min", rng.start)]
    if len(rng) > 1:
        fields.append(("step", rng.step) if rng.step is not None else ("mul", rng.mul))
    for field, value in fields:
        if not isinstance(value, int):
            raise ConfigError(path, f"{rng.key}.{field}",
                              f"expected int values for this parameter, so an int {field}, got {describe(value)}")


def grid(params: dict, zip_groups: list[list[str]]) -> Iterator[dict]:
    """Every shape of the cross product, a zipped group varying as one axis, in the file's order.

    >>> list(grid({"m": [1, 2], "n": [3, 4], "k": [5]}, [["m", "n"]]))
    [{'m': 1, 'n': 3, 'k': 5}, {'m': 2, 'n': 4, 'k': 5}]
    """
    zipped = {n: g for g in zip_groups for n in g}
    axes = []  # each axis: (names, iterable of value tuples)
    done = set()
    for name in params:
        if name in done:
            continue
        group = zipped.get(name, [name])
        done.update(group)
        axes.append((group, list(zip(*(list(params[n]) for n in group)))))
    for combo in itertools.product(*(values for _, values in axes)):
        shape = {}
        for (names, _), values in zip(axes, combo):
            shape.update(zip(names, values))
        yield shape


class Range(Sequence):
    """{min, max, step} or {min, max, mul}: a lazily expanded sequence whose length is arithmetic.

    The length counts the numbers the file wrote (0.1 is one tenth, not the binary float next to
    it), so rounding never adds or drops the last value; the values themselves are computed as
    `min + i * step` and `min * mul ** i`.

    >>> len(Range(0.1, 0.3, step=0.1)), list(Range(3, 100, mul=3)), len(Range(1, 10**12, step=1))
    (3, [3, 9, 27, 81], 1000000000000)
    """

    def __init__(self, start, stop, step=None, mul=None, key: str = ""):
        # Integral floats (YAML's 2.0) become ints, so an int parameter's range stays exact.
        self.start, self.stop, self.step, self.mul = plain(start), stop, plain(step), plain(mul)
        self.key = key
        self.length = self._arithmetic_length() if step is not None else self._geometric_length()

    @classmethod
    def parse(cls, path: Path, key: str, spec: dict) -> "Range":
        unknown = sorted(set(spec) - RANGE_KEYS)
        if unknown:
            raise ConfigError(path, f"{key}.{unknown[0]}", f"unknown key; a range is {{min, max, step}} or {{min, max, mul}}")
        for field in ("min", "max"):
            if field not in spec:
                raise ConfigError(path, f"{key}.{field}", "missing: a range needs min and max")
            finite(path, f"{key}.{field}", spec[field])
        lo, hi = spec["min"], spec["max"]
        if lo > hi:
            raise ConfigError(path, key, f"min ({lo}) is greater than max ({hi})")
        if ("step" in spec) == ("mul" in spec):
            raise ConfigError(path, key, "give exactly one of 'step' (arithmetic) or 'mul' (geometric)")
        if "step" in spec:
            step = finite(path, f"{key}.step", spec["step"])
            if step <= 0:
                raise ConfigError(path, f"{key}.step", f"expected a number > 0, got {step}")
            return cls(lo, hi, step=step, key=key)
        mul = finite(path, f"{key}.mul", spec["mul"])
        if mul <= 1:
            raise ConfigError(path, f"{key}.mul", f"expected a number > 1, got {mul}")
        if lo <= 0:
            raise ConfigError(path, f"{key}.min", f"a geometric range needs min > 0, got {lo}")
        return cls(lo, hi, mul=mul, key=key)

    def _arithmetic_length(self) -> int:
        return math.floor((_exact(self.stop) - _exact(self.start)) / _exact(self.step)) + 1

    def _geometric_length(self) -> int:
        # The logarithm is within one of the last index; the boundary is then settled exactly.
        last = max(0, math.floor((math.log(self.stop) - math.log(self.start)) / math.log(self.mul)))
        while last > 0 and not self._reaches(last):
            last -= 1
        while self._reaches(last + 1):
            last += 1
        return last + 1

    def _reaches(self, i: int) -> bool:
        """min * mul**i <= max, in exact rationals where that is cheap (every range short enough to run)."""
        start, mul, stop = _exact(self.start), _exact(self.mul), _exact(self.stop)
        if i * (mul.numerator.bit_length() + mul.denominator.bit_length()) <= _EXACT_BITS:
            return start.numerator * mul.numerator ** i * stop.denominator <= \
                stop.numerator * start.denominator * mul.denominator ** i
        # A range this long with a many-digit mul: the float value, with a 1e-9 slack for rounding.
        try:
            return self._value(i) <= self.stop * (1 + 1e-9)
        except OverflowError:  # past the largest float, so past max
            return False

    def _value(self, i: int):
        return self.start + i * self.step if self.step is not None else self.start * self.mul ** i

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Iterator:
        for i in range(self.length):
            yield plain(self._value(i))

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self.length))]
        if not -self.length <= i < self.length:
            raise IndexError(f"range index {i} out of range")
        return plain(self._value(i % self.length))

    def __eq__(self, other) -> bool:
        return isinstance(other, Range) and self._spec() == other._spec()

    def __hash__(self) -> int:
        return hash(self._spec())

    def _spec(self) -> tuple:
        return self.start, self.stop, self.step, self.mul

    def __repr__(self) -> str:
        kind = f"step={self.step}" if self.step is not None else f"mul={self.mul}"
        return f"Range(min={self.start}, max={self.stop}, {kind}: {self.length} values)"


_EXACT_BITS = 1 << 17  # beyond this size the exact big-integer powers of _reaches stop being cheap


def _exact(x) -> Fraction:
    """The number as the file wrote it: a float's shortest decimal (0.1 -> 1/10), an int as is."""
    return Fraction(repr(x)) if isinstance(x, float) else Fraction(x)
