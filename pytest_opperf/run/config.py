"""configs/<op>.yaml -> validated grid -> Cases.

The seed form works verbatim::

    backend: deep_gemm
    backend_version: "2.1.1+c9f8b34"
    dtypes: {'input': 'fp8', 'output': 'bf16'}
    params:
      M: {min: 2, max: 4, step: 2}
      N: [8192]
      K: [1536]

Every error is a ConfigError naming the file, the key and what was expected.
"""

from __future__ import annotations

import ast
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Iterator, Optional

import yaml

from pytest_opperf.amounts import parse_fraction
from pytest_opperf.case import Case, format_value
from pytest_opperf.catalog import dtypes as dtype_table
from pytest_opperf.measure import timing

TOP_KEYS = {
    "op", "description", "backend", "backend_version", "backends", "dtypes", "params",
    "zip", "cases", "exclude", "tolerance", "timer", "cache", "max_regression",
}
BACKEND_KEYS = {"version", "knobs", "constraints", "default", "search"}
RANGE_KEYS = {"min", "max", "step", "mul"}
SCALAR_TYPES = (int, float, str, bool)


class ConfigError(Exception):
    """A config problem, already phrased for the user: 'file: key: what was expected'."""

    def __init__(self, path: Any, key: str, message: str):
        self.path, self.key = str(path), key
        where = f"{self.path}: {key}: " if key else f"{self.path}: "
        super().__init__(where + message)


@dataclass(frozen=True)
class BackendSpec:
    name: str
    version: Optional[str]  # the pin, if any
    knobs: tuple  # ((knob, (values...)), ...)
    # ((key, source, compiled code), ...): knob combinations that break one are skipped with the reason.
    constraints: tuple = ()
    default: bool = False  # also run the backend without knobs: the baseline a sweep's best is measured against
    search: Any = None  # search.RandomSearch: a seeded sample of the knob grid instead of all of it


