"""Timers: one strategy class each, chosen by name; and the sampling loop around them.

    cpu        host clock (perf_counter_ns) around each call, with a device synchronize
    event      device events around each call (torch.Event: CUDA, NPU, XPU, ... through
               torch's device-generic API); about 3 us of launch overhead a call
    cuda_graph calls captured in CUDA graphs, each replay timed with events and divided by
               its calls: event overhead vanishes; 0.3-0.6 us a call of launch gap remains
    profiler   kernel time from the profiler (CUPTI on CUDA): the sum of the kernels one call
               ran, with their names; the CUDA default

Every timer returns samples in microseconds: the time of one call. A sample may average
several calls (`calls_per_sample`: the calls in one graph replay, or pytest-benchmark's
`iterations`); the record says how many.

Accelerators other than CUDA (NPU through torch_npu, XPU, MTIA, HPU ...) need no code here:
the event timer, the flush and synchronize use torch's device-generic API (torch.Event,
torch.accelerator), and the profiler timer picks the device's profiler activity by name.

Cache state. "hot": calls run back to back on the same inputs. "cold": every call finds its
inputs out of the last-level cache. Every timer gets there the same way, by rotating through
copies of the inputs at least twice the cache apart: by the time a copy is read again, the
others have evicted it. One way for all, so a timer and the profiler that checks it time the
same cache state (a flush between calls leaves another one: measured on an H100, a 2^22-element
add read 14 us after a read flush, 17 us hot, 20 us in rotation). Only inputs that cannot be
copied (a closure, pedantic's setup) are flushed between samples instead (a read of twice the
cache; not possible inside a CUDA graph).
"""

from __future__ import annotations

import bisect
import math
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from pytest_opperf.measure.stats import Stats, StoppingRule

TIMERS: dict[str, type] = {}
CACHES = ("cold", "hot")
CALL_RANGE = "opperf::call"
CHECKED_RANGE = "opperf::checked"  # a plain call on the checked inputs, for its kernels
TIMED_RANGE = "opperf::timed"  # one more call made the way the samples were
GRAPH_REPLAY_S = 1e-3  # one replay lasts about this long: event overhead below 0.5%
MAX_GRAPH_CALLS = 1000
MAX_INPUT_COPIES = 20_000
COPY_ALIGN_BYTES = 256  # cudaMalloc's alignment; cuBLASLt wants 16 for matrices and fp8 scales
FLUSH_MIN_BYTES = 64 << 20
BATCH_S = 0.01  # the samples of one batch take about this long, where a call allows
MAX_BATCH = 200


def timer(cls):
    """Register a Timer subclass under its `name` (--opperf-timer=NAME, `timer: NAME` in a config)."""
    TIMERS[cls.name] = cls
    return cls


def unsupported(timer_name: str, device_type: str) -> Optional[str]:
    """Why the named timer cannot time on this device type, or None when it can.

    >>> unsupported("cuda_graph", "cpu")
    'the cuda_graph timer needs a CUDA device'
    """
    return TIMERS[timer_name].unsupported(device_type)


def default_timer(device_type: str) -> str:
    """cpu on a CPU; profiler kernel time on CUDA; device events elsewhere.

    On CUDA the profiler is the only timer that reads kernel time for kernels of a few
    microseconds (graph replays add 0.3-0.6 us a call, events about 3 us: docs/benchmarks.md),
    and its harness cost per case was the lowest measured (docs/benchmarks.md).
    """
    if device_type == "cpu":
        return "cpu"
    return "profiler" if device_type == "cuda" else "event"


def default_cache(device_type: str) -> str:
    # On a CPU an op mostly reads what the op before it just wrote; accelerators run cold.
    return "hot" if device_type == "cpu" else "cold"


def synchronize(device_type: str) -> None:
    """Wait for the current accelerator's queued work (nothing to wait for on a CPU)."""
    if device_type == "cpu":
        return
    import torch

    torch.accelerator.synchronize()


