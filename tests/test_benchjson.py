"""pytest-benchmark compatibility: its statistics, the `bench` calling convention, and the JSON
export read back by pytest-benchmark's own compare command."""

import json
import subprocess
import sys

import pytest
from pytest_benchmark.stats import Stats as BenchmarkStats

from conftest import FAST, rows, write_config
from pytest_opperf.measure import sampler
from pytest_opperf.measure.stats import Stats
from pytest_opperf.store import benchjson


def test_our_stats_agree_with_pytest_benchmarks_on_the_same_data():
    data = [12.0, 10.5, 11.0, 30.0, 10.0, 10.25, 11.5, 10.75, 9.5]
    ours, theirs = Stats(data), BenchmarkStats()
    for x in data:
        theirs.update(x)
    assert (ours.min, ours.max, ours.n) == (theirs.min, theirs.max, theirs.rounds)
    assert ours.mean == pytest.approx(theirs.mean) and ours.std == pytest.approx(theirs.stddev)
    assert ours.median == theirs.median == 10.75


def test_exported_stats_are_pytest_benchmarks_own_in_seconds_per_call():
    samples_us = [1.0, 2.0, 3.0, 4.0, 20.0, 2.5]
    s = benchjson.stats_of(samples_us, calls_per_sample=10)
    # Quartiles, outlier bounds (hd15iqr, ld15iqr) and outlier counts are pytest-benchmark's to
    # define, and they changed between its releases: the export must carry whatever the
    # installed release computes from the same samples in seconds.
    theirs = BenchmarkStats()
    for x in samples_us:
        theirs.update(x * 1e-6)
    for name in BenchmarkStats.fields:
        expected = getattr(theirs, name)
        assert s[name] == (pytest.approx(expected) if isinstance(expected, float) else expected), name
    # The units, by hand: seconds per call, the samples' count as rounds, the calls as iterations.
    assert s["median"] == pytest.approx(2.75e-6) and s["min"] == pytest.approx(1e-6) and s["max"] == pytest.approx(20e-6)
    assert s["total"] == pytest.approx(32.5e-6) and s["ops"] == pytest.approx(6 / 32.5e-6)
    assert s["rounds"] == 6 and s["iterations"] == 10


PEDANTIC = """
import pytest


def test_add(backend, inputs, bench):
    bench.extra_info["note"] = "pedantic"
    prepared = []

    def setup():
        prepared.append(1)
        return inputs, {}

    out = bench.pedantic(backend, setup=setup, rounds=12, warmup_rounds=2)
    assert out.shape == inputs[0].shape and len(prepared) >= 1 + 12


def test_gemm(backend, inputs, bench):
    out = bench.pedantic(backend, args=inputs, iterations=4, rounds=5)
    assert out.shape == (inputs[0].shape[0], inputs[1].shape[1])


@pytest.mark.opperf(op="add")
def test_misuse(backend, inputs, bench):
    bench.pedantic(backend, args=inputs, setup=lambda: (inputs, {}))


@pytest.mark.opperf(op="add")
def test_extra_info_not_json(backend, inputs, bench):
    bench.extra_info["input"] = inputs[0]
    bench(backend, *inputs)
"""


def test_pedantic_and_extra_info_map_onto_the_sampler(project):
    (project.path / "benches" / "test_ops.py").write_text(PEDANTIC)
    write_config(project, "add", "backend: torch\ndtypes: fp32\nparams: {N: 64}\n")
    write_config(project, "gemm", "backend: torch\ndtypes: fp32\nparams: {M: 8, N: 8, K: 8}\n")
    result = project.runpytest("benches", *FAST)
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines(["*ValueError: bench.pedantic: give either setup*or args/kwargs, not both*"])
    result.stdout.fnmatch_lines(["*bench.extra_info must hold JSON data*Tensor is not JSON serializable*"])
    (add,) = [r for r in rows(project, "add") if "test_add" in r["test_id"]]
    assert add["samples"] >= 12 and add["warmup_calls"] >= sampler.WARMUP_CALLS and add["calls_per_sample"] == 1
    assert json.loads(add["extra_info"]) == {"note": "pedantic"}
    (gemm,) = rows(project, "gemm")
    assert gemm["calls_per_sample"] == 4 and gemm["samples"] >= 5 and gemm["extra_info"] is None


def _compare(path):
    """pytest-benchmark's compare command (its console script's entry point, same interpreter)."""
    return subprocess.run([sys.executable, "-m", "pytest_benchmark", "compare", str(path), "--columns=min,median,rounds"],
                          capture_output=True, text=True, timeout=120)


