"""SQLite storage: one file per device, one table per op, a unique index per op, one writer.

Rows are written with INSERT OR REPLACE on the op's unique index, so re-running a case
replaces its row. Each write is one transaction: a process killed at any moment leaves
the database as it was before that write, or after it. An op that gained a parameter with a
default migrates its table inside that transaction. Rows that cannot be written go to the
rescue file beside the database (``results/<device>.rescue.jsonl``), which ``merge`` reads back.

Several sessions (and ``opperf merge``) may write one database at once: every write takes the
write lock when it begins (``BEGIN IMMEDIATE``) and waits up to BUSY_TIMEOUT_S for another's, and
the file is kept in WAL mode, so readers never wait for a writer nor a writer for readers.

>>> rows = [{"op": "add", "n": 4, "dtype_in": "fp32", ...}]   # doctest: +SKIP
>>> write(Path("results/cpu.db"), run, rows)                 # doctest: +SKIP
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import sqlite3
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

import sqlite_utils
import sqlite_utils.db

from pytest_opperf.record import Record
from pytest_opperf.store.results import CEILINGS, CHECK_FAILED, KEY_COLUMNS, MEASURE_COLUMNS, RUNS, StorageError, key_index

# Columns of the runs table that may be NULL in the first row written, typed up front.
RUN_TYPES = {"git_dirty": int, "device_count": int, "workers": int, "migrations": str, "threads": int,
             "busy_cores_at_start": float}
# How long a write waits for another process's write to end (a checkpoint takes milliseconds).
BUSY_TIMEOUT_S = 30.0
RESCUE_SUFFIX = ".rescue.jsonl"
_IDENT = re.compile(r"^[a-z_][a-z0-9_]*$")


class TableRefused(StorageError):
    """An op table whose key no longer fits its op: its rows are not written, the other tables' are."""


@dataclass
class Written:
    rows: int = 0
    refused: dict = field(default_factory=dict)  # table -> why its rows were not written, and what to do
    migrated: dict = field(default_factory=dict)  # table -> the columns this write added to it (an older table)


def connect(path: Path) -> sqlite_utils.Database:
    """A connection that writes: it waits BUSY_TIMEOUT_S for other writers, on a file in WAL mode.

    WAL (kept in the file) lets readers read while a session writes, and a session write while
    others read. Where it cannot be set (a network filesystem, where SQLite has no shared memory)
    the file keeps its rollback journal: writes still wait their turn.
    """
    con = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_S, check_same_thread=False)
    try:
        if con.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            con.execute("PRAGMA journal_mode=WAL")
    except sqlite3.OperationalError:
        pass  # as said: the rollback journal
    except sqlite3.Error:
        con.close()  # not a database: the caller says so, naming the file
        raise
    return sqlite_utils.Database(con)


@contextmanager
def immediate(db: sqlite_utils.Database) -> Iterator[sqlite_utils.Database]:
    """One write transaction that takes the write lock as it begins (BEGIN IMMEDIATE), waiting for it.

    sqlite-utils' atomic() begins a deferred transaction: it reads the schema under a read lock,
    and its first write then fails at once with "database is locked" (no wait can help: the
    other writer waits for that read lock) whenever another process writes. Here every read of
    the schema happens under the write lock. sqlite-utils' own atomic() blocks inside become
    savepoints of this transaction.
    """
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
        db.execute("COMMIT")
    except BaseException:
        if db.conn.in_transaction:
            db.conn.rollback()
        raise


def migration_note(path: Path, table: str, columns: list[str]) -> str:
    """The line that says a write added columns to an older table (the session summary, opperf merge)."""
    return f"{path}: table {table}: added columns {', '.join(columns)} (migrated from an older version)"


