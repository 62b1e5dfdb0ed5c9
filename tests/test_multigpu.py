"""Many GPUs, many hosts, on a CPU: crash isolation in real xdist sessions, timeouts, the memory
budget, sharding, merge. Backends built to crash stand in for broken kernels."""

import fnmatch
import sqlite3
import time
from types import SimpleNamespace

import pytest
import torch

from conftest import FAST, rows, rows_at, write_config
from pytest_opperf import cli
from pytest_opperf.hardware import specs
from pytest_opperf.run import isolation, xdist
from pytest_opperf.store import database as storage

# A backend of `add` that fails in a chosen way on chosen sizes, the way broken kernels do.
FRAGILE = """

import ctypes
import time

import torch


DEVICE = {"state": "ok"}  # the device as a probe would find it, per process like a CUDA context


@register_backend("add", "fragile")
def add_fragile(a, b):
    n = a.numel()
    if n % 10 == 3:
        ctypes.string_at(0)  # segmentation fault
    if n == 5:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
    if n == 6:
        time.sleep(60)
    if n == 7:
        DEVICE["state"] = "poisoned"
        raise torch.AcceleratorError("CUDA error: an illegal memory access was encountered")
    if n == 9:  # cuBLAS refusing its arguments: an error, but the context still works
        raise RuntimeError("CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling cublasLtMatmul")
    if n == 11:
        DEVICE["state"] = "hung"
        raise RuntimeError("CUDA error: unspecified launch failure")
    return torch.add(a, b)
"""

# A CPU has no context to poison, so the guard probes nothing there. This stands in for the
# probe of a CUDA context: it fails the way a poisoned one does, and never answers when hung.
FAKE_CONTEXT = """

from pytest_opperf.run import isolation


def fake_probe(device):
    if DEVICE["state"] == "poisoned":
        raise torch.AcceleratorError("CUDA error: an illegal memory access was encountered")
    if DEVICE["state"] == "hung":
        time.sleep(3600)


_REAL = (isolation.context_exists, isolation.probe, isolation.PROBE_TIMEOUT_S)


def pytest_configure(config):
    isolation.context_exists = lambda device: True
    isolation.probe = fake_probe
    isolation.PROBE_TIMEOUT_S = 1.0


def pytest_unconfigure(config):  # an in-process run (an xdist controller) leaves the suite's isolation as it was
    isolation.context_exists, isolation.probe, isolation.PROBE_TIMEOUT_S = _REAL
"""

ADD_KEY = ("n", "dtype_in", "dtype_out", "backend", "backend_version", "knobs", "timer", "cache")
GEMM_KEY = ("m", "n", "k", *ADD_KEY[1:])


def _session(project, workers: list, *args: str):
    """A session of the fragile backends: under xdist in this process (only the controller; the
    workers that crash or hang are processes of their own), serially in a process of its own (a
    crash or a hang there would be the suite's)."""
    if workers:
        return project.runpytest(*args, *workers)
    return project.runpytest_subprocess(*args, timeout=300)


def keys(table_rows, cols):
    return sorted(tuple(r[c] for c in cols) for r in table_rows)


@pytest.fixture
def fragile(project):
    (project.path / "conftest.py").write_text((project.path / "conftest.py").read_text() + FRAGILE + FAKE_CONTEXT)
    return project


def integrity(project, device="cpu") -> str:
    con = sqlite3.connect(project.path / "results" / f"{device}.db")
    try:
        return con.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        con.close()


