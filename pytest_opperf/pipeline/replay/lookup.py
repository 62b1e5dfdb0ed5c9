"""How long does this op take on this device? The answer a performance model asks the database for.

Three kinds of answer, tried in this order, and every answer says which it is:

- ``measured``: a row of the op's table with exactly these parameters and this dtype (the
  named backend's, or else the fastest backend's; of several rows of a backend the newest);
- ``interpolated``: along one size parameter (an int parameter), between the nearest measured
  rows below and above the asked value that equal the question in every other parameter,
  linear in log(time) over log(size); of several such parameters the one with the closest pair;
- ``roofline``: ``max(flops / peak FLOP/s, bytes / memory bandwidth)`` from the op's formulas
  and the device's hardware spec (a lower bound: no real kernel is faster).

>>> lookup(Path("results/h100.db"), "gemm", {"m": 4096, "n": 4096, "k": 4096})   # doctest: +SKIP
Answer(op='gemm', ..., time_us=140.2, kind='measured', detail='backend torch, timer profiler, ...')
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from pytest_opperf.pipeline.reading.signature import ProfileError

MEASURED, INTERPOLATED, ROOFLINE = "measured", "interpolated", "roofline"


@dataclass(frozen=True)
class Answer:
    op: str
    params: dict
    dtype: str
    device: str
    time_us: float
    kind: str  # measured, interpolated or roofline
    backend: Optional[str]
    detail: str


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
           device: Optional[str] = None, hardware: Optional[Path] = None) -> Answer:
    from pytest_opperf.dtypes import lookup as dtype_lookup
    from pytest_opperf.store.results import ResultsError, open_results

    op = _op(op_name)
    missing = [p for p in op.params if p not in params and p not in op.defaults]
    if missing:
        raise ProfileError(f"op {op_name!r}: parameter(s) {missing} not given (it has {list(op.params)})")
    params = {p: params.get(p, op.defaults.get(p)) for p in op.params}
    try:
        dtype = dtype_lookup(dtype).name
    except KeyError:
        raise ProfileError(f"--dtype={dtype}: unknown dtype") from None
    rows: list[dict] = []
    db_device = None
    if results_db.exists():
        try:
            with open_results(results_db) as results:
                db_device = results.device
                if op_name in results.op_tables():
                    where = {"dtype_in": dtype, **({"backend": backend} if backend is not None else {})}
                    rows = results.rows(op_name, where=where)
        except ResultsError as exc:
            raise ProfileError(str(exc)) from None
    device = device or db_device
    answer = _measured(rows, op, params) or _interpolated(rows, op, params)
    if answer is not None:
        time_us, chosen, detail, kind = answer
        return Answer(op_name, params, dtype, device or "", time_us, kind, chosen, detail)
    if device is None:
        raise ProfileError(f"{results_db}: no database to name the device; pass --device NAME for a roofline answer")
    time_us, detail = _roofline(op, params, dtype, device, hardware)
    return Answer(op_name, params, dtype, device, time_us, ROOFLINE, None, detail)


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


def _measured(rows: list[dict], op, params: dict):
    same = [r for r in rows if all(r[p] == params[p] for p in op.params)]
    if not same:
        return None
    per_backend = _newest_per_backend(same)
    row = min(per_backend.values(), key=lambda r: r["time_us"])
    detail = f"backend {row['backend']}, timer {row.get('timer')}, cache {row.get('cache')}, run {row.get('run_id')}"
    if len(per_backend) > 1:
        detail += f" (fastest of {len(per_backend)} backends)"
    return row["time_us"], row["backend"], detail, MEASURED


def _interpolated(rows: list[dict], op, params: dict):
    sizes = [p for p in op.params if op.types.get(p, int) is int]
    best = None
    for axis in sizes:
        others = [p for p in op.params if p != axis]
        line = [r for r in rows if all(r[p] == params[p] for p in others)]
        # per size value: the fastest backend's newest row, as for a measured answer
        points: dict[int, dict] = {}
        for value in {r[axis] for r in line}:
            at = _newest_per_backend([r for r in line if r[axis] == value])
            points[value] = min(at.values(), key=lambda r: r["time_us"])
        below = [v for v in points if 0 < v < params[axis]]
        above = [v for v in points if v > params[axis]]
        if not below or not above:
            continue
        lo, hi = max(below), min(above)
        span = math.log(hi / lo)
        if best is None or span < best[0]:
            best = (span, axis, lo, hi, points[lo], points[hi])
    if best is None:
        return None
    _, axis, lo, hi, r_lo, r_hi = best
    t = math.log(params[axis] / lo) / math.log(hi / lo)
    time_us = math.exp(math.log(r_lo["time_us"]) + t * (math.log(r_hi["time_us"]) - math.log(r_lo["time_us"])))
    backend = r_lo["backend"] if r_lo["backend"] == r_hi["backend"] else None
    detail = (f"log-log over {axis} between {axis}={lo} ({r_lo['time_us']:.4g} us, {r_lo['backend']}) and "
              f"{axis}={hi} ({r_hi['time_us']:.4g} us, {r_hi['backend']})")
    return time_us, backend, detail, INTERPOLATED


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
    dt = DTypes(dtype_lookup(dtype), dtype_lookup(dtype))
    flops, nbytes = float(op.flops(params, dt)), float(op.bytes(params, dt))
    peak, bw = spec.peak_flops(dtype, op.peak), spec.mem_bw_bytes_per_s
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
