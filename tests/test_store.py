"""Nothing measured is lost silently: migration of a grown op, refusals, the rescue file, merge of it.

Real pytest sessions on CPU (pytester), then the real SQLite and rescue files.
"""

import json
import re
import sqlite3
import tempfile
import types

import pytest

from conftest import FAST, rows, rows_at, write_config
from pytest_opperf import cli
from pytest_opperf.store import database as storage
from pytest_opperf.store import writer

# An op whose parameters (and their defaults) the test picks per run, as a user's op that changes
# between two runs of the same bench project.
GROWN = """

import json as _json
import os as _os

from pytest_opperf import Op, register_op


def _grown_inputs(p, dt, device, gen):
    return (torch.randn(p["n"], device=device, generator=gen, dtype=dt.input.torch),)


register_op(Op("grown", tuple(_os.environ["GROWN_PARAMS"].split(",")), _grown_inputs, lambda x: x.double() * 2,
               lambda p, d: p["n"], lambda p, d: 8 * p["n"], peak="vector",
               defaults=_json.loads(_os.environ.get("GROWN_DEFAULTS", "{}"))))


@register_backend("grown", "torch")
def grown_torch(x):
    return x * 2
"""


@pytest.fixture
def grown(project, monkeypatch):
    """The bench project with op `grown` (GROWN_PARAMS, GROWN_DEFAULTS pick its version)."""
    conftest = project.path / "conftest.py"
    conftest.write_text(conftest.read_text() + GROWN)
    (project.path / "benches" / "test_grown.py").write_text(
        "def test_grown(backend, inputs, bench):\n    bench(backend, *inputs)\n")
    return project


def version(monkeypatch, params: str, defaults: str = "{}"):
    monkeypatch.setenv("GROWN_PARAMS", params)
    monkeypatch.setenv("GROWN_DEFAULTS", defaults)


def paths(pytester):
    db = (pytester.path / "results" / "cpu.db").resolve()
    return db, db.with_name("cpu.rescue.jsonl")


def rescued(path) -> list[dict]:
    """The lines of a rescue file that carry rows, as {"table", "key", "row"}."""
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [line for line in lines if "opperf_rescue" not in line]


def columns(db, table) -> list[tuple]:
    con = sqlite3.connect(db)
    try:
        return [(r[1], r[3]) for r in con.execute(f"pragma table_info([{table}])")]  # (name, notnull)
    finally:
        con.close()


def index_columns(db, index) -> list[str]:
    con = sqlite3.connect(db)
    try:
        return [r[2] for r in con.execute(f"pragma index_info([{index}])")]
    finally:
        con.close()


# --- migration --------------------------------------------------------------------------------


def test_an_op_that_gains_a_parameter_with_a_default_migrates_its_table(grown, monkeypatch):
    version(monkeypatch, "n")
    write_config(grown, "grown", "backend: torch\ndtypes: fp32\nparams: {N: [4, 8]}\n")
    grown.runpytest("benches", "-k", "grown", *FAST).assert_outcomes(passed=2)
    old = {r["n"]: r for r in rows(grown, "grown")}
    version(monkeypatch, "n,m", '{"m": 1}')
    write_config(grown, "grown", "backend: torch\ndtypes: fp32\nparams: {N: [8, 16], M: [1, 2]}\n")
    result = grown.runpytest("benches", "-k", "grown", *FAST)
    result.assert_outcomes(passed=4)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["opperf: 4 rows written to *cpu.db (run *)"])
    db, rescue = paths(grown)
    got = {(r["n"], r["m"]): r for r in rows(grown, "grown")}
    # The old n=4 row took the default; the old n=8 row was the same case as (8, 1) and was replaced.
    assert sorted(got) == [(4, 1), (8, 1), (8, 2), (16, 1), (16, 2)]
    assert got[(4, 1)]["run_id"] == old[4]["run_id"] and got[(4, 1)]["time_us"] == old[4]["time_us"]
    assert {got[k]["run_id"] for k in got if k != (4, 1)} == {got[(8, 1)]["run_id"]} != {old[8]["run_id"]}
    # The migrated table reads as a fresh one: parameters first, NOT NULL, in the unique key.
    assert columns(db, "grown")[:3] == [("n", 1), ("m", 1), ("dtype_in", 1)]
    assert index_columns(db, "grown_key") == ["n", "m", *storage.KEY_COLUMNS]
    assert sqlite3.connect(db).execute("pragma integrity_check").fetchone()[0] == "ok"
    assert not rescue.exists()