def test_crashing_cases_fail_alone_under_xdist_and_every_other_row_is_stored(fragile):
    # fragile: n=3 segfaults its worker, n=5 runs out of memory, n=7 poisons the device context.
    write_config(fragile, "add", "backends: [torch, fragile]\ndtypes: fp32\nparams: {N: [2, 3, 4, 5, 7, 8]}\n")
    result = fragile.runpytest("benches", "-k", "add", "-n", "2", *FAST)
    result.assert_outcomes(passed=9, failed=3)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    # Each failure names its case and why (our words and Python's, not xdist's wording of a crash).
    result.stdout.fnmatch_lines_random([
        "FAILED *test_add?fragile-fp32-n=3?*",
        "*Fatal Python error: Segmentation fault*",
        "FAILED *test_add?fragile-fp32-n=5?*",
        "*OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB*",
        "FAILED *test_add?fragile-fp32-n=7?*",
        "*opperf: AcceleratorError in *fragile-fp32-n=7*; the device no longer works (probe: AcceleratorError: "
        "CUDA error: an illegal memory access was encountered), so the worker was replaced*",
        "*illegal memory access*",
    ])
    got = rows(fragile, "add")
    failed = {("fragile", 3), ("fragile", 5), ("fragile", 7)}
    expected = {(b, n) for b in ("torch", "fragile") for n in (2, 3, 4, 5, 7, 8)} - failed
    assert sorted((r["backend"], r["n"]) for r in got) == sorted(expected)
    assert integrity(fragile) == "ok"
    assert {r["worker"] for r in got} <= {"gw0", "gw1", "gw2", "gw3"} and len({r["worker"] for r in got}) >= 2
    assert all(r["gpu"] is None and r["gpu_uuid"] is None for r in got)  # a CPU has no GPU to name


def test_case_crashes_do_not_use_up_worker_restarts(fragile):
    # xdist's own limit would stop after 4 crashes of one worker; crashes inside cases don't count.
    write_config(fragile, "add", "backend: fragile\ndtypes: fp32\nparams: {N: [3, 13, 23, 33, 43, 2, 4]}\n")
    result = fragile.runpytest("benches", "-k", "add", "-n", "1", *FAST)
    result.assert_outcomes(passed=2, failed=5)  # n=2 and 4 run after the five crashes
    assert sorted(r["n"] for r in rows(fragile, "add")) == [2, 4]


def test_user_max_worker_restart_still_applies(fragile):
    write_config(fragile, "add", "backend: fragile\ndtypes: fp32\nparams: {N: [3, 2]}\n")
    result = fragile.runpytest("benches", "-k", "add", "-n", "1", "--max-worker-restart=0", *FAST)
    # The crash at n=3 ends the only worker and none replaces it, so n=2 never runs (judged by
    # what ran, not by xdist's wording of it, which is xdist's to change).
    result.assert_outcomes(failed=1)
    assert result.ret != pytest.ExitCode.OK and rows(fragile, "add") == []


def test_timeout_under_xdist_replaces_the_worker(fragile):
    write_config(fragile, "add", "backend: fragile\ndtypes: fp32\nparams: {N: [2, 6, 4]}\n")
    result = fragile.runpytest("benches", "-k", "add", "-n", "1", "--opperf-timeout=3", *FAST)
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines([
        "*opperf: the case ran past --opperf-timeout and its worker was stopped; it was here:*",
        "*Timeout (0:00:03)!*",
        "*in add_fragile*",
        "FAILED *test_add?fragile-fp32-n=6?*",
    ])
    assert sorted(r["n"] for r in rows(fragile, "add")) == [2, 4]


