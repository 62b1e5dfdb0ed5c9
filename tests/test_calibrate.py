"""Measured ceilings: `opperf calibrate`, --opperf-calibrate, attainable MFU/MBU.

The sessions are real pytest sessions on the CPU; the ceilings they hold rows against are either
measured (a CPU calibration takes a few seconds) or written by hand, so that every attainable
MFU/MBU can be worked out from numbers chosen here.
"""


import pytest
import torch

from conftest import FAST, rows, rows_at
from pytest_opperf import cli
from pytest_opperf.gate.baseline import from_database
from pytest_opperf.hardware import calibrate as measured
from pytest_opperf.hardware.specs import detect_accelerator, load_specs, resolve_alias
from pytest_opperf.measure import contention
from pytest_opperf.store import ceilings
from pytest_opperf.store.database import merge
from pytest_opperf.view.source import Results

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# Hand-chosen ceilings: 1 GFLOP/s on the fp32 matrix units, 0.5 GFLOP/s on the vector units,
# copy 2 GB/s and read 4 GB/s (so 4 GB/s is the memory ceiling: the better of the two).
MATRIX_FP32_FLOPS = 1e9
VECTOR_FP32_FLOPS = 0.5e9
MEMORY_BYTES_PER_S = 4e9


def hand_rows(calibration_id="hand", torch_version=None, created_at="2026-11-23T10:00:00+00:00"):
    env = {k: None for k in measured.ENVIRONMENT}
    env["torch"] = torch_version or str(torch.__version__)
    base = {"calibration_id": calibration_id, "device": "cpu", "dtype": "", "shape": "by hand", "method": "by hand",
            "tflops": None, "gbytes_per_s": None, "datasheet_tflops": None, "datasheet_gbytes_per_s": None,
            "ratio": None, "time_us": 1.0, "cv": 0.0, "samples": 3, "timer": "cpu", "cache": "hot",
            "created_at": created_at, **env}
    return [
        {**base, "quantity": "matrix", "dtype": "fp32", "tflops": MATRIX_FP32_FLOPS / 1e12},
        {**base, "quantity": "vector", "dtype": "fp32", "tflops": VECTOR_FP32_FLOPS / 1e12},
        {**base, "quantity": "copy", "gbytes_per_s": 2.0},
        {**base, "quantity": "read", "gbytes_per_s": MEMORY_BYTES_PER_S / 1e9},
        {**base, "quantity": "launch", "time_us": 4.0},
    ]


def db_of(pytester):
    return pytester.path / "results" / "cpu.db"


class Watch:
    """A stand-in for the contention probe that reports what the test says (None: a quiet machine)."""

    def __init__(self, seen=None):
        self.seen = seen
        self.threads = None

    def start(self, threads):
        self.threads = threads

    def stop(self):
        return {"contended": int(self.seen is not None), "contention": self.seen or "cpu: others 0.01 of 2 cores"}


@pytest.fixture(autouse=True)
def quiet_machine(monkeypatch):
    """The tests' calibrations are taken as on an idle machine (this one is shared); the tests of the
    busy check below give their own watch."""
    monkeypatch.setattr(contention, "Probe", lambda *a, **k: Watch())


# --- the arithmetic ---------------------------------------------------------------------------


def test_attainable_by_hand():
    cal = measured.Calibration(hand_rows())
    # a gemm of 2*64^3 = 524288 FLOP and 49152 bytes in 1000 us: 0.524 GFLOP/s, 49.152 MB/s
    got = measured.attainable(524288, 49152, 1000.0, cal, "fp32", "matrix")
    assert got["mfu_attainable"] == pytest.approx(0.524288)  # of 1 GFLOP/s
    assert got["mbu_attainable"] == pytest.approx(0.049152 / 4)  # of 4 GB/s: read beats copy
    # a bf16 vector op has no ceiling of its own: it is held against the fp32 vector ceiling
    got = measured.attainable(1e5, 0, 1000.0, cal, "bf16", "vector")
    assert got == {"mfu_attainable": pytest.approx(0.2), "mbu_attainable": None}
    # a matrix dtype that was not measured gives nothing; so does no calibration
    assert measured.attainable(1e5, 8, 1.0, cal, "fp8", "matrix")["mfu_attainable"] is None
    assert measured.attainable(1e5, 8, 1.0, None, "fp32", "matrix") == {"mfu_attainable": None, "mbu_attainable": None}
    assert cal.launch_us == 4.0


