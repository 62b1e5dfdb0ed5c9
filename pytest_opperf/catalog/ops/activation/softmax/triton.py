"""Row softmax in Triton (the fused softmax of Triton's tutorial): one program per row, the
whole row in one block, max-subtracted and computed in fp32.

Knobs: BLOCK_SIZE (a power of two >= n; default the next power of two of n), num_warps.
"""

from __future__ import annotations

import torch

from pytest_opperf.catalog.backends.triton import kernel, row_block, rows, tuned_knobs, warps
from pytest_opperf.catalog.supports import same_dtype
from pytest_opperf.catalog.registry import register_backend

tl = None  # triton.language, bound when a kernel is first launched (backends/triton.py: kernel)


@kernel
def _softmax(x_ptr, y_ptr, x_row_stride, y_row_stride, n, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=-float("inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(y_ptr + row * y_row_stride + cols, (e / tl.sum(e, axis=0)).to(y_ptr.dtype.element_ty), mask=mask)


@register_backend("softmax", "triton", library="triton", devices={"cuda"}, supports=same_dtype)
def softmax_triton(x, block_size=None, num_warps=None):
    m, n = x.shape
    block_size, num_warps = tuned_knobs("softmax", {"m": m, "n": n}, x.dtype, block_size=block_size,
                                        num_warps=num_warps).values()
    block = row_block("softmax", n, block_size)
    num_warps = warps("softmax", block, num_warps)
    rows("softmax", x)
    y = torch.empty_like(x)
    _softmax[(m,)](x, y, x.stride(0), y.stride(0), n, BLOCK_SIZE=block, num_warps=num_warps)
    return y
