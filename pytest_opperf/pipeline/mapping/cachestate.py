"""The cache state each signature replays in: the one that reproduces how the model ran it.

A replay that flushes the L2 before every call times a kernel that reads its inputs from device
memory; a replay that does not (``hot``) times it reading them from the L2. In a model the two
kinds of input differ: an activation was written by one of the kernels just before (a transformer
chains them), so it is still in the L2; a weight was last read one layer or one step earlier, and
the rest of the model's weights have passed through the L2 since. The trace cannot say which is
which by data flow: torch.profiler's record_shapes trace holds each op's dims, dtypes, strides and
scalars, no tensor ids or addresses (checked on torch 2.11 H100 traces). So the rule reads the
op's role:

- a signature whose **weights** (the parameter slots of ``WEIGHTS``: a linear's weight and bias,
  an embedding's table, a grouped GEMM's experts, a convolution's filters) hold more bytes than
  its other inputs replays ``cold``: its time is reading the weight from device memory;
- else it replays ``hot`` when all its tensor inputs together fit in half the profiled device's
  L2 (the other half for what the previous kernel read and wrote), ``cold`` when they do not.

Where the L2 is unknown (a CPU trace, an Ascend CSV without ``--l2-mb``) every signature replays
cold, the timer's default. The choice and its reason are columns of the profile database
(``cache``, ``cache_reason``) and of the replayed rows (``cache``).

Per input (``residency``, ``opperf import --cache-rule inputs``): each tensor input gets a state
of its own, since it is the inputs that differ (issue 44). A trace profiled inside
``capture(trace, model)`` says where each input came from (``input_sources``, see capture.py): a
parameter or buffer of the model, or made before the block (a KV cache), is ``cold``; the output
of an op is ``resident`` when what all ops wrote since, and its own bytes, fit half the L2, else
``cold``. Without a capture, a weight slot is ``cold``; an out= tensor is written, not read; every
other input's producer is not in a record_shapes trace (no tensor ids: checked on torch 2.11 H100
and 2.13 CPU traces), so it takes the default, ``resident`` (the output of a kernel just before)
when the call's non-weight inputs together fit half the L2, ``cold`` when they do not. Neither rule
is measured yet (no GPU run of them). A signature whose
inputs are all resident replays ``hot``, none ``cold``, a mix ``resident``: the timer flushes, then
reads exactly the resident inputs into the L2 (measure/inputs.py). Each slot's state and why are
the columns ``residency`` and ``residency_reason``; which of the case's input tensors they are is
``resident_inputs``, the replay config's per-case ``resident:``.
"""

from __future__ import annotations

import gzip
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from pytest_opperf.pipeline.reading.signature import parse_shapes
from pytest_opperf.pipeline.reading.slots import slot_bytes

HOT, COLD, RESIDENT = "hot", "cold", "resident"
RULES = ("signature", "inputs")  # opperf import --cache-rule: one state per signature, or per input
_DEVICE_NAME = re.compile(r'"deviceProperties"\s*:\s*\[\s*\{[^}]*?"name"\s*:\s*"([^"]+)"')
_HEAD_BYTES = 1 << 20  # deviceProperties sits before or after the events; its head is read first
# op -> its input slots that hold parameters (read from device memory in the model: see the module doc).
# aten::addmm is GPT-2's Conv1D (torch.addmm(bias, x, weight)); nn.Linear is recorded as aten::linear.
WEIGHTS = {
    "aten::linear": (1, 2), "aten::addmm": (0, 2), "aten::_grouped_mm": (1, 3), "aten::embedding": (0,),
    "aten::conv1d": (1, 2), "aten::conv2d": (1, 2), "aten::conv3d": (1, 2), "aten::convolution": (1, 2),
    "aten::_convolution": (1, 2),
}


def l2_bytes_of_trace(path: Path) -> Optional[int]:
    """The L2 of the GPU a torch.profiler trace ran on, from its ``deviceProperties`` name and the
    hardware specs; None when the trace names no device or the spec has no L2 size."""
    from pytest_opperf.hardware.specs import load_specs, resolve_alias

    try:
        with open(path, "rb") as raw:
            head = raw.read(2)
        opener = gzip.open if head == b"\x1f\x8b" else open
        with opener(path, "rb") as fh:
            text = fh.read(_HEAD_BYTES).decode("utf-8", "replace")
            found = _DEVICE_NAME.search(text)
            if found is None:
                text = _tail(fh)
                found = _DEVICE_NAME.search(text)
    except (OSError, EOFError):
        return None
    if found is None:
        return None
    spec = resolve_alias(load_specs(), found.group(1))
    if spec is None or not spec.l2_mbytes:
        return None
    return int(spec.l2_mbytes * 2**20)


