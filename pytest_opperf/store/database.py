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

from pytest_opperf.measure import devstate

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
    "warmup_calls": int, "calls_per_sample": int, "first_call_ms": float, **devstate.COLUMNS, "extra_info": str,
    "test_id": str, "run_id": str, "created_at": str,
    "worker": str, "gpu": int, "gpu_uuid": str,
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


# --- merge ------------------------------------------------------------------------------------


class MergeError(StorageError):
    pass


def key_of(db: sqlite_utils.Database, table: str) -> list[str]:
    """The unique key of an op table: the columns of its '<table>_key' index (as write() makes it)."""
    for index in db[table].indexes:
        if index.name == f"{table}_key" and index.unique:
            return list(index.columns)
    raise MergeError(f"table {table!r} has no unique index {table}_key: not an opperf result table")


def merge(out: Path, inputs: list[Path]) -> dict[str, dict]:
    """Merge per-shard databases into `out` (created if missing), in one transaction.

    On an op's unique key the newest row wins (by created_at; on a tie, the later input);
    every runs row is kept. Each table must have the same key columns in every file. Inputs
    and output must pass PRAGMA integrity_check. Returns {table: {"read": n, "written": n}}.

    >>> merge(Path("all.db"), [Path("shard0.db"), Path("shard1.db")])   # doctest: +SKIP
    {'gemm': {'read': 40, 'written': 40}, 'runs': {'read': 2, 'written': 2}}
    """
    out = Path(out)
    sources = [Path(p) for p in inputs]
    if not sources:
        raise MergeError("no input databases")
    for path in sources:
        if not path.is_file():
            raise MergeError(f"{path}: no such file")
        if path.resolve() == out.resolve():
            raise MergeError(f"{path}: is the output too; merge into another file")
        _check_integrity(path)
    if out.exists():
        _check_integrity(out)
    counts: dict[str, dict] = {}
    db = sqlite_utils.Database(out)
    try:
        with db.atomic():
            for path in sources:
                _merge_one(db, out, path, counts)
            problem = _integrity_problem(db)
            if problem:
                raise MergeError(f"{out}: the merged database fails its integrity check: {problem}")
    finally:
        db.close()
    return counts


def _check_integrity(path: Path) -> None:
    try:
        db = sqlite_utils.Database(path)
        try:
            problem = _integrity_problem(db)
        finally:
            db.close()
    except Exception as exc:  # sqlite3.DatabaseError: "file is not a database", ...
        raise MergeError(f"{path}: not a readable SQLite database ({exc})") from None
    if problem:
        raise MergeError(f"{path}: fails PRAGMA integrity_check: {problem}")


def _integrity_problem(db: sqlite_utils.Database) -> str:
    lines = [row[0] for row in db.execute("PRAGMA integrity_check").fetchall()]
    return "" if lines == ["ok"] else "; ".join(lines[:5])


def _merge_one(db: sqlite_utils.Database, out: Path, path: Path, counts: dict) -> None:
    src = sqlite_utils.Database(path)
    try:
        for table in src.table_names():
            if table.startswith("sqlite_"):
                continue
            if not _IDENT.match(table):
                raise MergeError(f"{path}: table {table!r} is not an opperf table name")
            count = counts.setdefault(table, {"read": 0, "written": 0})
            rows = list(src[table].rows)
            count["read"] += len(rows)
            if table == RUNS:
                if rows:
                    db[RUNS].upsert_all(rows, pk="run_id", alter=True)
                    count["written"] += len(rows)
                continue
            try:
                key = key_of(src, table)
            except MergeError as exc:
                raise MergeError(f"{path}: {exc}") from None
            if db[table].exists():
                try:
                    theirs = key_of(db, table)
                except MergeError as exc:
                    raise MergeError(f"{out}: {exc}") from None
                if theirs != key:
                    raise MergeError(f"{path}: table {table!r}: key columns {key} differ from {theirs} in the "
                                     f"output: the op's parameters changed between these runs")
            else:
                db[table].create(dict(src[table].columns_dict), not_null=set(key))
                db[table].create_index(key, index_name=f"{table}_key", unique=True)
            newer = _newer_rows(db, table, key, rows)
            if newer:
                db[table].insert_all(newer, replace=True, alter=True)
            count["written"] += len(newer)
    finally:
        src.close()


def _newer_rows(db: sqlite_utils.Database, table: str, key: list[str], rows: list[dict]) -> list[dict]:
    """The rows not older (created_at) than the output's row of the same key."""
    where = " and ".join(f"[{c}] = ?" for c in key)
    sql = f"select created_at from [{table}] where {where}"
    keep = []
    for row in rows:
        existing = db.execute(sql, [row[c] for c in key]).fetchone()
        if existing is None or (row.get("created_at") or "") >= (existing[0] or ""):
            keep.append(row)
    return keep
