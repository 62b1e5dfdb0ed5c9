"""A recorded aten call, replayed as itself: the ``aten`` op's parameters and how they are read.

torch.profiler (record_shapes=True, torch >= 2.1) writes for every CPU op its inputs' dims,
strides and types, and the values of its scalar arguments (``Concrete Inputs``). That is enough
to call the same overload again with tensors of the same shapes, strides and dtypes:
``pipeline/mapping/bind.py`` picks the overload whose schema fits the recorded slots and encodes the call as two texts, the
``aten`` op's parameters ``call`` (``aten::topk.default``) and ``args`` (JSON, one entry per
schema argument)::

    null                     an absent optional argument
    8, -1, true, 1e-05       an int, a float, a bool (inf and nan as "F:inf", "F:-inf", "F:nan")
    [4096, 128]              an int list
    "T:bf16[64,512]"         a contiguous tensor; "T:bf16[512,64]/1,512" with its strides;
                             "T:fp32[]" a 0-dim tensor; a trailing "@host" keeps it in host memory;
                             "T:i32[4]=3,9,12,16" an integer tensor holding these values
    ["T:...", "T:..."]       a tensor list
    "D:bfloat16"             a dtype, "L:strided" a layout, "M:contiguous_format" a memory format,
    "V:"                     a device: the case's; "V:cpu" host memory (a copy to the host)

What the trace does not hold is filled by stated assumptions, listed on the signature: index
tensors hold indices within the dimension they index (uniform), grouped-GEMM offsets split the
rows into equal groups, masks are random, inputs of ops that select by value (topk, sort,
argmax, ...) hold distinct values, so every correct kernel picks the same elements, and an
in-place op (``add_``) is replayed as its out-of-place form (``add``): the in-place one changes
its own input on every timed call.
"""

from __future__ import annotations

import functools

import json
import math
import re
from dataclasses import dataclass, field

from pytest_opperf import dtypes as dtype_table

# Ops defined on positive inputs only (their inputs in a model are variances, norms, probabilities).
POSITIVE = {"rsqrt", "sqrt", "log", "log2", "log10", "log1p", "pow", "lgamma", "digamma", "reciprocal", "acosh",
            "erfinv", "xlogy"}
# Ops that pick elements by value: their floating inputs get distinct values (see module doc).
SELECTING = {"topk", "sort", "argsort", "argmax", "argmin", "max", "min", "kthvalue", "median", "nanmedian",
             "mode", "msort", "sort_values"}
# op name -> {index argument: (the tensor argument it indexes, its dim argument or a fixed dim)}
INDEXES = {
    "index_select": {2: (0, 1)}, "gather": {2: (0, 1)}, "scatter": {2: (0, 1)}, "scatter_add": {2: (0, 1)},
    "scatter_reduce": {2: (0, 1)}, "index_add": {2: (0, 1)}, "index_copy": {2: (0, 1)},
    "index_fill": {2: (0, 1)}, "take_along_dim": {1: (0, 2)}, "embedding": {1: (0, "0")},
    "embedding_dense_backward": {1: (0, "0")},
}
TENSOR_RE = re.compile(r"^T:(\w+)\[([0-9,]*)\](?:/([0-9,]*))?(?:=(-?[0-9]+(?:,-?[0-9]+)*))?(@host)?$")


def contiguous_strides(shape) -> tuple:
    out, step = [], 1
    for d in reversed(shape):
        out.append(step)
        step *= max(d, 1)
    return tuple(reversed(out))