def test_serial_timeout_oom_and_poisoned_device(fragile):
    # Serial order: each shape, torch then fragile. n=5 OOM and n=6 timeout fail and the run goes
    # on; n=7 (the last case) stops the run: the process cannot be replaced.
    write_config(fragile, "add", "backends: [torch, fragile]\ndtypes: fp32\nparams: {N: [2, 5, 6, 7, 8]}\n")
    result = fragile.runpytest_subprocess("benches", "-k", "add", "--opperf-timeout=2", *FAST)
    result.assert_outcomes(passed=5, failed=3)
    result.stdout.fnmatch_lines_random([
        "*OutOfMemoryError: CUDA out of memory*",
        "*CaseTimeout: opperf: the case ran past --opperf-timeout=2 s*",
        "*Interrupted: opperf: AcceleratorError in *fragile-fp32-n=7*, and then the device no longer worked "
        "(probe: AcceleratorError: CUDA error: an illegal memory access was encountered); stopping, rows measured so "
        "far are stored (run with -n 1 to replace the process and go on)*",
    ])
    got = rows(fragile, "add")
    assert sorted((r["backend"], r["n"]) for r in got) == [
        ("fragile", 2), ("torch", 2), ("torch", 5), ("torch", 6), ("torch", 7)]  # n=8 comes after the stop
    assert all(r["worker"] is None for r in rows(fragile, "add"))


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_an_error_that_leaves_the_device_working_fails_only_its_case(fragile, workers):
    # n=9 raises as cuBLAS does when it refuses its arguments; the probe finds the context working.
    # Nothing crashes or hangs: the serial session runs in this process too.
    write_config(fragile, "add", "backend: fragile\ndtypes: fp32\nparams: {N: [2, 9, 4, 8, 10]}\n")
    result = fragile.runpytest("benches", "-k", "add", *FAST, *workers)
    result.assert_outcomes(passed=4, failed=1)
    result.stdout.fnmatch_lines_random([
        "*RuntimeError: CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling cublasLtMatmul",
        "FAILED *test_add?fragile-fp32-n=9?*",
        "*the device answered a probe after this error: it still works*",
    ])
    result.stdout.no_fnmatch_line("*crashed*")
    result.stdout.no_fnmatch_line("*Interrupted*")
    got = rows(fragile, "add")
    assert sorted(r["n"] for r in got) == [2, 4, 8, 10]
    assert {r["worker"] for r in got} <= ({"gw0", "gw1"} if workers else {None})  # no worker was replaced


HOOK_ROWS_AT_STOP = """

import sqlite3


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session):
    # Before the plugin's own session-end write: what the stop itself stored.
    con = sqlite3.connect(session.config.rootpath / "results" / "cpu.db")
    print("rows stored at the stop:", sorted(n for (n,) in con.execute("select n from [add]")))
"""


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_a_device_that_stops_answering_ends_the_serial_run_or_its_worker(fragile, workers):
    # n=11 hangs the (fake) device: the probe gets no answer within its 1 s.
    if not workers:
        conftest = fragile.path / "conftest.py"
        conftest.write_text("import pytest\n" + conftest.read_text() + HOOK_ROWS_AT_STOP)
    write_config(fragile, "add", "backend: fragile\ndtypes: fp32\nparams: {N: [2, 4, 11, 8]}\n")
    # A flush interval longer than the run: only the stop can have stored the rows before session end.
    # The hung probe is abandoned after its timeout: the run ends long before the probe would (3600 s).
    result = _session(fragile, workers, "benches", "-k", "add", "-s", "--opperf-flush-interval=600", *FAST)
    if workers:
        result.assert_outcomes(passed=3, failed=1)
        result.stdout.fnmatch_lines_random([
            "*worker 'gw*' crashed while running*test_add?fragile-fp32-n=11?*",
            "*opperf: RuntimeError in *n=11* (call); the device no longer works (probe: no answer within 1 s), "
            "so the worker was replaced*",
            "*replacing crashed worker*",
        ])
        assert sorted(r["n"] for r in rows(fragile, "add")) == [2, 4, 8]
    else:
        result.assert_outcomes(passed=2, failed=1)
        result.stdout.fnmatch_lines_random([
            "*Interrupted: opperf: RuntimeError in *fragile-fp32-n=11*, and then the device no longer worked "
            "(probe: no answer within 1 s); stopping, rows measured so far are stored (run with -n 1*",
            "*rows stored at the stop: [[]2, 4[]]",
        ])
        assert sorted(r["n"] for r in rows(fragile, "add")) == [2, 4]  # n=8 comes after the stop


