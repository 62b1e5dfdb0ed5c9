"""Real pytest sessions on CPU: collection, the functional check, rows in the real SQLite file."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
import torch

from conftest import FAST, db_bytes, rows, write_config
from pytest_opperf.catalog.registry import library_version

KEY = ("m", "n", "k", "dtype_in", "dtype_out", "backend", "backend_version", "knobs", "timer", "cache")


def keys(table_rows, cols=KEY):
    return sorted(tuple(r[c] for c in cols) for r in table_rows)


def test_seed_config_gives_expected_rows(project):
    result = project.runpytest("benches", "-k", "gemm", *FAST)
    result.assert_outcomes(passed=2)
    got = rows(project, "gemm")
    assert [(r["m"], r["n"], r["k"]) for r in got] == [(2, 16, 8), (4, 16, 8)]
    row = got[0]
    assert (row["dtype_in"], row["dtype_out"], row["backend"]) == ("fp32", "fp32", "torch")
    assert row["backend_version"] == library_version("torch")  # the distribution's version
    assert (row["timer"], row["cache"]) == ("cpu", "hot")
    assert row["samples"] >= 3 and row["time_us"] > 0
    assert row["time_us_p95"] >= row["time_us"] >= row["time_us_min"]
    assert row["flops"] == 2 * 2 * 16 * 8 and row["bytes"] == (2 * 8 + 8 * 16 + 2 * 16) * 4
    assert row["gflops"] == pytest.approx(row["flops"] / row["time_us"] / 1e3)
    assert row["mfu"] is None  # the generic cpu spec has no peaks
    run = sqlite3.connect(project.path / "results" / "cpu.db").execute(
        "select run_id, device, torch, python, plugin_version, command, host, started_at, ended_at from runs").fetchall()
    assert len(run) == 1 and run[0][0] == row["run_id"] and run[0][1] == "cpu"
    assert run[0][2] == torch.__version__ and all(v is not None for v in run[0][3:])
    libraries = sqlite3.connect(project.path / "results" / "cpu.db").execute("select libraries from runs").fetchone()[0]
    assert json.loads(libraries) == {"torch": library_version("torch")}
    result.stdout.fnmatch_lines(["*opperf*", "test_gemm?torch-fp32-m=2-n=16-k=8?*", "*2 rows written to*cpu.db*"])


def test_rerun_replaces_rows_instead_of_duplicating(project):
    project.runpytest("benches", *FAST).assert_outcomes(passed=6)
    first = rows(project, "gemm") + rows(project, "add")
    project.runpytest("benches", *FAST).assert_outcomes(passed=6)
    second = rows(project, "gemm") + rows(project, "add")
    assert len(first) == len(second) == 6
    assert len({r["run_id"] for r in second}) == 1 and second[0]["run_id"] != first[0]["run_id"]
    runs = sqlite3.connect(project.path / "results" / "cpu.db").execute("select count(*) from runs").fetchone()[0]
    assert runs == 2


def test_xdist_writes_the_same_rows_as_serial(project):
    project.runpytest("benches", *FAST).assert_outcomes(passed=6)
    serial = keys(rows(project, "gemm")), keys(rows(project, "add"), ("n", *KEY[3:]))
    (project.path / "results" / "cpu.db").unlink()
    result = project.runpytest("benches", "-n", "2", *FAST)
    result.assert_outcomes(passed=6)
    parallel = keys(rows(project, "gemm")), keys(rows(project, "add"), ("n", *KEY[3:]))
    assert parallel == serial
    assert len(serial[0]) == 2 and len(serial[1]) == 4
    con = sqlite3.connect(project.path / "results" / "cpu.db")
    assert con.execute("select count(*) from runs").fetchone()[0] == 1  # one writer, one run


def test_a_wrong_kernel_fails_its_check_and_writes_no_row(project):
    # 1% off fails at every dtype: bf16's default bound once let it through (issue 38).
    write_config(project, "gemm", "backends: [torch, wrong]\ndtypes: [fp32, bf16, fp16]\nparams: {M: 8, N: 8, K: 8}\n")
    write_config(project, "add", "backends: [torch, transposed]\ndtypes: fp32\nparams: {N: 64}\n")
    result = project.runpytest("benches", *FAST)
    result.assert_outcomes(passed=4, failed=4)
    result.stdout.fnmatch_lines([
        # the message's shape, not this host's digits: a bf16 output 1% off measured 0.00961 on an H100
        "*functional check failed: gemm/wrong [[]wrong-fp32-m=8-n=8-k=8[]]: normwise relative error 0.0* exceeds 2.8*e-07*",
        "*functional check failed: gemm/wrong [[]wrong-bf16-m=8-n=8-k=8[]]: normwise relative error 0.0* exceeds 0.0078*",
        "*functional check failed: gemm/wrong [[]wrong-fp16-m=8-n=8-k=8[]]: normwise relative error 0.0* exceeds 0.00097*",
        "*functional check failed: add/transposed*normwise relative error*",
    ])
    assert sorted({r["backend"] for r in rows(project, "gemm")}) == ["torch"]
    assert [r["backend"] for r in rows(project, "add")] == ["torch"]
    assert result.ret == 1


BROKEN_LATER = """

