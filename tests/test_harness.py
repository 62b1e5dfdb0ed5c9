"""Harness cost: the per-phase account of each case, its summary, and `opperf timeline`."""

import importlib.util

import pytest
import torch

from conftest import FAST, rows, rows_at
from pytest_opperf.cli import main
from pytest_opperf.measure import phases
from pytest_opperf.view import timeline

PHASE_COLUMNS = [f"phase_{p}_ms" for p in phases.PHASES]


def test_phase_columns_are_stored_non_negative_and_within_the_wall_time(project):
    result = project.runpytest("benches/", *FAST)
    result.assert_outcomes(passed=6)
    result.stdout.fnmatch_lines(["opperf: harness, per case (mean of 6): wall * ms = set-up *, inputs *, check *,"
                                 " * sampling *, * record *, other * ms; sampling is *% of the wall time; "
                                 "start-up * s to the first case"])
    stored = rows(project, "gemm") + rows(project, "add")
    assert len(stored) == 6
    for row in stored:
        for column in PHASE_COLUMNS:
            assert row[column] is not None and row[column] >= 0, (column, row[column])
        wall = (row["ended_unix_s"] - row["started_unix_s"]) * 1e3
        assert wall > 0
        # Disjoint stretches of the case: together at most its wall time (clock reads ~1 us apart).
        assert sum(row[c] for c in PHASE_COLUMNS) <= wall + 0.01
        assert row["phase_sampling_ms"] > 0 and row["phase_check_ms"] > 0
    # Cases ran one after the other in one process: their spans do not overlap.
    spans = sorted((r["started_unix_s"], r["ended_unix_s"]) for r in stored)
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))


def test_a_test_that_makes_its_own_inputs_has_no_inputs_phase(pytester):
    pytester.makepyfile(test_own="""
        import torch

        def test_add(bench):
            bench(torch.add, torch.rand(64), torch.rand(64))
    """)
    (pytester.path / "configs").mkdir()
    (pytester.path / "configs" / "add.yaml").write_text("backend: torch\ndtypes: [fp32]\nparams:\n  N: [64]\n")
    pytester.runpytest(*FAST).assert_outcomes(passed=1)
    (row,) = rows(pytester, "add")
    assert row["phase_inputs_ms"] is None
    assert row["phase_setup_ms"] >= 0 and row["phase_check_ms"] > 0


def test_phase_columns_hand_worked():
    clock = phases.PhaseClock()
    clock.add("check", 0.004)
    clock.add("check", 0.001)  # a second stretch of the same phase adds up
    clock.add("sampling", 0.020)
    setup = phases.Span()
    setup.unix_s, setup.perf_s, setup.stop_perf_s = 1000.0, 5.0, 5.003  # 3 ms of set-up
    row = phases.columns(setup, 0.001, clock, 1000.040)
    assert row["phase_setup_ms"] == pytest.approx(2.0)  # 3 ms less the 1 ms of inputs inside it
    assert row["phase_inputs_ms"] == pytest.approx(1.0)
    assert row["phase_check_ms"] == pytest.approx(5.0)
    assert row["phase_sampling_ms"] == pytest.approx(20.0)
    assert row["phase_warmup_ms"] is None and row["phase_record_ms"] is None
    assert (row["started_unix_s"], row["ended_unix_s"]) == (1000.0, 1000.040)
    t = phases.totals([row, {**row, "phase_check_ms": None}])
    assert t["wall"] == pytest.approx(80.0)
    assert t["check"] == pytest.approx(5.0)
    assert t["other"] == pytest.approx(80.0 - 2 * (2 + 1 + 20) - 5)
    with pytest.raises(ValueError, match="unknown phase 'compile'"):
        clock.add("compile", 1.0)


def test_segments_follow_the_phases_and_end_at_the_bar():
    bar = timeline.Bar("gw0 / GPU 1", "add: x", 2.0, 2.1, {"setup": 10.0, "sampling": 60.0, "record": 50.0})
    got = [(p, round(s, 6), round(n, 6)) for p, s, n in timeline.segments(bar)]
    # The record would run past the end (clock reads apart): it is cut there, and no 'other' is left.
    assert got == [("setup", 2.0, 0.01), ("sampling", 2.01, 0.06), ("record", 2.07, 0.03)]