def test_a_cpu_session_probes_nothing_and_goes_on(project):
    # Without an accelerator context there is nothing to poison: even an AcceleratorError (as
    # raised here on a CPU) fails its case alone, serially too.
    (project.path / "conftest.py").write_text((project.path / "conftest.py").read_text() + FRAGILE)
    write_config(project, "add", "backend: fragile\ndtypes: fp32\nparams: {N: [2, 7, 4]}\n")
    result = project.runpytest("benches", "-k", "add", *FAST)
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*AcceleratorError: CUDA error: an illegal memory access was encountered",
                                 "FAILED *test_add?fragile-fp32-n=7?*"])
    result.stdout.no_fnmatch_line("*answered a probe*")
    result.stdout.no_fnmatch_line("*no longer work*")
    assert sorted(r["n"] for r in rows(project, "add")) == [2, 4]


def test_the_probe_is_bounded_in_time_and_reports_what_went_wrong():
    assert isolation.run_bounded(lambda: None, 1.0) is None

    def broken():
        raise torch.AcceleratorError("CUDA error: an illegal memory access was encountered")

    assert isolation.run_bounded(broken, 1.0) == "AcceleratorError: CUDA error: an illegal memory access was encountered"
    began = time.monotonic()
    assert isolation.run_bounded(lambda: time.sleep(30), 0.2) == "no answer within 0.2 s"
    assert time.monotonic() - began < 5  # the hung call was left behind, not waited for
    assert not isolation.context_exists(torch.device("cpu"))


# On a GPU: errors raised while the CUDA context exists. n=7 and n=9 leave the context working
# (a CUDA runtime error on a device that does not exist; an fp8 GEMM with misaligned operands),
# n=11 poisons it (a device-side assert is sticky: every later CUDA call fails).
NONSTICKY = """

import torch


@register_backend("add", "gpu_errors", devices={"cuda"})
def add_gpu_errors(a, b):
    n = a.numel()
    if n == 7:
        torch.empty(1, device=f"cuda:{torch.cuda.device_count()}")
    if n == 9:  # K = 8: fp8 GEMMs need dimensions divisible by 16
        x = torch.ones(16, 8, device=a.device).to(torch.float8_e4m3fn)
        one = torch.ones((), device=a.device)
        torch._scaled_mm(x, x.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    if n == 11:
        a[torch.tensor([1 << 30], device=a.device)]
        torch.cuda.synchronize()
    return torch.add(a, b)
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("workers", [[], ["-n", "1"]], ids=["serial", "xdist"])
def test_gpu_errors_that_leave_the_context_working_fail_alone(project, workers):
    (project.path / "conftest.py").write_text((project.path / "conftest.py").read_text() + NONSTICKY)
    write_config(project, "add", "backend: gpu_errors\ndtypes: fp32\nparams: {N: [2, 7, 4, 9, 8, 11, 10]}\n")
    result = project.runpytest_subprocess("benches", "-k", "add", "-p", "no:randomly", "--opperf-budget=0.05",
                                          "--opperf-clock-warmup=off", *workers, timeout=300)
    outcomes = result.parseoutcomes()
    assert outcomes["failed"] == 3 and outcomes["passed"] == (4 if workers else 3), result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines_random(["FAILED *test_add?gpu_errors-fp32-n=7?*", "FAILED *test_add?gpu_errors-fp32-n=9?*",
                                        "*the device answered a probe after this error: it still works*"])
    if workers:
        result.stdout.fnmatch_lines_random(["*crashed while running*n=11*",
                                            "*the device no longer works (probe: *device-side assert*"])
    else:
        result.stdout.fnmatch_lines(["*Interrupted: opperf: *n=11*, and then the device no longer worked (probe: *"])
    device = next((project.path / "results").glob("*.db")).stem
    assert sorted(r["n"] for r in rows(project, "add", device=device)) == ([2, 4, 8, 10] if workers else [2, 4, 8])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_probe_finds_a_working_cuda_context():
    device = torch.device("cuda", torch.cuda.current_device())
    torch.ones(1, device=device)
    assert isolation.context_exists(device)
    assert isolation.run_bounded(lambda: isolation.probe(device), isolation.PROBE_TIMEOUT_S) is None


def test_memory_budget_skips_at_collection_with_the_estimate(project):
    (project.path / "conftest.py").write_text((project.path / "conftest.py").read_text() + """

