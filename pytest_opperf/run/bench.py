"""The `bench` object: what a bench test calls to check, time and record a backend.

    def test_gemm(backend, inputs, bench):
        bench(backend, *inputs)

`bench(fn, *args)` first checks fn's output against the op's reference (a mismatch fails
the test and writes no row), then times it with the session's timer until the stopping
rule is met, checks the output of one timed call against the same reference (a timer that
skipped work fails the test, naming the timer), and leaves the record on the test item for
the report to carry.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import math
import time
from typing import Any, Callable, Optional

import pytest

from pytest_opperf.case import Case
from pytest_opperf.catalog import tuned
from pytest_opperf.catalog.registry import OPS, BackendUnavailable, installed_version
from pytest_opperf.measure import accelerator, check, contention, devstate, phases, sampler, timers, trace
from pytest_opperf.measure.inputs import Workload, default_cache
from pytest_opperf.measure.stats import StoppingRule
from pytest_opperf.gate.session import GateSession
from pytest_opperf.record import SAMPLES_KEY, Record
from pytest_opperf.run.env import CaseEnv

RECORD_KEY = pytest.StashKey[dict]()
# A case whose functional check failed: its key and the message, for the controller to mark its stored rows.
CHECK_FAILED_KEY = pytest.StashKey[dict]()
SETUP_KEY = pytest.StashKey[phases.Span]()  # the case's pytest set-up, timed by the plugin's hook
INPUTS_KEY = pytest.StashKey[float]()  # seconds the inputs fixture took, inside the set-up
REFERENCES_KEY = pytest.StashKey[check.LastReference]()  # the session's last reference output


def last_reference(config: pytest.Config) -> check.LastReference:
    """The session's kept reference output (check.LastReference), shared by the cases of one shape."""
    return config.stash.setdefault(REFERENCES_KEY, check.LastReference())


