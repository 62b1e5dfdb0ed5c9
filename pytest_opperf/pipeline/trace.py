"""torch.profiler output: a Chrome/Kineto trace JSON (``export_chrome_trace``, ``.json`` or ``.json.gz``).

The trace must be recorded with ``record_shapes=True``: CPU ops (``cat: cpu_op``) then carry
``Input Dims`` and ``Input type``. What an op instance took depends on the trace:

- ``time_source = "kernel"`` when the trace has device activity (``kernel``, ``gpu_memcpy``,
  ``gpu_memset``): each kernel is tied to the CPU op that launched it through its ``External
  id``, or else through its ``correlation`` id (the ``ac2g`` flow's id) to the runtime call
  and the innermost CPU op around that call; its device duration counts for that op.
- ``time_source = "cpu_op"`` otherwise: each CPU op's self time (its duration less its child
  ops').

Either way a unit of time goes to the outermost op around it (the launching one included) that
the mapping claims, or to the launching op itself when none is: ``aten::softmax`` holds the
time of the ``aten::_softmax`` it calls, while ``aten::mm`` inside an unclaimed ``aten::linear``
is a GEMM of its own and the ``aten::linear`` keeps only its own overhead. No time is counted
twice and none is dropped.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Callable, Optional

from pytest_opperf import files
from pytest_opperf.pipeline.signature import Instance, ProfileError, Signature, aggregate, format_shapes

DEVICE_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}

# claims(op_name, input_shapes_text, input_dtypes_text) -> does the mapping take this op?
Claims = Callable[[str, str, str], bool]


def read(path: Path, claims: Claims) -> list[Signature]:
    events = _events(path)
    ops = [e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    if not ops:
        raise ProfileError(f"{path}: no CPU ops (cat 'cpu_op') in the trace; record it with torch.profiler")
    if not any("Input Dims" in (e.get("args") or {}) for e in ops):
        raise ProfileError(f"{path}: the CPU ops carry no 'Input Dims': record the trace with "
                           f"torch.profiler.profile(..., record_shapes=True)")
    tree = _Tree(ops)
    device = [e for e in events if e.get("ph") == "X" and e.get("cat") in DEVICE_CATEGORIES]
    owner = _Owner(tree, claims)
    if device:
        instances = _kernel_time(path, events, device, tree, owner)
        time_source = "kernel"
    else:
        instances = _cpu_time(tree, owner)
        time_source = "cpu_op"
    return aggregate(instances, source="torch.profiler", time_source=time_source)


def _events(path: Path) -> list[dict]:
    if not path.exists():
        raise ProfileError(f"{path}: no such file")
    try:
        data = files.load_json(path)
    except files.FileError as exc:
        raise ProfileError(f"{path}: not a Chrome trace JSON file: {exc.reason}") from None
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise ProfileError(f"{path}: expected a Chrome trace ({{'traceEvents': [...]}} or a list of events)")
    return [e for e in events if isinstance(e, dict)]


class _Tree:
    """CPU ops nested by time on each thread: op index -> parent index."""

    def __init__(self, ops: list[dict]):
        self.ops = ops
        self.parent: list[Optional[int]] = [None] * len(ops)
        self.children_us = [0.0] * len(ops)
        by_thread = defaultdict(list)
        for i, op in enumerate(ops):
            by_thread[(op.get("pid"), op.get("tid"))].append(i)
        self.by_thread = {}
        for thread, members in by_thread.items():
            # Parents first when two ops start together: the longer one encloses the other.
            members.sort(key=lambda i: (ops[i]["ts"], -ops[i].get("dur", 0)))
            self.by_thread[thread] = members
            stack: list[int] = []
            for i in members:
                while stack and not self._contains(stack[-1], ops[i]["ts"] + ops[i].get("dur", 0) / 2):
                    stack.pop()
                if stack:
                    self.parent[i] = stack[-1]
                    self.children_us[stack[-1]] += ops[i].get("dur", 0)
                stack.append(i)
        self.by_external = {}
        for i, op in enumerate(ops):
            ext = (op.get("args") or {}).get("External id")
            if ext:
                self.by_external.setdefault(ext, i)

    def _contains(self, i: int, ts: float) -> bool:
        op = self.ops[i]
        return op["ts"] <= ts <= op["ts"] + op.get("dur", 0)

    def innermost(self, thread: tuple, ts: float) -> Optional[int]:
        best = None
        for i in self.by_thread.get(thread, ()):
            if self.ops[i]["ts"] > ts:
                break
            if self._contains(i, ts):
                best = i
        return best

    def shapes(self, i: int) -> tuple[str, str]:
        args = self.ops[i].get("args") or {}
        dims = args.get("Input Dims") or []
        types = args.get("Input type") or []
        slots = [_slot(d) for d in dims]
        return format_shapes(slots), ";".join(str(t) for t in types)


def _slot(dims):
    if not dims:
        return None
    if isinstance(dims[0], list):
        return [tuple(d) for d in dims]
    return tuple(dims)


class _Owner:
    """The op a unit of time belongs to: the outermost claimed op from `i` outwards, else `i`."""

    def __init__(self, tree: _Tree, claims: Claims):
        self.tree = tree
        self.claims = claims
        self._claimed: dict[int, bool] = {}

    def __call__(self, i: int) -> int:
        owner, j = i, i
        while j is not None:
            if self._is_claimed(j):
                owner = j
            j = self.tree.parent[j]
        return owner

    def _is_claimed(self, i: int) -> bool:
        if i not in self._claimed:
            shapes, types = self.tree.shapes(i)
            self._claimed[i] = self.claims(self.tree.ops[i]["name"], shapes, types)
        return self._claimed[i]


def _kernel_time(path: Path, events: list[dict], device: list[dict], tree: _Tree, owner: _Owner) -> list[Instance]:
    runtime_by_corr = {}
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver", "runtime") and e.get("ph") == "X":
            corr = (e.get("args") or {}).get("correlation")
            if corr is not None:
                runtime_by_corr[corr] = e
    # ac2g flows carry the correlation id when a kernel's own args do not.
    flow_end = {}
    for e in events:
        if e.get("cat") == "ac2g" and e.get("ph") == "f":
            flow_end[(e.get("pid"), e.get("tid"), e.get("ts"))] = e.get("id")
    time_of: dict[int, float] = defaultdict(float)
    kernels_of: dict[int, list] = defaultdict(list)
    orphans: dict[str, list] = defaultdict(list)
    for k in device:
        args = k.get("args") or {}
        launcher = tree.by_external.get(args.get("External id")) if args.get("External id") else None
        if launcher is None:
            corr = args.get("correlation", flow_end.get((k.get("pid"), k.get("tid"), k.get("ts"))))
            call = runtime_by_corr.get(corr)
            if call is not None:
                launcher = tree.innermost((call.get("pid"), call.get("tid")), call["ts"])
        if launcher is None:
            orphans[k.get("name", "?")].append(float(k.get("dur", 0)))
            continue
        op = owner(launcher)
        time_of[op] += float(k.get("dur", 0))
        kernels_of[op].append(k.get("name", "?"))
    out = []
    for i in sorted(time_of, key=lambda i: tree.ops[i]["ts"]):
        shapes, types = tree.shapes(i)
        out.append(Instance(tree.ops[i]["name"], shapes, types, time_of[i], kernels=tuple(kernels_of[i])))
    # Device work no CPU op launched (a graph replay, a collective's helper stream): kept, by kernel name.
    for name, durations in orphans.items():
        for d in durations:
            out.append(Instance(name, "", "", d, kernels=(name,)))
    return out


def _cpu_time(tree: _Tree, owner: _Owner) -> list[Instance]:
    time_of: dict[int, float] = defaultdict(float)
    for i, op in enumerate(tree.ops):
        self_us = max(0.0, float(op.get("dur", 0)) - tree.children_us[i])
        if self_us > 0:
            time_of[owner(i)] += self_us
    out = []
    for i in sorted(time_of, key=lambda i: tree.ops[i]["ts"]):
        shapes, types = tree.shapes(i)
        out.append(Instance(tree.ops[i]["name"], shapes, types, time_of[i]))
    return out
