"""Cross-entropy loss of next-token logits: the mean over tokens of logsumexp(row) - row[target].

logits[tokens, vocab], targets int64 [tokens] -> the mean loss, a 0-dim fp32 tensor (the
logits are read in their dtype and reduced in fp32, as the HF models upcast them).
FLOPs: 4*tokens*vocab + 3*tokens + 1 (per logit: max, subtract, exp, sum; per token: log, minus target, sum; mean).
Bytes: tokens*vocab*in_size + tokens*8 + 4 (logits and int64 targets read, the fp32 loss written once).
"""

import torch

from pytest_opperf.catalog.supports import reads_float_writes
from pytest_opperf.catalog.registry import Op, register_backend, register_op


def inputs(p, dt, device, gen):
    logits = torch.randn(p["tokens"], p["vocab"], device=device, generator=gen, dtype=dt.input.torch)
    targets = torch.randint(0, p["vocab"], (p["tokens"],), device=device, generator=gen)
    return logits, targets


def reference(logits, targets):
    # A block of rows at a time: float64 copies of a whole [8192, 152064] batch would take 10 GB.
    total = torch.zeros((), dtype=torch.float64, device=logits.device)
    for start in range(0, logits.shape[0], 512):
        rows = logits[start:start + 512].double()
        picked = rows.gather(1, targets[start:start + 512, None]).squeeze(1)
        total += (torch.logsumexp(rows, dim=-1) - picked).sum()
    return total / logits.shape[0]


def flops(p, dt):
    return 4 * p["tokens"] * p["vocab"] + 3 * p["tokens"] + 1


def nbytes(p, dt):
    return p["tokens"] * p["vocab"] * dt.input.itemsize + p["tokens"] * 8 + 4


def memory(p, dt):
    # logits, the torch backend's fp32 copy and log-probabilities, the reference's float64 block
    return p["tokens"] * p["vocab"] * (dt.input.itemsize + 2 * 4) + 2 * 512 * p["vocab"] * 8


def tolerance(p, dt):
    # An fp32 sum over the vocabulary, per row, then over the tokens: rounding grows with both.
    return max(1e-5, 2e-7 * (p["vocab"] ** 0.5 + p["tokens"] ** 0.5))


OP = register_op(Op("cross_entropy", ("tokens", "vocab"), inputs, reference, flops, nbytes, peak="vector",
                    memory=memory, tolerance=tolerance, description="mean next-token cross-entropy, fp32 loss"))


_supports = reads_float_writes("cross_entropy", "fp32")


@register_backend("cross_entropy", "torch", supports=_supports)
def cross_entropy_torch(logits, targets):
    return torch.nn.functional.cross_entropy(logits.float(), targets)


@register_backend("cross_entropy", "torch_unfused", supports=_supports)
def cross_entropy_unfused(logits, targets):
    # The formula step by step: a logsumexp per row and the target's logit, without the
    # [tokens, vocab] log-probabilities that log_softmax + nll_loss write.
    lse = torch.logsumexp(logits.float(), dim=-1)
    return (lse - logits.gather(1, targets[:, None]).squeeze(1).float()).mean()
