"""How long does this op take on this device? The answer a performance model asks the database for.

Four kinds of answer, tried in this order, and every answer says which it is:

- ``measured``: a row of the op's table with exactly these parameters and this dtype (the
  named backend's, or else the fastest backend's; of several rows of a backend the newest), in the
  call's cache state where the table has rows in it;
- ``interpolated``: in the call's kernel family (families.py: a GEMM along M at its N and K,
  attention along batch and sequence length, a memory-bound call along the bytes it moves; a
  catalogue op along its int parameters), between the nearest measured sizes below and above,
  linear in log(time) over log(size), along one axis where one passes through the call, else two;
- ``extrapolated``: the same, past the smallest or largest measured size (flat below the smallest,
  along the last segment's slope above the largest);
- ``roofline``: ``max(flops / peak FLOP/s, bytes / memory bandwidth)`` from the op's formulas
  and the device's hardware spec (a lower bound: no real kernel is faster).

``Table`` reads a database once and answers many calls; ``lookup`` answers one.

>>> lookup(Path("results/h100.db"), "gemm", {"m": 4096, "n": 4096, "k": 4096})   # doctest: +SKIP
Answer(op='gemm', ..., time_us=140.2, kind='measured', detail='backend torch, timer profiler, ...')
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from pytest_opperf.pipeline.reading.signature import ProfileError

MEASURED, INTERPOLATED, EXTRAPOLATED, ROOFLINE = "measured", "interpolated", "extrapolated", "roofline"


@dataclass(frozen=True)
class Answer:
    op: str
    params: dict
    dtype: str
    device: str
    time_us: float
    kind: str  # measured, interpolated, extrapolated or roofline
    backend: Optional[str]
    detail: str
    family: Optional[tuple] = None  # interpolated or extrapolated: the kernel family read (Table.held_out)


def parse_params(op_name: str, pairs: list[str]) -> dict:
    """``["m=4096", "n=11008"]`` -> the op's typed parameters, defaults filled in."""
    op = _op(op_name)
    params = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        name = name.strip().lower()
        if not sep or name not in op.params:
            raise ProfileError(f"{pair!r}: expected PARAM=VALUE with PARAM one of {list(op.params)}")
        kind = op.types.get(name, int)
        try:
            params[name] = int(value) if kind is int else float(value) if kind is float else value
        except ValueError:
            raise ProfileError(f"{pair!r}: {name} of op {op_name!r} takes {kind.__name__} values") from None
    return params


def lookup(results_db: Path, op_name: str, params: dict, dtype: str = "bf16", backend: Optional[str] = None,
           device: Optional[str] = None, hardware: Optional[Path] = None, cache: Optional[str] = None) -> Answer:
    return Table(results_db, device, hardware).answer(op_name, params, dtype, backend, cache)