# --- refusals ---------------------------------------------------------------------------------

REFUSALS = {
    "removed": ("n", "{}", "{N: [4, 8]}", [
        "opperf: ERROR: {db}: table 'grown' has key column(s) [[]'k'[]] that op 'grown' no longer has (a parameter "
        "removed or renamed); its rows were not written. Fix it with one of:",
        "opperf:   - keep the old rows as table grown_old: sqlite3 {db} \"ALTER TABLE [[]grown[]] RENAME TO *\"",
        "opperf:   - write to another results directory: --opperf-results=DIR",
    ], "keep the old rows"),
    "renamed": ("n,kk", "{}", "{N: [4, 8], KK: [2]}", [
        "opperf: ERROR: {db}: table 'grown' has key column(s) [[]'k'[]] that op 'grown' no longer has*",
        "opperf:   - if 'k' was renamed 'kk': sqlite3 {db} "
        "\"ALTER TABLE [[]grown[]] RENAME COLUMN [[]k[]] TO [[]kk[]]\"",
        "opperf:   - keep the old rows as table grown_old: *",
    ], "if 'k' was renamed"),
    "new without default": ("n,k,m", "{}", "{N: [4, 8], K: [2], M: [1]}", [
        "opperf: ERROR: {db}: table 'grown' lacks key column(s) [[]'m'[]] that op 'grown' now has, with no default "
        "for its old rows; its rows were not written. Fix it with one of:",
        "opperf:   - give the op a default for the old rows: Op(..., defaults={{'m': VALUE}})",
        "opperf:   - keep the old rows as table grown_old: *",
    ], "keep the old rows"),
}


@pytest.mark.parametrize("change", list(REFUSALS))
def test_a_parameter_removed_renamed_or_new_without_default_is_refused_and_rescued(grown, monkeypatch, change):
    params, defaults, grid, message, fix = REFUSALS[change]
    version(monkeypatch, "n,k")
    write_config(grown, "grown", "backend: torch\ndtypes: fp32\nparams: {N: [4], K: [2, 3]}\n")
    grown.runpytest("benches", *FAST).assert_outcomes(passed=8)
    before = rows(grown, "grown")
    others = rows(grown, "add")
    version(monkeypatch, params, defaults)
    write_config(grown, "grown", f"backend: torch\ndtypes: fp32\nparams: {grid}\n")
    result = grown.runpytest("benches", *FAST)
    result.assert_outcomes(passed=8)
    assert result.ret == pytest.ExitCode.INTERNAL_ERROR
    db, rescue = paths(grown)
    result.stdout.fnmatch_lines([line.format(db=db) for line in message] + [
        f"opperf: ERROR: 2 rows are not in the database: they were saved to {rescue}; once fixed, restore them "
        f"with: opperf merge {db} {rescue}"])
    result.stdout.no_fnmatch_line("*object at 0x*")
    # Checked before any write: the old rows are as they were; the other ops' rows were written.
    assert rows(grown, "grown") == before
    assert [r["run_id"] for r in rows(grown, "add")] != [r["run_id"] for r in others]
    lines = rescued(rescue)
    assert sorted(line["row"]["n"] for line in lines if line["table"] == "grown") == [4, 8]
    assert [line["row"]["run_id"] for line in lines if line["table"] == "runs"] == [rows(grown, "add")[0]["run_id"]]

    # The fix the message gives works as written; merge then restores the rescued rows.
    command = next(line for line in result.outlines if fix in line)
    sql = re.search(r'sqlite3 \S+ "(.*)"$', command).group(1)
    con = sqlite3.connect(db)
    con.executescript(sql)
    con.close()
    assert cli.main(["merge", str(db), str(rescue)]) == 0
    new_key = params.split(",")
    restored = {tuple(r[c] for c in new_key) for r in rows(grown, "grown")}
    assert {tuple(line["row"][c] for c in new_key) for line in lines if line["table"] == "grown"} <= restored
    if fix == "keep the old rows":
        assert sorted((r["n"], r["k"]) for r in rows(grown, "grown_old")) == [(4, 2), (4, 3)]
    else:  # renamed: the old rows live on under the new name, (4, 2) replaced by its newer row
        assert sorted(restored) == [(4, 2), (4, 3), (8, 2)]
    # The next run goes through, and reminds that a rescue file is still there.
    again = grown.runpytest("benches", "-k", "grown", *FAST)
    assert again.ret == pytest.ExitCode.OK
    again.stdout.fnmatch_lines([f"opperf: warning: {rescue} holds rows that an earlier run could not store: "
                                f"restore them with `opperf merge {db} {rescue}`, then delete it"])


