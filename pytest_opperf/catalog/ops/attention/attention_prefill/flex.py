"""torch.nn.attention.flex_attention with a causal block mask, for attention_prefill.

flex_attention is fast only compiled (torch.compile turns the mask function into a Triton
kernel that skips the blocks above the diagonal). The backend compiles it once and the block
mask once per shape; both happen in the functional check's call, which is not timed, so the
samples hold the compiled kernel alone. Compiling for a CPU takes minutes (110 s for one
shape on this project's CI machine), so the backend runs on CUDA only.
"""

from __future__ import annotations

import functools
import importlib.util

from pytest_opperf.catalog.backends.torch_compile import warm_inductor
from pytest_opperf.catalog.registry import register_backend

# Each new shape or dtype recompiles; dynamo's default limit (8) would silently fall back to the
# uncompiled (slow) flex_attention past the eighth case of a sweep.
RECOMPILE_LIMIT = 64


def _causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


@functools.lru_cache(maxsize=16)
def _block_mask(seq: int, device: str):
    from torch.nn.attention.flex_attention import create_block_mask

    return create_block_mask(_causal, None, None, seq, seq, device=device)


@functools.lru_cache(maxsize=1)
def _compiled():
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, RECOMPILE_LIMIT)
    return torch.compile(flex_attention, dynamic=False)


def flex_prefill(q, k, v, compiled: bool = True):
    """Causal attention through flex_attention; compiled=False runs it uncompiled (for tests on a CPU)."""
    from torch.nn.attention.flex_attention import flex_attention

    fn = _compiled() if compiled else flex_attention
    mask = _block_mask(q.shape[-2], str(q.device))
    return fn(q, k, v, block_mask=mask, enable_gqa=q.shape[1] != k.shape[1])


def _supports(device_type, dt, capability):
    if device_type != "cuda":
        return f"flex_attention is compiled to Triton for CUDA here; compiling it for {device_type} takes minutes"
    if importlib.util.find_spec("triton") is None:
        return "flex_attention needs triton, which is not installed"
    if dt.input != dt.output or not dt.input.is_float or dt.input.itemsize < 2:
        return f"flex_attention computes in its input dtype (fp32, fp16, bf16), not {dt.label}"
    return None


@register_backend("attention_prefill", "flex_attention", supports=_supports, warm=warm_inductor)
def attention_prefill_flex(q, k, v):
    return flex_prefill(q, k, v)
