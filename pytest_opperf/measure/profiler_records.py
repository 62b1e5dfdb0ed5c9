"""torch.profiler sessions, and what their records say of the calls made inside them.

The profiler timer and every timer's check of its timed call open a session here, mark the
calls they make with the ranges below (`record_function`), and read back per range the device
events (kernels, copies, fills) the calls ran: their names, and their summed device time.

On CUDA the events come straight from the profiler's raw records (recorded_events), which is
far cheaper than torch's own event tree; elsewhere from torch's parser.
"""

from __future__ import annotations

import bisect
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Optional

from pytest_opperf.measure.errors import TimerError

CALL_RANGE = "opperf::call"
CHECKED_RANGE = "opperf::checked"  # a plain call on the checked inputs, for its kernels
TIMED_RANGE = "opperf::timed"  # one more call made the way the samples were
_OWN_RANGES = (CALL_RANGE, CHECKED_RANGE, TIMED_RANGE)

_STARTED: set = set()  # device types whose profiler this process has started


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


@contextmanager
def profiling(device_type: str):
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
        _STARTED.add(device_type)


def started(device_type: str) -> bool:
    """Whether this process has run a profiler session on device_type (and paid its start)."""
    return device_type in _STARTED


def recorded_events(prof, device_type: str) -> list:
    """The events of a finished profiler session that kernel_times and range_kernels read, built
    straight from the profiler's raw records on CUDA; prof.events() elsewhere (torch's parser
    gives other accelerators' legacy device times that the raw records lack) and where torch
    keeps no raw records.

    prof.events() builds torch's whole event tree in Python, several times slower an event than
    this reader (28-31 us a host record against 3.7 us). This reads the same records once and keeps what the timer
    needs: our own host-side ranges, each carrying the device events (kernels, copies, fills)
    launched under it in launch order, and every device-side event. It attributes a device event
    the way torch does: to the host op whose correlation id it links to, and through it to the
    range holding that op (same thread, the op starting inside the range; our ranges do not
    nest). Durations are computed from the same nanosecond stamps, so the totals equal torch's
    (a GPU test compares them).
    """
    profiler = getattr(prof, "profiler", None)
    results = getattr(profiler, "kineto_results", None)
    if device_type != "cuda" or results is None or not hasattr(results, "trace_start_ns"):
        return prof.events()
    return _read_raw(results)


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
        kernels = device_events(events)
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


def range_kernels(events, name: str) -> list[str]:
    """The unique kernel names under the profiler range `name`, in launch order; [] when none
    were recorded (attributed to the CPU-side range, else found inside its device-side copy)."""
    names = [k for e in events if e.name == name and _on_cpu(e) for k in _kernel_names(e)]
    if not names:
        kernels = device_events(events)
        names = [k.name for start, end in _device_ranges(events, name) for k in _inside(kernels, start, end)]
    return list(dict.fromkeys(names))


def kernels_after(events, name: str) -> list[str]:
    """The unique names of the device kernels that started after the host entered range `name`.

    For the last range of a session whose earlier work was synchronized: the kernels a graph
    replay launches are tied to its cudaGraphLaunch, which not every profiler build attributes
    to the range around it; their start times still place them.
    """
    starts = [e.time_range.start for e in events if e.name == name and _on_cpu(e)]
    if not starts:
        return []
    return list(dict.fromkeys(k.name for k in device_events(events) if k.time_range.start >= min(starts)))


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


