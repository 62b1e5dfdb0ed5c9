"""The `ceilings` table: calibrations (hardware/calibrate.py) in the device's results database.

One row per measurement, unique on (calibration_id, quantity, dtype, shape), written in one
transaction. Every calibration is kept; the one in use is the newest of the device. The table
carries a `ceilings_key` index and `created_at` like an op table, so `opperf merge` carries it
across shards unchanged; the readers (store/results.py) leave it out of the op tables.

>>> write(Path("results/h100.db"), calibration.rows)      # doctest: +SKIP
>>> latest(Path("results/h100.db"), "h100").id            # doctest: +SKIP
'3f2a9c0d1e7b4a55'
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Optional

import sqlite_utils.db

from pytest_opperf.hardware.calibrate import Calibration
from pytest_opperf.store.database import connect, immediate
from pytest_opperf.store.results import CEILINGS, StorageError, open_results

TABLE = CEILINGS
KEY = ["calibration_id", "quantity", "dtype", "shape"]
# Columns that may be NULL in a first row (a CPU has no driver, no clocks), typed up front.
TYPES = {
    "tflops": float, "gbytes_per_s": float, "datasheet_tflops": float, "datasheet_gbytes_per_s": float,
    "ratio": float, "flops": float, "bytes": float, "driver": str, "cuda": str, "hip": str,
    "sm_clock_mhz": int, "mem_clock_mhz": int, "power_limit_w": float, "threads": int,
}


def write(path: Path, rows: list[dict]) -> None:
    """Add a calibration's rows to the database at path (created if missing), in one transaction."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        db = connect(path)
    except (OSError, sqlite3.Error) as exc:
        raise StorageError(f"{path}: cannot write the calibration: {exc}") from None
    try:
        with immediate(db):  # alongside a session writing the same database
            table = db[TABLE]
            if not table.exists():
                first = rows[0]
                columns = {c: TYPES.get(c) or (type(first[c]) if first[c] is not None else str) for c in first}
                table.create(columns, not_null=set(KEY))
                table.create_index(KEY, index_name=f"{TABLE}_key", unique=True)
            table.insert_all(rows, replace=True, alter=True)
    except (sqlite3.Error, sqlite_utils.db.AlterError) as exc:
        raise StorageError(f"{path}: cannot write the calibration: {exc}") from None
    finally:
        db.close()


def latest(path: Path, device: str) -> Optional[Calibration]:
    """The newest calibration of `device` in the database at path, or None (no file, no table, none).

    Read-only: a view or a session start may call it on a database it must not change.
    """
    return _pick(all_rows(path, device))


def all_rows(path: Path, device: Optional[str] = None) -> list[dict]:
    """Every ceilings row of the database (of one device), oldest calibration first; [] without the file."""
    path = Path(path)
    if not path.is_file():
        return []
    with open_results(path) as results:
        return results.ceilings(device)


def _pick(rows: list[dict]) -> Optional[Calibration]:
    if not rows:
        return None
    newest = rows[-1]["calibration_id"]
    return Calibration([r for r in rows if r["calibration_id"] == newest])
