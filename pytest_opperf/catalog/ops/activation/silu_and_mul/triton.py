"""SiLU-and-multiply in Triton on the fused gate_up output x[m, 2n]: a 2-D grid of (row,
column block) programs, so any block size works and a single row (decode) still spreads
over many programs. Computed in fp32.

Knobs: BLOCK_SIZE (a power of two; default the next power of two of n, at most 1024),
num_warps (default 4).
"""

from __future__ import annotations

import torch

from pytest_opperf.catalog.backends.triton import (
    kernel, next_power_of_two, power_of_two, rows, tuned_knobs, warps,
)
from pytest_opperf.catalog.supports import same_dtype
from pytest_opperf.catalog.registry import register_backend

tl = None  # triton.language, bound when a kernel is first launched (backends/triton.py: kernel)

DEFAULT_BLOCK = 1024


@kernel
def _silu_and_mul(x_ptr, y_ptr, x_row_stride, y_row_stride, n, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = cols < n
    gate = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * x_row_stride + n + cols, mask=mask, other=0.0).to(tl.float32)
    y = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(y_ptr + row * y_row_stride + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@register_backend("silu_and_mul", "triton", library="triton", devices={"cuda"}, supports=same_dtype)
def silu_and_mul_triton(x, block_size=None, num_warps=None):
    m, n = x.shape[0], x.shape[1] // 2
    block_size, num_warps = tuned_knobs("silu_and_mul", {"m": m, "n": n}, x.dtype, block_size=block_size,
                                        num_warps=num_warps).values()
    block = min(next_power_of_two(n), DEFAULT_BLOCK) if block_size is None else \
        power_of_two("silu_and_mul", "BLOCK_SIZE", block_size)
    num_warps = warps("silu_and_mul", block, 4 if num_warps is None else num_warps)
    rows("silu_and_mul", x)
    y = torch.empty(m, n, device=x.device, dtype=x.dtype)
    _silu_and_mul[(m, -(-n // block))](x, y, x.stride(0), y.stride(0), n, BLOCK_SIZE=block, num_warps=num_warps)
    return y
