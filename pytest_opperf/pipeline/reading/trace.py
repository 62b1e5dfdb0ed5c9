"""torch.profiler output: a Chrome/Kineto trace JSON (``export_chrome_trace``, ``.json`` or ``.json.gz``).

The trace must be recorded with ``record_shapes=True``: CPU ops (``cat: cpu_op``, ``Operator`` in
PyTorch 1.8/1.9 traces) then carry ``Input Dims`` (and, since 1.10, ``Input type``). What an op
instance took depends on the trace:

- ``time_source = "kernel"`` when the trace has device activity (``kernel``, ``gpu_memcpy``,
  ``gpu_memset``; ``Kernel``, ``Memcpy``, ``Memset`` in older traces): each kernel is tied to the
  CPU op that launched it through its ``External id``, or else through its ``correlation`` id
  (the ``ac2g`` or ``async`` flow's id) to the runtime call and the innermost CPU op around that
  call; its device duration counts for that op.
- ``time_source = "cpu_op"`` otherwise: each CPU op's self time (its duration less its child
  ops').

Either way a unit of time goes to the outermost op around it (the launching one included) that
the mapping claims, or to the launching op itself when none is: ``aten::softmax`` holds the
time of the ``aten::_softmax`` it calls, while ``aten::mm`` inside an unclaimed ``aten::linear``
is a GEMM of its own and the ``aten::linear`` keeps only its own overhead. No time is counted
twice and none is dropped.

The events are read one at a time (events.py) and only the fields used here are kept; owners.py
hands out the time: linking a kernel to its op is a dict lookup, or a binary search in its
thread's ops sorted by start, so a trace of n events is read in O(n log n).
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from pytest_opperf.pipeline.reading import calls, capture
from pytest_opperf.pipeline.reading.events import Events
from pytest_opperf.pipeline.reading.owners import HOOK, Claims, Owner, Tree, cpu_time, kernel_time
from pytest_opperf.pipeline.reading.signature import ProfileError, Signature, aggregate, format_shapes
from pytest_opperf.pipeline.reading.slots import slot_bytes

# Categories, lower-cased: Kineto's names, then PyTorch 1.8/1.9's.
CPU_OP = {"cpu_op", "operator"}
RUNTIME = {"cuda_runtime", "cuda_driver", "runtime"}
DEVICE = {"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"}
FLOW = {"ac2g", "async"}
ANNOTATION = {"user_annotation"}  # record_function ranges (calls.py: steps and phases)



def read(path: Path, claims: Claims, l2_bytes: Optional[int] = None, l2_of_trace: bool = False,
         extras: Optional[dict] = None) -> list[Signature]:
    """The trace's signatures (and in EXTRAS["modules"], where given, the calls of a capture's leaf
    modules: calls.module_calls); L2_BYTES (the profiled device's L2) tells a captured input written
    recently enough to be in it (see _sources) from one written before. L2_OF_TRACE: it is the L2 of
    the GPU the trace's deviceProperties name, which a CPU profile taken on a GPU's host names too:
    its calls ran on the CPU, so it is not used then."""
    _refuse_trace_view(path)
    trace = _read(path)
    if not trace.device and l2_of_trace:
        l2_bytes = None
    if not trace.names:
        raise ProfileError(f"{path}: no CPU ops (cat 'cpu_op' or 'Operator') in the trace; record it with torch.profiler "
                           f"(record_shapes=True)")
    if not trace.with_dims:
        raise ProfileError(f"{path}: the CPU ops carry no 'Input Dims': record the trace with "
                           f"torch.profiler.profile(..., record_shapes=True)")
    tree = Tree(trace)
    _apply_capture(trace, path, l2_bytes, tree)
    _inherit_sources(trace, tree)
    owner = Owner(trace, tree, claims)
    if trace.device:
        instances = kernel_time(trace, tree, owner)
        time_source = "kernel"
    else:
        instances = cpu_time(trace, tree, owner)
        time_source = "cpu_op"
    if extras is not None:
        extras["modules"] = trace.modules
    return aggregate(instances, source="torch.profiler", time_source=time_source)


@dataclass
class _Trace:
    """What linking needs of a trace, column by column: CPU ops, runtime calls, device activity, flows."""

    names: list = field(default_factory=list)      # per CPU op: name (interned)
    threads: list = field(default_factory=list)    # (pid, tid) as text
    starts: list = field(default_factory=list)     # us
    durs: list = field(default_factory=list)       # us
    shapes: list = field(default_factory=list)     # index into `texts`
    texts: list = field(default_factory=list)      # (input shapes, dtypes, strides, concrete values) as text
    by_external: dict = field(default_factory=dict)  # External id -> first CPU op with it
    with_dims: bool = False
    runtime: dict = field(default_factory=dict)    # correlation -> ((pid, tid), ts) of the runtime call
    device: list = field(default_factory=list)     # (name, dur, External id, correlation, flow key)
    sources: dict = field(default_factory=dict)    # CPU op -> where its inputs came from (a capture's; _sources)
    flow_ends: dict = field(default_factory=dict)  # (pid, tid, ts) of a flow's end -> its id (correlation)
    annotations: list = field(default_factory=list)  # record_function ranges: (thread, ts, dur, name)
    writers: dict = field(default_factory=dict)    # CPU op -> per input slot the CPU op that wrote it (a capture's)
    op_of: dict = field(default_factory=dict)      # a capture's op number -> the CPU op it is (_sources)
    module_calls: list = field(default_factory=list)  # a capture's leaf-module calls (capture._leaf_calls)
    modules: list = field(default_factory=list)    # the same in the sequence's positions (calls.module_calls)


def _read(path: Path) -> _Trace:
    trace = _Trace()
    text_index: dict[tuple, int] = {}   # (shapes, dtypes) text -> index in trace.texts
    raw_index: dict[tuple, int] = {}    # the same, by the repr of the fields as read (most ops repeat)
    threads: dict[tuple, tuple] = {}    # (pid, tid) as read -> as text (PyTorch 1.9 mixes 25738 and "25738")
    events = Events(path)
    for index, e in events:
        if type(e) is not dict:
            raise ProfileError(f"{events.where(index)}: a {type(e).__name__}, not an event object")
        cat = e.get("cat")
        kind = _KINDS.get(cat) or (_KINDS.get(cat.lower()) if type(cat) is str else None)
        if kind is None:
            continue
        ph = e.get("ph")
        if kind is _FLOW:
            if ph == "f":
                thread = _thread(e, threads, events, index)
                trace.flow_ends[(*thread, _number(e, "ts", events, index, path))] = e.get("id")
            continue
        if ph != "X":
            continue
        ts, dur = e.get("ts"), e.get("dur")
        if type(ts) not in _NUMBERS or type(dur) not in _NUMBERS or not (ts - ts == 0 and 0 <= dur < math.inf):
            ts, dur = _number(e, "ts", events, index, path), _number(e, "dur", events, index, path)
        args = e.get("args")
        if type(args) is not dict:
            if args is not None:
                raise ProfileError(f"{events.where(index)}: 'args' is {_shown(args)} (expected an object)")
            args = {}
        name = e.get("name")
        if type(name) is not str:
            raise ProfileError(f"{events.where(index)}: 'name' is {_shown(name)} (expected text)")
        thread = _thread(e, threads, events, index)
        if kind is _ANNOTATION:
            trace.annotations.append((thread, ts, dur, name))
        elif kind is _CPU_OP:
            raw = (repr(args.get("Input Dims")), repr(args.get("Input type")), repr(args.get("Input Strides")),
                   repr(args.get("Concrete Inputs")))
            shapes = raw_index.get(raw)
            if shapes is None:
                text = _signature_text(args, events, index)
                shapes = raw_index[raw] = text_index.setdefault(text, len(text_index))
                if shapes == len(trace.texts):
                    trace.texts.append(text)
                trace.with_dims = trace.with_dims or "Input Dims" in args
            op = len(trace.names)
            trace.names.append(sys.intern(name))
            trace.threads.append(thread)
            trace.starts.append(ts)
            trace.durs.append(dur)
            trace.shapes.append(shapes)
            ext = _id(args, "External id", events, index)
            if ext:
                trace.by_external.setdefault(ext, op)
        elif kind is _RUNTIME:
            corr = _id(args, "correlation", events, index)
            if corr is not None:
                trace.runtime[corr] = (thread, ts)
        else:
            ext = _id(args, "External id", events, index)
            if ext is None:
                ext = _id(args, "external id", events, index)
            corr = _id(args, "correlation", events, index)
            flow = None if corr is not None else (*thread, ts)
            trace.device.append((sys.intern(name), dur, ext, corr, flow))
    return trace


_CPU_OP, _RUNTIME, _DEVICE, _FLOW, _ANNOTATION = "cpu_op", "runtime", "device", "flow", "annotation"
_KINDS = {**{c: _CPU_OP for c in CPU_OP}, **{c: _RUNTIME for c in RUNTIME}, **{c: _DEVICE for c in DEVICE},
          **{c: _FLOW for c in FLOW}, **{c: _ANNOTATION for c in ANNOTATION}}
_NUMBERS = (int, float)


def _thread(e: dict, threads: dict, events: Events, index: int) -> tuple:
    key = (e.get("pid"), e.get("tid"))
    try:
        thread = threads.get(key)
    except TypeError:  # a list or an object: not a process or thread id
        raise ProfileError(f"{events.where(index)}: 'pid', 'tid' are {_shown(key)} (expected numbers or texts)") from None
    if thread is None:
        thread = threads[key] = (str(key[0]), str(key[1]))
    return thread


def _number(e: dict, key: str, events: Events, index: int, path: Path) -> float:
    value = e.get(key)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and (
            key != "dur" or value >= 0):
        return value
    if key == "ts" and isinstance(value, str) and _numeric(value):
        _refuse_trace_view(path, always=True)
    expected = "a number of us" if key == "ts" else "a number of us, not negative"
    shown = "missing" if key not in e else f"{_shown(value)}"
    raise ProfileError(f"{events.where(index)}: {e.get('cat')} event {_shown(e.get('name'))}: '{key}' is {shown} "
                       f"(expected {expected})")


def _numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _id(args: dict, key: str, events: Events, index: int):
    value = args.get(key)
    if value is None or type(value) is int or type(value) is str:
        return value
    raise ProfileError(f"{events.where(index)}: '{key}' is {_shown(value)} (expected an integer)")


def _signature_text(args: dict, events: Events, index: int) -> tuple[str, str, str, str]:
    dims = args.get("Input Dims")
    types = args.get("Input type")
    if dims is None:
        dims = []
    if not _is_shapes(dims):
        raise ProfileError(f"{events.where(index)}: 'Input Dims' is {_shown(dims)} (expected a list of shapes, "
                           f"each a list of integers or a list of such lists)")
    if types is None:
        types = []
    if type(types) is not list or not all(type(t) is str for t in types):
        raise ProfileError(f"{events.where(index)}: 'Input type' is {_shown(types)} (expected a list of texts)")
    strides = args.get("Input Strides")
    strides = format_shapes([_slot(d) for d in strides]) if strides is not None and _is_shapes(strides) else ""
    values = args.get("Concrete Inputs")
    values = json.dumps(values) if type(values) is list and all(type(v) is str for v in values) else ""
    return (sys.intern(format_shapes([_slot(d) for d in dims])), sys.intern(";".join(types)), sys.intern(strides),
            sys.intern(values))


# The op whose Concrete Inputs slot a capture fills (pipeline/capture.py), and with what.
_CAPTURED = {"aten::_grouped_mm": ("grouped_mm_offsets", 2), "aten::index": ("index_counts", 1)}
# Version 1 captures counted these calls into index_counts too, in the order they ran.
_INDEX_PUT_V1 = ("aten::index_put_", "aten::index_put", "aten::_index_put_impl_")


def _apply_capture(trace: _Trace, path: Path, l2_bytes: Optional[int], tree: Tree) -> None:
    """Put what capture.py saved beside the trace into the Concrete Inputs of the ops it ran for:
    the k-th call of an op in time order that the capture's hook saw (not inside one of the hook's
    events) takes the k-th record; a call inside another of the same op (the hook's redispatch)
    takes its outer call's. A count that differs is refused. Where its inputs came from goes to
    trace.sources (_sources)."""
    try:
        saved = capture.load(path)
    except ValueError as exc:
        raise ProfileError(str(exc)) from None
    if saved is None:
        return
    hook = _under_hook(trace, tree)
    _sources(trace, saved.get("inputs") or [], hook, l2_bytes)
    trace.module_calls = [m for m in saved.get("modules") or [] if isinstance(m, list) and len(m) == 8]
    for name, (key, slot) in _CAPTURED.items():
        counted = (name, *_INDEX_PUT_V1) if key == "index_counts" and saved.get("version") == 1 else (name,)
        ran = sorted((i for i, n in enumerate(trace.names) if n in counted), key=lambda i: trace.starts[i])
        outer = [i for i in ran if i not in hook] if hook is not None else _outermost(trace, ran)
        records = saved.get(key) or []
        if outer and len(records) != len(outer):
            raise ProfileError(f"{capture.sidecar(path)}: {len(records)} {key} for {len(outer)} {name} calls in "
                               f"{path.name}: the capture is of another run (capture and profile the same block)")
        texts = {i: _captured_text(trace, i, slot, record, key)
                 for i, record in zip(outer, records) if trace.names[i] == name}
        current = None
        for i in ran:
            if i in texts:
                current = i
            elif current is not None and trace.names[i] == name and trace.threads[i] == trace.threads[current] and \
                    trace.starts[i] + trace.durs[i] <= trace.starts[current] + trace.durs[current]:
                texts[i] = texts[current]
        for i, text in texts.items():
            if text is not None:
                trace.shapes[i] = text


def _captured_text(trace: _Trace, i: int, slot: int, record, key: str) -> Optional[int]:
    """The index of op i's texts with the captured record in its Concrete Inputs slot (None: kept)."""
    shapes, types, strides, values = trace.texts[trace.shapes[i]]
    slots = json.loads(values) if values else []
    if record is None or slot >= len(slots):
        return None
    if key == "grouped_mm_offsets":
        slots[slot] = json.dumps(record)
    elif isinstance(record, list) and len(record) == 2:  # version 6: an index over a later dim
        slots[slot] = json.dumps({"count": record[0], "dim": record[1]})
    else:
        slots[slot] = json.dumps({"count": record})
    trace.texts.append((shapes, types, strides, json.dumps(slots)))
    return len(trace.texts) - 1


# A captured input's source (capture.Sources) as the code a signature keeps per slot: p a weight, o made
# before the block, r written by an op recently enough to be in the L2, e written before that.
WEIGHT, BEFORE, RECENT, EARLIER = "p", "o", "r", "e"


def _sources(trace: _Trace, records: list, hook: Optional[set], l2_bytes: Optional[int]) -> None:
    """trace.sources for the calls the capture's hook saw, matched as _apply_capture matches: the
    k-th call of an op outside the hook's events takes the k-th record of that op. An input an op
    wrote is RECENT when what all ops wrote since, and its own bytes, fit half the L2 (the other
    half for what the reading kernel reads and writes besides), else EARLIER. An op whose calls
    and records differ in number is matched by aligning the two sequences (calls.matched); a
    call no record matches keeps no sources (the stated default applies to it)."""
    kept = [(r, rec) for r, rec in enumerate(records)
            if isinstance(rec, list) and len(rec) in (2, 3, 4) and isinstance(rec[1], list)]
    if not kept:
        return
    half = (l2_bytes or 0) // 2
    named = {rec[0] for _, rec in kept}
    order = [i for i in sorted(range(len(trace.names)), key=lambda i: trace.starts[i])
             if trace.names[i] in named and not (hook and i in hook)]
    op_of = calls.matched([(r, rec[0]) for r, rec in kept], [(i, trace.names[i]) for i in order])
    trace.op_of = op_of
    for r, rec in kept:
        i = op_of.get(r)
        if i is None:
            continue
        sizes = _slot_bytes(trace, i)
        codes = []
        for k, fact in enumerate(rec[1]):
            fact = str(fact)
            if fact.startswith("w") and fact[1:].isdigit():
                own = sizes[k] if k < len(sizes) else 0
                fact = RECENT if int(fact[1:]) + own <= half else EARLIER
            codes.append(fact if fact in (WEIGHT, BEFORE, RECENT, EARLIER) else "")
        trace.sources[i] = ";".join(codes)
        writers = [calls.writer_of(w, op_of) for w in (rec[2] if len(rec) >= 3 and isinstance(rec[2], list) else [])]
        if any(w is not None for w in writers):
            trace.writers[i] = writers
        if len(rec) == 4 and isinstance(rec[3], dict) and rec[3]:
            calls.type_lists(trace, i, rec[3])


def _slot_bytes(trace: _Trace, i: int) -> list:
    """Bytes of each input slot of op i (0 where the dtype is not a tensor's or the slot is empty)."""
    shapes, types, _, _ = trace.texts[trace.shapes[i]]
    return slot_bytes(shapes, types) or []


def _inherit_sources(trace: _Trace, tree: Tree) -> None:
    """An op the hook did not see (a composite such as aten::linear, which dispatches as aten::t and
    aten::addmm) takes its inputs' sources and writers from the ops inside it (calls.inherit)."""
    from pytest_opperf.pipeline.reading.signature import parse_shapes

    def slots(i: int) -> list:
        shapes, types, _, _ = trace.texts[trace.shapes[i]]
        return [(s, math.prod(s), t) if isinstance(s, tuple) and s else None
                for s, t in zip(parse_shapes(shapes), types.split(";"))]

    calls.inherit(trace, lambda i: tree.parent[i], slots)


def _under_hook(trace: _Trace, tree: Tree) -> Optional[set]:
    """The ops inside one of the hook's events (below it in the nesting of their thread); None when
    the trace has no such event. Nesting, not times alone: an op and the hook event it holds may start
    or end on the same tick of the trace's clock."""
    if HOOK not in trace.names:
        return None
    under: dict = {}
    for i in range(len(trace.names)):
        chain, j = [], tree.parent[i]
        while j is not None and j not in under and trace.names[j] != HOOK:
            chain.append(j)
            j = tree.parent[j]
        found = j is not None and (trace.names[j] == HOOK or under[j])
        for k in chain:
            under[k] = found
        under[i] = found
    return {i for i, inside in under.items() if inside}


def _outermost(trace: _Trace, calls: list) -> list:
    """The calls (in time order) not inside another call of the same op on their thread."""
    out, end_of = [], {}
    for i in calls:
        end = trace.starts[i] + trace.durs[i]
        if end <= end_of.get(trace.threads[i], -math.inf):
            continue
        out.append(i)
        end_of[trace.threads[i]] = end
    return out


def _is_shapes(dims) -> bool:
    """A list of slots: each a list of ints (a tensor's shape), or a non-empty list of those (a tensor list)."""
    if type(dims) is not list:
        return False
    for slot in dims:
        if type(slot) is not list:
            return False
        if slot and type(slot[0]) is list:
            for shape in slot:
                if type(shape) is not list or any(type(x) is not int for x in shape):
                    return False
        elif any(type(x) is not int for x in slot):
            return False
    return True


def _slot(dims: list):
    if not dims:
        return None
    if isinstance(dims[0], list):
        return [tuple(d) for d in dims]
    return tuple(dims)


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _refuse_trace_view(path: Path, always: bool = False) -> None:
    """torch_npu's trace_view.json: its kernels carry no shapes; kernel_details.csv beside it does."""
    csv = path.parent / "kernel_details.csv"
    if not always and not (path.name == "trace_view.json" and csv.is_file()):
        return
    where = csv if csv.is_file() else "the kernel_details.csv in its ASCEND_PROFILER_OUTPUT folder"
    raise ProfileError(f"{path}: a torch_npu trace_view.json (string timestamps, kernels without shapes); "
                       f"import {where} instead")
