"""Signatures no catalogue rule maps, replayed as the aten op itself (the catalogue's ``aten`` op).

torch.profiler traces of torch >= 2.1 record each op's input strides and scalar arguments
(``Input Strides``, ``Concrete Inputs``): with them ``catalog/replay.py`` binds the call to its
overload and the signature becomes a case of ``aten`` with ``call`` and ``args``. What the replay
assumes (tensor contents the trace does not hold) goes into the signature's note; a call that
cannot be bound is unreplayable with the reason.
"""

from __future__ import annotations

import functools
import json

from pytest_opperf.catalog import replay
from pytest_opperf.pipeline.mapping import bind
from pytest_opperf.pipeline.reading.signature import parse_shapes

_HOST_COPY = ("Memcpy HtoD", "memcpy htod", "Memcpy HostToDevice")
_TO_HOST = ("Memcpy DtoH", "memcpy dtoh", "Memcpy DeviceToHost")
# Ops that copy between devices: the trace writes their device argument without the device, so
# their kernels tell which way the copy went.
_COPIES = ("aten::to", "aten::_to_copy", "aten::copy_")


def claimable(op_type: str, input_values: str) -> bool:
    """An aten op of a trace that recorded scalar arguments, and that this torch has."""
    return bool(input_values) and op_type.startswith("aten::") and _known(op_type)


@functools.lru_cache(maxsize=None)
def _known(op_type: str) -> bool:
    import torch

    base = op_type[len("aten::"):]
    return hasattr(torch.ops.aten, base) or (base.endswith("_") and hasattr(torch.ops.aten, base[:-1]))


def resolve(sig, main_dtype: str) -> dict:
    """The Resolution fields (a dict) of a signature replayed as its aten op."""
    types = (sig.input_dtypes or "").split(";")
    # One 0-dim slot is written as an empty text, as no slot is: the types say how many there are.
    shapes = parse_shapes(sig.input_shapes) or [None] * len(types)
    strides = parse_shapes(sig.input_strides) or [None] * len(shapes)
    values = json.loads(sig.input_values) if sig.input_values else [""] * len(shapes)
    if not (len(shapes) == len(types) == len(values) == len(strides)):
        return _unreplayable(f"the trace's Input Dims, Input type, Input Strides and Concrete Inputs have different "
                             f"lengths ({len(shapes)}, {len(types)}, {len(strides)}, {len(values)})")
    host, to_host = _copy_direction(sig.op_type, list(sig.kernels or ()))
    try:
        bound = bind.bind(sig.op_type, shapes, strides, types, values, host_input=host, list_dtype=main_dtype,
                          host_output=to_host)
        label = _dtype_label(bound)
    except bind.Unbindable as exc:
        return _unreplayable(f"not replayable as itself: {exc}")
    head = "replayed as itself, with an assumed index count" if bound.proxy else "replayed as itself"
    note = "; ".join((head,) + bound.assumptions)
    return dict(status="mapped", op="aten", backend="torch", dtype=label, params={"call": bound.call, "args": bound.args},
                proxy=bound.proxy, note=note, reason="")


def _copy_direction(op_type: str, kernels: list) -> tuple[bool, bool]:
    """(reads host memory, writes host memory), from the kernels the call ran: an op whose every
    kernel is a host-to-device copy reads the host; a copy op (to, _to_copy, copy_) that ran such a
    copy among others (a cast on the device after it) does too, and one that ran a device-to-host
    copy writes the host.

    >>> _copy_direction("aten::to", ["Memcpy DtoH (Device -> Pageable)"])
    (False, True)
    >>> _copy_direction("aten::to", ["Memcpy HtoD (Pageable -> Device)", "elementwise_kernel"])
    (True, False)
    """
    if not kernels:
        return False, False
    from_host = [any(h in name for h in _HOST_COPY) for name in kernels]
    copy = op_type in _COPIES
    return all(from_host) or (copy and any(from_host)), copy and any(any(h in n for h in _TO_HOST) for n in kernels)


def _unreplayable(reason: str) -> dict:
    return dict(status="unreplayable", op="aten", backend="torch", reason=reason)


def _dtype_label(bound) -> str:
    """The case's dtype: its first floating input's (else its first input's), and its first
    output's when that is a different floating dtype ("bf16-fp32")."""
    from pytest_opperf.dtypes import lookup

    kinds = replay.tensor_dtypes(json.loads(bound.args))
    inputs = [k for k in kinds if _catalogue(k) and lookup(_catalogue(k)).is_float] or \
        [k for k in kinds if _catalogue(k)] or ["float32"]
    first = _catalogue(inputs[0])
    out = _catalogue(replay.output_dtype(bound.call, json.loads(bound.args)) or "")
    if out and out != first and lookup(out).is_float:
        return f"{first}-{out}"
    return first


def _catalogue(torch_name: str):
    from pytest_opperf.dtypes import lookup

    try:
        return lookup(torch_name).name
    except KeyError:
        return None
