"""liger-kernel (LinkedIn's Triton kernels for LLM training) as backend `liger`, GPU only.

Through its autograd Functions (liger_kernel.ops), forward only, called as its functional API
(liger_kernel.transformers.functional) calls them; see _ops() for why not through that API. Where
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
import sys

from pytest_opperf.catalog.ops import same_dtype
from pytest_opperf.catalog.ops.norm import add_rmsnorm, layernorm, rmsnorm
from pytest_opperf.catalog.registry import register_backend

LIBRARY = "liger-kernel"


def _backend(op):
    return register_backend(op, "liger", library=LIBRARY, devices={"cuda"}, supports=same_dtype)


@functools.cache
def _ops():
    """liger_kernel.ops, imported with peft and transformers hidden where neither is loaded yet.

    liger's utils module imports peft (which imports transformers) for a flag that only its
    Hugging Face model patching reads, and its op modules ask transformers at import whether
    the host is an Ascend NPU. On an H100 host (2026-11-23) `import
    liger_kernel.transformers.functional` took 6.8 s, 5.1 s of it in peft, the first call of
    the sweep's first liger case. Hidden, the probe answers "no NPU", which is true where this
    backend runs (CUDA only), and the flag reads False. Both names are restored after the
    import, so a later `import transformers` works as usual.
    """
    hidden = [name for name in ("peft", "transformers") if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # `import name` raises ImportError
    try:
        import liger_kernel.ops as ops
    finally:
        for name in hidden:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]
    return ops


@_backend("rmsnorm")
def rmsnorm_liger(x, w):
    # casting_mode "llama": rstd in fp32, x * rstd cast to the input dtype, then times w.
    # (X, W, eps, offset, casting_mode, in_place), the functional API's defaults elsewhere
    return _ops().LigerRMSNormFunction.apply(x, w, rmsnorm.EPS, 0.0, "llama", True)


@_backend("add_rmsnorm")
def add_rmsnorm_liger(x, residual, w):
    return _ops().LigerFusedAddRMSNormFunction.apply(x, residual, w, add_rmsnorm.EPS, 0.0, "llama", True)


@_backend("layernorm")
def layernorm_liger(x, w, b):
    return _ops().LigerLayerNormFunction.apply(x, w, b, layernorm.EPS)


LIGER_MAX_BLOCK = 65536  # liger's kernels hold a row in one block and refuse longer rows


def _row_fits(device_type, dtypes, capability, params):
    """liger's softmax keeps a whole row in one Triton block: rows past 65536 raise at launch."""
    if params.get("n", 0) > LIGER_MAX_BLOCK:
        return f"liger's softmax holds a row in one block of at most {LIGER_MAX_BLOCK}; n = {params['n']}"
    return same_dtype(device_type, dtypes, capability)


@register_backend("softmax", "liger", library=LIBRARY, devices={"cuda"}, supports=_row_fits)
def softmax_liger(x):
    return _ops().LigerSoftmaxFunction.apply(x)


@_backend("silu_and_mul")
def silu_and_mul_liger(x):
    return _ops().LigerFusedGateUpSiLUMulFunction.apply(x)


@_backend("gelu_and_mul")
def gelu_and_mul_liger(x):
    n = x.shape[-1] // 2
    return _ops().LigerGELUMulFunction.apply(x[..., :n], x[..., n:])


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
    # (q, k, cos, sin, position_ids, unsqueeze_dim, rotary_dim)
    q_out, k_out = _ops().LigerRopeFunction.apply(q4, k4, cos, sin, None, 1, q.shape[-1])
    return q_out.transpose(1, 2)[0], k_out.transpose(1, 2)[0]
