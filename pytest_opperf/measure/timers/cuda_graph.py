"""The cuda_graph timer: calls captured in CUDA graphs, each replay timed with events.

A replay holds many calls and its time is divided by them, so the events' own overhead
vanishes; the launch gap between the captured calls remains. CUDA only, and only for calls a
graph can capture (no host syncs, no CPU tensors, no dynamic shapes).
"""

from __future__ import annotations

import math
import time
from typing import Optional

from pytest_opperf.measure.accelerator import hold_device
from pytest_opperf.measure.errors import TimerError
from pytest_opperf.measure.timers.base import Timer, timer

GRAPH_REPLAY_S = 1e-3  # one replay lasts about this long: event overhead below 0.5%
MAX_GRAPH_CALLS = 1000


@timer
class CudaGraphTimer(Timer):
    """Replays graphs of captured calls; each sample is one replay's time over its calls.

    Cold: the calls of all graphs together cycle through enough input copies to span twice
    the cache, and the graphs replay in turn, so each call's inputs were evicted since their
    last use. Hot: one graph of calls on the same inputs.
    """

    name = "cuda_graph"

    def __init__(self, work, device, cache, cache_bytes, calls_per_sample=1):
        # calls_per_sample is the timer's own choice here (calls per replay), set at capture.
        if cache == "cold" and not work.input_bytes:
            # A flush inside the graph would be timed with the call.
            raise TimerError("cold timing in a CUDA graph rotates copies of the inputs: pass them as "
                             "arguments (bench(fn, *inputs)), not inside a closure")
        super().__init__(work, device, cache, cache_bytes)
        self.graphs: list = []
        self.calls = 0
        self.captured: Optional[tuple] = None  # (arguments, output) of the first graph's last call

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
                for args in chunk[:-1]:
                    work.fn(*args, **work.kwargs)
                out = work.fn(*chunk[-1], **work.kwargs)
                if not self.graphs:
                    self.captured = (chunk[-1], out)  # what a replay writes, read back by timed_call
                del out  # the other graphs' outputs go back to the pool as before
            pool = graph.pool()
            self.graphs.append(graph)
        torch.cuda.synchronize()
        self.calls_per_sample = self.calls

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
            hold_device(self.device_type)
            start.record()
            graph.replay()
            end.record()
        torch.cuda.synchronize()
        return [start.elapsed_time(end) * 1e3 / self.calls for start, end in pairs]

    def timed_call(self):
        """A replay of the first graph; the output is the tensor its last captured call returned,
        read after the replay: a call the graph did not capture leaves it stale."""
        import torch

        if not self.graphs:
            self.sample(1)
        self.graphs[0].replay()
        torch.cuda.synchronize()
        return self.captured


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