@dataclass
class OpConfig:
    path: Path
    op: str
    backends: list[BackendSpec]
    dtypes: list[tuple[str, str]]
    params: dict[str, list]  # lower-case name -> values (after range expansion: lazily counted)
    zip_groups: list[list[str]]
    cases: Optional[list[dict]]
    exclude: list[tuple[str, Any]]  # (source, compiled code)
    tolerance: dict[str, float]
    timer: Optional[str]
    cache: Optional[str]
    # (expression source or None for "every case", compiled code or None, threshold): first match wins.
    max_regression: list = field(default_factory=list)
    param_keys: dict[str, str] = field(default_factory=dict)  # column -> its key as written ("params.M")

    def count(self) -> int:
        """Cases before exclusion, computed without expanding the grid."""
        return math.prod(n for _, n in self.factors())

    def factors(self) -> list[tuple[str, int]]:
        """What multiplies into count(), each with the key that sets it; no range is expanded.

        >>> cfg.factors()   # params: {M: {min: 1, max: 8, mul: 2}, N: [1, 2]}, dtypes: [fp16, bf16]  # doctest: +SKIP
        [('params.M', 4), ('params.N', 2), ('backends', 1), ('dtypes', 2)]
        """
        if self.cases is not None:
            shapes = [("cases", len(self.cases))]
        else:
            zipped = {n for g in self.zip_groups for n in g}
            shapes = [(self.param_keys.get(n, f"params.{n}"), len(v)) for n, v in self.params.items() if n not in zipped]
            shapes += [(f"zip[{i}]", len(self.params[g[0]])) for i, g in enumerate(self.zip_groups)]
        backends = sum(_knob_sets(b) for b in self.backends)
        return shapes + [("backends", backends), ("dtypes", len(self.dtypes))]

    def expand(self, columns: tuple[str, ...], device: str) -> Iterator[Case]:
        """Yield the cases in a stable order; excluded and duplicate ones dropped."""
        seen = set()
        for shape in self._shapes():
            ordered = tuple((c, shape[c]) for c in columns)
            for backend in self.backends:
                for knobs in self._knob_sets(backend, ordered, device):
                    for din, dout in self.dtypes:
                        case = Case(self.op, backend.name, backend.version, din, dout, ordered, knobs)
                        if case in seen or (self.exclude and self._excluded(case, device)):
                            continue
                        seen.add(case)
                        yield case

    def _knob_sets(self, backend: BackendSpec, shape: tuple, device: str) -> Iterator[tuple]:
        """The backend's knob combinations for one shape: () first for its default, then the
        grid in order, or the search's seeded sample of the combinations its constraints allow."""
        if backend.default and backend.knobs:
            yield ()
        if backend.search is None:
            names = [k for k, _ in backend.knobs]
            for values in itertools.product(*(v for _, v in backend.knobs)):
                yield tuple(zip(names, values))
            return
        shape_id = "-".join(f"{k}={format_value(v)}" for k, v in shape)

        def allowed(knobs: tuple) -> bool:
            probe = Case(self.op, backend.name, None, "", "", shape, knobs)
            return all(self._holds(key, source, code, probe, device, dtypes=False)
                       for key, source, code in backend.constraints)

        yield from backend.search.sample(backend.knobs, f"{self.op}/{backend.name}/{shape_id}", allowed)

    def violated(self, case: Case, device: str) -> Optional[str]:
        """Why the case's knob combination is invalid (the first constraint it breaks), or None."""
        if not case.knobs:
            return None  # the backend's own defaults: constraints are about the knobs a config sets
        for backend in self.backends:
            if backend.name != case.backend:
                continue
            for key, source, code in backend.constraints:
                if not self._holds(key, source, code, case, device):
                    names = {**dict(case.params), **dict(case.knobs)}
                    used = ", ".join(f"{n}={format_value(names[n])}" for n in code.co_names if n in names)
                    return f"{self.path}: {key}: {source!r} does not hold ({used})"
        return None

    def _shapes(self) -> Iterator[dict]:
        if self.cases is not None:
            fixed = {k: v[0] for k, v in self.params.items()}
            for row in self.cases:
                yield {**fixed, **row}
            return
        yield from _grid(self.params, self.zip_groups)

    def _excluded(self, case: Case, device: str) -> bool:
        return any(self._holds("exclude", source, code, case, device) for source, code in self.exclude)

    def threshold_for(self, case: Case, device: str) -> Optional[tuple[float, str]]:
        """The case's max_regression and where it came from, or None when the config sets none.

        >>> cfg.threshold_for(case, "h100")   # max_regression: {"m < 512": 25%, "true": 10%}  # doctest: +SKIP
        (0.25, 'configs/gemm.yaml: max_regression[m < 512]')
        """
        for source, code, threshold in self.max_regression:
            if code is None:
                return threshold, f"{self.path}: max_regression"
            if self._holds(f"max_regression[{source}]", source, code, case, device):
                return threshold, f"{self.path}: max_regression[{source}]"
        return None

    def _holds(self, key: str, source: str, code: Any, case: Case, device: str, dtypes: bool = True) -> bool:
        """Evaluate a validated expression on one case's names (params, knobs, backend, dtypes, device).

        An expression naming a knob the case does not set (another backend's, or a default case)
        does not hold: it is about the cases that set it. Without `dtypes` (a search choosing
        knobs for a shape, before the dtypes are crossed in) an expression naming one holds.
        """
        names = {**dict(case.params), **dict(case.knobs), "backend": case.backend,
                 "dtype_in": case.dtype_in, "dtype_out": case.dtype_out, "device": device}
        unset = {k for b in self.backends for k, _ in b.knobs} - set(dict(case.knobs))
        if unset.intersection(code.co_names):
            return False
        if not dtypes and {"dtype_in", "dtype_out"}.intersection(code.co_names):
            return True
        try:
            return bool(eval(code, {"__builtins__": _SAFE_FUNCS}, names))
        except Exception as exc:  # a typo'd expression must not pass silently
            raise ConfigError(self.path, key, f"{source!r} failed on case {case.id}: {exc}") from None


