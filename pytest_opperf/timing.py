"""Timers: one strategy class each, chosen by name; and the sampling loop around them.

    cpu        host clock (perf_counter_ns) around each call, with a device synchronize
    event      device events around each call (torch.cuda.Event on CUDA, torch.Event on
               other accelerators: NPU, XPU, ... through torch's device-generic API)
    cuda_graph calls captured in CUDA graphs, each replay timed with events and divided by
               its calls: launch gaps and event overhead vanish, so small kernels read true
    profiler   kernel time from the profiler (CUPTI on CUDA): the sum of the kernels one call
               ran, with their names

Every timer returns samples in microseconds.

Cache state. "hot": calls run back to back on the same inputs. "cold": every call finds its
inputs out of the last-level cache. Every timer gets there the same way, by rotating through
copies of the inputs at least twice the cache apart: by the time a copy is read again, the
others have evicted it. One way for all, so a timer and the profiler that checks it time the
same cache state (a flush between calls leaves another one: measured on an H100, a 2^22-element
add read 14 us after a read flush, 17 us hot, 20 us in rotation). Only a closure, whose inputs
cannot be copied, is flushed between calls instead (not possible inside a CUDA graph).
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable, Optional

from .stats import Stats, StoppingRule

TIMERS: dict[str, type] = {}
CALL_RANGE = "opperf::call"
GRAPH_REPLAY_S = 1e-3  # one replay lasts about this long: event overhead below 0.5%
MAX_GRAPH_CALLS = 1000
MAX_INPUT_COPIES = 20_000


def timer(cls):
    TIMERS[cls.name] = cls
    return cls


def default_timer(device_type: str) -> str:
    """cpu on a CPU; profiler kernel time on CUDA; device events elsewhere.

    On CUDA the profiler is the only timer that reads kernel time for kernels of a few
    microseconds (graph replays add about 0.25 us of launch gap a call, events about 3 us),
    and its harness cost per case was the lowest measured (docs/benchmarks.md).
    """
    if device_type == "cpu":
        return "cpu"
    return "profiler" if device_type == "cuda" else "event"


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


class TimerError(RuntimeError):
    pass


@dataclass
class Workload:
    """What is timed: fn(*args, **kwargs), and the size of the inputs it reads."""

    fn: Callable
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)

    def __call__(self):
        return self.fn(*self.args, **self.kwargs)

    @property
    def input_bytes(self) -> int:
        return sum(a.numel() * a.element_size() for a in self.args if _is_tensor(a))

    def copies(self, n: int) -> list[tuple]:
        """n argument tuples with the tensors cloned (n = 1: the original arguments)."""
        sets = [self.args]
        for _ in range(n - 1):
            sets.append(tuple(a.clone() if _is_tensor(a) else a for a in self.args))
        return sets


def _is_tensor(x) -> bool:
    import torch

    return isinstance(x, torch.Tensor)


class Flusher:
    """Reads a buffer of twice the cache so the next call finds its inputs in memory, not in cache.

    A read, not a write: a written buffer leaves the cache full of dirty lines, and the timed
    call then pays for writing them back (measured on an H100: +20% on a 6 us add).
    """

    def __init__(self, device, cache_bytes: Optional[int]):
        import torch

        nbytes = max(2 * (cache_bytes or 0), 64 << 20)
        self.buffer = torch.ones(nbytes // 4, dtype=torch.int32, device=device)
        self.total = torch.empty((), dtype=torch.int64, device=device)

    def __call__(self) -> None:
        import torch

        torch.sum(self.buffer, dim=0, dtype=torch.int64, out=self.total)


class Timer:
    name = ""
    min_batch = 1

    def __init__(self, work: Workload, device, cache: str, cache_bytes: Optional[int]):
        self.work = work
        self.device = device
        self.device_type = device.type
        self.cache = cache
        self.kernels: list[str] = []
        # Cold: every timer rotates through the same input copies, so all timers (and the
        # profiler that checks them) see one cache state. A closure has no inputs to copy:
        # the per-call timers then flush between calls instead.
        self.flush = None
        self.arg_sets = [work.args]
        if cache == "cold":
            if work.input_bytes:
                self.arg_sets = work.copies(rotation_copies(work.input_bytes, cache_bytes))
            else:
                self.flush = Flusher(device, cache_bytes)
        self.turn = 0

    def call(self):
        """One call of the workload, on the next input set of the rotation."""
        args = self.arg_sets[self.turn % len(self.arg_sets)]
        self.turn += 1
        return self.work.fn(*args, **self.work.kwargs)

    def sample(self, n: int) -> list[float]:
        raise NotImplementedError


def rotation_copies(input_bytes: int, cache_bytes: Optional[int]) -> int:
    """Input sets to cycle through so a set's bytes were evicted before it is read again.

    Between two reads of one set, the others move at least twice the cache. An input set
    that alone spans twice the cache evicts itself: one set is enough.

    >>> rotation_copies(8 << 20, 50 << 20), rotation_copies(200 << 20, 50 << 20)
    (14, 1)
    """
    span = 2 * (cache_bytes or 0)
    if input_bytes >= span:
        return 1
    return int(min(MAX_INPUT_COPIES, math.ceil(span / input_bytes) + 1))


@timer
class CpuTimer(Timer):
    name = "cpu"

    def sample(self, n):
        out = []
        for _ in range(n):
            if self.flush:
                self.flush()
                synchronize(self.device_type)
            t0 = time.perf_counter_ns()
            self.call()
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

    def sample(self, n):
        if self.device_type == "cpu":
            raise TimerError("the 'event' timer needs an accelerator; use 'cpu' on a CPU")
        pairs = [(self._event(), self._event()) for _ in range(n)]
        for start, end in pairs:
            if self.flush:
                self.flush()
            start.record()
            self.call()
            end.record()
        synchronize(self.device_type)
        return [start.elapsed_time(end) * 1e3 for start, end in pairs]


@timer
class CudaGraphTimer(Timer):
    """Replays graphs of captured calls; each sample is one replay's time over its calls.

    Cold: the calls of all graphs together cycle through enough input copies to span twice
    the cache, and the graphs replay in turn, so each call's inputs were evicted since their
    last use. Hot: one graph of calls on the same inputs.
    """

    name = "cuda_graph"

    def __init__(self, work, device, cache, cache_bytes):
        if cache == "cold" and not work.input_bytes:
            # A flush inside the graph would be timed with the call.
            raise TimerError("cold timing in a CUDA graph rotates copies of the inputs: pass them as "
                             "arguments (bench(fn, *inputs)), not inside a closure")
        super().__init__(work, device, cache, cache_bytes)
        self.graphs: list = []
        self.calls = 0

    def _capture(self) -> None:
        import torch

        if self.device_type != "cuda":
            raise TimerError("the 'cuda_graph' timer needs a CUDA device")
        work = self.work
        t0 = time.perf_counter()
        work()
        torch.cuda.synchronize()
        per_call = max(time.perf_counter() - t0, 1e-6)
        self.calls = int(min(MAX_GRAPH_CALLS, max(1, math.ceil(GRAPH_REPLAY_S / per_call))))
        sets = self.arg_sets
        copies = len(sets)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for args in sets[:3]:
                work.fn(*args, **work.kwargs)  # warm-up on a side stream, as capture requires
        torch.cuda.current_stream().wait_stream(stream)
        pool = None
        order = [sets[i % copies] for i in range(max(copies, self.calls))]
        for start in range(0, len(order), self.calls):
            chunk = order[start:start + self.calls]
            if len(chunk) < self.calls:
                chunk += order[: self.calls - len(chunk)]
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                for args in chunk:
                    work.fn(*args, **work.kwargs)
            pool = graph.pool()
            self.graphs.append(graph)
        torch.cuda.synchronize()

    def sample(self, n):
        import torch

        if not self.graphs:
            try:
                self._capture()
            except TimerError:
                raise
            except Exception as exc:  # not capturable: host syncs, CPU tensors, dynamic shapes
                self.graphs = []
                _heal_after_failed_capture(self.device)
                first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                raise TimerError(f"cannot capture the call in a CUDA graph ({type(exc).__name__}: {first_line}); "
                                 f"use --opperf-timer=event") from None
        pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
        for start, end in pairs:
            graph = self.graphs[self.turn % len(self.graphs)]
            self.turn += 1
            start.record()
            graph.replay()
            end.record()
        torch.cuda.synchronize()
        return [start.elapsed_time(end) * 1e3 / self.calls for start, end in pairs]


def _heal_after_failed_capture(device) -> None:
    """A capture that failed leaves the CUDA generators marked as capturing, and every later
    random tensor fails ("Offset increment outside graph capture"). One capture that ends
    normally resets them, so the next case runs in a sound process."""
    import torch

    try:
        torch.cuda.synchronize(device)
    except Exception:
        pass  # the invalidated capture's own error, already reported
    graph = torch.cuda.CUDAGraph()
    x = torch.zeros(1, device=device)
    with torch.cuda.graph(graph):
        x.add_(1)
    torch.cuda.synchronize(device)


@timer
class ProfilerTimer(Timer):
    """Kernel time as the profiler records it: the device time of the kernels of each call."""

    name = "profiler"
    min_batch = 20  # starting the profiler costs far more than a call

    def sample(self, n):
        from torch.profiler import ProfilerActivity, profile, record_function

        activity = {"cuda": ProfilerActivity.CUDA, "xpu": getattr(ProfilerActivity, "XPU", None)}.get(
            self.device_type, getattr(ProfilerActivity, "PrivateUse1", None))
        if self.device_type == "cpu" or activity is None:
            raise TimerError("the 'profiler' timer needs an accelerator the profiler can trace")
        with warnings.catch_warnings():
            # torch warns that each profiling cycle clears the last one's events: that is the intent.
            warnings.filterwarnings("ignore", message=".*Profiler clears events.*")
            prof = profile(activities=[ProfilerActivity.CPU, activity])
            prof.__enter__()
        try:
            for _ in range(n):
                if self.flush:
                    self.flush()
                with record_function(CALL_RANGE):
                    self.call()
            synchronize(self.device_type)
        finally:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*Profiler clears events.*")
                prof.__exit__(None, None, None)
        totals, names = kernel_times(prof.events(), n)
        for name in names:
            if name not in self.kernels:
                self.kernels.append(name)
        return totals


def kernel_times(events, n: int) -> tuple[list[float], list[str]]:
    """Per call range: the summed device time of its kernels (us), and the kernels' names."""
    calls = [e for e in events if e.name == CALL_RANGE and _on_cpu(e)]
    if len(calls) != n:
        raise TimerError(f"the profiler recorded {len(calls)} calls of {n}")
    totals = [float(getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0.0)) for e in calls]
    names = [k for e in calls for k in _kernel_names(e)]
    if min(totals) > 0:
        return totals, names
    # Kernels not attributed to the CPU range: use the device-side copy of each range instead.
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


