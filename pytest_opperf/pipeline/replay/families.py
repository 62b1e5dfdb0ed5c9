"""A call's kernel family and where it sits in it: what lookup interpolates over.

Rows of one family run one kernel on other sizes, so their time is a smooth function of the sizes
that set the kernel's work, and a call between measured neighbours is read off that function in log
space (log time over log size):

- a catalogue op (gemm, attention_prefill, attention_decode, add, softmax, embedding, ...): the family
  is its parameters that are not ints; the axes are its int parameters (attention: batch and the query
  or KV length at fixed heads and head size; gemm: m at fixed n and k);
- an ``aten`` replay of a GEMM with a weight (linear, mm, addmm, _grouped_mm): the family is the call,
  the weight's shape and every operand's dtype and layout; the axis is M, the rows (a _grouped_mm's
  rows over all its experts: the routing spreads them as it does at every size);
- an ``aten`` bmm, baddbmm or matmul (two activations): the family is the call, the operands' dtypes,
  layouts and inner size; the axis is the multiply-adds;
- any other ``aten`` call (memory-bound: elementwise, copies, norms, reductions, indexing): the family
  is the call, each tensor argument's dtype, innermost size, contiguity and whether it is smaller than
  the largest (broadcast), and the other arguments' values; the axis is the bytes its tensors hold. A call without tensor arguments (arange)
  sits at its largest int argument.

``estimate`` reads a call's time off its family's points: along one axis between the nearest measured
neighbours, or two (an axis's lines first, then across them: bilinear where the four corners were
measured); past the grid's end only with ``extrapolated`` set, flat below its smallest point and along
its last segment's slope (between 0 and 2) up to twice its largest; a line of one point is not extended.
"""

from __future__ import annotations

import json
import math
from itertools import permutations
from typing import Optional

from pytest_opperf.catalog.replay import TensorText, is_tensor_text

WEIGHTED = {"aten::linear": (0, 1), "aten::mm": (0, 1), "aten::addmm": (1, 2), "aten::_grouped_mm": (0, 1)}
BATCHED = {"aten::bmm", "aten::baddbmm", "aten::matmul"}
REACH = 2.0  # the furthest past the largest measured size an answer is extrapolated (a factor)


def place(op: str, params: dict, int_params: tuple) -> Optional[tuple]:
    """(family, axes, coordinates) of a call with these parameters; None where its sizes cannot be read."""
    if op != "aten":
        axes = tuple(p for p in int_params if isinstance(params.get(p), int) and params[p] > 0)
        family = (op, tuple(sorted((k, str(v)) for k, v in params.items() if k not in axes)))
        return family, axes, tuple(params[p] for p in axes)
    try:
        call, args = params["call"].partition(".")[0], json.loads(params["args"])
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    if not isinstance(args, list):
        return None
    tensors = [(i, _tensor(a)) for i, a in enumerate(args) if is_tensor_text(a)]
    if any(t is None for _, t in tensors):
        return None
    if call in WEIGHTED and len(tensors) >= 2:
        (_, x), (_, w) = tensors[WEIGHTED[call][0]], tensors[WEIGHTED[call][1]]
        rows = math.prod(x.shape[:-1]) if call != "aten::_grouped_mm" else (x.shape[0] if x.shape else 0)
        forms = tuple((t.dtype, t.shape, t.stride) if t is w else (t.dtype, _contiguous(t)) for _, t in tensors)
        return ("aten", params["call"], forms, _scalars(args)), ("m",), (rows,)
    if call in BATCHED and len(tensors) >= 2:
        (_, a), (_, b) = tensors[-2], tensors[-1]
        if len(a.shape) < 2 or len(b.shape) < 2:
            return None
        work = math.prod(a.shape) * b.shape[-1]
        forms = tuple((t.dtype, _contiguous(t)) for _, t in tensors)
        return ("aten", params["call"], forms, a.shape[-1], _scalars(args)), ("macs",), (work,)
    listed = [[t for t in map(_tensor, a) if t] for a in args if isinstance(a, list) and any(map(is_tensor_text, a))]
    every = [t for _, t in tensors] + [t for ts in listed for t in ts]
    if not every:
        ints = [abs(a) for a in args if isinstance(a, int) and not isinstance(a, bool)]
        return ("aten", params["call"], _texts(args)), ("size",), (max(ints, default=1),)
    held = sum(t.numel * _itemsize(t.dtype) for t in every)
    most = max((t.numel for t in every), default=0)
    forms = tuple(_form(t, most) for _, t in tensors)
    lists = tuple(tuple(_form(t, most) for t in ts) for ts in listed)
    return ("aten", params["call"], forms, lists, _scalars(args)), ("bytes",), (max(held, 1),)


def _tensor(text) -> Optional[TensorText]:
    try:
        return TensorText.parse(text)
    except ValueError:
        return None


def _itemsize(short: str) -> int:
    from pytest_opperf import dtypes

    try:
        return dtypes.lookup(short, any_tensor=True).itemsize
    except KeyError:
        return 4


