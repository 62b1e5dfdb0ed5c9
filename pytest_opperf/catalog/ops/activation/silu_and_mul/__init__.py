"""SiLU-and-multiply, the SwiGLU activation of a gated MLP: x[m, 2n] -> silu(x[:, :n]) * x[:, n:].

x is the output of the fused gate_up projection (gate in the first half of each row, up in
the second, as vLLM's SiluAndMul takes it); silu(g) = g / (1 + exp(-g)).
FLOPs: 5 per output element (negate: 1, exp: 1, +1: 1, divide: 1, multiply by up: 1), m*n
outputs.
Bytes: x read, y written once: 2*m*n * in_size + m*n * out_size.
"""

import torch

from pytest_opperf.catalog.backends import liger
from pytest_opperf.catalog.supports import same_dtype
from pytest_opperf.catalog.registry import Op, register_backend, register_op


def inputs(p, dt, device, gen):
    return (torch.randn(p["m"], 2 * p["n"], device=device, generator=gen, dtype=dt.input.torch),)


def reference(x):
    x = x.double()
    gate, up = x.chunk(2, dim=-1)
    return gate / (1.0 + torch.exp(-gate)) * up


def flops(p, dt):
    return 5 * p["m"] * p["n"]


def nbytes(p, dt):
    m, n = p["m"], p["n"]
    return 2 * m * n * dt.input.itemsize + m * n * dt.output.itemsize


OP = register_op(Op("silu_and_mul", ("m", "n"), inputs, reference, flops, nbytes, peak="vector",
                    description="silu(x[:, :n]) * x[:, n:] (SwiGLU) on the fused gate_up output x[m, 2n]"))


@register_backend("silu_and_mul", "torch", supports=same_dtype)
def silu_and_mul_torch(x):
    n = x.shape[-1] // 2
    return torch.nn.functional.silu(x[..., :n]) * x[..., n:]


@liger.backend("silu_and_mul")
def silu_and_mul_liger(x):
    # liger's fused gate_up kernel reads x[m, 2n] in place
    return liger.ops().LigerFusedGateUpSiLUMulFunction.apply(x)