def _tail(fh) -> str:
    """The last MiB of the file (a gzip stream is read through to get there)."""
    last = b""
    while True:
        block = fh.read(_HEAD_BYTES)
        if not block:
            return last.decode("utf-8", "replace")
        last = (last + block)[-_HEAD_BYTES:]


def input_bytes(input_shapes: str, input_dtypes: str) -> Optional[int]:
    """Bytes of a signature's tensor inputs; None when a tensor's dtype is not known.

    >>> input_bytes("64,128;128", "c10::BFloat16;float"), input_bytes("4;", "long int;Scalar"), input_bytes("8", "bool")
    (16896, 32, 8)
    """
    sizes = slot_bytes(input_shapes, input_dtypes)
    return None if sizes is None else sum(sizes)


def choose(op_type: str, input_shapes: str, input_dtypes: str, l2_bytes: Optional[int]) -> tuple[str, str]:
    """(cache state, why) for one signature: see the module doc.

    >>> choose("aten::linear", "1,1,512;2048,512;", "c10::BFloat16;c10::BFloat16;", 50 * 2**20)[0]
    'cold'
    >>> choose("aten::add", "1,1,512;1,1,512;", "c10::BFloat16;c10::BFloat16;Scalar", 50 * 2**20)[0]
    'hot'
    """
    if not l2_bytes:
        return COLD, "the profiled device's L2 size is unknown: replayed cold"
    sizes = slot_bytes(input_shapes, input_dtypes)
    if sizes is None:
        return COLD, "an input's dtype is unknown: replayed cold"
    weights = sum(sizes[i] for i in WEIGHTS.get(op_type, ()) if i < len(sizes))
    size = sum(sizes)
    if weights and weights > size - weights:
        return COLD, (f"its weights ({weights / 2**20:.2f} MiB) outweigh its other inputs: the model read them "
                      f"from device memory, not from the L2")
    mib = f"{size / 2**20:.2f} MiB of inputs"
    if size <= l2_bytes // 2:
        return HOT, f"{mib} fit half the {l2_bytes / 2**20:g} MiB L2: the kernels before left them there"
    return COLD, f"{mib} exceed half the {l2_bytes / 2**20:g} MiB L2: read from device memory"


@dataclass(frozen=True)
class Residency:
    """Where each input slot of a signature was when the model's kernel read it."""

    slots: tuple  # per input slot: RESIDENT, COLD, or "" (no tensor the call reads)
    reasons: tuple  # per slot, why ("" for a slot that is not one)

    @property
    def cache(self) -> str:
        """The signature's cache state: hot when every tensor input is resident, cold when none is,
        resident (flush, then read the resident ones) for a mix."""
        states = {s for s in self.slots if s}
        if states == {RESIDENT}:
            return HOT
        return RESIDENT if RESIDENT in states else COLD

    @property
    def resident_slots(self) -> tuple:
        return tuple(i for i, s in enumerate(self.slots) if s == RESIDENT)

    def summary(self) -> str:
        """One line for cache_reason: in0 resident, in1 cold."""
        return ", ".join(f"in{i} {s}" for i, s in enumerate(self.slots) if s) or "no tensor inputs"


# A capture's source of an input (trace._sources) -> its state and why.
CAPTURED = {
    "p": (COLD, "a parameter or buffer of the model (capture): read from device memory"),
    "o": (COLD, "made before the captured block, not a parameter (a KV cache, an input; capture): cold"),
    "r": (RESIDENT, "written by an op just before, and all written since fits half the L2 (capture)"),
    "e": (COLD, "written by an op, but more than half the L2 was written since (capture)"),
}


