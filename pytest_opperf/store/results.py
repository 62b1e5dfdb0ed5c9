"""Opening and reading a results database: its op tables, their rows and parameters, the runs, the ceilings.

A results database (``results/<device>.db``, written by store/database.py) holds one table per
op, the ``runs`` table (one row per session) and the ``ceilings`` table (store/ceilings.py). Every
reader opens it through open_results(): read-only, with SQLite's ``mode=ro`` URI, so reading never
creates a file nor takes a write lock, and sqlite-utils reads underneath. The names of the
common columns and tables are declared here, for the writer and the readers alike.

>>> with open_results(Path("results/cpu.db")) as results:                  # doctest: +SKIP
...     results.op_tables(), results.params("gemm"), results.device
(['add', 'gemm'], ['m', 'n', 'k'], 'cpu')
>>> results.rows("gemm", where={"backend": "torch"}, order_by=("created_at", "rowid"))   # doctest: +SKIP
[{'m': 256, 'n': 256, 'k': 256, 'dtype_in': 'fp32', ..., 'time_us': 41.5, ...}, ...]
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Mapping, Optional, Sequence

import sqlite_utils
from sqlite_utils.db import quote_identifier

from pytest_opperf.columns import KEY, MEASURE, types

# Columns every op table has besides its parameters, in order, with their SQLite types (declared,
# with their units and meanings, in pytest_opperf/columns.py). Key columns (with the op's
# parameters) make up the unique index.
KEY_COLUMNS = types(KEY)
MEASURE_COLUMNS = types(MEASURE)
RUNS = "runs"
CHECK_FAILED = "check_failed"  # set on the rows of a case whose check failed later (store/database.py)
CEILINGS = "ceilings"  # the device's measured ceilings (store/ceilings.py): not an op table


class StorageError(Exception):
    pass


class ResultsError(StorageError):
    """A results database that cannot be opened or read: 'file: reason'."""

    def __init__(self, path: Path, reason: str):
        self.path, self.reason = path, reason
        super().__init__(f"{path}: {reason}")


def open_results(path: Path) -> "ResultsDB":
    """The results database at path, opened read-only; ResultsError if it is missing or not SQLite.

    A missing file stays missing (nothing is created); close it, or use it as a context manager.

    >>> open_results(Path("results/none.db"))         # doctest: +SKIP
    ResultsError: results/none.db: no such database
    """
    path = Path(path)
    if not path.is_file():
        raise ResultsError(path, not_a_file(path) or "no such database")
    try:
        con = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise ResultsError(path, f"cannot open: {exc}") from None
    results = ResultsDB(path, sqlite_utils.Database(con, recursive_triggers=False))
    with results.reading():  # the header is read on the first query: a file that is not SQLite fails here
        results.db.execute("select count(*) from sqlite_master").fetchone()
    return results


def not_a_file(path: Path) -> str:
    """What stands at `path` where a results database (a file) should: '' when nothing or a file does.

    >>> not_a_file(Path("/")), not_a_file(Path("/dev/null"))
    ('a directory, not a results database (a SQLite file)', 'not a regular file, so not a results database (a SQLite file)')
    """
    if path.is_dir():
        return "a directory, not a results database (a SQLite file)"
    if path.exists():
        return "not a regular file, so not a results database (a SQLite file)"
    return ""


def param_columns(columns: Sequence[str], key: Sequence[str] = ()) -> list[str]:
    """An op table's parameter columns: its unique key less the common key columns, in key order;
    without a key, the columns that are neither key nor measurement columns.

    >>> param_columns(["m", "n", "dtype_in", "time_us"])
    ['m', 'n']
    >>> param_columns(["m", "n", "dtype_in", "time_us"], key=["n", "m", *KEY_COLUMNS])
    ['n', 'm']
    """
    if key:
        return [c for c in key if c not in KEY_COLUMNS]
    return [c for c in columns if c not in KEY_COLUMNS and c not in MEASURE_COLUMNS]


def key_index(db: sqlite_utils.Database, table: str) -> list[str]:
    """The columns of a table's unique '<table>_key' index (as the writer makes it); [] without one."""
    for index in db[table].indexes:
        if index.name == f"{table}_key" and index.unique:
            return list(index.columns)
    return []


