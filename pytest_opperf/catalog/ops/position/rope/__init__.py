"""Rotary position embedding (RoPE) of the queries and keys: q[t, heads_q, head_dim],
k[t, heads_kv, head_dim] -> (rotated q, rotated k), new tensors in the input dtype.

Each head's dims form head_dim/2 pairs (a, b); pair i of token j turns by the angle
pos_j * base^(-2i/head_dim): a' = a cos - b sin, b' = b cos + a sin. `layout` says which
dims pair up: `neox` rotates halves, (i, i + head_dim/2) (GPT-NeoX, Llama, Qwen, HF's
rotate_half); `gptj` rotates interleaved neighbours, (2i, 2i + 1) (GPT-J, Meta's reference
Llama code).

cos and sin come precomputed per token, [t, head_dim/2] in the input dtype, as a model
computes them once per step for all layers: positions random in [0, 131072), base fixed at
500000 (Llama-3; the base changes the angles, not the work). Engines that gather cos/sin
from a cache by position (vLLM) read the same bytes.

FLOPs: 3 per element of q and k (two multiplies and an add or subtract):
3 * t * (heads_q + heads_kv) * head_dim.
Bytes: q and k read and written once, cos and sin
read once: t * (heads_q + heads_kv) * head_dim * (in_size + out_size) + t * head_dim * in_size.
"""

import torch

from pytest_opperf.catalog.backends import liger
from pytest_opperf.catalog.supports import same_dtype
from pytest_opperf.catalog.registry import Op, choice, register_backend, register_op

BASE = 500000.0
MAX_POSITION = 131072
LAYOUT = choice("neox", "gptj")


def inputs(p, dt, device, gen):
    t, d = p["tokens"], p["head_dim"]
    if d % 2:
        raise ValueError(f"rope: head_dim must be even (its dims rotate in pairs), got {d}")
    q = torch.randn(t, p["heads_q"], d, device=device, generator=gen, dtype=dt.input.torch)
    k = torch.randn(t, p["heads_kv"], d, device=device, generator=gen, dtype=dt.input.torch)
    positions = torch.randint(0, MAX_POSITION, (t,), device=device, generator=gen)
    inv_freq = BASE ** (-torch.arange(0, d, 2, device=device, dtype=torch.float64) / d)
    angles = positions.double()[:, None] * inv_freq[None, :]
    return q, k, angles.cos().to(dt.input.torch), angles.sin().to(dt.input.torch), p["layout"]


def _pairs(x, layout):
    """The (a, b) halves of each rotated pair."""
    if layout == "neox":
        return x.chunk(2, dim=-1)
    return x[..., 0::2], x[..., 1::2]


def reference(q, k, cos, sin, layout):
    # A turn of the pair (a, b) is the complex product (a + ib)(cos + i sin).
    turn = torch.complex(cos.double(), sin.double())[:, None, :]

    def rotate(x):
        a, b = _pairs(x.double(), layout)
        z = torch.complex(a.contiguous(), b.contiguous()) * turn
        if layout == "neox":
            return torch.cat((z.real, z.imag), dim=-1)
        return torch.stack((z.real, z.imag), dim=-1).flatten(-2)

    return rotate(q), rotate(k)


def flops(p, dt):
    return 3 * p["tokens"] * (p["heads_q"] + p["heads_kv"]) * p["head_dim"]


def nbytes(p, dt):
    t, d = p["tokens"], p["head_dim"]
    return t * (p["heads_q"] + p["heads_kv"]) * d * (dt.input.itemsize + dt.output.itemsize) + t * d * dt.input.itemsize


def memory(p, dt):
    # Inputs and outputs, and the reference's peak: float64 copies of q and k, their pairs as
    # complex128 and the turned result, about 64 bytes an element of q and k.
    t, d = p["tokens"], p["head_dim"]
    elements = t * (p["heads_q"] + p["heads_kv"]) * d
    return elements * (dt.input.itemsize + dt.output.itemsize + 64) + t * d * (dt.input.itemsize + 16)


OP = register_op(Op("rope", ("tokens", "heads_q", "heads_kv", "head_dim", "layout"), inputs, reference, flops,
                    nbytes, peak="vector", defaults={"heads_q": 32, "heads_kv": 8, "head_dim": 128, "layout": "neox"},
                    types={"layout": LAYOUT}, memory=memory,
                    description="rotary embedding of q and k; layout neox (halves) or gptj (interleaved); base 500000"))


@register_backend("rope", "torch", supports=same_dtype)
def rope_torch(q, k, cos, sin, layout):
    c, s = cos[:, None, :], sin[:, None, :]

    def rotate(x):
        a, b = _pairs(x, layout)
        a2, b2 = a * c - b * s, b * c + a * s
        if layout == "neox":
            return torch.cat((a2, b2), dim=-1)
        return torch.stack((a2, b2), dim=-1).flatten(-2)

    return rotate(q), rotate(k)


@liger.backend("rope")
def rope_liger(q, k, cos, sin, layout):
    if layout != "neox":
        raise ValueError(f"liger-kernel's rope rotates halves (layout neox) only, not {layout}: exclude "
                         "\"backend == 'liger' and layout != 'neox'\" in the config")
    # liger rotates q and k in place; the op returns new tensors (a benchmark calls it thousands of
    # times on the same inputs, and checks its first call), so q and k are copied first: the time
    # includes a read and a write of both.
    # liger wants [batch, heads, tokens, head_dim]; this view of a copy of q[tokens, heads, head_dim]
    # is what it turns back into a contiguous [batch, tokens, heads, head_dim] and rotates in place.
    q4 = q.clone().unsqueeze(0).transpose(1, 2)
    k4 = k.clone().unsqueeze(0).transpose(1, 2)
    # cos/sin hold head_dim/2 angles (not duplicated halves): say how many dims rotate.
    # (q, k, cos, sin, position_ids, unsqueeze_dim, rotary_dim)
    q_out, k_out = liger.ops().LigerRopeFunction.apply(q4, k4, cos, sin, None, 1, q.shape[-1])
    return q_out.transpose(1, 2)[0], k_out.transpose(1, 2)[0]
