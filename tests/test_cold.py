"""Cold is cold for every op (GPU only): before each timed call none of its inputs is in L2 and L2
holds no dirty lines, whatever the size of the inputs.

Before the read flush, cold rotated input copies: a 64-token embedding from a 32000x4096 table read
0.62x its hot time (the table stayed in L2), an int8 GEMM 256^3 0.78x, and rope at 4096 tokens 1.19x
a read-flushed time (the previous call's dirty output written back inside the timed call).
"""

import importlib.util
import json
import statistics
from pathlib import Path

import pytest
import torch

from pytest_opperf.catalog import load_builtin
from pytest_opperf.measure import inputs, sampler
from pytest_opperf.measure.stats import StoppingRule

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
RULE = StoppingRule(target_rel=0.005, min_samples=50, max_samples=5000, budget_s=2.0)
EMBEDDING = ("embedding", "torch", "bf16", {"tokens": 64, "vocab": 32000, "hidden": 4096})
INT8_GEMM = ("gemm", "torch", "int8", {"m": 256, "n": 256, "k": 256})
ROPE = ("rope", "torch", "bf16", {"tokens": 4096, "heads_q": 32, "heads_kv": 8, "head_dim": 128, "layout": "neox"})


def _independent():
    """benchmarks/acceptance/independent_check.py: a timing written apart from the plugin's timers."""
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "acceptance" / "independent_check.py"
    spec = importlib.util.spec_from_file_location("independent_check", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _case(op, backend, dtype, params):
    """The catalogue's callable and inputs of a case, as the sweep builds them."""
    load_builtin()
    row = {"backend": backend, "dtype_in": dtype, "dtype_out": "int32" if dtype == "int8" else dtype, "knobs": "",
           **params}
    return _independent().rebuild(op, row, list(params), torch.device("cuda"))


def _median(case, timer_name, cache):
    fn, args = _case(*case)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    with torch.inference_mode():
        m = sampler.measure(inputs.Workload(fn, args), torch.device("cuda"), timer_name, cache, RULE, cache_bytes=l2)
    return m


@cuda
@pytest.mark.parametrize("timer_name", ["profiler", "cuda_graph", "event"])
@pytest.mark.parametrize("case", [EMBEDDING, INT8_GEMM], ids=["embedding-64-of-32000x4096", "gemm-int8-256"])
def test_cold_is_no_faster_than_hot_when_the_inputs_outgrow_a_rotation(case, timer_name):
    cold, hot = _median(case, timer_name, "cold"), _median(case, timer_name, "hot")
    assert cold.cache_flush == "read" and hot.cache_flush == "none"
    assert cold.stats.median >= hot.stats.median, (cold.stats.median, hot.stats.median)


@cuda
@pytest.mark.parametrize("case", [ROPE, EMBEDDING], ids=["rope-4096", "embedding-64-of-32000x4096"])
def test_cold_agrees_with_an_independent_read_flushed_time(case):
    ic = _independent()
    fn, args = _case(*case)
    sep = ic.Separator(torch.device("cuda"), True, torch.cuda.get_device_properties(0).L2_cache_size)
    independent = statistics.median(ic.call_times_us(fn, args, sep, 200))
    recorded = _median(case, "profiler", "cold").stats.median
    assert abs(recorded / independent - 1) <= 0.05, (recorded, independent)


@cuda
def test_the_independent_separator_splits_calls_that_run_a_memset_and_an_int16_max():
    # The kernels torch's own flush would run (stop 25 could not check 28 rows that run them).
    ic = _independent()
    x = torch.randint(0, 100, (1 << 20,), dtype=torch.int16, device="cuda")

    def fn(x):
        return torch.zeros(1 << 20, device="cuda").sum() + x.max()

    for cold in (True, False):
        sep = ic.Separator(torch.device("cuda"), cold, torch.cuda.get_device_properties(0).L2_cache_size)
        times = ic.call_times_us(fn, (x,), sep, 10)
        assert len(times) == 10 and all(t > 0 for t in times), times


@cuda
def test_the_independent_check_in_the_sweeps_process_agrees_with_the_rows(project, monkeypatch):
    # benchmarks/acceptance/independent_check.py as a plugin: each case's callable timed by its own loop right
    # after the plugin measured it, in the same process.
    from conftest import write_config

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "benchmarks" / "acceptance"))
    write_config(project, "add", "backend: torch\ndtypes: bf16\nparams:\n  N: [1048576, 16777216]\n")
    result = project.runpytest("benches", "-k", "add", "-p", "independent_check", "-p", "no:cacheprovider",
                               "-p", "no:randomly", "--independent-json=check.json")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*independent check, in the sweep's process*", "2 rows timed: *"])
    rows = json.loads((project.path / "check.json").read_text())["rows"]
    assert len(rows) == 2 and all(r["cache"] == "cold" and r["timer"] == "profiler" for r in rows), rows
    assert all(abs(r["ratio"] - 1) <= 0.10 for r in rows), [(r["row"], r["ratio"]) for r in rows]


def test_the_check_rebuilds_a_sweeps_rows_and_counts_rows_at_another_clock_apart(project):
    # On any machine: --dry-run rebuilds every row of a database and calls it; the summary's bounds
    # leave out a row the check timed at another SM clock than the sweep (and name it).
    ic = _independent()
    from conftest import write_config

    write_config(project, "add", "backend: torch\ndtypes: fp32\nparams:\n  N: [1024, 4096]\n")
    project.runpytest("benches", "-k", "add", "--device=cpu", "--opperf-budget=0.02", "-p", "no:randomly",
                      "-p", "no:cacheprovider").assert_outcomes(passed=2)
    out = project.path / "check.json"
    assert ic.main(["--db", str(project.path / "results" / "cpu.db"), "--dry-run", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [("error" in r, r["recorded_us"] > 0) for r in rows] == [(False, True)] * 2

    def timed(label, ratio, here_mhz):
        return {"row": label, "recorded_us": 10.0 * ratio, "independent_us": 10.0, "ratio": ratio,
                "recorded_sm_mhz": [1980, 1980], "clocks": [[[1980, 300], [here_mhz, 300]]]}

    line = ic.summary([timed("a", 1.01, 1980), timed("b", 0.93, 1515), timed("c", 0.94, 1960)])
    assert line.startswith("3 rows timed: rows >= 5 us: 1/2 within 5%; rows < 5 us: 0/0 within 10%")
    assert "1 rows at another SM clock than recorded, not compared (b 0.930 at -23% SM clock)" in line
