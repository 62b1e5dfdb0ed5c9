"""The sequence plan: the profile's calls in the order they ran, each built as a call to run.

The isolated replay (``pytest benches/`` on the import's configs) times each signature alone, in a
cache state chosen for it. In the model a kernel ran after other kernels: what they left in the L2
(and whether it is dirty), the clocks, the queue. ``opperf sequence PROFILE_DB`` runs the profile's
calls again in their recorded order (the ``calls`` table, reading/calls.py). The way through:
``plan`` builds them here, whatif.py transforms the built plan (``--backend``, ``--replace``),
sequence.py runs it, summary.py sums what it measured. Here:

- each call is built as the isolated replay builds its signature's case (the op's ``inputs()``, the
  signature's backend), once: a call's inputs are made for it and kept for every repetition, and
  the calls of one signature in different steps share them (the k-th call of a signature in a step
  reads what the k-th call of every step reads: a layer's weight, decode after decode); with
  ``--inputs per-signature`` a signature's calls share a set, one op's and shapes' its weights;
- an input the capture saw written by an earlier call (the ``links``) is that call's output, as it
  ran: the data flow, and so the L2, of the model; so is each tensor of a tensor list (the ``cat``
  of a KV cache reads the last step's ``cat`` and the new key). Only floating-point inputs are
  linked: an index or a mask keeps the contents its replay assumes. An output is kept until its
  last reader ran.

Calls of signatures that are not mapped, or whose backend cannot run here, are left out (``Plan.left_out``),
and so is their time on both sides: the sums compare the same calls.

Memory is planned before anything is made on the device: ``needs`` counts on the meta device what
each way of holding the inputs would hold there (sequence.replay takes the one that fits).
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from pytest_opperf.pipeline.mapping.rules import MAPPED
from pytest_opperf.pipeline.reading.signature import ProfileError, parse_shapes
from pytest_opperf.pipeline.reading.slots import slot_bytes
from pytest_opperf.pipeline.replay.weights import as_parameters

INPUTS = ("per-call", "per-signature")


@dataclass
class Call:
    """One call of the sequence, ready to run."""

    position: int
    signature: int
    step: Optional[int]
    phase: str
    fn: object
    args: list                     # the call's own arguments (linked ones replaced when it runs)
    links: list                    # [Link]: the inputs that are an earlier call's output
    alt: object = None             # the what-if backend's callable, where it differs (whatif.swap_backends)
    stands_for: Optional[tuple] = None  # a --replace stand-in: whatif.StandIn (what it runs, for which module)


@dataclass(frozen=True)
class Link:
    """Argument ``argument`` (element ``element`` of it, where it is a tensor list) is a view of
    DTYPE, SHAPE and STRIDE over what the call at ``producer`` returned."""

    argument: int
    element: Optional[int]
    producer: int
    dtype: object
    shape: tuple
    stride: tuple

    @classmethod
    def of(cls, argument: int, element: Optional[int], producer: int, t, torch) -> "Link":
        return cls(argument, element, producer, t.dtype, tuple(t.shape), tuple(t.stride()))

    @property
    def extent(self) -> int:
        """Elements of the producer's output the view reaches (0 for an empty view)."""
        return 1 + sum((d - 1) * s for d, s in zip(self.shape, self.stride)) if all(self.shape) else 0


@dataclass
class Plan:
    calls: list
    left_out: dict = field(default_factory=dict)   # signature id -> why its calls are not replayed
    last_use: dict = field(default_factory=dict)   # producer position -> the last position that reads it
    swapped: dict = field(default_factory=dict)    # signature id -> (op, backend before, backend after)
    # --replace: position -> the Call that stands for a module's calls there (its output's position);
    # the module's other calls do not run in the what-if
    replacements: dict = field(default_factory=dict)
    skipped: set = field(default_factory=set)
    replaced: dict = field(default_factory=dict)   # module class -> (op, backend, module calls replaced)
    names: dict = field(default_factory=dict)      # signature id -> (op_type, input shapes, dtype): to name a call

    @property
    def what_if(self) -> bool:
        return bool(self.swapped or self.replacements)


