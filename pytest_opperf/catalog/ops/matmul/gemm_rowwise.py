"""Row-wise scaled fp8 GEMM: C[m, n] = scale_a[m, 1] * (A[m, k] @ B[k, n]) * scale_b[1, n].

The fp8 GEMM of W8A8 inference: activations quantized with one fp32 scale per token (row of
A), weights with one per output channel (column of B); torch._scaled_mm applies both in its
epilogue when given scale_a of shape (m, 1) and scale_b of shape (1, n).

Why an op and not a backend of gemm: inputs belong to a case, not to a backend, so a
`torch_rowwise` backend of gemm would receive gemm's unit tensor-wise scales; and a `scaling`
parameter of gemm would change the key and the test id of every gemm row. Here the inputs are
what a row-wise kernel reads: rows of A span a 16x range of magnitudes (tokens differ), each
row and column quantized to fill e4m3's range, so a kernel that drops, swaps or misindexes the
scales fails the check.

FLOPs: 2*m*n*k for the products and sums + 2*m*n for the two scale multiplies of the epilogue.
Bytes: A and B read once (1 byte each), the m + n fp32 scales once, C written once:
(m*k + k*n) + 4*(m + n) + m*n * out_size.
"""

import torch

from pytest_opperf.catalog.precision import reduction_tolerance
from pytest_opperf.catalog.registry import Op, register_backend, register_op

E4M3_MAX = 448.0


def _quantize(x, dim):
    """fp8 values and the fp32 scales (amax / 448 along `dim`) that map them back to x."""
    scale = x.abs().amax(dim=dim, keepdim=True) / E4M3_MAX
    return (x / scale).to(torch.float8_e4m3fn), scale.float()


def inputs(p, dt, device, gen):
    m, n, k = p["m"], p["n"], p["k"]
    magnitude = torch.exp2(torch.rand(m, 1, device=device, generator=gen) * 4 - 2)
    a, scale_a = _quantize(torch.randn(m, k, device=device, generator=gen) * magnitude, dim=1)
    # B column-major, as _scaled_mm wants it: made as (n, k), one scale per row of that, viewed transposed.
    bt, scale_bt = _quantize(torch.randn(n, k, device=device, generator=gen), dim=1)
    return a, bt.t(), scale_a, scale_bt.t().contiguous(), dt.output.torch


def reference(a, b, scale_a, scale_b, out_dtype):
    return scale_a.double() * (a.double() @ b.double()) * scale_b.double()


def flops(p, dt):
    return 2 * p["m"] * p["n"] * p["k"] + 2 * p["m"] * p["n"]


def nbytes(p, dt):
    m, n, k = p["m"], p["n"], p["k"]
    return (m * k + k * n) * dt.input.itemsize + 4 * (m + n) + m * n * dt.output.itemsize


def tolerance(p, dt):
    return reduction_tolerance(p["k"], dt)


OP = register_op(Op("gemm_rowwise", ("m", "n", "k"), inputs, reference, flops, nbytes, peak="matrix",
                    description="fp8 GEMM, one scale per row of A and per column of B", tolerance=tolerance))


def _dtypes_reason(dt):
    if dt.input.name != "fp8":
        return f"row-wise scaled GEMM takes e4m3 (fp8) inputs, not {dt.input.name}"
    if dt.output.name != "bf16":
        return f"torch._scaled_mm writes row-wise scaled results in bf16 only, not {dt.output.name}"
    return None


def _torch_release() -> tuple:
    return tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])


def _torch_supports(device_type, dt, capability, p):
    if device_type == "cuda" and capability < (9, 0):
        return "row-wise scaled torch._scaled_mm needs CUDA sm_90 or newer (its CUTLASS kernel)"
    if device_type not in ("cuda", "cpu"):
        return f"torch._scaled_mm has no fp8 GEMM on {device_type}"
    if device_type == "cpu" and _torch_release() < (2, 13):
        # torch before 2.13: its CPU _scaled_mm takes per-tensor scales only.
        return f"row-wise scales in torch._scaled_mm on a CPU need torch 2.13 or newer, not {torch.__version__}"
    if device_type == "cuda" and (p["k"] % 16 or p["n"] % 16):
        return f"torch._scaled_mm needs k and n divisible by 16 on CUDA, got k={p['k']}, n={p['n']}"
    return _dtypes_reason(dt)


@register_backend("gemm_rowwise", "torch", supports=_torch_supports)
def gemm_rowwise_torch(a, b, scale_a, scale_b, out_dtype):
    return torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype)


def _dequant_supports(device_type, dt, capability):
    return _dtypes_reason(dt)


@register_backend("gemm_rowwise", "torch_dequant", supports=_dequant_supports)
def gemm_rowwise_dequant(a, b, scale_a, scale_b, out_dtype):
    """Without fp8 tensor cores (A100, CPUs): upcast (exact), GEMM in bf16, scale the result."""
    return (a.to(out_dtype) @ b.to(out_dtype)) * scale_a.to(out_dtype) * scale_b.to(out_dtype)
