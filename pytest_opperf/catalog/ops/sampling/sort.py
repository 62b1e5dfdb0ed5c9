"""Sort of each row, ascending: values and the indices that order them (Ascend's Sort, torch.sort).

x[m, n] -> (values[m, n] in x's dtype, indices[m, n] int64). Samplers sort the vocabulary's
probabilities (top-p); MoE dispatch sorts token-expert pairs; an embedding's backward sorts ids.
Inputs hold distinct values within a row, so every correct kernel returns the same indices and
the check compares both outputs exactly.
FLOPs: 0 (a sort compares and moves; it does no floating-point arithmetic: read its MBU).
Bytes: m*n*(2*size + 8) (x read once, values and int64 indices written once).
"""

import torch

from pytest_opperf.catalog import replay
from pytest_opperf.catalog.supports import same_dtype
from pytest_opperf.catalog.registry import Op, register_backend, register_op


def inputs(p, dt, device, gen):
    return (replay.distinct_rows(p["m"], p["n"], dt.input.torch, device, gen),)


def reference(x):
    values, indices = torch.sort(x.detach().cpu().double(), dim=-1)
    return values, indices


def flops(p, dt):
    return 0


def nbytes(p, dt):
    return p["m"] * p["n"] * (2 * dt.input.itemsize + 8)


def tolerance(p, dt):
    return 0.0  # a permutation of the input: exact


OP = register_op(Op("sort", ("m", "n"), inputs, reference, flops, nbytes, peak="vector", tolerance=tolerance,
                    description="each row sorted ascending: values and int64 indices"))


@register_backend("sort", "torch", supports=same_dtype)
def sort_torch(x):
    values, indices = torch.sort(x, dim=-1)
    return values, indices
