"""Grouped GEMM (the expert layer of a mixture of experts): out[rows of g] = x[rows of g] @ W[g].

x[groups * m, k] holds the tokens routed to each expert, sorted by expert; W[groups, k, n] one
weight per expert; offs[groups] (int32) the end row of each group, as torch._grouped_mm takes it.
`m` is the tokens per expert: every expert gets the same number (balanced routing), so a layer
with T tokens, top-k routing and E experts is m = T * top_k / E. Uneven routing is a different
workload; this op times the balanced one.

FLOPs: 2*groups*m*n*k.
Bytes: x, W and the offsets read once, out written once:
(groups*m*k + groups*k*n) * in_size + 4*groups + groups*m*n * out_size.
The check's bound grows with k (see catalog/precision.py).
"""

import torch

from pytest_opperf.catalog.supports import same_dtype
from pytest_opperf.catalog.precision import reduction_tolerance
from pytest_opperf.catalog.registry import Op, register_backend, register_op


def inputs(p, dt, device, gen):
    groups, m, n, k = p["groups"], p["m"], p["n"], p["k"]
    x = torch.randn(groups * m, k, device=device, generator=gen, dtype=dt.input.torch)
    w = torch.randn(groups, k, n, device=device, generator=gen, dtype=dt.input.torch)
    offs = torch.arange(1, groups + 1, device=device, dtype=torch.int32) * m
    # The group sizes as the host knows them after routing: an eager MoE loop slices with them
    # (reading offs back would sync the device on every call).
    sizes = (m,) * groups
    return x, w, offs, sizes


def reference(x, w, offs, sizes):
    ends = offs.tolist()
    starts = [0] + ends[:-1]
    return torch.cat([x[s:e].double() @ w[g].double() for g, (s, e) in enumerate(zip(starts, ends))])


def flops(p, dt):
    return 2 * p["groups"] * p["m"] * p["n"] * p["k"]


def nbytes(p, dt):
    groups, m, n, k = p["groups"], p["m"], p["n"], p["k"]
    return (groups * m * k + groups * k * n) * dt.input.itemsize + 4 * groups + groups * m * n * dt.output.itemsize


def memory(p, dt):
    """The tensors, the reference's float64 output (and the check's two float64 copies of it), and
    one group's float64 operands at a time: the experts' weights (15 GB in bf16 for DeepSeek-V3's
    up projection) are never all converted at once."""
    groups, m, n, k = p["groups"], p["m"], p["n"], p["k"]
    return nbytes(p, dt) + 3 * 8 * groups * m * n + 8 * (m * k + k * n + m * n)


def tolerance(p, dt):
    return reduction_tolerance(p["k"], dt)


OP = register_op(Op("grouped_gemm", ("groups", "m", "n", "k"), inputs, reference, flops, nbytes, peak="matrix",
                    memory=memory, description="per-expert GEMMs of a mixture of experts", tolerance=tolerance))


@register_backend("grouped_gemm", "torch", supports=same_dtype)
def grouped_gemm_torch(x, w, offs, sizes):
    """One GEMM per expert, written into one output: what an eager MoE layer launches."""
    out = x.new_empty(x.shape[0], w.shape[2])
    start = 0
    for g, size in enumerate(sizes):
        torch.mm(x[start:start + size], w[g], out=out[start:start + size])
        start += size
    return out


def _grouped_mm_supports(device_type, dt, capability, p):
    if not hasattr(torch, "_grouped_mm"):
        return f"this torch ({torch.__version__}) has no torch._grouped_mm"
    if device_type != "cuda" or capability not in ((9, 0), (10, 0)):
        # Elsewhere torch._grouped_mm runs a loop of mm (its fallback): the torch backend's loop.
        return "torch._grouped_mm has its fused kernel on CUDA sm_90 and sm_100 only"
    if dt.input.name != "bf16" or dt.output.name != "bf16":
        return f"torch._grouped_mm's fused kernel takes bf16, not {dt.label}"
    if p["n"] % 8 or p["k"] % 8:
        return f"torch._grouped_mm needs rows of 16 bytes (n and k multiples of 8), got n={p['n']}, k={p['k']}"
    return None


@register_backend("grouped_gemm", "torch_grouped_mm", supports=_grouped_mm_supports)
def grouped_gemm_grouped_mm(x, w, offs, sizes):
    return torch._grouped_mm(x, w, offs=offs)