def load(path: Path, op_params: tuple[str, ...], op_defaults: dict, op_name: Optional[str] = None,
         op_types: Optional[dict] = None, max_cases: Optional[int] = None) -> OpConfig:
    """Read and validate one config file against its op's parameter columns (int unless op_types says).

    A grid of more than max_cases cases is refused here, counted without expanding a range.
    """
    path = Path(path)
    raw = _read_yaml(path)
    if not isinstance(raw, dict):
        raise ConfigError(path, "", f"expected a mapping of config keys at the top level, got {_kind(raw)}")
    unknown = sorted(set(map(str, raw)) - TOP_KEYS)
    if unknown:
        raise ConfigError(path, unknown[0], f"unknown key; expected one of {sorted(TOP_KEYS)}")
    op = raw.get("op", op_name)
    if op_name is not None and op != op_name:
        raise ConfigError(path, "op", f"this file is read for op {op_name!r} but says {op!r}")

    columns = tuple(c.lower() for c in op_params)
    params = _parse_params(path, raw.get("params", {}))
    zip_groups = _parse_zip(path, raw.get("zip", []), params)
    params = _distinct(params, keep={n for g in zip_groups for n in g})
    cases = _parse_cases(path, raw.get("cases"), params, columns, op_defaults)
    if cases is None:
        unknown = sorted(set(params) - set(columns))
        if unknown:
            raise ConfigError(path, f"params.{unknown[0]}", f"unknown parameter of op {op!r}; expected one of {list(columns)}")
        for column in columns:
            if column not in params:
                if column not in op_defaults:
                    raise ConfigError(path, "params", f"missing parameter {column!r} of op {op!r} (parameters: {list(columns)})")
                params[column] = [op_defaults[column]]
    _check_types(path, params, cases, {c: (op_types or {}).get(c, int) for c in columns})
    backends = _parse_backends(path, raw, columns)
    names = _expression_names(columns, backends)
    cfg = OpConfig(
        path=path,
        op=op,
        backends=backends,
        dtypes=_parse_dtypes(path, raw.get("dtypes")),
        params=params,
        zip_groups=zip_groups,
        cases=cases,
        exclude=_parse_exclude(path, raw.get("exclude"), names),
        tolerance=_parse_tolerance(path, raw.get("tolerance")),
        timer=_choice(path, raw, "timer", sorted(timing.TIMERS)),
        cache=_choice(path, raw, "cache", list(timing.CACHES)),
        max_regression=_parse_max_regression(path, raw.get("max_regression"), names),
        param_keys={str(n).lower(): f"params.{n}" for n in raw.get("params") or {}},
    )
    if max_cases is not None:
        _check_size(cfg, max_cases)
    return cfg


def _check_size(cfg: OpConfig, max_cases: int) -> None:
    count = cfg.count()
    if count > max_cases:
        factors = " x ".join(f"{key}: {n}" for key, n in cfg.factors() if n > 1)
        raise ConfigError(cfg.path, "", f"the grid has {count} cases, more than --opperf-max-cases={max_cases} "
                                        f"({factors}); narrow these or raise the limit")


# --- YAML ----------------------------------------------------------------------------------


