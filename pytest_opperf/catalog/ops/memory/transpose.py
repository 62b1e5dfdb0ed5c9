"""Transpose into a new contiguous tensor: y[n, m] = x[m, n]^T.

A pure copy whose reads and writes cannot both be in order: its bandwidth is a ceiling for
layout changes (the K-major <-> N-major copies around GEMMs, head permutes). A backend must
return y contiguous; the check compares values only.
FLOPs: 0 (data movement only).
Bytes: 2*m*n*size (x read, y written once).
"""

import torch

from pytest_opperf.catalog.supports import same_dtype
from pytest_opperf.catalog.registry import Op, register_backend, register_op


def inputs(p, dt, device, gen):
    return (torch.randn(p["m"], p["n"], device=device, generator=gen, dtype=dt.input.torch),)


def reference(x):
    return x.double().t().contiguous()


def flops(p, dt):
    return 0


def nbytes(p, dt):
    return 2 * p["m"] * p["n"] * dt.input.itemsize


def tolerance(p, dt):
    return 0.0  # a copy: exact


OP = register_op(Op("transpose", ("m", "n"), inputs, reference, flops, nbytes, peak="vector", tolerance=tolerance,
                    description="y = x.T, contiguous"))


@register_backend("transpose", "torch", supports=same_dtype)
def transpose_torch(x):
    return x.t().contiguous()


@register_backend("transpose", "torch_copy", supports=same_dtype)
def transpose_copy(x):
    # copy_ into a preallocated tensor from the transposed view
    return torch.empty(x.shape[1], x.shape[0], dtype=x.dtype, device=x.device).copy_(x.t())