def residency(op_type: str, input_shapes: str, input_dtypes: str, l2_bytes: Optional[int],
              outputs: frozenset = frozenset(), sources: str = "") -> Residency:
    """Each input slot's state (see the module doc); OUTPUTS: the slots of out= tensors; SOURCES:
    where a capture saw each input come from (``r;p;``, see CAPTURED), which decides over the roles.

    >>> r = residency("aten::linear", "1,1,512;2048,512;", "c10::BFloat16;c10::BFloat16;", 50 * 2**20)
    >>> r.slots, r.cache
    (('resident', 'cold', ''), 'resident')
    """
    sizes = slot_bytes(input_shapes, input_dtypes)
    count = len(parse_shapes(input_shapes))
    if sizes is None:
        return _all(count, [], COLD, "an input's dtype is unknown: cold")
    if not l2_bytes:
        return _all(count, sizes, COLD, "the profiled device's L2 size is unknown: cold")
    weights = set(WEIGHTS.get(op_type, ()))
    others = sum(b for i, b in enumerate(sizes) if i not in weights and i not in outputs)
    fits = others <= l2_bytes // 2
    share = f"{others / 2**20:.2f} MiB of non-weight inputs {'fit' if fits else 'exceed'} half the " \
            f"{l2_bytes / 2**20:g} MiB L2"
    seen = (sources or "").split(";")
    slots, reasons = [], []
    for i, size in enumerate(sizes):
        if not size:
            state, why = "", ""
        elif i in outputs:
            state, why = "", "an out= tensor: written by the call, not read"
        elif i < len(seen) and seen[i] in CAPTURED:
            state, why = CAPTURED[seen[i]]
        elif i in weights:
            state, why = COLD, (f"a parameter slot of {op_type}: last read a layer or a step before, read from "
                                f"device memory")
        else:
            state = RESIDENT if fits else COLD
            why = f"producer not in the trace (no tensor ids): the default, {state}: {share}"
        slots.append(state)
        reasons.append(why)
    return Residency(tuple(slots), tuple(reasons))


def _all(count: int, sizes: list, where: str, why: str) -> Residency:
    """Every tensor slot in one state (WHERE), for one reason."""
    tensor = [bool(sizes[i]) if i < len(sizes) else True for i in range(count)]
    return Residency(tuple(where if t else "" for t in tensor), tuple(why if t else "" for t in tensor))


def tensor_positions(op: str, params: dict, dtype: str, input_shapes: str, slots: tuple) -> Optional[tuple]:
    """Positions, among the case's input tensors (the op's inputs() order, tensors inside lists not
    counted), of the profiled input SLOTS; None when they cannot be told apart.

    ``aten`` (replayed as itself) takes its arguments in the recorded order: exact, but a resident
    tensor list (aten::cat's inputs) is not one the timer reads, so None. A catalogue
    op's inputs are built on the meta device and told from each other by their element counts:
    a slot matches the op's inputs of as many elements (all of them, when several have that count),
    and the slots cannot be told apart (None) when the profile gives one count to slots in
    different states, or a resident slot's count to none of the op's inputs.
    """
    from pytest_opperf.catalog import replay

    if op == "aten":
        values = replay.decode_args(params["call"], params["args"])
        positions, seen = [], 0
        for i, value in enumerate(values):
            if replay.is_tensor_list(value) and i in slots:
                return None
            if replay.is_tensor_text(value):
                if i in slots:
                    positions.append(seen)
                seen += 1
        return tuple(positions)
    tensors = _meta_inputs(op, params, dtype)
    if tensors is None:
        return None
    profiled = [math.prod(s) if isinstance(s, tuple) and s else None for s in parse_shapes(input_shapes)]
    chosen = set(slots)
    positions = []
    for numel in {n for n in profiled if n}:
        states = {i in chosen for i, n in enumerate(profiled) if n == numel}
        if len(states) > 1:
            return None  # one size in both states: which input is which is not known
        matching = [p for p, t in enumerate(tensors) if t.numel() == numel]
        if not matching and states == {True}:
            return None  # a resident slot the op's inputs do not hold
        if states == {True}:
            positions.extend(matching)
    return tuple(sorted(positions))


def _meta_inputs(op: str, params: dict, dtype: str) -> Optional[list]:
    """The op's input tensors for these parameters, built on the meta device; None when it cannot."""
    import torch

    from pytest_opperf.catalog import load_builtin
    from pytest_opperf.catalog.registry import OPS, DTypes
    from pytest_opperf.dtypes import lookup

    load_builtin()
    first, _, second = (dtype or "").partition("-")
    try:
        dt = DTypes(lookup(first), lookup(second or first))
        made = OPS[op].inputs({**OPS[op].defaults, **params}, dt, torch.device("meta"), None)
    except Exception:  # noqa: BLE001  (an op whose inputs cannot be made without data: not told apart)
        return None
    return [a for a in made if isinstance(a, torch.Tensor)]


def reasons_text(r: Residency) -> str:
    """The residency_reason column: JSON, one text per slot."""
    return json.dumps(list(r.reasons))
