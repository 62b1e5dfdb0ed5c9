"""SQLite storage: one file per device, one table per op, a unique index per op, one writer.

Rows are written with INSERT OR REPLACE on the op's unique index, so re-running a case
replaces its row. Each write is one transaction: a process killed at any moment leaves
the database as it was before that write, or after it.

>>> rows = [{"op": "add", "n": 4, "dtype_in": "fp32", ...}]   # doctest: +SKIP
>>> write(Path("results/cpu.db"), run, rows)                 # doctest: +SKIP
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterable

import sqlite_utils

from . import devstate

# Columns every op table has besides its parameters, in order, with their SQLite types.
# Key columns (with the op's parameters) make up the unique index.
KEY_COLUMNS = {
    "dtype_in": str, "dtype_out": str, "backend": str, "backend_version": str,
    "knobs": str, "timer": str, "cache": str,
}
MEASURE_COLUMNS = {
    "time_us": float, "time_us_mean": float, "time_us_p95": float, "time_us_std": float,
    "time_us_min": float, "cv": float, "samples": int, "ci_rel": float, "target_met": int,
    "unstable": int, "gflops": float, "gbytes_per_s": float, "mfu": float, "mbu": float,
    "flops": float, "bytes": float, "peak_dtype": str, "peak_kind": str, "kernels": str,
    "warmup_calls": int, "calls_per_sample": int, **devstate.COLUMNS, "extra_info": str,
    "test_id": str, "run_id": str, "created_at": str,
}
RESERVED = set(KEY_COLUMNS) | set(MEASURE_COLUMNS) | {"op", "rowid", "id"}
RUNS = "runs"
_IDENT = re.compile(r"^[a-z_][a-z0-9_]*$")


class StorageError(Exception):
    pass


def key_columns(params: Iterable[str]) -> list[str]:
    return [*params, *KEY_COLUMNS]


def row_from_record(record: dict) -> tuple[str, list[str], dict]:
    """(table, key columns, row) from a plain record; the record's '_params' orders the params."""
    params = list(record["_params"])
    row = {c: record[c] for c in params}
    for column in [*KEY_COLUMNS, *MEASURE_COLUMNS]:
        value = record.get(column)
        if isinstance(value, (list, dict)):
            value = json.dumps(value)
        row[column] = value
    return record["op"], key_columns(params), row


def write(path: Path, run: dict, records: list[dict]) -> int:
    """Upsert the run and its records in one transaction; returns the number of rows written."""
    by_table: dict[str, tuple[list[str], list[dict]]] = {}
    for record in records:
        table, key, row = row_from_record(record)
        if not _IDENT.match(table):
            raise StorageError(f"op name {table!r} is not a valid table name")
        by_table.setdefault(table, (key, []))[1].append(row)
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite_utils.Database(path)
    try:
        with db.atomic():
            db[RUNS].upsert(run, pk="run_id", alter=True, columns={"git_dirty": int, "device_count": int, "workers": int})
            for table, (key, rows) in by_table.items():
                _ensure_table(db, table, key, rows[0])
                db[table].insert_all(rows, replace=True, alter=True)
    finally:
        db.close()
    return len(records)


def _ensure_table(db: sqlite_utils.Database, name: str, key: list[str], sample: dict) -> None:
    table = db[name]
    if not table.exists():
        columns = {c: type(sample[c]) if sample[c] is not None else str for c in key}
        columns.update({c: t for c, t in MEASURE_COLUMNS.items()})
        table.create(columns, not_null=set(key))
    else:
        missing = [c for c in key if c not in table.columns_dict]
        if missing:
            raise StorageError(
                f"table {name!r} in {db.conn} has no key column(s) {missing}: it was written by an "
                f"op with other parameters; use another results directory or rename the op")
    index_name = f"{name}_key"
    existing = {ix.name: ix for ix in table.indexes}
    if index_name in existing and list(existing[index_name].columns) != key:
        db.execute(f"DROP INDEX [{index_name}]")
        existing.pop(index_name)
    if index_name not in existing:
        table.create_index(key, index_name=index_name, unique=True)


def integrity_ok(path: Path) -> bool:
    db = sqlite_utils.Database(path)
    try:
        return db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        db.close()
