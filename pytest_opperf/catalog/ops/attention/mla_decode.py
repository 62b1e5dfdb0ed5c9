"""DeepSeek-V3 multi-head latent attention (MLA), decode with the weights absorbed.

With W_UK absorbed into the query and W_UV applied after (DeepSeek-V2 paper, arXiv:2405.04434,
section 2.1.2, "absorb"; DeepSeek-V3, arXiv:2412.19437, section 2.1.1; the kernel layout of
FlashMLA and of vLLM's MLA backends), decode attends every head to one shared latent cache:

    q[batch, heads, kv_lora_rank + rope_dim]     = [q_nope absorbed (512) | q_pe (64)]
    kv[batch, kv_len, kv_lora_rank + rope_dim]   = [c_kv (512) | k_pe (64)]   (one row per token)
    scores = (q_nope c_kv^T + q_pe k_pe^T) / sqrt(128 + rope_dim)
    out[batch, heads, kv_lora_rank] = softmax(scores) c_kv

The latent and the rope key sit side by side in one cache row, as FlashMLA and vLLM store them,
so the scores are one product over all 576 columns. The softmax scale is that of the
un-absorbed heads: qk_nope_head_dim (128) + qk_rope_head_dim, 1/sqrt(192) for DeepSeek-V3
(its YaRN long-context factor, mscale^2, multiplies the scale and leaves the work unchanged).

FLOPs: 2 * batch * heads * kv_len * (kv_lora_rank + rope_dim) for the scores
+ 2 * batch * heads * kv_len * kv_lora_rank for softmax @ c_kv.
Bytes: q, the cache, out once: batch * (heads*(r + rope) + kv_len*(r + rope) + heads*r) * size.
Reference: float64 on the device (see _common.reference). Tolerance: see tolerance() below.
"""

import math

import torch

from pytest_opperf.catalog.backends import sdpa
from pytest_opperf.catalog.supports import same_dtype
from pytest_opperf.catalog import precision
from pytest_opperf.catalog.ops.attention import _common
from pytest_opperf.catalog.registry import Op, register_backend, register_op

QK_NOPE_HEAD_DIM = 128  # DeepSeek-V2 and V3: the per-head query/key width before absorption


def scale(rope_dim: int) -> float:
    return 1.0 / math.sqrt(QK_NOPE_HEAD_DIM + rope_dim)


def inputs(p, dt, device, gen):
    b, h, width = p["batch"], p["heads"], p["kv_lora_rank"] + p["rope_dim"]
    q = torch.randn(b, h, width, device=device, generator=gen, dtype=dt.input.torch)
    kv = torch.randn(b, p["kv_len"], width, device=device, generator=gen, dtype=dt.input.torch)
    return q, kv, p["kv_lora_rank"]


def reference(q, kv, rank):
    # The heads of a sequence are rows of one query matrix against a single key/value head.
    out = _common.reference(q.unsqueeze(1), kv.unsqueeze(1), kv[..., :rank].unsqueeze(1), causal=False,
                            scale=scale(q.shape[-1] - rank))
    return out.squeeze(1)


def flops(p, dt):
    r, rope = p["kv_lora_rank"], p["rope_dim"]
    return _common.flops(p["batch"], p["heads"], 1, p["kv_len"], r + rope, r, causal=False)


def nbytes(p, dt):
    b, h, t, r, rope = p["batch"], p["heads"], p["kv_len"], p["kv_lora_rank"], p["rope_dim"]
    return b * (h * (r + rope) + t * (r + rope) + h * r) * dt.input.itemsize


def memory(p, dt):
    b, h, t, r, rope = p["batch"], p["heads"], p["kv_len"], p["kv_lora_rank"], p["rope_dim"]
    return _common.memory(nbytes(p, dt), b * h * r, b * h * t, t * (2 * r + rope), dt)


def tolerance(p, dt):
    # The torch backend rounds the scores to the input dtype (an eager einsum) before its fp32
    # softmax: each score off by up to u_in |s|, |s| ~ sqrt(r + rope) * scale (1.7 at DeepSeek-V3's
    # sizes), measured 2.6 u_bf16 normwise there. Kernels that keep fp32 scores (FlashMLA,
    # FlashInfer) land far under; a kernel 1% off still fails the check's systematic measure.
    width = p["kv_lora_rank"] + p["rope_dim"]
    score = math.sqrt(width) * scale(p["rope_dim"])
    return precision.elementwise_tolerance(dt) + 2 * score * precision.unit_roundoff(dt.input)


OP = register_op(Op("mla_decode", ("batch", "kv_len", "heads", "kv_lora_rank", "rope_dim"), inputs, reference,
                    flops, nbytes, peak="matrix", memory=memory, defaults={"kv_lora_rank": 512, "rope_dim": 64},
                    tolerance=tolerance, description="DeepSeek-V3 MLA decode, weights absorbed, latent cache"))


@register_backend("mla_decode", "torch", supports=same_dtype)
def mla_decode_torch(q, kv, rank):
    scores = torch.einsum("bhc,btc->bht", q, kv)
    scores.mul_(scale(q.shape[-1] - rank))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.einsum("bht,btr->bhr", probs, kv[..., :rank])


def _sdpa_probe(p):
    width, t = p["kv_lora_rank"] + p["rope_dim"], min(p["kv_len"], sdpa.PROBE_SEQ)
    return (1, 1, p["heads"], width), (1, 1, t, width), (1, 1, t, p["kv_lora_rank"]), False


def _sdpa_call(backend, q, kv, rank):
    # The heads of a sequence become the query rows of one head against the one latent head.
    out = sdpa.attention(backend, q.unsqueeze(1), kv.unsqueeze(1), kv[..., :rank].unsqueeze(1),
                         scale=scale(q.shape[-1] - rank))
    return out.squeeze(1)


# Its values are narrower than its keys (512 against 576): only these two kernels take that.
for _kernel in ("sdpa_efficient", "sdpa_math"):
    sdpa.register("mla_decode", _kernel, _sdpa_probe, _sdpa_call)