import os


@register_backend("gemm", "broken_later")
def gemm_broken_later(a, b):
    # Right until OPPERF_TEST_BROKEN is set: a kernel whose later build computes 1% off.
    return (a @ b) * (1.01 if os.environ.get("OPPERF_TEST_BROKEN") else 1.0)
"""


def test_a_case_whose_check_fails_later_is_marked_and_no_view_takes_its_row(project, monkeypatch, capsys):
    from pytest_opperf import cli
    from pytest_opperf.pipeline.replay.lookup import lookup
    from pytest_opperf.pipeline.reading.signature import ProfileError

    conftest = project.path / "conftest.py"
    conftest.write_text(conftest.read_text() + BROKEN_LATER)
    write_config(project, "gemm", "backends: [torch, broken_later]\ndtypes: bf16\nparams: {M: 64, N: 64, K: 64}\n")
    project.runpytest("benches", "-k", "gemm", *FAST).assert_outcomes(passed=2)
    db = project.path / "results" / "cpu.db"
    assert lookup(db, "gemm", {"m": 64, "n": 64, "k": 64}, backend="broken_later").kind == "measured"
    monkeypatch.setenv("OPPERF_TEST_BROKEN", "1")
    result = project.runpytest("benches", "-k", "gemm", *FAST)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*functional check failed: gemm/broken_later*"])
    # The history stays, marked with the run and the message ...
    (kept,) = [r for r in rows(project, "gemm") if r["backend"] == "broken_later"]
    first_run, failing_run = [r[0] for r in sqlite3.connect(db).execute("select run_id from runs order by rowid")]
    assert kept["run_id"] == first_run and kept["check_failed"].startswith(f"{failing_run}: ")
    assert "normwise relative error 0.0" in kept["check_failed"]  # about 1% off
    # ... and nothing takes it as current: the report, the lookups.
    capsys.readouterr()
    assert cli.main(["report", str(db), "--op", "gemm"]) == 0
    report = capsys.readouterr().out
    assert "gemm: 1 cases on cpu" in report and "broken_later" not in report
    with pytest.raises(ProfileError, match="no measured row"):
        lookup(db, "gemm", {"m": 64, "n": 64, "k": 64}, backend="broken_later")
    # A run whose check passes again replaces the row: current again.
    monkeypatch.delenv("OPPERF_TEST_BROKEN")
    project.runpytest("benches", "-k", "gemm", *FAST).assert_outcomes(passed=2)
    assert [r["check_failed"] for r in rows(project, "gemm")] == [None, None]


def test_ids_marks_and_selection(project):
    result = project.runpytest("benches", "--collect-only", "-q", *FAST)
    result.stdout.fnmatch_lines([
        "benches/test_ops.py::test_gemm[[]torch-fp32-m=2-n=16-k=8[]]",
        "benches/test_ops.py::test_add[[]torch-bf16-n=4096[]]",
    ])
    assert not (project.path / "results" / "cpu.db").exists()  # collecting writes nothing
    project.runpytest("benches", "-m", "add and torch", "--collect-only", "-q", "--strict-markers", *FAST) \
        .stdout.fnmatch_lines(["*4/6 tests collected (2 deselected)*"])
    project.runpytest("benches", "-k", "bf16", "--collect-only", "-q", *FAST) \
        .stdout.fnmatch_lines(["*2/6 tests collected (4 deselected)*"])


def test_sample_only_option_and_env_write_nothing(project, monkeypatch):
    result = project.runpytest("benches", "--opperf-sample-only", *FAST)
    result.assert_outcomes(passed=6)
    result.stdout.fnmatch_lines(["*sample-only: nothing written*"])
    assert not (project.path / "results").exists()
    monkeypatch.setenv("OPPERF_SAMPLE_ONLY", "1")
    project.runpytest("benches", *FAST).assert_outcomes(passed=6)
    assert not (project.path / "results").exists()


def test_version_pin_mismatch_errors_or_skips(project):
    project.runpytest("benches", *FAST).assert_outcomes(passed=6)
    before = db_bytes(project)
    write_config(project, "gemm", "backend: torch\nbackend_version: '0.0.1'\ndtypes: fp32\nparams: {M: 8, N: 8, K: 8}\n")
    result = project.runpytest("benches", *FAST)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines([f"*gemm.yaml: backend_version: pins '0.0.1' but the installed torch is '{library_version('torch')}'*"])
    result.stdout.no_fnmatch_line("*Traceback*")
    assert db_bytes(project) == before
    result = project.runpytest("benches", "--opperf-version-mismatch=skip", "-rs", *FAST)
    result.assert_outcomes(passed=4, skipped=1)
    result.stdout.fnmatch_lines(["*SKIPPED*pins '0.0.1'*"])


# Each bad input: a clear message naming the file/key or option, no traceback, the database untouched.
BAD_CONFIGS = [
    ("M: [1, 2\n", "gemm.yaml: invalid YAML at line"),
    ("backend: torch\ndtypes: fp32\nparams: {M: {min: 1, max: 8, step: 0}, N: 1, K: 1}\n", "gemm.yaml: params.M.step: expected a number > 0"),
    ("backend: torch\ndtypes: fp32\nparams: {M: {min: 9, max: 8, step: 1}, N: 1, K: 1}\n", "gemm.yaml: params.M: min (9) is greater than max (8)"),
    ("backend: torch\ndtypes: fp9\nparams: {M: 1, N: 1, K: 1}\n", "gemm.yaml: dtypes: unknown dtype 'fp9'"),
    ("backend: torch\ndtypes: fp32\nparams: {M: 1, N: 1, K: 1}\ncolor: red\n", "gemm.yaml: color: unknown key"),
    ("backend: torch\ndtypes: fp32\nparams: {M: one, N: 1, K: 1}\n", "gemm.yaml: params.m: expected int values for this parameter, got str 'one'"),
    ("backend: torch\ndtypes: fp32\nparams: {M: {min: 1, max: 2, step: 0.5}, N: 1, K: 1}\n", "gemm.yaml: params.M.step: expected int values*got float 0.5"),
    ("backend: nope\ndtypes: fp32\nparams: {M: 1, N: 1, K: 1}\n", "gemm.yaml: backend 'nope': not registered for op 'gemm' (registered: [[]*'torch', 'torch_compile'*[]])"),
    ("backend: torch\ndtypes: fp32\nparams:\n  M: {min: 1, max: 100, step: 1}\n  N: {min: 1, max: 100, step: 1}\n  K: [1]\n",
     "gemm.yaml: the grid has 10000 cases, more than --opperf-max-cases=5000 (params.M: 100 x params.N: 100)*"),
    ("backend: torch\ndtypes: fp32\nparams: {M: {min: 1, max: 1000000000000, step: 1}, N: 1, K: 1}\n",
     "gemm.yaml: the grid has 1000000000000 cases, more than --opperf-max-cases=5000 (params.M: 1000000000000)*"),
]


@pytest.mark.parametrize("text, message", BAD_CONFIGS)
def test_bad_configs_are_collection_errors_that_keep_the_database(project, text, message):
    project.runpytest("benches", "-k", "add", *FAST).assert_outcomes(passed=4)
    before = db_bytes(project)
    write_config(project, "gemm", text)
    result = project.runpytest("benches", *FAST)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*ERROR collecting benches/test_ops.py*", f"*{message}*"])
    result.stdout.no_fnmatch_line("*Traceback*")
    result.stdout.no_fnmatch_line("*site-packages*")
    assert db_bytes(project) == before


def test_grid_limit_is_configurable(project):
    write_config(project, "add", "backend: torch\ndtypes: fp32\nparams: {N: {min: 1, max: 30, step: 1}}\n")
    result = project.runpytest("benches", "-k", "add", "--opperf-max-cases=20", "--collect-only", *FAST)
    result.stdout.fnmatch_lines(["*add.yaml: the grid has 30 cases, more than --opperf-max-cases=20*"])
    result = project.runpytest("benches", "-k", "add", "--collect-only", "-q", *FAST)
    result.stdout.fnmatch_lines(["*30/32 tests collected*"])


@pytest.mark.parametrize("args, message", [
    (["--device=tpu9"], "--device=tpu9: unknown device; known: *a100*cpu*h100*"),
    (["--device=../../etc"], "--device=../../etc: a device name is lower-case letters*"),
    pytest.param(["--device=h100"], "--device=h100: h100 runs on cuda, but this machine has no accelerator",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")),
    (["--opperf-timer=stopwatch"], "--opperf-timer=stopwatch: expected auto or one of*"),
    (["--opperf-cache=lukewarm"], "--opperf-cache=lukewarm: expected auto, cold, hot or resident"),
    (["--opperf-target=150%"], "--opperf-target=150%: expected a fraction between 0 and 100%"),
    (["--opperf-min-samples=0"], "--opperf-min-samples=0: expected an integer >= 1"),
    (["--opperf-budget=soon"], "--opperf-budget=soon: expected a number >= 0"),
    (["--opperf-warmup=soon"], "--opperf-warmup=soon: expected auto or seconds >= 0"),
    (["--opperf-version-mismatch=warn"], "--opperf-version-mismatch=warn: expected error or skip"),
    (["--opperf-config=nope.yaml"], "--opperf-config=*nope.yaml: no such file"),
])
def test_bad_options_are_usage_errors(project, args, message):
    project.runpytest("benches", "-k", "add", *FAST).assert_outcomes(passed=4)
    before = db_bytes(project)
    fast = [a for a in FAST if not a.startswith("--device")]
    result = project.runpytest("benches", *fast, *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message}"])
    assert db_bytes(project) == before


def test_ini_keys_set_options_and_the_command_line_wins(project):
    project.makeini("[pytest]\nopperf_sample_only = true\nopperf_min_samples = 4\n")
    result = project.runpytest("benches", "-k", "add and fp32", *FAST[:3], "--opperf-warmup=0")
    result.assert_outcomes(passed=2)
    assert not (project.path / "results").exists()
    project.makeini("[pytest]\nopperf_min_samples = 7\nopperf_results = out\n")
    project.runpytest("benches", "-k", "add and fp32", *FAST[:3], "--opperf-warmup=0").assert_outcomes(passed=2)
    got = rows(project, "add", device="cpu") or []
    assert got == []  # written under out/, not results/
    con = sqlite3.connect(project.path / "out" / "cpu.db")
    assert min(r[0] for r in con.execute("select samples from [add]")) >= 7
    project.runpytest("benches", "-k", "add and fp32", *FAST).assert_outcomes(passed=2)
    assert min(r[0] for r in con.execute("select samples from [add]")) >= 3


def test_explicit_config_file_and_marker(project):
    other = project.path / "my_add.yaml"
    other.write_text("op: add\nbackend: torch\ndtypes: fp32\nparams: {N: [7, 9]}\n")
    result = project.runpytest("benches", "-k", "add", "--opperf-config=my_add.yaml", "--collect-only", "-q", *FAST)
    result.stdout.fnmatch_lines(["*test_add[[]torch-fp32-n=7[]]*", "*test_add[[]torch-fp32-n=9[]]*"])
    project.makepyfile(test_marked="""
        import pytest

        @pytest.mark.opperf(op="add", config="my_add.yaml")
        def test_vector_sum(backend, inputs, bench):
            bench(backend, *inputs)

        def test_unknown_op(bench):
            pass
    """)
    result = project.runpytest("test_marked.py", *FAST)
    result.stdout.fnmatch_lines(["*test_marked.py::test_unknown_op: cannot tell which op this test benchmarks*"])
    result = project.runpytest("test_marked.py", "-k", "vector", *FAST)
    assert result.ret == pytest.ExitCode.INTERRUPTED  # the collection error of the other test stops the run


def test_a_killed_run_leaves_a_valid_database_with_earlier_rows(project):
    project.runpytest("benches", "-k", "gemm", *FAST).assert_outcomes(passed=2)
    earlier = keys(rows(project, "gemm"))
    write_config(project, "add", "backend: torch\ndtypes: fp32\nparams: {N: {min: 1, max: 400, step: 1}}\n")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    # Checkpoint after every row, so the kill lands between, or in the middle of, writes.
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "benches", "-k", "add", *FAST,
                             "--opperf-flush-interval=0", "-q"], cwd=project.path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline and len(rows(project, "add")) < 20:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    con = sqlite3.connect(project.path / "results" / "cpu.db")
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert 20 <= len(rows(project, "add")) < 400
    assert keys(rows(project, "gemm")) == earlier


def test_a_case_whose_inputs_fail_is_an_error_with_no_row(project):
    project.makepyfile(conftest_extra="")
    (project.path / "conftest.py").write_text(
        (project.path / "conftest.py").read_text() + """

