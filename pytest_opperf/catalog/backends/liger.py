"""liger-kernel (LinkedIn's Triton kernels for LLM training) as backend `liger`, GPU only.

Through its functional API (liger_kernel.transformers.functional), forward only. Where
liger's calling convention differs from our op's, the backend adapts it, and the adaptation
is part of what is timed:
- rope rotates q and k in place; our op returns new tensors (a benchmark calls it thousands
  of times on the same inputs, and checks its first call), so the backend copies q and k
  first: its time includes a read and a write of both. liger rotates halves only (neox).
- gelu_and_mul: liger's geglu takes gate and up as two contiguous tensors, so the two halves
  of our fused x[m, 2n] are copied out first (liger's own GeGLU MLP has two projections).
  silu_and_mul uses liger's fused gate_up kernel and reads x in place.
Written against liger-kernel 0.8.5 (its fused gate_up SwiGLU and rope's rotary_dim are recent).
"""

import functools

from pytest_opperf.catalog.ops._common import same_dtype
from pytest_opperf.catalog.ops.norm import add_rmsnorm, layernorm, rmsnorm
from pytest_opperf.catalog.registry import register_backend

LIBRARY = "liger-kernel"


def _backend(op):
    return register_backend(op, "liger", library=LIBRARY, devices={"cuda"}, supports=same_dtype)


@functools.cache
def _liger():
    from liger_kernel.transformers import functional

    return functional


@_backend("rmsnorm")
def rmsnorm_liger(x, w):
    # casting_mode "llama": rstd in fp32, x * rstd cast to the input dtype, then times w.
    return _liger().liger_rms_norm(x, w, rmsnorm.EPS, casting_mode="llama")


@_backend("add_rmsnorm")
def add_rmsnorm_liger(x, residual, w):
    return _liger().liger_fused_add_rms_norm(x, residual, w, add_rmsnorm.EPS, casting_mode="llama")


@_backend("layernorm")
def layernorm_liger(x, w, b):
    return _liger().liger_layer_norm(x, w, b, layernorm.EPS)


LIGER_MAX_BLOCK = 65536  # liger's kernels hold a row in one block and refuse longer rows


def _row_fits(device_type, dtypes, capability, params):
    """liger's softmax keeps a whole row in one Triton block: rows past 65536 raise at launch."""
    if params.get("n", 0) > LIGER_MAX_BLOCK:
        return f"liger's softmax holds a row in one block of at most {LIGER_MAX_BLOCK}; n = {params['n']}"
    return same_dtype(device_type, dtypes, capability)


@register_backend("softmax", "liger", library=LIBRARY, devices={"cuda"}, supports=_row_fits)
def softmax_liger(x):
    return _liger().liger_softmax(x)


@_backend("silu_and_mul")
def silu_and_mul_liger(x):
    from liger_kernel.ops import LigerFusedGateUpSiLUMulFunction

    return LigerFusedGateUpSiLUMulFunction.apply(x)


@_backend("gelu_and_mul")
def gelu_and_mul_liger(x):
    n = x.shape[-1] // 2
    return _liger().liger_geglu(x[..., :n], x[..., n:])


@_backend("rope")
def rope_liger(q, k, cos, sin, layout):
    if layout != "neox":
        raise ValueError(f"liger-kernel's rope rotates halves (layout neox) only, not {layout}: exclude "
                         "\"backend == 'liger' and layout != 'neox'\" in the config")
    # liger wants [batch, heads, tokens, head_dim]; this view of a copy of q[tokens, heads, head_dim]
    # is what it turns back into a contiguous [batch, tokens, heads, head_dim] and rotates in place.
    q4 = q.clone().unsqueeze(0).transpose(1, 2)
    k4 = k.clone().unsqueeze(0).transpose(1, 2)
    # cos/sin hold head_dim/2 angles (not duplicated halves): say how many dims rotate.
    q_out, k_out = _liger().liger_rope(q4, k4, cos, sin, rotary_dim=q.shape[-1])
    return q_out.transpose(1, 2)[0], k_out.transpose(1, 2)[0]
