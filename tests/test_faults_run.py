"""Faults of a run, triggered for real: SIGTERM mid-sweep (serial and -n 2), a hung case, a case
stuck in native code, a read-only results folder, a full disk, report files that cannot be written.

Each test starts a real pytest session (in a subprocess of its own where a signal or a hang is the
fault, in this process otherwise) and checks what a user would: the exit
code, the one-line message, the rows in the SQLite file (PRAGMA integrity_check, the run's
ended_at) and in the rescue files: rows in the database + rows rescued == cases measured.
"""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import FAST, rows, rows_at, write_config

# Every case the process that received its row saw measured: one line per case, in `measured`.
# A sleep in each case's set-up makes the sweep last; OPPERF_HANG_AT names a case that never ends
# (python: a sleep; native: a deadlock in C, the GIL released, as a hung kernel); OPPERF_FAULT_AT
# names the case before whose set-up OPPERF_FAULT runs (a shell command: remount, fill the disk).
FAULTS = """

import ctypes as _ctypes
import os as _os
import subprocess as _subprocess
import time as _time


def pytest_runtest_logreport(report):
    if report.when == "call" and report.passed and getattr(report, "opperf_record", None) is not None:
        with open("measured", "a") as f:
            f.write(report.nodeid + "\\n")


@pytest.fixture(autouse=True)
def _slow_and_faulty(request):
    name = request.node.name
    with open("started", "a") as f:
        f.write(name + "\\n")
    if _os.environ.get("OPPERF_FAULT_AT") and name.endswith(_os.environ["OPPERF_FAULT_AT"]):
        _subprocess.run(_os.environ["OPPERF_FAULT"], shell=True, check=True)
    if _os.environ.get("OPPERF_HANG_AT") and name.endswith(_os.environ["OPPERF_HANG_AT"]):
        if _os.environ.get("OPPERF_HANG") == "native":
            mutex = _ctypes.create_string_buffer(64)  # zeroed: PTHREAD_MUTEX_INITIALIZER
            libc = _ctypes.CDLL(None)
            libc.pthread_mutex_lock(mutex)
            libc.pthread_mutex_lock(mutex)  # a default mutex locked twice: waits forever, in C
        while True:
            _time.sleep(1)
    _time.sleep(float(_os.environ.get("OPPERF_CASE_SLEEP", "0")))
    yield
"""

SWEEP = "backend: torch\ndtypes: fp32\nparams: {N: {min: 1, max: 40, step: 1}}\n"


@pytest.fixture
def sweep(project):
    conftest = project.path / "conftest.py"
    conftest.write_text("import pytest\n" + conftest.read_text() + FAULTS)
    write_config(project, "add", SWEEP)
    return project


def start(project, *args, **env):
    """A real session in its own process group (CI signals the group), output in files."""
    environ = dict(os.environ, PYTHONUNBUFFERED="1", **{k: str(v) for k, v in env.items()})
    out = open(project.path / "out.txt", "w")  # noqa: SIM115 (closed by finish)
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "benches", "-k", "add", *FAST, *args],
                            cwd=project.path, env=environ, stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True)
    proc.out = out
    return proc


def run_here(project, *args) -> tuple[int, str]:
    """A session in this process, where the fault needs no signal and no process of its own: its exit
    code and its whole output."""
    result = project.runpytest_inprocess("benches", "-k", "add", *FAST, *args)
    return result.ret, result.stdout.str() + "\n" + result.stderr.str()