def read_table(path: Path, table: str, order: str = "") -> list[dict]:
    """The rows of a profile database's TABLE (none where it has no such table)."""
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            db.row_factory = sqlite3.Row
            names = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            rows = [dict(r) for r in db.execute(f"SELECT * FROM [{table}] {order}")] if table in names else []
        db.close()
    except sqlite3.DatabaseError as exc:
        raise ProfileError(f"{path}: not a profile database ({exc})") from None
    return rows


def load_calls(path: Path) -> list[dict]:
    """The profile's calls in time order; a ProfileError when it has none (imported before opperf kept them)."""
    rows = read_table(path, "calls", "ORDER BY position")
    if not rows:
        raise ProfileError(f"{path}: holds no calls in time order (imported by an older opperf, or from Ascend "
                           f"kernel_details, which has no order): import the trace again (opperf import ... --force)")
    return rows


def device_of(name: Optional[str], time_source: str, option: str = "--device"):
    """The torch device to replay on: NAME (as OPTION), else cuda for a profile of kernel times, else cpu."""
    import torch

    if name is None:
        if time_source == "kernel" and not torch.cuda.is_available():
            raise ProfileError("the profile holds device kernel times and this machine has no CUDA device: replay it "
                               "on the kind of device it was profiled on (--device NAME)")
        name = "cuda" if time_source == "kernel" else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ProfileError(f"{option}={name}: not a torch device ({short(exc)})") from None
    module = getattr(torch, device.type, None)
    if device.type != "cpu" and not (module is not None and hasattr(module, "is_available") and module.is_available()):
        raise ProfileError(f"{option}={name}: no such device on this machine")
    if device.type == "cpu" and time_source == "kernel":
        raise ProfileError(f"{option}={name}: the profile holds device kernel times, a CPU has none to compare")
    return device


def stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def plan(rows: list[dict], calls: list[dict], device, inputs: str = "per-call", seed: int = 0, say=None) -> Plan:
    """Every call of a replayable signature, built on DEVICE (a torch.device); whatif.py transforms the
    built plan for a what-if (swap_backends, stand_ins)."""
    import torch

    from pytest_opperf.catalog import load_builtin

    if inputs not in INPUTS:
        raise ProfileError(f"--inputs={inputs}: expected {' or '.join(INPUTS)}")
    load_builtin()
    say = say or (lambda text: None)
    built: dict = {}       # signature id -> (fn, make(seed) -> args) or None
    out = Plan([])
    made: dict = {}        # inputs key -> arguments
    ordinal: dict = defaultdict(int)
    shared: dict = {}      # (op, dtype, shapes, strides, k-th such call in its step, argument) -> tensor
    alike: dict = defaultdict(int)
    capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    for c, sig in _replayed(rows, calls, built, lambda sig: _built(sig, device, capability, out)):
        fn, make = built[sig["id"]]
        key, alike_key = _keys(sig, c, inputs, ordinal, alike)
        if key not in made:
            try:
                made[key] = make(seed + c["position"])
            except Exception as exc:  # noqa: BLE001  (one signature's inputs must not end the run)
                if isinstance(exc, torch.OutOfMemoryError):  # the caller's to plan for (sequence.replay)
                    raise
                out.left_out[sig["id"]] = f"its inputs could not be made ({short(exc)})"
                built[sig["id"]] = None
                continue
            made[key] = _share(made[key], shared, alike_key, torch)
            if len(made) % 500 == 0:
                say(f"  {len(made)} input sets made ({c['position'] + 1} of {len(calls)} calls)")
        args = list(made[key])
        out.calls.append(Call(c["position"], sig["id"], c["step"], c["phase"] or "", fn, args,
                              _links(sig, c, args, torch)))
    # Calls left out after an earlier call of theirs was planned (inputs that failed later): dropped.
    out.calls = [c for c in out.calls if c.signature not in out.left_out]
    planned = {c.position for c in out.calls}
    for c in out.calls:
        c.links = [link for link in c.links if link.producer in planned]
        for link in c.links:
            out.last_use[link.producer] = max(out.last_use.get(link.producer, -1), c.position)
    return out