def _on_cpu(event) -> bool:
    return str(getattr(event, "device_type", "CPU")).endswith("CPU")


def _kernel_names(event) -> list[str]:
    names = [k.name for k in getattr(event, "kernels", [])]
    for child in getattr(event, "cpu_children", []):
        names.extend(_kernel_names(child))
    return names


@dataclass
class Measurement:
    timer: str
    cache: str
    stats: Stats
    met: bool  # the precision target was reached
    warmup_calls: int
    kernels: list = field(default_factory=list)
    samples: list = field(default_factory=list)  # microseconds, in the order taken
    wall_s: float = 0.0  # harness time: warm-up, capture and sampling


def measure(
    work: Workload,
    device,
    timer_name: str,
    cache: str,
    rule: StoppingRule,
    warmup_s: float = 0.01,
    warmup_calls: int = 3,
    cache_bytes: Optional[int] = None,
) -> Measurement:
    """Warm up, then sample `work` with the named timer until `rule` says stop."""
    if not isinstance(work, Workload):
        work = Workload(work)
    t_begin = time.perf_counter()
    calls = 0
    while calls < warmup_calls or time.perf_counter() - t_begin < warmup_s:
        work()
        synchronize(device.type)
        calls += 1
        if calls >= 10_000:
            break
    per_call = (time.perf_counter() - t_begin) / calls
    tmr = TIMERS[timer_name](work, device, cache, cache_bytes)
    # Batches of about 10 ms keep the stopping check cheap without overshooting the budget.
    if timer_name == "cuda_graph":
        per_call = GRAPH_REPLAY_S
    batch = max(tmr.min_batch, min(200, int(0.01 / max(per_call, 1e-7))))

    samples: list[float] = []
    stats = None
    start = time.perf_counter()
    while not rule.done(stats, time.perf_counter() - start):
        want = max(1, min(batch, rule.max_samples - len(samples)))
        samples.extend(tmr.sample(max(want, min(tmr.min_batch, rule.max_samples))))
        stats = Stats(samples)
    return Measurement(timer_name, cache, stats, rule.met(stats), calls, list(tmr.kernels), samples,
                       time.perf_counter() - t_begin)
