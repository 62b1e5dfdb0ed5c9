"""Elementwise add: c[n] = a[n] + b[n].

FLOPs: n.
Bytes: 2*n*in_size + n*out_size (two inputs read, one output written).
"""

import torch

from pytest_opperf.catalog.supports import same_dtype
from pytest_opperf.catalog.registry import Op, register_backend, register_op


def inputs(p, dt, device, gen):
    n = p["n"]
    return (torch.randn(n, device=device, generator=gen, dtype=dt.input.torch),
            torch.randn(n, device=device, generator=gen, dtype=dt.input.torch))


def reference(a, b):
    return a.double() + b.double()


def flops(p, dt):
    return p["n"]


def nbytes(p, dt):
    return 2 * p["n"] * dt.input.itemsize + p["n"] * dt.output.itemsize


OP = register_op(Op("add", ("n",), inputs, reference, flops, nbytes, peak="vector", description="c = a + b"))


@register_backend("add", "torch", supports=same_dtype)
def add_torch(a, b):
    return torch.add(a, b)
