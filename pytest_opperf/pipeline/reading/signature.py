"""Profiled op instances and their aggregation into signatures.

A signature is what the seed's per-kernel CSVs key rows on: the op type (a variant suffix
such as ``_0`` removed), the input shapes, dtypes and formats, the output shapes and dtypes.
Shapes are kept in the profiler's own text form: ``;`` between tensor slots, ``,`` between
dimensions, an empty slot left empty (optional inputs and scalars keep their position), and
``+`` between the tensors of a tensor-list slot (``aten::cat``'s inputs)::

    >>> parse_shapes("136,7168;;7168,3584")
    [(136, 7168), None, (7168, 3584)]
    >>> format_shapes([(136, 7168), None, [(2, 3), (2, 1)]])
    '136,7168;;2,3+2,1'
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from typing import Optional, Union

Slot = Union[None, tuple, list]

_VARIANT = re.compile(r"_\d+$")


class ProfileError(Exception):
    """Input the importer cannot read; the message names the file and what was expected."""


def normalise_type(name: str) -> str:
    """A kernel type without its variant suffix: ``muls_add_kernel_1`` -> ``muls_add_kernel``.

    >>> normalise_type("split_qkv_rmsnorm_rope_kernel_0"), normalise_type("MatMulV2")
    ('split_qkv_rmsnorm_rope_kernel', 'MatMulV2')
    """
    return _VARIANT.sub("", name.strip())


def parse_shapes(text: str) -> list[Slot]:
    """Slots of a shape field: a tuple of dims, None for an empty slot, a list for a tensor list."""
    text = (text or "").strip().strip('"')
    if not text:
        return []
    slots: list[Slot] = []
    for part in text.split(";"):
        part = part.strip()
        if not part:
            slots.append(None)
        elif "+" in part:
            slots.append([_dims(p) for p in part.split("+")])
        else:
            slots.append(_dims(part))
    return slots


def _dims(text: str) -> tuple:
    text = text.strip()
    if not text:
        return ()
    return tuple(int(d) for d in text.split(","))


def format_shapes(slots: list[Slot]) -> str:
    parts = []
    for slot in slots:
        if slot is None:
            parts.append("")
        elif isinstance(slot, list):
            parts.append("+".join(",".join(map(str, s)) for s in slot))
        else:
            parts.append(",".join(map(str, slot)))
    return ";".join(parts)


@dataclass(frozen=True)
class Instance:
    """One profiled call of an op: its type and tensors as the profiler wrote them, and its time."""

    op_type: str
    input_shapes: str
    input_dtypes: str
    duration_us: float
    input_formats: str = ""
    output_shapes: str = ""
    output_dtypes: str = ""
    kernels: tuple = ()  # the kernel names it ran (traces with device kernels)
    input_strides: str = ""  # torch.profiler's Input Strides, in the shapes' text form
    input_values: str = ""   # torch.profiler's Concrete Inputs, as JSON text
    input_sources: str = ""  # where each input came from, per slot, from a capture (trace._sources)
    # Its place in the profiled sequence (pipeline/calls.py): the call's position in time order (None:
    # not a call of the sequence, a kernel no op launched), its step and phase, and per input slot the
    # position of the earlier call whose output it read (a capture's; None where not known).
    position: Optional[int] = None
    step: Optional[int] = None
    phase: str = ""
    links: tuple = ()

    @property
    def key(self) -> tuple:
        return (self.op_type, self.input_shapes, self.input_dtypes, self.input_formats,
                self.output_shapes, self.output_dtypes, self.input_strides, self.input_values, self.input_sources)


@dataclass
class Signature:
    """Instances of one signature: count and duration statistics, as the seed's parser gives them."""

    source: str
    time_source: str
    op_type: str
    input_shapes: str
    input_dtypes: str
    input_formats: str
    output_shapes: str
    output_dtypes: str
    input_strides: str = ""
    input_values: str = ""
    input_sources: str = ""  # per slot: p a weight, o made before the block, r written recently, e earlier
    durations_us: list = field(default_factory=list)
    kernels: dict = field(default_factory=dict)  # kernel name -> times seen
    calls: list = field(default_factory=list)  # its instances in the sequence: (position, step, phase, links, us)
    context: dict = field(default_factory=dict)  # facts of the run the mapping may read (world_size, ...)

    @property
    def count(self) -> int:
        return len(self.durations_us)

    @property
    def mean_us(self) -> float:
        return statistics.fmean(self.durations_us)

    @property
    def median_us(self) -> float:
        return statistics.median(self.durations_us)

    @property
    def std_us(self) -> float:
        return statistics.stdev(self.durations_us) if self.count > 1 else 0.0

    @property
    def total_us(self) -> float:
        return sum(self.durations_us)


def aggregate(instances: list[Instance], source: str, time_source: str) -> list[Signature]:
    """Group instances by signature, in order of first appearance."""
    groups: dict[tuple, Signature] = {}
    for inst in instances:
        sig = groups.get(inst.key)
        if sig is None:
            sig = groups[inst.key] = Signature(source, time_source, *inst.key)
        sig.durations_us.append(inst.duration_us)
        if inst.position is not None:
            sig.calls.append((inst.position, inst.step, inst.phase, inst.links, inst.duration_us))
        for name in inst.kernels:
            sig.kernels[name] = sig.kernels.get(name, 0) + 1
    return list(groups.values())

