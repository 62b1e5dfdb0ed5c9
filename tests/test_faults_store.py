"""Nothing lost when others use the database too: concurrent sessions and merges, readers of a file
being written, and a table migrated from an older version says so.

Real pytest sessions in subprocesses (two at once on one results directory), then the real SQLite file.
"""

import json
import sqlite3
import subprocess
import sys
import threading
import time

import pytest

from conftest import FAST, rows_at, write_config
from pytest_opperf import cli
from pytest_opperf.store import database as storage
from pytest_opperf.store.results import open_results

# Enough cases in both dtypes that two sessions' checkpoints (one per row) overlap for seconds.
MANY = "backend: torch\ndtypes: [fp32, bf16]\nparams:\n  N: [{}]\n".format(", ".join(str(64 * i) for i in range(1, 21)))
CHECKPOINT_EVERY_ROW = "--opperf-flush-interval=0"


def start(pytester, results: str, *args: str) -> subprocess.Popen:
    """A real session in its own process, writing every row as soon as it is measured."""
    cmd = [sys.executable, "-m", "pytest", "benches", *FAST, CHECKPOINT_EVERY_ROW, f"--opperf-results={results}", *args]
    return pytester.popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                          text=True)


def written(pytester, results: str, *args: str) -> None:
    """A session before the one under test, in this process (quicker than one of its own)."""
    pytester.runpytest("benches", *FAST, f"--opperf-results={results}", *args).assert_outcomes(passed=2)


def finish(proc: subprocess.Popen) -> str:
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    return out


def integrity(db) -> str:
    con = sqlite3.connect(db)
    try:
        return con.execute("pragma integrity_check").fetchone()[0]
    finally:
        con.close()


@pytest.mark.parametrize("round_", range(3))  # three rounds: a race that is likely becomes near certain
def test_two_sessions_writing_one_database_at_once_lose_nothing(project, round_):
    write_config(project, "add", MANY)
    results = f"results{round_}"
    # Round 0 starts on no file (both create it), the others on a database an earlier session wrote.
    if round_:
        written(project, results, "-k", "gemm")
    a = start(project, results, "-k", "add and fp32")
    b = start(project, results, "-k", "add and bf16")
    out_a, out_b = finish(a), finish(b)
    db = project.path / results / "cpu.db"
    assert not storage.rescue_path(db).exists(), out_a + out_b
    got = rows_at(db, "add")
    assert sorted((r["n"], r["dtype_in"]) for r in got) == sorted((64 * i, d) for i in range(1, 21)
                                                                  for d in ("fp32", "bf16"))
    assert len({r["run_id"] for r in got}) == 2
    assert len(rows_at(db, "runs")) == 2 + (1 if round_ else 0)
    assert "opperf: 20 rows written to" in out_a and "opperf: 20 rows written to" in out_b
    assert integrity(db) == "ok"


def test_merge_into_a_database_a_session_is_writing(project):
    write_config(project, "add", MANY)
    written(project, "shard", "-k", "gemm")
    shard = project.path / "shard" / "cpu.db"
    db = project.path / "results" / "cpu.db"
    session = start(project, "results", "-k", "add")
    merged = 0
    while session.poll() is None:  # merge again and again while the session checkpoints every row
        if db.exists():
            assert cli.main(["merge", str(db), str(shard)]) == 0
            merged += 1
        time.sleep(0.05)
    out = finish(session)
    assert merged >= 2, out
    assert not storage.rescue_path(db).exists(), out
    assert len(rows_at(db, "add")) == 40 and len(rows_at(db, "gemm")) == len(rows_at(shard, "gemm")) == 2
    assert len(rows_at(db, "runs")) == 2
    assert integrity(db) == "ok"


def test_a_reader_reads_while_a_writer_holds_its_transaction(tmp_path):
    db = tmp_path / "cpu.db"
    run = {"run_id": "r1", "started_at": "2026-01-01T00:00:00+00:00"}
    storage.write(db, run, [_record(4)])
    writer = sqlite3.connect(db, isolation_level=None)
    try:
        assert writer.execute("pragma journal_mode").fetchone()[0] == "wal"
        # EXCLUSIVE: a writer in the middle of its commit (or one whose rows no longer fit its cache).
        writer.execute("begin exclusive")
        writer.execute("update [add] set time_us = 99")
        started = time.monotonic()
        with open_results(db) as results:
            assert [r["time_us"] for r in results.rows("add")] == [1.0]  # the committed row
            assert results.runs()[0]["run_id"] == "r1"
        assert time.monotonic() - started < 2  # read at once, not after a wait for the writer
        writer.execute("commit")
    finally:
        writer.close()
    with open_results(db) as results:
        assert [r["time_us"] for r in results.rows("add")] == [99.0]