# libyaml's parser where PyYAML was built with it (12x faster on the shipped configs), the
# pure-Python one otherwise; the constructor is PyYAML's safe one either way.
_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _StrictLoader(_SafeLoader):
    """A safe loader that refuses duplicate keys instead of keeping the last one."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    mapping = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in mapping:
            mark = key_node.start_mark
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", mark)
        mapping[key] = loader.construct_object(value_node, deep=deep)
    return mapping


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _read_yaml(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(path, "", f"cannot read: {exc.strerror}") from None
    try:
        return yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(path, "", f"invalid YAML{where}: {problem}") from None


# --- sections ------------------------------------------------------------------------------


def _parse_backends(path: Path, raw: dict, columns: tuple = ()) -> list[BackendSpec]:
    if "backend" in raw and "backends" in raw:
        raise ConfigError(path, "backends", "give either 'backend' (with 'backend_version') or 'backends', not both")
    if "backend" in raw:
        name = raw["backend"]
        if not isinstance(name, str) or not name:
            raise ConfigError(path, "backend", f"expected a backend name, got {_kind(name)}")
        version = raw.get("backend_version")
        if version is not None and not isinstance(version, (str, int, float)):
            raise ConfigError(path, "backend_version", f"expected a version string, got {_kind(version)}")
        return [BackendSpec(name, _pin(path, "backend_version", version), ())]
    if "backend_version" in raw:
        raise ConfigError(path, "backend_version", "goes with 'backend'; under 'backends' give each backend its 'version'")
    spec = raw.get("backends")
    if spec is None:
        raise ConfigError(path, "backend", "missing: name the backend(s) to run ('backend: torch' or 'backends: [...]')")
    if isinstance(spec, str):
        spec = [spec]
    if isinstance(spec, list):
        out = []
        for i, name in enumerate(spec):
            if not isinstance(name, str) or not name:
                raise ConfigError(path, f"backends[{i}]", f"expected a backend name, got {_kind(name)}")
            out.append(BackendSpec(name, None, ()))
        if not out:
            raise ConfigError(path, "backends", "expected at least one backend")
        return out
    if isinstance(spec, dict):
        out = []
        for name, body in spec.items():
            key = f"backends.{name}"
            if body is None or isinstance(body, (str, int, float)):
                out.append(BackendSpec(str(name), _pin(path, key, body), ()))
                continue
            if not isinstance(body, dict):
                raise ConfigError(path, key, f"expected a version string or a mapping with {sorted(BACKEND_KEYS)}, got {_kind(body)}")
            unknown = sorted(set(body) - BACKEND_KEYS)
            if unknown:
                raise ConfigError(path, f"{key}.{unknown[0]}", f"unknown key; expected one of {sorted(BACKEND_KEYS)}")
            knobs = _distinct(_parse_params(path, body.get("knobs") or {}, prefix=f"{key}.knobs"))
            out.append(BackendSpec(str(name), _pin(path, f"{key}.version", body.get("version")),
                                   tuple((k, v if isinstance(v, _Range) else tuple(v)) for k, v in knobs.items()),
                                   **_tuning(path, key, body, knobs, columns)))
        if not out:
            raise ConfigError(path, "backends", "expected at least one backend")
        return out
    raise ConfigError(path, "backends", f"expected a list of names or a mapping name -> version, got {_kind(spec)}")


def _tuning(path: Path, key: str, body: dict, knobs: dict, columns: tuple) -> dict:
    """A backend's constraints, default and search: they only mean something with knobs."""
    from pytest_opperf.run import search

    given = [k for k in ("constraints", "default", "search") if k in body]
    if given and not knobs:
        raise ConfigError(path, f"{key}.{given[0]}", "goes with knobs: give the backend 'knobs' to sweep")
    allowed = set(columns) | set(knobs) | {"dtype_in", "dtype_out", "device"} | set(_SAFE_FUNCS)
    spec = body.get("constraints")
    items = [] if spec is None else spec if isinstance(spec, list) else [spec]
    constraints = []
    for i, source in enumerate(items):
        where = f"{key}.constraints" if not isinstance(spec, list) else f"{key}.constraints[{i}]"
        constraints.append((where, source, _compile_expression(path, where, source, allowed)))
    default = body.get("default", False)
    if not isinstance(default, bool):
        raise ConfigError(path, f"{key}.default", f"expected true or false, got {_kind(default)}")
    try:
        method = search.parse(body.get("search"))
    except search.SearchSpecError as exc:
        raise ConfigError(path, f"{key}.search{exc.field}", str(exc)) from None
    return {"constraints": tuple(constraints), "default": default, "search": method}


