"""A backend's once-a-process warm-up (Backend.warm: a compiler's own start) runs once, in a thread,
before the process's first kernel case and beside the rest of its start-up; a case then pays for its
own compile alone. A failed warm-up is a line of the summary, and the case meets the failure itself."""

import textwrap
import threading
import time

import pytest

from conftest import FAST, rows, write_config
from pytest_opperf.catalog import registry
from pytest_opperf.run.machine import Machine, backends_of

CONFTEST = textwrap.dedent("""
    import json, os, threading, time
    import torch
    from pytest_opperf import Op, register_backend, register_op

    LOG = os.path.join(os.path.dirname(__file__), "warm.log")

    def warm(device):
        start = time.time()
        time.sleep(0.3)  # a compiler's start
        if os.environ.get("WARM_FAILS"):
            raise RuntimeError("no compiler here")
        with open(LOG, "a") as f:
            f.write(json.dumps({"thread": threading.current_thread().name, "device": str(device),
                                "start": start, "end": time.time()}) + "\\n")

    register_op(Op("twice", ("n",), lambda p, dt, device, gen: (torch.randn(p["n"], generator=gen),),
                   lambda x: 2 * x.double(), lambda p, dt: p["n"], lambda p, dt: 8 * p["n"], peak="vector"))

    @register_backend("twice", "torch")
    def plain(x):
        return 2 * x

    @register_backend("twice", "compiled", warm=warm)
    def compiled(x):
        return x + x

    @register_backend("twice", "compiled_too", warm=warm)   # the same warm-up: run once
    def compiled_too(x):
        return x * 2
""")


def _project(pytester):
    pytester.makeconftest(CONFTEST)
    (pytester.path / "configs").mkdir()
    write_config(pytester, "twice", "backends: [torch, compiled, compiled_too]\ndtypes: fp32\nparams: {n: [64, 128]}\n")
    pytester.makepyfile(test_twice="def test_twice(backend, inputs, bench):\n    bench(backend, *inputs)\n")


def test_a_warm_up_runs_once_in_a_thread_and_ends_before_the_first_kernel_case(pytester):
    import json

    _project(pytester)
    result = pytester.runpytest("test_twice.py", *FAST)
    result.assert_outcomes(passed=6)
    (warmed,) = [json.loads(line) for line in (pytester.path / "warm.log").read_text().splitlines()]
    assert warmed["thread"] == "opperf-warm" and warmed["device"] == "cpu"
    first = min(r["started_unix_s"] for r in rows(pytester, "twice"))
    assert warmed["end"] <= first  # the cases did not run beside it


def test_a_warm_up_that_fails_is_said_and_the_cases_still_run(pytester, monkeypatch):
    _project(pytester)
    monkeypatch.setenv("WARM_FAILS", "1")
    result = pytester.runpytest("test_twice.py", *FAST)
    result.assert_outcomes(passed=6)
    result.stdout.fnmatch_lines(["*WARNING: warming warm before the first case failed (RuntimeError: no compiler "
                                 "here); the first case paid it*"])


class _Device:
    torch = "cpu"
    type = "cpu"


def test_the_machine_runs_each_distinct_warm_up_once_and_waits_for_them(monkeypatch):
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    calls, gate = [], threading.Event()

    def slow(device):
        gate.wait(5)
        calls.append(("slow", device, threading.current_thread().name))

    def fast(device):
        calls.append(("fast", device, threading.current_thread().name))

    def broken(device):
        calls.append(("broken", device))

    import os
    import sys

    monkeypatch.delitem(sys.modules, "colorsys", raising=False)
    slow.imports = ("colorsys",)  # imported here, before the thread starts
    broken.imports = ("no_such_module_of_opperf",)
    machine = Machine(settings=None, device=_Device(), workers=1)
    backends = [registry.Backend("op", name, len, "torch", warm=warm)
                for name, warm in (("a", slow), ("b", fast), ("c", slow), ("d", None), ("e", broken))]
    machine.warm_backends(backends + [None])
    assert "colorsys" in sys.modules
    assert machine.notes == ["WARNING: warming broken before the first case failed (ModuleNotFoundError: No module "
                             "named 'no_such_module_of_opperf'); the first case paid it"]
    machine.notes.clear()
    assert os.environ.get("TRITON_CACHE_DIR")  # pinned before Inductor's first kernel could move it
    time.sleep(0.05)
    assert calls == []  # the thread waits on `slow`: nothing ran out of order, nothing ran here
    gate.set()
    machine.warmed()
    assert calls == [("slow", "cpu", "opperf-warm"), ("fast", "cpu", "opperf-warm")]
    assert not machine.notes
    machine.warm_backends(backends)  # once a process
    machine.warmed()
    assert len(calls) == 2


def test_backends_of_items_are_the_registered_backends_of_their_cases():
    from pytest_opperf.case import CASE_FIXTURE, Case
    from pytest_opperf.catalog import BACKENDS, load_builtin

    load_builtin()

    class Item:
        def __init__(self, case):
            self.callspec = type("Spec", (), {"params": {CASE_FIXTURE: case}})()

    cases = [Case("gemm", "torch_compile", None, "bf16", "bf16", (("m", m), ("n", 8), ("k", 8))) for m in (8, 16)]
    items = [Item(c) for c in cases] + [Item(Case("gemm", "torch", None, "bf16", "bf16", ())), object()]
    found = backends_of(items)
    assert found == [BACKENDS[("gemm", "torch")], BACKENDS[("gemm", "torch_compile")]]
    assert found[1].warm is not None and found[0].warm is None


def test_inductor_warms_up_on_a_cpu():
    import torch

    from pytest_opperf.catalog.backends import torch_compile

    if not torch_compile._cxx_compiler():
        pytest.skip("Inductor on a CPU needs a C++ compiler")
    torch_compile.warm_inductor(torch.device("cpu"))  # compiles and runs its own two-op function
    assert torch_compile._scale_shift(torch.ones(2)).tolist() == [3.0, 3.0]
