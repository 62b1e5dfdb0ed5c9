"""GEMM: C[m, n] = A[m, k] @ B[k, n].

FLOPs: 2*m*n*k (one multiply and one add per term).
Bytes: A and B read once, C written once: (m*k + k*n) * in_size + m*n * out_size.
fp8 (e4m3) runs through torch._scaled_mm with unit scales; it needs CUDA sm_89 or newer.
"""

import torch

from pytest_opperf.catalog.registry import Op, register_backend, register_op


def inputs(p, dt, device, gen):
    m, n, k = p["m"], p["n"], p["k"]
    if dt.input.name.startswith("fp8"):
        a = torch.randn(m, k, device=device, generator=gen).to(dt.input.torch)
        # _scaled_mm wants B column-major: make it as (n, k) and view it transposed.
        b = torch.randn(n, k, device=device, generator=gen).to(dt.input.torch).t()
        one = torch.ones((), device=device, dtype=torch.float32)
        return a, b, one, one.clone(), dt.output.torch
    a = torch.randn(m, k, device=device, generator=gen, dtype=dt.input.torch)
    b = torch.randn(k, n, device=device, generator=gen, dtype=dt.input.torch)
    return a, b


def reference(a, b, scale_a=None, scale_b=None, out_dtype=None):
    out = a.double() @ b.double()
    if scale_a is not None:
        out = out * scale_a.double() * scale_b.double()
    return out


def flops(p, dt):
    return 2 * p["m"] * p["n"] * p["k"]


def nbytes(p, dt):
    m, n, k = p["m"], p["n"], p["k"]
    return (m * k + k * n) * dt.input.itemsize + m * n * dt.output.itemsize


OP = register_op(Op("gemm", ("m", "n", "k"), inputs, reference, flops, nbytes, peak="matrix",
                    description="C = A @ B"))


def _torch_supports(device_type, dt, capability):
    if dt.input.name.startswith("fp8"):
        if device_type != "cuda" or capability < (8, 9):
            return "fp8 GEMM through torch._scaled_mm needs CUDA sm_89 or newer"
        if dt.output.name not in ("bf16", "fp16", "fp32"):
            return f"torch._scaled_mm cannot write {dt.output.name}"
        return None
    if dt.input != dt.output:
        return f"torch.matmul writes its input dtype, not {dt.output.name}"
    if not dt.input.is_float:
        return "torch.matmul has no integer GEMM"
    return None


@register_backend("gemm", "torch", supports=_torch_supports)
def gemm_torch(a, b, scale_a=None, scale_b=None, out_dtype=None):
    if scale_a is not None:
        return torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype)
    return torch.matmul(a, b)
