"""A recorded aten call -> the ``aten`` op's parameters: the overload its slots fit, encoded.

torch.profiler (record_shapes=True, torch >= 2.1) writes for every CPU op its inputs' dims,
strides and types, and the values of its scalar arguments (``Concrete Inputs``). ``bind`` picks
the overload whose schema takes the recorded slots and encodes the call in the text form that
catalog/replay.py documents and rebuilds; what it had to assume is returned with it.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, Optional

from pytest_opperf import dtypes as dtype_table
from pytest_opperf.catalog.replay import (INDEXES, SELECTING, TensorText, contiguous_strides, is_tensor_text,
                                          shape_of, short_text, tensor_texts)
from pytest_opperf.pipeline.reading.slots import LIST, dtype_of_list, is_list, torch_dtype_name


_MEMORY_FORMATS = {0: "contiguous_format", 1: "preserve_format", 2: "channels_last", 3: "channels_last_3d"}


# In-place ops that leave the same result however often they run (the timed calls repeat them on
# their own output): replayed in place. Other in-place ops replay out of place (see bind).
IDEMPOTENT = {"copy_", "fill_", "zero_", "masked_fill_", "index_put_", "_index_put_impl_", "index_copy_",
              "index_fill_", "scatter_", "clamp_", "clamp_min_", "clamp_max_", "relu_", "masked_scatter_",
              "floor_", "ceil_", "round_", "trunc_", "abs_", "nan_to_num_", "hardtanh_"}


_RANDOM = re.compile(r"rand|normal|uniform|bernoulli|dropout|multinomial|exponential|geometric|cauchy|"
                     r"log_normal|poisson")


_INDICES = "I:"  # an index list the profiler does not record, until _indices decides it


_UNINITIALISED = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "resize_", "resize"}


class Unbindable(Exception):
    """A recorded call that cannot be replayed as itself; the message says why."""


@dataclass(frozen=True)
class Bound:
    call: str          # aten::name.overload
    args: str          # the JSON text described in the module doc
    assumptions: tuple  # what was assumed, in words
    proxy: bool = False  # an assumption changes the work (an index count the trace does not hold)


def bind(op_type: str, shapes: list, strides: list, types: list, values: list, host_input: bool = False,
         list_dtype: str = "float32", host_output: bool = False) -> Bound:
    """The overload of ``op_type`` that takes these recorded slots, and its arguments encoded.

    shapes/strides: per slot a tuple of dims, None (empty or 0-dim), or a list of tuples (a
    tensor list); types: the recorded type texts; values: the recorded concrete inputs ("" when
    none); list_dtype: the dtype given to a tensor list's tensors (the trace does not type them one
    by one); host_input, host_output: the trace shows a copy from, or to, host memory (which the
    record does not say: a device argument is written without its device). Raises Unbindable with
    the reason.
    """
    import torch

    if not op_type.startswith("aten::"):
        raise Unbindable("not an aten op")
    base = op_type[len("aten::"):]
    assumptions = []
    proxy = False
    if base.endswith("_") and base not in IDEMPOTENT and hasattr(torch.ops.aten, base[:-1]):
        assumptions.append(f"replayed out of place as aten::{base[:-1]}, which also copies its first input: "
                           f"the in-place form would change its own input on every timed call")
        base, proxy = base[:-1], True
    packet = getattr(torch.ops.aten, base, None)
    if packet is None:
        raise Unbindable(f"torch {torch.__version__} has no aten::{base}")
    if _RANDOM.search(base):
        raise Unbindable(f"aten::{base} draws random numbers: no reference can check its output")
    if base in _UNINITIALISED:
        raise Unbindable(f"aten::{base} allocates without writing: its output holds nothing to check")
    slots = [_Slot(*row) for row in zip(shapes, strides or [None] * len(shapes), types,
                                        values or [""] * len(shapes))]
    problems = []
    for name, lenient in [(n, False) for n in packet.overloads()] + [(n, True) for n in packet.overloads()]:
        schema = getattr(packet, name)._schema
        try:
            args = _fit(schema, slots, list_dtype, lenient)
        except Unbindable as exc:
            problems.append(f"{name}: {exc}")
            continue
        if lenient:
            assumptions.append("a recorded scalar passed as a 0-dim tensor, or a 0-dim tensor as a number (no "
                               "overload takes it as recorded)")
        numbers = [s.dtype for s in slots if is_wrapped_number(s.dtype, s.shape)]
        if numbers:
            assumptions.append(f"a 0-dim {' and '.join(sorted(set(numbers)))} without a value is a Python number in "
                               f"arithmetic (x / 30.0): replayed as the number 2 (its value is not recorded)")
        defaulted = [a.name for a, s in zip(schema.arguments, slots) if str(a.type) == "str" and not s.value]
        if defaulted:
            assumptions.append(f"text arguments are not recorded: {', '.join(defaulted)} took the default")
        if any(isinstance(a, str) and a.startswith(_INDICES) for a in args):
            args, said, assumed = _indices(base, args)
            assumptions.append(said)
            proxy = proxy or assumed
        if host_input:
            args = _on_host(args, 1 if base == "copy_" else 0)  # copy_(dst, src): the source is on the host
            assumptions.append("the copied tensor is read from pinned host memory (the trace shows a host-to-device "
                               "copy)")
        if host_output:
            args = ["V:cpu" if a == "V:" else a for a in args] if "V:" in args else _on_host(args, 0)
            assumptions.append("the copy goes to host memory (the trace shows a device-to-host copy)")
        assumptions.extend(_contents_assumed(base, args))
        assumptions.extend(finite_assumption(args))
        if any(s.type.strip() == LIST for s in slots):
            assumptions.append(f"tensor lists hold {list_dtype} (the trace types a list only as TensorList, and no "
                               f"capture gave its dtype)")
        call = f"aten::{base}.{name}"
        return Bound(call, json.dumps(args, separators=(",", ":")), tuple(assumptions), proxy)
    if not problems:
        raise Unbindable(f"aten::{base} has no overloads")
    raise Unbindable(f"no overload of aten::{base} takes the recorded arguments ({problems[0]})")


@dataclass(frozen=True)
class _Slot:
    shape: Any
    stride: Any
    type: str
    value: str

    @property
    def dtype(self) -> Optional[str]:
        return torch_dtype_name(self.type)


def _fit(schema, slots: list, list_dtype: str, lenient: bool = False) -> list:
    arguments = schema.arguments
    if len(arguments) != len(slots):
        raise Unbindable(f"{len(arguments)} arguments, {len(slots)} recorded")
    # An out= overload (aten::where.self_out) binds like any other: the profiler records its out
    # tensor in the slot of its keyword, and the replay passes a tensor of that shape there.
    return [_argument(a, s, list_dtype, lenient) for a, s in zip(arguments, slots)]


def _argument(arg, slot: _Slot, list_dtype: str, lenient: bool):
    kind = str(getattr(arg, "real_type", arg.type))
    optional = kind.startswith("Optional[")
    inner = kind[len("Optional["):-1] if optional else kind
    if slot.dtype is not None:  # a recorded tensor (0-dim when its shape is empty)
        return _tensor_argument(arg.name, kind, inner, slot, lenient)
    if is_list(slot.type):
        if not inner.startswith("List[") or "Tensor" not in inner:
            raise Unbindable(f"{arg.name}: a tensor list was recorded for a {kind}")
        # A list of one tensor is written as that tensor's dims (no '+' between tensors).
        shapes = slot.shape if isinstance(slot.shape, list) else [slot.shape or ()]
        strides = slot.stride if isinstance(slot.stride, list) else [slot.stride] * len(shapes)
        dtype = dtype_of_list(slot.type) or list_dtype
        return [_tensor(dtype, s or (), st or None) for s, st in zip(shapes, strides)]
    if inner == "List[Optional[Tensor]]" and slot.value:
        return _INDICES + str(_captured_count(slot.value))  # its length, from a capture (pipeline/capture.py)
    if slot.value == "" or slot.value is None:
        if inner == "Device":
            return "V:"  # a device the profiler did not write down: the case's
        if inner == "List[Optional[Tensor]]":
            return _INDICES  # not recorded by the profiler: see _indices
        if arg.has_default_value():
            return _default(arg)
        if optional:
            return None
        raise Unbindable(f"{arg.name}: a {kind} without a recorded value")
    if inner == "Tensor":
        if not lenient:
            raise Unbindable(f"{arg.name}: a number was recorded for a Tensor")
        return "T:fp32[]"
    return _scalar(arg.name, inner, slot.value)


def _wrapped_number(dtype: Optional[str]):
    """Python numbers in arithmetic (``x / 30.0``, ``x + 1``) reach aten as 0-dim tensors of torch's
    widest float and int (float64, int64), recorded with dims [] and no value; the replay passes a
    number of the same kind: 2.0 or 2, None for a dtype no Python number becomes."""
    try:
        found = dtype_table.lookup(dtype or "", any_tensor=True)
    except KeyError:
        return None
    if found.itemsize != 8 or found.kind not in ("float", "int"):
        return None
    return 2.0 if found.kind == "float" else 2


def is_wrapped_number(dtype: Optional[str], shape) -> bool:
    """Was a recorded 0-dim tensor a Python number? (see docs/pipeline.md: a 0-dim double or int64)

    >>> is_wrapped_number("float64", None), is_wrapped_number("float32", ()), is_wrapped_number("int64", (4,))
    (True, False, False)
    """
    return _wrapped_number(dtype) is not None and not shape


def _tensor_argument(name: str, kind: str, inner: str, slot: "_Slot", lenient: bool):
    """A recorded tensor for a schema slot: a Python number (a wrapped one) goes into a Scalar slot
    as a number; other tensors only into Tensor slots. The lenient pass takes a wrapped number into
    a Tensor slot as a 0-dim host tensor (the kernel reads it as a scalar operand, as it read the
    number) and any other 0-dim tensor into a Scalar slot as a number."""
    wrapped = is_wrapped_number(slot.dtype, slot.shape)
    if inner in ("Scalar", "number"):
        if wrapped or (lenient and not slot.shape):
            return _wrapped_number(slot.dtype) or (2.0 if "float" in slot.dtype else 2)
        raise Unbindable(f"{name}: a tensor was recorded for a {kind}")
    if inner != "Tensor":
        raise Unbindable(f"{name}: a tensor was recorded for a {kind}")
    if wrapped:
        if not lenient:
            raise Unbindable(f"{name}: a Python number (a 0-dim {slot.dtype}) was recorded for a Tensor")
        return _tensor(slot.dtype, (), None) + "@host"
    text = _tensor(slot.dtype, slot.shape or (), slot.stride or None)
    captured = _captured(slot.value)
    return f"{text}={','.join(map(str, captured))}" if captured else text


def _captured(value: str) -> tuple:
    """An integer tensor's contents a capture put in its Concrete Inputs slot ("[3, 9, 12]"), else ()."""
    try:
        data = json.loads(value) if value and value.lstrip().startswith("[") else None
    except ValueError:
        return ()
    return tuple(data) if isinstance(data, list) and data and all(type(v) is int for v in data) else ()


