"""MoE router: softmax over the experts of each token's logits, then its top-k experts.

logits[tokens, experts] -> (weights fp32 [tokens, topk], ids int64 [tokens, topk]), each row's
experts in descending order of weight. With renormalize=1 (the default, as Mixtral and
DeepSeek-V3 do) the k weights are divided by their sum; with 0 they stay softmax
probabilities (Qwen2-MoE's norm_topk_prob=False). DeepSeek-V3 scores with a sigmoid and group
limits before its top-8: only its shape is taken here.
FLOPs: 5*tokens*experts + 2*tokens*topk with renormalize (softmax: max, subtract, exp, sum, divide; sum, divide).
Bytes: tokens*experts*in_size + tokens*topk*(4 + 8) (logits read, fp32 weights and int64 ids written once).
The top-k selection only compares: it is not counted.

The logits of a row are distinct values a fixed step apart in a random order, so the k-th
and (k+1)-th are never tied and the check compares the ids exactly, the weights by the norm.
"""

import math

import torch

from pytest_opperf.catalog.supports import reads_float_writes
from pytest_opperf.catalog.registry import Op, register_backend, register_op


def inputs(p, dt, device, gen):
    tokens, experts, topk = p["tokens"], p["experts"], p["topk"]
    if not 1 <= topk <= experts:
        raise ValueError(f"moe_gating: topk must be between 1 and experts={experts}, got {topk}")
    # A power-of-two step keeps every value exact in bf16 (ranks < 256) and spans about [-4, 4].
    step = 2.0 ** round(math.log2(8 / experts))
    rank = torch.rand(tokens, experts, device=device, generator=gen).argsort(dim=-1)
    logits = ((rank - experts // 2) * step).to(dt.input.torch)
    return logits, topk, p["renormalize"]


def reference(logits, topk, renormalize):
    probs = torch.softmax(logits.double(), dim=-1)
    weights, ids = probs.topk(topk, dim=-1)
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    return weights, ids


def flops(p, dt):
    return 5 * p["tokens"] * p["experts"] + (2 * p["tokens"] * p["topk"] if p["renormalize"] else 0)


def nbytes(p, dt):
    return p["tokens"] * p["experts"] * dt.input.itemsize + p["tokens"] * p["topk"] * (4 + 8)


OP = register_op(Op("moe_gating", ("tokens", "experts", "topk", "renormalize"), inputs, reference, flops, nbytes,
                    peak="vector", defaults={"renormalize": 1},
                    description="router softmax + top-k (weights fp32, expert ids int64)"))


_supports = reads_float_writes("moe_gating", "fp32")


@register_backend("moe_gating", "torch", supports=_supports)
def moe_gating_torch(logits, topk, renormalize):
    # As HF Mixtral: softmax over all experts in fp32, top-k, then renormalise.
    weights, ids = torch.softmax(logits, dim=-1, dtype=torch.float32).topk(topk, dim=-1)
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    return weights, ids


@register_backend("moe_gating", "torch_topk_first", supports=_supports)
def moe_gating_topk_first(logits, topk, renormalize):
    # Select on the logits (softmax is monotonic), then exponentiate only the k chosen: with
    # renormalize this is a softmax over k values; without, the full row's logsumexp normalises.
    top, ids = logits.float().topk(topk, dim=-1)
    if renormalize:
        return torch.softmax(top, dim=-1), ids
    return torch.exp(top - torch.logsumexp(logits.float(), dim=-1, keepdim=True)), ids