def test_the_best_size_is_the_ceiling():
    rows = hand_rows()
    rows.append({**rows[0], "shape": "m=n=k=8192", "tflops": 3e-3})
    assert measured.Calibration(rows).peak_flops("fp32", "matrix") == pytest.approx(3e9)


def test_stale_reasons_name_what_changed():
    cal = measured.Calibration(hand_rows(torch_version="2.12.0"))
    now = {**cal.environment, "torch": "2.13.0", "driver": "580.1"}  # the calibration knew no driver
    assert cal.stale_reasons(now) == ["torch 2.12.0 -> 2.13.0"]
    assert cal.stale_reasons({**cal.environment}) == []
    gpu = measured.Calibration([{**r, "cuda": "12.8", "host": "a", "sm_clock_mhz": 1980} for r in hand_rows()])
    # another host with the same GPU is not stale; another clock setting is
    assert gpu.stale_reasons({**gpu.environment, "host": "b"}) == []
    assert gpu.stale_reasons({**gpu.environment, "sm_clock_mhz": 1755}) == ["sm_clock_mhz 1980 -> 1755"]
    cpu = measured.Calibration([{**r, "host": "a", "threads": 2} for r in hand_rows()])
    assert cpu.stale_reasons({**cpu.environment, "host": "b", "threads": 4}) == ["threads 2 -> 4", "host a -> b"]


# --- sessions ---------------------------------------------------------------------------------


def test_rows_carry_attainable_mfu_and_mbu_from_the_stored_ceilings(project):
    ceilings.write(db_of(project), hand_rows())
    result = project.runpytest("benches/", *FAST)
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*time_us*aMFU*aMBU*",
                                 "*aMFU, aMBU: against the measured ceilings of calibration hand*"])
    gemm = rows(project, "gemm")
    assert len(gemm) == 2
    for row in gemm:
        seconds = row["time_us"] * 1e-6
        m, n, k = row["m"], row["n"], row["k"]
        assert row["flops"] == 2 * m * n * k  # m=2: 512 FLOP; m=4: 1024
        assert row["bytes"] == (m * k + k * n) * 4 + m * n * 4
        assert row["mfu_attainable"] == pytest.approx(row["flops"] / seconds / MATRIX_FP32_FLOPS)
        assert row["mbu_attainable"] == pytest.approx(row["bytes"] / seconds / MEMORY_BYTES_PER_S)
        assert row["mfu"] is None  # the cpu spec has no datasheet peaks
    first = next(r for r in gemm if r["m"] == 2)
    assert first["mfu_attainable"] == pytest.approx(512 / (first["time_us"] * 1e-6) / 1e9)
    add = rows(project, "add")
    assert {r["dtype_in"] for r in add} == {"fp32", "bf16"}
    for row in add:  # add is a vector op: bf16 too is held against the fp32 vector ceiling
        assert row["mfu_attainable"] == pytest.approx(row["flops"] / (row["time_us"] * 1e-6) / VECTOR_FP32_FLOPS)
    run = rows(project, "runs")[0]
    assert run["calibration_id"] == "hand" and run["calibration_stale"] is None
    assert run["calibrated_at"] == "2026-11-23T10:00:00+00:00"


def test_the_newest_calibration_is_used(project):
    ceilings.write(db_of(project), hand_rows("old", created_at="2026-11-01T00:00:00+00:00"))
    newer = [{**r, "tflops": r["tflops"] * 2 if r["tflops"] else None} for r in hand_rows("new")]
    ceilings.write(db_of(project), newer)
    assert project.runpytest("benches/", *FAST, "-k", "gemm").ret == 0
    row = rows(project, "gemm")[0]
    assert row["mfu_attainable"] == pytest.approx(row["flops"] / (row["time_us"] * 1e-6) / (2 * MATRIX_FP32_FLOPS))
    assert rows(project, "runs")[0]["calibration_id"] == "new"


