"""The timed calls are the checked calls: a timer or backend whose timed calls do other work than the
checked call fails its case, naming the timer, and writes no row. CPU cases everywhere; the CUDA-graph
ones on a GPU (skipped cleanly without one)."""

import pytest
import torch

from conftest import FAST, rows, rows_at, write_config
from pytest_opperf.measure import timers

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
GPU_FAST = tuple(a for a in FAST if not a.startswith("--device"))

BENCH = """
import pytest
import torch


def test_add(backend, inputs, bench):
    bench(backend, *inputs)


@pytest.mark.opperf(op="add")
def test_add_fresh(backend, inputs, bench):
    def setup():  # new random inputs before every sample, and before the timed call that is checked
        return tuple(torch.randn_like(x) for x in inputs), {}
    bench.pedantic(backend, setup=setup, rounds=3)
"""

CONFTEST = """
import torch
from pytest_opperf import register_backend
from pytest_opperf.measure import timers

_STATE = {}


@register_backend("add", "accumulating")
def add_accumulating(a, b):
    # A classic stale-state bug: an output buffer reused across calls and never zeroed.
    # The first call (the functional check) is right; every later one is off.
    buf = _STATE.setdefault("buffer", torch.zeros_like(a))
    return buf.add_(a + b)


@register_backend("add", "cached")
def add_cached(a, b):
    # Returns the result of the first inputs it saw, whatever it is given now.
    return _STATE.setdefault("first", a + b)


@timers.timer
class UncopiedTimer(timers.CpuTimer):
    # Calls on inputs it allocated but never filled: a copy bug in a timer that copies its inputs.
    name = "uncopied"

    def __init__(self, work, device, cache, cache_bytes, calls_per_sample=1):
        super().__init__(work, device, cache, cache_bytes, calls_per_sample)
        self.empty = tuple(torch.zeros_like(a) if isinstance(a, torch.Tensor) else a for a in work.args)

    def _next_args(self):
        return self.empty


@register_backend("add", "graph_shy")
def add_graph_shy(a, b):
    # Host-side logic that keeps the work out of a CUDA graph: while a graph is captured it hands
    # back a copy of its last result instead of adding. Right values, but not the work timed.
    if torch.cuda.is_current_stream_capturing() and "last" in _STATE:
        return _STATE["last"].clone()
    _STATE["last"] = a + b
    return _STATE["last"]


@register_backend("add", "host_counter")
def add_host_counter(a, b):
    # Device state kept in step by a Python counter: a real call moves both; a graph replay moves
    # only the device side, since the counter's value at capture is frozen into the graph.
    if "acc" not in _STATE:
        _STATE["acc"], _STATE["calls"] = torch.zeros((), device=a.device), 0
    _STATE["calls"] += 1
    _STATE["acc"].add_(1)
    return a + b + (_STATE["acc"] - _STATE["calls"])
"""


def _add(backend: str, n: int = 4096) -> str:
    return f"backend: {backend}\ndtypes: fp32\nparams: {{N: {n}}}\n"


@pytest.fixture
def checked_project(pytester):
    pytester.makepyfile(conftest=CONFTEST)
    (pytester.path / "benches").mkdir()
    (pytester.path / "benches" / "test_ops.py").write_text(BENCH)
    (pytester.path / "configs").mkdir()
    with timers.registered():  # in-process sessions register the conftest's timers here too
        yield pytester


def fails_naming_the_timer(project, backend: str, message: str, *args, n: int = 4096):
    """Runs the add cases of `backend`: one fails with `message` and no row is written."""
    write_config(project, "add", _add(backend, n))
    result = project.runpytest("benches", *args)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*{message}*"])
    assert not any(rows_at(db, "add") for db in (project.path / "results").glob("*.db"))


@pytest.mark.parametrize("cache", ["cold", "hot"])
def test_a_backend_right_only_on_its_first_call_fails_naming_the_timer(checked_project, cache):
    fails_naming_the_timer(checked_project, "accumulating", "timer cpu: the timed call's output differs from the "
                           "reference: normwise relative error * exceeds 0.0001", "-k", "test_add[",
                           f"--opperf-cache={cache}", *FAST)


def test_a_timer_that_times_other_inputs_fails_naming_the_timer(checked_project):
    fails_naming_the_timer(checked_project, "torch", "timer uncopied: the timed call's inputs differ from the inputs "
                           "it was given: the timer timed other data", "-k", "test_add[", "--opperf-timer=uncopied",
                           *FAST)


def test_fresh_inputs_from_setup_are_checked_against_their_own_reference(checked_project):
    write_config(checked_project, "add", _add("torch"))
    checked_project.runpytest("benches", "-k", "test_add_fresh", *FAST).assert_outcomes(passed=1)
    assert [r["backend"] for r in rows(checked_project, "add")] == ["torch"]
    (checked_project.path / "results" / "cpu.db").unlink()
    # The same fresh inputs catch a backend that returns the result of the first inputs it saw.
    fails_naming_the_timer(checked_project, "cached", "timer cpu: the timed call's output differs from the reference",
                           "-k", "test_add_fresh", *FAST)


# --- on a GPU ---------------------------------------------------------------------------------


@cuda
@pytest.mark.parametrize("cache", ["cold", "hot"])
def test_the_graph_timer_fails_a_backend_whose_work_the_graph_does_not_capture(checked_project, cache):
    write_config(checked_project, "add", _add("graph_shy", 1 << 20))
    # Every call is real with events: the case passes.
    checked_project.runpytest("benches", "-k", "test_add[", "--opperf-timer=event", *GPU_FAST).assert_outcomes(passed=1)
    for db in (checked_project.path / "results").glob("*.db"):
        db.unlink()
    fails_naming_the_timer(checked_project, "graph_shy", "timer cuda_graph: the timed call did not run kernels the "
                           "checked call ran: missing [[]*[]]", "-k", "test_add[", "--opperf-timer=cuda_graph",
                           f"--opperf-cache={cache}", *GPU_FAST, n=1 << 20)


@cuda
def test_the_graph_timer_fails_a_backend_whose_host_counter_the_graph_freezes(checked_project):
    write_config(checked_project, "add", _add("host_counter", 1 << 20))
    for timer_name in ("event", "profiler"):
        checked_project.runpytest("benches", "-k", "test_add[", f"--opperf-timer={timer_name}",
                                  *GPU_FAST).assert_outcomes(passed=1)
    for db in (checked_project.path / "results").glob("*.db"):
        db.unlink()
    fails_naming_the_timer(checked_project, "host_counter", "timer cuda_graph: the timed call's output differs from "
                           "the reference: normwise relative error", "-k", "test_add[", "--opperf-timer=cuda_graph",
                           *GPU_FAST, n=1 << 20)
