"""Rotary embedding of q and k in Triton, in one launch: program (token, head block) rotates
BLOCK_H heads of q or of k (the head blocks of q come first on the grid's second axis).
Both layouts: `neox` pairs dims (i, i + head_dim/2), `gptj` pairs (2i, 2i + 1). Computed in
fp32, written to new tensors.

Knobs: BLOCK_H (heads per program, a power of two; default all heads of the token: the next
power of two of max(heads_q, heads_kv)), num_warps (default 4).
"""

from __future__ import annotations

import torch

from pytest_opperf.catalog.backends.triton import (
    kernel, next_power_of_two, power_of_two, rows, tuned_knobs, warps,
)
from pytest_opperf.catalog.supports import same_dtype
from pytest_opperf.catalog.registry import register_backend

tl = None  # triton.language, bound when a kernel is first launched (backends/triton.py: kernel)


@kernel
def _rope(q_ptr, k_ptr, cos_ptr, sin_ptr, qo_ptr, ko_ptr,
          q_token_stride, q_head_stride, k_token_stride, k_head_stride,
          qo_token_stride, qo_head_stride, ko_token_stride, ko_head_stride, cs_token_stride,
          heads_q, heads_kv, half, blocks_q,
          NEOX: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    # Blocks [0, blocks_q) of axis 1 turn heads of q, the rest heads of k: one code path for
    # both, chosen by selects (not branches, so a stride or head count of 1, which Triton
    # specializes to a constant, cannot give the two branches different types).
    token = tl.program_id(0).to(tl.int64)
    block = tl.program_id(1)
    is_k = block >= blocks_q
    heads = (block - tl.where(is_k, blocks_q, 0)) * BLOCK_H + tl.arange(0, BLOCK_H)
    src = tl.where(is_k, k_ptr + token * k_token_stride, q_ptr + token * q_token_stride)
    dst = tl.where(is_k, ko_ptr + token * ko_token_stride, qo_ptr + token * qo_token_stride)
    src_rows = src + heads[:, None] * tl.where(is_k, k_head_stride, q_head_stride)
    dst_rows = dst + heads[:, None] * tl.where(is_k, ko_head_stride, qo_head_stride)
    in_head = (heads < tl.where(is_k, heads_kv, heads_q))[:, None]

    pair = tl.arange(0, BLOCK_D)
    in_pair = pair < half
    cos = tl.load(cos_ptr + token * cs_token_stride + pair, mask=in_pair, other=0.0).to(tl.float32)[None, :]
    sin = tl.load(sin_ptr + token * cs_token_stride + pair, mask=in_pair, other=0.0).to(tl.float32)[None, :]
    out = qo_ptr.dtype.element_ty
    if NEOX:
        # Pairs (i, i + half): each half is a contiguous run of the row.
        mask = in_head & in_pair[None, :]
        a = tl.load(src_rows + pair[None, :], mask=mask, other=0.0).to(tl.float32)
        b = tl.load(src_rows + half + pair[None, :], mask=mask, other=0.0).to(tl.float32)
        tl.store(dst_rows + pair[None, :], (a * cos - b * sin).to(out), mask=mask)
        tl.store(dst_rows + half + pair[None, :], (b * cos + a * sin).to(out), mask=mask)
    else:
        # Pairs (2i, 2i + 1): read the row in one contiguous load and split the pairs in
        # registers; two stride-2 loads would each fetch every sector for half its bytes.
        dim = tl.arange(0, 2 * BLOCK_D)
        mask = in_head & (dim < 2 * half)[None, :]
        row = tl.load(src_rows + dim[None, :], mask=mask, other=0.0).to(tl.float32)
        a, b = tl.split(tl.reshape(row, (BLOCK_H, BLOCK_D, 2)))
        turned = tl.join(a * cos - b * sin, b * cos + a * sin)
        tl.store(dst_rows + dim[None, :], tl.reshape(turned, (BLOCK_H, 2 * BLOCK_D)).to(out), mask=mask)


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
    blocks_q = -(-heads_q // block_h)
    grid = (tokens, blocks_q + -(-heads_kv // block_h))
    _rope[grid](q, k, cos, sin, qo, ko, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
                qo.stride(0), qo.stride(1), ko.stride(0), ko.stride(1), cos.stride(0),
                heads_q, heads_kv, head_dim // 2, blocks_q,
                NEOX=layout == "neox", BLOCK_H=block_h, BLOCK_D=next_power_of_two(head_dim // 2), num_warps=num_warps)
    return qo, ko