def test_under_xdist_the_controller_holds_rows_against_the_ceilings(project):
    ceilings.write(db_of(project), hand_rows())
    assert project.runpytest("benches/", *FAST, "-n", "2").ret == 0
    stored = rows(project, "gemm") + rows(project, "add")
    assert len(stored) == 6 and all(r["mfu_attainable"] and r["mbu_attainable"] for r in stored)


def test_calibrate_then_sweep(project, capsys):
    """`opperf calibrate` measures this CPU into its database; a sweep then finds it."""
    # --device cpu: on a GPU machine the detected device would be the GPU, into its own database
    assert cli.main(["calibrate", "--device", "cpu", "--results", str(project.path / "results")]) == 0
    stored = rows(project, "ceilings")
    printed = capsys.readouterr().out.splitlines()
    assert "| quantity | dtype | shape | measured | datasheet | measured/datasheet | cv | timer |" in printed
    assert printed[-1] == (f"opperf calibrate: stored in {project.path / 'results' / 'cpu.db'} as calibration "
                           f"{stored[0]['calibration_id']}")
    assert sum(line.startswith("| matrix | fp32 | m=n=k=1024 | ") for line in printed) == 1
    assert {r["quantity"] for r in stored} == {"copy", "read", "matrix", "vector", "launch"}
    assert {r["dtype"] for r in stored if r["quantity"] == "matrix"} == {"fp32", "bf16", "fp16"}
    assert all(r["time_us"] > 0 and r["samples"] >= 3 and r["timer"] == "cpu" for r in stored)
    assert stored[0]["torch"] == str(torch.__version__) and stored[0]["threads"] == torch.get_num_threads()
    copy = next(r for r in stored if r["quantity"] == "copy")
    assert copy["gbytes_per_s"] == pytest.approx(copy["bytes"] / (copy["time_us"] * 1e-6) / 1e9)
    assert copy["bytes"] == 2 * (64 << 20)  # 64 MiB read and 64 MiB written
    gemm = next(r for r in stored if r["quantity"] == "matrix" and r["dtype"] == "fp32")
    assert gemm["tflops"] == pytest.approx(2 * 1024 ** 3 / (gemm["time_us"] * 1e-6) / 1e12)

    result = project.runpytest("benches/", *FAST, "--opperf-calibrate=missing")  # one is stored: no new one
    assert result.ret == 0
    assert len(rows(project, "ceilings")) == len(stored)
    run = rows(project, "runs")[0]
    assert run["calibration_id"] == stored[0]["calibration_id"]
    for row in rows(project, "gemm"):
        assert row["mfu_attainable"] == pytest.approx(row["flops"] / (row["time_us"] * 1e-6) / (gemm["tflops"] * 1e12))
        assert row["mbu_attainable"] > 0


def test_the_sweep_calibrates_first_when_asked(project):
    result = project.runpytest("benches/", *FAST, "-k", "gemm", "--opperf-calibrate=missing")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*calibrated (none stored): stored in*cpu.db as *"])
    stored = rows(project, "ceilings")
    assert {r["quantity"] for r in stored} >= {"copy", "matrix", "launch"}
    assert all(r["mfu_attainable"] > 0 for r in rows(project, "gemm"))


def test_sample_only_calibrates_but_stores_nothing(project):
    result = project.runpytest("benches/", *FAST, "-k", "gemm", "--opperf-calibrate=always", "--opperf-sample-only")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*calibrated (asked); sample-only: not stored*", "*aMFU*"])
    assert not db_of(project).exists()