def _replayed(rows: list[dict], calls: list[dict], cache: dict, build):
    """(call, signature) of each call whose signature BUILD(signature) made something of, kept in
    CACHE (signature id -> it, None: not replayed; a None set later leaves out its later calls)."""
    by_id = {r["id"]: r for r in rows}
    for c in calls:
        sig = by_id.get(c["signature"])
        if sig is not None and sig["id"] not in cache:
            cache[sig["id"]] = build(sig)
        if sig is not None and cache[sig["id"]] is not None:
            yield c, sig


def _keys(sig: dict, call: dict, inputs: str, ordinal: dict, alike: dict) -> tuple:
    """(inputs key, alike key) of a call, counted in ORDINAL and ALIKE: its input set is made once a
    key (once a signature, or for the k-th call of a signature in a step); _share dedups the
    floating-point tensors of the calls of one alike key (the same op and shapes, the k-th such
    call of its step)."""
    mine = (sig["id"], call["step"])
    shape = (sig["op"], sig["dtype"], sig["input_shapes"], sig.get("input_strides") or "")
    if inputs == "per-signature":  # one set a signature; signatures of one shape (routings) share weights
        return (sig["id"],), (*shape, 0)
    key = (*mine, ordinal[mine])
    ordinal[mine] += 1
    kth = alike[(shape, call["step"])]
    alike[(shape, call["step"])] += 1
    return key, (*shape, kth)


def _share(args, shared: dict, key: tuple, torch) -> list:
    """ARGS with each floating-point tensor replaced by the one the first call of KEY made (the same
    op and shapes, the k-th such call of its step): signatures that differ only in what a capture
    recorded (an MoE layer's routing, step by step) read one layer's weights, as the model does, and
    hold one copy of them."""
    args = list(args)
    for j, a in enumerate(args):
        if isinstance(a, torch.Tensor) and a.dtype.is_floating_point:
            args[j] = shared.setdefault((key, j), a)
    return args


def _built(sig: dict, device, capability, out: Plan):
    """(fn, make(seed) -> arguments) of a signature, named in out.names; None (and why, in
    out.left_out) when it is not replayed here."""
    import torch

    from pytest_opperf.catalog.registry import BACKENDS, OPS

    out.names[sig["id"]] = (sig["op_type"], sig["input_shapes"], sig["dtype"])
    if sig["status"] != MAPPED:
        out.left_out[sig["id"]] = f"{sig['status']}: {sig.get('reason') or 'no rule maps it'}"
        return None
    op = OPS.get(sig["op"])
    backend = BACKENDS.get((sig["op"], sig["backend"]))
    if op is None or backend is None:
        out.left_out[sig["id"]] = f"{sig['op']}/{sig['backend']} is not registered here"
        return None
    _, dtypes, params = case_of(sig)
    why = backend.cannot_run(device.type, dtypes, capability, params)
    if why:
        out.left_out[sig["id"]] = f"{sig['op']}/{sig['backend']} cannot run here: {why}"
        return None

    def make(seed: int, where=device):  # where: the meta device, to size them (needs)
        gen = torch.Generator(device="cpu" if where.type == "meta" else where).manual_seed(seed)
        with torch.no_grad():  # not inference tensors: a weight below must be able to require grad
            return as_parameters(sig, op.inputs(params, dtypes, where, gen), slot_arguments, torch)

    return backend.fn, make


def case_of(sig: dict) -> tuple:
    """(op, dtypes, params) of a mapped signature: the catalogue case its calls replay."""
    from pytest_opperf.catalog.registry import OPS

    op = OPS[sig["op"]]
    return op, dtypes_of(sig["dtype"]), {**op.defaults, **json.loads(sig["params"])}


