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
"""

from __future__ import annotations

import gzip
import math
import re
from pathlib import Path
from typing import Optional

from pytest_opperf.pipeline.signature import parse_shapes

HOT, COLD = "hot", "cold"
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


def slot_bytes(input_shapes: str, input_dtypes: str) -> Optional[list]:
    """Bytes of each input slot (0 for a scalar or an absent one); None when a tensor's dtype is not known."""
    from pytest_opperf.pipeline.bind import torch_dtype_name
    from pytest_opperf.pipeline.mapping import profiled_dtype
    from pytest_opperf.dtypes import lookup

    out = []
    for slot, text in zip(parse_shapes(input_shapes), (input_dtypes or "").split(";")):
        shapes = slot if isinstance(slot, list) else [slot] if slot is not None else []
        if not shapes:
            out.append(0)
            continue
        name = profiled_dtype(text) if text.strip() != "TensorList" else "fp32"
        try:  # a mask (bool) or a byte index is a tensor dtype the catalogue's cases do not use
            itemsize = lookup(name or torch_dtype_name(text) or "", any_tensor=name is None).itemsize
        except KeyError:
            return None
        out.append(sum(math.prod(s) for s in shapes) * itemsize)
    return out


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