class ResultsDB:
    """An open results database: `db` is the sqlite_utils.Database, `path` the file."""

    def __init__(self, path: Path, db: sqlite_utils.Database):
        self.path = path
        self.db = db

    def __enter__(self) -> "ResultsDB":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.db.close()

    @contextmanager
    def reading(self) -> Iterator[None]:
        """SQLite's errors while reading (a damaged or foreign file) as a ResultsError naming the file."""
        try:
            yield
        except sqlite3.DatabaseError as exc:
            raise ResultsError(self.path, f"not a readable SQLite database ({exc})") from None

    def table_names(self) -> list[str]:
        """Every table of the file, sorted (SQLite's own sqlite_* tables left out)."""
        with self.reading():
            return sorted(n for n in self.db.table_names() if not n.startswith("sqlite_"))

    def op_tables(self) -> list[str]:
        """The op tables, sorted: every table but the runs and the ceilings."""
        return [n for n in self.table_names() if n not in (RUNS, CEILINGS)]

    def has_table(self, name: str) -> bool:
        with self.reading():
            return self.db[name].exists()

    def columns(self, table: str) -> list[str]:
        """The table's columns in order; [] for a table the file does not have."""
        with self.reading():
            return [c.name for c in self.db[table].columns]

    def params(self, op: str) -> list[str]:
        """The op table's parameter columns (param_columns of its columns and unique key)."""
        with self.reading():
            return param_columns(self.columns(op), key_index(self.db, op))

    def rows(self, table: str, where: Optional[Mapping[str, object]] = None,
             order_by: Sequence[str] = ("rowid",), history: bool = False) -> list[dict]:
        """The table's rows as dicts: those equal to `where` in every column it names, in `order_by` order.
        Rows whose case failed its functional check since (`check_failed` set) are history: left out
        unless `history`, so no report, win, lookup or comparison takes them as current.

        >>> results.rows("gemm", where={"dtype_in": "bf16"}, order_by=("created_at", "rowid"))   # doctest: +SKIP
        """
        if not self.has_table(table):
            raise ResultsError(self.path, f"no table {table!r}")
        where = dict(where or {})
        clauses = [f"{quote_identifier(c)} = ?" for c in where]
        if not history and CHECK_FAILED in self.columns(table):
            clauses.append(f"{quote_identifier(CHECK_FAILED)} is null")
        clause = " and ".join(clauses) or None
        # rowid stays bare: quoted, SQLite would take it for a string where no column resolves it.
        order = ", ".join(c if c == "rowid" else quote_identifier(c) for c in order_by) or None
        with self.reading():
            return list(self.db[table].rows_where(clause, list(where.values()), order_by=order))

    def runs(self) -> list[dict]:
        """The runs rows, oldest first (by started_at); [] without a runs table."""
        return self.rows(RUNS, order_by=("started_at", "rowid")) if self.has_table(RUNS) else []

    def run(self, run_id: str) -> Optional[dict]:
        """The runs row of run_id, or None."""
        found = self.rows(RUNS, where={"run_id": run_id}) if self.has_table(RUNS) else []
        return found[0] if found else None

    def latest_run(self) -> Optional[dict]:
        """The run that started last, or None."""
        runs = self.runs()
        return runs[-1] if runs else None

    @property
    def device(self) -> str:
        """The device most runs measured; the file's name when it has no runs."""
        counts = Counter(r.get("device") for r in self.runs() if r.get("device"))
        return counts.most_common(1)[0][0] if counts else self.path.stem

    def ceilings(self, device: Optional[str] = None) -> list[dict]:
        """The ceilings rows (of one device), oldest calibration first; [] without a ceilings table."""
        if not self.has_table(CEILINGS):
            return []
        return self.rows(CEILINGS, where={"device": device} if device else None, order_by=("created_at", "rowid"))
