"""configs/<op>.yaml -> validated OpConfig -> Cases.

The seed form works verbatim::

    backend: deep_gemm
    backend_version: "2.1.1+c9f8b34"
    dtypes: {'input': 'fp8', 'output': 'bf16'}
    params:
      M: {min: 2, max: 4, step: 2}
      N: [8192]
      K: [1536]

`load` reads the file (yamlfile.py) and validates it section by section into an OpConfig:
parameter values and ranges come from grid.py, expressions (exclude, max_regression,
constraints) from expressions.py. `OpConfig.expand` yields the Cases. Every error is a
ConfigError naming the file, the key and what was expected.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Collection, Iterator, Optional

from pytest_opperf.amounts import parse_fraction
from pytest_opperf.case import Case, format_value
from pytest_opperf import dtypes as dtype_table
from pytest_opperf.config import expressions
from pytest_opperf.config.grid import SCALAR_TYPES, Range, check_types, distinct, grid, parse_params
from pytest_opperf.files import short
from pytest_opperf.config.yamlfile import ConfigError, describe, number, read_yaml

TOP_KEYS = {
    "op", "description", "backend", "backend_version", "backends", "dtypes", "params",
    "zip", "cases", "exclude", "tolerance", "timer", "cache", "max_regression",
}
BACKEND_KEYS = {"version", "knobs", "constraints", "default", "search"}
# What a `cases:` row may say besides its parameters: the backend(s) and dtypes it runs with, and
# the inputs the cache state "resident" keeps in the cache (positions among its input tensors).
ROW_KEYS = {"backend", "dtypes", "resident"}


def load(path: Path, op_params: tuple[str, ...], op_defaults: dict, op_name: Optional[str] = None,
         op_types: Optional[dict] = None, max_cases: Optional[int] = None,
         timers: Optional[Collection[str]] = None, caches: Optional[Collection[str]] = None) -> OpConfig:
    """Read and validate one config file against its op's parameter columns (int unless op_types says).

    A grid of more than max_cases cases is refused here, counted without expanding a range.
    `timers` and `caches` are the names `timer:` and `cache:` may take (the measuring layer's);
    None accepts any name, for a reader that never times a case.
    """
    path = Path(path)
    raw = read_yaml(path)
    if not isinstance(raw, dict):
        raise ConfigError(path, "", f"expected a mapping of config keys at the top level, got {describe(raw)}")
    unknown = sorted(set(map(str, raw)) - TOP_KEYS)
    if unknown:
        raise ConfigError(path, unknown[0], f"unknown key; expected one of {sorted(TOP_KEYS)}")
    op = raw.get("op", op_name)
    if not isinstance(op, str) or not op:
        raise ConfigError(path, "op", f"expected the name of an op, got {describe(op)}")
    if op_name is not None and op != op_name:
        raise ConfigError(path, "op", f"this file is read for op {op_name!r} but says {short(op)}")
    if not isinstance(raw.get("description", ""), str):
        raise ConfigError(path, "description", f"expected a string, got {describe(raw['description'])}")

    columns = tuple(c.lower() for c in op_params)
    params = parse_params(path, raw.get("params", {}))
    zip_groups = _parse_zip(path, raw.get("zip", []), params)
    params = distinct(params, keep={n for g in zip_groups for n in g})
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
    check_types(path, params, None if cases is None else [row.params for row in cases],
                {c: (op_types or {}).get(c, int) for c in columns})
    backends = _parse_backends(path, raw, columns)
    _check_row_backends(path, cases, backends)
    names = expressions.names(columns, {k for b in backends for k, _ in b.knobs})
    cfg = OpConfig(
        path=path,
        op=op,
        backends=backends,
        dtypes=_file_dtypes(path, raw.get("dtypes"), cases),
        params=params,
        zip_groups=zip_groups,
        cases=cases,
        exclude=_parse_exclude(path, raw.get("exclude"), names),
        tolerance=_parse_tolerance(path, raw.get("tolerance")),
        timer=_choice(path, raw, "timer", None if timers is None else sorted(timers)),
        cache=_choice(path, raw, "cache", None if caches is None else list(caches)),
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


# --- sections ----------------------------------------------------------------------------------


def _parse_backends(path: Path, raw: dict, columns: tuple = ()) -> list[BackendSpec]:
    if "backend" in raw and "backends" in raw:
        raise ConfigError(path, "backends", "give either 'backend' (with 'backend_version') or 'backends', not both")
    if "backend" in raw:
        name = raw["backend"]
        if not isinstance(name, str) or not name:
            raise ConfigError(path, "backend", f"expected a backend name, got {describe(name)}")
        version = raw.get("backend_version")
        if version is not None and not isinstance(version, (str, int, float)):
            raise ConfigError(path, "backend_version", f"expected a version string, got {describe(version)}")
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
                raise ConfigError(path, f"backends[{i}]", f"expected a backend name, got {describe(name)}")
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
                raise ConfigError(path, key, f"expected a version string or a mapping with {sorted(BACKEND_KEYS)}, got {describe(body)}")
            unknown = sorted(set(body) - BACKEND_KEYS)
            if unknown:
                raise ConfigError(path, f"{key}.{unknown[0]}", f"unknown key; expected one of {sorted(BACKEND_KEYS)}")
            knobs = distinct(parse_params(path, body.get("knobs") or {}, prefix=f"{key}.knobs"))
            out.append(BackendSpec(str(name), _pin(path, f"{key}.version", body.get("version")),
                                   tuple((k, v if isinstance(v, Range) else tuple(v)) for k, v in knobs.items()),
                                   **_tuning(path, key, body, knobs, columns)))
        if not out:
            raise ConfigError(path, "backends", "expected at least one backend")
        return out
    raise ConfigError(path, "backends", f"expected a list of names or a mapping name -> version, got {describe(spec)}")


def _tuning(path: Path, key: str, body: dict, knobs: dict, columns: tuple) -> dict:
    """A backend's constraints, default and search: they only mean something with knobs."""
    from pytest_opperf.config import search

    given = [k for k in ("constraints", "default", "search") if k in body]
    if given and not knobs:
        raise ConfigError(path, f"{key}.{given[0]}", "goes with knobs: give the backend 'knobs' to sweep")
    # A constraint is about one backend's knobs: it has no `backend` to name.
    allowed = expressions.names(columns, knobs, fields=("dtype_in", "dtype_out", "device"))
    spec = body.get("constraints")
    items = [] if spec is None else spec if isinstance(spec, list) else [spec]
    constraints = []
    for i, source in enumerate(items):
        where = f"{key}.constraints" if not isinstance(spec, list) else f"{key}.constraints[{i}]"
        constraints.append((where, source, expressions.compile_expression(path, where, source, allowed)))
    default = body.get("default", False)
    if not isinstance(default, bool):
        raise ConfigError(path, f"{key}.default", f"expected true or false, got {describe(default)}")
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
            raise ConfigError(path, key, f"{short(pin)} is neither a version nor a PEP 440 specifier such as '>=2.4'") from None
    return pin


def _file_dtypes(path: Path, spec: Any, rows: Optional[list[CaseRow]]) -> list[tuple[str, str]]:
    """The file's `dtypes:`; without one, those its `cases:` rows name, when every row names its own."""
    if spec is None and rows and all(row.dtypes is not None for row in rows):
        return list(dict.fromkeys(pair for row in rows for pair in row.dtypes))
    return _parse_dtypes(path, spec)


def _parse_dtypes(path: Path, spec: Any, where: str = "dtypes") -> list[tuple[str, str]]:
    if spec is None:
        raise ConfigError(path, where, "missing: expected e.g. 'bf16', [fp16, bf16] or {input: fp8, output: bf16}")
    items = spec if isinstance(spec, list) else [spec]
    if not items:
        raise ConfigError(path, where, "expected at least one dtype")
    out = []
    for i, item in enumerate(items):
        key = where if not isinstance(spec, list) else f"{where}[{i}]"
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
            raise ConfigError(path, key, f"expected a dtype name or {{input: ..., output: ...}}, got {describe(item)}")
        if (din, dout) not in out:
            out.append((din, dout))
    return out


def _dtype(path: Path, key: str, name: Any) -> str:
    if not isinstance(name, str):
        raise ConfigError(path, key, f"expected a dtype name, got {describe(name)}")
    try:
        return dtype_table.lookup(name).name
    except KeyError:
        raise ConfigError(path, key, f"unknown dtype {short(name)}; expected one of {dtype_table.known_names()}") from None


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
                raise ConfigError(path, f"zip[{i}]", f"{short(n)} is not in params")
            if n in used:
                raise ConfigError(path, f"zip[{i}]", f"{short(n)} is in two groups")
            used.add(n)
        lengths = {n: len(params[n]) for n in names}
        if len(set(lengths.values())) != 1:
            raise ConfigError(path, f"zip[{i}]", f"zipped parameters need equally many values, got {short(lengths)}")
        groups.append(names)
    return groups


def _parse_cases(path: Path, spec: Any, params: dict, columns: tuple, defaults: dict) -> Optional[list[CaseRow]]:
    if spec is None:
        return None
    if not isinstance(spec, list) or not spec:
        raise ConfigError(path, "cases", f"expected a non-empty list of {{param: value}} mappings, got {describe(spec)}")
    for name, values in params.items():
        if len(values) != 1:
            raise ConfigError(path, f"params.{name}", "with 'cases', params may only fix single values shared by all cases")
        if name not in columns:
            raise ConfigError(path, f"params.{name}", f"unknown parameter; expected one of {list(columns)}")
    rows = []
    for i, row in enumerate(spec):
        key = f"cases[{i}]"
        if not isinstance(row, dict):
            raise ConfigError(path, key, f"expected a mapping of parameter -> value, got {describe(row)}")
        case = {}
        for name, value in row.items():
            column = str(name).lower()
            if column in ROW_KEYS and column not in columns:
                continue
            if column not in columns:
                raise ConfigError(path, f"{key}.{name}", f"unknown parameter; expected one of {list(columns)} "
                                                         f"or {sorted(ROW_KEYS)}")
            if not isinstance(value, SCALAR_TYPES):
                raise ConfigError(path, f"{key}.{name}", f"expected a number or string, got {describe(value)}")
            case[column] = value
        for column in columns:
            if column not in case and column not in params:
                if column not in defaults:
                    raise ConfigError(path, key, f"missing parameter {column!r}")
                case[column] = defaults[column]
        rows.append(CaseRow(case, _row_backends(path, key, row.get("backend")),
                            None if row.get("dtypes") is None else tuple(_parse_dtypes(path, row["dtypes"], f"{key}.dtypes")),
                            _row_resident(path, key, row.get("resident"))))
    return rows


def _row_resident(path: Path, key: str, spec: Any) -> tuple:
    """A row's `resident:`, positions among the case's input tensors: [0, 2]; () when it names none."""
    if spec is None:
        return ()
    if not isinstance(spec, list) or not all(type(i) is int and i >= 0 for i in spec):
        raise ConfigError(path, f"{key}.resident", f"expected a list of input tensor positions (integers >= 0, "
                                                   f"as [0, 2]), got {describe(spec)}")
    return tuple(sorted(set(spec)))


def _row_backends(path: Path, key: str, spec: Any) -> Optional[tuple[str, ...]]:
    """A row's `backend:`, one name or a list of them; None when the row names none."""
    if spec is None:
        return None
    names = spec if isinstance(spec, list) else [spec]
    if not names or not all(isinstance(n, str) and n for n in names):
        raise ConfigError(path, f"{key}.backend", f"expected a backend name or a list of them, got {describe(spec)}")
    return tuple(dict.fromkeys(names))


def _check_row_backends(path: Path, rows: Optional[list[CaseRow]], backends: list[BackendSpec]) -> None:
    """A row runs on backends the file names (their versions and knobs are set there)."""
    known = [b.name for b in backends]
    for i, row in enumerate(rows or []):
        for name in row.backends or ():
            if name not in known:
                raise ConfigError(path, f"cases[{i}].backend",
                                  f"unknown backend {short(name)}; expected one of the file's backends {known}")


def _parse_exclude(path: Path, spec: Any, allowed: set[str]) -> list[tuple[str, Any]]:
    if spec is None:
        return []
    items = spec if isinstance(spec, list) else [spec]
    out = []
    for i, source in enumerate(items):
        key = "exclude" if not isinstance(spec, list) else f"exclude[{i}]"
        out.append((source, expressions.compile_expression(path, key, source, allowed)))
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
        out.append((source, expressions.compile_expression(path, key, source, allowed), _threshold(path, key, value)))
    return out


def _threshold(path: Path, key: str, value: Any) -> float:
    try:
        return parse_fraction(value)
    except ValueError:
        raise ConfigError(path, key, f"expected a threshold above zero such as 10% or 0.1, got {describe(value)}") from None


def _parse_tolerance(path: Path, spec: Any) -> dict[str, float]:
    if spec is None:
        return {}
    if not isinstance(spec, dict):
        raise ConfigError(path, "tolerance", f"expected a mapping dtype -> max normwise relative error, got {describe(spec)}")
    out = {}
    for name, value in spec.items():
        dt = _dtype(path, f"tolerance.{name}", name)
        tol = number(path, f"tolerance.{name}", value)
        if tol < 0:
            raise ConfigError(path, f"tolerance.{name}", f"expected a number >= 0, got {tol}")
        out[dt] = float(tol)
    return out


def _choice(path: Path, raw: dict, key: str, known: Optional[list[str]]) -> Optional[str]:
    """An optional name that must be one of `known` (read when the config loads, before any case runs)."""
    value = raw.get(key)
    if value is None:
        return None
    if known is None and isinstance(value, str) and value:
        return value
    if not isinstance(value, str) or value not in (known or ()):
        expected = f"one of {known}" if known is not None else "a name"
        raise ConfigError(path, key, f"expected {expected}, got {describe(value)}")
    return value


# --- the validated config and its cases --------------------------------------------------------


@dataclass(frozen=True)
class CaseRow:
    """One row of `cases:`: its parameters, and the backends and dtypes it is limited to (None: the file's)."""

    params: dict
    backends: Optional[tuple[str, ...]] = None
    dtypes: Optional[tuple[tuple[str, str], ...]] = None
    resident: tuple = ()  # positions among the input tensors the cache state "resident" reads first


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
    cases: Optional[list[CaseRow]]
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
        if self.cases is not None and any(row.backends or row.dtypes for row in self.cases):
            # Rows limited to their own backends or dtypes: no product, each row counted on its own.
            return [("cases", sum(sum(_knob_sets(b) for b in self._backends_of(row)) * len(row.dtypes or self.dtypes)
                                  for row in self.cases))]
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
        for shape, row in self._shapes():
            ordered = tuple((c, shape[c]) for c in columns)
            for backend in self._backends_of(row):
                for knobs in self._knob_sets(backend, ordered, device):
                    for din, dout in (row.dtypes if row is not None and row.dtypes else self.dtypes):
                        case = Case(self.op, backend.name, backend.version, din, dout, ordered, knobs,
                                    row.resident if row is not None else ())
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
                    return f"{self.path}: {key}: {short(source)} does not hold ({used})"
        return None

    def _shapes(self) -> Iterator[tuple[dict, Optional[CaseRow]]]:
        """Each shape, with the `cases:` row it comes from (None for a grid's)."""
        if self.cases is not None:
            fixed = {k: v[0] for k, v in self.params.items()}
            for row in self.cases:
                yield {**fixed, **row.params}, row
            return
        for shape in grid(self.params, self.zip_groups):
            yield shape, None

    def _backends_of(self, row: Optional[CaseRow]) -> list[BackendSpec]:
        """The backends a row runs on: those it names, else the file's."""
        if row is None or row.backends is None:
            return self.backends
        return [b for b in self.backends if b.name in row.backends]

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
            return bool(expressions.evaluate(code, names))
        except Exception as exc:  # a typo'd expression must not pass silently
            raise ConfigError(self.path, key, f"{short(source)} failed on case {case.id}: {exc}") from None


def _knob_sets(backend: BackendSpec) -> int:
    """How many knob combinations a backend runs per shape and dtype: its grid, or the search's
    sample of it, and its default."""
    grid = math.prod(len(v) for _, v in backend.knobs)
    if backend.search is not None:
        grid = min(grid, backend.search.samples)
    return grid + (1 if backend.default and backend.knobs else 0)