from pytest_opperf import Op, register_op
from pytest_opperf.catalog.ops.memory import add as _add

register_op(Op("huge", ("n",), _add.inputs, _add.reference, _add.flops, _add.nbytes, peak="vector",
               memory=lambda p, dt: 5e11))
register_backend("huge", "torch")(_add.add_torch)
""")
    (project.path / "benches" / "test_huge.py").write_text(
        "def test_huge(backend, inputs, bench):\n    bench(backend, *inputs)\n")
    write_config(project, "huge", "backend: torch\ndtypes: fp32\nparams: {N: 8}\n")
    write_config(project, "add", "backend: torch\ndtypes: fp32\nparams: {N: [1024, 2000000]}\n")
    result = project.runpytest("benches", "-k", "add or huge", "-v", "-rs", "--opperf-max-mem-gb=0.1", *FAST)
    result.assert_outcomes(passed=1, skipped=2)
    # add fp32 n=2e6: 24 MB of tensors + 48 MB of float64 reference; 64 MiB of timer buffers.
    result.stdout.fnmatch_lines_random([
        "*test_add?torch-fp32-n=2000000? SKIPPED (estimat*",
        "*test_huge?torch-fp32-n=8? SKIPPED (estimat*",
        "SKIPPED*test_ops.py: estimated device memory 0.14 GB (case 0.07 GB + timer buffers 0.07 GB) exceeds the "
        "budget of 0.10 GB (--opperf-max-mem-gb=0.1)",
        "SKIPPED*test_huge.py: estimated device memory 500.07 GB (case 500.00 GB*",
    ])
    assert [r["n"] for r in rows(project, "add")] == [1024]
    # Without the option a CPU has no budget: both run.
    project.runpytest("benches", "-k", "add", *FAST).assert_outcomes(passed=2)


def test_shards_cover_the_serial_set_and_merge_to_the_serial_rows(project, tmp_path, capsys):
    write_config(project, "add", "backend: torch\ndtypes: fp32\nparams: {N: [1, 2, 3, 4, 5, 6, 7, 8]}\n")
    project.runpytest("benches", *FAST).assert_outcomes(passed=10)
    serial = keys(rows(project, "add"), ADD_KEY), keys(rows(project, "gemm"), GEMM_KEY)
    counts, dbs = [], []
    for i in range(3):
        args = ("benches", f"--opperf-shard={i}/3", f"--opperf-results=shard{i}", *FAST)
        # One shard under xdist: its workers must agree on the share, or xdist refuses the run.
        result = project.runpytest(*args, "-n", "2") if i == 1 else project.runpytest(*args)
        outcomes = result.parseoutcomes()
        assert outcomes.get("failed", 0) == 0
        if i != 1:  # xdist's workers deselect; its controller does not count them
            assert outcomes["deselected"] == 10 - outcomes["passed"]
        counts.append(outcomes["passed"])
        dbs.append(project.path / f"shard{i}" / "cpu.db")
    assert sorted(counts) == [3, 3, 4]  # balanced: sizes differ by at most one
    shard_keys = [keys(rows_at(db, "add"), ADD_KEY) + keys(rows_at(db, "gemm"), GEMM_KEY) for db in dbs]
    union = [k for ks in shard_keys for k in ks]
    assert len(union) == len(set(union)) == 10  # no case in two shards
    out = tmp_path / "merged.db"
    assert cli.main(["merge", str(out), *map(str, dbs)]) == 0
    assert "3 databases ->" in capsys.readouterr().out
    assert (keys(rows_at(out, "add"), ADD_KEY), keys(rows_at(out, "gemm"), GEMM_KEY)) == serial
    con = sqlite3.connect(out)
    assert con.execute("select count(*) from runs").fetchone()[0] == 3
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


@pytest.mark.parametrize("args, message", [
    (["--opperf-shard=3/2"], "--opperf-shard=3/2: expected I/N with N >= 1 and 0 <= I < N, e.g. 0/4"),
    (["--opperf-shard=0/0"], "--opperf-shard=0/0: expected I/N*"),
    (["--opperf-shard=1"], "--opperf-shard=1: expected I/N*"),
    (["--opperf-shard=-1/4"], "--opperf-shard=-1/4: expected I/N*"),
    (["--opperf-shard=a/b"], "--opperf-shard=a/b: expected I/N*"),
    (["--opperf-max-mem-gb=lots"], "--opperf-max-mem-gb=lots: expected auto, none or a number of GB > 0"),
    (["--opperf-max-mem-gb=0"], "--opperf-max-mem-gb=0: expected auto, none*"),
    (["--opperf-timeout=-1"], "--opperf-timeout=-1: expected a number >= 0"),
])
def test_bad_multigpu_options_are_usage_errors(project, args, message):
    result = project.runpytest("benches", *FAST, *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message}"])


# --- merge, on hand-made databases ------------------------------------------------------------


def record(n, time_us, created_at, run_id, op="add", params=("n",)):
    return {"op": op, "_params": list(params), **{p: n for p in params}, "dtype_in": "fp32", "dtype_out": "fp32",
            "backend": "torch", "backend_version": "2", "knobs": "", "timer": "cpu", "cache": "hot",
            "time_us": time_us, "created_at": created_at, "run_id": run_id}


def make_db(path, run_id, records):
    storage.write(path, {"run_id": run_id, "started_at": "2026-01-01T00:00:00+00:00"}, records)
    return path


def test_merge_keeps_the_newest_row_per_key_and_every_run(tmp_path):
    old = make_db(tmp_path / "old.db", "r1", [record(1, 10.0, "2026-01-01T00:00:00+00:00", "r1"),
                                              record(2, 20.0, "2026-01-01T00:00:00+00:00", "r1")])
    new = make_db(tmp_path / "new.db", "r2", [record(1, 11.0, "2026-01-02T00:00:00+00:00", "r2")])
    out = tmp_path / "out.db"
    counts = storage.merge(out, [new, old])  # order does not matter: created_at decides
    assert counts["add"] == {"read": 3, "written": 2}
    assert sorted((r["n"], r["time_us"], r["run_id"]) for r in rows_at(out, "add")) == [(1, 11.0, "r2"), (2, 20.0, "r1")]
    assert sorted(r["run_id"] for r in rows_at(out, "runs")) == ["r1", "r2"]
    # OUT may exist: merging into it again adds a newer row and keeps the rest.
    newest = make_db(tmp_path / "newest.db", "r3", [record(2, 21.0, "2026-01-03T00:00:00+00:00", "r3")])
    storage.merge(out, [newest, old])
    assert sorted((r["n"], r["time_us"]) for r in rows_at(out, "add")) == [(1, 11.0), (2, 21.0)]
    assert len(rows_at(out, "runs")) == 3


def test_merge_errors_name_the_file_and_leave_the_output_alone(tmp_path, capsys):
    good = make_db(tmp_path / "good.db", "r1", [record(1, 10.0, "2026-01-01T00:00:00+00:00", "r1")])
    out = tmp_path / "out.db"
    storage.merge(out, [good])
    before = out.read_bytes()
    other_key = make_db(tmp_path / "other.db", "r2", [record(1, 1.0, "2026-01-02T00:00:00+00:00", "r2",
                                                             params=("n", "m"))])
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not a database, only text " * 200)
    cases = [
        ([str(tmp_path / "missing.db")], f"{tmp_path / 'missing.db'}: no such file"),
        ([str(garbage)], f"{garbage}: not a readable SQLite database"),
        ([str(good), str(other_key)], f"{other_key}: table 'add': key columns [[]'n', 'm', *differ from [[]'n', 'dtype_in'*"),
        ([str(out)], f"{out}: is the output too"),
    ]
    for inputs, message in cases:
        assert cli.main(["merge", str(out), *inputs]) == 2
        err = capsys.readouterr().err
        assert fnmatch.fnmatch(err.strip(), f"opperf merge: {message}*"), err
        assert out.read_bytes() == before
    corrupt = tmp_path / "corrupt.db"
    corrupt.write_bytes(good.read_bytes()[:2048])  # cut short: the page count no longer matches
    assert cli.main(["merge", str(tmp_path / "new.db"), str(corrupt)]) == 2
    assert "corrupt.db" in capsys.readouterr().err


# --- pinning ----------------------------------------------------------------------------------


def test_worker_specs_index_into_the_users_device_list(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,GPU-abc, 6")
    entries = xdist.visible_entries("CUDA_VISIBLE_DEVICES", 3)
    assert entries == ["4", "GPU-abc", "6"]
    assert xdist.worker_specs(4, "CUDA_VISIBLE_DEVICES", entries) == [
        "popen//env:CUDA_VISIBLE_DEVICES=4", "popen//env:CUDA_VISIBLE_DEVICES=GPU-abc",
        "popen//env:CUDA_VISIBLE_DEVICES=6", "popen//env:CUDA_VISIBLE_DEVICES=4"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert xdist.visible_entries("CUDA_VISIBLE_DEVICES", 2) == ["0", "1"]
    assert xdist.worker_specs(2, xdist.INDEX_VARIABLE, ["a", "b"]) == [
        "popen//env:OPPERF_DEVICE_INDEX=0", "popen//env:OPPERF_DEVICE_INDEX=1"]


def _pinning_config(device: str, workers: int = 2):
    option = SimpleNamespace(numprocesses=workers, tx=["popen"] * workers, opperf_device=device)
    return SimpleNamespace(option=option, getoption=lambda name: getattr(option, name),
                           getini=lambda name: "auto")


def _torch_asked():
    raise AssertionError("NVML counted the GPUs: torch is not imported before the workers start")


@pytest.mark.parametrize("counted_by", ["nvml", "torch"])
@pytest.mark.parametrize("device, pinned", [("auto", True), ("cuda", True), ("cpu", False), (" CPU ", False)])
def test_workers_are_counted_and_pinned_by_gpu_unless_the_run_is_on_the_cpu(monkeypatch, device, pinned, counted_by):
    # A GPU host: -n 2 --device=cpu runs on the cores; its workers are neither pinned nor told they share GPUs.
    # NVIDIA's GPUs are counted by NVML, without torch; without NVML (another accelerator), torch counts.
    if counted_by == "nvml":
        monkeypatch.setattr(specs, "nvidia_device_count", lambda: 2)
        monkeypatch.setattr(specs, "detect_accelerator", _torch_asked)
    else:
        monkeypatch.setattr(specs, "nvidia_device_count", lambda: None)
        monkeypatch.setattr(specs, "detect_accelerator", lambda: specs.Accelerator("cuda", "NVIDIA H100 80GB HBM3", 2))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    config = _pinning_config(device)
    assert xdist.auto_workers(config) == (2 if pinned else None)  # -n auto: one per GPU, else xdist counts cores
    line = xdist.pin_workers(config)
    if pinned:
        assert line == "opperf: 2 workers on 2 cuda devices: CUDA_VISIBLE_DEVICES=0 | 1"
        assert config.option.tx == ["popen//env:CUDA_VISIBLE_DEVICES=0", "popen//env:CUDA_VISIBLE_DEVICES=1"]
    else:
        assert line is None and config.option.tx == ["popen", "popen"]


# The project's conftest imports torch in every process; this one does not, and says what the
# controller had imported when xdist started the workers.
AT_SPAWN = """
import sys