class Bench:
    """The `bench` fixture, with pytest-benchmark's calling convention and a functional check first.

        bench(fn, *args, **kwargs)                    # check, time, record; returns fn's output
        bench.pedantic(fn, args=(a, b), rounds=50, warmup_rounds=5, iterations=10)
        bench.extra_info["note"] = "tuned"            # lands in the row's extra_info column (JSON)
    """

    def __init__(self, item: pytest.Item, env: CaseEnv, gate: GateSession,
                 references: Optional[check.LastReference] = None):
        self.item = item
        self.env = env
        self.case: Case = env.case
        self.gate = gate
        self.op = OPS[self.case.op]
        self.dtypes = env.dtypes
        self.extra_info: dict = {}
        self.checked = False
        self.reference: Optional[tuple] = None  # (the checked inputs, their reference output)
        self.checked_out: Any = None  # the checked call's output, which passed against that reference
        self.checked_fingerprint: Optional[tuple] = None
        self.measurement = None
        self.first_call_ms: Optional[float] = None
        self.check_floor: Optional[float] = None  # the smallest scale error the check surely catches (check.examine)
        self.phases = phases.PhaseClock(env.run.activity.listener(item.nodeid))
        self.tuned: Optional[tuple[dict, str]] = None  # (knobs, table file) a kernel took from a tuned table
        self.references = references  # the reference output of the case before, where its inputs were these

    def check(self, fn: Callable, *args, **kwargs) -> Any:
        """Run fn once and compare with the op's reference; fails the test on a mismatch."""
        import torch

        with self.phases("check"), torch.inference_mode():
            # The first call pays compilation, autotuning and lazy initialisation: kept apart from
            # the timing (warm-up follows) and recorded as first_call_ms.
            tuned.take_hit()
            start = time.perf_counter()
            try:
                with self.phases.told("first call"):
                    out = fn(*args, **kwargs)
                    accelerator.synchronize(self.env.device.type)
            except BackendUnavailable as exc:
                pytest.skip(f"backend {self.case.backend}: {exc}")
            self.first_call_ms = (time.perf_counter() - start) * 1e3
            self.tuned = tuned.take_hit()
            ref = self._reference(args)
            cfg_tol = self._tolerance()
            problem, self.check_floor = check.examine(out, ref, self.dtypes.output, cfg_tol)
        if problem:
            self.item.stash[CHECK_FAILED_KEY] = {
                "op": self.case.op, **self.case.param_dict, "dtype_in": self.case.dtype_in,
                "dtype_out": self.case.dtype_out, "backend": self.case.backend, "knobs": self._knobs(),
                "check_failed": problem}
            pytest.fail(f"functional check failed: {self.case.op}/{self.case.backend} [{self.case.id}]: {problem}",
                        pytrace=False)
        self.checked = True
        self.reference = (args, ref)  # kept for the timed call's check: computed once
        self.checked_out = out  # alive until _run returns it anyway: keeping it costs no memory
        self.checked_fingerprint = check.fingerprint(out)  # to tell later whether it still holds what passed
        return out

    def _reference(self, args: tuple) -> Any:
        """The op's reference output on args: the one computed for the case before (another backend
        of this shape) where its inputs equal these, else computed and kept for the next."""
        key = self.case.inputs_key
        ref = self.references.get(key, args) if self.references is not None else None
        if ref is None:
            ref = self.op.reference(*args)
            if self.references is not None:
                self.references.keep(key, args, ref)
        return ref

    def _check_timed(self, work: Workload, args: tuple, out: Any) -> Optional[str]:
        """Why the output of a call the timer made is wrong, or None.

        Its inputs are the work's arguments (a timer of one's own may copy them): when they are
        the checked inputs, the kept reference holds. Other checked inputs (bench.check on
        other data) or pedantic's setup giving fresh ones: the reference of the timed inputs.
        """
        if work.setup is None:
            if not check.same_values(args, work.args):
                return "the timed call's inputs differ from the inputs it was given: the timer timed other data"
            args = work.args  # equal values; compared with the checked inputs below by identity, for free
        checked_args, ref = self.reference
        if not check.same_values(args, checked_args):
            ref = self.op.reference(*args)
        elif (self.checked_fingerprint is not None and check.same_output(out, self.checked_out, args)
              and check.fingerprint(self.checked_out) == self.checked_fingerprint):
            return None  # bit for bit the output that passed against this reference: compare() would agree
        problem = check.compare(out, ref, self.dtypes.output, self._tolerance())
        return f"the timed call's output differs from the reference: {problem}" if problem else None

    def __call__(self, fn: Callable, *args, **kwargs) -> Any:
        """Check fn(*args, **kwargs), then time it and record the result; returns its output."""
        return self._run(Workload(fn, args, kwargs))

    def pedantic(self, target: Callable, args: tuple = (), kwargs: Optional[dict] = None,
                 setup: Optional[Callable] = None, rounds: int = 1, warmup_rounds: int = 0,
                 iterations: int = 1) -> Any:
        """pytest-benchmark's pedantic mode, mapped onto the adaptive sampler.

        rounds: at least this many samples (sampling goes on to the precision target);
        warmup_rounds: at least this many warm-up rounds; iterations: calls averaged in one
        sample (cpu and event timers; a CUDA graph replay holds the calls it chooses);
        setup: called before every sample, untimed; if it returns (args, kwargs) they are the
        call's arguments. As in pytest-benchmark, setup excludes args/kwargs and iterations > 1.
        """
        if setup is not None and (args or kwargs):
            raise ValueError("bench.pedantic: give either setup (returning (args, kwargs)) or args/kwargs, not both")
        if setup is not None and iterations > 1:
            raise ValueError("bench.pedantic: setup runs before every call, so iterations must be 1")
        for name, value, least in (("rounds", rounds, 1), ("iterations", iterations, 1),
                                   ("warmup_rounds", warmup_rounds, 0)):
            if not isinstance(value, int) or value < least:
                raise ValueError(f"bench.pedantic: {name} must be an integer >= {least}, got {value!r}")
        work = Workload(target, tuple(args), dict(kwargs or {}), setup)
        return self._run(work, rounds=rounds, warmup_calls=warmup_rounds * iterations, calls_per_sample=iterations)

    def _run(self, work: Workload, rounds: int = 1, warmup_calls: int = 0, calls_per_sample: int = 1) -> Any:
        import torch

        work.prepare()
        if self.checked:
            with self.phases("check"), torch.inference_mode():
                out = work()
        else:
            out = self.check(work.fn, *work.args, **work.kwargs)
        settings, device = self.env.settings, self.env.device
        cfg = self.env.config
        device_type = device.type
        timer_name = pick(settings.timer, cfg.timer if cfg else None, timers.default_timer(device_type))
        cache = pick(settings.cache, cfg.cache if cfg else None, default_cache(device_type))
        work.resident = self.case.resident  # read into the cache after the flush when the cache is resident
        rule = StoppingRule(settings.target_rel, max(settings.min_samples, rounds),
                            max(settings.max_samples, rounds), settings.budget_s)
        monitor = device.monitor()
        warmer = device.clock_warmer(settings)
        probe = device.contention_probe() if settings.contention else None
        with torch.inference_mode():
            with self.phases("warmup"):
                warmup = warmer.before_case()
            with self.phases("devstate"):
                before = monitor.read()
                if probe is not None:
                    probe.start(contention.own_threads(device_type))
            try:
                with self.phases.told("sampling"):  # its warm-up, sampling and timed-call check: timed by the sampler
                    m = sampler.measure(work, device.torch, timer_name, cache, rule, warmup_s=settings.warmup_s,
                                       warmup_calls=max(sampler.WARMUP_CALLS, warmup_calls), cache_bytes=device.cache_bytes(),
                                       calls_per_sample=calls_per_sample, kernel_names=settings.kernel_names,
                                       check=functools.partial(self._check_timed, work))
            except timers.TimerError as exc:
                pytest.fail(f"timer {timer_name}: {exc}", pytrace=False)
            with self.phases("devstate"):
                seen = probe.stop() if probe is not None else {}
                after = monitor.read()
                warmer.after_case()
        for phase, seconds in m.phase_s.items():
            self.phases.add(phase, seconds)
        self.measurement = m
        if settings.trace_dir is not None:
            self._trace(work, timer_name, cache, m)
        with self.phases("record"):
            record = self._record(m, {**devstate.columns(before, after), **seen, **warmup})
            verdict = self.gate.judge(self.case, record)
            if verdict is not None:
                record["gate"] = verdict
        record.update(self._phase_columns())
        # Stashed before failing: a regressed measurement is still a valid row for the database.
        self.item.stash[RECORD_KEY] = record
        if record.gate_fails:
            pytest.fail(self.gate.failure_message(verdict), pytrace=False)
        return out

    def _phase_columns(self) -> dict:
        """Where this case's time went so far (measure/phases.py): the row's phase_* columns."""
        setup = self.item.stash.get(SETUP_KEY, None)
        ended = setup.unix_now() if setup is not None else time.time()
        return phases.columns(setup, self.item.stash.get(INPUTS_KEY, None), self.phases, ended)

    def _trace(self, work: Workload, timer_name: str, cache: str, m: sampler.Measurement) -> None:
        """--opperf-trace: a Chrome trace of the case's samples, after (and apart from) its measurement."""
        import torch

        path = self.env.settings.trace_dir / trace.file_name(self.item.nodeid)
        with torch.inference_mode():
            trace.write(work, self.env.device.torch, timer_name, cache, path, cache_bytes=self.env.device.cache_bytes(),
                        calls_per_sample=m.calls_per_sample,
                        info={"test_id": self.item.nodeid, "case": self.case.id, "time_us": m.stats.median})

    def _knobs(self) -> str:
        """The knobs the case ran with, as JSON: the config's, else those a tuned table gave the kernel."""
        knobs = dict(self.case.knobs) or (self.tuned[0] if self.tuned else {})
        return json.dumps(knobs, sort_keys=True) if knobs else ""

    def _extra_info(self) -> Optional[dict]:
        """extra_info as JSON data (it crosses to the controller and into a JSON column); None if empty."""
        try:
            return json.loads(json.dumps(self.extra_info, allow_nan=False)) or None
        except (TypeError, ValueError) as exc:
            pytest.fail(f"bench.extra_info must hold JSON data (str, int, float, bool, None, lists, dicts with str "
                        f"keys): {exc}", pytrace=False)

    def _tolerance(self) -> float:
        cfg = self.env.config
        if cfg and self.dtypes.output.name in cfg.tolerance:
            return cfg.tolerance[self.dtypes.output.name]
        return self.op.check_bound(self.case.param_dict, self.dtypes)

    def _record(self, m: sampler.Measurement, device_state: dict) -> Record:
        s = m.stats
        case, p = self.case, self.case.param_dict
        return Record.measured(case.op, p, self.op.defaults, {
            "dtype_in": case.dtype_in,
            "dtype_out": case.dtype_out,
            "backend": case.backend,
            "backend_version": installed_version(case.op, case.backend),
            "knobs": self._knobs(),
            "timer": m.timer,
            "cache": m.cache,
            "time_us": s.median,
            "time_us_mean": s.mean,
            "time_us_p95": s.p95,
            "time_us_std": s.std,
            "time_us_min": s.min,
            "cv": s.steady.cv,  # the steady state's spread; the outliers counted apart
            "outliers": s.outliers,
            "outlier_share": s.outlier_share,
            "outlier_us": s.outlier_us,
            "samples": s.n,
            "ci_rel": None if math.isinf(s.median_ci_rel) else s.median_ci_rel,
            "target_met": int(m.met),
            "median_drift": s.drift,
            "unstable": int(s.unstable),
            "flops": float(self.op.flops(p, self.dtypes)),
            "bytes": float(self.op.bytes(p, self.dtypes)),
            "peak_dtype": case.dtype_in,
            "peak_kind": self.op.peak,
            "kernels": m.kernels,  # None (NULL) where unknown: CPU, or --opperf-kernel-names=off
            "warmup_calls": m.warmup_calls,
            "calls_per_sample": m.calls_per_sample,
            "cache_flush": m.cache_flush,
            "first_call_ms": self.first_call_ms,
            "check_floor": self.check_floor,
            **device_state,
            "extra_info": self._extra_info(),
            "test_id": self.item.nodeid,
            "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds"),
            **self._samples(m),
            **self.env.run.placement,
            "tuned_table": self.tuned[1] if self.tuned and not case.knobs else None,
        })

    def _samples(self, m: sampler.Measurement) -> dict:
        """The samples, only where the pytest-benchmark export will compute its statistics of them."""
        return {SAMPLES_KEY: list(m.samples)} if self.env.settings.benchmark_json is not None else {}


def pick(option: str, from_config, default: str) -> str:
    """The command line (when not 'auto') wins over the config, which wins over the default."""
    if option != "auto":
        return option
    return from_config or default