def write(path: Path, run: dict, records: list[dict]) -> Written:
    """Upsert the run and its records in one transaction; returns what was written and what was refused.

    Every op table is checked against its op before its rows are written. A parameter the op
    gained with a default (the record's ``_defaults``: the Op's ``defaults``) is added to the
    table in the same transaction, the old rows taking the default; a table with a key column
    the op no longer has, or lacking one that has no default, is refused: its rows are not
    written (``Written.refused`` says why and what to do) and the other tables are. Columns
    added to an older table (a new parameter, a column of a newer plugin) are in
    ``Written.migrated`` and in the run's ``migrations`` column.
    Raises StorageError, naming the file, when the file cannot be written at all.

    >>> write(Path("results/cpu.db"), run, records)   # doctest: +SKIP
    Written(rows=4, refused={}, migrated={'gemm': ['first_call_ms']})
    """
    by_table = _rows_by_table(records)
    defaults = {record["op"]: Record(record).defaults for record in records}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StorageError(f"{path.parent}: cannot make the results directory: {exc}") from None
    written = Written()
    db = None
    try:
        db = connect(path)
        with immediate(db):
            for table, (key, rows) in by_table.items():
                try:
                    new_columns = _new_key_columns(db, path, table, key, defaults.get(table, {}))
                except TableRefused as exc:
                    written.refused[table] = str(exc)
                    continue
                before = list(db[table].columns_dict)
                _ensure_table(db, table, key, rows[0], new_columns)
                db[table].insert_all(rows, replace=True, alter=True)
                written.rows += len(rows)
                added = [c for c in db[table].columns_dict if before and c not in before]
                if added:
                    written.migrated[table] = added
            run = {**run, "migrations": _migrations(db, run.get("run_id"), written.migrated)}
            db[RUNS].upsert(run, pk="run_id", alter=True, columns=RUN_TYPES)
    except (sqlite3.Error, sqlite_utils.db.AlterError, sqlite_utils.db.TransformError) as exc:
        raise StorageError(f"{path}: {exc}") from None
    finally:
        if db is not None:
            db.close()
    return written


def mark_check_failed(path: Path, run_id: str, failure: dict) -> int:
    """Mark the stored rows of a case whose functional check failed in run `run_id`: `failure` holds
    the op, its parameters, dtypes, backend and knobs, and the check's message. The rows stay (the
    history), with `check_failed` = 'run_id: message', whatever their timer, cache or backend
    version; readers leave them out (ResultsDB.rows) until a run whose check passes replaces them.
    Returns how many rows were marked (0 without a database, a table or a row of the case).

    >>> mark_check_failed(Path("results/cpu.db"), "r2", {"op": "gelu", "n": 4096, "dtype_in": "bf16",
    ...                   "dtype_out": "bf16", "backend": "wrong", "knobs": "", "check_failed": "..."})   # doctest: +SKIP
    1
    """
    failure = dict(failure)
    table, text = failure.pop("op"), f"{run_id}: {failure.pop(CHECK_FAILED)}"
    if not path.is_file():
        return 0
    db = None
    try:
        db = connect(path)
        with immediate(db):
            columns = db[table].columns_dict if db[table].exists() else {}
            if not columns or any(c not in columns for c in failure):
                return 0  # no table, or one without a column of the case: no row of it
            if CHECK_FAILED not in columns:
                db.execute(f"ALTER TABLE [{table}] ADD COLUMN [{CHECK_FAILED}] TEXT")
            clause = " and ".join(f"[{c}] is ?" for c in failure)
            return db.execute(f"UPDATE [{table}] SET [{CHECK_FAILED}] = ? WHERE {clause}",
                              [text, *failure.values()]).rowcount
    except sqlite3.Error as exc:
        raise StorageError(f"{path}: {exc}") from None
    finally:
        if db is not None:
            db.close()