def finish(proc, timeout=60) -> str:
    try:
        proc.wait(timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.out.close()
    return Path(proc.out.name).read_text()


def lines(project, name: str) -> list[str]:
    path = project.path / name
    return path.read_text().splitlines() if path.exists() else []


def wait_for(condition, timeout=60.0, what="") -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def integrity(db: Path) -> str:
    con = sqlite3.connect(db)
    try:
        return con.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        con.close()


def rescued_rows(path: Path) -> list[dict]:
    items = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [i for i in items if "opperf_rescue" not in i and i.get("table") == "add"]


# --- SIGTERM ------------------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_sigterm_mid_sweep_stores_every_row_received_and_closes_the_run(sweep, workers):
    # A flush interval longer than the run: only the signal's path can store the rows.
    proc = start(sweep, "--opperf-flush-interval=600", *workers, OPPERF_CASE_SLEEP=0.2)
    wait_for(lambda: len(lines(sweep, "measured")) >= 4, what="4 measured cases")
    os.killpg(proc.pid, signal.SIGTERM)
    signalled = time.time()
    out = finish(proc)
    assert time.time() - signalled < 15, out
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out
    measured = set(lines(sweep, "measured"))
    stored = {r["test_id"] for r in rows(sweep, "add")}
    assert measured and measured <= stored, out  # every row the session received is in the database
    assert len(stored) < 40
    assert integrity(sweep.path / "results" / "cpu.db") == "ok"
    runs = rows(sweep, "runs")
    assert len(runs) == 1 and runs[0]["ended_at"] >= runs[0]["started_at"]
    assert f"opperf: interrupted (SIGTERM): {len(stored)} measured rows kept, " in out, out
    assert f" of 40 cases not run" in out, out
    assert f"opperf: {len(stored)} rows written to {sweep.path / 'results' / 'cpu.db'}" in out, out


def test_a_hung_case_does_not_keep_earlier_rows_out_of_the_database(sweep):
    # No --opperf-timeout: case n=5 never ends. The timer's checkpoint stores n=1..4 meanwhile.
    proc = start(sweep, "--opperf-flush-interval=1", OPPERF_HANG_AT="n=5]")
    wait_for(lambda: any(s.endswith("n=5]") for s in lines(sweep, "started")), what="the hung case")
    assert len(lines(sweep, "measured")) == 4
    wait_for(lambda: len(rows(sweep, "add")) == 4, timeout=5.0, what="4 rows in the database")
    os.killpg(proc.pid, signal.SIGTERM)
    out = finish(proc, timeout=20)
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out
    assert sorted(r["n"] for r in rows(sweep, "add")) == [1, 2, 3, 4]
    assert integrity(sweep.path / "results" / "cpu.db") == "ok"
    assert "opperf: interrupted (SIGTERM): 4 measured rows kept, 36 of 40 cases not run" in out, out


def test_sigterm_while_a_case_is_stuck_in_native_code_stores_the_rows_within_the_bound(sweep):
    # The case waits in C with the GIL released (a hung kernel's sync does the same): the Python
    # handler never runs; the watch thread stores the rows and ends the process.
    proc = start(sweep, "--opperf-flush-interval=600", OPPERF_HANG_AT="n=4]", OPPERF_HANG="native")
    wait_for(lambda: any(s.endswith("n=4]") for s in lines(sweep, "started")), what="the stuck case")
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGTERM)
    signalled = time.time()
    out = finish(proc, timeout=20)
    assert time.time() - signalled < 10, out
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out
    assert sorted(r["n"] for r in rows(sweep, "add")) == [1, 2, 3]
    assert integrity(sweep.path / "results" / "cpu.db") == "ok"
    assert rows(sweep, "runs")[0]["ended_at"] is not None
    assert "opperf: SIGTERM: the session did not end within 3 s" in out, out
    assert "opperf: interrupted (SIGTERM): 3 measured rows kept, 37 of 40 cases not run" in out, out


# --- a read-only results folder, a full disk ----------------------------------------------------


@pytest.fixture
def mounted(sweep):
    """results/ as a small tmpfs (64 KiB) the test can remount read-only or fill; skipped where
    this user cannot mount (the tests run as root on the test VM, where chmod stops nobody)."""
    folder = sweep.path / "results"
    folder.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    yield folder
    subprocess.run(["umount", "-l", str(folder)], check=False)


def test_a_read_only_results_folder_is_a_usage_error_before_the_first_case(sweep, mounted):
    subprocess.run(["mount", "-o", "remount,ro", str(mounted)], check=True)
    code, out = run_here(sweep)
    assert code == pytest.ExitCode.USAGE_ERROR, out
    assert "Read-only file system" in out, out
    assert f"ERROR: {mounted / 'cpu.db'}: cannot write the results database: cannot create files in {mounted}: " \
           "Read-only file system (choose another directory with --opperf-results=DIR)" in out, out
    assert lines(sweep, "started") == []  # nothing ran


