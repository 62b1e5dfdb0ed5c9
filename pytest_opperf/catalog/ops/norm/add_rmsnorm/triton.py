"""Residual add + RMSNorm in Triton: one program per row, the whole row in one block.

The sum is formed in fp32, written out as the new residual (in the input dtype) and
normalized from fp32, as vLLM's fused_add_rms_norm does. Knobs: BLOCK_SIZE (a power of two
>= n; default the next power of two of n), num_warps.
"""

from __future__ import annotations

import torch

from pytest_opperf.catalog.backends.triton import kernel, row_block, rows, tuned_knobs, warps
from pytest_opperf.catalog.supports import same_dtype
from pytest_opperf.catalog.ops.norm.add_rmsnorm import EPS
from pytest_opperf.catalog.registry import register_backend

tl = None  # triton.language, bound when a kernel is first launched (backends/triton.py: kernel)


@kernel
def _add_rmsnorm(x_ptr, r_ptr, w_ptr, y_ptr, s_ptr, x_row_stride, r_row_stride, y_row_stride, s_row_stride, n, eps,
                 BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + row * r_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    s = x + r
    tl.store(s_ptr + row * s_row_stride + cols, s.to(s_ptr.dtype.element_ty), mask=mask)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(s * s, axis=0) / n + eps)
    tl.store(y_ptr + row * y_row_stride + cols, (s * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)


@register_backend("add_rmsnorm", "triton", library="triton", devices={"cuda"}, supports=same_dtype)
def add_rmsnorm_triton(x, residual, w, block_size=None, num_warps=None):
    m, n = x.shape
    block_size, num_warps = tuned_knobs("add_rmsnorm", {"m": m, "n": n}, x.dtype, block_size=block_size,
                                        num_warps=num_warps).values()
    block = row_block("add_rmsnorm", n, block_size)
    num_warps = warps("add_rmsnorm", block, num_warps)
    rows("add_rmsnorm", x, residual, w)
    y, s = torch.empty_like(x), torch.empty_like(x)
    _add_rmsnorm[(m,)](x, residual, w, y, s, x.stride(0), residual.stride(0), y.stride(0), s.stride(0), n, EPS,
                       BLOCK_SIZE=block, num_warps=num_warps)
    return y, s