class Table:
    """A results database's rows, read once, answering for many calls (predict prices a step's
    hundreds of calls from one): measured, interpolated along the call's kernel family
    (families.py), extrapolated past the measured sizes (said so), else the roofline."""

    def __init__(self, results_db: Path, device: Optional[str] = None, hardware: Optional[Path] = None):
        from pytest_opperf.store.results import ResultsError, open_results

        self.path, self.hardware = results_db, hardware
        self.rows: dict = {}    # op -> its table's rows, read at the first question about the op
        self.tables: set = set()
        db_device = None
        if results_db.exists():
            try:
                with open_results(results_db) as results:
                    db_device = results.device
                    self.tables = set(results.op_tables())
            except ResultsError as exc:
                raise ProfileError(str(exc)) from None
        self.device = device or db_device
        self.lines: dict = {}   # (op, dtype, backend) -> (family, axes) -> coordinates -> log time
        self.errors: dict = {}  # (line key, family, axes) -> held-out errors
        self.by_params: dict = {}  # (op, dtype, backend, cache) -> parameter values -> rows

    def answer(self, op_name: str, params: dict, dtype: str = "bf16", backend: Optional[str] = None,
               cache: Optional[str] = None) -> Answer:
        op = _op(op_name)
        missing = [p for p in op.params if p not in params and p not in op.defaults]
        if missing:
            raise ProfileError(f"op {op_name!r}: parameter(s) {missing} not given (it has {list(op.params)})")
        params = {p: params.get(p, op.defaults.get(p)) for p in op.params}
        dtype = label(dtype)
        found = _measured(self._same(op_name, op, dtype, backend, cache).get(tuple(params[p] for p in op.params))) \
            or self._interpolated(op_name, op, params, dtype, backend)
        if found is not None:
            return Answer(op_name, params, dtype, self.device or "", *found)
        if self.device is None:
            raise ProfileError(f"{self.path}: no database to name the device; pass --device NAME for a roofline answer")
        time_us, detail = _roofline(op, params, dtype, self.device, self.hardware)
        return Answer(op_name, params, dtype, self.device, time_us, ROOFLINE, None, detail)

    def _same(self, op_name: str, op, dtype: str, backend: Optional[str], cache: Optional[str]) -> dict:
        """_rows(...) by their parameters' values (in op.params order), built once a key."""
        key = (op_name, dtype, backend, cache)
        if key not in self.by_params:
            index: dict = {}
            for r in self._rows(op_name, dtype, backend, cache):
                index.setdefault(tuple(r.get(p) for p in op.params), []).append(r)
            self.by_params[key] = index
        return self.by_params[key]

    def _rows(self, op_name: str, dtype: str, backend: Optional[str], cache: Optional[str]) -> list:
        if op_name not in self.rows:
            self.rows[op_name] = self._read(op_name) if op_name in self.tables else []
        dtype_in, dtype_out = sides(dtype)  # one dtype: its input's alone (sampling's rows are fp32-int64)
        rows = [r for r in self.rows[op_name] if r.get("dtype_in") == dtype_in
                and ("-" not in dtype or r.get("dtype_out") == dtype_out)
                and (backend is None or r.get("backend") == backend)]
        same = [r for r in rows if r.get("cache") == cache]
        return same if cache is not None and same else rows

    def _read(self, op_name: str) -> list:
        from pytest_opperf.store.results import ResultsError, open_results

        try:
            with open_results(self.path) as results:
                return results.rows(op_name)
        except ResultsError as exc:
            raise ProfileError(str(exc)) from None

    def _interpolated(self, op_name: str, op, params: dict, dtype: str, backend):
        """Read off the call's kernel family, over every cache state: a size's state follows from its
        size (small calls stay in the L2), so a family's line runs through both."""
        from pytest_opperf.pipeline.replay import families

        ints = tuple(p for p in op.params if op.types.get(p, int) is int)
        placed = families.place(op_name, params, ints)
        if placed is None:
            return None
        family, axes, target = placed
        key = (op_name, dtype, backend)
        points = self._family(key, op, ints).get((family, axes))
        if not points:
            return None
        got = families.estimate(points, target, axes)
        if got is None:
            return None
        log_us, how, extrapolated = got
        return (math.exp(log_us), EXTRAPOLATED if extrapolated else INTERPOLATED, backend,
                f"log-log in its kernel family ({len(points)} measured sizes): {how}", (key, family, axes))

    def _family(self, key: tuple, op, ints: tuple) -> dict:
        """(family, axes) -> coordinates -> log time, of the rows of one op, dtype and backend."""
        from pytest_opperf.pipeline.replay import families

        if key not in self.lines:
            rows = self._rows(*key, None)
            by_params: dict = {}
            for r in rows:
                by_params.setdefault(tuple(r.get(p) for p in op.params), []).append(r)
            logs: dict = {}
            for values, same in by_params.items():
                placed = families.place(key[0], dict(zip(op.params, values)), ints)
                if placed is None:
                    continue
                best = min(_newest_per_backend(same).values(), key=lambda r: r["time_us"])
                if best["time_us"] > 0:
                    logs.setdefault(placed[:2], {}).setdefault(placed[2], []).append(math.log(best["time_us"]))
            self.lines[key] = {f: {c: sum(v) / len(v) for c, v in pts.items()} for f, pts in logs.items()}
        return self.lines[key]

    def held_out(self, answers: list) -> list:
        """The relative errors of the kernel families these answers were read from, each measured size
        estimated from its neighbours with itself held out (families.held_out)."""
        from pytest_opperf.pipeline.replay import families

        errors = []
        for key, family, axes in {a.family for a in answers if a.family is not None}:
            if (key, family, axes) not in self.errors:
                self.errors[(key, family, axes)] = families.held_out(self.lines[key][(family, axes)], axes)
            errors += self.errors[(key, family, axes)]
        return errors