# --- a results file that is not SQLite --------------------------------------------------------


def test_a_corrupt_results_file_fails_the_run_and_its_rows_are_restored_by_merge(project, tmp_path, capsys):
    db, rescue = paths(project)
    db.parent.mkdir()
    garbage = b"this is not a database, only text " * 200
    db.write_bytes(garbage)
    result = project.runpytest("benches", "-n", "2", *FAST)  # the xdist controller writes
    result.assert_outcomes(passed=6)
    assert result.ret == pytest.ExitCode.INTERNAL_ERROR
    result.stdout.fnmatch_lines([f"opperf: ERROR: {db}: file is not a database",
                                 f"opperf: ERROR: 6 rows are not in the database: they were saved to {rescue}; *"])
    result.stdout.no_fnmatch_line("*object at 0x*")
    result.stdout.no_fnmatch_line("*rows written to*")
    assert db.read_bytes() == garbage  # the file is the user's to look at: left as it was
    lines = rescued(rescue)
    # Merging into the broken file itself is refused with what to do.
    assert cli.main(["merge", str(db), str(rescue)]) == 2
    assert "not a readable SQLite database" in capsys.readouterr().err
    good = tmp_path / "restored.db"
    assert cli.main(["merge", str(good), str(rescue)]) == 0
    assert "1 rescue files ->" in capsys.readouterr().out
    for table, count in (("gemm", 2), ("add", 4)):
        want = sorted((line["row"]["test_id"], line["row"]["time_us"]) for line in lines if line["table"] == table)
        assert sorted((r["test_id"], r["time_us"]) for r in rows_at(good, table)) == want and len(want) == count
    runs = rows_at(good, "runs")
    assert len(runs) == 1 and runs[0]["run_id"] == rows_at(good, "add")[0]["run_id"]
    assert runs[0]["git_dirty"] is None or isinstance(runs[0]["git_dirty"], int)


def test_rows_no_file_takes_are_counted_as_lost(project, monkeypatch, tmp_path):
    db, rescue = paths(project)
    db.parent.mkdir()
    db.write_bytes(b"not a database " * 100)
    rescue.mkdir()  # a directory where the rescue file should go: appending to it fails
    (project.path / rescue.name).mkdir()  # the same in the working directory
    (tmp_path / "file").write_text("")
    # A temp directory that is a file (for the writer only: pytest's own capture needs the real one).
    temp = types.SimpleNamespace(gettempdir=lambda: str(tmp_path / "file"), mkstemp=tempfile.mkstemp)
    monkeypatch.setattr(writer, "tempfile", temp)
    result = project.runpytest("benches", "-k", "add", *FAST)
    result.assert_outcomes(passed=4)
    assert result.ret == pytest.ExitCode.INTERNAL_ERROR
    result.stdout.fnmatch_lines([f"opperf: ERROR: {db}: file is not a database",
                                 f"opperf: ERROR: {rescue}: cannot write the rescue file: *",
                                 f"opperf: ERROR: {project.path / rescue.name}: cannot write the rescue file: *",
                                 f"opperf: ERROR: {tmp_path / 'file'}/opperf-*-cpu.rescue.jsonl: cannot write the "
                                 "rescue file: *",
                                 "opperf: ERROR: 4 rows were lost: neither the database nor a rescue file (beside it, "
                                 "in the working directory, in the temp directory) could be written"])


