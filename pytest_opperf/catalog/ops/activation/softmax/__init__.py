"""Softmax over the last dimension of x[m, n].

FLOPs: 5 per element (running max: 1, subtract: 1, exp: 1, sum: 1, divide: 1).
Bytes: x read, y written once: 2 * m * n * size.
"""

import torch

from pytest_opperf.catalog.backends import liger
from pytest_opperf.catalog.supports import same_dtype
from pytest_opperf.catalog.registry import Op, register_backend, register_op


def inputs(p, dt, device, gen):
    return (torch.randn(p["m"], p["n"], device=device, generator=gen, dtype=dt.input.torch),)


def reference(x):
    return torch.softmax(x.double(), dim=-1)


def flops(p, dt):
    return 5 * p["m"] * p["n"]


def nbytes(p, dt):
    return p["m"] * p["n"] * (dt.input.itemsize + dt.output.itemsize)


OP = register_op(Op("softmax", ("m", "n"), inputs, reference, flops, nbytes, peak="vector",
                    description="row softmax"))


@register_backend("softmax", "torch", supports=same_dtype)
def softmax_torch(x):
    return torch.softmax(x, dim=-1)


def _liger_row_fits(device_type, dtypes, capability, params):
    """liger's softmax keeps a whole row in one Triton block: longer rows raise at launch."""
    if params.get("n", 0) > liger.MAX_BLOCK:
        return f"liger's softmax holds a row in one block of at most {liger.MAX_BLOCK}; n = {params['n']}"
    return same_dtype(device_type, dtypes, capability)


@liger.backend("softmax", supports=_liger_row_fits)
def softmax_liger(x):
    return liger.ops().LigerSoftmaxFunction.apply(x)