def dtypes_of(label: str):
    """The DTypes of a signature's dtype label (``bf16``, or ``fp8-bf16``: input-output)."""
    from pytest_opperf.catalog.registry import DTypes
    from pytest_opperf.dtypes import lookup

    first, _, second = (label or "").partition("-")
    return DTypes(lookup(first), lookup(second or first))


def _links(sig: dict, call: dict, args: list, torch) -> list:
    """[Link] of the call's linked inputs: floating-point tensors, alone or in a tensor list, whose
    slot the capture saw written by an earlier call."""
    if not call.get("links"):
        return []
    writers = json.loads(call["links"])
    where = slot_arguments(sig, args, torch)
    shapes, strides = parse_shapes(sig["input_shapes"]), parse_shapes(sig.get("input_strides") or "")
    out = []
    for slot, producer in enumerate(writers):
        k = where[slot] if slot < len(where) else None
        if producer is None or k is None:
            continue
        if isinstance(producer, list):  # a tensor list, element by element
            items = args[k] if isinstance(args[k], (list, tuple)) else ()
            if len(items) == len(producer):
                out.extend(Link.of(k, e, p, t, torch) for e, (p, t) in enumerate(zip(producer, items))
                           if p is not None and _floating(t, torch))
        elif _floating(args[k], torch):
            link = Link.of(k, None, producer, args[k], torch)
            recorded = strides[slot] if slot < len(strides) else None
            # A catalogue case makes dense inputs; where the model's input had the case's dims but
            # other strides (attention's q, k, v as views of [b, s, h, d]), the view takes the model's.
            if (slot < len(shapes) and shapes[slot] == link.shape and isinstance(recorded, tuple)
                    and len(recorded) == len(link.shape)):
                link = dataclasses.replace(link, stride=recorded)
            out.append(link)
    return out


def _floating(t, torch) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype.is_floating_point


def slot_arguments(sig: dict, args: list, torch) -> list:
    """Per profiled input slot, the index of the case argument that is that input (None: not known).
    An ``aten`` case's arguments are the recorded ones, in order, after its overload; a catalogue
    op's tensor arguments of a slot's element count are the slots of that count, in order, where
    there are as many of each (q, k and v of one size are attention's three inputs in order)."""
    slots = parse_shapes(sig["input_shapes"])
    if sig["op"] == "aten":
        return [k + 1 if k + 1 < len(args) and _tensor_or_list(args[k + 1], torch) else None
                for k in range(len(slots))]
    tensors = [(k, a) for k, a in enumerate(args) if isinstance(a, torch.Tensor)]
    out = []
    for j, s in enumerate(slots):
        if not isinstance(s, tuple):
            out.append(None)
            continue
        numel = prod(s)
        matching = [k for k, a in tensors if a.numel() == numel]
        same = [i for i, x in enumerate(slots) if isinstance(x, tuple) and prod(x) == numel]
        # as many arguments as slots of that size: in the same order (attention's q, k, v)
        out.append(matching[same.index(j)] if len(matching) == len(same) else None)
    return out


def _tensor_or_list(a, torch) -> bool:
    return isinstance(a, torch.Tensor) or (isinstance(a, (list, tuple)) and bool(a)
                                           and all(isinstance(t, torch.Tensor) for t in a))


