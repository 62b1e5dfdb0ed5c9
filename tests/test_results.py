"""Reading a results database (store/results.py): real SQLite files, written by the store's own writer."""

import sqlite3

import pytest

from pytest_opperf.store import ceilings
from pytest_opperf.store import database as storage
from pytest_opperf.store.results import (
    KEY_COLUMNS,
    MEASURE_COLUMNS,
    ResultsError,
    StorageError,
    open_results,
    param_columns,
)


def record(op: str, params: dict, backend: str = "torch", time_us: float = 10.0, **extra) -> dict:
    """A plain record as the bench fixture makes one, its measurement reduced to what these tests read."""
    base = {c: None for c in [*KEY_COLUMNS, *MEASURE_COLUMNS]}
    base.update(dtype_in="fp32", dtype_out="fp32", backend=backend, backend_version="1", knobs="", timer="cpu",
                cache="hot", time_us=time_us, samples=5)
    return {**base, **params, **extra, "op": op, "_params": list(params)}


def run(run_id: str, started_at: str, device: str = "cpu") -> dict:
    return {"run_id": run_id, "started_at": started_at, "device": device}


@pytest.fixture
def db(tmp_path):
    """cpu.db: three runs (two on cpu); gemm (m, n, k) with two backends; add (n); a calibration."""
    path = tmp_path / "cpu.db"
    storage.write(path, run("r0", "2025-12-31T00:00:00"), [])
    storage.write(path, run("r1", "2026-01-01T00:00:00"), [
        record("gemm", {"m": 64, "n": 32, "k": 16}, created_at="2026-01-01T00:00:01", run_id="r1"),
        record("gemm", {"m": 64, "n": 32, "k": 16}, backend="other", time_us=20.0, run_id="r1"),
        record("add", {"n": 4096}, run_id="r1"),
    ])
    storage.write(path, run("r2", "2026-01-02T00:00:00", device="h100"), [
        record("gemm", {"m": 128, "n": 32, "k": 16}, created_at="2026-01-02T00:00:01", run_id="r2"),
    ])
    base = {"device": "cpu", "dtype": "fp32", "shape": "by hand", "created_at": "2026-01-01T00:00:00"}
    ceilings.write(path, [{**base, "calibration_id": "c1", "quantity": "matrix", "tflops": 1.0},
                          {**base, "calibration_id": "c1", "quantity": "copy", "gbytes_per_s": 2.0}])
    ceilings.write(path, [{**base, "calibration_id": "c2", "device": "h100", "quantity": "matrix", "tflops": 3.0,
                           "created_at": "2026-01-02T00:00:00"}])
    return path


def test_a_missing_database_is_a_clear_error_and_stays_missing(tmp_path):
    missing = tmp_path / "none" / "cpu.db"
    with pytest.raises(ResultsError, match=f"^{missing}: no such database$") as info:
        open_results(missing)
    assert isinstance(info.value, StorageError) and info.value.path == missing
    assert not missing.parent.exists()


def test_a_file_that_is_not_sqlite_is_a_clear_error(tmp_path):
    garbage = tmp_path / "garbage.db"
    garbage.write_text("not a database, " * 100)
    with pytest.raises(ResultsError, match=f"^{garbage}: not a readable SQLite database"):
        open_results(garbage)
    assert garbage.read_text() == "not a database, " * 100


def test_reading_never_writes(db):
    before = db.read_bytes()
    with open_results(db) as results:
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            results.db.execute("delete from gemm")
        assert results.rows("gemm")
    assert db.read_bytes() == before
    # No journal, no rescue file. A reader of a WAL file (as the writer leaves it) may leave SQLite's
    # shared-memory index and an empty log beside it, which the next writer removes as it closes.
    assert sorted(p.name for p in db.parent.iterdir()) in (["cpu.db"], ["cpu.db", "cpu.db-shm", "cpu.db-wal"])
    assert not db.with_name("cpu.db-wal").exists() or db.with_name("cpu.db-wal").stat().st_size == 0


def test_op_tables_leave_out_the_runs_and_the_ceilings(db):
    with open_results(db) as results:
        assert results.op_tables() == ["add", "gemm"]
        assert results.table_names() == ["add", "ceilings", "gemm", "runs"]
        assert results.has_table("gemm") and not results.has_table("nope")


def test_rows_of_an_op_filtered_and_ordered(db):
    with open_results(db) as results:
        assert [(r["m"], r["backend"]) for r in results.rows("gemm")] == [(64, "torch"), (64, "other"), (128, "torch")]
        assert [r["time_us"] for r in results.rows("gemm", where={"m": 64, "backend": "other"})] == [20.0]
        newest_first = results.rows("gemm", where={"backend": "torch"}, order_by=("created_at",))
        assert [r["m"] for r in newest_first] == [64, 128]
        with pytest.raises(ResultsError, match=f"^{db}: no table 'nope'$"):
            results.rows("nope")


def test_param_columns_come_from_the_key_index_in_its_order(db):
    with open_results(db) as results:
        assert results.params("gemm") == ["m", "n", "k"]
        assert results.params("add") == ["n"]
        assert results.columns("add")[:2] == ["n", "dtype_in"]
    # Without a key index: every column that is neither a key nor a measurement column.
    assert param_columns(["n", "m", "dtype_in", "time_us", "mfu"]) == ["n", "m"]
    assert param_columns(["m", "n"], key=["n", "m", *KEY_COLUMNS]) == ["n", "m"]


def test_runs_all_one_and_latest(db):
    with open_results(db) as results:
        assert [r["run_id"] for r in results.runs()] == ["r0", "r1", "r2"]
        assert results.run("r1")["started_at"] == "2026-01-01T00:00:00" and results.run("nope") is None
        assert results.latest_run()["run_id"] == "r2"
        assert results.device == "cpu"  # the device most runs measured, not the latest run's


def test_a_database_without_runs_is_named_by_its_file(tmp_path):
    path = tmp_path / "mi300x.db"
    sqlite3.connect(path).execute("create table t (x)").connection.close()
    with open_results(path) as results:
        assert results.runs() == [] and results.latest_run() is None and results.run("r") is None
        assert results.device == "mi300x" and results.ceilings() == [] and results.op_tables() == ["t"]


def test_ceilings_oldest_first_and_per_device(db):
    with open_results(db) as results:
        assert [(r["calibration_id"], r["quantity"]) for r in results.ceilings()] == [
            ("c1", "matrix"), ("c1", "copy"), ("c2", "matrix")]
        assert [r["calibration_id"] for r in results.ceilings("h100")] == ["c2"]
    assert ceilings.all_rows(db, "cpu") == [r for r in ceilings.all_rows(db) if r["device"] == "cpu"]
    assert ceilings.all_rows(db.with_name("none.db")) == []


def test_a_merge_into_a_file_that_is_not_a_database_is_one_line_and_exit_2(db, tmp_path, capsys):
    from pytest_opperf import cli

    out = tmp_path / "out.db"
    out.write_bytes(b"not a database, only text long enough to look like a header " * 20)
    before = out.read_bytes()
    assert cli.main(["merge", str(out), str(db)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and "file is not a database" in err, err
    assert out.read_bytes() == before