@pytest.mark.parametrize("fault", ["read-only", "full"])
def test_a_results_folder_that_fails_mid_run_loses_no_row(sweep, mounted, fault, monkeypatch):
    # From case n=6 on the folder takes nothing: remounted read-only, or filled to the last byte.
    command = (f"mount -o remount,ro {mounted}" if fault == "read-only"
               else f"dd if=/dev/zero of={mounted}/filler bs=4k 2>/dev/null || true")
    monkeypatch.setenv("OPPERF_FAULT_AT", "n=6]")
    monkeypatch.setenv("OPPERF_FAULT", command)
    code, out = run_here(sweep, "--opperf-flush-interval=0")
    assert code == pytest.ExitCode.INTERNAL_ERROR, out
    db = mounted / "cpu.db"
    rescue = sweep.path / "cpu.rescue.jsonl"  # beside the database failed too: the working directory
    assert "opperf: ERROR: " in out and f"{mounted / 'cpu.rescue.jsonl'}: cannot write the rescue file" in out, out
    measured = {m.split("::")[-1] for m in lines(sweep, "measured")}
    in_db = {r["test_id"].split("::")[-1] for r in rows_at(db, "add")}
    in_rescue = {r["row"]["test_id"].split("::")[-1] for r in rescued_rows(rescue)}
    assert len(measured) == 40 and in_db | in_rescue == measured and not in_db & in_rescue
    # How many rows the folder took before it failed depends on the journal's own files (WAL):
    # at least the first, at most the five measured before the fault.
    assert 1 <= len(in_db) <= 5 and integrity(db) == "ok"
    assert (f"opperf: ERROR: {40 - len(in_db)} rows are not in the database: they were saved to {rescue}; once "
            f"fixed, restore them with: opperf merge {db} {rescue}") in out, out
    # Once the folder takes writes again (and has room for the journal), the printed command
    # restores every row.
    subprocess.run(f"rm -f {mounted}/filler; mount -o remount,rw,size=1m {mounted}", shell=True, check=True)
    assert subprocess.run(["opperf", "merge", str(db), str(rescue)], capture_output=True).returncode == 0
    assert {r["test_id"].split("::")[-1] for r in rows_at(db, "add")} == measured


# --- report and baseline files ------------------------------------------------------------------

OUTPUTS = ["--opperf-benchmark-json", "--opperf-save-baseline", "--opperf-report-json", "--opperf-html"]


@pytest.mark.parametrize("flag", OUTPUTS)
def test_an_unwritable_report_or_baseline_path_is_a_usage_error_before_the_first_case(sweep, flag):
    (sweep.path / "afile").write_text("")
    code, out = run_here(sweep, f"{flag}=afile/out")  # below a file: no folder can be made there
    assert code == pytest.ExitCode.USAGE_ERROR, out
    assert f"ERROR: {flag}={sweep.path / 'afile' / 'out'}: cannot write it: {sweep.path / 'afile'} is not a " \
           "directory" in out, out
    assert lines(sweep, "started") == []


@pytest.mark.parametrize("flag, what", [("--opperf-benchmark-json", "cannot write"),
                                        ("--opperf-save-baseline", "baseline not written to"),
                                        ("--opperf-report-json", "JSON report not written to")])
def test_a_report_or_baseline_path_that_fails_at_the_end_fails_the_run(sweep, flag, what, monkeypatch):
    write_config(sweep, "add", "backend: torch\ndtypes: fp32\nparams: {N: [1, 2, 3]}\n")
    # During the run a folder takes the file's place: writing it at the end fails.
    monkeypatch.setenv("OPPERF_FAULT_AT", "n=2]")
    monkeypatch.setenv("OPPERF_FAULT", "mkdir out.json")
    code, out = run_here(sweep, f"{flag}=out.json")
    assert code == pytest.ExitCode.INTERNAL_ERROR, out
    assert f"opperf: ERROR: {what}" in out and str(sweep.path / "out.json") in out, out
    assert len(rows(sweep, "add")) == 3  # the rows are stored all the same


def test_a_merge_into_a_full_disk_is_one_line_and_exit_2(sweep, mounted, tmp_path):
    # The output path passes the check (an empty file fits), then SQLite fills the 64 KiB folder.
    from pytest_opperf.store import database as storage

    source = tmp_path / "big.db"
    rows_in = [{"op": "add", "_params": ["n"], "n": n, "dtype_in": "fp32", "dtype_out": "fp32", "backend": "torch",
                "backend_version": "2", "knobs": "x" * 200, "timer": "cpu", "cache": "hot", "time_us": 1.0,
                "created_at": "2026-01-01T00:00:00+00:00", "run_id": "r1"} for n in range(2000)]
    storage.write(source, {"run_id": "r1", "started_at": "2026-01-01T00:00:00+00:00"}, rows_in)
    done = subprocess.run(["opperf", "merge", str(mounted / "out.db"), str(source)], capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("opperf merge: ") and "full" in done.stderr, done.stderr