class TimerError(RuntimeError):
    pass


@dataclass
class Workload:
    """What is timed: fn(*args, **kwargs), and the size of the inputs it reads.

    With `setup` (pytest-benchmark's pedantic convention), prepare() calls it before each
    timed call, untimed; when it returns (args, kwargs) they replace the arguments.
    """

    fn: Callable
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    setup: Optional[Callable] = None

    def __call__(self):
        return self.fn(*self.args, **self.kwargs)

    def prepare(self) -> None:
        if self.setup is None:
            return
        fresh = self.setup()
        if fresh is not None:
            self.args, self.kwargs = tuple(fresh[0]), dict(fresh[1] or {})

    @property
    def input_bytes(self) -> int:
        return sum(a.numel() * a.element_size() for a in self.args if _is_tensor(a))

    def copies(self, n: int) -> list[tuple]:
        """n argument tuples with the tensors copied (n = 1: the original arguments).

        The copies of a tensor are views into one block, made by one copy kernel: cold
        timing of a small input may want thousands of them, and a clone each would cost a
        launch each. A view has the original's shape and strides (a transposed operand stays
        transposed), and starts COPY_ALIGN_BYTES-aligned in the block, as a tensor of its own would.
        """
        columns = [_replicas(a, n - 1) if _is_tensor(a) else [a] * (n - 1) for a in self.args]
        return [self.args, *zip(*columns)] if n > 1 else [self.args]


