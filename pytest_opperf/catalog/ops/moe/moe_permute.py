"""MoE permute: the tokens' rows gathered in expert order, before the grouped expert GEMMs.

hidden[tokens, hidden], ids[tokens, topk] (int64, distinct experts per token) ->
(rows [tokens*topk, hidden], order int64 [tokens*topk], offsets int64 [experts + 1]).
The (token, slot) pairs, numbered t*topk + j, are sorted by expert id STABLY: within an
expert they keep ascending t*topk + j. order[i] is the number of the pair that lands at row
i, rows[i] = hidden[order[i] // topk], and expert e owns rows offsets[e]:offsets[e+1].
This exact definition lets any correct backend match the reference bit for bit.
FLOPs: 0 (data movement only).
Bytes: (tokens + tokens*topk)*hidden*size + 2*tokens*topk*8 + (experts+1)*8 (inputs read, outputs written once).
"""

import torch

from pytest_opperf.catalog.supports import same_dtype
from pytest_opperf.catalog.registry import Op, register_backend, register_op


def inputs(p, dt, device, gen):
    tokens, experts, topk = p["tokens"], p["experts"], p["topk"]
    if not 1 <= topk <= experts:
        raise ValueError(f"moe_permute: topk must be between 1 and experts={experts}, got {topk}")
    hidden = torch.randn(tokens, p["hidden"], device=device, generator=gen, dtype=dt.input.torch)
    # A router picks k distinct experts per token: the first k of a random permutation.
    ids = torch.rand(tokens, experts, device=device, generator=gen).argsort(dim=-1)[:, :topk].contiguous()
    return hidden, ids, experts


def reference(hidden, ids, experts):
    topk = ids.shape[1]
    flat = ids.flatten().tolist()
    order = sorted(range(len(flat)), key=lambda i: flat[i])  # Python's sort is stable
    counts = [0] * (experts + 1)
    for e in flat:
        counts[e + 1] += 1
    order = torch.tensor(order, dtype=torch.int64, device=ids.device)
    offsets = torch.tensor(counts, dtype=torch.int64, device=ids.device).cumsum(0)
    return hidden[order // topk].double(), order, offsets


def flops(p, dt):
    return 0


def nbytes(p, dt):
    tokens, hidden, topk = p["tokens"], p["hidden"], p["topk"]
    size = dt.input.itemsize
    return tokens * hidden * size + 2 * tokens * topk * 8 + tokens * topk * hidden * size + (p["experts"] + 1) * 8


def memory(p, dt):
    # inputs and outputs, the reference's rows in float64, torch_scatter's one-hot counts (int32)
    pairs = p["tokens"] * p["topk"]
    return nbytes(p, dt) + pairs * p["hidden"] * 8 + 3 * pairs * p["experts"] * 4


def tolerance(p, dt):
    return 0.0  # a gather copies: exact


OP = register_op(Op("moe_permute", ("tokens", "hidden", "experts", "topk"), inputs, reference, flops, nbytes,
                    peak="vector", memory=memory, tolerance=tolerance,
                    description="rows gathered in stable expert order, with the order and expert offsets"))


@register_backend("moe_permute", "torch", supports=same_dtype)
def moe_permute_torch(hidden, ids, experts):
    flat = ids.flatten()
    order = torch.argsort(flat, stable=True)
    # Not bincount: on CUDA it reads the largest id back to the host, so no CUDA graph can hold it.
    counts = torch.zeros(experts, dtype=torch.int64, device=flat.device).index_add_(0, flat, torch.ones_like(flat))
    offsets = torch.nn.functional.pad(counts.cumsum(0), (1, 0))
    return hidden.index_select(0, order // ids.shape[1]), order, offsets


@register_backend("moe_permute", "torch_scatter", supports=same_dtype)
def moe_permute_scatter(hidden, ids, experts):
    # The order by counting instead of sorting, as fused MoE kernels do: a pair's row is its
    # expert's offset plus the number of earlier pairs with that expert.
    flat = ids.flatten()
    one_hot = torch.nn.functional.one_hot(flat, experts).to(torch.int32)
    before = (one_hot.cumsum(0, dtype=torch.int32) - one_hot).gather(1, flat[:, None]).squeeze(1)
    offsets = torch.nn.functional.pad(one_hot.sum(0, dtype=torch.int64).cumsum(0), (1, 0))
    dest = offsets[flat] + before
    pairs = torch.arange(flat.numel(), device=ids.device)
    order = torch.empty_like(flat).index_copy_(0, dest, pairs)
    return hidden.index_select(0, order // ids.shape[1]), order, offsets
