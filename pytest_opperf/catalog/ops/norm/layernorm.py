"""LayerNorm over the last dimension: y = (x - mean(x)) / sqrt(var(x) + eps) * w + b, x[m, n].

eps = 1e-5 (torch.nn.LayerNorm's default); var is the biased variance (divides by n), as in
torch.
FLOPs: 7 per element (sum for the mean: 1, subtract the mean: 1, square: 1, sum: 1,
scale by rstd: 1, weight: 1, bias: 1) + 4 per row (mean and variance divides, +eps, rsqrt).
Bytes: x read, w and b read once, y written once: (m*n + 2*n) * in_size + m*n * out_size.

`torch_unfused` spells the formula out op by op (one trip to memory each), against the
single fused F.layer_norm kernel of `torch`.
"""

import torch

from pytest_opperf.catalog.backends import liger
from pytest_opperf.catalog.supports import same_dtype
from pytest_opperf.catalog.registry import Op, register_backend, register_op

EPS = 1e-5


def inputs(p, dt, device, gen):
    m, n = p["m"], p["n"]
    # An offset on x makes the mean matter: a kernel that skipped it would be caught.
    x = torch.randn(m, n, device=device, generator=gen, dtype=dt.input.torch) + 0.5
    w = torch.rand(n, device=device, generator=gen, dtype=dt.input.torch) + 0.5
    b = torch.randn(n, device=device, generator=gen, dtype=dt.input.torch)
    return x, w, b


def reference(x, w, b):
    x = x.double()
    mean = x.mean(-1, keepdim=True)
    var = (x - mean).pow(2).mean(-1, keepdim=True)
    return (x - mean) * torch.rsqrt(var + EPS) * w.double() + b.double()


def flops(p, dt):
    return 7 * p["m"] * p["n"] + 4 * p["m"]


def nbytes(p, dt):
    m, n = p["m"], p["n"]
    return (m * n + 2 * n) * dt.input.itemsize + m * n * dt.output.itemsize


OP = register_op(Op("layernorm", ("m", "n"), inputs, reference, flops, nbytes, peak="vector",
                    description="LayerNorm with weight and bias, eps=1e-5"))


@register_backend("layernorm", "torch", supports=same_dtype)
def layernorm_torch(x, w, b):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, EPS)


@register_backend("layernorm", "torch_unfused", supports=same_dtype)
def layernorm_unfused(x, w, b):
    xf = x.float()
    mean = xf.mean(-1, keepdim=True)
    centered = xf - mean
    rstd = torch.rsqrt(centered.pow(2).mean(-1, keepdim=True) + EPS)
    return (centered * rstd).to(x.dtype) * w + b


@liger.backend("layernorm")
def layernorm_liger(x, w, b):
    return liger.ops().LigerLayerNormFunction.apply(x, w, b, EPS)
