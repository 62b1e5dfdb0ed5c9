"""Decode attention over a paged KV cache (vLLM's layout), grouped-query heads.

q[batch, heads_q, head_dim] (one new token per sequence); the caches k_cache and v_cache
[num_pages, page_size, heads_kv, head_dim] hold every sequence's keys and values in pages;
block_table[batch, pages_per_seq] (int32) lists the pages of each sequence in order. Each
sequence holds kv_len tokens in ceil(kv_len / page_size) pages; the table is a random
permutation of all the pages, as an allocator leaves them after a while. out[batch, heads_q,
head_dim] = softmax(q k^T / sqrt(head_dim)) v over the sequence's kv_len tokens.

FLOPs: 4 * batch * heads_q * kv_len * head_dim (QK^T and PV).
Bytes: the keys and values of the kv_len tokens of each sequence (a kernel need not read the
unused tail of a last page), the block table, q and out: (2*batch*kv_len*heads_kv*head_dim
+ 2*batch*heads_q*head_dim) * size + 4 * batch * pages_per_seq.
Reference: float64 on the device (see _common.reference). Tolerance: the dtype's.
"""

import torch
import torch.nn.functional as F

from pytest_opperf.catalog.supports import same_dtype
from pytest_opperf.catalog.ops.attention import _common
from pytest_opperf.catalog.registry import Op, register_backend, register_op


def pages_per_seq(p) -> int:
    return -(-p["kv_len"] // p["page_size"])


def inputs(p, dt, device, gen):
    _common.groups(p)
    b, hkv, d, page = p["batch"], p["heads_kv"], p["head_dim"], p["page_size"]
    pages = b * pages_per_seq(p)
    q = torch.randn(b, p["heads_q"], d, device=device, generator=gen, dtype=dt.input.torch)
    k_cache = torch.randn(pages, page, hkv, d, device=device, generator=gen, dtype=dt.input.torch)
    v_cache = torch.randn(pages, page, hkv, d, device=device, generator=gen, dtype=dt.input.torch)
    order = torch.randperm(pages, device=device, generator=gen)
    block_table = order.to(torch.int32).view(b, pages_per_seq(p))
    return q, k_cache, v_cache, block_table, p["kv_len"]


def gather(cache, block_table, kv_len):
    """A sequence's keys (or values) as one tensor [batch, heads_kv, kv_len, head_dim] (a copy)."""
    b = block_table.shape[0]
    tokens = cache.index_select(0, block_table.flatten().long())
    return tokens.view(b, -1, cache.shape[2], cache.shape[3])[:, :kv_len].transpose(1, 2)


def reference(q, k_cache, v_cache, block_table, kv_len):
    k = gather(k_cache, block_table, kv_len)
    v = gather(v_cache, block_table, kv_len)
    out = _common.reference(q.unsqueeze(2), k, v, causal=False, scale=_common.default_scale(q.shape[-1]))
    return out.squeeze(2)


def flops(p, dt):
    return _common.dense_flops(p, 1, p["kv_len"], causal=False)


def nbytes(p, dt):
    return _common.dense_bytes(p, 1, p["kv_len"], dt) + 4 * p["batch"] * pages_per_seq(p)


def memory(p, dt):
    b, t, d, hq, hkv = p["batch"], p["kv_len"], p["head_dim"], p["heads_q"], p["heads_kv"]
    cache_elements = 2 * b * pages_per_seq(p) * p["page_size"] * hkv * d
    # The gathers copy the cache once more (a float64 copy in the reference).
    tensors = (2 * cache_elements + 2 * b * hq * d) * dt.input.itemsize + 8 * cache_elements
    return _common.memory(tensors, b * hq * d, b * hq * t, 2 * hkv * t * d, dt)


OP = register_op(Op("paged_decode", ("batch", "kv_len", "heads_q", "heads_kv", "head_dim", "page_size"), inputs,
                    reference, flops, nbytes, peak="matrix", memory=memory,
                    tolerance=_common.tolerance, description="decode attention over a paged KV cache with a block table"))


@register_backend("paged_decode", "torch", supports=same_dtype)
def paged_decode_torch(q, k_cache, v_cache, block_table, kv_len):
    """Gather the pages by advanced indexing, then the attention written out."""
    b, _, d = q.shape
    hkv = k_cache.shape[2]
    k = k_cache[block_table].view(b, -1, hkv, d)[:, :kv_len].transpose(1, 2)
    v = v_cache[block_table].view(b, -1, hkv, d)[:, :kv_len].transpose(1, 2)
    return _common.eager(q.unsqueeze(2), k, v, causal=False, scale=_common.default_scale(d)).squeeze(2)


@register_backend("paged_decode", "torch_gather_sdpa", supports=same_dtype)
def paged_decode_gather_sdpa(q, k_cache, v_cache, block_table, kv_len):
    """Gather the pages into contiguous keys and values (index_select), then SDPA's default kernel."""
    k = gather(k_cache, block_table, kv_len)
    v = gather(v_cache, block_table, kv_len)
    gqa = q.shape[1] != k.shape[1]
    return F.scaled_dot_product_attention(q.unsqueeze(2), k, v, enable_gqa=gqa).squeeze(2)