def _form(t: TensorText, most: int) -> tuple:
    """What of a memory-bound call's tensor sets its kernel, whatever the batch and length: its dtype,
    its innermost size where it has rows (a row's width: a norm over 4096 is not one over 128), whether it is a
    contiguous tensor or a view with gaps or another order, and whether it is smaller than the
    call's largest tensor (broadcast, or one of unequal parts)."""
    return t.dtype, t.shape[-1] if len(t.shape) > 1 else 0, _contiguous(t), t.numel < most


def _contiguous(t: TensorText) -> bool:
    """Row-major without gaps over its dims that are not 1 (which of a view's dims are 1 changes nothing)."""
    dims = [(d, s) for d, s in zip(t.shape, t.stride) if d != 1]
    return all(s == 1 if i == len(dims) - 1 else s == dims[i + 1][0] * dims[i + 1][1] for i, (_, s) in enumerate(dims))


def _scalars(args: list) -> tuple:
    """The arguments that are not tensors (dims, flags, dtypes, small constants), as texts."""
    return tuple(json.dumps(a) for a in args if not is_tensor_text(a) and not (
        isinstance(a, list) and any(is_tensor_text(x) for x in a)))


def _texts(args: list) -> tuple:
    return tuple(json.dumps(a) for a in args if not (isinstance(a, int) and not isinstance(a, bool)))


def estimate(points: dict, target: tuple, axes: tuple) -> Optional[tuple]:
    """(log time, how, extrapolated) of TARGET from POINTS (coordinates -> log time) on AXES, along
    one axis where the other coordinates are the target's, else two; None when no line passes near."""
    near = []  # the points off the target on two axes at most, with those axes
    for c, t in points.items():
        off = frozenset(i for i in range(len(target)) if c[i] != target[i])
        if len(off) <= 2:
            near.append((c, t, off))
    varying = sorted(set().union(*(off for _, _, off in near))) or [0]
    best = None
    for axis in varying:
        line = {c[axis]: t for c, t, off in near if off <= {axis}}
        got = _line(line, target[axis], axes[axis])
        if got is not None:
            best = _better(best, (got[0], got[1], got[2], got[3]))
    if best is None or best[2]:
        for a, b in permutations(varying, 2):
            plane = [(c, t) for c, t, off in near if off <= {a, b}]
            if not plane:
                continue
            across = {}
            for value in {c[a] for c, _ in plane}:
                got = _line({c[b]: t for c, t in plane if c[a] == value}, target[b], axes[b])
                if got is not None and not got[2]:
                    across[value] = got
            got = _line({v: g[0] for v, g in across.items()}, target[a], axes[a])
            if got is not None:
                best = _better(best, (got[0], got[1] + max(across[v][1] for v in got[4]), got[2],
                                      f"{got[3]}, each {' '.join(sorted({across[v][3] for v in got[4]}))}"))
    if best is None:
        return None
    return best[0], best[3], best[2]


def _better(best, new):
    """Interpolated before extrapolated, then the narrower span."""
    if best is None or (new[2], new[1]) < (best[2], best[1]):
        return new
    return best


def _line(line: dict, x, name: str) -> Optional[tuple]:
    """(log time, span, extrapolated, said, the points used) at X along a line of size -> log time;
    past its ends only where it has two points at least."""
    if not line or x <= 0:
        return None
    if x in line:
        return line[x], 0.0, False, f"{name}={x}", (x,)
    below = sorted(v for v in line if 0 < v < x)
    above = sorted(v for v in line if v > x)
    if below and above:
        lo, hi = below[-1], above[0]
        f = math.log(x / lo) / math.log(hi / lo)
        return (line[lo] + f * (line[hi] - line[lo]), math.log(hi / lo), False,
                f"between {name}={lo} and {name}={hi}", (lo, hi))
    if len(line) < 2:
        return None
    if above:  # smaller than any point: no faster than the smallest measured
        return (line[above[0]], math.log(above[0] / x), True, f"below the smallest measured, {name}={above[0]}",
                (above[0],))
    top, prev = below[-1], below[-2]
    if x > REACH * top:
        return None
    slope = min(max((line[top] - line[prev]) / math.log(top / prev), 0.0), 2.0)
    return (line[top] + slope * math.log(x / top), math.log(x / top), True,
            f"past the largest measured, {name}={top}, at its last slope {slope:.2f}", (top,))


def held_out(points: dict, axes: tuple) -> list:
    """Each point that has measured neighbours on both sides, estimated from the others with itself
    held out: the relative errors (the grid's spacing doubled there, so an upper estimate)."""
    if len(axes) == 1:  # a line: each inner point from the two beside it
        line = sorted((c[0], t) for c, t in points.items())
        return [math.exp(lo_t + math.log(x / lo) / math.log(hi / lo) * (hi_t - lo_t) - t) - 1
                for (lo, lo_t), (x, t), (hi, hi_t) in zip(line, line[1:], line[2:])]
    errors = []
    for c, t in points.items():
        rest = {k: v for k, v in points.items() if k != c}
        got = estimate(rest, c, axes)
        if got is not None and not got[2]:
            errors.append(math.exp(got[0] - t) - 1)
    return errors