def test_a_stale_calibration_is_flagged_not_silently_used(project, capsys):
    ceilings.write(db_of(project), hand_rows(torch_version="0.0.1"))
    result = project.runpytest("benches/", *FAST, "-k", "gemm")
    assert result.ret == 0
    result.stdout.fnmatch_lines([f"*warning: calibration hand is stale (torch 0.0.1 -> {torch.__version__})*"])
    run = rows(project, "runs")[0]
    assert run["calibration_id"] == "hand"
    assert run["calibration_stale"] == f"torch 0.0.1 -> {torch.__version__}"
    assert all(r["mfu_attainable"] is not None for r in rows(project, "gemm"))  # used, and said so
    capsys.readouterr()
    assert cli.main(["report", str(db_of(project)), "--op", "gemm"]) == 0
    assert f"its calibration hand was stale (torch 0.0.1 -> {torch.__version__})" in capsys.readouterr().out

    # missing: a stale calibration is measured again, and the new one is not stale
    assert project.runpytest("benches/", *FAST, "-k", "gemm", "--opperf-calibrate=missing").ret == 0
    latest = rows(project, "runs")[-1]
    assert latest["calibration_id"] != "hand" and latest["calibration_stale"] is None


def test_off_uses_no_calibration(project):
    ceilings.write(db_of(project), hand_rows())
    result = project.runpytest("benches/", *FAST, "-k", "gemm", "--opperf-calibrate=off")
    assert result.ret == 0
    result.stdout.no_fnmatch_line("*aMFU*")
    assert all(r["mfu_attainable"] is None and r["mbu_attainable"] is None for r in rows(project, "gemm"))
    assert rows(project, "runs")[0]["calibration_id"] is None


def test_collect_only_measures_nothing(project):
    result = project.runpytest("benches/", *FAST, "--collect-only", "--opperf-calibrate=always")
    assert result.ret == 0
    assert not db_of(project).exists()


# --- bad input --------------------------------------------------------------------------------


def test_bad_calibrate_option_is_a_usage_error(project):
    result = project.runpytest("benches/", *FAST, "--opperf-calibrate=sometimes")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["ERROR: --opperf-calibrate=sometimes: expected one of auto, missing, always, off"])


