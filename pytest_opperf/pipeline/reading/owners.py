"""The op a unit of a trace's time belongs to (trace.py reads the trace, this module hands out its time).

CPU ops are nested by time on each thread (``Tree``); a kernel is tied to the op that launched it
(through its External id, or its correlation id to the runtime call and the innermost op around
it); its time, or a CPU op's self time, goes to the outermost op around it that the mapping claims
(``Owner``), so that no time is counted twice and none is dropped.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from typing import Callable, Optional

from pytest_opperf.pipeline.reading import calls
from pytest_opperf.pipeline.reading.signature import Instance

# claims(op_name, input shapes, dtypes, strides, values as text) -> how the mapping takes this op:
# 2 a catalogue rule (the same computation), 1 a replay of the op itself or a stand-in, 0 not at all.
Claims = Callable[[str, str, str, str, str], int]

# The event the capture's dispatch hook adds around each op it sees: calls inside one ran below the
# hook (the op's own redispatch, or ops its kernel calls), so the capture never saw them.
HOOK = "PythonDispatchMode"


class Tree:
    """CPU ops nested by time on each thread: op index -> parent index, children's time, innermost op at t."""

    def __init__(self, trace):
        self.trace = trace
        n = len(trace.names)
        self.parent: list[Optional[int]] = [None] * n
        self.children_us = [0.0] * n
        by_thread = defaultdict(list)
        for i, thread in enumerate(trace.threads):
            by_thread[thread].append(i)
        starts, durs = trace.starts, trace.durs
        self.members: dict[tuple, list[int]] = {}
        self.member_starts: dict[tuple, list[float]] = {}
        for thread, members in by_thread.items():
            # Parents first when two ops start together: the longer one encloses the other; on one
            # tick both ways, the capture's hook event is inside the op it dispatched.
            members.sort(key=lambda i: (starts[i], -durs[i], trace.names[i] == HOOK))
            self.members[thread] = members
            self.member_starts[thread] = [starts[i] for i in members]
            stack: list[int] = []
            for i in members:
                middle = starts[i] + durs[i] / 2
                while stack and not self.contains(stack[-1], middle):
                    stack.pop()
                if stack:
                    self.parent[i] = stack[-1]
                    self.children_us[stack[-1]] += durs[i]
                stack.append(i)

    def contains(self, i: int, ts: float) -> bool:
        start = self.trace.starts[i]
        return start <= ts <= start + self.trace.durs[i]

    def innermost(self, thread: tuple, ts: float) -> Optional[int]:
        """The op that started last, of those open at ts: the last one started by then, or its nearest
        ancestor still open (an op open at ts that started earlier encloses that last one)."""
        starts = self.member_starts.get(thread)
        if not starts:
            return None
        k = bisect_right(starts, ts) - 1
        i = self.members[thread][k] if k >= 0 else None
        while i is not None and not self.contains(i, ts):
            i = self.parent[i]
        return i


class Owner:
    """The op a unit of time belongs to: the outermost op around it (itself included) that a
    catalogue rule claims; else the outermost one the mapping replays as itself or stands in for,
    among those holding no catalogue-claimed op (its replay would run that op's kernels again);
    else the op itself."""

    def __init__(self, trace, tree: Tree, claims: Claims):
        self.trace = trace
        self.tree = tree
        self.claims = claims
        self._level: dict[tuple, int] = {}          # (name, texts index) -> claim level
        self._tops: dict[int, tuple] = {}            # op -> (outermost level-2 op, outermost free level-1 op)
        self.tainted = self._tainted()

    def __call__(self, i: int) -> int:
        top2, top1 = self._outermost(i)
        return top2 if top2 is not None else (top1 if top1 is not None else i)

    def _tainted(self) -> set:
        """Ops that hold a catalogue-claimed op below them."""
        out: set = set()
        parent = self.tree.parent
        for i in range(len(self.trace.names)):
            if self.level(i) == 2:
                j = parent[i]
                while j is not None and j not in out:
                    out.add(j)
                    j = parent[j]
        return out

    def _outermost(self, i: int) -> tuple:
        chain = []
        j = i
        while j is not None and j not in self._tops:
            chain.append(j)
            j = self.tree.parent[j]
        top2, top1 = self._tops[j] if j is not None else (None, None)
        for j in reversed(chain):  # outermost first
            level = self.level(j)
            if top2 is None and level == 2:
                top2 = j
            if top1 is None and level == 1 and j not in self.tainted:
                top1 = j
            self._tops[j] = (top2, top1)
        return self._tops[i]

    def level(self, i: int) -> int:
        key = (self.trace.names[i], self.trace.shapes[i])
        level = self._level.get(key)
        if level is None:
            shapes, types, strides, values = self.trace.texts[key[1]]
            level = self._level[key] = int(self.claims(key[0], shapes, types, strides, values))
        return level


def kernel_time(trace, tree: Tree, owner: Owner) -> list[Instance]:
    time_of: dict[int, float] = defaultdict(float)
    kernels_of: dict[int, list] = defaultdict(list)
    orphans: dict[str, list] = defaultdict(list)
    for name, dur, ext, corr, flow in trace.device:
        launcher = trace.by_external.get(ext) if ext else None
        if launcher is None:
            call = trace.runtime.get(corr if corr is not None else trace.flow_ends.get(flow))
            if call is not None:
                launcher = tree.innermost(*call)
        if launcher is None:
            orphans[name].append(float(dur))
            continue
        op = owner(launcher)
        time_of[op] += float(dur)
        kernels_of[op].append(name)
    out = _instances(trace, time_of, kernels_of, owner)
    # Device work no CPU op launched (a graph replay, a collective's helper stream): kept, by kernel name.
    for name, durations in orphans.items():
        for d in durations:
            out.append(Instance(name, "", "", d, kernels=(name,)))
    return out


def cpu_time(trace, tree: Tree, owner: Owner) -> list[Instance]:
    time_of: dict[int, float] = defaultdict(float)
    for i, dur in enumerate(trace.durs):
        self_us = max(0.0, float(dur) - tree.children_us[i])
        if self_us > 0:
            time_of[owner(i)] += self_us
    return _instances(trace, time_of, {}, owner)


def _instances(trace, time_of: dict, kernels_of: dict, owner: Owner) -> list[Instance]:
    out = []
    placed = calls.places(trace, owner, list(time_of))
    trace.modules = calls.module_calls(trace, owner, placed)
    for i in sorted(time_of, key=lambda i: (trace.starts[i], i)):
        shapes, types, strides, values = trace.texts[trace.shapes[i]]
        position, step, phase, links = placed[i]
        out.append(Instance(trace.names[i], shapes, types, time_of[i], kernels=tuple(kernels_of.get(i, ())),
                            input_strides=strides, input_values=values, input_sources=trace.sources.get(i, ""),
                            position=position, step=step, phase=phase, links=links))
    return out