def test_rows_the_folder_beside_the_database_cannot_take_go_to_the_working_directory(project):
    db, rescue = paths(project)
    db.parent.mkdir()
    db.write_bytes(b"not a database " * 100)
    rescue.mkdir()
    result = project.runpytest("benches", "-k", "add", *FAST)
    assert result.ret == pytest.ExitCode.INTERNAL_ERROR
    here = project.path / rescue.name
    result.stdout.fnmatch_lines([f"opperf: ERROR: {rescue}: cannot write the rescue file: *",
                                 f"opperf: ERROR: 4 rows are not in the database: they were saved to {here}; once "
                                 f"fixed, restore them with: opperf merge {db} {here}"])
    assert len(rescued(here)) == 5  # the run's row and 4 rows


# --- a checkpoint that fails, then writes that succeed ----------------------------------------

# Another process holding the database (a long query, a backup) for a while: locked from the set-up
# of case n=2 to the set-up of case n=3, so the checkpoint that carries n=2's row finds it locked.
LOCKER = """

import sqlite3 as _sqlite3

import pytest_opperf.store.database as _database

_database.BUSY_TIMEOUT_S = 1.0  # how long the checkpoint waits for the lock (30 s by default): the test's time
_held = []


@pytest.fixture(autouse=True)
def _hold_the_database(request):
    if "n=2]" in request.node.name:
        con = _sqlite3.connect(request.config.rootpath / "results" / "cpu.db", isolation_level=None)
        con.execute("BEGIN EXCLUSIVE")
        _held.append(con)
    if "n=3]" in request.node.name:
        _held.pop().close()
    yield
"""


def test_a_failed_checkpoint_then_good_writes_lose_and_duplicate_nothing(project, capsys):
    conftest = project.path / "conftest.py"
    conftest.write_text("import pytest\n" + conftest.read_text() + LOCKER)
    write_config(project, "add", "backend: torch\ndtypes: fp32\nparams: {N: [1, 2, 3, 4]}\n")
    # --opperf-timeout checkpoints before every case (serial run): n=1 before n=2, n=2 (locked) before
    # n=3, n=3 before n=4; n=4 goes in the session's last write.
    result = project.runpytest_subprocess("benches", "-k", "add", "--opperf-timeout=60", *FAST)
    result.assert_outcomes(passed=4)
    assert result.ret == pytest.ExitCode.INTERNAL_ERROR
    db, rescue = paths(project)
    result.stdout.fnmatch_lines(["opperf: 3 rows written to *cpu.db (run *)",
                                 f"opperf: ERROR: {db}: database is locked",
                                 f"opperf: ERROR: 1 rows are not in the database: they were saved to {rescue}; *"])
    in_db = sorted(r["n"] for r in rows(project, "add"))
    in_rescue = sorted(line["row"]["n"] for line in rescued(rescue) if line["table"] == "add")
    assert in_db == [1, 3, 4] and in_rescue == [2]  # each row in one place, none twice, none missing
    ended = rows(project, "runs")[0]["ended_at"]
    assert cli.main(["merge", str(db), str(rescue)]) == 0
    capsys.readouterr()
    assert sorted(r["n"] for r in rows(project, "add")) == [1, 2, 3, 4]
    runs = rows(project, "runs")
    assert len(runs) == 1 and runs[0]["ended_at"] == ended  # the rescued, earlier state of the run lost


# --- merge of rescue files, on hand-made files ------------------------------------------------