@dataclass(frozen=True)
class TensorText:
    """One tensor argument's text, read: ``T:<dtype>[dims]`` with optional ``/strides`` and ``@host``."""

    dtype: str  # the short name (bf16, i64, b1, ...)
    shape: tuple
    stride: tuple  # the given strides, else the contiguous ones
    host: bool = False
    values: tuple = ()  # an integer tensor's contents as they ran (grouped-GEMM offsets from a capture)

    @classmethod
    def parse(cls, text: str) -> "TensorText":
        """ValueError naming the text when it is not a tensor's text.

        >>> TensorText.parse("T:bf16[512,64]/1,512")
        TensorText(dtype='bf16', shape=(512, 64), stride=(1, 512), host=False)
        >>> t = TensorText.parse("T:fp32[2,3]@host"); (t.stride, t.host, t.dtype_name, t.numel, t.extent)
        ((3, 1), True, 'float32', 6, 6)
        """
        m = TENSOR_RE.match(text) if isinstance(text, str) else None
        if m is None:
            raise ValueError(f"aten: {text!r} is not a tensor's text (T:<dtype>[dims] or T:<dtype>[dims]/strides)")
        shape = tuple(int(d) for d in m.group(2).split(",") if d)
        stride = tuple(int(d) for d in m.group(3).split(",") if d) if m.group(3) is not None else None
        values = tuple(int(v) for v in m.group(4).split(",")) if m.group(4) else ()
        return cls(m.group(1), shape, stride if stride is not None else contiguous_strides(shape), bool(m.group(5)),
                   values)

    @property
    def dtype_name(self) -> str:
        """torch's name of the dtype (bfloat16, int64, ...)."""
        try:
            return dtype_table.lookup(self.dtype, any_tensor=True).torch_name
        except KeyError:
            return self.dtype  # torch's getattr names it, if it is a dtype at all

    def torch_dtype(self, torch):
        return getattr(torch, self.dtype_name)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def extent(self) -> int:
        """Elements of the storage the strides reach (0 for an empty tensor)."""
        return 1 + sum((d - 1) * s for d, s in zip(self.shape, self.stride)) if all(self.shape) else 0


def short_text(torch_name: str) -> str:
    """A torch dtype's form in a tensor's text (bfloat16 -> bf16, int64 -> i64); an unknown one as given."""
    try:
        return dtype_table.lookup(torch_name, any_tensor=True).short or torch_name
    except KeyError:
        return torch_name


def is_tensor_text(value) -> bool:
    return isinstance(value, str) and value.startswith("T:")


def is_tensor_list(value) -> bool:
    """A list of tensor texts; absent entries (None) allowed, as in aten::index's indices ``[None, T]``."""
    return isinstance(value, list) and any(is_tensor_text(v) for v in value) and \
        all(v is None or is_tensor_text(v) for v in value)


