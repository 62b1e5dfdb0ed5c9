"""Embedding lookup: out[t] = table[ids[t]], ids int64 [tokens], table[vocab, hidden].

FLOPs: 0 (data movement only).
Bytes: 2*tokens*hidden*size + tokens*8 (the rows looked up and the ids read, out written; the rest is untouched).
"""

import torch

from pytest_opperf.catalog.supports import same_dtype
from pytest_opperf.catalog.registry import Op, register_backend, register_op


def inputs(p, dt, device, gen):
    table = torch.randn(p["vocab"], p["hidden"], device=device, generator=gen, dtype=dt.input.torch)
    ids = torch.randint(0, p["vocab"], (p["tokens"],), device=device, generator=gen)
    return ids, table


def reference(ids, table):
    return table[ids].double()  # gather first: a float64 copy of a whole table would be 4x its size


def flops(p, dt):
    return 0


def nbytes(p, dt):
    return 2 * p["tokens"] * p["hidden"] * dt.input.itemsize + p["tokens"] * 8


def memory(p, dt):
    # the table, ids, out and the reference's float64 rows
    return p["vocab"] * p["hidden"] * dt.input.itemsize + nbytes(p, dt) + p["tokens"] * p["hidden"] * 8


def tolerance(p, dt):
    return 0.0  # a gather copies: exact


OP = register_op(Op("embedding", ("tokens", "vocab", "hidden"), inputs, reference, flops, nbytes, peak="vector",
                    memory=memory, tolerance=tolerance, description="token embedding lookup"))


@register_backend("embedding", "torch", supports=same_dtype)
def embedding_torch(ids, table):
    return torch.nn.functional.embedding(ids, table)


@register_backend("embedding", "torch_index_select", supports=same_dtype)
def embedding_index_select(ids, table):
    return table.index_select(0, ids)