@pytest.fixture
def swept(project):
    """A real session under -n 2: its database holds rows of two workers."""
    project.runpytest("benches/", "-n", "2", *FAST).assert_outcomes(passed=6)
    return project


def test_timeline_of_a_real_sweep_in_html_and_png(swept, tmp_path, capsys):
    db = swept.path / "results" / "cpu.db"
    stored = rows_at(db, "gemm") + rows_at(db, "add")
    assert {r["worker"] for r in stored} == {"gw0", "gw1"}
    out = tmp_path / "tl.html"
    assert main(["timeline", str(db), "-o", str(out)]) == 0
    assert "(6 cases, 2 lanes, " in capsys.readouterr().out
    page = out.read_text()
    assert page.count("<g><title>") == 6
    for row in stored:
        case = row["test_id"].split("[", 1)[1].rstrip("]")
        assert f"<title>{row['test_id'].split('::')[1].split('[')[0][5:]}: {case}" in page
    assert ">gw0<" in page and ">gw1<" in page and "<svg" in page and "http" not in page.replace(
        "http://www.w3.org/2000/svg", "")
    # The session's start is in its runs row: each worker's lane begins with its start-up.
    assert "Start-up, from the session's start to each lane's first case: gw0 " in page
    png = tmp_path / "tl.png"
    if importlib.util.find_spec("matplotlib") is None:  # the PNG needs the [plot] extra: say so, exit 2
        assert main(["timeline", str(db), "-o", str(png)]) == 2
        assert "plots need matplotlib" in capsys.readouterr().err and not png.exists()
        return
    assert main(["timeline", str(db), "-o", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_timeline_bad_input_is_one_line_and_exit_2(project, tmp_path, capsys):
    # A serial sweep's database: bad input is told apart the same way, without two workers' start-up.
    project.runpytest("benches/", "-k", "add", *FAST).assert_outcomes(passed=4)
    db = project.path / "results" / "cpu.db"
    assert main(["timeline", str(db), "-o", str(tmp_path / "t.pdf")]) == 2
    assert capsys.readouterr().err.strip() == (f"opperf timeline: -o {tmp_path / 't.pdf'}: the timeline is written "
                                               f"as .html or .png, by the file's suffix")
    assert main(["timeline", str(db), "--run", "nope", "-o", str(tmp_path / "t.html")]) == 2
    assert "--run=nope: no timed rows of that run" in capsys.readouterr().err
    assert main(["timeline", str(tmp_path / "missing.db")]) == 2
    assert "no such database" in capsys.readouterr().err
    assert not (tmp_path / "t.html").exists()


def test_timeline_of_rows_without_timestamps_says_so(project, tmp_path, capsys):
    project.runpytest("benches/", "-k", "add", *FAST).assert_outcomes(passed=4)
    db = project.path / "results" / "cpu.db"
    import sqlite3

    con = sqlite3.connect(db)
    con.execute("update [add] set started_unix_s = null, ended_unix_s = null")  # as an older version wrote them
    con.commit()
    con.close()
    assert main(["timeline", str(db), "-o", str(tmp_path / "t.html")]) == 2
    assert "no row has the timeline columns (started_unix_s, ended_unix_s)" in capsys.readouterr().err


def test_compare_leaves_a_float64_output_alone_and_counts_non_finite_values():
    from pytest_opperf import dtypes
    from pytest_opperf.measure import check

    out = torch.tensor([3.0, 4.0], dtype=torch.float64)
    ref = torch.tensor([3.0, 4.5], dtype=torch.float64)
    problem = check.compare(out, ref, dtypes.lookup("fp64"), 0.05)
    # ||(0, -0.5)|| / ||(3, 4.5)|| = 0.5 / 5.408 = 0.0925 > 0.05
    assert problem.startswith("normwise relative error 0.0925 exceeds 0.05 (largest difference at flat index 1: 4 ")
    assert out.tolist() == [3.0, 4.0]  # the difference is formed in a copy, not in the backend's output
    fp8 = torch.tensor([1.0, float("nan"), 2.0]).to(torch.float8_e4m3fn)
    bad = check.compare(fp8, torch.ones(3, dtype=torch.float64), dtypes.lookup("fp8"), 0.5)
    assert bad == "1 of 3 elements are NaN or infinite"


def test_same_output_needs_separate_tensors_equal_bit_for_bit():
    from pytest_opperf.measure.check import same_output

    a = torch.randn(8)
    x = torch.randn(8)
    assert same_output(a.clone(), a, (x,))
    assert same_output((a.clone(), x.clone()), (a, x.clone()), ())
    assert not same_output(a, a, (x,))  # one buffer: proves nothing
    assert not same_output(x[:8], x.clone(), (x,))  # a view of an input
    b = a.clone()
    b.view(torch.int32)[3] ^= 1  # one bit apart
    assert not same_output(b, a, (x,))
    assert not same_output((a.clone(),), (a, a), ())


def test_a_large_grid_collects_the_same_ids_in_the_same_order(project):
    from conftest import write_config

    # Ranges (arithmetic and geometric), a list, two backends, two dtypes and an exclusion: the ids
    # and their order are those the grid's rules give, worked out here by plain loops (a shape's
    # backends side by side: collect.group_shapes).
    write_config(project, "gemm", """
        backends: [torch, wrong]
        dtypes: [fp32, bf16]
        params:
          M: {min: 1, max: 1024, mul: 2}
          N: {min: 8, max: 64, step: 8}
          K: [16, 32, 48]
        exclude: ["m * n > 4096"]
    """)
    result = project.runpytest("benches/test_ops.py::test_gemm", "--collect-only", "-q", *FAST)
    collected = [line for line in result.stdout.lines if line.startswith("benches/")]
    expected = [f"benches/test_ops.py::test_gemm[{b}-{d}-m={m}-n={n}-k={k}]"
                for m in [2 ** i for i in range(11)] for n in range(8, 65, 8) for k in (16, 32, 48)
                if m * n <= 4096 for d in ("fp32", "bf16") for b in ("torch", "wrong")]
    assert len(expected) == 756  # 63 shapes with m * n <= 4096, x 3 k x 2 backends x 2 dtypes
    assert collected == expected


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@cuda
def test_phase_columns_on_a_gpu_with_the_default_timer(project):
    # The profiler timer, NVML readings and the clock warm-up: every phase runs and is accounted.
    result = project.runpytest("benches/", "-k", "add", "--opperf-budget=0.05", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=4)
    (db,) = (project.path / "results").glob("*.db")
    stored = rows_at(db, "add")
    assert len(stored) == 4 and {r["timer"] for r in stored} == {"profiler"}
    for row in stored:
        wall = (row["ended_unix_s"] - row["started_unix_s"]) * 1e3
        for column in ("phase_setup_ms", "phase_inputs_ms", "phase_check_ms", "phase_warmup_ms",
                       "phase_sampling_ms", "phase_verify_ms", "phase_record_ms"):
            assert row[column] is not None and row[column] >= 0, column
        assert row["phase_sampling_ms"] > 0
        assert sum(row[c] or 0.0 for c in PHASE_COLUMNS) <= wall + 0.01


def test_a_backend_that_overwrites_its_checked_output_is_still_caught(pytester):
    # Right on its first call only, and its later calls write into the first output's buffer too:
    # the timed output then equals the (overwritten) checked one bit for bit, and only a full
    # comparison with the reference shows both are wrong.
    pytester.makeconftest("""
        import torch
        from pytest_opperf import register_backend

        BUFFERS = {}

        @register_backend("add", "double_buffered")
        def add_double_buffered(a, b):
            if "first" not in BUFFERS:
                BUFFERS["first"] = a + b
                return BUFFERS["first"]
            wrong = a + b + 1
            BUFFERS["first"].copy_(wrong)
            return wrong
    """)
    pytester.makepyfile(test_ops="def test_add(backend, inputs, bench):\n    bench(backend, *inputs)\n")
    (pytester.path / "configs").mkdir()
    (pytester.path / "configs" / "add.yaml").write_text("backend: double_buffered\ndtypes: [fp32]\nparams:\n  N: [4096]\n")
    result = pytester.runpytest(*FAST)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*timer cpu: the timed call's output differs from the reference: normwise relative*"])
    assert rows(pytester, "add") == []