def tensor_texts(args):
    """The tensor texts among the arguments, those inside tensor lists included, in order."""
    for a in args:
        if is_tensor_text(a):
            yield a
        elif isinstance(a, list):
            yield from (x for x in a if is_tensor_text(x))


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
    shapes = [shape_of(v) for v in values]
    built = []
    for i, value in enumerate(values):
        built.append(_value(value, i, replay.name, shapes, device, gen, torch))
    _fill_indices(replay.name, built, values, gen, torch)
    # An in-place op's reference starts from what its written arguments held before any call.
    for i, arg in enumerate(schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write and isinstance(built[i], torch.Tensor):
            replay.originals[i] = built[i].detach().cpu().clone()
    return (replay, *built)


def shape_of(value):
    """A tensor text's shape; None for any other argument."""
    return TensorText.parse(value).shape if is_tensor_text(value) else None


def _value(value, index: int, name: str, shapes: list, device, gen, torch):
    if is_tensor_list(value):
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
        return torch.device(rest or device)
    if tag != "T":
        return value
    t = TensorText.parse(value)
    where = "cpu" if t.host else device
    if t.values:  # the contents that ran (see pipeline/reading/capture.py): kept, not drawn
        return torch.tensor(t.values, dtype=t.torch_dtype(torch), device=where).reshape(t.shape)
    shape, stride = t.shape, t.stride
    row = stride[-2] if len(shape) > 1 and stride[-1] == 1 else (shape[-1] if shape else 1)  # the last dim's run
    storage = _random(t.extent, t.torch_dtype(torch), name, shapes, where, gen, torch, row=row)
    out = storage.as_strided(shape, stride)
    return out.pin_memory() if t.host and torch.cuda.is_available() else out


def _random(n: int, dtype, name: str, shapes: list, device, gen, torch, row: int = 1):
    gen_device = gen.device if gen is not None else torch.device("cpu")
    if dtype == torch.bool:
        return torch.rand(n, generator=gen, device=gen_device).lt(0.5).to(device)
    if not dtype.is_floating_point and not dtype.is_complex:
        if name in SELECTING:  # distinct, so every correct kernel orders and picks alike
            return torch.randperm(n, generator=gen, device=gen_device).to(device, dtype)
        # From 1: a divisor is never zero; index arguments get their own contents (_fill_indices).
        bound = min([d for s in shapes if s for d in s if d > 0] or [2])
        return torch.randint(1, max(2, min(bound, 2 ** 15)), (n,), generator=gen, device=gen_device).to(device, dtype)
    if name in SELECTING:
        return _distinct(n, row, dtype, gen, gen_device, torch).to(device)
    values = torch.randn(n, generator=gen, device=gen_device, dtype=torch.float32)
    if name in POSITIVE:  # a square root or logarithm of a variance, not of noise: no NaN to check
        values = values.abs_().add_(0.5)
    return values.to(device, dtype)


def distinct_rows(rows: int, row: int, dtype, device, gen):
    """A [rows, row] tensor whose values differ within each row, where the dtype has that many values
    (a sort's or a top-k's inputs: every correct kernel orders them alike)."""
    import torch

    gen_device = gen.device if gen is not None else torch.device("cpu")
    return _distinct(rows * row, row, dtype, gen, gen_device, torch).reshape(rows, row).to(device)


def _distinct(n: int, row: int, dtype, gen, gen_device, torch):
    """n values of dtype in rows of `row`, all different within a row where the dtype has that many
    values, in random order: a random choice of distinct values, shifted cyclically per row."""
    row = max(row, 1)
    if dtype.itemsize >= 4:
        table = (torch.arange(row, device=gen_device, dtype=torch.float64) - row / 2) / row
    else:
        table = _short_float_values(dtype, gen_device)
    size = table.numel()
    base = (torch.randperm(size, generator=gen, device=gen_device)[:row] if row <= size
            else torch.randint(0, size, (row,), generator=gen, device=gen_device))
    rows = -(-n // row)
    shift = torch.randint(0, size, (rows, 1), generator=gen, device=gen_device)
    picks = (base.unsqueeze(0) + shift).remainder_(size).flatten()[:n]
    return table[picks].to(dtype)


@functools.lru_cache(maxsize=None)
def _short_float_values(dtype, device):
    """Every finite value of a 2-byte float dtype under 1e4 in magnitude, ascending, as float32 on
    device (made once a dtype and device)."""
    import torch

    bits = torch.arange(-2 ** 15, 2 ** 15, dtype=torch.int32).to(torch.int16).view(dtype)
    table = torch.unique(bits[torch.isfinite(bits.float())].float())
    return table[table.abs() < 1e4].to(device)  # no overflow in a softmax or sum after the pick


def _fill_indices(name: str, built: list, values: list, gen, torch) -> None:
    """Index and offset tensors get valid contents: within the dimension they index, or equal groups."""
    if name == "_grouped_mm" and len(built) > 2 and isinstance(built[2], torch.Tensor) and "=" not in str(values[2]):
        rows = built[0].shape[-2] if built[0].dim() == 2 else 0
        groups = built[2].numel()
        if rows:
            ends = [rows * (g + 1) // groups for g in range(groups)]
            built[2].copy_(torch.tensor(ends, dtype=built[2].dtype))
        return
    if name.rstrip("_") in ("index", "index_put", "_index_put_impl") and len(built) > 1 and isinstance(built[1], list):
        for k, t in enumerate(built[1]):  # the k-th entry indexes dim k (None: that dim whole)
            size = built[0].shape[k] if k < built[0].dim() else 1
            if isinstance(t, torch.Tensor) and not t.dtype.is_floating_point and t.dtype != torch.bool:
                picks = torch.randperm(size, generator=gen, device=gen.device if gen is not None else "cpu")
                picks = picks[:t.numel()] if t.numel() <= size else picks[torch.randint(0, size, (t.numel(),))]
                t.copy_(picks.reshape(t.shape).to(t.device, t.dtype))
        return
    for index, (target, dim_arg) in INDEXES.get(name.rstrip("_"), {}).items():
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


# Inputs larger than this (bytes, on an accelerator) get their float64 reference there: the CPU would
# take seconds to minutes (a 65536-token linear of 4096 x 14336 is 7.7 TFLOP in float64: about 13 s on
# 16 cores, 0.1 s on an H200), and the float64 kernel is not the one the case times.
DEVICE_REFERENCE_BYTES = 64 << 20


def reference(replay: Replay, *args):
    """The same overload in float64 where it has such a kernel, else as it ran, outputs in the dtypes
    the device's come in: on the CPU, or, for inputs on an accelerator of more than
    DEVICE_REFERENCE_BYTES, in float64 on that device where it takes the call (else on the CPU).
    aten::topk(sorted=False) may list its picks in any order: the reference checks the device's
    picks are the right ones and lists them in the device's order."""
    import torch

    args = [replay.originals.get(i, a) for i, a in enumerate(args)]
    dtypes = _output_dtypes(replay, args)
    out = None
    tries = [("float64", True), ("all64", True)] if _large(args, torch) else []
    for mode, keep in tries + [("float64", False), ("all64", False), ("same", False)]:
        try:
            out = _as_tuple(tensors_of(replay(*[_lift(a, mode, keep) for a in args])))
            break
        except (RuntimeError, NotImplementedError, TypeError):
            if mode == "same":
                raise
    if dtypes is not None:
        out = tuple(o.to(d) if isinstance(o, torch.Tensor) and o.dtype != d else o for o, d in zip(out, dtypes))
    if replay.name == "topk" and len(args) > 4 and args[4] is False:
        out = _in_device_order(replay, args, out, torch)
    return out[0] if len(out) == 1 else out


def _output_dtypes(replay: Replay, args: list):
    """The dtypes of the device's outputs, from the overload on meta tensors; None when it has no
    meta kernel that can answer (aten::item reads a value, which a meta tensor does not hold): the
    reference's outputs keep their own dtypes then."""
    try:
        return [getattr(o, "dtype", None) for o in _as_tuple(replay(*[_lift(a, "meta") for a in args]))]
    except (RuntimeError, NotImplementedError, TypeError):
        return None


def unbuildable(call: str, args: str):
    """Why a case of the aten op cannot be built (None: it can): an overload this torch lacks,
    arguments that do not decode. Told at set-up, so the case is skipped with the reason."""
    try:
        decode_args(call, args)
    except ValueError as exc:
        return str(exc)
    return None


def _as_tuple(out) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _large(args: list, torch) -> bool:
    """Tensors on an accelerator holding more than DEVICE_REFERENCE_BYTES, all told."""
    tensors = [t for a in args for t in (a if isinstance(a, list) else [a]) if isinstance(t, torch.Tensor)]
    return any(t.device.type not in ("cpu", "meta") for t in tensors) and \
        sum(t.numel() * t.element_size() for t in tensors) > DEVICE_REFERENCE_BYTES


def _lift(a, mode: str, keep: bool = False):
    """An argument for the reference: on the CPU, or where it is (KEEP), with mode float64: floating
    tensors in float64; all64: every non-bool tensor too; same: as they are; or on the meta device."""
    import torch

    if isinstance(a, torch.Tensor):
        if mode == "meta":
            return torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device="meta")
        t = a.detach().clone() if keep else a.detach().cpu().clone()
        if (mode == "float64" and t.dtype.is_floating_point) or (mode == "all64" and t.dtype != torch.bool):
            return t.double()
        return t
    if isinstance(a, list):
        return [_lift(x, mode, keep) for x in a]
    if isinstance(a, torch.device):
        return a if keep else torch.device("meta" if mode == "meta" else "cpu")
    return a


def _in_device_order(replay: Replay, args: list, ref: tuple, torch) -> tuple:
    ref = tuple(r.cpu() if isinstance(r, torch.Tensor) else r for r in ref)
    values, indices = replay(*args)
    dim = args[2] if len(args) > 2 else -1
    got, want = indices.detach().cpu().sort(dim).values, ref[1].sort(dim).values
    if not torch.equal(got, want):
        return ref  # other picks: the check reports them
    source = args[0].detach().cpu().double()
    return (torch.gather(source, dim, indices.detach().cpu()).to(ref[0].dtype), indices.detach().cpu())


def nbytes(call: str, args: str) -> float:
    """Bytes the call must move: each tensor input's storage read once, each output written once
    (an out= tensor is an output only: the call writes it without reading it)."""
    import torch

    values = decode_args(call, args)
    written = out_arguments(call)
    total = 0
    for text in tensor_texts(v for i, v in enumerate(values) if i not in written):
        t = TensorText.parse(text)
        total += t.numel * t.torch_dtype(torch).itemsize
    return float(total + output_bytes(call, values))


def out_arguments(call: str) -> frozenset:
    """Positions of the overload's out= arguments (keyword-only, written): aten::add.out -> {3}."""
    schema = parse_call(call)._schema
    return frozenset(i for i, a in enumerate(schema.arguments)
                     if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write)


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
    return [TensorText.parse(t).dtype_name for t in tensor_texts(values)]


def _meta(value, torch):
    if is_tensor_list(value):
        return [_meta(v, torch) for v in value]
    if is_tensor_text(value):
        t = TensorText.parse(value)
        return torch.empty_strided(t.shape, t.stride, dtype=t.torch_dtype(torch), device="meta")
    if isinstance(value, str) and value.startswith("V:"):
        return torch.device("meta")
    return _value(value, 0, "", [], "meta", None, torch) if isinstance(value, str) else value
