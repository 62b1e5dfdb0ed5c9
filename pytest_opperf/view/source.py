"""Reading a results database for viewing: read-only, one op table at a time.

Every view goes through here, so none of them can write to a results database: the file is
opened with SQLite's ``mode=ro`` URI.

>>> results = Results.open(Path("results/cpu.db"))    # doctest: +SKIP
>>> results.ops, results.device
(['add', 'gemm'], 'cpu')
>>> table = results.table("gemm")                     # doctest: +SKIP
>>> table.params, len(table.rows), case_id(table.rows[0], table.params)
(['m', 'n', 'k'], 4, 'torch-fp32-m=256-n=256-k=256')
"""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from pytest_opperf.case import Case
from pytest_opperf.store.database import CEILINGS, KEY_COLUMNS, MEASURE_COLUMNS, RUNS

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
    runs: dict[str, dict] = field(default_factory=dict)  # run_id -> runs row

    @classmethod
    def open(cls, path: Path) -> "Results":
        path = Path(path)
        with _connect(path) as con:
            names = [r[0] for r in con.execute("select name from sqlite_master where type = 'table' order by name")]
            runs = {}
            if RUNS in names:
                runs = {r["run_id"]: dict(r) for r in con.execute(f"select * from [{RUNS}] order by started_at")}
        return cls(path, [n for n in names if n not in (RUNS, CEILINGS) and not n.startswith("sqlite_")], runs)

    @property
    def ops(self) -> list[str]:
        return list(self.tables)

    @property
    def device(self) -> str:
        """The device most runs measured; the file's name when it has no runs."""
        counts = Counter(r.get("device") for r in self.runs.values() if r.get("device"))
        return counts.most_common(1)[0][0] if counts else self.path.stem

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
        with _connect(self.path) as con:
            columns = [r["name"] for r in con.execute(f"pragma table_info({_quote(op)})")]
            params = _params(con, op, columns)
            rows = [dict(r) for r in con.execute(f"select * from {_quote(op)} order by rowid")]
        for row in rows:
            row["device"] = (self.runs.get(row.get("run_id")) or {}).get("device") or self.device
        return OpTable(op, params, columns, rows, self.path)

    def runs_of(self, rows: list[dict]) -> list[dict]:
        """The runs rows that wrote these rows, oldest first."""
        ids = {r.get("run_id") for r in rows}
        return [run for run_id, run in self.runs.items() if run_id in ids]


def _connect(path: Path) -> "_Closing":
    if not path.is_file():
        raise ViewError(f"{path}: no such database")
    try:
        con = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True)
        con.row_factory = sqlite3.Row
        con.execute("select count(*) from sqlite_master").fetchone()
    except sqlite3.DatabaseError as exc:
        raise ViewError(f"{path}: not a readable SQLite database ({exc})") from None
    return _Closing(con)


class _Closing:
    """sqlite3's connection as a context manager commits; this one only closes (it never wrote)."""

    def __init__(self, con: sqlite3.Connection):
        self.con = con

    def __enter__(self) -> sqlite3.Connection:
        return self.con

    def __exit__(self, *exc) -> None:
        self.con.close()


def _params(con: sqlite3.Connection, op: str, columns: list[str]) -> list[str]:
    """The op's parameter columns: its unique index less the common key columns, in index order."""
    key = [r["name"] for r in con.execute(f"pragma index_info({_quote(op + '_key')})")]
    if key:
        return [c for c in key if c not in KEY_COLUMNS]
    known = set(KEY_COLUMNS) | set(MEASURE_COLUMNS)
    return [c for c in columns if c not in known]


def _quote(name: str) -> str:
    """A table name from the file itself, quoted: whatever it holds, it stays one identifier."""
    return '"' + name.replace('"', '""') + '"'


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
