"""Linear layer: y[m, n] = act(x[m, k] @ W[n, k]^T + bias[n]), W stored as torch.nn.Linear stores it.

`activation` is none, gelu (tanh approximation, as the gelu op and cuBLASLt's GELU epilogue),
silu or relu.
FLOPs: 2*m*n*k for the GEMM + m*n for the bias + m*n * (FLOPs of the activation per element):
none 0; relu 1 (max); silu 4 (x / (1 + exp(-x)): negate, exp, add, divide); gelu 9 (as the
gelu op: x*x*x 2, *0.044715 1, +x 1, *sqrt(2/pi) 1, tanh 1, +1 1, *x 1, *0.5 1).
Bytes: x, W and bias read once, y written once: (m*k + n*k + n) * in_size + m*n * out_size.
The check's bound grows with k (see catalog/precision.py).
"""

import math

import torch
import torch.nn.functional as F

from pytest_opperf.catalog.supports import same_dtype
from pytest_opperf.catalog.precision import reduction_tolerance
from pytest_opperf.catalog.registry import Op, register_backend, register_op

ACTIVATION_FLOPS = {"none": 0, "relu": 1, "silu": 4, "gelu": 9}


def _activation(p) -> str:
    name = p["activation"]
    if name not in ACTIVATION_FLOPS:
        raise ValueError(f"linear: activation={name!r}: expected one of {', '.join(ACTIVATION_FLOPS)}")
    return name


def inputs(p, dt, device, gen):
    m, n, k = p["m"], p["n"], p["k"]
    x = torch.randn(m, k, device=device, generator=gen, dtype=dt.input.torch)
    # Scaled as nn.Linear initialises it, so x @ W^T stays near unit size and the activation's
    # curved part (|y| < 3) is where the outputs land.
    w = torch.randn(n, k, device=device, generator=gen, dtype=dt.input.torch) / math.sqrt(k)
    bias = torch.randn(n, device=device, generator=gen, dtype=dt.input.torch)
    return x, w, bias, _activation(p)


def _apply(y, activation):
    if activation == "gelu":
        return F.gelu(y, approximate="tanh")
    if activation == "silu":
        return F.silu(y)
    if activation == "relu":
        return F.relu(y)
    return y


def reference(x, w, bias, activation):
    return _apply(x.double() @ w.double().t() + bias.double(), activation)


def flops(p, dt):
    m, n, k = p["m"], p["n"], p["k"]
    return 2 * m * n * k + m * n * (1 + ACTIVATION_FLOPS[_activation(p)])


def nbytes(p, dt):
    m, n, k = p["m"], p["n"], p["k"]
    return (m * k + n * k + n) * dt.input.itemsize + m * n * dt.output.itemsize


def tolerance(p, dt):
    return reduction_tolerance(p["k"], dt)


OP = register_op(Op("linear", ("m", "n", "k", "activation"), inputs, reference, flops, nbytes, peak="matrix",
                    defaults={"activation": "none"}, types={"activation": str},
                    description="y = act(x @ W^T + bias)", tolerance=tolerance))


@register_backend("linear", "torch", supports=same_dtype)
def linear_torch(x, w, bias, activation):
    return _apply(F.linear(x, w, bias), activation)


def _fused_supports(device_type, dt, capability, p):
    if device_type != "cuda":
        return ("torch._addmm_activation fuses the activation into cuBLASLt's epilogue on CUDA only "
                "(elsewhere it is addmm, then an exact-erf GELU)")
    if p["activation"] not in ("relu", "gelu"):
        return f"cuBLASLt's epilogue has relu and gelu, not {p['activation']}"
    return same_dtype(device_type, dt, capability)


@register_backend("linear", "torch_addmm_act", supports=_fused_supports)
def linear_addmm_activation(x, w, bias, activation):
    """Bias and activation in the GEMM's epilogue (one kernel) instead of a kernel after it."""
    return torch._addmm_activation(bias, x, w.t(), use_gelu=activation == "gelu")