def _pin(path: Path, key: str, version: Any) -> Optional[str]:
    if version is None:
        return None
    pin = str(version).strip()
    if pin[:1] in "<>=!~":
        from packaging.specifiers import InvalidSpecifier, SpecifierSet

        try:
            SpecifierSet(pin)
        except InvalidSpecifier:
            raise ConfigError(path, key, f"{pin!r} is neither a version nor a PEP 440 specifier such as '>=2.4'") from None
    return pin


def _parse_dtypes(path: Path, spec: Any) -> list[tuple[str, str]]:
    if spec is None:
        raise ConfigError(path, "dtypes", "missing: expected e.g. 'bf16', [fp16, bf16] or {input: fp8, output: bf16}")
    items = spec if isinstance(spec, list) else [spec]
    if not items:
        raise ConfigError(path, "dtypes", "expected at least one dtype")
    out = []
    for i, item in enumerate(items):
        key = "dtypes" if not isinstance(spec, list) else f"dtypes[{i}]"
        if isinstance(item, str):
            din = dout = _dtype(path, key, item)
        elif isinstance(item, dict):
            unknown = sorted(set(item) - {"input", "output"})
            if unknown:
                raise ConfigError(path, f"{key}.{unknown[0]}", "unknown key; expected 'input' and 'output'")
            if "input" not in item:
                raise ConfigError(path, f"{key}.input", "missing: the input dtype")
            din = _dtype(path, f"{key}.input", item["input"])
            dout = _dtype(path, f"{key}.output", item.get("output", item["input"]))
        else:
            raise ConfigError(path, key, f"expected a dtype name or {{input: ..., output: ...}}, got {_kind(item)}")
        if (din, dout) not in out:
            out.append((din, dout))
    return out


def _dtype(path: Path, key: str, name: Any) -> str:
    if not isinstance(name, str):
        raise ConfigError(path, key, f"expected a dtype name, got {_kind(name)}")
    try:
        return dtype_table.lookup(name).name
    except KeyError:
        raise ConfigError(path, key, f"unknown dtype {name!r}; expected one of {dtype_table.known_names()}") from None


def _parse_params(path: Path, spec: Any, prefix: str = "params") -> dict[str, list]:
    if not isinstance(spec, dict):
        raise ConfigError(path, prefix, f"expected a mapping of parameter -> values, got {_kind(spec)}")
    out: dict[str, list] = {}
    for name, value in spec.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ConfigError(path, f"{prefix}.{name}", "parameter names must be identifiers")
        column = name.lower()
        key = f"{prefix}.{name}"
        if column in out:
            raise ConfigError(path, key, f"given twice (names are case-insensitive: {column!r})")
        if isinstance(value, dict):
            out[column] = _Range.parse(path, key, value)
        elif isinstance(value, list):
            if not value:
                raise ConfigError(path, key, "expected at least one value")
            for i, v in enumerate(value):
                if not isinstance(v, SCALAR_TYPES):
                    raise ConfigError(path, f"{key}[{i}]", f"expected a number or string, got {_kind(v)}")
            out[column] = list(value)
        elif isinstance(value, SCALAR_TYPES):
            out[column] = [value]
        else:
            raise ConfigError(path, key, f"expected a list, a value or {{min, max, step|mul}}, got {_kind(value)}")
    return out


def _distinct(params: dict, keep: set = frozenset()) -> dict:
    """Each list's repeated values dropped, except in the parameters named in `keep`.

    A zipped parameter keeps its repeats: its i-th value pairs with the i-th of its group, so
    m: [128, 128, 256] zipped with n: [1, 2, 3] is the shapes (128, 1), (128, 2), (256, 3).
    """
    return {n: v if n in keep or isinstance(v, _Range) else list(dict.fromkeys(v)) for n, v in params.items()}


