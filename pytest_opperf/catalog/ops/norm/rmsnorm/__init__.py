"""RMSNorm over the last dimension: y = x / sqrt(mean(x^2) + eps) * w, x[m, n], w[n].

FLOPs: 4 per element (square: 1, sum: 1, scale: 1, weight: 1) + 3 per row (mean, +eps, rsqrt).
Bytes: x read, w read once, y written once: (m*n + n) * in_size + m*n * out_size.
"""

import torch

from pytest_opperf.catalog.backends import liger
from pytest_opperf.catalog.supports import same_dtype
from pytest_opperf.catalog.registry import Op, register_backend, register_op

EPS = 1e-6


def inputs(p, dt, device, gen):
    x = torch.randn(p["m"], p["n"], device=device, generator=gen, dtype=dt.input.torch)
    w = torch.rand(p["n"], device=device, generator=gen, dtype=dt.input.torch) + 0.5
    return x, w


def reference(x, w):
    x = x.double()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w.double()


def flops(p, dt):
    return 4 * p["m"] * p["n"] + 3 * p["m"]


def nbytes(p, dt):
    m, n = p["m"], p["n"]
    return (m * n + n) * dt.input.itemsize + m * n * dt.output.itemsize


OP = register_op(Op("rmsnorm", ("m", "n"), inputs, reference, flops, nbytes, peak="vector",
                    description="RMSNorm with weight, eps=1e-6"))


@register_backend("rmsnorm", "torch", supports=same_dtype)
def rmsnorm_torch(x, w):
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), w, EPS)


@register_backend("rmsnorm", "torch_unfused", supports=same_dtype)
def rmsnorm_unfused(x, w):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype) * w


@liger.backend("rmsnorm")
def rmsnorm_liger(x, w):
    # casting_mode "llama": rstd in fp32, x * rstd cast to the input dtype, then times w.
    # (X, W, eps, offset, casting_mode, in_place), the functional API's defaults elsewhere
    return liger.ops().LigerRMSNormFunction.apply(x, w, EPS, 0.0, "llama", True)
