"""KV-cache write: each new token's K and V scattered into a paged cache at its slot.

k, v[tokens, kv_heads, head_dim], k_cache, v_cache[pages, page_size, kv_heads, head_dim],
slots int64 [tokens] (distinct; slot s is row s % page_size of page s // page_size) ->
(k_cache, v_cache), written in place and returned (vLLM's reshape_and_cache_flash layout).
Writing the same slots again writes the same values, so the timed calls repeat it harmlessly.
FLOPs: 0 (data movement only).
Bytes: 4*tokens*kv_heads*head_dim*size + tokens*8 (k, v and slots read, their slots of both caches written).

The caches start filled with a fixed pattern (initial_cache) that the reference rebuilds
instead of reading the caches, which the backend has already written: a backend that writes
outside its slots is caught.
"""

import torch

from pytest_opperf.catalog.supports import same_dtype
from pytest_opperf.catalog.registry import Op, register_backend, register_op


def initial_cache(shape, dtype, device):
    """Quasi-random values in (-1, 1) (a golden-ratio sequence over the flat index), in `dtype`."""
    n = torch.arange(torch.Size(shape).numel(), device=device, dtype=torch.float64)
    return (((n + 0.5) * 0.6180339887498949) % 1.0 * 2 - 1).reshape(shape).to(dtype)


def inputs(p, dt, device, gen):
    tokens, heads, dim, page_size, pages = p["tokens"], p["kv_heads"], p["head_dim"], p["page_size"], p["pages"]
    if tokens > pages * page_size:
        raise ValueError(f"kv_cache_write: {tokens} tokens do not fit in {pages} pages of {page_size} slots")
    k = torch.randn(tokens, heads, dim, device=device, generator=gen, dtype=dt.input.torch)
    v = torch.randn(tokens, heads, dim, device=device, generator=gen, dtype=dt.input.torch)
    shape = (pages, page_size, heads, dim)
    slots = torch.randperm(pages * page_size, device=device, generator=gen)[:tokens]
    return k, v, initial_cache(shape, dt.input.torch, device), initial_cache(shape, dt.input.torch, device), slots


def reference(k, v, k_cache, v_cache, slots):
    out = []
    for new, cache in ((k, k_cache), (v, v_cache)):
        expected = initial_cache(cache.shape, cache.dtype, cache.device).double()
        expected.view(-1, *new.shape[1:])[slots] = new.double()
        out.append(expected)
    return tuple(out)


def flops(p, dt):
    return 0


def nbytes(p, dt):
    return 4 * p["tokens"] * p["kv_heads"] * p["head_dim"] * dt.input.itemsize + p["tokens"] * 8


def memory(p, dt):
    # both caches, and the reference's float64 copies of them (plus the pattern's index)
    cache = p["pages"] * p["page_size"] * p["kv_heads"] * p["head_dim"]
    return nbytes(p, dt) + 2 * cache * dt.input.itemsize + 3 * cache * 8


def tolerance(p, dt):
    return 0.0  # a copy: exact


OP = register_op(Op("kv_cache_write", ("tokens", "kv_heads", "head_dim", "page_size", "pages"), inputs, reference,
                    flops, nbytes, peak="vector", defaults={"page_size": 16}, memory=memory, tolerance=tolerance,
                    description="scatter new K/V into a paged cache at slot indices (in place)"))


@register_backend("kv_cache_write", "torch", supports=same_dtype)
def kv_cache_write_torch(k, v, k_cache, v_cache, slots):
    k_cache.view(-1, *k.shape[1:]).index_copy_(0, slots, k)
    v_cache.view(-1, *v.shape[1:]).index_copy_(0, slots, v)
    return k_cache, v_cache


@register_backend("kv_cache_write", "torch_index_put", supports=same_dtype)
def kv_cache_write_index_put(k, v, k_cache, v_cache, slots):
    # cache[slots] = k: advanced-index assignment (index_put_), as torch-native engines write it
    k_cache.view(-1, *k.shape[1:])[slots] = k
    v_cache.view(-1, *v.shape[1:])[slots] = v
    return k_cache, v_cache
