"""The profiler timer: kernel time as the profiler records it (CUPTI on CUDA), the CUDA default.

A sample is the summed device time of the kernels one call ran, read from the profiler's
records (measure/profiler_records.py), so neither launch gaps nor event overhead are in it;
the kernels' names come with it. Also here: paying the profiler's once-per-process start
before a sweep's first case (start_profiler).
"""

from __future__ import annotations

import time
from typing import Optional

from pytest_opperf.measure import profiler_records as records
from pytest_opperf.measure.accelerator import synchronize
from pytest_opperf.measure.timers.base import TimedCall, Timer, default_timer, timer


@timer
class ProfilerTimer(Timer):
    """Kernel time as the profiler records it: the device time of the kernels of each call."""

    name = "profiler"
    min_batch = 20  # starting the profiler costs far more than a call

    def __init__(self, work, device, cache, cache_bytes, calls_per_sample=1):
        # A sample is the kernels of one call: averaging several calls would add nothing.
        super().__init__(work, device, cache, cache_bytes, 1)
        self.checked_kernels: Optional[list[str]] = None

    @classmethod
    def unsupported(cls, device_type):
        if device_type == "cpu":
            return "the profiler timer needs an accelerator; use 'cpu' on a CPU"
        if records.profiler_activity(device_type) is None:
            return f"the profiler of this torch build cannot trace {device_type} kernels"
        return None

    def sample(self, n):
        from torch.profiler import record_function

        self._refuse_unsupported()
        first = self.checked_kernels is None
        with records.profiling(self.device_type) as prof:
            if first:
                # The plain call verify() compares the samples' kernels with: in this session, for free.
                with record_function(records.CHECKED_RANGE):
                    self.work()
                synchronize(self.device_type)
            for _ in range(n):
                self._prepare()
                with record_function(records.CALL_RANGE):
                    self.call()  # one call a sample: the kernels of that call are the sample
            synchronize(self.device_type)
        events = records.recorded_events(prof, self.device_type)
        if first:
            self.checked_kernels = records.range_kernels(events, records.CHECKED_RANGE)
        totals, names = records.kernel_times(events, n)
        for name in names:
            if name not in self.kernels:
                self.kernels.append(name)
        return totals

    def verify(self, trace):
        # The timed calls were profiled while sampling: their kernels are known already.
        return TimedCall(*self.timed_call(), self.checked_kernels, list(self.kernels))


def start_profiler(device_type: str, timer_name: str) -> Optional[float]:
    """Pay the profiler's once-per-process start before the first case, not inside its sampling.

    The first profiler session of a process sets up the device's tracing (CUPTI on CUDA), which
    takes seconds (1 to 4.4 s on an H100). Inside a case it would be charged to that case's sampling
    phase and eat its time budget. One empty-but-for-one-kernel session here pays it; the seconds
    it took are returned. None, and nothing done: another timer (timer_name, "auto" meaning the
    device's default), a device the profiler cannot trace, or a process that started it already.
    """
    timer_name = default_timer(device_type) if timer_name == "auto" else timer_name
    if (timer_name != ProfilerTimer.name or records.started(device_type)
            or ProfilerTimer.unsupported(device_type) is not None):
        return None
    import torch

    start = time.perf_counter()
    x = torch.ones(1, device=device_type)
    with records.profiling(device_type):  # the session marks device_type's profiler started
        x.add_(1)  # a kernel: the device's activity tracing starts as in a sampling session
        synchronize(device_type)
    return time.perf_counter() - start