def record(n, time_us, created_at, run_id="r1"):
    return {"op": "add", "_params": ["n"], "n": n, "dtype_in": "fp32", "dtype_out": "fp32", "backend": "torch",
            "backend_version": "2", "knobs": "", "timer": "cpu", "cache": "hot", "time_us": time_us,
            "created_at": created_at, "run_id": run_id}


def run(run_id, ended_at):
    return {"run_id": run_id, "started_at": "2026-01-01T00:00:00+00:00", "ended_at": ended_at}


def test_merge_of_rescue_files_keeps_the_newest_row_and_reads_them_by_content(tmp_path):
    out = tmp_path / "cpu.db"
    storage.write(out, run("r0", "2026-01-02T00:00:00+00:00"), [record(1, 5.0, "2026-01-02T00:00:00+00:00", "r0")])
    rescue = tmp_path / "cpu.rescue.jsonl"
    storage.rescue(rescue, out, "locked", run("r1", "2026-01-01T00:00:00+00:00"),
                   [record(1, 9.0, "2026-01-01T00:00:00+00:00"), record(2, 9.0, "2026-01-01T00:00:00+00:00")])
    # A second run rescued into the same file: its newer row of n=2 wins over the first one's.
    storage.rescue(rescue, out, "locked", run("r2", "2026-01-03T00:00:00+00:00"),
                   [record(2, 7.0, "2026-01-03T00:00:00+00:00", "r2")])
    renamed = tmp_path / "saved.txt"  # recognised by its first line, whatever its name
    renamed.write_bytes(rescue.read_bytes())
    counts = storage.merge(out, [renamed])
    assert counts["add"] == {"read": 3, "written": 2}
    assert sorted((r["n"], r["time_us"], r["run_id"]) for r in rows_at(out, "add")) == [(1, 5.0, "r0"), (2, 7.0, "r2")]
    assert sorted(r["run_id"] for r in rows_at(out, "runs")) == ["r0", "r1", "r2"]
    before = rows_at(out, "add")
    storage.merge(out, [renamed])  # again: nothing changes
    assert rows_at(out, "add") == before


def test_a_rescue_file_cut_short_by_a_kill_keeps_its_whole_lines(tmp_path, capsys):
    rescue = tmp_path / "cpu.rescue.jsonl"
    storage.rescue(rescue, tmp_path / "cpu.db", "locked", run("r1", "x"), [record(1, 9.0, "2026-01-01")])
    with rescue.open("a") as f:
        f.write('{"table": "add", "key": ["n"], "ro')  # the process died here
    # The next rescue starts on a line of its own.
    storage.rescue(rescue, tmp_path / "cpu.db", "locked", run("r2", "y"), [record(2, 9.0, "2026-01-02", "r2")])
    out = tmp_path / "out.db"
    assert cli.main(["merge", str(out), str(rescue)]) == 0
    assert f"opperf merge: warning: {rescue}:4: not a whole JSON line" in capsys.readouterr().err
    assert sorted(r["n"] for r in rows_at(out, "add")) == [1, 2]


@pytest.mark.parametrize("text, message", [
    ('{"table": "add", "row": {}}\n', "{path}: not an opperf rescue file (line 1 comes before any 'opperf_rescue'*"),
    ('{"opperf_rescue": 1}\n{"table": "add", "row": {"n": 1}}\n', "{path}:2: table 'add': expected \"key\"*"),
    ('{"opperf_rescue": 1}\n{"table": "x y", "row": {}}\n', "{path}:2: expected {{\"table\": NAME*"),
    ('', "{path}: not an opperf rescue file (no 'opperf_rescue' header line)"),
])
def test_bad_rescue_files_are_refused_naming_the_file_and_line(tmp_path, capsys, text, message):
    path = tmp_path / "x.rescue.jsonl"
    path.write_text(text)
    out = tmp_path / "out.db"
    assert cli.main(["merge", str(out), str(path)]) == 2
    err = capsys.readouterr().err.strip()
    import fnmatch

    assert fnmatch.fnmatch(err, "opperf merge: " + message.format(path=path)), err
    assert not out.exists()


