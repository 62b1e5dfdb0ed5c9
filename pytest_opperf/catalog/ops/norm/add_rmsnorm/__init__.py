"""Residual add fused with RMSNorm, as between the layers of a Llama-style decoder:
s = x + residual; y = s / sqrt(mean(s^2) + eps) * w. Returns (y, s): the normed hidden state
and the new residual, both [m, n] in the input dtype. eps = 1e-6.

Both outputs are new tensors: engines (vLLM's fused_add_rms_norm) often overwrite x and
residual in place, which a benchmark that calls the kernel thousands of times on the same
inputs, and checks its first call, cannot do.

FLOPs: 5 per element (add: 1, square: 1, sum: 1, scale: 1, weight: 1) + 3 per row (mean, +eps,
rsqrt).
Bytes: x, residual read, w read once, y and s written once:
(2*m*n + n) * in_size + 2*m*n * out_size.
"""

import torch

from pytest_opperf.catalog.backends import liger
from pytest_opperf.catalog.supports import same_dtype
from pytest_opperf.catalog.registry import Op, register_backend, register_op

EPS = 1e-6


def inputs(p, dt, device, gen):
    m, n = p["m"], p["n"]
    x = torch.randn(m, n, device=device, generator=gen, dtype=dt.input.torch)
    residual = torch.randn(m, n, device=device, generator=gen, dtype=dt.input.torch)
    w = torch.rand(n, device=device, generator=gen, dtype=dt.input.torch) + 0.5
    return x, residual, w


def reference(x, residual, w):
    s = x.double() + residual.double()
    return s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + EPS) * w.double(), s


def flops(p, dt):
    return 5 * p["m"] * p["n"] + 3 * p["m"]


def nbytes(p, dt):
    m, n = p["m"], p["n"]
    return (2 * m * n + n) * dt.input.itemsize + 2 * m * n * dt.output.itemsize


OP = register_op(Op("add_rmsnorm", ("m", "n"), inputs, reference, flops, nbytes, peak="vector",
                    description="residual add + RMSNorm, eps=1e-6; returns (normed, new residual)"))


@register_backend("add_rmsnorm", "torch", supports=same_dtype)
def add_rmsnorm_torch(x, residual, w):
    s = x + residual
    return torch.nn.functional.rms_norm(s, (s.shape[-1],), w, EPS), s


@liger.backend("add_rmsnorm")
def add_rmsnorm_liger(x, residual, w):
    return liger.ops().LigerFusedAddRMSNormFunction.apply(x, residual, w, EPS, 0.0, "llama", True)