def _replicas(t, n: int) -> list:
    """n copies of tensor t with its strides, in one allocation and one copy.

    Each copy's slot is rounded up to COPY_ALIGN_BYTES: packed back to back, the copies of a
    4-byte scale would start at 4-byte offsets, which cuBLASLt refuses (CUBLAS_STATUS_NOT_SUPPORTED
    for fp8 scales) and vectorised kernels take slow paths on. The padding is under 256 bytes a
    copy and is not counted as input bytes (it is never read).
    """
    if n <= 0:
        return []
    if not _is_dense(t):
        return [t.clone() for _ in range(n)]  # overlapping or gapped: one clone each, as before
    unit = max(COPY_ALIGN_BYTES // t.element_size(), 1)  # elements in one aligned unit
    slot = -(-t.numel() // unit) * unit
    block = t.new_empty_strided((n, *t.shape), (slot, *t.stride()))
    block.copy_(t.unsqueeze(0).expand(n, *t.shape))
    return list(block.unbind(0))


def _is_dense(t) -> bool:
    """t's elements fill t.numel() consecutive slots, its dimensions in some order (contiguous,
    transposed, permuted): sorted by stride, each stride is the product of the sizes below it."""
    expected = 1
    for stride, size in sorted((st, size) for size, st in zip(t.shape, t.stride()) if size > 1):
        if stride != expected:
            return False
        expected *= size
    return t.numel() > 0


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

        nbytes = max(2 * (cache_bytes or 0), FLUSH_MIN_BYTES)
        self.buffer = torch.ones(nbytes // 4, dtype=torch.int32, device=device)
        self.total = torch.empty((), dtype=torch.int64, device=device)

    def __call__(self) -> None:
        import torch

        torch.sum(self.buffer, dim=0, dtype=torch.int64, out=self.total)


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
        # Cold: every timer rotates through the same input copies, so all timers (and the
        # profiler that checks them) see one cache state. Inputs that cannot be copied (a
        # closure, or pedantic's setup making fresh ones) are flushed between samples instead.
        self.flush = None
        self.arg_sets = [work.args]
        if cache == "cold":
            if work.input_bytes and work.setup is None:
                self.arg_sets = work.copies(rotation_copies(work.input_bytes, cache_bytes))
            else:
                self.flush = Flusher(device, cache_bytes)
        self.turn = 0

    @classmethod
    def unsupported(cls, device_type: str) -> Optional[str]:
        """Why this timer cannot time on device_type, or None."""
        return None

    def _next_args(self) -> tuple:
        if len(self.arg_sets) == 1:
            return self.work.args  # the live arguments: pedantic's setup may have replaced them
        args = self.arg_sets[self.turn % len(self.arg_sets)]
        self.turn += 1
        return args

    def call(self):
        """One call of the workload, on the next input set of the rotation."""
        return self.work.fn(*self._next_args(), **self.work.kwargs)

    def sample(self, n: int) -> list[float]:
        raise NotImplementedError

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

        with _profiling(self.device_type) as prof:
            with record_function(CHECKED_RANGE):
                self.work()
            synchronize(self.device_type)
            with record_function(TIMED_RANGE):
                args, out = self.timed_call()
        events = prof.events()
        timed = range_kernels(events, TIMED_RANGE) or _kernels_after(events, TIMED_RANGE)
        return TimedCall(args, out, range_kernels(events, CHECKED_RANGE), timed)

    def _calls(self) -> None:
        """The calls of one sample, after its untimed preparation (setup, flush)."""
        for _ in range(self.calls_per_sample):
            self.call()

    def _prepare(self) -> None:
        self.work.prepare()
        if self.flush:
            self.flush()


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


def cold_extra_bytes(cache_bytes: Optional[int]) -> int:
    """The most device memory cold timing adds to a case: the rotated input copies move
    ceil(2 * cache / inputs) sets, under 2 * cache plus one set, and a set is rotated only
    while smaller than 2 * cache: under 4 * cache (plus each copy's alignment padding, under
    256 bytes a tensor, at most 5 MB a tensor at MAX_INPUT_COPIES). A flush buffer is smaller."""
    return max(4 * (cache_bytes or 0), FLUSH_MIN_BYTES)


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
        out, k = [], self.calls_per_sample
        for _ in range(n):
            self._prepare()
            synchronize(self.device_type)
            t0 = time.perf_counter_ns()
            self._calls()
            synchronize(self.device_type)
            out.append((time.perf_counter_ns() - t0) / 1e3 / k)
        return out


@timer
class EventTimer(Timer):
    name = "event"

    @classmethod
    def unsupported(cls, device_type):
        return "the event timer needs an accelerator; use 'cpu' on a CPU" if device_type == "cpu" else None

    def _event(self):
        import torch

        # torch.Event is the device-generic event (CUDA, XPU, NPU, ...): one code path for all.
        return torch.Event(device=self.device, enable_timing=True)

    def sample(self, n):
        _refuse(self, self.device_type)
        pairs = [(self._event(), self._event()) for _ in range(n)]
        for start, end in pairs:
            self._prepare()
            hold_device(self.device_type)
            start.record()
            self._calls()
            end.record()
        synchronize(self.device_type)
        return [start.elapsed_time(end) * 1e3 / self.calls_per_sample for start, end in pairs]


HOLD_CYCLES = 200_000  # ~100 us at 2 GHz: longer than the host needs to queue one sample


def hold_device(device_type: str) -> None:
    """Keep the device busy while the host queues the next sample (CUDA only).

    Between a start event and the call it times, the device otherwise waits for the host to
    launch the call: microseconds that are host time, not the kernel's (more after profiler
    sessions in the same process, which add host work to every launch). A spin kernel queued
    first runs while the host queues start event, call(s) and end event behind it, so they
    then run back to back. Other accelerators have no spin kernel in torch's generic API:
    their samples keep the launch gap.
    """
    if device_type == "cuda":
        import torch

        torch.cuda._sleep(HOLD_CYCLES)


def _refuse(tmr: Timer, device_type: str) -> None:
    reason = tmr.unsupported(device_type)
    if reason:
        raise TimerError(reason)


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

        _refuse(self, self.device_type)
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
        if profiler_activity(device_type) is None:
            return f"the profiler of this torch build cannot trace {device_type} kernels"
        return None

    def sample(self, n):
        from torch.profiler import record_function

        _refuse(self, self.device_type)
        first = self.checked_kernels is None
        with _profiling(self.device_type) as prof:
            if first:
                # The plain call verify() compares the samples' kernels with: in this session, for free.
                with record_function(CHECKED_RANGE):
                    self.work()
                synchronize(self.device_type)
            for _ in range(n):
                self._prepare()
                with record_function(CALL_RANGE):
                    self.call()  # one call a sample: the kernels of that call are the sample
            synchronize(self.device_type)
        events = recorded_events(prof, self.device_type)
        if first:
            self.checked_kernels = range_kernels(events, CHECKED_RANGE)
        totals, names = kernel_times(events, n)
        for name in names:
            if name not in self.kernels:
                self.kernels.append(name)
        return totals

    def verify(self, trace):
        # The timed calls were profiled while sampling: their kernels are known already.
        return TimedCall(*self.timed_call(), self.checked_kernels, list(self.kernels))


@contextmanager
def _profiling(device_type: str):
    """One torch.profiler session tracing the host and device_type's kernels."""
    from torch.profiler import ProfilerActivity, profile

    with warnings.catch_warnings():
        # torch warns that each profiling cycle clears the last one's events: that is the intent.
        warnings.filterwarnings("ignore", message=".*Profiler clears events.*")
        prof = profile(activities=[ProfilerActivity.CPU, profiler_activity(device_type)])
        prof.__enter__()
    try:
        yield prof
    finally:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*Profiler clears events.*")
            prof.__exit__(None, None, None)
        _PROFILER_STARTED.add(device_type)


_PROFILER_STARTED: set = set()  # device types whose profiler this process has started


def start_profiler(device_type: str, timer_name: str) -> Optional[float]:
    """Pay the profiler's once-per-process start before the first case, not inside its sampling.

    The first profiler session of a process sets up the device's tracing (CUPTI on CUDA): 1.0 to
    1.6 s on an H100, 4.4 s where torch's modules had no bytecode cache (docs/benchmarks.md).
    Inside a case it would be charged to that case's sampling phase and eat its time budget.
    One empty-but-for-one-kernel session here pays it; the seconds it took are returned. None,
    and nothing done: another timer (timer_name, "auto" meaning the device's default), a device
    the profiler cannot trace, or a process that started it already.
    """
    timer_name = default_timer(device_type) if timer_name == "auto" else timer_name
    if (timer_name != ProfilerTimer.name or device_type in _PROFILER_STARTED
            or ProfilerTimer.unsupported(device_type) is not None):
        return None
    import torch

    start = time.perf_counter()
    x = torch.ones(1, device=device_type)
    with _profiling(device_type):
        x.add_(1)  # a kernel: the device's activity tracing starts as in a sampling session
        synchronize(device_type)
    _PROFILER_STARTED.add(device_type)
    return time.perf_counter() - start


def recorded_events(prof, device_type: str) -> list:
    """The events of a finished profiler session that kernel_times and range_kernels read, built
    straight from the profiler's raw records on CUDA; prof.events() elsewhere (torch's parser
    gives other accelerators' legacy device times that the raw records lack) and where torch
    keeps no raw records.

    prof.events() builds torch's whole event tree in Python: 28-31 us an event on a two-core CPU
    VM, against 4-5 us for this reader (a session of 200 profiled adds, 400 records). On an H100
    the default sweep's sampling phase took 2.3x less time with this reader (docs/benchmarks.md).
    This reads the same records once and keeps what the timer needs: our own host-side ranges,
    each carrying the device events (kernels, copies, fills) launched under it in launch order,
    and every device-side event. It attributes a device event the way torch does: to the host
    op whose correlation id it links to, and through it to the range holding that op (same
    thread, the op starting inside the range; our ranges do not nest). Durations are computed
    from the same nanosecond stamps, so the totals equal torch's (a GPU test compares them).
    """
    profiler = getattr(prof, "profiler", None)
    results = getattr(profiler, "kineto_results", None)
    if device_type != "cuda" or results is None or not hasattr(results, "trace_start_ns"):
        return prof.events()
    import torch
    from torch.autograd import DeviceType

    names: dict[str, str] = {}

    def name_of(e) -> str:  # demangled, as torch's parser names events
        raw = e.name()
        if raw not in names:
            names[raw] = torch._C._demangle(raw) if len(raw) > 1 else raw
        return names[raw]

    own = (CALL_RANGE, CHECKED_RANGE, TIMED_RANGE)
    attributed = (DeviceType.CUDA, DeviceType.PrivateUse1, DeviceType.XPU)  # as torch's parser
    t0 = results.trace_start_ns()
    launchers: dict[int, tuple[int, int]] = {}  # host op's correlation id -> (thread, start ns)
    ranges: list[tuple[int, int, int, _Record]] = []  # (thread, start ns, end ns, record)
    linked: list[tuple[int, _Record]] = []
    events: list = []
    kinds: dict = {}  # DeviceType -> its name as torch's parser writes it
    records = results.events()
    skip_hidden = bool(records) and hasattr(records[0], "is_hidden_event")  # torch < 2.4 has none
    # Each call on a record crosses into C++: a host record is read only as far as it matters.
    for e in records:
        if skip_hidden and e.is_hidden_event():
            continue
        kind = e.device_type()
        if kind == DeviceType.CPU:
            thread = e.start_thread_id()
            if e.is_async() or thread != e.end_thread_id():
                continue
            start = e.start_ns()
            if e.linked_correlation_id() == 0:
                launchers[e.correlation_id()] = (thread, start)
            name = e.name()
            if name in own:
                end = e.end_ns()
                record = _Record(name, "DeviceType.CPU", _Span((start - t0) / 1000, (end - t0) / 1000))
                ranges.append((thread, start, end, record))
                events.append(record)
            continue
        start, end = e.start_ns(), e.end_ns()
        label = kinds.get(kind) or kinds.setdefault(kind, str(kind))
        record = _Record(name_of(e), label, _Span((start - t0) / 1000, (end - t0) / 1000))
        events.append(record)
        if kind in attributed:
            correlation = e.linked_correlation_id()
            if correlation > 0:
                linked.append((correlation, record))
    ranges.sort(key=lambda r: r[1])
    starts = [r[1] for r in ranges]
    linked.sort(key=lambda pair: pair[1].time_range.start)  # a range's kernels in launch order
    for correlation, record in linked:
        launcher = launchers.get(correlation)
        if launcher is None:
            continue
        thread, at = launcher
        i = bisect.bisect_right(starts, at) - 1
        if i >= 0 and ranges[i][0] == thread and at <= ranges[i][2]:
            owner = ranges[i][3]
            owner.kernels.append(record)
            owner.device_time_total += record.time_range.end - record.time_range.start
    return events


@dataclass
class _Span:
    start: float  # us from the trace's start
    end: float


@dataclass
class _Record:
    """An event as kernel_times and range_kernels read it (torch's FunctionEvent has the same
    attributes): a host range holds the device events launched under it in `kernels`."""

    name: str
    device_type: str
    time_range: _Span
    kernels: list = field(default_factory=list)
    cpu_children: list = field(default_factory=list)
    device_time_total: float = 0.0


def profiler_activity(device_type: str):
    """The torch.profiler activity that traces device_type's kernels, or None.

    The activities are named after device types (CUDA also covers ROCm, whose device type is
    'cuda'; XPU, MTIA, HPU); an out-of-tree backend such as torch_npu is PrivateUse1 under
    the name it registered. None when this torch build cannot trace it.
    """
    import torch
    from torch.profiler import ProfilerActivity

    activity = getattr(ProfilerActivity, device_type.upper(), None)
    if activity is None and device_type == torch._C._get_privateuse1_backend_name():
        activity = ProfilerActivity.PrivateUse1
    if activity is None or activity == ProfilerActivity.CPU or activity not in torch.profiler.supported_activities():
        return None
    return activity


def profiled_kernel_names(work: Workload, device) -> Optional[list[str]]:
    """The kernels one profiled call of `work` runs, unique, in call order; None if unknown.

    Used after timing with another timer: one call under the profiler tells which library
    kernels ran. A device the profiler cannot trace, or a call without kernels, gives None.
    """
    if ProfilerTimer.unsupported(device.type):
        return None
    tmr = ProfilerTimer(work, device, "hot", None)
    try:
        tmr.sample(1)
    except TimerError:
        return None
    return tmr.kernels


def kernel_times(events, n: int) -> tuple[list[float], list[str]]:
    """Per call range: the summed device time of its kernels (us), and the kernels' names.

    Two views of a call's kernels: those the profiler attributes to the host-side range (through
    the launch's correlation id), and those running inside the range's device-side copy. Kernels
    launched through the driver API (Triton's launcher) may miss the first: a call of a torch fill
    and two Triton kernels was attributed the fill alone. Where the device ranges exist, the view
    that saw more device time is taken per call.
    """
    calls = [e for e in events if e.name == CALL_RANGE and _on_cpu(e)]
    if len(calls) != n:
        raise TimerError(f"the profiler recorded {len(calls)} calls of {n}")
    totals = [_device_time_total(e) for e in calls]
    names = [_kernel_names(e) for e in calls]
    ranges = _device_ranges(events, CALL_RANGE)
    if len(ranges) == n:
        kernels = _device_kernels(events)
        starts = [k.time_range.start for k in kernels]
        for i, (start, end) in enumerate(ranges):
            inside = _inside(kernels, start, end, starts)
            ranged = float(sum(k.time_range.end - k.time_range.start for k in inside))
            if ranged > totals[i]:
                totals[i], names[i] = ranged, [k.name for k in inside]
    elif min(totals) <= 0:
        raise TimerError(f"the profiler recorded no kernels for the calls ({len(ranges)} device ranges of {n}): "
                         f"is the op running on the device?")
    if min(totals) <= 0:
        raise TimerError("the profiler recorded a call without kernels: is the op running on the device?")
    return totals, [k for call in names for k in call]


def _device_time_total(event) -> float:
    # device_time_total where torch has it; cuda_time_total (deprecated since) only on older builds
    if hasattr(event, "device_time_total"):
        return float(event.device_time_total or 0.0)
    return float(getattr(event, "cuda_time_total", 0.0) or 0.0)


def range_kernels(events, name: str) -> list[str]:
    """The unique kernel names under the profiler range `name`, in launch order; [] when none
    were recorded (attributed to the CPU-side range, else found inside its device-side copy)."""
    names = [k for e in events if e.name == name and _on_cpu(e) for k in _kernel_names(e)]
    if not names:
        kernels = _device_kernels(events)
        names = [k.name for start, end in _device_ranges(events, name) for k in _inside(kernels, start, end)]
    return list(dict.fromkeys(names))


def _kernels_after(events, name: str) -> list[str]:
    """The unique names of the device kernels that started after the host entered range `name`.

    For the last range of a session whose earlier work was synchronized: the kernels a graph
    replay launches are tied to its cudaGraphLaunch, which not every profiler build attributes
    to the range around it; their start times still place them.
    """
    starts = [e.time_range.start for e in events if e.name == name and _on_cpu(e)]
    if not starts:
        return []
    return list(dict.fromkeys(k.name for k in _device_kernels(events) if k.time_range.start >= min(starts)))


def _device_ranges(events, name: str) -> list[tuple]:
    return sorted((e.time_range.start, e.time_range.end) for e in events if e.name == name and not _on_cpu(e))


def _device_kernels(events) -> list:
    """Device-side events other than this module's own ranges, by start time."""
    own = (CALL_RANGE, CHECKED_RANGE, TIMED_RANGE)
    return sorted((e for e in events if e.name not in own and not _on_cpu(e)), key=lambda k: k.time_range.start)


def _inside(kernels: list, start, end, starts: Optional[list] = None) -> list:
    """The kernels (sorted by start) that start in [start, end); starts: their start times, where
    the caller has them (a batch asks once a call: a scan each would cost n x kernels)."""
    starts = [k.time_range.start for k in kernels] if starts is None else starts
    return kernels[bisect.bisect_left(starts, start):bisect.bisect_left(starts, end)]


def _on_cpu(event) -> bool:
    return str(getattr(event, "device_type", "CPU")).endswith("CPU")


def _kernel_names(event) -> list[str]:
    """The kernels launched under a CPU-side event, its own first, then its children's in order."""
    names = [k.name for k in getattr(event, "kernels", [])]
    for child in getattr(event, "cpu_children", []):
        names.extend(_kernel_names(child))
    return names


def batch_sizes(sample_s: float, min_batch: int, min_samples: int) -> tuple[int, int]:
    """(samples a batch, samples in the first batch) for samples of about sample_s seconds.

    A batch lasts about BATCH_S, so the stopping rule is checked often without costing much,
    and holds at most MAX_BATCH samples; it holds at least the timer's min_batch (a profiler
    session costs more than a short call). The first batch of long calls stops at the rule's
    min_samples instead: where 10 samples of a 34 ms kernel meet the target, a first batch of
    20 spent 0.7 s of an H100 sweep's 1 s budget on one case (docs/benchmarks.md).

    >>> batch_sizes(3e-6, 20, 10), batch_sizes(1e-3, 20, 10), batch_sizes(0.034, 20, 10)
    ((200, 200), (20, 10), (20, 10))
    """
    fits = int(BATCH_S / max(sample_s, 1e-7))
    batch = max(min_batch, min(MAX_BATCH, fits))
    first = max(min(min_batch, min_samples), min(MAX_BATCH, fits))
    return batch, min(batch, first)


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
    calls = 0
    work.prepare()
    while calls < warmup_calls or time.perf_counter() - t_begin < warmup_s:
        work()
        synchronize(device.type)
        calls += 1
        if calls >= 10_000:
            break
    t_sampling = time.perf_counter()
    per_call = (t_sampling - t_begin) / calls
    tmr = TIMERS[timer_name](work, device, cache, cache_bytes, calls_per_sample)
    sample_s = GRAPH_REPLAY_S if timer_name == "cuda_graph" else per_call * tmr.calls_per_sample
    batch, first = batch_sizes(sample_s, tmr.min_batch, rule.min_samples)

    samples: list[float] = []
    stats = None
    start = time.perf_counter()
    while not rule.done(stats, time.perf_counter() - start):
        samples.extend(tmr.sample(min(first if stats is None else batch, rule.max_samples - len(samples))))
        stats = Stats(samples)
    t_verify = time.perf_counter()
    kernels = list(tmr.kernels) if tmr.kernels else None
    trace = kernel_names and kernels is None and ProfilerTimer.unsupported(device.type) is None
    if check is not None or trace or tmr.kernels:
        timed = tmr.verify(trace)
        problem = check(timed.args, timed.output) if check is not None else None
        problem = problem or kernel_mismatch(timed.checked_kernels, timed.kernels)
        if problem:
            raise TimerError(problem)
        kernels = kernels or timed.checked_kernels or None
    t_end = time.perf_counter()
    phase_s = {"warmup": t_sampling - t_begin, "sampling": t_verify - t_sampling, "verify": t_end - t_verify}
    return Measurement(timer_name, cache, stats, rule.met(stats), calls, kernels, samples,
                       t_end - t_begin, tmr.calls_per_sample, phase_s)
