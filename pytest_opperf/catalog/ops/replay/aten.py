"""Any aten call a torch.profiler trace recorded, replayed as itself.

`call` names the overload (aten::topk.default) and `args` its arguments as recorded: tensors of
the recorded shapes, strides and dtypes, the recorded scalars (the format and the assumptions
about tensor contents are in catalog/replay.py). `opperf import` writes these cases for the ops
no catalogue rule maps; a config may also list them by hand.

FLOPs: not counted (0): the op is any op; its MBU is the figure to read.
Bytes: each tensor input read once, each output written once (output sizes from calling the
overload on meta tensors).
The check: the same overload on the CPU, floating inputs in float64 (inputs over 64 MiB on an
accelerator: in float64 on it, where it has the kernel; replay.reference), against the device's output,
within the elementwise bound; a scan (cumsum, cumprod, logcumsumexp) within 2 u + sqrt(k) u of its
output dtype, k the scanned length: torch's CUDA scan adds in the output dtype (a bf16 cumsum of
32000 values on an H100 read 0.0179 normwise, against 0.0078 for 2 u).
"""

import math

from pytest_opperf.catalog import precision, replay
from pytest_opperf.catalog.registry import Op, register_backend, register_op


def inputs(p, dt, device, gen):
    return replay.build(p["call"], p["args"], device, gen)


def flops(p, dt):
    return 0


def nbytes(p, dt):
    return replay.nbytes(p["call"], p["args"])


def memory(p, dt):
    """Inputs and outputs, and the reference's host copies do not count: they live in host memory."""
    return 2 * nbytes(p, dt)


SCANS = ("aten::cumsum", "aten::cumprod", "aten::logcumsumexp")


def tolerance(p, dt):
    bound = precision.elementwise_tolerance(dt)
    if not p["call"].startswith(SCANS):
        return bound
    values = replay.decode_args(p["call"], p["args"])
    shape = replay.shape_of(values[0]) or (1,)
    dim = values[1] if len(values) > 1 and isinstance(values[1], int) else -1
    return bound + math.sqrt(shape[dim] if shape else 1) * precision.unit_roundoff(dt.output)


OP = register_op(Op("aten", ("call", "args"), inputs, replay.reference, flops, nbytes, peak="vector",
                    types={"call": str, "args": str}, memory=memory, tolerance=tolerance,
                    description="a recorded aten call replayed as itself (shapes, strides, dtypes, scalars)"))


def _supports(device_type, dt, capability, params):
    return replay.unbuildable(params["call"], params["args"])


@register_backend("aten", "torch", supports=_supports)
def aten_torch(call, *args):
    return replay.tensors_of(call(*args))
