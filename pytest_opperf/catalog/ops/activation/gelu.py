"""GeLU, tanh approximation: y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).

Two backends make the comparison of seed 004: `torch` is the fused F.gelu kernel;
`torch_unfused` spells the formula out, one kernel (and one trip to memory) per step.
FLOPs: 9*n (x*x*x: 2, *0.044715: 1, +x: 1, *sqrt(2/pi): 1, tanh: 1, +1: 1, *x: 1, *0.5: 1).
Bytes: n*(in_size + out_size) (x read, y written once).
"""

import math

import torch

from pytest_opperf.catalog.supports import same_dtype
from pytest_opperf.catalog.registry import Op, register_backend, register_op

_C = math.sqrt(2.0 / math.pi)


def inputs(p, dt, device, gen):
    return (torch.randn(p["n"], device=device, generator=gen, dtype=dt.input.torch),)


def reference(x):
    x = x.double()
    return 0.5 * x * (1.0 + torch.tanh(_C * (x + 0.044715 * x ** 3)))


def flops(p, dt):
    return 9 * p["n"]


def nbytes(p, dt):
    return p["n"] * (dt.input.itemsize + dt.output.itemsize)


OP = register_op(Op("gelu", ("n",), inputs, reference, flops, nbytes, peak="vector",
                    description="tanh-approximated GeLU"))


@register_backend("gelu", "torch", supports=same_dtype)
def gelu_torch(x):
    return torch.nn.functional.gelu(x, approximate="tanh")


@register_backend("gelu", "torch_unfused", supports=same_dtype)
def gelu_unfused(x):
    return 0.5 * x * (1.0 + torch.tanh(_C * (x + 0.044715 * x * x * x)))
