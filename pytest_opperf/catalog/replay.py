"""A recorded aten call, replayed as itself: the ``aten`` op's parameters and how they are read.

torch.profiler (record_shapes=True, torch >= 2.1) writes for every CPU op its inputs' dims,
strides and types, and the values of its scalar arguments (``Concrete Inputs``). That is enough
to call the same overload again with tensors of the same shapes, strides and dtypes: ``bind``
picks the overload whose schema fits the recorded slots and encodes the call as two texts, the
``aten`` op's parameters ``call`` (``aten::topk.default``) and ``args`` (JSON, one entry per
schema argument)::

    null                     an absent optional argument
    8, -1, true, 1e-05       an int, a float, a bool (inf and nan as "F:inf", "F:-inf", "F:nan")
    [4096, 128]              an int list
    "T:bf16[64,512]"         a contiguous tensor; "T:bf16[512,64]/1,512" with its strides;
                             "T:fp32[]" a 0-dim tensor; a trailing "@host" keeps it in host memory
    ["T:...", "T:..."]       a tensor list
    "D:bfloat16"             a dtype, "L:strided" a layout, "M:contiguous_format" a memory format,
    "V:"                     a device: the case's

What the trace does not hold is filled by stated assumptions, listed on the signature: index
tensors hold indices within the dimension they index (uniform), grouped-GEMM offsets split the
rows into equal groups, masks are random, inputs of ops that select by value (topk, sort,
argmax, ...) hold distinct values, so every correct kernel picks the same elements, and an
in-place op (``add_``) is replayed as its out-of-place form (``add``): the in-place one changes
its own input on every timed call.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Optional

# Profiler spellings of tensor dtypes -> (torch attribute, short name used in the args text).
_DTYPES = {
    "float": "float32", "double": "float64", "c10::half": "float16", "c10::bfloat16": "bfloat16",
    "long int": "int64", "long": "int64", "int": "int32", "short int": "int16", "short": "int16",
    "signed char": "int8", "unsigned char": "uint8", "bool": "bool",
    "c10::float8_e4m3fn": "float8_e4m3fn", "c10::float8_e5m2": "float8_e5m2",
    "c10::complex<float>": "complex64",
}
_SHORT = {"float32": "fp32", "float64": "fp64", "float16": "fp16", "bfloat16": "bf16", "int64": "i64",
          "int32": "i32", "int16": "i16", "int8": "i8", "uint8": "u8", "bool": "b1",
          "float8_e4m3fn": "fp8", "float8_e5m2": "fp8_e5m2", "complex64": "c64"}
_LONG = {v: k for k, v in _SHORT.items()}
# c10::ScalarType codes (dtype arguments are recorded as these numbers).
_SCALAR_TYPES = {0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 5: "float16", 6: "float32",
                 7: "float64", 9: "complex64", 11: "bool", 15: "bfloat16", 23: "float8_e5m2", 24: "float8_e4m3fn"}
_MEMORY_FORMATS = {0: "contiguous_format", 1: "preserve_format", 2: "channels_last", 3: "channels_last_3d"}

# Ops that pick elements by value: their floating inputs get distinct values (see module doc).
SELECTING = {"topk", "sort", "argsort", "argmax", "argmin", "max", "min", "kthvalue", "median", "nanmedian",
             "mode", "msort", "sort_values"}
# op name -> {index argument: (the tensor argument it indexes, its dim argument or a fixed dim)}
_INDEXES = {
    "index_select": {2: (0, 1)}, "gather": {2: (0, 1)}, "scatter": {2: (0, 1)}, "scatter_add": {2: (0, 1)},
    "scatter_reduce": {2: (0, 1)}, "index_add": {2: (0, 1)}, "index_copy": {2: (0, 1)},
    "index_fill": {2: (0, 1)}, "take_along_dim": {1: (0, 2)}, "embedding": {1: (0, "0")},
    "embedding_dense_backward": {1: (0, "0")},
}
_RANDOM = re.compile(r"rand|normal|uniform|bernoulli|dropout|multinomial|exponential|geometric|cauchy|"
                     r"log_normal|poisson")
_INDICES = "I:"  # an index list the profiler does not record, until _indices decides it
_UNINITIALISED = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "resize_", "resize"}
_TENSOR_RE = re.compile(r"^T:(\w+)\[([0-9,]*)\](?:/([0-9,]*))?(@host)?$")


class Unbindable(Exception):
    """A recorded call that cannot be replayed as itself; the message says why."""


@dataclass(frozen=True)
class Bound:
    call: str          # aten::name.overload
    args: str          # the JSON text described in the module doc
    assumptions: tuple  # what was assumed, in words
    proxy: bool = False  # an assumption changes the work (an index count the trace does not hold)


def torch_dtype_name(profiled: str) -> Optional[str]:
    """torch's name for a profiler's tensor dtype spelling, None when it is not one.

    >>> torch_dtype_name("c10::BFloat16"), torch_dtype_name("long int"), torch_dtype_name("Scalar")
    ('bfloat16', 'int64', None)
    """
    return _DTYPES.get((profiled or "").strip().lower())


def bind(op_type: str, shapes: list, strides: list, types: list, values: list, host_input: bool = False,
         list_dtype: str = "float32") -> Bound:
    """The overload of ``op_type`` that takes these recorded slots, and its arguments encoded.

    shapes/strides: per slot a tuple of dims, None (empty or 0-dim), or a list of tuples (a
    tensor list); types: the recorded type texts; values: the recorded concrete inputs ("" when
    none); list_dtype: the dtype given to a tensor list's tensors (the trace does not type them one
    by one). Raises Unbindable with the reason.
    """
    import torch

    if not op_type.startswith("aten::"):
        raise Unbindable("not an aten op")
    base = op_type[len("aten::"):]
    assumptions = []
    if base.endswith("_") and not base.startswith("_") and hasattr(torch.ops.aten, base[:-1]):
        assumptions.append(f"replayed out of place as aten::{base[:-1]} (the in-place form changes its input "
                           f"on every timed call)")
        base = base[:-1]
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
            assumptions.append("a recorded scalar passed as a 0-dim tensor (no overload takes it as a number)")
        defaulted = [a.name for a, s in zip(schema.arguments, slots) if str(a.type) == "str" and not s.value]
        if defaulted:
            assumptions.append(f"text arguments are not recorded: {', '.join(defaulted)} took the default")
        proxy = False
        if _INDICES in args:
            args, said, proxy = _indices(base, args)
            assumptions.append(said)
        if host_input:
            args = _on_host(args)
            assumptions.append("the first tensor is read from pinned host memory (the trace shows a host-to-device "
                               "copy)")
        assumptions.extend(_contents_assumed(base, args))
        assumptions.extend(finite_assumption(args))
        if any(s.type == "TensorList" for s in slots):
            assumptions.append(f"tensor lists hold {list_dtype} (the trace types a list only as TensorList)")
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
    if any(a.alias_info is not None and a.alias_info.is_write for a in arguments):
        raise Unbindable("writes into an argument (an out= or in-place form)")
    return [_argument(a, s, list_dtype, lenient) for a, s in zip(arguments, slots)]


def _argument(arg, slot: _Slot, list_dtype: str, lenient: bool):
    kind = str(getattr(arg, "real_type", arg.type))
    optional = kind.startswith("Optional[")
    inner = kind[len("Optional["):-1] if optional else kind
    if slot.dtype is not None:  # a recorded tensor (0-dim when its shape is empty)
        if inner not in ("Tensor", "Scalar", "number"):
            raise Unbindable(f"{arg.name}: a tensor was recorded for a {kind}")
        return _tensor(slot.dtype, slot.shape or (), slot.stride or None)
    if slot.type == "TensorList":
        if not inner.startswith("List[") or "Tensor" not in inner:
            raise Unbindable(f"{arg.name}: a tensor list was recorded for a {kind}")
        if not isinstance(slot.shape, list):
            raise Unbindable(f"{arg.name}: a tensor list without its tensors' dims")
        strides = slot.stride if isinstance(slot.stride, list) else [None] * len(slot.shape)
        # The trace types a list only as 'TensorList': its tensors take the profile's main dtype.
        return [_tensor(list_dtype, s, st) for s, st in zip(slot.shape, strides)]
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


def _tensor(dtype: str, shape: tuple, stride) -> str:
    text = f"T:{_SHORT.get(dtype, dtype)}[{','.join(map(str, shape))}]"
    if stride is not None and tuple(stride) != _contiguous(shape):
        text += "/" + ",".join(map(str, stride))
    return text


def _contiguous(shape) -> tuple:
    out, step = [], 1
    for d in reversed(shape):
        out.append(step)
        step *= max(d, 1)
    return tuple(reversed(out))


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
        if code not in _SCALAR_TYPES:
            raise Unbindable(f"{name}: dtype code {code} is not one this replay knows")
        return f"D:{_SCALAR_TYPES[code]}"
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
    self_shape = _shape_of(args[0]) or (1,)
    values = _shape_of(args[2]) if base in ("index_put", "_index_put_impl") and len(args) > 2 else None
    if values:
        count, said, proxy = values[0], "indices: one int64 index over dim 0, as many as the values", False
    else:
        count = self_shape[0]
        said = (f"indices are not recorded: assumed one int64 index over dim 0 picking {count} distinct rows "
                f"(the op's time depends on how many it picks)")
        proxy = True
    out = [[f"T:i64[{count}]"] if a == _INDICES else a for a in args]
    return out, said, proxy


def _on_host(args: list) -> list:
    out = list(args)
    for i, a in enumerate(out):
        if isinstance(a, str) and a.startswith("T:"):
            out[i] = a + "@host"
            break
    return out


def _contents_assumed(base: str, args: list) -> list:
    said = []
    kinds = {_TENSOR_RE.match(a).group(1) for a in _tensors(args)}
    if base in _INDEXES or base in ("index", "index_put", "_index_put_impl", "bincount", "one_hot"):
        said.append("indices uniform over the dimension they index")
    elif kinds & {"i64", "i32", "i16", "i8", "u8"} and base != "_grouped_mm":
        said.append("integer inputs uniform in [0, the smallest dimension of the call)")
    if base == "_grouped_mm":
        said.append("offsets split the rows into equal groups (the trace does not hold them)")
    if "b1" in kinds:
        said.append("masks random (half true)")
    if base in SELECTING:
        said.append("inputs hold distinct values, so every correct kernel selects the same elements")
    return said


def _tensors(args):
    for a in args:
        if isinstance(a, str) and a.startswith("T:"):
            yield a
        elif isinstance(a, list):
            yield from (x for x in a if isinstance(x, str) and x.startswith("T:"))


# ---- replay: the aten op's inputs, backend and reference ----

@dataclass(eq=False)
class Replay:
    """The overload to call and how its arguments split into positional and keyword ones."""

    call: str
    positional: int
    keywords: tuple
    originals: dict = field(default_factory=dict)

    def __call__(self, *args):
        return self.overload(*args[:self.positional], **dict(zip(self.keywords, args[self.positional:])))

    @property
    def overload(self):
        import torch

        name, _, overload = self.call[len("aten::"):].partition(".")
        return getattr(getattr(torch.ops.aten, name), overload or "default")

    @property
    def name(self) -> str:
        return self.call[len("aten::"):].partition(".")[0]

    def __repr__(self) -> str:
        return self.call


def parse_call(call: str):
    """The overload a ``call`` parameter names; ValueError naming what is wrong."""
    import torch

    if not call.startswith("aten::"):
        raise ValueError(f"aten: call={call!r}: expected aten::<name>.<overload>")
    name, _, overload = call[len("aten::"):].partition(".")
    packet = getattr(torch.ops.aten, name, None)
    if packet is None or (overload or "default") not in packet.overloads():
        raise ValueError(f"aten: call={call!r}: this torch ({torch.__version__}) has no such overload")
    return getattr(packet, overload or "default")


def decode_args(call: str, args: str) -> list:
    try:
        values = json.loads(args)
    except ValueError as exc:
        raise ValueError(f"aten: args={args!r} is not JSON ({exc})") from None
    schema = parse_call(call)._schema
    if not isinstance(values, list) or len(values) != len(schema.arguments):
        raise ValueError(f"aten: args must be a list of {len(schema.arguments)} values for {call}")
    return values


def build(call: str, args: str, device, gen) -> tuple:
    """(Replay, *arguments) for the recorded call: tensors filled as the module doc says."""
    import torch

    values = decode_args(call, args)
    schema = parse_call(call)._schema
    replay = Replay(call, sum(not a.kwarg_only for a in schema.arguments),
                    tuple(a.name for a in schema.arguments if a.kwarg_only))
    shapes = [_shape_of(v) for v in values]
    built = []
    for i, value in enumerate(values):
        built.append(_value(value, i, replay.name, shapes, device, gen, torch))
    _fill_indices(replay.name, built, values, gen, torch)
    return (replay, *built)


def _shape_of(value):
    if isinstance(value, str) and value.startswith("T:"):
        m = _TENSOR_RE.match(value)
        return tuple(int(d) for d in m.group(2).split(",") if d)
    return None


def _value(value, index: int, name: str, shapes: list, device, gen, torch):
    if isinstance(value, list) and value and all(isinstance(v, str) and v.startswith("T:") for v in value):
        return [_value(v, index, name, shapes, device, gen, torch) for v in value]
    if not isinstance(value, str):
        return value
    tag, _, rest = value.partition(":")
    if tag == "F":
        # -inf, inf and nan fill and clamp at the cost of any number: a finite stand-in keeps the
        # output readable by the check (which refuses non-finite outputs).
        value = float(rest)
        return 0.0 if math.isnan(value) else math.copysign(1e4, value)
    if tag == "D":
        return getattr(torch, rest)
    if tag == "M":
        return getattr(torch, rest)
    if tag == "L":
        return torch.strided
    if tag == "V":
        return torch.device(device)
    if tag != "T":
        return value
    m = _TENSOR_RE.match(value)
    if m is None:
        raise ValueError(f"aten: {value!r} is not a tensor's text (T:<dtype>[dims] or T:<dtype>[dims]/strides)")
    dtype = getattr(torch, _LONG.get(m.group(1), m.group(1)))
    shape = tuple(int(d) for d in m.group(2).split(",") if d)
    stride = tuple(int(d) for d in m.group(3).split(",") if d) if m.group(3) is not None else _contiguous(shape)
    host = bool(m.group(4))
    where = "cpu" if host else device
    extent = 1 + sum((d - 1) * s for d, s in zip(shape, stride)) if all(shape) else 0
    storage = _random(extent, dtype, name, shapes, where, gen, torch)
    out = storage.as_strided(shape, stride)
    return out.pin_memory() if host and torch.cuda.is_available() else out


def _random(n: int, dtype, name: str, shapes: list, device, gen, torch):
    gen_device = gen.device if gen is not None else torch.device("cpu")
    if dtype == torch.bool:
        return torch.rand(n, generator=gen, device=gen_device).lt(0.5).to(device)
    if not dtype.is_floating_point and not dtype.is_complex:
        bound = min([d for s in shapes if s for d in s if d > 0] or [2])
        return torch.randint(0, max(1, min(bound, 2 ** 15)), (n,), generator=gen, device=gen_device).to(device, dtype)
    if name in SELECTING:
        return _distinct(n, dtype, gen, gen_device, torch).to(device)
    return torch.randn(n, generator=gen, device=gen_device, dtype=torch.float32).to(device, dtype)


def _distinct(n: int, dtype, gen, gen_device, torch):
    """n values of dtype, all different where the dtype has that many, in random order."""
    if dtype.itemsize >= 4:
        ranks = torch.randperm(n, generator=gen, device=gen_device).to(torch.float64)
        return ((ranks - n / 2) / max(n, 1)).to(dtype)
    bits = torch.arange(-2 ** 15, 2 ** 15, dtype=torch.int32).to(torch.int16).view(dtype)
    table = torch.unique(bits[torch.isfinite(bits.float())].float())
    table = table[table.abs() < 1e4]  # no overflow in a softmax or sum downstream of the pick
    picks = torch.randperm(max(n, 1), generator=gen, device=gen_device).cpu() % table.numel()
    return table[picks[:n]].to(gen_device, dtype)


def _fill_indices(name: str, built: list, values: list, gen, torch) -> None:
    """Index and offset tensors get valid contents: within the dimension they index, or equal groups."""
    if name == "_grouped_mm" and len(built) > 2 and isinstance(built[2], torch.Tensor):
        rows = built[0].shape[-2] if built[0].dim() == 2 else 0
        groups = built[2].numel()
        if rows:
            ends = [rows * (g + 1) // groups for g in range(groups)]
            built[2].copy_(torch.tensor(ends, dtype=built[2].dtype))
        return
    if name in ("index", "index_put", "_index_put_impl") and len(built) > 1 and isinstance(built[1], list):
        size = built[0].shape[0] if built[0].dim() else 1
        for k, t in enumerate(built[1]):
            if isinstance(t, torch.Tensor) and not t.dtype.is_floating_point and t.dtype != torch.bool:
                picks = torch.randperm(size, generator=gen, device=gen.device if gen is not None else "cpu")
                picks = picks[:t.numel()] if t.numel() <= size else picks[torch.randint(0, size, (t.numel(),))]
                t.copy_(picks.reshape(t.shape).to(t.device, t.dtype))
        return
    for index, (target, dim_arg) in _INDEXES.get(name, {}).items():
        if index >= len(built) or not isinstance(built[index], torch.Tensor) or not isinstance(built[target], torch.Tensor):
            continue
        dim = int(dim_arg) if isinstance(dim_arg, str) else built[dim_arg]
        size = built[target].shape[dim] if built[target].dim() else 1
        t = built[index]
        t.copy_(torch.randint(0, max(size, 1), t.shape, generator=gen,
                              device=gen.device if gen is not None else "cpu").to(t.device, t.dtype))


def tensors_of(out):
    """An output the check can read: a number (aten::item's) as a 0-dim tensor, a list as a tuple."""
    import torch

    if isinstance(out, (tuple, list)):
        return tuple(tensors_of(o) for o in out)
    if isinstance(out, (bool, int, float)):
        return torch.tensor(out)
    return out


def reference(replay: Replay, *args):
    """The same overload on the CPU, floating inputs in float64, outputs in the dtypes the device's are."""
    import torch

    def lift(a, to64: bool):
        if isinstance(a, torch.Tensor):
            t = a.detach().cpu()
            return t.double() if to64 and t.dtype.is_floating_point else t.clone()
        if isinstance(a, list):
            return [lift(x, to64) for x in a]
        if isinstance(a, torch.device):
            return torch.device("cpu")
        return a

    low = tensors_of(replay(*[lift(a, False) for a in args]))
    try:
        high = tensors_of(replay(*[lift(a, True) for a in args]))
    except (RuntimeError, NotImplementedError, TypeError):
        return low  # no float64 kernel on the CPU: the same dtypes, still an independent device
    if isinstance(low, (tuple, list)):
        return tuple(h.to(l.dtype) if isinstance(h, torch.Tensor) and h.dtype.is_floating_point else h
                     for h, l in zip(high, low))
    return high.to(low.dtype) if isinstance(high, torch.Tensor) and high.dtype.is_floating_point else high


def nbytes(call: str, args: str) -> float:
    """Bytes the call must move: each tensor input's storage read once, each output written once."""
    import torch

    values = decode_args(call, args)
    total = 0
    for text in _tensors(values):
        m = _TENSOR_RE.match(text)
        shape = [int(d) for d in m.group(2).split(",") if d]
        total += math.prod(shape) * getattr(torch, _LONG.get(m.group(1), m.group(1))).itemsize
    return float(total + output_bytes(call, values))


def _meta_outputs(call: str, values: list) -> list:
    """The overload's outputs on meta tensors (no data, no device); [] for an op without a meta kernel."""
    import torch

    try:
        built = [_meta(v, torch) for v in values]
        schema = parse_call(call)._schema
        replay = Replay(call, sum(not a.kwarg_only for a in schema.arguments),
                        tuple(a.name for a in schema.arguments if a.kwarg_only))
        out = replay(*built)
    except Exception:  # noqa: BLE001  (no meta kernel, or arguments it refuses: outputs unknown)
        return []
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return [o for o in outs if isinstance(o, torch.Tensor)]


def output_bytes(call: str, values: list) -> int:
    """The outputs' bytes (0 when the op has no meta kernel to tell them)."""
    return sum(o.numel() * o.element_size() for o in _meta_outputs(call, values))


def output_dtype(call: str, values: list):
    """torch's name of the first output's dtype, None when unknown."""
    outs = _meta_outputs(call, values)
    return str(outs[0].dtype).removeprefix("torch.") if outs else None


def tensor_dtypes(values: list) -> list:
    """torch's names of the tensor arguments' dtypes, in order."""
    return [_LONG.get(_TENSOR_RE.match(t).group(1), _TENSOR_RE.match(t).group(1)) for t in _tensors(values)]


def _meta(value, torch):
    if isinstance(value, list) and value and all(isinstance(v, str) and v.startswith("T:") for v in value):
        return [_meta(v, torch) for v in value]
    if isinstance(value, str) and value.startswith("T:"):
        m = _TENSOR_RE.match(value)
        shape = tuple(int(d) for d in m.group(2).split(",") if d)
        stride = tuple(int(d) for d in m.group(3).split(",") if d) if m.group(3) is not None else _contiguous(shape)
        return torch.empty_strided(shape, stride, dtype=getattr(torch, _LONG.get(m.group(1), m.group(1))),
                                   device="meta")
    if isinstance(value, str) and value.startswith("V:"):
        return torch.device("meta")
    return _value(value, 0, "", [], "meta", None, torch) if isinstance(value, str) else value
