"""Timers: one strategy class each, chosen by name; and the sampling loop around them.

    cpu        host clock (perf_counter_ns) around each call, with a device synchronize
    event      device events around each call (torch.cuda.Event on CUDA, torch.Event on
               other accelerators: NPU, XPU, ... through torch's device-generic API)
    cuda_graph many calls captured in one CUDA graph, replayed and timed with events, divided
    profiler   kernel time from the profiler (CUPTI on CUDA): the sum of the kernels one call ran

Every timer returns samples in microseconds. "Cold" means a buffer at least twice the
last-level cache is overwritten before each sample, so the call reads its inputs from memory.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from .stats import Stats, StoppingRule

TIMERS: dict[str, type] = {}
CALL_RANGE = "opperf::call"


def timer(cls):
    TIMERS[cls.name] = cls
    return cls


def default_timer(device_type: str) -> str:
    return "cpu" if device_type == "cpu" else "event"


def default_cache(device_type: str) -> str:
    # On a CPU the flush costs more than most calls it would separate; accelerators run cold.
    return "hot" if device_type == "cpu" else "cold"


def synchronize(device_type: str) -> None:
    if device_type == "cpu":
        return
    import torch

    if device_type == "cuda":
        torch.cuda.synchronize()
    else:
        torch.accelerator.synchronize()


class Flusher:
    """Overwrites a buffer larger than the cache so the next call starts cold."""

    def __init__(self, device, cache_bytes: Optional[int]):
        import torch

        nbytes = max(2 * (cache_bytes or 0), 64 << 20)
        self.buffer = torch.empty(nbytes // 4, dtype=torch.int32, device=device)

    def __call__(self) -> None:
        self.buffer.zero_()


class Timer:
    name = ""
    min_batch = 1
    supports_cold = True

    def __init__(self, device, flush: Optional[Flusher]):
        self.device = device
        self.device_type = device.type
        self.flush = flush
        self.kernels: list[str] = []

    def sample(self, fn: Callable[[], object], n: int) -> list[float]:
        raise NotImplementedError


@timer
class CpuTimer(Timer):
    name = "cpu"

    def sample(self, fn, n):
        out = []
        for _ in range(n):
            if self.flush:
                self.flush()
                synchronize(self.device_type)
            t0 = time.perf_counter_ns()
            fn()
            synchronize(self.device_type)
            out.append((time.perf_counter_ns() - t0) / 1e3)
        return out


@timer
class EventTimer(Timer):
    name = "event"

    def _event(self):
        import torch

        if self.device_type == "cuda":
            return torch.cuda.Event(enable_timing=True)
        return torch.Event(device=self.device_type, enable_timing=True)

    def sample(self, fn, n):
        if self.device_type == "cpu":
            raise TimerError("the 'event' timer needs an accelerator; use 'cpu' on a CPU")
        pairs = [(self._event(), self._event()) for _ in range(n)]
        for start, end in pairs:
            if self.flush:
                self.flush()
            start.record()
            fn()
            end.record()
        synchronize(self.device_type)
        return [start.elapsed_time(end) * 1e3 for start, end in pairs]


@timer
class CudaGraphTimer(Timer):
    """Replays a graph of `reps` captured calls: launch gaps vanish; the cache stays hot."""

    name = "cuda_graph"
    supports_cold = False

    def __init__(self, device, flush):
        super().__init__(device, None)
        self.graph = None
        self.reps = 0

    def _capture(self, fn):
        import torch

        # Enough calls that one replay lasts about a millisecond, at least 10.
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        est = max(time.perf_counter() - t0, 1e-6)
        self.reps = int(min(100, max(10, 1e-3 / est)))
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()  # warm-up on the side stream, as capture requires
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(self.reps):
                fn()
        torch.cuda.synchronize()
        self.graph = graph

    def sample(self, fn, n):
        import torch

        if self.device_type != "cuda":
            raise TimerError("the 'cuda_graph' timer needs a CUDA device")
        if self.graph is None:
            self._capture(fn)
        pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
        for start, end in pairs:
            start.record()
            self.graph.replay()
            end.record()
        torch.cuda.synchronize()
        return [start.elapsed_time(end) * 1e3 / self.reps for start, end in pairs]


@timer
class ProfilerTimer(Timer):
    """Kernel time as the profiler records it: the device time of the kernels of each call."""

    name = "profiler"
    min_batch = 20  # starting the profiler costs far more than a call

    def sample(self, fn, n):
        from torch.profiler import ProfilerActivity, profile, record_function

        activity = {"cuda": ProfilerActivity.CUDA, "xpu": getattr(ProfilerActivity, "XPU", None)}.get(
            self.device_type, getattr(ProfilerActivity, "PrivateUse1", None))
        if self.device_type == "cpu" or activity is None:
            raise TimerError("the 'profiler' timer needs an accelerator the profiler can trace")
        with profile(activities=[ProfilerActivity.CPU, activity]) as prof:
            for _ in range(n):
                if self.flush:
                    self.flush()
                with record_function(CALL_RANGE):
                    fn()
            synchronize(self.device_type)
        events = prof.events()
        calls = [e for e in events if e.name == CALL_RANGE and _on_cpu(e)]
        if len(calls) != n:
            raise TimerError(f"the profiler recorded {len(calls)} calls of {n}")
        totals = [float(getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0.0)) for e in calls]
        names = [k for e in calls for k in _kernel_names(e)]
        if min(totals) <= 0:
            totals, names = _from_device_ranges(events, n)
        for name in names:
            if name not in self.kernels:
                self.kernels.append(name)
        return totals


def _on_cpu(event) -> bool:
    return str(getattr(event, "device_type", "CPU")).endswith("CPU")


def _from_device_ranges(events, n: int) -> tuple[list[float], list[str]]:
    """Kernel time per call from the device-side copy of each call range (its GPU interval)."""
    ranges = sorted((e.time_range.start, e.time_range.end) for e in events
                    if e.name == CALL_RANGE and not _on_cpu(e))
    kernels = [e for e in events if e.name != CALL_RANGE and not _on_cpu(e)]
    if len(ranges) != n:
        raise TimerError(f"the profiler recorded no kernels for the calls ({len(ranges)} device ranges of {n}): "
                         f"is the op running on the device?")
    totals, names = [], []
    for start, end in ranges:
        inside = [k for k in kernels if start <= k.time_range.start < end]
        totals.append(float(sum(k.time_range.end - k.time_range.start for k in inside)))
        names.extend(k.name for k in inside)
    if min(totals) <= 0:
        raise TimerError("the profiler recorded a call without kernels: is the op running on the device?")
    return totals, names


def _kernel_names(event) -> list[str]:
    names = [k.name for k in getattr(event, "kernels", [])]
    for child in getattr(event, "cpu_children", []):
        names.extend(_kernel_names(child))
    return names


class TimerError(RuntimeError):
    pass


@dataclass
class Measurement:
    timer: str
    cache: str
    stats: Stats
    met: bool  # the precision target was reached
    warmup_calls: int
    kernels: list = field(default_factory=list)


def measure(
    fn: Callable[[], object],
    device,
    timer_name: str,
    cache: str,
    rule: StoppingRule,
    warmup_s: float = 0.025,
    warmup_calls: int = 3,
    cache_bytes: Optional[int] = None,
) -> Measurement:
    """Warm up, then sample `fn` with the named timer until `rule` says stop."""
    cls = TIMERS[timer_name]
    if cache == "cold" and not cls.supports_cold:
        cache = "hot"  # a replayed graph re-reads what its previous call left in cache
    flush = Flusher(device, cache_bytes) if cache == "cold" else None
    tmr = cls(device, flush)

    calls, t0 = 0, time.perf_counter()
    while calls < warmup_calls or time.perf_counter() - t0 < warmup_s:
        fn()
        synchronize(device.type)
        calls += 1
        if calls >= 10_000:
            break
    per_call = (time.perf_counter() - t0) / calls
    # Batches of about 10 ms keep the stopping check cheap without overshooting the budget.
    batch = max(tmr.min_batch, min(200, int(0.01 / max(per_call, 1e-7))))

    samples: list[float] = []
    stats = None
    start = time.perf_counter()
    while not rule.done(stats, time.perf_counter() - start):
        want = batch if stats is None else max(1, min(batch, rule.max_samples - stats.n))
        samples.extend(tmr.sample(fn, max(want, tmr.min_batch)))
        stats = Stats(samples)
    return Measurement(timer_name, cache, stats, rule.met(stats), calls, list(tmr.kernels))