def pytest_xdist_setupnodes(config, specs):
    with open("imported-at-spawn", "w") as f:
        f.write(str("torch" in sys.modules))
"""


def test_the_controller_starts_its_workers_before_its_torch_import_and_device_work(project):
    project.makepyfile(conftest=AT_SPAWN)
    result = project.runpytest_subprocess("benches", "-k", "add", "-n", "2", *FAST)
    result.assert_outcomes(passed=4)
    assert (project.path / "imported-at-spawn").read_text() == "False"
    # The session's header lines, written once it opened: after xdist started the workers.
    result.stdout.fnmatch_lines(["created: 2/2 workers", "opperf: device cpu (*, torch *), timer *", "opperf: rows -> *"])
    runs = rows(project, "runs")
    assert len(rows(project, "add")) == 4 and len(runs) == 1 and runs[0]["workers"] == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="--device=h100 is this machine's device")
@pytest.mark.parametrize("device, message, spawned", [
    ("nosuchdevice", "--device=nosuchdevice: unknown device; known: *", False),  # the specs say so: before
    ("h100", "--device=h100: h100 runs on cuda, but this machine has no accelerator", True),  # torch says so
])
def test_a_bad_device_is_a_usage_error_before_or_after_the_workers_start(project, device, message, spawned):
    start = time.monotonic()
    result = project.runpytest("benches", "-k", "add", "-n", "2", *FAST, f"--device={device}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message}"])
    assert ("created: 2/2 workers" in result.stdout.str()) == spawned  # then they are stopped
    assert time.monotonic() - start < 60
    assert not (project.path / "results").exists()


# In each xdist worker: an atexit handler, and an object only the interpreter's finalization destroys
# (as it destroys torch's modules and the CUDA context); each leaves a file when it runs.
EXIT_MARKS = """
import atexit
import os