def _migrations(db: sqlite_utils.Database, run_id: Optional[str], migrated: dict) -> Optional[str]:
    """The run's `migrations` column: the columns each of its writes added to an older table, as JSON
    ({"gemm": ["a", "b"]}), the earlier checkpoints' notes kept; None when none did."""
    notes: dict = {}
    if "migrations" in db[RUNS].columns_dict:
        row = db.execute("select migrations from runs where run_id = ?", [run_id]).fetchone()
        try:
            notes = json.loads(row[0]) if row and row[0] else {}
        except ValueError:
            notes = {}
    for table, columns in migrated.items():
        notes[table] = [*notes.get(table, []), *(c for c in columns if c not in notes.get(table, []))]
    return json.dumps(notes) if notes else None


def _rows_by_table(records: list[dict]) -> dict[str, tuple[list[str], list[dict]]]:
    by_table: dict[str, tuple[list[str], list[dict]]] = {}
    for record in records:
        table, key, row = Record(record).to_row()
        if not _IDENT.match(table):
            raise StorageError(f"op name {table!r} is not a valid table name")
        by_table.setdefault(table, (key, []))[1].append(row)
    return by_table


def _new_key_columns(db: sqlite_utils.Database, path: Path, name: str, key: list[str], defaults: dict) -> dict:
    """{column: default} of the op's key columns the table lacks; TableRefused if the table does not fit the op.

    Read-only: runs in the write's transaction before the table is written, so a refused table
    costs no row of another.
    """
    table = db[name]
    if not table.exists():
        return {}
    columns = table.columns_dict
    # The index says what the key was when the table was written (a column outside it is a measurement).
    old_key = key_index(db, name) or [c for c in columns if c not in MEASURE_COLUMNS]
    gone = [c for c in old_key if c not in key]
    new = [c for c in key if c not in columns]
    no_default = [c for c in new if defaults.get(c) is None]
    if gone or no_default:
        raise TableRefused(_refusal(path, name, old_key, gone, no_default))
    return {c: defaults[c] for c in new}


def _refusal(path: Path, name: str, old_key: list[str], gone: list[str], no_default: list[str]) -> str:
    """Why a table was refused, then one line per way out: a command to run or a change to make."""
    if gone:
        what = f"has key column(s) {gone} that op {name!r} no longer has (a parameter removed or renamed)"
    else:
        what = f"lacks key column(s) {no_default} that op {name!r} now has, with no default for its old rows"
    fixes = []
    if len(gone) == 1 and len(no_default) == 1:
        fixes.append(f"if {gone[0]!r} was renamed {no_default[0]!r}: sqlite3 {path} "
                     f"\"ALTER TABLE [{name}] RENAME COLUMN [{gone[0]}] TO [{no_default[0]}]\"")
    params = [c for c in no_default if c not in KEY_COLUMNS]
    if params and not gone:
        fixes.append(f"give the op a default for the old rows: Op(..., defaults={{{params[0]!r}: VALUE}})")
    fixes.append(f"keep the old rows as table {name}_old: sqlite3 {path} \"{_set_aside_sql(name, old_key)}\"")
    fixes.append("write to another results directory: --opperf-results=DIR")
    return "\n".join([f"{path}: table {name!r} {what}; its rows were not written. Fix it with one of:",
                      *(f"  - {fix}" for fix in fixes)])


def _set_aside_sql(name: str, key: list[str]) -> str:
    """SQL that renames a table and its unique index, so a new table of that name can start."""
    old = f"{name}_old"
    columns = ", ".join(f"[{c}]" for c in key)
    return (f"ALTER TABLE [{name}] RENAME TO [{old}]; DROP INDEX [{name}_key]; "
            f"CREATE UNIQUE INDEX [{old}_key] ON [{old}] ({columns})")


def _columns_for(key: list[str], sample: dict) -> dict:
    """The columns of a new op table: its key (typed by a row's values), then the measurements."""
    columns = {c: type(sample[c]) if sample.get(c) is not None else str for c in key}
    columns.update(MEASURE_COLUMNS)
    return columns