def _captured_count(value: str) -> str:
    """A capture's index count, and the dim it indexes where not dim 0: "12", "1@2"."""
    try:
        record = json.loads(value)
        count, dim = record.get("count"), record.get("dim")
    except (ValueError, AttributeError):
        return ""
    if not (type(count) is int and count > 0):
        return ""
    return f"{count}@{dim}" if type(dim) is int and dim > 0 else str(count)


def _tensor(dtype: str, shape: tuple, stride) -> str:
    text = f"T:{short_text(dtype)}[{','.join(map(str, shape))}]"
    if stride is not None and tuple(stride) != contiguous_strides(shape):
        text += "/" + ",".join(map(str, stride))
    return text


def _default(arg):
    value = arg.default_value
    if isinstance(value, float) and not math.isfinite(value):
        return f"F:{value}"
    if isinstance(value, (bool, int, float, str, list)) or value is None:
        return value
    raise Unbindable(f"{arg.name}: not recorded, and its default {value!r} is not one this replay can pass")


def _scalar(name: str, kind: str, text: str):
    text = text.strip()
    if kind == "ScalarType":
        code = int(text)
        dtype = dtype_table.of_scalar_type(code)
        if dtype is None:
            raise Unbindable(f"{name}: dtype code {code} is not one this replay knows")
        return f"D:{dtype.torch_name}"
    if kind == "MemoryFormat":
        return f"M:{_MEMORY_FORMATS.get(int(text), 'contiguous_format')}"
    if kind == "Layout":
        return "L:strided"
    if kind == "Device":
        return "V:"
    if kind.startswith("List["):
        try:
            return [int(v) for v in json.loads(text)]
        except (ValueError, TypeError):
            raise Unbindable(f"{name}: {text!r} is not a list of integers") from None
    if text in ("True", "False"):
        return text == "True"
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        raise Unbindable(f"{name}: {text!r} is not a number") from None
    return value if math.isfinite(value) else f"F:{value}"


