"""Top-k / top-p sampling of one token per row, made deterministic by its random numbers.

logits[batch, vocab], u[batch] (fp32 in [0, 1)), top_k, top_p -> ids int64 [batch]:
the softmax of each row; its tokens in descending probability (ties: ascending token id);
the first top_k kept (0: all), renormalised; of those, the tokens whose exclusive cumulative
probability is below top_p kept (the first always is), renormalised; the id is the first
kept token whose inclusive cumulative probability exceeds u (inverse CDF). No temperature.
FLOPs: 5*batch*vocab (the softmax: max, subtract, exp, sum, divide; the sort, filters and search only compare).
Bytes: batch*vocab*in_size + batch*(4 + 8) (logits and u read, int64 ids written once).

Inputs are built so that float rounding cannot change a kept set or a sampled id, and the
check compares ids exactly: each row holds HEAD distinct logits a fixed step apart (a
"ladder", at random positions) over a floor far below them; no cumulative probability lies
near top_p, and u is put in the middle of the interval of the token a uniform draw picks, a
token of probability at least 1e-3. So a row's distribution is peaked, as a trained model's is.
"""

import torch

from pytest_opperf.catalog.supports import reads_float_writes
from pytest_opperf.catalog.registry import Op, register_backend, register_op

HEAD = 128  # distinct logits per row: in bf16 steps of 1/8..1/4 down to -32 stay distinct
FLOOR = -64.0  # the other logits: their whole mass (e^-64 each) is far below any float's notice
MARGIN = 1e-4  # smallest distance of a cumulative probability from top_p, of u from a boundary / 2
_STEPS = [0.125 * (1 + j / 16) for j in range(16)]


def inputs(p, dt, device, gen):
    batch, vocab, top_k, top_p = p["batch"], p["vocab"], p["top_k"], p["top_p"]
    if vocab <= HEAD or top_k < 0 or not 0 < top_p <= 1:
        raise ValueError(f"sampling: needs vocab > {HEAD}, top_k >= 0 (0: off) and 0 < top_p <= 1; "
                         f"got vocab={vocab}, top_k={top_k}, top_p={top_p}")
    ladder, kept = _ladder(vocab, top_k, top_p, dt.input.torch)
    positions = torch.rand(batch, vocab, device=device, generator=gen).topk(HEAD, dim=-1).indices
    logits = torch.full((batch, vocab), FLOOR, device=device, dtype=dt.input.torch)
    logits.scatter_(1, positions, ladder.to(device=device, dtype=dt.input.torch).expand(batch, HEAD))
    # u: the middle of the interval of the token a uniform draw picks among the likely ones.
    cdf = kept.cumsum(0)
    likely = int((kept >= 1e-3).sum())
    mass = torch.rand(batch, device=device, generator=gen, dtype=torch.float64) * cdf[likely - 1].item()
    rank = torch.searchsorted(cdf[:likely].to(device), mass, right=True).clamp(max=likely - 1)
    middle = (cdf - kept / 2).to(device)
    return logits, middle[rank].to(torch.float32), top_k, top_p


def _ladder(vocab, top_k, top_p, dtype):
    """The head logits (descending, as stored in `dtype`) and the final kept distribution over them."""
    for step in _STEPS:
        ladder = (-step * torch.arange(HEAD, dtype=torch.float64)).to(dtype).double()
        if len(set(ladder.tolist())) < HEAD:
            continue
        probs = torch.exp(ladder)  # the floor's mass is below float64's notice beside e^-32
        k = HEAD if top_k == 0 or top_k >= HEAD else top_k
        probs[k:] = 0
        probs /= probs.sum()
        exclusive = probs.cumsum(0) - probs
        if top_p < 1 and (exclusive - top_p).abs().min() < MARGIN:
            continue
        if top_p < 1:
            probs[exclusive >= top_p] = 0
        return ladder, probs / probs.sum()
    raise ValueError(f"sampling: no logit ladder keeps top_p={top_p} clear of the cumulative probabilities")


def reference(logits, u, top_k, top_p):
    probs, ids = torch.softmax(logits.double(), dim=-1).sort(dim=-1, descending=True, stable=True)
    if top_k:
        probs[:, top_k:] = 0
    probs = probs / probs.sum(-1, keepdim=True)
    probs = torch.where(probs.cumsum(-1) - probs < top_p, probs, 0)
    cdf = probs.cumsum(-1)
    pick = torch.searchsorted(cdf, u.double()[:, None] * cdf[:, -1:], right=True)
    return ids.gather(1, pick.clamp(max=ids.shape[1] - 1)).squeeze(1)


def flops(p, dt):
    return 5 * p["batch"] * p["vocab"]


def nbytes(p, dt):
    return p["batch"] * p["vocab"] * dt.input.itemsize + p["batch"] * (4 + 8)


def memory(p, dt):
    # logits, the positions' random keys, the reference's float64 probs, sort and cumsums
    return p["batch"] * p["vocab"] * (dt.input.itemsize + 4 + 5 * 8)


OP = register_op(Op("sampling", ("batch", "vocab", "top_k", "top_p"), inputs, reference, flops, nbytes,
                    peak="vector", types={"top_p": float}, defaults={"top_k": 0, "top_p": 1.0}, memory=memory,
                    description="top-k/top-p sampling by inverse CDF at given uniforms (ids int64)"))


_supports = reads_float_writes("sampling", "int64")


def _pick(probs, ids, u, top_p):
    """Top-p over probs sorted in descending order, then the inverse CDF at u."""
    probs = probs / probs.sum(-1, keepdim=True)
    probs = probs.masked_fill(probs.cumsum(-1) - probs >= top_p, 0)
    cdf = probs.cumsum(-1)
    pick = torch.searchsorted(cdf, u[:, None] * cdf[:, -1:], right=True).clamp_(max=ids.shape[1] - 1)
    return ids.gather(1, pick).squeeze(1)


@register_backend("sampling", "torch", supports=_supports)
def sampling_torch(logits, u, top_k, top_p):
    # The sort-based sampler of eager inference engines: sort the whole vocabulary.
    probs, ids = torch.softmax(logits, dim=-1, dtype=torch.float32).sort(dim=-1, descending=True, stable=True)
    if top_k:
        probs[:, top_k:] = 0
    return _pick(probs, ids, u, top_p)


@register_backend("sampling", "torch_topk", supports=_supports)
def sampling_topk(logits, u, top_k, top_p):
    # With top_k on, select the k largest logits first and take the softmax of those alone
    # (the renormalised top-k distribution) instead of sorting the vocabulary.
    if not top_k:
        return sampling_torch(logits, u, top_k, top_p)
    top, ids = logits.topk(top_k, dim=-1)
    return _pick(torch.softmax(top, dim=-1, dtype=torch.float32), ids, u, top_p)