def test_a_writer_waits_for_another_writer_instead_of_failing(tmp_path):
    db = tmp_path / "cpu.db"
    storage.write(db, {"run_id": "r1"}, [_record(4)])
    holder = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    holder.execute("begin immediate")
    threading.Timer(1.0, holder.execute, ["commit"]).start()  # another session's checkpoint, one second long
    assert storage.write(db, {"run_id": "r2"}, [_record(8)]).rows == 1
    holder.close()
    assert sorted(r["n"] for r in rows_at(db, "add")) == [4, 8]


# --- the migration note -----------------------------------------------------------------------

OLDER = ["first_call_ms", "tuned_table"]  # columns the plugin added after the table was made


def make_older(db, table: str, dropped: list[str]) -> None:
    """The table as an older plugin version made it: without the columns it did not know yet."""
    con = sqlite3.connect(db)
    try:
        for column in dropped:
            con.execute(f"alter table [{table}] drop column [{column}]")
        con.commit()
    finally:
        con.close()


def test_a_session_that_migrates_an_older_table_says_so(project):
    project.runpytest("benches", "-k", "add and fp32", *FAST).assert_outcomes(passed=2)
    db = (project.path / "results" / "cpu.db").resolve()
    make_older(db, "add", OLDER)
    result = project.runpytest("benches", "-k", "add", *FAST)
    result.assert_outcomes(passed=4)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines([f"opperf: {db}: table add: added columns first_call_ms, tuned_table "
                                 f"(migrated from an older version)"])
    assert "table gemm" not in result.stdout.str()
    first, second = rows_at(db, "runs")
    assert first["migrations"] is None
    assert json.loads(second["migrations"]) == {"add": OLDER}
    # The old rows are kept (NULL in the new columns), the new ones have them.
    got = rows_at(db, "add")
    assert len(got) == 4 and {r["dtype_in"] for r in got} == {"fp32", "bf16"}
    # A later session on the migrated table has nothing to say.
    again = project.runpytest("benches", "-k", "add", *FAST)
    assert "migrated" not in again.stdout.str()
    assert rows_at(db, "runs")[-1]["migrations"] is None


def test_a_note_of_each_checkpoint_adds_up_in_the_runs_row(tmp_path):
    db = tmp_path / "cpu.db"
    storage.write(db, {"run_id": "r0"}, [_record(4), _record(4, op="mul")])
    make_older(db, "add", ["first_call_ms"])
    make_older(db, "mul", ["tuned_table"])
    run = {"run_id": "r1"}
    assert storage.write(db, run, [_record(8)]).migrated == {"add": ["first_call_ms"]}
    assert storage.write(db, run, [_record(8, op="mul")]).migrated == {"mul": ["tuned_table"]}
    assert storage.write(db, run, [_record(16)]).migrated == {}
    assert json.loads(rows_at(db, "runs")[-1]["migrations"]) == {"add": ["first_call_ms"], "mul": ["tuned_table"]}


def test_merge_says_which_tables_it_migrated(project, capsys):
    project.runpytest("benches", "-k", "add and fp32", *FAST).assert_outcomes(passed=2)
    db = project.path / "results" / "cpu.db"
    make_older(db, "add", OLDER)
    project.runpytest("benches", "-k", "add and bf16", "--opperf-results=new", *FAST).assert_outcomes(passed=2)
    capsys.readouterr()
    assert cli.main(["merge", str(db), str(project.path / "new" / "cpu.db")]) == 0
    out = capsys.readouterr().out
    assert f"opperf merge: {db}: table add: added columns first_call_ms, tuned_table (migrated from an older " \
           f"version)" in out
    assert len(rows_at(db, "add")) == 4


def _record(n: int, op: str = "add") -> dict:
    """A minimal stored record of op(n) (the measurement columns left NULL but time_us)."""
    from pytest_opperf.columns import KEY, MEASURE

    record = {column: None for column in [*KEY, *MEASURE]}
    record.update(op=op, _params=["n"], n=n, dtype_in="fp32", dtype_out="fp32", backend="torch",
                  backend_version="2", knobs="", timer="cpu", cache="hot", time_us=1.0, run_id="r",
                  created_at=f"2026-01-01T00:00:{n % 60:02d}.000+00:00")
    return record
