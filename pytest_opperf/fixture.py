"""The fixtures a bench test uses, and the `bench` object that checks, times and records.

    def test_gemm(backend, inputs, bench):
        bench(backend, *inputs)

`bench(fn, *args)` first checks fn's output against the op's reference (a mismatch fails
the test and writes no row), then times it with the session's timer until the stopping
rule is met, and leaves the record on the test item for the report to carry.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import math
import zlib
from dataclasses import dataclass
from typing import Any, Callable

import pytest

from . import check, timing
from .baseline import regressed
from .config import Case
from .registry import BACKENDS, OPS
from .session import installed_version
from .stats import StoppingRule

RECORD_KEY = pytest.StashKey[dict]()


class Bench:
    def __init__(self, item: pytest.Item, case: Case, state):
        self.item = item
        self.case = case
        self.state = state
        self.op = OPS[case.op]
        self.dtypes = state.dtypes_of(case)
        self.extra_info: dict = {}
        self.checked = False
        self.measurement = None

    def check(self, fn: Callable, *args, **kwargs) -> Any:
        """Run fn once and compare with the op's reference; fails the test on a mismatch."""
        import torch

        with torch.inference_mode():
            out = fn(*args, **kwargs)
            ref = self.op.reference(*args)
            cfg_tol = self._tolerance()
            problem = check.compare(out, ref, self.dtypes.output, cfg_tol)
        if problem:
            pytest.fail(f"functional check failed: {self.case.op}/{self.case.backend} [{self.case.id}]: {problem}",
                        pytrace=False)
        self.checked = True
        return out

    def __call__(self, fn: Callable, *args, **kwargs) -> Any:
        """Check fn(*args, **kwargs), then time it and record the result; returns its output."""
        import torch

        out = self.check(fn, *args, **kwargs) if not self.checked else None
        settings = self.state.settings
        cfg = self._config()
        timer_name = _pick(settings.timer, cfg.timer if cfg else None, timing.default_timer(self.state.device.type))
        cache = _pick(settings.cache, cfg.cache if cfg else None, timing.default_cache(self.state.device.type))
        if timer_name not in timing.TIMERS:
            pytest.fail(f"{cfg.path}: timer: unknown timer {timer_name!r}; expected one of {sorted(timing.TIMERS)}",
                        pytrace=False)
        rule = StoppingRule(settings.target_rel, settings.min_samples, settings.max_samples, settings.budget_s)
        with torch.inference_mode():
            try:
                m = timing.measure(timing.Workload(fn, args, kwargs), self.state.device, timer_name, cache, rule,
                                   warmup_s=settings.warmup_s, cache_bytes=self.state.cache_bytes())
            except timing.TimerError as exc:
                pytest.fail(f"timer {timer_name}: {exc}", pytrace=False)
        self.measurement = m
        record = self._record(m)
        verdict = self.state.judge(self.case, record)
        if verdict is not None:
            record["gate"] = verdict
        # Stashed before failing: a regressed measurement is still a valid row for the database.
        self.item.stash[RECORD_KEY] = record
        if regressed(record):
            pytest.fail(self.state.gate.failure_message(verdict), pytrace=False)
        return out

    def _config(self):
        return self.state.config_of.get(self.case)

    def _tolerance(self) -> float:
        cfg = self._config()
        if cfg and self.dtypes.output.name in cfg.tolerance:
            return cfg.tolerance[self.dtypes.output.name]
        return self.dtypes.output.max_rel_err

    def _record(self, m: timing.Measurement) -> dict:
        s = m.stats
        case, p = self.case, self.case.param_dict
        return {
            "op": case.op,
            "_params": list(self.op.params),
            **p,
            "dtype_in": case.dtype_in,
            "dtype_out": case.dtype_out,
            "backend": case.backend,
            "backend_version": installed_version(case),
            "knobs": json.dumps(dict(case.knobs), sort_keys=True) if case.knobs else "",
            "timer": m.timer,
            "cache": m.cache,
            "time_us": s.median,
            "time_us_mean": s.mean,
            "time_us_p95": s.p95,
            "time_us_std": s.std,
            "time_us_min": s.min,
            "cv": s.cv,
            "samples": s.n,
            "ci_rel": None if math.isinf(s.median_ci_rel) else s.median_ci_rel,
            "target_met": int(m.met),
            "unstable": int(s.unstable),
            "flops": float(self.op.flops(p, self.dtypes)),
            "bytes": float(self.op.bytes(p, self.dtypes)),
            "peak_dtype": case.dtype_in,
            "peak_kind": self.op.peak,
            "kernels": m.kernels,
            "warmup_calls": m.warmup_calls,
            "test_id": self.item.nodeid,
            "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "extra_info": dict(self.extra_info),
        }


def _pick(option: str, from_config, default: str) -> str:
    """The command line (when not 'auto') wins over the config, which wins over the default."""
    if option != "auto":
        return option
    return from_config or default


def case_seed(seed: int, case: Case) -> int:
    """A stable per-case seed: the same case gets the same inputs in every process."""
    return (seed * 1_000_003 + zlib.crc32(f"{case.op}/{case.id}".encode())) % (2**63)


# --- fixtures (registered by the plugin) ----------------------------------------------------


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
    from .plugin import state_of

    state = state_of(request.config)
    return Device(state.spec.name, state.spec, state.device, state.accelerator.reported_name)


@pytest.fixture
def backend(opperf_case: Case) -> Callable:
    """The registered callable of this case's backend (knobs bound as keyword arguments)."""
    fn = BACKENDS[(opperf_case.op, opperf_case.backend)].fn
    return functools.partial(fn, **dict(opperf_case.knobs)) if opperf_case.knobs else fn


@pytest.fixture
def inputs(request, opperf_case: Case, device: Device) -> tuple:
    """The op's inputs for this case, random from a per-case seed, on the device."""
    import torch

    from .plugin import state_of

    state = state_of(request.config)
    gen = torch.Generator(device=device.torch).manual_seed(case_seed(state.settings.seed, opperf_case))
    op = OPS[opperf_case.op]
    with torch.inference_mode():
        return op.inputs(opperf_case.param_dict, state.dtypes_of(opperf_case), device.torch, gen)


@pytest.fixture
def bench(request, opperf_case: Case) -> Bench:
    """Checks, then times a callable: bench(fn, *args). The record lands in the database."""
    from .plugin import state_of

    return Bench(request.node, opperf_case, state_of(request.config))
