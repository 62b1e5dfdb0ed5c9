"""Symmetric per-channel int8 quantization of a weight w[n, k] -> (q int8 [n, k], scales fp32 [n, 1]).

One scale per output channel (row): scale = amax(|w_row|) / 127; q = round(w / scale),
rounding half to even (torch.round, CUDA's rint/__float2int_rn), clamped to [-127, 127]
(symmetric: -128 unused), so w ~ q * scale. The reference computes in float64 and rounds
the same way; a correct fp32 kernel differs from it only where w / scale sits within fp32
noise of a .5, by one unit there.

The check compares q and the scales (see quant_fp8.py for why not q * scale).
FLOPs: 4 per element (abs: 1, max: 1, divide: 1, round: 1) + 1 per row.
Bytes: w read once, q and the scales written once: n*k * (in_size + 1) + 4*n.
"""

import torch

from pytest_opperf.catalog.supports import reads_float_writes
from pytest_opperf.catalog.registry import Op, register_backend, register_op

INT8_MAX = 127.0


def inputs(p, dt, device, gen):
    return (torch.randn(p["n"], p["k"], device=device, generator=gen, dtype=dt.input.torch),)


def reference(w):
    w = w.double()
    scale = w.abs().amax(dim=-1, keepdim=True) / INT8_MAX
    return torch.round(w / scale).clamp(-INT8_MAX, INT8_MAX), scale.float()


def flops(p, dt):
    return 4 * p["n"] * p["k"] + p["n"]


def nbytes(p, dt):
    n, k = p["n"], p["k"]
    return n * k * (dt.input.itemsize + dt.output.itemsize) + 4 * n


def tolerance(p, dt):
    # A scale of amax/128 instead of amax/127 reads 1.4e-2; the torch backend's flipped ties read
    # 3e-4 from bf16 weights (measured on CPU: ~1 element in 10^4 off by one), 3e-5 from fp32.
    return 1e-3


OP = register_op(Op("quant_int8", ("n", "k"), inputs, reference, flops, nbytes, peak="vector", tolerance=tolerance,
                    description="symmetric per-channel int8 weight quantization, scale = amax/127 per row"))


@register_backend("quant_int8", "torch", supports=reads_float_writes("quant_int8", "int8"))
def quant_int8_torch(w):
    wf = w.float()
    scale = wf.abs().amax(dim=-1, keepdim=True) / INT8_MAX
    return torch.round(wf / scale).clamp(-INT8_MAX, INT8_MAX).to(torch.int8), scale
