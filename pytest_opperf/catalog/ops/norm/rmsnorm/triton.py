"""RMSNorm in Triton: one program per row, the whole row in one block, computed in fp32.

Knobs: BLOCK_SIZE (a power of two >= n; default the next power of two of n), num_warps.
"""

from __future__ import annotations

import torch

from pytest_opperf.catalog.backends.triton import kernel, row_block, rows, tuned_knobs, warps
from pytest_opperf.catalog.supports import same_dtype
from pytest_opperf.catalog.ops.norm.rmsnorm import EPS
from pytest_opperf.catalog.registry import register_backend

tl = None  # triton.language, bound when a kernel is first launched (backends/triton.py: kernel)


@kernel
def _rmsnorm(x_ptr, w_ptr, y_ptr, x_row_stride, y_row_stride, n, eps, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / n + eps)
    tl.store(y_ptr + row * y_row_stride + cols, (x * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)


@register_backend("rmsnorm", "triton", library="triton", devices={"cuda"}, supports=same_dtype)
def rmsnorm_triton(x, w, block_size=None, num_warps=None):
    m, n = x.shape
    block_size, num_warps = tuned_knobs("rmsnorm", {"m": m, "n": n}, x.dtype, block_size=block_size,
                                        num_warps=num_warps).values()
    block = row_block("rmsnorm", n, block_size)
    num_warps = warps("rmsnorm", block, num_warps)
    rows("rmsnorm", x, w)
    y = torch.empty_like(x)
    _rmsnorm[(m,)](x, w, y, x.stride(0), y.stride(0), n, EPS, BLOCK_SIZE=block, num_warps=num_warps)
    return y
