"""The fixtures a bench test asks for; the plugin registers them. Each is a few lines that hand
the work to the run layer (run/bench.py: the `bench` object; run/collective.py: collectives).

    def test_gemm(backend, inputs, bench):
        bench(backend, *inputs)
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Any, Callable

import pytest

from pytest_opperf.case import Case
from pytest_opperf.catalog.registry import BACKENDS, OPS
from pytest_opperf.measure import accelerator
from pytest_opperf.run import budgets
from pytest_opperf.run.bench import INPUTS_KEY, Bench, last_reference
from pytest_opperf.run.collective import CollectiveBench, groups
from pytest_opperf.run.env import CaseEnv
from pytest_opperf.run.session import session_of


def _case(request) -> Case:
    case = getattr(request, "param", None)
    if case is None:
        pytest.fail(f"{request.node.nodeid}: opperf fixtures need a case; the test was not parametrized from a config",
                    pytrace=False)
    return case


@pytest.fixture
def opperf_case(request) -> Case:
    """The case of this test: op, backend, dtypes, parameters."""
    return _case(request)


@pytest.fixture(autouse=True)
def opperf_search_budget(request):
    """Skips a case of a searched shape whose time budget is spent; times the others against it.

    Autouse fixtures are set up first and torn down last: the whole test counts.
    """
    callspec = getattr(request.node, "callspec", None)
    case = callspec.params.get("opperf_case") if callspec is not None else None
    if case is None:
        yield
        return
    with budgets.budgets(request.config).charge(case):
        yield


def case_env(config: pytest.Config, case: Case) -> CaseEnv:
    """The case's environment: its config from collection, its inputs' seed (a fresh one in each of
    the gate's confirmation rounds)."""
    session = session_of(config)
    return session.env.for_case(case, session.collection.config_of.get(case), session.gate.seed_offset)


@dataclass(frozen=True)
class Device:
    """What the `device` fixture gives: the hardware spec and the torch device the cases run on."""

    name: str  # the spec's name: --device=NAME, results/NAME.db
    spec: Any  # hardware.HardwareSpec: peaks, bandwidth, memory
    torch: Any  # torch.device
    reported_name: str  # what the driver calls it

    @property
    def type(self) -> str:
        return self.torch.type


@pytest.fixture
def device(request) -> Device:
    """The device of this session: spec (peaks) and torch device."""
    device = session_of(request.config).env.device
    return Device(device.spec.name, device.spec, device.torch, device.accelerator.reported_name)


@pytest.fixture
def backend(opperf_case: Case) -> Callable:
    """The registered callable of this case's backend (knobs bound as keyword arguments)."""
    fn = BACKENDS[(opperf_case.op, opperf_case.backend)].fn
    return functools.partial(fn, **dict(opperf_case.knobs)) if opperf_case.knobs else fn


@pytest.fixture
def inputs(request, opperf_case: Case, device: Device) -> tuple:
    """The op's inputs for this case, random from a per-case seed, on the device."""
    import torch

    env = case_env(request.config, opperf_case)
    last_reference(request.config).release(unless=opperf_case.inputs_key)  # before these inputs take memory
    start = time.perf_counter()
    gen = torch.Generator(device=device.torch).manual_seed(env.seed)
    op = OPS[opperf_case.op]
    with torch.inference_mode():
        made = op.inputs(opperf_case.param_dict, env.dtypes, device.torch, gen)
    # Waited for, so their creation is counted here and not in the check that first reads them.
    accelerator.synchronize(device.type)
    request.node.stash[INPUTS_KEY] = time.perf_counter() - start
    return made


@pytest.fixture
def bench(request, opperf_case: Case) -> Bench:
    """Checks, then times a callable: bench(fn, *args). The record lands in the database."""
    return Bench(request.node, case_env(request.config, opperf_case), session_of(request.config).gate,
                 last_reference(request.config))


@pytest.fixture
def collective(request, opperf_case: Case) -> CollectiveBench:
    """Checks, then times a collective on `num_devices` ranks: collective(backend). The row lands in
    the database with algbw_gbps and busbw_gbps."""
    session = session_of(request.config)
    last_reference(request.config).release()  # a kernel case's kept reference: no memory of the ranks'
    return CollectiveBench(request.node, case_env(request.config, opperf_case), session.gate,
                           groups(request.config))
