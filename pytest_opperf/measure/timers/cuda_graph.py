"""The cuda_graph timer: calls captured in a CUDA graph, each replay timed with events.

Hot: a replay holds many calls and its time is divided by them, so the events' own overhead
vanishes; the launch gap between the captured calls remains. Cold: each captured call follows
a flush of the cache (inputs.Flusher) inside the graph, and the replays run under the profiler:
a call's time is from the end of the flush before it to the end of its last kernel (the graph's
gap to the call and between its kernels counted, as in a hot replay, where a call runs from the
end of the one before it), a sample their mean over one replay; the flush's kernels are told apart
by their place (a replay runs flush, call, flush, call, ...; how many kernels each runs is counted
once, eagerly). Events captured around each call read 3% over its kernels on a bf16 4096^3 GEMM
(H200, 2026-11-29: 176-180 us for 171-175 us of kernel time; the node after an event waits), so
the cold graph read 1-4% over the profiler timer where its kernels agreed with it. CUDA only, and
only for calls a graph can capture (no host syncs, no CPU tensors, no dynamic shapes).
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
        ran = records.device_events(records.recorded_events(prof, "cuda"))
        flush, call = self.pattern
        each = flush + call
        if len(ran) != n * self.calls * each:
            raise TimerError(f"the profiler recorded {len(ran)} device events in {n} graph replays of {self.calls} "
                             f"calls, where a flush runs {flush} and a call {call}: use --opperf-timer=profiler")
        out = []
        for r in range(n):
            first = r * self.calls * each
            # a call's time: from the end of the flush before it to the end of its last kernel, as a hot
            # replay's call runs from the end of the call before it (the graph's gap to it counted once)
            ends = [(ran[first + i * each + flush - 1].time_range.end if flush else
                     ran[first + i * each].time_range.start, ran[first + i * each + each - 1].time_range.end)
                    for i in range(self.calls)]
            out.append(sum(end - start for start, end in ends) / self.calls)
        return out

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
