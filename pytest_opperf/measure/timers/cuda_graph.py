"""The cuda_graph timer: calls captured in a CUDA graph, each replay timed with events.

Hot: a replay holds many calls and its time is divided by them, so the events' own overhead
vanishes; the launch gap between the captured calls remains. Cold: each captured call follows
a flush of the cache (inputs.Flusher) inside the graph, and the replays run under the profiler:
a call's time is from the end of the flush before it to the end of its last kernel (the graph's
gap to the call and between its kernels counted, as in a hot replay, where a call runs from the
end of the one before it), a sample their mean over one replay; the flush's kernels are told apart
by their place (a replay runs flush, call, flush, call, ...; how many kernels each runs is counted
once, eagerly). Not events captured around each call: the node after an event waits, so they
time more than the call. CUDA only, and only for calls a graph can capture (no host syncs, no CPU
tensors, no dynamic shapes).
"""

from __future__ import annotations

import math
import time
from typing import Optional

from pytest_opperf.measure import profiler_records as records
from pytest_opperf.measure.accelerator import hold_device
from pytest_opperf.measure.errors import TimerError
from pytest_opperf.measure.inputs import cache_flush
from pytest_opperf.measure.timers.base import Timer, timer

GRAPH_REPLAY_S = 1e-3  # one replay lasts about this long: event overhead below 0.5%
MAX_GRAPH_CALLS = 1000


@timer
class CudaGraphTimer(Timer):
    """Replays a graph of captured calls; each sample is one replay's time over its calls
    (cold: the summed times of its calls between their own events, over its calls)."""

    name = "cuda_graph"

    def __init__(self, work, device, cache, cache_bytes, calls_per_sample=1):
        # calls_per_sample is the timer's own choice here (calls per replay), set at capture.
        super().__init__(work, device, cache, cache_bytes)
        self.graph = None
        self.calls = 0
        self.pattern: Optional[tuple] = None  # cold: device events of one flush and of one call
        self.captured: Optional[tuple] = None  # (arguments, output) of the graph's last call

    @classmethod
    def unsupported(cls, device_type):
        return None if device_type == "cuda" else "the cuda_graph timer needs a CUDA device"

    def _capture(self) -> None:
        import torch

        self._refuse_unsupported()
        work = self.work
        if work.setup is not None:
            raise TimerError("a CUDA graph replays fixed inputs, so it cannot call a setup before each call; "
                             "use --opperf-timer=event (or a config's timer: event)")
        t0 = time.perf_counter()
        if self.flush:
            self.flush()
        work()
        torch.cuda.synchronize()
        per_call = max(time.perf_counter() - t0, 1e-6)
        self.calls = int(min(MAX_GRAPH_CALLS, max(1, math.ceil(GRAPH_REPLAY_S / per_call))))
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                work()  # warm-up on a side stream, as capture requires
        torch.cuda.current_stream().wait_stream(stream)
        if self.flush:
            self.pattern = (_device_events(self.flush), _device_events(work))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(self.calls):
                if self.flush:
                    self.flush()
                out = work()
            self.captured = (work.args, out)  # what a replay writes, read back by timed_call
        torch.cuda.synchronize()
        self.graph = graph
        self.calls_per_sample = self.calls

    @property
    def cache_flush(self) -> str:
        """Cold (and resident): a flush before every call of the graph (each between its own events),
        not once a sample."""
        return cache_flush(self.cache, 1)

    def sample(self, n):
        if self.graph is None:
            self._capture_or_explain()
        return self._cold_samples(n) if self.pattern else self._hot_samples(n)

    def _hot_samples(self, n: int) -> list[float]:
        import torch

        pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
        for start, end in pairs:
            hold_device(self.device_type)
            start.record()
            self.graph.replay()
            end.record()
        torch.cuda.synchronize()
        return [start.elapsed_time(end) * 1e3 / self.calls for start, end in pairs]

    def _cold_samples(self, n: int) -> list[float]:
        """A replay a sample: its calls' times (each from the end of its flush), over its calls."""
        import torch

        with records.profiling("cuda") as prof:
            for _ in range(n):
                self.graph.replay()
            torch.cuda.synchronize()
        return cold_call_times(records.device_events(records.recorded_events(prof, "cuda")), n, self.calls,
                               *self.pattern)

    def _capture_or_explain(self) -> None:
        try:
            self._capture()
        except TimerError:
            raise
        except Exception as exc:  # not capturable: host syncs, CPU tensors, dynamic shapes
            self.graph, self.pattern = None, None
            _heal_after_failed_capture(self.device)
            first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise TimerError(f"cannot capture the call in a CUDA graph ({type(exc).__name__}: {first_line}); "
                             f"use --opperf-timer=event") from None

    def timed_call(self):
        """A replay of the graph; the output is the tensor its last captured call returned,
        read after the replay: a call the graph did not capture leaves it stale."""
        import torch

        if self.graph is None:
            self.sample(1)
        self.graph.replay()
        torch.cuda.synchronize()
        return self.captured


def cold_call_times(ran: list, n: int, calls: int, flush: int, call: int) -> list[float]:
    """Per replay of N, the mean time (us) of its CALLS calls, from RAN (its device events in time
    order: FLUSH of a flush, then CALL of a call, CALLS times a replay): each call from the end of the
    flush before it to the end of its last event, as a hot replay's call runs from the end of the one
    before it. TimerError when the profiler recorded another number of events.

    >>> ev = lambda a, b: type("E", (), {"time_range": type("T", (), {"start": a, "end": b})})
    >>> cold_call_times([ev(0, 20), ev(21, 31), ev(31, 51), ev(53, 63)], 1, 2, 1, 1)
    [11.5]
    """
    each = flush + call
    if flush < 1 or len(ran) != n * calls * each:
        raise TimerError(f"the profiler recorded {len(ran)} device events in {n} graph replays of {calls} calls, "
                         f"where a flush runs {flush} and a call {call}: use --opperf-timer=profiler")
    out = []
    for r in range(n):
        at = [r * calls * each + i * each for i in range(calls)]
        out.append(sum(ran[k + each - 1].time_range.end - ran[k + flush - 1].time_range.end for k in at) / calls)
    return out


def _device_events(fn) -> int:
    """How many device events (kernels, copies, fills) one eager call of FN runs."""
    import torch

    with records.profiling("cuda") as prof:
        fn()
        torch.cuda.synchronize()
    return len(records.device_events(records.recorded_events(prof, "cuda")))


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
