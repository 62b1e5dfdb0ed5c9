"""Timers: one strategy class each, chosen by name (--opperf-timer=NAME, `timer: NAME` in a config).

    cpu        host clock (perf_counter_ns) around each call, with a device synchronize
    event      device events around each call (torch.Event: CUDA, NPU, XPU, ... through
               torch's device-generic API); each call carries the events' launch overhead
    cuda_graph calls captured in CUDA graphs, each replay timed with events and divided by
               its calls: event overhead vanishes; the launch gap between calls remains
    profiler   kernel time from the profiler (CUPTI on CUDA): the sum of the kernels one call
               ran, with their names; the CUDA default

Every timer returns samples in microseconds: the time of one call. A sample may average
several calls (`calls_per_sample`: the calls in one graph replay, or pytest-benchmark's
`iterations`); the record says how many. Every timer calls on the same inputs for a cache
state (measure/inputs.py).

Accelerators other than CUDA (NPU through torch_npu, XPU, MTIA, HPU ...) need no code here:
the event timer, the flush and synchronize use torch's device-generic API (torch.Event,
torch.accelerator), and the profiler timer picks the device's profiler activity by name.

A timer of one's own: subclass Timer, give it a `name` and a `sample(n)`, decorate it with
@timer and import it from a conftest.py.
"""

from pytest_opperf.measure.errors import TimerError
from pytest_opperf.measure.timers.base import (TIMERS, TimedCall, Timer, default_timer, kernel_mismatch, registered,
                                               timer, unsupported)
# Each import registers its timer, in this order (TIMERS keeps it).
from pytest_opperf.measure.timers.cpu import CpuTimer
from pytest_opperf.measure.timers.event import EventTimer
from pytest_opperf.measure.timers.cuda_graph import CudaGraphTimer
from pytest_opperf.measure.timers.profiler import ProfilerTimer, start_profiler

__all__ = ["TIMERS", "CpuTimer", "CudaGraphTimer", "EventTimer", "ProfilerTimer", "TimedCall", "Timer", "TimerError",
           "default_timer", "kernel_mismatch", "registered", "start_profiler", "timer", "unsupported"]
