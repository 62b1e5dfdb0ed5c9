"""The timer protocol and the registry that picks a timer by name.

A timer is a Timer subclass with a `name` and a `sample(n)`, registered with @timer; the
registry is what --opperf-timer=NAME and a config's `timer: NAME` choose from. Each timer
module below this one registers its class on import.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Optional

from pytest_opperf.measure import profiler_records as records
from pytest_opperf.measure.accelerator import synchronize
from pytest_opperf.measure.errors import TimerError
from pytest_opperf.measure.inputs import Workload, cache_flush, flusher

TIMERS: dict[str, type] = {}


def timer(cls):
    """Register a Timer subclass under its `name` (--opperf-timer=NAME, `timer: NAME` in a config)."""
    TIMERS[cls.name] = cls
    return cls


@contextmanager
def registered(*classes) -> Iterator[None]:
    """The registry with `classes` added, for the block only.

    On leaving, the registry is as it was before: a timer registered inside the block (a test
    session's conftest.py with @timer) is dropped too, and a name the block took over is back.
    """
    before = dict(TIMERS)
    try:
        for cls in classes:
            timer(cls)
        yield
    finally:
        TIMERS.clear()
        TIMERS.update(before)


def unsupported(timer_name: str, device_type: str) -> Optional[str]:
    """Why the named timer cannot time on this device type, or None when it can.

    >>> unsupported("cuda_graph", "cpu")
    'the cuda_graph timer needs a CUDA device'
    """
    return TIMERS[timer_name].unsupported(device_type)


def default_timer(device_type: str) -> str:
    """cpu on a CPU; profiler kernel time on CUDA; device events elsewhere.

    On CUDA the profiler is the only timer that reads kernel time for kernels of a few
    microseconds (graph replays and events add launch overhead to each call), and its harness
    cost per case was the lowest measured on an H100 sweep of 1 us to 13 ms kernels.
    """
    if device_type == "cpu":
        return "cpu"
    return "profiler" if device_type == "cuda" else "event"


class Timer:
    """One timing strategy: sample(n) returns n samples of one call's time, in microseconds."""

    name = ""
    min_batch = 1

    def __init__(self, work: Workload, device, cache: str, cache_bytes: Optional[int], calls_per_sample: int = 1):
        self.work = work
        self.device = device
        self.device_type = device.type
        self.cache = cache
        self.kernels: list[str] = []
        self.calls_per_sample = calls_per_sample
        self.flush = flusher(device, cache, cache_bytes, work)

    @classmethod
    def unsupported(cls, device_type: str) -> Optional[str]:
        """Why this timer cannot time on device_type, or None."""
        return None

    def sample(self, n: int) -> list[float]:
        raise NotImplementedError

    @property
    def cache_flush(self) -> str:
        """How the cache was cleared before the timed calls (the row's cache_flush column)."""
        return cache_flush(self.cache, self.calls_per_sample)

    def call(self):
        """One call of the workload on its inputs (a timer that copies them picks the set here)."""
        return self.work.fn(*self._next_args(), **self.work.kwargs)

    def timed_call(self) -> tuple[tuple, Any]:
        """One more call made the way the samples made theirs: (its arguments, its output).

        The output is read after the device finished, so a caller can check what was timed.
        """
        self.work.prepare()
        args = self._next_args()
        out = self.work.fn(*args, **self.work.kwargs)
        synchronize(self.device_type)
        return args, out

    def verify(self, trace: bool) -> "TimedCall":
        """The timed call of timed_call(); with trace, profiled beside a plain call on the
        checked inputs, so the kernels of the two can be compared (one profiler session)."""
        if not trace:
            return TimedCall(*self.timed_call())
        from torch.profiler import record_function

        with records.profiling(self.device_type) as prof:
            with record_function(records.CHECKED_RANGE):
                self.work()
            synchronize(self.device_type)
            with record_function(records.TIMED_RANGE):
                args, out = self.timed_call()
        events = prof.events()
        timed = (records.range_kernels(events, records.TIMED_RANGE)
                 or records.kernels_after(events, records.TIMED_RANGE))
        return TimedCall(args, out, records.range_kernels(events, records.CHECKED_RANGE), timed)

    def _next_args(self) -> tuple:
        return self.work.args  # the live arguments: pedantic's setup may have replaced them

    def _calls(self) -> None:
        """The calls of one sample, after its untimed preparation (setup, flush). With several
        calls a sample, only the first finds the cache flushed: a flush between them would be timed."""
        for _ in range(self.calls_per_sample):
            self.call()

    def _prepare(self) -> None:
        self.work.prepare()
        if self.flush:
            self.flush()

    def _refuse_unsupported(self) -> None:
        reason = self.unsupported(self.device_type)
        if reason:
            raise TimerError(reason)


@dataclass
class TimedCall:
    """A call made by a timer's own mechanism, and the kernels it and a plain call ran (None: not known)."""

    args: tuple
    output: Any
    checked_kernels: Optional[list] = None  # a plain call on the checked inputs
    kernels: Optional[list] = None  # the timed call (for the profiler timer: its samples' calls)


def kernel_mismatch(checked: Optional[list], timed: Optional[list]) -> Optional[str]:
    """Why the timed call's kernels betray skipped work, or None (also when either is unknown).

    A kernel of the checked call that the timed call did not run is work the timer skipped (or
    replaced: misaligned copies can make a library pick another kernel). Kernels only the timed
    call ran are named alongside but do not fail alone: a graph replay may add its own (RNG
    state fills before the launch).

    >>> kernel_mismatch(["gemm", "splitk_reduce"], ["gemm"])
    "the timed call did not run kernels the checked call ran: missing ['splitk_reduce']"
    """
    if not checked or timed is None:
        return None  # no names (a CPU, a profiler without device activity): nothing to compare
    missing = [k for k in checked if k not in timed]
    if not missing:
        return None
    extra = [k for k in timed if k not in checked]
    return (f"the timed call did not run kernels the checked call ran: missing {missing}"
            + (f", ran instead {extra}" if extra else ""))
