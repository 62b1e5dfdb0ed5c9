"""A profiled input slot's type text, read: tensor lists, dtype spellings, bytes.

The profiler writes each input's type as text (``c10::BFloat16``, Ascend's ``DT_BF16``, ``long int``,
``Scalar``, ``TensorList``; a capture's typed list ``TensorList(bfloat16)``, reading/calls.py). The
readers size a slot from it (the capture's cache facts), mapping/ names its dtype; the names resolve
in pytest_opperf/dtypes.py.
"""

from __future__ import annotations

import math
from typing import Optional

from pytest_opperf import dtypes as dtype_table
from pytest_opperf.pipeline.reading.signature import parse_shapes


LIST = "TensorList"


def dtype_of_list(profiled: str) -> Optional[str]:
    """The dtype a tensor list's type text names: ``TensorList(bfloat16)`` (a capture's, capture.py)
    -> bfloat16; None for a bare ``TensorList`` (the trace's own: no dtype) or another type.

    >>> dtype_of_list("TensorList(bfloat16)"), dtype_of_list("TensorList"), dtype_of_list("c10::BFloat16")
    ('bfloat16', None, None)
    """
    text = (profiled or "").strip()
    if text.startswith(LIST + "(") and text.endswith(")"):
        return text[len(LIST) + 1:-1] or None
    return None


def is_list(profiled: str) -> bool:
    return (profiled or "").strip() == LIST or dtype_of_list(profiled) is not None


def torch_dtype_name(profiled: str) -> Optional[str]:
    """torch's name for a profiler's tensor dtype spelling, None when it is not one.

    >>> torch_dtype_name("c10::BFloat16"), torch_dtype_name("long int"), torch_dtype_name("Scalar")
    ('bfloat16', 'int64', None)
    """
    try:
        return dtype_table.lookup(profiled or "", any_tensor=True).torch_name
    except KeyError:
        return None


def profiled_dtype(text: Optional[str]) -> Optional[str]:
    """A profiler's dtype spelling as a catalogue dtype name, None when it names no tensor dtype.

    >>> profiled_dtype("DT_BF16"), profiled_dtype("c10::BFloat16"), profiled_dtype("FLOAT"), profiled_dtype("Scalar")
    ('bf16', 'bf16', 'fp32', None)
    """
    if not text:
        return None
    key = (dtype_of_list(text) or text).strip().lower()  # a capture's typed list: its tensors' dtype
    for prefix in ("dt_", "c10::", "torch."):  # Ascend's DT_BF16, torch's c10::BFloat16: the name after it
        key = key.removeprefix(prefix)
    try:
        return dtype_table.lookup(key).name
    except KeyError:
        return None


def slot_bytes(input_shapes: str, input_dtypes: str) -> Optional[list]:
    """Bytes of each input slot (0 for a scalar or an absent one); None when a tensor's dtype is not known."""
    out = []
    for slot, text in zip(parse_shapes(input_shapes), (input_dtypes or "").split(";")):
        shapes = slot if isinstance(slot, list) else [slot] if slot is not None else []
        if not shapes:
            out.append(0)
            continue
        name = "fp32" if text.strip() == LIST else profiled_dtype(text)  # TensorList(bfloat16): a capture's
        try:  # a mask (bool) or a byte index is a tensor dtype the catalogue's cases do not use
            itemsize = dtype_table.lookup(name or torch_dtype_name(text) or "", any_tensor=name is None).itemsize
        except KeyError:
            return None
        out.append(sum(math.prod(s) for s in shapes) * itemsize)
    return out