class _Range(Sequence):
    """{min, max, step} or {min, max, mul}: a lazily expanded sequence whose length is arithmetic.

    The length counts the numbers the file wrote (0.1 is one tenth, not the binary float next to
    it), so rounding never adds or drops the last value; the values themselves are computed as
    `min + i * step` and `min * mul ** i`.

    >>> len(_Range(0.1, 0.3, step=0.1)), list(_Range(3, 100, mul=3)), len(_Range(1, 10**12, step=1))
    (3, [3, 9, 27, 81], 1000000000000)
    """

    def __init__(self, start, stop, step=None, mul=None, key: str = ""):
        # Integral floats (YAML's 2.0) become ints, so an int parameter's range stays exact.
        self.start, self.stop, self.step, self.mul = _tidy(start), stop, _tidy(step), _tidy(mul)
        self.key = key
        self.length = self._arithmetic_length() if step is not None else self._geometric_length()

    @classmethod
    def parse(cls, path: Path, key: str, spec: dict) -> "_Range":
        unknown = sorted(set(spec) - RANGE_KEYS)
        if unknown:
            raise ConfigError(path, f"{key}.{unknown[0]}", f"unknown key; a range is {{min, max, step}} or {{min, max, mul}}")
        for field in ("min", "max"):
            if field not in spec:
                raise ConfigError(path, f"{key}.{field}", "missing: a range needs min and max")
            _finite(path, f"{key}.{field}", spec[field])
        lo, hi = spec["min"], spec["max"]
        if lo > hi:
            raise ConfigError(path, key, f"min ({lo}) is greater than max ({hi})")
        if ("step" in spec) == ("mul" in spec):
            raise ConfigError(path, key, "give exactly one of 'step' (arithmetic) or 'mul' (geometric)")
        if "step" in spec:
            step = _finite(path, f"{key}.step", spec["step"])
            if step <= 0:
                raise ConfigError(path, f"{key}.step", f"expected a number > 0, got {step}")
            return cls(lo, hi, step=step, key=key)
        mul = _finite(path, f"{key}.mul", spec["mul"])
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
        # A range this long with a many-digit mul: the float value with the old 1e-9 slack.
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
            yield _tidy(self._value(i))

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self.length))]
        if not -self.length <= i < self.length:
            raise IndexError(f"range index {i} out of range")
        return _tidy(self._value(i % self.length))

    def __eq__(self, other) -> bool:
        return isinstance(other, _Range) and self._spec() == other._spec()

    def __hash__(self) -> int:
        return hash(self._spec())

    def _spec(self) -> tuple:
        return self.start, self.stop, self.step, self.mul

    def __repr__(self) -> str:
        kind = f"step={self.step}" if self.step is not None else f"mul={self.mul}"
        return f"_Range(min={self.start}, max={self.stop}, {kind}: {self.length} values)"


_EXACT_BITS = 1 << 17  # a few milliseconds of big-integer powers at most


def _check_types(path: Path, params: dict, cases: Optional[list[dict]], types: dict) -> None:
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
        if isinstance(values, _Range):
            _check_range_type(path, values, kind)
            continue
        for i, value in enumerate(values):
            if not ok(value, kind):
                key = f"params.{name}" if len(values) == 1 else f"params.{name}[{i}]"
                raise ConfigError(path, key, f"expected {kind.__name__} values for this parameter, got {_kind(value)}")
    for i, row in enumerate(cases or []):
        for name, value in row.items():
            kind = types.get(name)
            if kind is not None and not ok(value, kind):
                raise ConfigError(path, f"cases[{i}].{name}", f"expected {kind.__name__}, got {_kind(value)}")


def _check_range_type(path: Path, rng: _Range, kind: type) -> None:
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
                              f"expected int values for this parameter, so an int {field}, got {_kind(value)}")