def _ensure_table(db: sqlite_utils.Database, name: str, key: list[str], sample: dict, new_columns: dict) -> None:
    table = db[name]
    index_name = f"{name}_key"
    if not table.exists():
        table.create(_columns_for(key, sample), not_null=set(key))
    elif new_columns:
        _add_key_columns(db, name, key, new_columns)
    existing = {ix.name: ix for ix in table.indexes}
    if index_name in existing and list(existing[index_name].columns) != key:
        db.execute(f"DROP INDEX [{index_name}]")
        existing.pop(index_name)
    if index_name not in existing:
        table.create_index(key, index_name=index_name, unique=True)


def _add_key_columns(db: sqlite_utils.Database, name: str, key: list[str], new_columns: dict) -> None:
    """Migrate an op table to a key with more parameters: the old rows take the op's defaults.

    Runs inside write()'s transaction, so a run killed during it leaves the table as it was.
    """
    table = db[name]
    if f"{name}_key" in {ix.name for ix in table.indexes}:
        db.execute(f"DROP INDEX [{name}_key]")  # rebuilt over the new key by _ensure_table
    for column, value in new_columns.items():
        table.add_column(column, type(value))
        db.execute(f"UPDATE [{name}] SET [{column}] = ?", [value])
    # A fresh table lists the parameters first, all NOT NULL: the migrated one reads the same.
    present = table.columns_dict
    order = [c for c in [*key, *MEASURE_COLUMNS] if c in present]
    table.transform(not_null=set(new_columns), column_order=order)


# --- rescue file -------------------------------------------------------------------------------
#
# JSON lines, appended, never rewritten. Each rescue appends a header line
#   {"opperf_rescue": 1, "database": "...", "error": "...", "saved_at": "..."}
# then the run's row {"table": "runs", "row": {...}} and one line per op row
#   {"table": "gemm", "key": ["m", "n", ...], "row": {...}}
# (the row as write() would have stored it), so merge() can load it like a database.


def rescue_path(db_path: Path) -> Path:
    """The rescue file beside a database: results/cpu.db -> results/cpu.rescue.jsonl."""
    return db_path.with_name(db_path.stem + RESCUE_SUFFIX)