def _read_raw(results) -> list:
    """The events of a session's raw records (torch's kineto results): our host-side ranges,
    each holding the device events launched under it, and every device-side event.

    Each call on a record crosses into C++ (about a microsecond): a record is read only as far as
    it matters. A host record is our range (its name says so) or a launcher only where a device
    event links to its correlation id; every other host op (most of them: the flush's op, the
    runtime's launch calls, an op's inner ops) costs its kind, name and correlation id alone.
    """
    from torch.autograd import DeviceType

    name_of = _demangler()
    own = _OWN_RANGES
    cpu = DeviceType.CPU
    attributed = (DeviceType.CUDA, DeviceType.PrivateUse1, DeviceType.XPU)  # as torch's parser
    t0 = results.trace_start_ns()
    hosts: list = []  # (correlation id, record) of host ops that are not our ranges
    own_launches: dict[int, tuple[int, int]] = {}  # our ranges as launchers (a Triton launch links to the range)
    ranges: list[tuple[int, int, int, _Record]] = []  # (thread, start ns, end ns, record)
    linked: list[tuple[int, _Record]] = []
    events: list = []
    kinds: dict = {}  # DeviceType -> its name as torch's parser writes it
    records = results.events()
    skip_hidden = bool(records) and hasattr(records[0], "is_hidden_event")  # torch < 2.4 has none
    for e in records:
        if skip_hidden and e.is_hidden_event():
            continue
        kind = e.device_type()
        if kind == cpu:
            name = e.name()
            if name in own:
                thread = e.start_thread_id()
                if e.is_async() or thread != e.end_thread_id():
                    continue
                start, end = e.start_ns(), e.end_ns()
                record = _Record(name, "DeviceType.CPU", _Span((start - t0) / 1000, (end - t0) / 1000))
                ranges.append((thread, start, end, record))
                own_launches[e.correlation_id()] = (thread, start)
                events.append(record)
            else:
                hosts.append((e.correlation_id(), e))
            continue
        start, end = e.start_ns(), e.end_ns()
        label = kinds.get(kind) or kinds.setdefault(kind, str(kind))
        record = _Record(name_of(e), label, _Span((start - t0) / 1000, (end - t0) / 1000))
        events.append(record)
        if kind in attributed:
            correlation = e.linked_correlation_id()
            if correlation > 0:
                linked.append((correlation, record))
    _attribute(linked, {**_launchers(hosts, {c for c, _ in linked}), **own_launches}, ranges)
    return events


def _launchers(hosts: list, wanted: set) -> dict[int, tuple[int, int]]:
    """Correlation id -> (thread, start ns) of the host ops that launched device events (`wanted`):
    synchronous ops that link to nothing themselves (a runtime call links to its op instead)."""
    launchers = {}
    for correlation, e in hosts:
        if correlation not in wanted or e.linked_correlation_id() != 0:
            continue
        thread = e.start_thread_id()
        if e.is_async() or thread != e.end_thread_id():
            continue
        launchers[correlation] = (thread, e.start_ns())
    return launchers


def _demangler() -> Callable:
    """A raw record's name, demangled as torch's parser names events (each name once)."""
    import torch

    names: dict[str, str] = {}

    def name_of(e) -> str:
        raw = e.name()
        if raw not in names:
            names[raw] = torch._C._demangle(raw) if len(raw) > 1 else raw
        return names[raw]

    return name_of


def _attribute(linked: list, launchers: dict, ranges: list) -> None:
    """Hand each linked device event to our range holding the host op that launched it, in launch
    order: same thread, the op starting inside the range (our ranges do not nest)."""
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


def _device_time_total(event) -> float:
    # device_time_total where torch has it; cuda_time_total (deprecated since) only on older builds
    if hasattr(event, "device_time_total"):
        return float(event.device_time_total or 0.0)
    return float(getattr(event, "cuda_time_total", 0.0) or 0.0)


def _device_ranges(events, name: str) -> list[tuple]:
    return sorted((e.time_range.start, e.time_range.end) for e in events if e.name == name and not _on_cpu(e))


def device_events(events, ranges: str = "") -> list:
    """The device's events (kernels, copies, fills) of a session, by start time: not this module's
    own ranges' device-side copies, nor those of the ranges whose names start with RANGES."""
    return sorted((e for e in events if e.name not in _OWN_RANGES and not _on_cpu(e)
                   and not (ranges and e.name.startswith(ranges))), key=lambda k: k.time_range.start)


def range_device_times(events, prefix: str) -> dict:
    """Per range whose name starts with PREFIX: the device time (us) of the events that start inside
    each of its device-side copies, in time order. A kernel the profiler tied to no op (a Triton
    launch, at times: see kernel_times) is inside the copy of the range it ran in."""
    kernels = device_events(events, prefix)
    starts = [k.time_range.start for k in kernels]
    spans: dict = {}
    for e in events:
        if e.name.startswith(prefix) and not _on_cpu(e):
            spans.setdefault(e.name, []).append((e.time_range.start, e.time_range.end))
    return {name: [float(sum(k.time_range.end - k.time_range.start for k in _inside(kernels, a, b, starts)))
                   for a, b in sorted(each)] for name, each in spans.items()}


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
