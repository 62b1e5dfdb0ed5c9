"""liger-kernel (LinkedIn's Triton kernels for LLM training): what its backends share.

Each op liger covers registers its own backend `liger` in its op module, with `backend` below,
and calls liger through its autograd Functions (`ops()`, liger_kernel.ops), forward only, as
liger's functional API (liger_kernel.transformers.functional) calls them; see ops() for why not
through that API. Where liger's calling convention differs from the op's, the op's backend
adapts it, and the adaptation is part of what is timed. GPU only. Written against
liger-kernel 0.8.5 (its fused gate_up SwiGLU and rope's rotary_dim are recent).
"""

from __future__ import annotations

import functools
import sys
from typing import Callable

from pytest_opperf.catalog.registry import register_backend
from pytest_opperf.catalog.supports import same_dtype

LIBRARY = "liger-kernel"
MAX_BLOCK = 65536  # liger's row kernels hold a row in one Triton block and refuse longer rows


def backend(op: str, supports: Callable = same_dtype) -> Callable[[Callable], Callable]:
    """Register the decorated callable as backend `liger` of `op`: CUDA only, its row stamped
    with liger-kernel's version, skipped (naming the package) where liger is not installed."""
    return register_backend(op, "liger", library=LIBRARY, devices={"cuda"}, supports=supports)


@functools.cache
def ops():
    """liger_kernel.ops, imported with peft and transformers hidden where neither is loaded yet.

    liger's utils module imports peft (which imports transformers) for a flag that only its
    Hugging Face model patching reads, and its op modules ask transformers at import whether
    the host is an Ascend NPU: seconds of imports, mostly peft, charged to the first call of the
    sweep's first liger case. Hidden, the probe answers "no NPU", which is true where this
    backend runs (CUDA only), and the flag reads False. Both names are restored after the
    import, so a later `import transformers` works as usual.
    """
    hidden = [name for name in ("peft", "transformers") if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # `import name` raises ImportError
    try:
        import liger_kernel.ops as liger_ops
    finally:
        for name in hidden:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]
    return liger_ops
