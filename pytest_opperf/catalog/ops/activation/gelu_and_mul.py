"""GeLU-and-multiply, the GeGLU activation of a gated MLP (Gemma): x[m, 2n] -> gelu(x[:, :n]) * x[:, n:].

The GeLU is the tanh approximation, 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))), as
Gemma's gelu_pytorch_tanh, vLLM's GeluAndMul(approximate="tanh") and liger-kernel's geglu
compute it (the erf GeLU differs from it by up to 5e-4 absolute, near g = -2.7).
FLOPs: 10 per output element (the tanh GeLU's 9, see gelu.py, and the multiply by up), m*n
outputs. Bytes: x read, y written once: 2*m*n * in_size + m*n * out_size.
"""

import math

import torch

from pytest_opperf.catalog.backends import liger
from pytest_opperf.catalog.supports import same_dtype
# The same input (the fused gate_up output) and the same traffic as SwiGLU's.
from pytest_opperf.catalog.ops.activation.silu_and_mul import inputs, nbytes
from pytest_opperf.catalog.registry import Op, register_backend, register_op

_C = math.sqrt(2.0 / math.pi)


def reference(x):
    x = x.double()
    gate, up = x.chunk(2, dim=-1)
    return 0.5 * gate * (1.0 + torch.tanh(_C * (gate + 0.044715 * gate ** 3))) * up


def flops(p, dt):
    return 10 * p["m"] * p["n"]


OP = register_op(Op("gelu_and_mul", ("m", "n"), inputs, reference, flops, nbytes, peak="vector",
                    description="gelu_tanh(x[:, :n]) * x[:, n:] (GeGLU, tanh GeLU) on the fused gate_up output"))


@register_backend("gelu_and_mul", "torch", supports=same_dtype)
def gelu_and_mul_torch(x):
    n = x.shape[-1] // 2
    return torch.nn.functional.gelu(x[..., :n], approximate="tanh") * x[..., n:]


@liger.backend("gelu_and_mul")
def gelu_and_mul_liger(x):
    # liger's geglu takes gate and up as two contiguous tensors (its GeGLU MLP has two
    # projections), so the two halves of our fused x[m, 2n] are copied out first, in the time.
    n = x.shape[-1] // 2
    return liger.ops().LigerGELUMulFunction.apply(x[..., :n], x[..., n:])
