"""What the profiler does not record, saved beside the trace for the replay: ``capture``.

torch.profiler's record_shapes trace holds a call's dims, strides and scalars, not the contents
of its tensors. Two contents change a kernel's time: the offsets of ``torch._grouped_mm`` (how
many tokens each expert of a mixture of experts got: routing is rarely even) and the length of
``aten::index``'s index list. ``capture`` records them during the profiled run::

    from pytest_opperf.pipeline.reading.capture import capture

    with torch.profiler.profile(activities=[...], record_shapes=True) as prof, capture("trace.json"):
        model(batch)
    prof.export_chrome_trace("trace.json")

and writes ``trace.capture.json`` beside the trace when the block ends. ``opperf import
trace.json`` reads it: the k-th ``aten::_grouped_mm`` of the trace (in time order) replays with the
k-th offsets captured (its signature keeps them, so calls routed differently are different
signatures), and the k-th ``aten::index`` with the k-th index count; "k-th" counts the calls the
hook saw, those outside its ``PythonDispatchMode`` events in the trace. Only ``aten::index`` is
counted: ``index_put_`` (``x[ids] = v``) takes its count from its values, which the trace holds.
Files of version 1 counted ``index_put_`` calls into the same list; import reads them against the
trace's ``aten::index`` and ``aten::index_put_`` calls in time order. The capture keeps
references to the offset tensors and reads them once the block ends, so the profiled kernels are
not synchronised or copied; its dispatch hook adds host time to every op (the kernels' own times are what import
reads), and a look-up of each input's storage.

With ``capture("trace.json", model)`` it also records, for each op the hook sees, where each tensor
input came from (``inputs``, version 3): a parameter or buffer of MODEL (``p``), the output of an op
in the block (``w`` and the bytes all ops wrote since: ``w4096``; an op that wrote fewer bytes of
its storage than the input holds, a KV cache's one new row, does not count), or neither (``o``: made
before the block, a KV cache). ``opperf import`` turns these into each input's cache state (see
cachestate.py); without MODEL no input is a parameter. Version 4 adds, per op, which earlier op
wrote each input (its number among the ops the hook saw): the sequence replay (sequence.py) feeds
that op's output to the input, as the model did. Version 5 records a tensor-list argument's writers
element by element (``[12, null]``: the ``cat`` of a KV cache reads the previous step's ``cat`` and
the new key), where version 4 recorded none for a list, and the dtype of each tensor-list argument
(``{"0": "bfloat16"}``, a record's fourth entry): the trace types a list only as ``TensorList``.
With MODEL, version 5 also notes each call of the model's leaf modules (``modules``): which ops were
one norm's, what its input was and which op wrote its output, so that a what-if can replace a
module's calls with one kernel (``opperf sequence --replace RMSNorm=rmsnorm:triton``).
Version 6 records an ``aten::index`` over a later dim (``x[..., [-2], :]``: indices ``[None, None,
t]``) as ``[count, dim]``; earlier versions recorded the count alone, which replays over dim 0.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

VERSION = 6
# version 1: index_counts also counted index_put calls; 3 added inputs, 4 their writers, 5 a tensor list's
# writers element by element, 6 an index over a later dim as [count, dim] (see the module doc)
READABLE = (1, 2, 3, 4, 5, 6)


def sidecar(trace: Path) -> Path:
    """The capture file of a trace: trace.json(.gz) -> trace.capture.json."""
    name = trace.name
    for suffix in (".json.gz", ".json", ".gz"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    return trace.with_name(name + ".capture.json")


class capture:  # noqa: N801  (a context manager used as a function, like torch.no_grad)
    """Record grouped-GEMM offsets, index counts and where each op's inputs came from while a
    model runs (MODEL: whose parameters and buffers are weights); write them beside TRACE."""

    def __init__(self, trace: str | Path, model=None, offsets=None):
        self.path = sidecar(Path(trace))
        self.grouped: list = []   # offset tensors, read when the block ends (or lists: see OFFSETS)
        # (rows, experts, the offsets tensor) -> offsets: the values of a grouped GEMM's offsets that hold none (a trace on
        # the meta device: opperf predict's assumption), where given
        self.offsets = offsets
        self.indexed: list = []   # index counts of aten::index
        self.inputs: list = []    # per op: [name, [source of each schema argument], [the op that wrote each]]
        self.modules: list = []   # per call of a leaf module: see _leaf_calls
        self.sources = Sources(model)
        self._model = model
        self._hooks: list = []
        self._open: list = []
        self._mode = None

    def __enter__(self) -> "capture":
        from torch.utils._python_dispatch import TorchDispatchMode

        owner = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                owner._see(func, args, kwargs or {})
                out = func(*args, **(kwargs or {}))
                owner.inputs.append(owner.sources.call(func, args, kwargs or {}, out))
                return out

        self._mode = _Mode()
        self._leaf_calls()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)
        for handle in self._hooks:
            handle.remove()
        offsets = [t.tolist() if hasattr(t, "tolist") else t for t in self.grouped]
        self.path.write_text(json.dumps({"version": VERSION, "grouped_mm_offsets": offsets,
                                         "index_counts": self.indexed, "inputs": self.inputs,
                                         "modules": self.modules}) + "\n")

    def _leaf_calls(self) -> None:
        """Note each call of MODEL's leaf modules (a norm, a linear, an activation: no children) as
        [its name, its class, the first op it ran, the op after its last, the op that wrote its first
        tensor input, that input's shape and dtype, the op that wrote its output]: which calls of the
        sequence are one module's (a what-if replaces them together: sequence.py)."""
        if self._model is None:
            return
        import torch

        owner = self

        def before(module, args):
            first = next((a for a in args if isinstance(a, torch.Tensor)), None)
            owner._open.append((owner.sources.calls, first, owner.sources.writer(first) if first is not None else None))

        def after(name):
            def hook(module, args, output):
                start, first, writer = owner._open.pop()
                if owner.sources.calls == start or first is None or not isinstance(output, torch.Tensor):
                    return
                owner.modules.append([name, type(module).__name__, start, owner.sources.calls, writer,
                                      list(first.shape), str(first.dtype).removeprefix("torch."),
                                      owner.sources.writer(output)])
            return hook

        for name, module in self._model.named_modules():
            if next(module.children(), None) is None:
                self._hooks.append(module.register_forward_pre_hook(before))
                self._hooks.append(module.register_forward_hook(after(name)))

    def _see(self, func, args: tuple, kwargs: dict) -> None:
        name = getattr(func, "__name__", "")
        if name.startswith("_grouped_mm"):
            offs = args[2] if len(args) > 2 else kwargs.get("offs")
            if offs is not None and offs.device.type == "meta":  # shapes without values: an assumption's
                # the rows of a 2-D x 3-D product split over the experts; a 2-D x 2-D one splits k
                total = args[0].shape[0] if args[1].dim() == 3 else args[0].shape[-1]
                offs = self.offsets(int(total), int(offs.shape[0]), offs) if self.offsets else None
            self.grouped.append(offs)
        elif name == "index.Tensor":
            indices = args[1] if len(args) > 1 else kwargs.get("indices") or []
            at = [k for k, t in enumerate(indices) if t is not None and t.dtype != _bool()]
            count = int(indices[at[0]].numel()) if at else None
            # x[..., [-2], :] indexes dim 2 ([None, None, index]): [count, dim] (version 6); dim 0: the count
            self.indexed.append([count, at[0]] if at and at[0] else count)


class Sources:
    """Where each tensor an op reads came from: storages of the model's parameters and buffers, and
    the storages ops wrote (which op, how many bytes, and how many bytes all ops had written then).
    Ops are numbered in the order they are seen: the k-th call() is op k."""

    def __init__(self, model=None):
        self.weights = set()
        if model is not None:
            for t in (*model.parameters(), *model.buffers()):
                self.weights.add(_storage(t))
        # storage -> (bytes the write covered, all bytes written once it was done, the op that wrote it)
        self.written: dict = {}
        self.total = 0  # bytes all ops have written so far
        self.calls = 0  # ops seen so far
        # meta storages written, held: one freed would pass its address (its identity) to a new one
        self._meta: list = []

    def call(self, func, args: tuple, kwargs: dict, out) -> list:
        """[op name, [source per schema argument], [the op that wrote each, or None]] of one call
        (and {argument: dtype} of its tensor-list arguments, where it has any), then its writes
        noted; [name, [], []] for an op without a schema to read (import then keeps the default for it)."""
        number, self.calls = self.calls, self.calls + 1
        schema = getattr(func, "_schema", None)
        if schema is None:
            return [str(getattr(func, "__name__", func)), [], []]
        arguments = schema.arguments
        values = [args[i] if i < len(args) else kwargs.get(a.name) for i, a in enumerate(arguments)]
        seen = [self.source(v) for v in values]
        writers = [self.writer(v) for v in values]
        lists = {str(k): str(v[0].dtype).removeprefix("torch.") for k, v in enumerate(values)
                 if isinstance(v, (list, tuple)) and v and all(_is_tensor(t) for t in v)}
        written = [v for v, a in zip(values, arguments) if a.alias_info is not None and a.alias_info.is_write]
        for t in [*written, *_fresh(func, out, values)]:
            self.note_write(t, number)
        return [schema.name, seen, writers, lists] if lists else [schema.name, seen, writers]

    def source(self, value) -> str:
        """p (a weight), w<bytes written since> (an op's output), o (neither), "" (no tensor)."""
        if not _is_tensor(value):
            return ""
        key = _storage(value)
        if key in self.weights:
            return "p"
        covered, at, _ = self.written.get(key, (0, None, None))
        if at is None or covered < _nbytes(value):
            return "o"
        return f"w{self.total - at}"

    def writer(self, value):
        """The number of the op that last wrote the storage VALUE reads (None: no op of the block);
        for a list or tuple of tensors, a list of those, element by element (None: no element was written)."""
        if isinstance(value, (list, tuple)) and value and all(_is_tensor(v) for v in value):
            each = [self.writer(v) for v in value]
            return each if any(w is not None for w in each) else None
        if not _is_tensor(value):
            return None
        return self.written.get(_storage(value), (0, None, None))[2]

    def note_write(self, t, number: Optional[int] = None) -> None:
        if not _is_tensor(t):
            return
        size = _nbytes(t)
        self.total += size
        self.written[_storage(t)] = (size, self.total, number)
        if t.device.type == "meta":
            self._meta.append(t.untyped_storage())


def _is_tensor(value) -> bool:
    import torch

    return isinstance(value, torch.Tensor)


def _fresh(func, out, values: list) -> list:
    """The outputs the op wrote into memory of their own: not a view of an input (aten::t, split),
    nor the input an in-place or out= op returns (its write is noted by its argument), nor an output
    over an input's memory that the schema does not mark as a view: aten::_unsafe_view, which a 3-D
    matmul ends with, returns the mm's output reshaped (the write is the mm's, counted once)."""
    returns = func._schema.returns
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    if len(returns) == 1 and isinstance(out, (tuple, list)):  # a Tensor[] return: one schema entry for all
        returns = returns * len(outs)
    read = {_storage(t) for v in values for t in (v if isinstance(v, (list, tuple)) else [v]) if _is_tensor(t)}
    return [o for o, r in zip(outs, returns) if r.alias_info is None and _is_tensor(o) and _storage(o) not in read]


def _storage(t) -> int:
    try:
        if t.device.type == "meta":  # no memory, every data_ptr 0: the storage object tells them apart
            return t.untyped_storage()._cdata
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # a tensor without storage (a functional wrapper)
        return -id(t)


def _nbytes(t) -> int:
    return t.numel() * t.element_size()


def _bool():
    import torch

    return torch.bool


def load(trace: Path) -> Optional[dict]:
    """The capture file beside TRACE, read; None when there is none. ValueError when it is not one."""
    path = sidecar(trace)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a capture file of pytest_opperf.pipeline.reading.capture ({exc})") from None
    if not isinstance(data, dict) or data.get("version") not in READABLE:
        raise ValueError(f"{path}: not a capture file of pytest_opperf.pipeline.reading.capture (version "
                         f"{' or '.join(map(str, READABLE))})")
    return data
