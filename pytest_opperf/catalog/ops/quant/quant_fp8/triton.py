"""Dynamic fp8 (e4m3) quantization in Triton, per token or per tensor.

Per token: one program per row finds the row's amax, writes its scale and the row's q.
When the row fits one block it stays in registers (one read of x); otherwise the program
walks the row twice in BLOCK_SIZE steps. Per tensor: a first launch folds every row's amax
into one float with an atomic max, a second quantizes with amax / 448 (x read twice).
Converting to e4m3 needs sm_89 (Ada) or newer.

Knobs: BLOCK_SIZE (a power of two; default the next power of two of n, at most 8192),
num_warps.
"""

from __future__ import annotations

import torch

from pytest_opperf.catalog.backends.triton import (
    kernel, next_power_of_two, power_of_two, rows, tuned_knobs, warps,
)
from pytest_opperf.catalog.ops.quant.quant_fp8 import FP8_MAX, supports
from pytest_opperf.catalog.registry import register_backend

tl = None  # triton.language, bound when a kernel is first launched (backends/triton.py: kernel)

DEFAULT_BLOCK = 8192


@kernel
def _row_amax(x_ptr, amax_ptr, x_row_stride, n, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    amax = 0.0
    for start in range(0, n, BLOCK_SIZE):
        cols = start + tl.arange(0, BLOCK_SIZE)
        x = tl.load(x_ptr + row * x_row_stride + cols, mask=cols < n, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.max(tl.abs(x), axis=0))
    tl.atomic_max(amax_ptr, amax)


@kernel
def _quant_fp8(x_ptr, q_ptr, scale_ptr, amax_ptr, x_row_stride, q_row_stride, n, fp8_max,
               PER_TENSOR: tl.constexpr, ONE_BLOCK: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    q_row = q_ptr + row * q_row_stride
    cols = tl.arange(0, BLOCK_SIZE)
    if ONE_BLOCK:
        x = tl.load(x_row + cols, mask=cols < n, other=0.0).to(tl.float32)
    if PER_TENSOR:
        scale = tl.load(amax_ptr) / fp8_max
        tl.store(scale_ptr, scale, mask=row == 0)
    else:
        if ONE_BLOCK:
            amax = tl.max(tl.abs(x), axis=0)
        else:
            amax = 0.0
            for start in range(0, n, BLOCK_SIZE):
                part = tl.load(x_row + start + cols, mask=start + cols < n, other=0.0).to(tl.float32)
                amax = tl.maximum(amax, tl.max(tl.abs(part), axis=0))
        scale = amax / fp8_max
        tl.store(scale_ptr + row, scale)
    if ONE_BLOCK:
        q = tl.clamp(x / scale, -fp8_max, fp8_max)
        tl.store(q_row + cols, q.to(q_ptr.dtype.element_ty), mask=cols < n)
    else:
        for start in range(0, n, BLOCK_SIZE):
            part = tl.load(x_row + start + cols, mask=start + cols < n, other=0.0).to(tl.float32)
            q = tl.clamp(part / scale, -fp8_max, fp8_max)
            tl.store(q_row + start + cols, q.to(q_ptr.dtype.element_ty), mask=start + cols < n)


def _supports(device_type, dt, capability):
    if capability is not None and tuple(capability) < (8, 9):
        return "Triton converts to fp8 e4m3 on sm_89 (Ada) or newer"
    return supports(device_type, dt, capability)


@register_backend("quant_fp8", "triton", library="triton", devices={"cuda"}, supports=_supports)
def quant_fp8_triton(x, granularity, block_size=None, num_warps=None):
    m, n = x.shape
    block_size, num_warps = tuned_knobs("quant_fp8", {"m": m, "n": n, "granularity": granularity}, x.dtype, "fp8",
                                        block_size=block_size, num_warps=num_warps).values()
    block = min(next_power_of_two(n), DEFAULT_BLOCK) if block_size is None else \
        power_of_two("quant_fp8", "BLOCK_SIZE", block_size)
    num_warps = warps("quant_fp8", block, num_warps)
    rows("quant_fp8", x)
    q = torch.empty(m, n, device=x.device, dtype=torch.float8_e4m3fn)
    per_tensor = granularity == "tensor"
    if per_tensor:
        scale = torch.empty(1, device=x.device, dtype=torch.float32)
        amax = torch.zeros(1, device=x.device, dtype=torch.float32)
        _row_amax[(m,)](x, amax, x.stride(0), n, BLOCK_SIZE=block, num_warps=num_warps)
    else:
        scale = torch.empty(m, 1, device=x.device, dtype=torch.float32)
        amax = scale  # unread: each program finds its own row's amax
    _quant_fp8[(m,)](x, q, scale, amax, x.stride(0), q.stride(0), n, FP8_MAX, PER_TENSOR=per_tensor,
                     ONE_BLOCK=block >= n, BLOCK_SIZE=block, num_warps=num_warps)
    return q, scale
