"""The sampling loop: warm up, sample with a timer in batches until the stopping rule says stop,
then check one timed call. measure() is what a case, the drift reference and the calibration
call; the timers (measure/timers/) only make samples.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from pytest_opperf.measure.accelerator import synchronize
from pytest_opperf.measure.errors import TimerError
from pytest_opperf.measure.inputs import Workload
from pytest_opperf.measure.stats import Stats, StoppingRule
from pytest_opperf.measure.timers import TIMERS, ProfilerTimer, Timer, kernel_mismatch
from pytest_opperf.measure.timers.cuda_graph import GRAPH_REPLAY_S

BATCH_S = 0.01  # the first batch's samples take about this long, where a call allows
MAX_BATCH = 2000  # samples in one batch at most (the profiler holds a batch's records in memory)
MARGIN = 1.15  # a later batch takes this much more than the samples the target is predicted to need
MAX_WARMUP_CALLS = 10_000
WARMUP_CALLS = 2  # warm-up calls at least, after the functional check's call: the kernel has run 3 times
STEADY = 0.05  # warm-up: two rounds whose per-call times agree this closely are steady
ROUND_S = 0.001  # a warm-up round lasts about this long (one call at least)
AUTO_WARMUP_S = 0.05  # an automatic warm-up stops here if its rounds never agree (after WARMUP_CALLS)


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
    warmup_s: Optional[float] = None,
    warmup_calls: int = WARMUP_CALLS,
    cache_bytes: Optional[int] = None,
    calls_per_sample: int = 1,
    kernel_names: bool = False,
    check: Optional[Callable[[tuple, Any], Optional[str]]] = None,
) -> Measurement:
    """Warm up, then sample `work` with the named timer until `rule` says stop; then check one
    timed call.

    Warm-up: at least `warmup_calls` calls, then until steady (warmup_s None: two rounds of
    calls of about a millisecond agree within STEADY, or AUTO_WARMUP_S passed) or until
    `warmup_s` seconds. Sampling goes in batches, checking the rule between batches: a short
    first one (batch_sizes), then as many samples as the median's interval so far says the
    target needs (next_batch), never past rule.max_samples.
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
    calls, per_call = _warm_up(work, device.type, warmup_calls, warmup_s, t_begin)
    t_sampling = time.perf_counter()
    tmr = TIMERS[timer_name](work, device, cache, cache_bytes, calls_per_sample)
    sample_s = GRAPH_REPLAY_S if timer_name == "cuda_graph" else per_call * tmr.calls_per_sample
    sample_s += _flush_seconds(tmr, device.type)  # a CPU's flush can cost milliseconds a sample
    samples, stats = _sample(tmr, rule, batch_sizes(sample_s, tmr.min_batch, rule.min_samples))
    t_verify = time.perf_counter()
    kernels = _verified_kernels(tmr, device.type, kernel_names, check)
    t_end = time.perf_counter()
    phase_s = {"warmup": t_sampling - t_begin, "sampling": t_verify - t_sampling, "verify": t_end - t_verify}
    return Measurement(timer_name, cache, stats, rule.met(stats), calls, kernels, samples,
                       t_end - t_begin, tmr.calls_per_sample, phase_s, tmr.cache_flush)


def batch_sizes(sample_s: float, min_batch: int, min_samples: int) -> int:
    """The samples of the first batch, for samples of about sample_s seconds.

    Short: the rule's min_samples, or the timer's min_batch where that is more (a profiler
    session costs more than a short call), at most what fits in BATCH_S but never under the
    smaller of the two. A stable kernel meets the target there; the later batches take what
    the first one says the target needs (next_batch).

    >>> batch_sizes(3e-6, 20, 10), batch_sizes(3e-4, 20, 10), batch_sizes(1e-3, 20, 10), batch_sizes(0.034, 20, 10)
    (20, 20, 10, 10)
    """
    fits = int(BATCH_S / max(sample_s, 1e-7))
    return min(max(min_batch, min_samples), max(min(min_batch, min_samples), fits))


def next_batch(stats: Stats, rule: StoppingRule, min_batch: int, sample_s: float, left_s: float) -> int:
    """The samples of the next batch: as many more as the median's interval so far says the target
    needs (its width narrows as 1/sqrt(n)), MARGIN over; at least min_batch, at most MAX_BATCH
    and what fits in the time budget left (sample_s: seconds a sample took in the last batch).

    >>> rule = StoppingRule(0.01, 10, 10_000, 1.0)
    >>> next_batch(Stats([100.0 + i % 7 for i in range(20)]), rule, 20, 1e-4, 0.9)  # half-width 1.9%: 4x the samples
    67
    >>> next_batch(Stats([100.0 + i % 7 for i in range(20)]), rule, 20, 0.02, 0.9)  # 45 samples left in the budget
    45
    """
    if stats.n < rule.min_samples:
        need = rule.min_samples - stats.n
    elif math.isinf(stats.median_ci_rel):
        need = stats.n
    else:
        need = math.ceil(stats.n * (stats.median_ci_rel / rule.target_rel) ** 2 * MARGIN) - stats.n
    fits = int(left_s / max(sample_s, 1e-9))
    return max(min_batch, min(need, MAX_BATCH, fits))


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


def _warm_up(work: Workload, device_type: str, warmup_calls: int, warmup_s: Optional[float],
             t_begin: float) -> tuple[int, float]:
    """Call `work` (after its setup) in rounds, each ended by a synchronisation, until warmup_calls
    calls are made and then warmup_s seconds have passed since t_begin, or, warmup_s None, until
    the last two rounds of about ROUND_S (or of one longer call each) agree within STEADY a call
    (AUTO_WARMUP_S at most); at most MAX_WARMUP_CALLS. Returns the calls made and the last
    round's seconds a call.

    What warms up is what a call's first runs pay once: lazy set-up, allocations, the caches'
    first fills, a library's choice of kernel. The device clock is the clock warmer's (clocks.py).
    A round never takes the calls past warmup_calls before it is reached, so an explicit count is
    kept exactly (pedantic's warmup_rounds).
    """
    calls, size, last = 0, 1, None
    work.prepare()
    while True:
        start = time.perf_counter()
        for _ in range(size):
            work()
        synchronize(device_type)
        now = time.perf_counter()
        calls += size
        per_call = (now - start) / size
        full = size > 1 or per_call >= ROUND_S / 2  # a round long enough to compare
        steady = full and last is not None and abs(per_call - last) <= STEADY * last
        last = per_call if full else None
        waited = now - t_begin
        if calls >= MAX_WARMUP_CALLS:
            break
        if calls >= warmup_calls:
            if warmup_s is not None and waited >= warmup_s:
                break
            if warmup_s is None and (steady or waited >= AUTO_WARMUP_S):
                break
        size = max(1, min(round(ROUND_S / max(per_call, 1e-9)), MAX_WARMUP_CALLS - calls))
        if calls < warmup_calls:
            size = min(size, warmup_calls - calls)
    return calls, per_call


def _sample(tmr: Timer, rule: StoppingRule, first: int) -> tuple[list[float], Optional[Stats]]:
    """The samples taken, a batch at a time (the first of `first` samples, then next_batch's),
    until the rule says stop, and their stats."""
    samples: list[float] = []
    stats = None
    start = time.perf_counter()
    size = first
    while not rule.done(stats, time.perf_counter() - start):
        size = min(size, rule.max_samples - len(samples))
        began = time.perf_counter()
        samples.extend(tmr.sample(size))
        now = time.perf_counter()
        stats = Stats(samples)
        size = next_batch(stats, rule, tmr.min_batch, (now - began) / size, rule.budget_s - (now - start))
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
