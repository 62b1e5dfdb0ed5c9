"""The sampling loop: warm up, sample with a timer in batches until the stopping rule says stop,
then check one timed call. measure() is what a case, the drift reference and the calibration
call; the timers (measure/timers/) only make samples.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from pytest_opperf.measure.accelerator import synchronize
from pytest_opperf.measure.errors import TimerError
from pytest_opperf.measure.inputs import Workload
from pytest_opperf.measure.stats import Stats, StoppingRule
from pytest_opperf.measure.timers import TIMERS, ProfilerTimer, Timer, kernel_mismatch
from pytest_opperf.measure.timers.cuda_graph import GRAPH_REPLAY_S

BATCH_S = 0.01  # the samples of one batch take about this long, where a call allows
MAX_BATCH = 200
MAX_WARMUP_CALLS = 10_000


@dataclass
class Measurement:
    """What measure() found, and how: the timer, cache state, warm-up and calls per sample."""

    timer: str
    cache: str
    stats: Stats
    met: bool  # the precision target was reached
    warmup_calls: int
    kernels: Optional[list] = None  # unique kernel names in call order; None: not known
    samples: list = field(default_factory=list)  # microseconds, in the order taken
    wall_s: float = 0.0  # harness time: warm-up, capture, sampling and kernel names
    calls_per_sample: int = 1  # calls averaged in one sample (graph replay, iterations)
    phase_s: dict = field(default_factory=dict)  # seconds of wall_s in warmup, sampling, verify
    cache_flush: str = ""  # how the cache was cleared before the timed calls (inputs.cache_flush)


def measure(
    work: Workload,
    device,
    timer_name: str,
    cache: str,
    rule: StoppingRule,
    warmup_s: float = 0.01,
    warmup_calls: int = 3,
    cache_bytes: Optional[int] = None,
    calls_per_sample: int = 1,
    kernel_names: bool = False,
    check: Optional[Callable[[tuple, Any], Optional[str]]] = None,
) -> Measurement:
    """Warm up, then sample `work` with the named timer until `rule` says stop; then check one
    timed call.

    Warm-up: at least `warmup_calls` calls and `warmup_s` seconds. Sampling goes in batches
    (batch_sizes: about 10 ms each), checking the rule between batches, and never past
    rule.max_samples.
    calls_per_sample averages that many back-to-back calls per sample (cpu and event timers;
    the graph timer picks its own). kernel_names: when the timer does not record kernel
    names itself, profile a plain call on an accelerator to learn them (in one session with
    the timed call below).

    After sampling, one more call goes through the timer's mechanism (timer.verify):
    check(its arguments, its output) returns why that output is wrong, or None; where both
    are known, its kernels must be those of a plain call on work's arguments. Either failing
    raises TimerError: what the samples timed was not the checked work.
    """
    if not isinstance(work, Workload):
        work = Workload(work)
    t_begin = time.perf_counter()
    calls = _warm_up(work, device.type, warmup_calls, warmup_s, t_begin)
    t_sampling = time.perf_counter()
    per_call = (t_sampling - t_begin) / calls
    tmr = TIMERS[timer_name](work, device, cache, cache_bytes, calls_per_sample)
    sample_s = GRAPH_REPLAY_S if timer_name == "cuda_graph" else per_call * tmr.calls_per_sample
    sample_s += _flush_seconds(tmr, device.type)  # a CPU's flush can cost milliseconds a sample
    samples, stats = _sample(tmr, rule, *batch_sizes(sample_s, tmr.min_batch, rule.min_samples))
    t_verify = time.perf_counter()
    kernels = _verified_kernels(tmr, device.type, kernel_names, check)
    t_end = time.perf_counter()
    phase_s = {"warmup": t_sampling - t_begin, "sampling": t_verify - t_sampling, "verify": t_end - t_verify}
    return Measurement(timer_name, cache, stats, rule.met(stats), calls, kernels, samples,
                       t_end - t_begin, tmr.calls_per_sample, phase_s, tmr.cache_flush)


def batch_sizes(sample_s: float, min_batch: int, min_samples: int) -> tuple[int, int]:
    """(samples a batch, samples in the first batch) for samples of about sample_s seconds.

    A batch lasts about BATCH_S, so the stopping rule is checked often without costing much,
    and holds at most MAX_BATCH samples; it holds at least the timer's min_batch (a profiler
    session costs more than a short call). The first batch of long calls stops at the rule's
    min_samples instead: a long kernel often meets the target there, and a first batch of
    min_batch would spend much of a short sweep's budget on that one case (a 34 ms attention
    kernel meets a 1% target in about 10 samples).

    >>> batch_sizes(3e-6, 20, 10), batch_sizes(1e-3, 20, 10), batch_sizes(0.034, 20, 10)
    ((200, 200), (20, 10), (20, 10))
    """
    fits = int(BATCH_S / max(sample_s, 1e-7))
    batch = max(min_batch, min(MAX_BATCH, fits))
    first = max(min(min_batch, min_samples), min(MAX_BATCH, fits))
    return batch, min(batch, first)


def _flush_seconds(tmr: Timer, device_type: str) -> float:
    """Wall seconds of one of the timer's cache flushes (0 when hot): the batches are sized with it."""
    if tmr.flush is None:
        return 0.0
    tmr.flush()  # the first read pays for faulting the buffer in
    synchronize(device_type)
    t0 = time.perf_counter()
    tmr.flush()
    synchronize(device_type)
    return time.perf_counter() - t0


def _warm_up(work: Workload, device_type: str, warmup_calls: int, warmup_s: float, t_begin: float) -> int:
    """Call `work` (after its setup) until warmup_calls calls and warmup_s seconds since t_begin
    are both done, or MAX_WARMUP_CALLS; returns the calls made."""
    calls = 0
    work.prepare()
    while calls < warmup_calls or time.perf_counter() - t_begin < warmup_s:
        work()
        synchronize(device_type)
        calls += 1
        if calls >= MAX_WARMUP_CALLS:
            break
    return calls


def _sample(tmr: Timer, rule: StoppingRule, batch: int, first: int) -> tuple[list[float], Optional[Stats]]:
    """The samples taken, a batch at a time, until the rule says stop, and their stats."""
    samples: list[float] = []
    stats = None
    start = time.perf_counter()
    while not rule.done(stats, time.perf_counter() - start):
        samples.extend(tmr.sample(min(first if stats is None else batch, rule.max_samples - len(samples))))
        stats = Stats(samples)
    return samples, stats


def _verified_kernels(tmr: Timer, device_type: str, kernel_names: bool,
                      check: Optional[Callable[[tuple, Any], Optional[str]]]) -> Optional[list]:
    """The kernels the samples ran (None: not known), once one timed call passed `check` and ran
    the kernels of a plain call; TimerError when it did not."""
    kernels = list(tmr.kernels) if tmr.kernels else None
    trace = kernel_names and kernels is None and ProfilerTimer.unsupported(device_type) is None
    if check is not None or trace or tmr.kernels:
        timed = tmr.verify(trace)
        problem = check(timed.args, timed.output) if check is not None else None
        problem = problem or kernel_mismatch(timed.checked_kernels, timed.kernels)
        if problem:
            raise TimerError(problem)
        kernels = kernels or timed.checked_kernels or None
    return kernels