def finite_assumption(args: list) -> list:
    """The assumption stated when a recorded scalar is not finite (see _value)."""
    return ["non-finite scalars (inf, nan) replaced by finite ones of the same sign (the same cost; the "
            "check can read the output)"] if any(isinstance(a, str) and a.startswith("F:") for a in args) else []


def _indices(base: str, args: list) -> tuple:
    """The index list of aten::index / index_put, which the profiler leaves out: one int64 index
    over the first dim, as long as index_put's values (exact), or as the indexed rows (assumed)."""
    self_shape = shape_of(args[0]) or (1,)
    values = shape_of(args[2]) if base.rstrip("_") in ("index_put", "_index_put_impl") and len(args) > 2 else None
    text = next((a[len(_INDICES):] for a in args if isinstance(a, str) and a.startswith(_INDICES)), "")
    counted, _, at = text.partition("@")
    captured = int(counted) if counted.isdigit() else None
    dim = int(at) if captured and at.isdigit() and int(at) < len(self_shape) else 0
    if captured:
        count, said, proxy = captured, (f"indices: one int64 index over dim {dim}, as many as the capture "
                                        f"counted"), False
    elif values:
        count, said, proxy = values[0], "indices: one int64 index over dim 0, as many as the values", False
    else:
        count = self_shape[0]
        said = (f"indices are not recorded: assumed one int64 index over dim 0 picking {count} distinct rows "
                f"(the op's time depends on how many it picks)")
        proxy = True
    out = [[None] * dim + [f"T:i64[{count}]"] if isinstance(a, str) and a.startswith(_INDICES) else a for a in args]
    return out, said, proxy


