"""Softmax over the last dimension of x[m, n].

FLOPs: 5 per element (running max: 1, subtract: 1, exp: 1, sum: 1, divide: 1).
Bytes: x read, y written once: 2 * m * n * size.
"""

import torch

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
