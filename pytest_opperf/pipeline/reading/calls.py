"""The profiled calls in the order they ran: their positions, steps, phases and data flow.

Import keeps, beside the signatures, each call of the profile in time order (the profile
database's ``calls`` table), which the sequence replay (sequence.py) runs again in that order:

- **position**: the calls an op's time went to (trace.py's owners), numbered by their start on the host,
  which is the order a stream runs their kernels in;
- **step** and **phase**, from the ``record_function`` ranges around the call (``user_annotation``
  in the trace): under ``ProfilerStep#N`` (``prof.step()`` with a schedule) the step is N and the
  phase the range inside it; otherwise each outermost range is a step (0, 1, ...) and its name the
  phase (``with record_function("prefill"): ...``, then one ``"decode"`` range a token). A call
  outside every range has no step and no phase;
- **links**: per input slot, the position of the earlier call whose output the input read, where a
  capture (capture.py, version 4) saw which op wrote it; a call whose time went to an op around the
  writer (``aten::linear`` around ``aten::addmm``) counts as the writer. A tensor-list slot (version 5)
  holds a list: its elements' writers (``[812, 840]``: a KV cache's ``cat`` reads the last step's
  ``cat`` and the new key).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Callable, Optional

from pytest_opperf.pipeline.reading.slots import LIST

STEP_RANGE = "ProfilerStep#"


def places(trace, owner: Callable[[int], int], ops: list) -> dict:
    """op -> (position, step, phase, links) for OPS (the ops that own time), numbered by start."""
    ordered = sorted(ops, key=lambda i: (trace.starts[i], i))
    position = {i: p for p, i in enumerate(ordered)}
    ranges = _ranges(trace, ordered)
    out = {}
    for i in ordered:
        step, phase = ranges.get(i, (None, ""))
        out[i] = (position[i], step, phase, _links(trace, owner, position, i))
    return out


def _links(trace, owner: Callable[[int], int], position: dict, i: int) -> tuple:
    writers = trace.writers.get(i)
    if not writers:
        return ()
    mine = position[i]

    def earlier(w):
        p = position.get(owner(w)) if w is not None else None
        return p if p is not None and p < mine else None

    links = []
    for w in writers:
        if isinstance(w, list):  # a tensor list: its elements' writers
            each = [earlier(x) for x in w]
            links.append(each if any(p is not None for p in each) else None)
        else:
            links.append(earlier(w))
    return tuple(links) if any(p is not None for p in links) else ()


def _ranges(trace, ordered: list) -> dict:
    """op -> (step, phase) from the annotation ranges open on its thread when it started."""
    by_thread = defaultdict(list)
    for thread, ts, dur, name in trace.annotations:
        by_thread[thread].append((ts, -dur, name))
    out = {}
    if not by_thread:
        return out
    ops_of = defaultdict(list)
    for i in ordered:
        ops_of[trace.threads[i]].append(i)
    for thread, ranges in by_thread.items():
        ranges.sort()
        k, stack, tops = 0, [], -1  # stack: (end, name, ordinal of its outermost range)
        for i in ops_of.get(thread, ()):
            ts = trace.starts[i]
            while k < len(ranges) and ranges[k][0] <= ts:
                start, neg, name = ranges[k]
                while stack and stack[-1][0] < start:
                    stack.pop()
                if not stack:
                    tops += 1
                stack.append((start - neg, name, tops))
                k += 1
            while stack and stack[-1][0] < ts:
                stack.pop()
            out[i] = _step(stack) if stack else (None, "")
    return out


def _step(stack: list) -> tuple:
    _, name, ordinal = stack[0]
    if name.startswith(STEP_RANGE) and name[len(STEP_RANGE):].isdigit():
        return int(name[len(STEP_RANGE):]), stack[1][1] if len(stack) > 1 else ""
    return ordinal, name


def inherit(trace, parent_of: Callable[[int], Optional[int]], slots: Callable[[int], list]) -> None:
    """An op the capture's hook did not see (a composite: aten::layer_norm around
    aten::native_layer_norm) takes, per input slot, the source (trace.sources) and the writer
    (trace.writers) of an input that an op inside it read. SLOTS(op): per input slot (shape, element
    count, dtype), or None.

    A slot takes the inputs read of its own shape and dtype, else those of its element count and dtype
    (a composite that reshapes before the op inside reads); of those, told apart by source and writer
    in the order they were first read, the composite's k-th slot of that key takes the k-th (the last
    where fewer were read). One token's layer_norm reads an input [1, 1, 2048] and a weight and bias
    [2048]: by element count alone all three would take the input's source and writer. An input an
    op inside the composite wrote is its own intermediate, not one of its inputs: left out."""
    seen = set(trace.sources) | set(trace.writers)
    reads: dict = defaultdict(list)  # composite -> [(shape, count, dtype, source, writer)] in time order
    for j in sorted(seen, key=lambda j: trace.starts[j]):
        codes = trace.sources.get(j, "").split(";")
        writers = trace.writers.get(j) or []
        a = parent_of(j)
        while a is not None and a not in seen:
            for k, slot in enumerate(slots(j)):
                code = codes[k] if k < len(codes) else ""
                w = writers[k] if k < len(writers) and type(writers[k]) is int else None
                if slot is None or (w is not None and _within(w, a, parent_of)):
                    continue
                reads[a].append((*slot, code, w))
            a = parent_of(a)
    for a, read in reads.items():
        taken: dict = defaultdict(int)  # key -> slots of the composite that took an input of that key
        codes, writers = [], []
        for slot in slots(a):
            code, w = "", None
            if slot is not None:
                shape, count, dtype = slot
                key = (shape, dtype)
                pool = [r for r in read if (r[0], r[2]) == key]
                if not pool:
                    key = (count, dtype)
                    pool = [r for r in read if (r[1], r[2]) == key]
                distinct = list(dict.fromkeys((r[3], r[4]) for r in pool))
                if distinct:
                    code, w = distinct[min(taken[key], len(distinct) - 1)]
                    taken[key] += 1
            codes.append(code)
            writers.append(w)
        if any(codes) and a not in trace.sources:
            trace.sources[a] = ";".join(codes)
        if any(w is not None for w in writers) and a not in trace.writers:
            trace.writers[a] = writers


def _within(op: int, composite: int, parent_of: Callable[[int], Optional[int]]) -> bool:
    """Whether OP ran inside COMPOSITE (below it in the nesting)."""
    a = parent_of(op)
    while a is not None:
        if a == composite:
            return True
        a = parent_of(a)
    return False


ALIGN_WINDOW = 16


def matched(records: list, ops: list) -> dict:
    """Record number -> op, for a capture's records [(number, name)] and the trace's calls the hook
    saw [(op, name)], both in the order they ran. An op name with as many records as calls pairs
    them in order (the k-th with the k-th). One whose counts differ (a call the trace and the hook
    saw differently) is paired by aligning the two sequences: in step while the names agree, else
    skipping the fewest records or calls (up to ALIGN_WINDOW) that bring them back into step.

    >>> matched([(0, "a"), (1, "b"), (2, "a")], [(10, "a"), (11, "x"), (12, "b"), (13, "a")])
    {0: 10, 2: 13, 1: 12}
    """
    rec_by: dict = defaultdict(list)
    ops_by: dict = defaultdict(list)
    for r, name in records:
        rec_by[name].append(r)
    for i, name in ops:
        ops_by[name].append(i)
    out = {}
    for name, rs in rec_by.items():
        if len(rs) == len(ops_by[name]):
            out.update(zip(rs, ops_by[name]))
    if len(out) == len(records):
        return out
    uneven = {name for name, rs in rec_by.items() if len(rs) != len(ops_by[name])}
    a, b = 0, 0
    while a < len(records) and b < len(ops):
        if records[a][1] == ops[b][1]:
            if records[a][1] in uneven:
                out[records[a][0]] = ops[b][0]
            a, b = a + 1, b + 1
            continue
        skip_ops = next((d for d in range(1, ALIGN_WINDOW + 1) if b + d < len(ops)
                         and ops[b + d][1] == records[a][1]), None)
        skip_records = next((d for d in range(1, ALIGN_WINDOW + 1) if a + d < len(records)
                             and records[a + d][1] == ops[b][1]), None)
        if skip_ops is None and skip_records is None:
            a, b = a + 1, b + 1
        elif skip_records is None or (skip_ops is not None and skip_ops <= skip_records):
            b += skip_ops
        else:
            a += skip_records
    return out


def module_calls(trace, owner: Callable[[int], int], placed: dict) -> list:
    """A capture's leaf-module calls (capture._leaf_calls) in the positions of the sequence:
    [name, class, step, phase, [positions of its calls], the position that wrote its input, the
    input's shape, its dtype, the position that wrote its output]; a module none of whose ops owns
    time is left out."""
    out = []
    at = {p: (step, phase) for p, step, phase, _ in placed.values()}

    def position(op_number):
        i = trace.op_of.get(op_number) if type(op_number) is int else None
        got = placed.get(owner(i)) if i is not None else None
        return got[0] if got is not None else None

    for name, cls, start, end, writer, shape, dtype, output in trace.module_calls:
        if not (type(start) is int and type(end) is int):
            continue
        mine = sorted({p for p in (position(k) for k in range(start, end)) if p is not None})
        if not mine:
            continue
        step, phase = at[mine[0]]
        source = position(writer)
        out.append([name, cls, step, phase, mine, source if source is not None and source < mine[0] else None,
                    shape, dtype, position(output)])
    return out


def writer_of(w, op_of: dict):
    """A capture's writer of one slot as the trace's op: an op number, or a tensor list's numbers
    (version 5) as a list; None where no op of the trace wrote it."""
    if type(w) is int:
        return op_of.get(w)
    if type(w) is list:
        each = [op_of.get(x) if type(x) is int else None for x in w]
        return each if any(x is not None for x in each) else None
    return None


def type_lists(trace, i: int, dtypes: dict) -> None:
    """Write a capture's tensor-list dtypes into op i's types: ``TensorList`` -> ``TensorList(bfloat16)``."""
    shapes, types, strides, values = trace.texts[trace.shapes[i]]
    slots = types.split(";")
    for k, name in dtypes.items():
        k = int(k) if str(k).isdigit() else -1
        if 0 <= k < len(slots) and slots[k].strip() == LIST and isinstance(name, str) and name.isidentifier():
            slots[k] = f"{LIST}({name})"
    typed = ";".join(slots)
    if typed != types:
        trace.texts.append((shapes, typed, strides, values))
        trace.shapes[i] = len(trace.texts) - 1