def _parse_zip(path: Path, spec: Any, params: dict) -> list[list[str]]:
    if spec in (None, []):
        return []
    if isinstance(spec, list) and spec and all(isinstance(s, str) for s in spec):
        spec = [spec]  # a single group written flat: zip: [m, n]
    if not isinstance(spec, list) or not all(isinstance(g, list) for g in spec):
        raise ConfigError(path, "zip", "expected a list of parameter groups, e.g. [[m, n, k]]")
    groups, used = [], set()
    for i, group in enumerate(spec):
        names = [str(n).lower() for n in group]
        if len(names) < 2:
            raise ConfigError(path, f"zip[{i}]", "a group zips two or more parameters")
        for n in names:
            if n not in params:
                raise ConfigError(path, f"zip[{i}]", f"{n!r} is not in params")
            if n in used:
                raise ConfigError(path, f"zip[{i}]", f"{n!r} is in two groups")
            used.add(n)
        lengths = {n: len(params[n]) for n in names}
        if len(set(lengths.values())) != 1:
            raise ConfigError(path, f"zip[{i}]", f"zipped parameters need equally many values, got {lengths}")
        groups.append(names)
    return groups


def _parse_cases(path: Path, spec: Any, params: dict, columns: tuple, defaults: dict) -> Optional[list[dict]]:
    if spec is None:
        return None
    if not isinstance(spec, list) or not spec:
        raise ConfigError(path, "cases", f"expected a non-empty list of {{param: value}} mappings, got {_kind(spec)}")
    for name, values in params.items():
        if len(values) != 1:
            raise ConfigError(path, f"params.{name}", "with 'cases', params may only fix single values shared by all cases")
        if name not in columns:
            raise ConfigError(path, f"params.{name}", f"unknown parameter; expected one of {list(columns)}")
    rows = []
    for i, row in enumerate(spec):
        key = f"cases[{i}]"
        if not isinstance(row, dict):
            raise ConfigError(path, key, f"expected a mapping of parameter -> value, got {_kind(row)}")
        case = {}
        for name, value in row.items():
            column = str(name).lower()
            if column not in columns:
                raise ConfigError(path, f"{key}.{name}", f"unknown parameter; expected one of {list(columns)}")
            if not isinstance(value, SCALAR_TYPES):
                raise ConfigError(path, f"{key}.{name}", f"expected a number or string, got {_kind(value)}")
            case[column] = value
        for column in columns:
            if column not in case and column not in params:
                if column not in defaults:
                    raise ConfigError(path, key, f"missing parameter {column!r}")
                case[column] = defaults[column]
        rows.append(case)
    return rows


_SAFE_FUNCS = {"min": min, "max": max, "abs": abs}
_SAFE_NODES = (
    ast.Expression, ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.Compare, ast.Name, ast.Load,
    ast.Constant, ast.Tuple, ast.List, ast.And, ast.Or, ast.Not, ast.Add, ast.Sub, ast.Mult,
    ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.USub, ast.UAdd, ast.Eq, ast.NotEq, ast.Lt,
    ast.LtE, ast.Gt, ast.GtE, ast.In, ast.NotIn, ast.Call, ast.IfExp,
)


def _expression_names(columns: tuple, backends: list[BackendSpec]) -> set[str]:
    """Names an expression (exclude, max_regression) may use: parameters, knobs, case fields, functions."""
    knobs = {k for b in backends for k, _ in b.knobs}
    return set(columns) | knobs | {"backend", "dtype_in", "dtype_out", "device"} | set(_SAFE_FUNCS)


def _compile_expression(path: Path, key: str, source: Any, allowed: set[str]) -> Any:
    """Parse and vet an expression: arithmetic, comparisons, and/or/not, min/max/abs over known names."""
    if not isinstance(source, str):
        raise ConfigError(path, key, f"expected an expression string such as 'm * k > 2**28', got {_kind(source)}")
    try:
        tree = ast.parse(source, mode="eval")
    except SyntaxError as exc:
        raise ConfigError(path, key, f"{source!r} is not a valid expression: {exc.msg}") from None
    for node in ast.walk(tree):
        if not isinstance(node, _SAFE_NODES):
            raise ConfigError(path, key, f"{source!r}: {type(node).__name__} is not allowed; use arithmetic, comparisons, and/or/not, min/max/abs")
        if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id in _SAFE_FUNCS):
            raise ConfigError(path, key, f"{source!r}: only min, max and abs may be called")
        if isinstance(node, ast.Name) and node.id not in allowed:
            raise ConfigError(path, key, f"{source!r}: unknown name {node.id!r}; expected one of {sorted(allowed)}")
    return compile(tree, f"{path}:{key}", "eval")


