"""A results database as the views see it: its op tables, each row with its run's device, and case ids.

Every view reads through here, and this reads through store/results.py, which opens the file
read-only: no view can write to a results database.

>>> results = Results.open(Path("results/cpu.db"))    # doctest: +SKIP
>>> results.ops, results.device
(['add', 'gemm'], 'cpu')
>>> table = results.table("gemm")                     # doctest: +SKIP
>>> table.params, len(table.rows), case_id(table.rows[0], table.params)
(['m', 'n', 'k'], 4, 'torch-fp32-m=256-n=256-k=256')
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

from pytest_opperf.case import Case
from pytest_opperf.store.results import ResultsDB, ResultsError, open_results

# Columns that say how a row was measured: with the params and dtypes they make a "shape"
# on which backends are compared (a cold and a hot time are not comparable).
SHAPE_COLUMNS = ("dtype_in", "dtype_out", "timer", "cache")


class ViewError(Exception):
    """Bad input to a view: the message names the file, the op or the option."""


@dataclass
class OpTable:
    """One op's rows, each with the `device` of the run that wrote it."""

    op: str
    params: list[str]
    columns: list[str]
    rows: list[dict]
    source: Path

    def distinct(self, column: str) -> list:
        return sorted({r[column] for r in self.rows if r[column] is not None}, key=_order)


@dataclass
class Results:
    path: Path
    tables: list[str]  # op tables, sorted
    runs: dict[str, dict] = field(default_factory=dict)  # run_id -> runs row, oldest first
    device: str = ""  # the device most runs measured; the file's name when it has no runs

    @classmethod
    def open(cls, path: Path) -> "Results":
        with _opened(Path(path)) as results:
            runs = {r["run_id"]: r for r in results.runs()}
            return cls(results.path, results.op_tables(), runs, results.device)

    @property
    def ops(self) -> list[str]:
        return list(self.tables)

    def pick(self, ops: Optional[list[str]]) -> list[str]:
        """The op tables asked for (all when None), or a ViewError naming the missing one."""
        if not ops:
            return self.ops
        for op in ops:
            if op not in self.tables:
                raise ViewError(f"{self.path}: no table {op!r} (tables: {', '.join(self.tables) or 'none'})")
        return list(ops)

    def table(self, op: str) -> OpTable:
        self.pick([op])
        with _opened(self.path) as results:
            columns, params, rows = results.columns(op), results.params(op), results.rows(op)
        for row in rows:
            row["device"] = (self.runs.get(row.get("run_id")) or {}).get("device") or self.device
        return OpTable(op, params, columns, rows, self.path)

    def runs_of(self, rows: list[dict]) -> list[dict]:
        """The runs rows that wrote these rows, oldest first."""
        ids = {r.get("run_id") for r in rows}
        return [run for run_id, run in self.runs.items() if run_id in ids]


@contextmanager
def _opened(path: Path) -> Iterator[ResultsDB]:
    """The database, read-only; what store/results.py cannot read is a ViewError with its message."""
    try:
        with open_results(path) as results:
            yield results
    except ResultsError as exc:
        raise ViewError(str(exc)) from None


def knobs_of(row: dict) -> dict:
    text = row.get("knobs") or ""
    try:
        knobs = json.loads(text) if text else {}
    except ValueError:
        return {}
    return knobs if isinstance(knobs, dict) else {}


def case_id(row: dict, params: list[str], backend: bool = True) -> str:
    """The case's pytest id ('torch-bf16-m=4096-n=4096-k=4096'); without the backend: its shape."""
    case = Case("", row["backend"], None, row["dtype_in"], row["dtype_out"],
                tuple((p, row[p]) for p in params), tuple(knobs_of(row).items()))
    return case.id if backend else case.id[len(row["backend"]) + 1:]


def shape_key(row: dict, params: list[str]) -> tuple:
    """What makes rows of different backends the same case: params, dtypes, timer and cache."""
    return tuple(row[p] for p in params) + tuple(row[c] for c in SHAPE_COLUMNS)


def best_by_shape(table: OpTable) -> dict[tuple, dict[str, dict]]:
    """shape -> backend -> its fastest row there (over knobs and versions), shapes in sort order."""
    best: dict[tuple, dict[str, dict]] = {}
    for row in sorted(table.rows, key=lambda r: sort_key(r, table.params)):
        if row.get("time_us") is None:
            continue
        per_backend = best.setdefault(shape_key(row, table.params), {})
        held = per_backend.get(row["backend"])
        if held is None or row["time_us"] < held["time_us"]:
            per_backend[row["backend"]] = row
    return best


def _order(value):
    return (0, value, "") if isinstance(value, (int, float)) else (1, 0, str(value))


def sort_key(row: dict, params: list[str]) -> tuple:
    """Numbers as numbers, so n=4096 sorts before n=16384."""
    return tuple(_order(row[p]) for p in params) + tuple(_order(row[c]) for c in (*SHAPE_COLUMNS, "backend"))
