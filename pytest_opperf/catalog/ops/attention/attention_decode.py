"""Attention of one new token per sequence against its KV cache (decode), grouped-query heads.

q[batch, heads_q, 1, head_dim], k and v [batch, heads_kv, kv_len, head_dim] (the cache, the new
token's key and value already in it); out = softmax(q k^T / sqrt(head_dim)) v. The one query
sees every cached key, so there is no mask.

FLOPs: 4 * batch * heads_q * kv_len * head_dim (QK^T and PV).
Bytes: the cache read once dominates: (2*heads_q + 2*heads_kv*kv_len) * batch * head_dim * size.
Reference: float64 on the device (see _common.reference). Tolerance: the dtype's.
"""

from pytest_opperf.catalog.backends import sdpa
from pytest_opperf.catalog.supports import same_dtype
from pytest_opperf.catalog.ops.attention import _common
from pytest_opperf.catalog.registry import Op, register_backend, register_op


def inputs(p, dt, device, gen):
    return _common.qkv(p, 1, p["kv_len"], dt, device, gen)


def reference(q, k, v):
    return _common.reference(q, k, v, causal=False, scale=_common.default_scale(q.shape[-1]))


def flops(p, dt):
    return _common.dense_flops(p, 1, p["kv_len"], causal=False)


def nbytes(p, dt):
    return _common.dense_bytes(p, 1, p["kv_len"], dt)


def memory(p, dt):
    return _common.dense_memory(p, 1, p["kv_len"], dt)


OP = register_op(Op("attention_decode", ("batch", "kv_len", "heads_q", "heads_kv", "head_dim"), inputs, reference,
                    flops, nbytes, peak="matrix", memory=memory,
                    tolerance=_common.tolerance, description="one query token per sequence against its KV cache"))


@register_backend("attention_decode", "torch", supports=same_dtype)
def attention_decode_torch(q, k, v):
    return _common.eager(q, k, v, causal=False, scale=_common.default_scale(q.shape[-1]))


def _sdpa_probe(p):
    kv = (1, p["heads_kv"], min(p["kv_len"], sdpa.PROBE_SEQ), p["head_dim"])
    return (1, p["heads_q"], 1, p["head_dim"]), kv, kv, False


def _sdpa_call(backend, q, k, v):
    return sdpa.attention(backend, q, k, v)


for _kernel in sdpa.KERNELS:
    sdpa.register("attention_decode", _kernel, _sdpa_probe, _sdpa_call)
