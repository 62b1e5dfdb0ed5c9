"""Rotary embedding of q and k in Triton, in one launch: program (token, head block) rotates
BLOCK_H heads of q and the same-numbered heads of k, reading the token's cos/sin once.
Both layouts: `neox` pairs dims (i, i + head_dim/2), `gptj` pairs (2i, 2i + 1). Computed in
fp32, written to new tensors.

Knobs: BLOCK_H (heads per program, a power of two; default all heads of the token: the next
power of two of max(heads_q, heads_kv)), num_warps (default 4).
"""

from __future__ import annotations

import torch

from pytest_opperf.catalog.backends.triton._common import (
    kernel, next_power_of_two, power_of_two, rows, tuned_knobs, warps,
)
from pytest_opperf.catalog.ops._common import same_dtype
from pytest_opperf.catalog.registry import register_backend

tl = None  # triton.language, bound when a kernel is first launched (_common.kernel)


@kernel
def _rope(q_ptr, k_ptr, cos_ptr, sin_ptr, qo_ptr, ko_ptr,
          q_token_stride, q_head_stride, k_token_stride, k_head_stride,
          qo_token_stride, qo_head_stride, ko_token_stride, ko_head_stride, cs_token_stride,
          heads_q, heads_kv, half,
          NEOX: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    pair = tl.arange(0, BLOCK_D)
    in_pair = pair < half
    cos = tl.load(cos_ptr + token * cs_token_stride + pair, mask=in_pair, other=0.0).to(tl.float32)[None, :]
    sin = tl.load(sin_ptr + token * cs_token_stride + pair, mask=in_pair, other=0.0).to(tl.float32)[None, :]
    if NEOX:
        da, db = pair, pair + half
    else:
        da, db = 2 * pair, 2 * pair + 1
    da, db = da[None, :], db[None, :]

    mask = (heads < heads_q)[:, None] & in_pair[None, :]
    src = q_ptr + token * q_token_stride + heads[:, None] * q_head_stride
    dst = qo_ptr + token * qo_token_stride + heads[:, None] * qo_head_stride
    a = tl.load(src + da, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(src + db, mask=mask, other=0.0).to(tl.float32)
    tl.store(dst + da, (a * cos - b * sin).to(qo_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + db, (b * cos + a * sin).to(qo_ptr.dtype.element_ty), mask=mask)

    mask = (heads < heads_kv)[:, None] & in_pair[None, :]
    src = k_ptr + token * k_token_stride + heads[:, None] * k_head_stride
    dst = ko_ptr + token * ko_token_stride + heads[:, None] * ko_head_stride
    a = tl.load(src + da, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(src + db, mask=mask, other=0.0).to(tl.float32)
    tl.store(dst + da, (a * cos - b * sin).to(ko_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + db, (b * cos + a * sin).to(ko_ptr.dtype.element_ty), mask=mask)


@register_backend("rope", "triton", library="triton", devices={"cuda"}, supports=same_dtype)
def rope_triton(q, k, cos, sin, layout, block_h=None, num_warps=None):
    tokens, heads_q, head_dim = q.shape
    heads_kv = k.shape[1]
    shape = {"tokens": tokens, "heads_q": heads_q, "heads_kv": heads_kv, "head_dim": head_dim, "layout": layout}
    block_h, num_warps = tuned_knobs("rope", shape, q.dtype, block_h=block_h, num_warps=num_warps).values()
    most = next_power_of_two(max(heads_q, heads_kv))
    block_h = most if block_h is None else power_of_two("rope", "BLOCK_H", block_h, largest=most)
    num_warps = warps("rope", block_h, 4 if num_warps is None else num_warps)
    rows("rope", q, k, cos, sin)
    if cos.stride(0) != sin.stride(0):
        raise ValueError("triton rope: cos and sin must have the same layout")
    qo, ko = torch.empty_like(q), torch.empty_like(k)
    grid = (tokens, -(-max(heads_q, heads_kv) // block_h))
    _rope[grid](q, k, cos, sin, qo, ko, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
                qo.stride(0), qo.stride(1), ko.stride(0), ko.stride(1), cos.stride(0),
                heads_q, heads_kv, head_dim // 2,
                NEOX=layout == "neox", BLOCK_H=block_h, BLOCK_D=next_power_of_two(head_dim // 2), num_warps=num_warps)
    return qo, ko
