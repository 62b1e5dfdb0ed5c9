"""Batched GEMM: C[b, m, n] = A[b, m, k] @ B[b, k, n], one independent GEMM per batch index.

In LLM inference: MLA's per-head projections with the absorbed weights (DeepSeek-V3: 128 heads,
q_nope (128, tokens, 128) @ W_UK (128, 128, 512), and the latent output back through W_UV).

FLOPs: 2*b*m*n*k.
Bytes: b*(m*k + k*n) * in_size + b*m*n * out_size.
The check's bound grows with k (see catalog/precision.py).
"""

import torch

from pytest_opperf.catalog.supports import same_dtype
from pytest_opperf.catalog.precision import reduction_tolerance
from pytest_opperf.catalog.registry import Op, register_backend, register_op


def inputs(p, dt, device, gen):
    b, m, n, k = p["b"], p["m"], p["n"], p["k"]
    x = torch.randn(b, m, k, device=device, generator=gen, dtype=dt.input.torch)
    y = torch.randn(b, k, n, device=device, generator=gen, dtype=dt.input.torch)
    return x, y


def reference(x, y):
    return x.double() @ y.double()


def flops(p, dt):
    return 2 * p["b"] * p["m"] * p["n"] * p["k"]


def nbytes(p, dt):
    b, m, n, k = p["b"], p["m"], p["n"], p["k"]
    return b * (m * k + k * n) * dt.input.itemsize + b * m * n * dt.output.itemsize


def tolerance(p, dt):
    return reduction_tolerance(p["k"], dt)


OP = register_op(Op("bmm", ("b", "m", "n", "k"), inputs, reference, flops, nbytes, peak="matrix",
                    description="batched C = A @ B", tolerance=tolerance))


@register_backend("bmm", "torch", supports=same_dtype)
def bmm_torch(x, y):
    return torch.bmm(x, y)