def _mark(path, _open=os.open, _close=os.close, flags=os.O_CREAT | os.O_WRONLY):
    _close(_open(path, flags))


class _Finalized:
    def __init__(self, path):
        self.path = path

    def __del__(self, _mark=_mark):
        _mark(self.path)


def pytest_configure(config):
    worker = getattr(config, "workerinput", {}).get("workerid")
    if worker:
        globals()["FINALIZED"] = _Finalized(os.path.join(os.getcwd(), f"finalized-{worker}"))
        atexit.register(_mark, os.path.join(os.getcwd(), f"atexit-{worker}"))
"""


def test_a_worker_ends_after_its_atexit_handlers_without_the_interpreters_finalization(project):
    project.makepyfile(conftest=(project.path / "conftest.py").read_text() + EXIT_MARKS)
    result = project.runpytest("benches", "-k", "add", "-n", "2", *FAST)  # the controller in this process
    result.assert_outcomes(passed=4)
    assert len(rows(project, "add")) == 4 and len(rows(project, "runs")) == 1  # every row landed
    assert sorted(p.name for p in project.path.glob("atexit-gw*")) == ["atexit-gw0", "atexit-gw1"]
    assert not list(project.path.glob("finalized-*"))  # the worker ended before the interpreter's teardown


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_each_worker_owns_one_gpu(project):
    write_config(project, "add", "backend: torch\ndtypes: fp32\nparams: {N: {min: 1024, max: 65536, mul: 2}}\n")
    result = project.runpytest_subprocess("benches", "-k", "add", "-n", "2", "--opperf-budget=0.02")
    result.assert_outcomes(passed=7)
    result.stdout.fnmatch_lines(["*opperf: 2 workers on * cuda devices: CUDA_VISIBLE_DEVICES=*"])
    device = next((project.path / "results").glob("*.db")).stem
    got = rows(project, "add", device=device)
    by_worker = {}
    for r in got:
        by_worker.setdefault(r["worker"], set()).add(r["gpu_uuid"])
    assert all(len(uuids) == 1 for uuids in by_worker.values())  # a worker stays on its GPU
    assert len({r["gpu_uuid"] for r in got}) == 2 and len({r["gpu"] for r in got}) == 2