def _parse_exclude(path: Path, spec: Any, allowed: set[str]) -> list[tuple[str, Any]]:
    if spec is None:
        return []
    items = spec if isinstance(spec, list) else [spec]
    out = []
    for i, source in enumerate(items):
        key = "exclude" if not isinstance(spec, list) else f"exclude[{i}]"
        out.append((source, _compile_expression(path, key, source, allowed)))
    return out


def _parse_max_regression(path: Path, spec: Any, allowed: set[str]) -> list[tuple]:
    """`max_regression: 10%` (every case) or a mapping {expression: threshold}, first match wins."""
    if spec is None:
        return []
    if not isinstance(spec, dict):
        return [(None, None, _threshold(path, "max_regression", spec))]
    if not spec:
        raise ConfigError(path, "max_regression", "expected a threshold such as 10% or a mapping {expression: threshold}")
    out = []
    for source, value in spec.items():
        if source is True:  # YAML reads an unquoted `true:` key as a boolean: the catch-all
            source = "True"
        key = f"max_regression[{source}]"
        out.append((source, _compile_expression(path, key, source, allowed), _threshold(path, key, value)))
    return out


def _threshold(path: Path, key: str, value: Any) -> float:
    try:
        return parse_fraction(value)
    except ValueError:
        raise ConfigError(path, key, f"expected a threshold above zero such as 10% or 0.1, got {_kind(value)}") from None


def _parse_tolerance(path: Path, spec: Any) -> dict[str, float]:
    if spec is None:
        return {}
    if not isinstance(spec, dict):
        raise ConfigError(path, "tolerance", f"expected a mapping dtype -> max normwise relative error, got {_kind(spec)}")
    out = {}
    for name, value in spec.items():
        dt = _dtype(path, f"tolerance.{name}", name)
        tol = _number(path, f"tolerance.{name}", value)
        if tol < 0:
            raise ConfigError(path, f"tolerance.{name}", f"expected a number >= 0, got {tol}")
        out[dt] = float(tol)
    return out


def _choice(path: Path, raw: dict, key: str, known: list[str]) -> Optional[str]:
    """An optional name that must be one of `known` (read when the config loads, before any case runs)."""
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or value not in known:
        raise ConfigError(path, key, f"expected one of {known}, got {_kind(value)}")
    return value


# --- helpers -------------------------------------------------------------------------------


def _knob_sets(backend: BackendSpec) -> int:
    """How many knob combinations a backend runs per shape and dtype: its grid, or the search's
    sample of it, and its default."""
    grid = math.prod(len(v) for _, v in backend.knobs)
    if backend.search is not None:
        grid = min(grid, backend.search.samples)
    return grid + (1 if backend.default and backend.knobs else 0)


def _grid(params: dict, zip_groups: list[list[str]]) -> Iterator[dict]:
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


def _number(path: Path, key: str, value: Any):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(path, key, f"expected a number, got {_kind(value)}")
    return value


def _finite(path: Path, key: str, value: Any):
    if not math.isfinite(_number(path, key, value)):
        raise ConfigError(path, key, f"expected a finite number, got {value}")
    return value


def _exact(x) -> Fraction:
    """The number as the file wrote it: a float's shortest decimal (0.1 -> 1/10), an int as is."""
    return Fraction(repr(x)) if isinstance(x, float) else Fraction(x)


def _tidy(v):
    """Keep integer grids integer: 2 * 2.0 ** 3 -> 16."""
    if isinstance(v, float) and v.is_integer() and abs(v) < 2**53:
        return int(v)
    return v


def _kind(value: Any) -> str:
    if value is None:
        return "nothing"
    return f"{type(value).__name__} {value!r}" if not isinstance(value, (dict, list)) else type(value).__name__
