"""Causal self-attention of a prompt (prefill), grouped-query heads.

q[batch, heads_q, seq, head_dim], k and v [batch, heads_kv, seq, head_dim];
out = softmax(q k^T / sqrt(head_dim) + causal mask) v, query head i reading key/value head
i // (heads_q / heads_kv).

FLOPs: 4 * batch * heads_q * seq^2 * head_dim / 2 (QK^T and PV, 2 each per multiply-add, over
the causal half of the query-key pairs; the catalogue's convention).
Bytes: q, k, v read once, out written once: (2*heads_q + 2*heads_kv) * batch * seq * head_dim * size.
Reference: float64 on the device, in chunks (see _common.reference). Tolerance: the dtype's.
Backends: `torch` (written out) and SDPA's four kernels here; flex_attention in flex.py beside
this file.
"""

from pytest_opperf.catalog.backends import sdpa
from pytest_opperf.catalog.supports import same_dtype
from pytest_opperf.catalog.ops.attention import _common
from pytest_opperf.catalog.registry import Op, register_backend, register_op


def inputs(p, dt, device, gen):
    return _common.qkv(p, p["seq"], p["seq"], dt, device, gen)


def reference(q, k, v):
    return _common.reference(q, k, v, causal=True, scale=_common.default_scale(q.shape[-1]))


def flops(p, dt):
    return _common.dense_flops(p, p["seq"], p["seq"], causal=True)


def nbytes(p, dt):
    return _common.dense_bytes(p, p["seq"], p["seq"], dt)


def memory(p, dt):
    return _common.dense_memory(p, p["seq"], p["seq"], dt)


OP = register_op(Op("attention_prefill", ("batch", "seq", "heads_q", "heads_kv", "head_dim"), inputs, reference,
                    flops, nbytes, peak="matrix", memory=memory,
                    tolerance=_common.tolerance, description="causal grouped-query attention over a prompt"))


@register_backend("attention_prefill", "torch", supports=same_dtype)
def attention_prefill_torch(q, k, v):
    return _common.eager(q, k, v, causal=True, scale=_common.default_scale(q.shape[-1]))


def _sdpa_probe(p):
    s = min(p["seq"], sdpa.PROBE_SEQ)
    q = (1, p["heads_q"], s, p["head_dim"])
    kv = (1, p["heads_kv"], s, p["head_dim"])
    return q, kv, kv, True


def _sdpa_call(backend, q, k, v):
    return sdpa.attention(backend, q, k, v, is_causal=True)


for _kernel in sdpa.KERNELS:
    sdpa.register("attention_prefill", _kernel, _sdpa_probe, _sdpa_call)