def rescue(path: Path, database: Path, error: str, run: dict, records: list[dict]) -> None:
    """Append the run's row and the records' rows to the rescue file, synced to disk before returning."""
    lines = [{"opperf_rescue": 1, "database": str(database), "error": error,
              "saved_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")},
             {"table": RUNS, "row": run}]
    for record in records:
        table, key, row = Record(record).to_row()
        lines.append({"table": table, "key": key, "row": row})
    # default=str: a stray value JSON cannot hold must not cost the rows around it.
    text = "".join(json.dumps(line, default=str) + "\n" for line in lines)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and path.stat().st_size:
        with path.open("rb") as f:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                text = "\n" + text  # a line cut short by a killed run stays alone on its line
    with path.open("a", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def is_rescue_file(path: Path) -> bool:
    """By suffix, or by content: a first line that is a rescue header (a SQLite file never is)."""
    if path.name.endswith(".jsonl"):
        return True
    with path.open("rb") as f:
        first = f.readline(4096)
    try:
        header = json.loads(first)
    except ValueError:
        return False
    return isinstance(header, dict) and "opperf_rescue" in header


def read_rescue(path: Path, warnings: list[str]) -> dict[str, tuple[list[str], list[dict]]]:
    """{table: (key columns, rows)} of a rescue file, in file order; the runs table keyed by run_id.

    A line that is not JSON (cut short by a kill while it was written) is skipped with a
    warning; any other bad line is a MergeError naming the file and line.
    """
    tables: dict[str, tuple[list[str], list[dict]]] = {}
    seen_header = False
    with path.open(encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                item = json.loads(line)
            except ValueError:
                warnings.append(f"{where}: not a whole JSON line (a write cut short?): skipped")
                continue
            if not isinstance(item, dict):
                raise MergeError(f"{where}: expected a JSON object")
            if "opperf_rescue" in item:
                seen_header = True
                continue
            if not seen_header:
                raise MergeError(f"{path}: not an opperf rescue file (line {number} comes before any "
                                 f"'opperf_rescue' header line)")
            table, row = item.get("table"), item.get("row")
            if not isinstance(table, str) or not _IDENT.match(table) or not isinstance(row, dict):
                raise MergeError(f"{where}: expected {{\"table\": NAME, \"row\": {{...}}}}")
            key = ["run_id"] if table == RUNS else item.get("key")
            if not isinstance(key, list) or not key or any(c not in row for c in key):
                raise MergeError(f"{where}: table {table!r}: expected \"key\", a list of the row's columns")
            known = tables.setdefault(table, (key, []))
            if known[0] != key:
                raise MergeError(f"{where}: table {table!r}: key columns {key} differ from {known[0]} earlier in "
                                 f"the file: the op's parameters changed between the runs it rescued")
            known[1].append(row)
    if not seen_header:
        raise MergeError(f"{path}: not an opperf rescue file (no 'opperf_rescue' header line)")
    return tables


# --- merge ------------------------------------------------------------------------------------


class MergeError(StorageError):
    pass


def key_of(db: sqlite_utils.Database, table: str) -> list[str]:
    """The unique key of an op table: the columns of its '<table>_key' index (as write() makes it)."""
    key = key_index(db, table)
    if not key:
        raise MergeError(f"table {table!r} has no unique index {table}_key: not an opperf result table")
    return key


def merge(out: Path, inputs: list[Path], warnings: Optional[list[str]] = None,
          migrated: Optional[dict] = None) -> dict[str, dict]:
    """Merge result databases and rescue files into `out` (created if missing), in one transaction.

    On an op's unique key the newest row wins (by created_at; on a tie, the later input);
    every runs row is kept (the latest ended_at of a run). Each table must have the same key
    columns in every file. Databases must pass PRAGMA integrity_check; a rescue file
    (``*.jsonl``, or any file whose first line is a rescue header) is read whole before
    `out` is touched. Returns {table: {"read": n, "written": n}}; what was skipped is
    appended to `warnings`, the columns added to `out`'s older tables go into `migrated`
    ({table: [column, ...]}).

    >>> merge(Path("all.db"), [Path("shard0.db"), Path("shard1.db")])   # doctest: +SKIP
    {'gemm': {'read': 40, 'written': 40}, 'runs': {'read': 2, 'written': 2}}
    >>> merge(Path("results/cpu.db"), [Path("results/cpu.rescue.jsonl")])   # doctest: +SKIP
    {'add': {'read': 4, 'written': 4}, 'runs': {'read': 1, 'written': 1}}
    """
    out = Path(out)
    sources = [Path(p) for p in inputs]
    warnings = [] if warnings is None else warnings
    if not sources:
        raise MergeError("no input databases")
    rescued: dict[Path, dict] = {}
    for path in sources:
        if not path.is_file():
            raise MergeError(f"{path}: no such file")
        if path.resolve() == out.resolve():
            raise MergeError(f"{path}: is the output too; merge into another file")
        if is_rescue_file(path):
            rescued[path] = read_rescue(path, warnings)
        else:
            _check_integrity(path)
    if out.exists():
        _check_integrity(out, " (to restore rows into a new database, move it away and merge into its path)")
    counts: dict[str, dict] = {}
    db = connect(out)
    try:
        with immediate(db):
            before = {table: list(db[table].columns_dict) for table in db.table_names() if table != RUNS}
            for path in sources:
                tables = rescued[path] if path in rescued else _tables_of(path)
                for table, (key, rows) in tables.items():
                    _merge_table(db, out, path, table, key, rows, counts)
            problem = _integrity_problem(db)
            if problem:
                raise MergeError(f"{out}: the merged database fails its integrity check: {problem}")
            for table, columns in before.items():
                added = [c for c in db[table].columns_dict if c not in columns]
                if added and migrated is not None:
                    migrated[table] = added
    finally:
        db.close()
    return counts


def _check_integrity(path: Path, advice: str = "") -> None:
    try:
        db = sqlite_utils.Database(path)
        try:
            problem = _integrity_problem(db)
        finally:
            db.close()
    except Exception as exc:  # sqlite3.DatabaseError: "file is not a database", ...
        raise MergeError(f"{path}: not a readable SQLite database ({exc}){advice}") from None
    if problem:
        raise MergeError(f"{path}: fails PRAGMA integrity_check: {problem}{advice}")


def _integrity_problem(db: sqlite_utils.Database) -> str:
    lines = [row[0] for row in db.execute("PRAGMA integrity_check").fetchall()]
    return "" if lines == ["ok"] else "; ".join(lines[:5])


def _tables_of(path: Path) -> dict[str, tuple[list[str], list[dict]]]:
    """{table: (key columns, rows)} of a result database."""
    src = sqlite_utils.Database(path)
    tables = {}
    try:
        for table in src.table_names():
            if table.startswith("sqlite_"):
                continue
            if not _IDENT.match(table):
                raise MergeError(f"{path}: table {table!r} is not an opperf table name")
            if table == RUNS:
                tables[table] = (["run_id"], list(src[table].rows))
                continue
            try:
                key = key_of(src, table)
            except MergeError as exc:
                raise MergeError(f"{path}: {exc}") from None
            tables[table] = (key, list(src[table].rows))
    finally:
        src.close()
    return tables


def _merge_table(db: sqlite_utils.Database, out: Path, path: Path, table: str, key: list[str], rows: list[dict],
                 counts: dict) -> None:
    count = counts.setdefault(table, {"read": 0, "written": 0})
    count["read"] += len(rows)
    if not rows:
        return
    if table == RUNS:
        # A run rescued at a checkpoint and written later appears twice: keep its last state.
        newer = _newer_rows(db, RUNS, ["run_id"], rows, "ended_at") if db[RUNS].exists() else rows
        if newer:
            db[RUNS].upsert_all(newer, pk="run_id", alter=True, columns=RUN_TYPES)
        count["written"] += len(newer)
        return
    if db[table].exists():
        theirs = key_index(db, table)
        if not theirs:
            raise MergeError(f"{out}: table {table!r} has no unique index {table}_key: not an opperf result table")
        if theirs != key:
            raise MergeError(f"{path}: table {table!r}: key columns {key} differ from {theirs} in {out}: the op's "
                             f"parameters changed between these runs; merge into another file, or first make "
                             f"{out}'s table fit (docs/database.md, 'When an op's parameters change')")
    else:
        # The ceilings table is no op table: it keeps its own columns (insert_all adds them), not an op's.
        columns = {c: str for c in key} if table == CEILINGS else _columns_for(key, rows[0])
        db[table].create(columns, not_null=set(key))
        db[table].create_index(key, index_name=f"{table}_key", unique=True)
    # Oldest first: where one input holds a key twice (a rescue file of several runs), the newest lands last.
    ordered = sorted(rows, key=lambda row: row.get("created_at") or "")
    newer = _newer_rows(db, table, key, ordered, "created_at")
    if newer:
        db[table].insert_all(newer, replace=True, alter=True)
    count["written"] += len(newer)


def _newer_rows(db: sqlite_utils.Database, table: str, key: list[str], rows: list[dict], stamp: str) -> list[dict]:
    """The rows not older (by the `stamp` column) than the output's row of the same key."""
    if stamp not in db[table].columns_dict:
        return rows
    where = " and ".join(f"[{c}] = ?" for c in key)
    sql = f"select [{stamp}] from [{table}] where {where}"
    keep = []
    for row in rows:
        existing = db.execute(sql, [row[c] for c in key]).fetchone()
        if existing is None or (row.get(stamp) or "") >= (existing[0] or ""):
            keep.append(row)
    return keep
