"""What the attention ops share: the float64 reference, the eager computation, FLOPs and memory.

Layout (b, h, s, d), grouped-query heads: query head i reads key/value head i // (h_q / h_kv),
the convention of SDPA's enable_gqa and of repeat_interleave on the key/value heads.
"""

from __future__ import annotations

import functools
import math

import torch

from pytest_opperf.catalog import precision

# Score elements the reference holds at once (float64): 2^25 of them is 256 MiB, and softmax
# keeps about three such buffers alive.
REFERENCE_CHUNK = 2**25


def groups(p: dict) -> int:
    """Query heads per key/value head; a ValueError names the parameters that do not divide."""
    hq, hkv = p["heads_q"], p["heads_kv"]
    if hkv < 1 or hq % hkv:
        raise ValueError(f"heads_q={hq} must be a multiple of heads_kv={hkv} (grouped-query attention)")
    return hq // hkv


def qkv(p: dict, s_q: int, s_kv: int, dt, device, gen):
    """Random q[batch, heads_q, s_q, head_dim], k and v[batch, heads_kv, s_kv, head_dim]."""
    groups(p)
    b, d = p["batch"], p["head_dim"]
    q = torch.randn(b, p["heads_q"], s_q, d, device=device, generator=gen, dtype=dt.input.torch)
    k = torch.randn(b, p["heads_kv"], s_kv, d, device=device, generator=gen, dtype=dt.input.torch)
    v = torch.randn(b, p["heads_kv"], s_kv, d, device=device, generator=gen, dtype=dt.input.torch)
    return q, k, v


def reference(q, k, v, causal: bool, scale: float):
    """softmax(q k^T * scale) v in float64, causal aligned to the last key, in chunks of query rows.

    float64 on the device rather than float32: a long prefill costs about 1e12 float64 FLOPs,
    tens of milliseconds on a GPU, once per case; the chunks keep
    the score matrix (otherwise b * h * s^2 * 8 bytes) to REFERENCE_CHUNK elements.
    """
    b, hq, sq, _ = q.shape
    hkv, sk, dv = k.shape[1], k.shape[2], v.shape[3]
    g = hq // hkv
    out = torch.empty(b, hq, sq, dv, dtype=torch.float64, device=q.device)
    rows = max(1, REFERENCE_CHUNK // (hq * sk))
    keys = torch.arange(sk, device=q.device)
    for i in range(b):
        k64, v64 = k[i].double(), v[i].double()  # (hkv, sk, d)
        for start in range(0, sq, rows):
            stop = min(sq, start + rows)
            qq = q[i, :, start:stop].double().reshape(hkv, g * (stop - start), -1)
            scores = (qq @ k64.transpose(-1, -2) * scale).view(hkv, g, stop - start, sk)
            if causal:
                last_key = torch.arange(start, stop, device=q.device) + (sk - sq)
                scores = scores.masked_fill(keys[None, :] > last_key[:, None], float("-inf"))
            probs = torch.softmax(scores, dim=-1).view(hkv, g * (stop - start), sk)
            out[i, :, start:stop] = (probs @ v64).view(hq, stop - start, dv)
    return out


@functools.lru_cache(maxsize=4)
def _future(sq: int, sk: int, device) -> torch.Tensor:
    """True where a query would see a key after its own position (made once per shape, as a model
    makes its mask once per forward pass and shares it between layers)."""
    return torch.ones(sq, sk, dtype=torch.bool, device=device).triu(sk - sq + 1)


def eager(q, k, v, causal: bool, scale: float):
    """The attention written out: matmul, scale, mask, softmax in float32, matmul.

    The query heads of a group are viewed as extra rows of one matrix, so keys and values are
    read in place (a repeat_interleave of the cache would copy it g times).
    """
    b, hq, sq, d = q.shape
    hkv, sk, dv = k.shape[1], k.shape[2], v.shape[3]
    g = hq // hkv
    scores = q.reshape(b, hkv, g * sq, d) @ k.transpose(-1, -2)
    scores.mul_(scale)
    if causal:
        scores.view(b, hkv, g, sq, sk).masked_fill_(_future(sq, sk, q.device), float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return (probs @ v).view(b, hq, sq, dv)


def flops(b: int, hq: int, sq: int, sk: int, d_qk: int, d_v: int, causal: bool) -> float:
    """2 * (d_qk + d_v) per query row and key: QK^T and PV; half of the pairs when causal."""
    total = 2 * b * hq * sq * sk * (d_qk + d_v)
    return total / 2 if causal else total


def dense_flops(p: dict, s_q: int, s_kv: int, causal: bool) -> float:
    """flops() of a grouped-query case of s_q queries and s_kv keys per sequence and head."""
    d = p["head_dim"]
    return flops(p["batch"], p["heads_q"], s_q, s_kv, d, d, causal)


def dense_bytes(p: dict, s_q: int, s_kv: int, dt) -> float:
    """q read and out written (heads_q x s_q rows each), k and v read (heads_kv x s_kv rows each), once."""
    return (2 * p["heads_q"] * s_q + 2 * p["heads_kv"] * s_kv) * p["batch"] * p["head_dim"] * dt.input.itemsize


def dense_memory(p: dict, s_q: int, s_kv: int, dt) -> float:
    """memory() of a grouped-query case whose tensors are q, k, v and out (dense_bytes)."""
    b, d, hq, hkv = p["batch"], p["head_dim"], p["heads_q"], p["heads_kv"]
    return memory(dense_bytes(p, s_q, s_kv, dt), b * hq * s_q * d, b * hq * s_q * s_kv, 2 * hkv * s_kv * d, dt)


def memory(tensor_bytes: float, out_elements: int, score_elements: int, kv_elements_per_batch: int, dt) -> float:
    """Device bytes at the peak of a case: its tensors, plus the larger of the eager backend's
    score buffers (scores in the dtype, softmax in float32, probabilities in the dtype) and the
    reference's float64 work (keys and values of one sequence, a chunk of scores three times
    over), plus the float64 output the reference returns and the check's two float64 copies."""
    eager_bytes = score_elements * (2 * dt.input.itemsize + 4)
    reference_bytes = 8 * (kv_elements_per_batch + 3 * min(score_elements, REFERENCE_CHUNK))
    return tensor_bytes + max(eager_bytes, reference_bytes) + 3 * 8 * out_elements


def tolerance(p: dict, dt) -> float:
    """The check's bound for attention over N(0, 1) inputs at scale 1/sqrt(head_dim): the output's
    rounding (2 u_out), plus the eager backends' scores and probabilities rounded to the input dtype
    (|s| ~ 1: about u_in each; measured up to 2.03 u_bf16 normwise). Kernels that keep them in fp32
    (FlashAttention, FlashInfer) land far under; a kernel 1% off still fails the check's systematic measure."""
    return precision.elementwise_tolerance(dt) + 2 * precision.unit_roundoff(dt.input)


def default_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)