def _on_host(args: list, which: int = 0) -> list:
    """The WHICH-th tensor (0: the first) in host memory (a Python number bound as a 0-dim host
    tensor already is)."""
    out = list(args)
    seen = 0
    for i, a in enumerate(out):
        if is_tensor_text(a):
            if seen == which:
                out[i] = a if a.endswith("@host") else a + "@host"
                break
            seen += 1
    return out


def _contents_assumed(base: str, args: list) -> list:
    said = []
    kinds = {TensorText.parse(a).dtype for a in tensor_texts(args)}
    if base.rstrip("_") in INDEXES or base.rstrip("_") in ("index", "index_put", "_index_put_impl", "bincount", "one_hot"):
        said.append("indices uniform over the dimension they index")
    elif any(_kind(k) == "int" for k in kinds) and base != "_grouped_mm":
        said.append("integer inputs uniform in [0, the smallest dimension of the call)")
    if base == "_grouped_mm" and not (len(args) > 2 and "=" in str(args[2])):
        said.append("offsets split the rows into equal groups (the trace does not hold them)")
    elif base == "_grouped_mm":
        said.append("offsets as they ran (from the capture file beside the trace)")
    if any(_kind(k) == "bool" for k in kinds):
        said.append("masks random (half true)")
    if base in SELECTING:
        said.append("inputs hold distinct values, so every correct kernel selects the same elements")
    return said


def _kind(short: str) -> str:
    """float, int, bool or complex for a tensor text's dtype; "" for one the table does not know."""
    try:
        return dtype_table.lookup(short, any_tensor=True).kind
    except KeyError:
        return ""