def _op(name: str):
    from pytest_opperf.catalog import load_builtin
    from pytest_opperf.catalog.registry import OPS

    load_builtin()
    if name not in OPS:
        raise ProfileError(f"unknown op {name!r}; known: {', '.join(sorted(OPS))}")
    return OPS[name]


def _newest_per_backend(rows: list[dict]) -> dict[str, dict]:
    best: dict[str, dict] = {}
    for r in rows:
        if r["backend"] not in best or (r.get("created_at") or "") > (best[r["backend"]].get("created_at") or ""):
            best[r["backend"]] = r
    return best


def _measured(same: Optional[list[dict]]):
    """The fastest backend's newest row of SAME (the rows at a call's parameters exactly), or None."""
    if not same:
        return None
    per_backend = _newest_per_backend(same)
    row = min(per_backend.values(), key=lambda r: r["time_us"])
    detail = f"backend {row['backend']}, timer {row.get('timer')}, cache {row.get('cache')}, run {row.get('run_id')}"
    if len(per_backend) > 1:
        detail += f" (fastest of {len(per_backend)} backends)"
    return row["time_us"], MEASURED, row["backend"], detail


def label(dtype: str) -> str:
    """A case's dtype label in its canonical spelling: one dtype (bf16: in and out), or IN-OUT (bf16-fp32,
    a cast's or a mixed call's, as DTypes.label writes it); a ProfileError naming it otherwise."""
    from pytest_opperf.dtypes import lookup as dtype_lookup

    names = []
    for part in str(dtype).split("-", 1):
        try:
            names.append(dtype_lookup(part, any_tensor=True).name)
        except KeyError:
            raise ProfileError(f"--dtype={dtype}: unknown dtype (expected a dtype, or IN-OUT such as bf16-fp32)") from None
    return "-".join(dict.fromkeys(names))


def sides(dtype: str) -> tuple[str, str]:
    """(dtype_in, dtype_out) of a canonical label."""
    dtype_in, _, dtype_out = dtype.partition("-")
    return dtype_in, dtype_out or dtype_in


def _roofline(op, params: dict, dtype: str, device: str, hardware: Optional[Path]) -> tuple[float, str]:
    from pytest_opperf.dtypes import lookup as dtype_lookup
    from pytest_opperf.catalog.registry import DTypes
    from pytest_opperf.hardware.specs import SpecError, load_specs

    try:
        specs = load_specs(hardware)
    except SpecError as exc:
        raise ProfileError(str(exc)) from None
    if device not in specs:
        raise ProfileError(f"--device={device}: no hardware spec of that name; known: {', '.join(sorted(specs))}")
    spec = specs[device]
    dtype_in, dtype_out = sides(dtype)
    dt = DTypes(dtype_lookup(dtype_in, any_tensor=True), dtype_lookup(dtype_out, any_tensor=True))
    flops, nbytes = float(op.flops(params, dt)), float(op.bytes(params, dt))
    peak, bw = spec.peak_flops(dtype_in, op.peak), spec.mem_bw_bytes_per_s
    compute_s = flops / peak if peak and flops else None
    memory_s = nbytes / bw if bw and nbytes else None
    if compute_s is None and memory_s is None:
        raise ProfileError(f"no measured row near this case, and the spec {device!r} has no {op.peak} {dtype} peak "
                           f"or memory bandwidth for a roofline answer")
    bound = "compute" if (compute_s or 0) >= (memory_s or 0) else "memory"
    parts = []
    if compute_s is not None:
        parts.append(f"{flops:.4g} FLOP / {peak / 1e12:g} TFLOP/s ({op.peak} {dtype})")
    if memory_s is not None:
        parts.append(f"{nbytes:.4g} B / {bw / 1e9:g} GB/s")
    return max(compute_s or 0, memory_s or 0) * 1e6, f"{bound}-bound on {device}: max({'; '.join(parts)})"