def test_json_export_under_xdist_is_read_by_pytest_benchmark_compare(project):
    result = project.runpytest("benches", "-n", "2", "--opperf-benchmark-json=out/bench.json", *FAST)
    result.assert_outcomes(passed=6)
    result.stdout.fnmatch_lines(["*opperf: 6 benchmarks written to*bench.json (pytest-benchmark JSON)*"])
    doc = json.loads((project.path / "out" / "bench.json").read_text())
    assert set(doc) == {"machine_info", "commit_info", "benchmarks", "datetime", "version"}
    assert doc["machine_info"]["opperf"]["device"] == "cpu" and "python_version" in doc["machine_info"]
    by_test = {b["fullname"]: b for b in doc["benchmarks"]}
    db_rows = rows(project, "gemm") + rows(project, "add")
    assert sorted(by_test) == sorted(r["test_id"] for r in db_rows)
    for row in db_rows:
        bench = by_test[row["test_id"]]
        assert bench["group"] == row["test_id"].split("::")[1].split("[")[0].removeprefix("test_")
        assert bench["stats"]["median"] * 1e6 == pytest.approx(row["time_us"])  # seconds, same samples
        assert bench["stats"]["min"] * 1e6 == pytest.approx(row["time_us_min"])
        assert bench["stats"]["rounds"] == row["samples"] and bench["stats"]["iterations"] == 1
        assert bench["options"]["timer"] == "cpu" and bench["params"]["backend"] == "torch"
    compared = _compare(project.path / "out" / "bench.json")
    assert compared.returncode == 0, compared.stderr
    for name in ("test_gemm[torch-fp32-m=2-n=16-k=8]", "test_add[torch-bf16-n=4096]"):
        assert name in compared.stdout, compared.stdout


def test_json_export_with_sample_only_writes_the_file_but_no_database(project):
    result = project.runpytest("benches", "-k", "add and fp32", "--opperf-sample-only",
                               "--opperf-benchmark-json=bench.json", *FAST)
    result.assert_outcomes(passed=2)
    assert not (project.path / "results").exists()
    doc = json.loads((project.path / "bench.json").read_text())
    assert [b["name"] for b in doc["benchmarks"]] == ["test_add[torch-fp32-n=1024]", "test_add[torch-fp32-n=4096]"]
    assert doc["commit_info"]["id"] == "unversioned"  # pytester's directory is no checkout


# --- pytest-benchmark's own options and header in an opperf session ----------------------------


def test_pytest_benchmarks_options_that_do_nothing_here_are_named_once(project):
    result = project.runpytest("benches", "-k", "add", "--benchmark-histogram", "--benchmark-autosave",
                               "--benchmark-json=out.json", *FAST)
    result.assert_outcomes(passed=4)
    notes = [line for line in result.outlines if "no effect on opperf cases" in line]
    assert notes == ["opperf: no effect on opperf cases (pytest-benchmark's fixture only): --benchmark-histogram -> "
                     "opperf plot or --opperf-html; --benchmark-autosave -> results/<device>.db or "
                     "--opperf-save-baseline; --benchmark-json -> --opperf-benchmark-json"]
    assert len(rows(project, "add")) == 4  # the cases ran and stored as without them


def test_pytest_benchmarks_header_is_its_version_unless_verbose(project):
    import pytest_benchmark

    short = project.runpytest("benches", "-k", "add", *FAST)
    (line,) = [line for line in short.outlines if line.startswith("benchmark: ")]
    assert line == f"benchmark: {pytest_benchmark.__version__} (pytest-benchmark; its defaults: -v)"
    assert not [line for line in short.outlines if "no effect on opperf cases" in line]  # no option given
    verbose = project.runpytest("benches", "-k", "add", "-v", *FAST)
    assert [line for line in verbose.outlines if line.startswith("benchmark: ") and "min_rounds=" in line]


SAVES_INTO_STORAGE = """
from pathlib import Path


def test_saves():  # what pytest-benchmark's --benchmark-autosave does (it is off inside xdist workers)
    Path(".benchmarks/Linux-CPython-3-64bit").mkdir(parents=True, exist_ok=True)
    Path(".benchmarks/Linux-CPython-3-64bit/0001_run.json").write_text("{}")
"""


def test_pytest_benchmarks_storage_folder_is_not_left_behind_empty(project):
    folder = project.path / ".benchmarks"
    project.runpytest("benches", "-k", "add", *FAST).assert_outcomes(passed=4)
    assert not folder.exists()  # pytest-benchmark made it, nothing went in: gone
    # A session that saved into it: the folder and what it holds stay.
    (project.path / "test_saves.py").write_text(SAVES_INTO_STORAGE)
    project.runpytest("test_saves.py", *FAST).assert_outcomes(passed=1)
    assert [p.name for p in folder.rglob("*.json")] == ["0001_run.json"]
    # A folder that was there before the session is the user's: kept, even empty.
    for p in sorted(folder.rglob("*"), reverse=True):
        p.unlink() if p.is_file() else p.rmdir()
    project.runpytest("benches", "-k", "add", *FAST).assert_outcomes(passed=4)
    assert folder.is_dir()


def test_without_pytest_benchmark_the_session_runs_and_says_nothing_of_it(project):
    result = project.runpytest("benches", "-k", "add", "-p", "no:benchmark", *FAST)
    result.assert_outcomes(passed=4)
    assert not [line for line in result.outlines if line.startswith("benchmark: ") or "pytest-benchmark" in line]