@pytest.mark.parametrize("name, message", [
    ("nope", "opperf calibrate: --device=nope: unknown device; known: a100, *cpu*"),
    ("../../etc", "opperf calibrate: --device=../../etc: a device name is lower-case letters*known: *"),
])
def test_bad_device_names_error_cleanly(tmp_path, capsys, name, message):
    assert cli.main(["calibrate", "--device", name, "--results", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert pytest.importorskip("fnmatch").fnmatch(err.strip(), message)
    assert not list(tmp_path.iterdir())  # nothing written


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_gpu_spec_on_a_cpu_machine_errors_cleanly(tmp_path, capsys):
    assert cli.main(["calibrate", "--device", "h100", "--results", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == ("opperf calibrate: --device=h100: h100 runs on cuda, but this "
                                               "machine has no accelerator")


def test_an_unwritable_database_errors_cleanly(tmp_path, capsys):
    bad = tmp_path / "not.db"
    bad.write_text("not a database")
    assert cli.main(["calibrate", "--db", str(bad)]) == 2
    assert "cannot write the calibration" in capsys.readouterr().err
    assert bad.read_text() == "not a database"


# --- the database and the views ----------------------------------------------------------------


def test_views_merge_and_baselines_treat_ceilings_as_no_op(project, tmp_path, capsys):
    ceilings.write(db_of(project), hand_rows())
    assert project.runpytest("benches/", *FAST, "-k", "gemm").ret == 0
    assert Results.open(db_of(project)).ops == ["gemm"]
    assert {e["op"] for e in from_database(db_of(project)).entries.values()} == {"gemm"}
    out = tmp_path / "merged.db"
    merge(out, [db_of(project)])
    merged = rows_at(out, "ceilings")
    assert len(merged) == 5 and "mfu" not in merged[0]  # its own columns, not an op table's
    assert merged == rows(project, "ceilings")
    assert ceilings.latest(out, "cpu").peak_flops("fp32", "matrix") == pytest.approx(MATRIX_FP32_FLOPS)
    capsys.readouterr()
    assert cli.main(["report", str(db_of(project))]) == 0
    out = capsys.readouterr().out.splitlines()
    assert any(line.startswith("attainable MFU") for line in out)
    at = out.index("measured ceilings in cpu.db")
    assert any(line.split()[:2] == ["cpu", "read"] and "4 GB/s" in line for line in out[at:])


def test_the_roofline_draws_the_measured_roofs_dashed(project):
    pytest.importorskip("matplotlib")
    from pytest_opperf.view import plots

    ceilings.write(db_of(project), hand_rows())
    assert project.runpytest("benches/", *FAST, "-k", "gemm").ret == 0
    table = Results.open(db_of(project)).table("gemm")
    fig = plots.roofline(table, load_specs()["cpu"], "cpu", plots.measured_ceilings(db_of(project), "cpu"))
    dashed = [line for line in fig.axes[0].get_lines() if line.get_linestyle() == "--"]
    assert [line.get_label() for line in dashed] == ["measured fp32 matrix 0.001 TFLOP/s, 4 GB/s"]
    ys = dashed[0].get_ydata()
    assert max(ys) == pytest.approx(MATRIX_FP32_FLOPS)  # the flat roof
    assert min(ys) == pytest.approx(MEMORY_BYTES_PER_S * dashed[0].get_xdata()[0])  # the bandwidth slope
    assert "measured roofs (dashed): calibration hand" in fig.axes[0].get_title()


# --- GPU ----------------------------------------------------------------------------------------


@cuda
def test_measured_ceilings_on_a_gpu_are_sane(tmp_path):
    """On a GPU with a spec: bf16 GEMMs and the copy reach 50-105% of the datasheet."""
    acc = detect_accelerator()
    spec = resolve_alias(load_specs(), acc.reported_name)
    if spec is None:
        pytest.skip(f"no hardware spec for {acc.reported_name!r}: nothing to compare with")
    cal = measured.calibrate(torch.device("cuda", torch.cuda.current_device()), spec, acc.reported_name)
    by = {(r["quantity"], r["dtype"]): r for r in cal.rows}
    bf16 = max((r for r in cal.rows if r["quantity"] == "matrix" and r["dtype"] == "bf16"), key=lambda r: r["tflops"])
    assert 0.5 <= bf16["ratio"] <= 1.05, bf16
    assert 0.5 <= by[("copy", "")]["ratio"] <= 1.05, by[("copy", "")]
    assert 0.5 <= by[("read", "")]["ratio"] <= 1.05, by[("read", "")]
    assert ("vector", "fp32") in by and 0.3 <= by[("vector", "fp32")]["ratio"] <= 1.05, by.get(("vector", "fp32"))
    assert 0 < cal.launch_us < 50
    assert cal.stale_reasons(measured.environment(torch.device("cuda"), acc.reported_name)) == []
    ceilings.write(tmp_path / "gpu.db", cal.rows)
    assert ceilings.latest(tmp_path / "gpu.db", spec.name).peak_flops("bf16", "matrix") == pytest.approx(bf16["tflops"] * 1e12)


# --- calibrating on a busy machine ---------------------------------------------------------------


def test_a_calibration_reads_contention_as_a_case_does(monkeypatch):
    # the probe each case gets (its readings are tested in test_contention.py), told the threads the probes use
    made = []
    monkeypatch.setattr(contention, "Probe", lambda *a, **k: made.append(Watch("cpu: others 1.90 of 2 cores")) or made[-1])
    cal = measured.calibrate(torch.device("cpu"), load_specs()["cpu"], "cpu")
    assert made and made[0].threads == torch.get_num_threads()
    assert cal.contention == "cpu: others 1.90 of 2 cores"


def test_a_calibration_on_a_busy_machine_is_flagged_and_counts_as_stale():
    logged = []
    spec = load_specs()["cpu"]
    cal = measured.calibrate(torch.device("cpu"), spec, "cpu", logged.append,
                             watch=Watch("other processes took 80% of the 2 CPUs' time"))
    assert all(r["contention"] == "other processes took 80% of the 2 CPUs' time" for r in cal.rows)
    assert any(line.startswith("warning: the machine was busy during the calibration (other processes took 80%")
               for line in logged)
    assert cal.stale_reasons(cal.environment) == ["measured on a busy machine (other processes took 80% of the 2 "
                                                  "CPUs' time)"]
    quiet = measured.calibrate(torch.device("cpu"), spec, "cpu", logged.append, watch=Watch(None))
    assert quiet.contention is None and quiet.stale_reasons(quiet.environment) == []