from pytest_opperf import Op, register_op


def _inputs(p, dt, device, gen):
    raise RuntimeError("cannot build inputs")


register_op(Op("broken", ("n",), _inputs, lambda x: x, lambda p, d: 1, lambda p, d: 1))


@register_backend("broken", "torch")
def broken_torch(x):
    return x
""")
    (project.path / "benches" / "test_broken.py").write_text(
        "def test_broken(backend, inputs, bench):\n    bench(backend, *inputs)\n")
    write_config(project, "broken", "backend: torch\ndtypes: fp32\nparams: {N: 4}\n")
    result = project.runpytest("benches", "-k", "broken", *FAST)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*RuntimeError: cannot build inputs*"])
    assert rows(project, "broken") == []


def test_the_profiler_starts_before_the_first_case_of_a_sweep_only(project, monkeypatch):
    from pytest_opperf.measure import timers

    calls = []

    def fake_start(device_type, timer_name):
        calls.append((device_type, timer_name))
        return 0.25

    monkeypatch.setattr(timers, "start_profiler", fake_start)
    result = project.runpytest("benches", "-k", "add", *FAST)
    result.assert_outcomes(passed=4)
    assert calls == [("cpu", "auto")]
    result.stdout.fnmatch_lines(["*start-up * s to the first case, of which 0.2 s the profiler's start*"])
    project.runpytest("benches", "--collect-only", *FAST)
    assert len(calls) == 1  # nothing runs: nothing to start
    (project.path / "test_plain.py").write_text("def test_plain():\n    assert 1 + 1 == 2\n")
    project.runpytest("test_plain.py", *FAST).assert_outcomes(passed=1)
    assert len(calls) == 1  # a project's own tests, not a sweep: the plugin starts nothing
    project.runpytest("benches", "-k", "add", "--opperf-timer=cpu", *FAST).assert_outcomes(passed=4)
    assert calls[-1] == ("cpu", "cpu")  # the timer is timers.start_profiler's to judge


def test_a_profiler_that_fails_to_start_is_a_warning_and_the_sweep_goes_on(project, monkeypatch):
    from pytest_opperf.measure import timers

    def broken_start(device_type, timer_name):
        raise RuntimeError("CUPTI_ERROR_NOT_INITIALIZED")

    monkeypatch.setattr(timers, "start_profiler", broken_start)
    result = project.runpytest("benches", "-k", "add", *FAST)
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["opperf: WARNING: starting the profiler before the first case failed (RuntimeError: "
                                 "CUPTI_ERROR_NOT_INITIALIZED); the first case's sampling started it"])
    assert len(rows(project, "add")) == 4
    assert "of which" not in result.stdout.str()  # no start paid, none reported


def test_a_sweep_freezes_its_start_up_heap_for_its_cases_and_thaws_it_at_the_end(project):
    import gc

    (project.path / "benches" / "conftest.py").write_text(
        "import gc\nFROZEN = []\n\n\ndef pytest_runtest_call(item):\n    FROZEN.append(gc.get_freeze_count())\n"
        "\n\ndef pytest_unconfigure(config):\n    print('frozen during cases:', min(FROZEN), flush=True)\n")
    result = project.runpytest("benches", "-k", "add", "-s", *FAST)
    result.assert_outcomes(passed=4)
    frozen = int(result.stdout.str().split("frozen during cases:")[1].split()[0])
    assert frozen > 10000  # torch's modules, pytest, the plugin, the cases: out of the full collections' way
    assert gc.get_freeze_count() == 0  # this process goes on after its in-process session: nothing stays frozen
    assert len(rows(project, "add")) == 4
    (project.path / "test_plain.py").write_text("import gc\n\n\ndef test_plain():\n    assert gc.get_freeze_count() == 0\n")
    project.runpytest("test_plain.py", *FAST).assert_outcomes(passed=1)  # a project's own tests: nothing frozen


def test_triton_cache_is_pinned_to_tritons_default_unless_set():
    from pytest_opperf.run.machine import pin_triton_cache

    env = {"TRITON_HOME": "/data/th"}
    assert pin_triton_cache(env) == "/data/th/.triton/cache" and env["TRITON_CACHE_DIR"] == "/data/th/.triton/cache"
    env = {"HOME": "/x"}
    path = pin_triton_cache(env)
    assert path == os.path.join(os.path.expanduser("~/"), ".triton", "cache") == env["TRITON_CACHE_DIR"]
    env = {"TRITON_CACHE_DIR": "/mine", "TRITON_HOME": "/data/th"}
    assert pin_triton_cache(env) is None and env["TRITON_CACHE_DIR"] == "/mine"  # the user's choice stands


def test_a_sweep_pins_tritons_cache_before_its_first_case_and_plain_tests_do_not(project, monkeypatch):
    # Inductor would otherwise point TRITON_CACHE_DIR at its own directory mid-sweep.
    monkeypatch.setenv("TRITON_CACHE_DIR", "-")  # so that the teardown unsets what the sweep sets
    monkeypatch.delenv("TRITON_CACHE_DIR")
    monkeypatch.setenv("TRITON_HOME", str(project.path / "th"))
    (project.path / "test_plain.py").write_text(
        "import os\ndef test_plain():\n    assert 'TRITON_CACHE_DIR' not in os.environ\n")
    project.runpytest("test_plain.py", *FAST).assert_outcomes(passed=1)
    (project.path / "benches" / "test_seen.py").write_text(
        "import os\nimport pytest\n@pytest.mark.opperf(op='add', config='configs/seen.yaml')\n"
        "def test_seen(backend, inputs, bench):\n    bench(backend, *inputs)\n"
        "    assert os.environ['TRITON_CACHE_DIR'] == os.path.join(os.environ['TRITON_HOME'], '.triton', 'cache')\n")
    write_config(project, "seen", "op: add\nbackend: torch\ndtypes: fp32\nparams: {N: 64}\n")
    project.runpytest("benches", "-k", "seen", *FAST).assert_outcomes(passed=1)