def test_a_migration_is_part_of_the_write_and_undone_with_it(tmp_path):
    db = tmp_path / "cpu.db"
    storage.write(db, run("r1", "a"), [record(1, 5.0, "2026-01-01")])
    schema = columns(db, "add")
    grown = {**record(2, 6.0, "2026-01-02", "r2"), "_params": ["n", "m"], "_defaults": {"m": 1},
             "m": None}  # NOT NULL fails the insert, after the migration
    with pytest.raises(storage.StorageError, match=f"{db}: NOT NULL constraint failed"):
        storage.write(db, run("r2", "b"), [grown])
    assert columns(db, "add") == schema and index_columns(db, "add_key") == ["n", *storage.KEY_COLUMNS]
    assert [(r["n"], r["run_id"]) for r in rows_at(db, "add")] == [(1, "r1")]
    written = storage.write(db, run("r2", "b"), [{**grown, "m": 3}])
    assert (written.rows, written.refused) == (1, {})
    assert sorted((r["n"], r["m"]) for r in rows_at(db, "add")) == [(1, 1), (2, 3)]


def test_the_timer_writes_only_when_rows_stop_arriving(tmp_path, monkeypatch):
    # While rows keep coming, `add` writes between cases and the timer thread stays out of a case's
    # timing; once none has come for the interval (a long or hung case), the timer writes them.
    now = [1000.0]
    monkeypatch.setattr(writer.time, "monotonic", lambda: now[0])
    db = tmp_path / "cpu.db"
    w = writer.ResultsWriter(db, lambda: run("r1", None), flush_interval_s=60.0)
    now[0] += 30
    w.add(record(1, 5.0, "2026-01-01T00:00:00+00:00"))
    now[0] += 40  # the checkpoint is due (70 s since the last), but a row came 40 s ago
    w.flush_if_stalled()
    assert w.pending and not db.exists()
    now[0] += 20  # 60 s without a row
    w.flush_if_stalled()
    assert not w.pending and [r["n"] for r in rows_at(db, "add")] == [1]
    w.flush_if_stalled()  # nothing waits: nothing to do
    assert w.written == 1


def test_merge_says_how_many_rows_the_file_holds(tmp_path, capsys):
    a, b, out = tmp_path / "a.db", tmp_path / "b.db", tmp_path / "out.db"
    storage.write(a, run("r1", "2026-01-01T00:00:00+00:00"),
                  [record(n, 1.0, "2026-01-01T00:00:00+00:00") for n in range(12)])
    storage.write(b, run("r2", "2026-01-02T00:00:00+00:00"),
                  [record(n, 2.0, "2026-01-02T00:00:00+00:00", "r2") for n in range(12)])
    assert cli.main(["merge", str(out), str(a), str(b)]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("add "))
    # The same 12 cases in both inputs: 12 rows in the file (before: '24 read 24 written').
    assert line.split() == ["add", "24", "rows", "read,", "12", "in", "out.db"]
    assert len(rows_at(out, "add")) == 12


@pytest.mark.parametrize("where, says", [("dir", "a directory, not a results database"),
                                         ("/dev/null", "not a regular file, so not a results database")])
def test_report_says_what_stands_where_the_database_should(tmp_path, capsys, where, says):
    path = tmp_path if where == "dir" else where
    assert cli.main(["report", str(path)]) == 2  # before: 'no such database'
    assert f"{path}: {says}" in capsys.readouterr().err


def test_compare_says_a_text_file_is_neither_a_database_nor_a_baseline(tmp_path, capsys):
    (tmp_path / "text.db").write_text("hello\n")
    storage.write(tmp_path / "x.db", run("r1", "2026-01-01T00:00:00+00:00"),
                  [record(1, 1.0, "2026-01-01T00:00:00+00:00")])
    assert cli.main(["compare", str(tmp_path / "x.db"), str(tmp_path / "text.db")]) == 2
    err = capsys.readouterr().err  # before: 'invalid JSON at line 1, column 1'
    assert f"{tmp_path / 'text.db'}: neither a results database (SQLite) nor a baseline file (JSON)" in err
