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
  ``--inputs per-signature`` all calls of a signature share one set (less memory);
- an input the capture saw written by an earlier call (the ``links``) is that call's output, as it
  ran: the data flow, and so the L2, of the model; so is each tensor of a tensor list (the ``cat``
  of a KV cache reads the last step's ``cat`` and the new key). Only floating-point inputs are
  linked: an index or a mask keeps the contents its replay assumes. An output is kept until its
  last reader ran.

Calls of signatures that are not mapped, or whose backend cannot run here, are left out (``Plan.left_out``),
and so is their time on both sides: the sums compare the same calls.
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


def device_of(name: Optional[str], time_source: str):
    """The torch device to replay on: NAME, else cuda for a profile of device kernel times, else cpu."""
    import torch

    if name is None:
        if time_source == "kernel" and not torch.cuda.is_available():
            raise ProfileError("the profile holds device kernel times and this machine has no CUDA device: replay it "
                               "on the kind of device it was profiled on (--device NAME)")
        name = "cuda" if time_source == "kernel" else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ProfileError(f"--device={name}: not a torch device ({short(exc)})") from None
    module = getattr(torch, device.type, None)
    if device.type != "cpu" and not (module is not None and hasattr(module, "is_available") and module.is_available()):
        raise ProfileError(f"--device={name}: no such device on this machine")
    if device.type == "cpu" and time_source == "kernel":
        raise ProfileError(f"--device={name}: the profile holds device kernel times, a CPU has none to compare")
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
    by_id = {r["id"]: r for r in rows}
    built: dict = {}       # signature id -> (fn, make(seed) -> args) or None
    out = Plan([])
    made: dict = {}        # inputs key -> arguments
    ordinal: dict = defaultdict(int)
    shared: dict = {}      # (op, dtype, shapes, strides, k-th such call in its step, argument) -> tensor
    alike: dict = defaultdict(int)
    capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    for c in calls:
        sig = by_id.get(c["signature"])
        if sig is None:
            continue
        if sig["id"] not in built:
            built[sig["id"]] = _built(sig, device, capability, out)
        if built[sig["id"]] is None:
            continue
        fn, make = built[sig["id"]]
        key = (sig["id"],) if inputs == "per-signature" else (sig["id"], c["step"], ordinal[(sig["id"], c["step"])])
        ordinal[(sig["id"], c["step"])] += 1
        shape = (sig["op"], sig["dtype"], sig["input_shapes"], sig.get("input_strides") or "")
        kth = alike[(shape, c["step"])]
        alike[(shape, c["step"])] += 1
        if key not in made:
            try:
                made[key] = make(seed + c["position"])
            except Exception as exc:  # noqa: BLE001  (one signature's inputs must not end the run)
                out.left_out[sig["id"]] = f"its inputs could not be made ({short(exc)})"
                built[sig["id"]] = None
                continue
            if inputs == "per-call":
                made[key] = _share(made[key], shared, (*shape, kth), torch)
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
    """(fn, make(seed) -> arguments) of a signature; None (and why, in
    out.left_out) when it is not replayed here."""
    import torch

    from pytest_opperf.catalog.registry import BACKENDS, OPS

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

    def make(seed: int):
        gen = torch.Generator(device=device).manual_seed(seed)
        with torch.inference_mode():
            return op.inputs(params, dtypes, device, gen)

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