def prod(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def short(exc: Exception) -> str:
    """An exception's message on one line, cut at 200 characters (its type where it has none)."""
    return " ".join(str(exc).split())[:200] or type(exc).__name__


@dataclass(frozen=True)
class Needs:
    """What a replay would hold on the device: per way of holding the inputs (INPUTS), their bytes;
    the outputs it keeps for a later reader, each (made at, last read at, bytes); the most one input
    set takes while it is made (_sized)."""

    inputs: dict
    kept: list
    making: int = 0


def needs(rows: list[dict], calls: list[dict], device) -> Needs:
    """What plan() would hold on DEVICE, counted before anything is made there: each signature's
    inputs made once on the meta device (where they cannot be, its recorded input bytes, shared
    with no call), held as plan() holds them (a set a key of _keys, the floating-point tensors
    _share dedups once: per call, and per signature); each output a later call reads, sized by
    the largest view a reader takes of it (a reader whose inputs meta cannot make takes none)."""
    import torch

    from pytest_opperf.catalog import load_builtin

    load_builtin()
    capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    draws = _draws_on_meta()
    sized: dict = {}       # signature id -> (arguments on meta, parts, making) or None: not replayed
    made, shared, planned = set(), set(), set()
    ordinal, alike = defaultdict(int), defaultdict(int)
    per_call, size, last_use, per_signature, signed, shared_signed = 0, {}, {}, 0, set(), set()
    for c, sig in _replayed(rows, calls, sized, lambda sig: _sized(sig, device, capability, draws)):
        args, parts, _ = sized[sig["id"]]
        key, alike_key = _keys(sig, c, "per-call", ordinal, alike)
        if key not in made:
            made.add(key)
            per_call += _new_bytes(parts, alike_key, shared)
        if sig["id"] not in signed:
            signed.add(sig["id"])
            per_signature += _new_bytes(parts, _keys(sig, c, "per-signature", {}, {})[1], shared_signed)
        planned.add(c["position"])
        for link in _links(sig, c, args, torch) if args else ():
            size[link.producer] = max(size.get(link.producer, 0), link.extent * link.dtype.itemsize)
            last_use[link.producer] = c["position"]
    sets = [v for v in sized.values() if v is not None]
    return Needs({"per-call": per_call, "per-signature": per_signature},
                 [(p, last_use[p], n) for p, n in size.items() if p in planned], max((v[2] for v in sets), default=0))


def _sized(sig: dict, device, capability, draws) -> Optional[tuple]:
    """(arguments on meta, parts, making) of a signature's input set, None where plan() leaves it out;
    a part is (the argument _share dedups or None, storage, bytes) of a tensor; making: the set's bytes
    and 8 an element of its largest tensor (the aten replay draws float32 or int64 values, then casts;
    per call, a set is made whole before _share drops what it dedups)."""
    import torch

    built = _built(sig, device, capability, Plan([]))
    if built is None:
        return None
    try:
        with draws:
            args = list(built[1](0, torch.device("meta")))
    except Exception:  # noqa: BLE001  (inputs meta cannot make: the recorded bytes stand for them)
        got = slot_bytes(sig["input_shapes"], sig.get("input_dtypes") or "") or []
        return [], [(None, ("slot", k), n) for k, n in enumerate(got)], sum(got) + 8 * max(got, default=0)
    parts, largest = [], 0
    for j, a in enumerate(args):
        shareable = j if isinstance(a, torch.Tensor) and a.dtype.is_floating_point else None
        for t in [a] if isinstance(a, torch.Tensor) else a if isinstance(a, (list, tuple)) else []:
            if isinstance(t, torch.Tensor):  # in a tensor list: _share leaves it to its own set
                storage = t.untyped_storage()
                parts.append((shareable, storage._cdata, storage.nbytes()))
                largest = max(largest, storage.nbytes() // t.element_size())
    return args, parts, sum({s: n for _, s, n in parts}.values()) + 8 * largest


def _new_bytes(parts: list, alike_key: tuple, shared: set) -> int:
    """Bytes a new input set adds: its storages, less the floating-point tensors _share gives it
    from an earlier set of ALIKE_KEY (SHARED: the (alike key, argument) pairs seen)."""
    fresh = {storage: n for j, storage, n in parts if j is None or (alike_key, j) not in shared}
    shared.update((alike_key, j) for j, _, _ in parts if j is not None)
    return sum(fresh.values())


def _draws_on_meta():
    """A torch function mode that makes random draws on the meta device (the aten replay draws on its
    generator's device, the host, then moves: gigabytes filled to size them)."""
    import torch
    from torch.overrides import TorchFunctionMode

    class DrawsOnMeta(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if kwargs.get("generator") is not None:
                kwargs = {**kwargs, "device": torch.device("meta")}
            return func(*args, **kwargs)

    return DrawsOnMeta()
