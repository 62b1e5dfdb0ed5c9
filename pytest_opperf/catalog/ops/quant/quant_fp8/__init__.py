"""Dynamic fp8 (e4m3) quantization of activations x[m, n] -> (q fp8 [m, n], scales fp32).

scale = amax(|x|) / 448 (448: the largest finite e4m3 value), per token (one scale per row,
scales [m, 1]) or per tensor (one scale, scales [1]), as `granularity` says; q = x / scale
rounded to the nearest e4m3 value (ties to even), so x ~ q * scale. Per token is what fp8
GEMMs with row-wise scales take (vLLM's dynamic per-token fp8 quant); per tensor needs the
whole tensor's amax before any element is written (two passes).

The check compares q and the scales, not the dequantized q * scale: a kernel whose scales
are consistently off (amax/440) still dequantizes to about x, yet hands the fp8 GEMM after
it scales other than the amax/448 it expects. The reference is exact (float64, then rounded
to the e4m3 grid), so a correct kernel differs from it only where fp32 rounding tips a
value sitting on a rounding midpoint, one e4m3 ulp (2^-3 relative) on a few elements.

FLOPs: 3 per element (abs: 1, max: 1, scaling: 1; the rounding to fp8 is not counted) + 1
per scale.
Bytes: x read once, q and the scales written once: m*n * (in_size + 1) + 4 * scales.
"""

import torch

from pytest_opperf.catalog.supports import reads_float_writes
from pytest_opperf.catalog.registry import Op, choice, register_backend, register_op

FP8_MAX = 448.0
GRANULARITY = choice("token", "tensor")


def inputs(p, dt, device, gen):
    return torch.randn(p["m"], p["n"], device=device, generator=gen, dtype=dt.input.torch), p["granularity"]


def reference(x, granularity):
    x = x.double()
    amax = x.abs().amax(dim=-1, keepdim=True) if granularity == "token" else x.abs().amax().reshape(1)
    scale = amax / FP8_MAX
    # torch rounds to the nearest e4m3 value, ties to even (checked in the tests).
    q = (x / scale).to(torch.float8_e4m3fn).double()
    return q, scale.float()


def scales(p) -> int:
    return p["m"] if p["granularity"] == "token" else 1


def flops(p, dt):
    return 3 * p["m"] * p["n"] + scales(p)


def nbytes(p, dt):
    return p["m"] * p["n"] * (dt.input.itemsize + dt.output.itemsize) + 4 * scales(p)


def tolerance(p, dt):
    # The torch backend reads up to 1.6e-3 from bf16 inputs (measured on CPU: ~3 elements in 10^4
    # on a midpoint tipped the other way), 1e-4 from fp32; a scale 1% off reads 3e-2, and q alone
    # scaled 0.2% off reads 1.3e-2.
    return 5e-3


OP = register_op(Op("quant_fp8", ("m", "n", "granularity"), inputs, reference, flops, nbytes, peak="vector",
                    defaults={"granularity": "token"}, types={"granularity": GRANULARITY}, tolerance=tolerance,
                    description="dynamic fp8 e4m3 quantization, scale = amax/448 per token or per tensor"))


supports = reads_float_writes("quant_fp8", "fp8")


@register_backend("quant_fp8", "torch", supports=supports)
def quant_fp8_torch(x, granularity):
    xf = x.float()
    amax = xf.abs().amax(dim=-1, keepdim=True) if granularity == "token" else xf.abs().amax().reshape(1)
    scale = amax / FP8_MAX
    return (xf / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale
