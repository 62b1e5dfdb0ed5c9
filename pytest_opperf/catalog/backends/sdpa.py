"""torch's scaled_dot_product_attention, held to one kernel per backend.

    sdpa_flash      FlashAttention-2 (CUDA sm_80+, fp16/bf16, equal head dims <= 256); on a CPU,
                    SDPA's own flash kernel (float32, bf16, fp16)
    sdpa_efficient  the memory-efficient (xFormers/CUTLASS) kernel, CUDA only
    sdpa_cudnn      cuDNN's fused attention, CUDA sm_80+ only
    sdpa_math       the composite reference in ATen, any device

torch.nn.attention.sdpa_kernel(k) leaves SDPA only that kernel: if it cannot take the case,
SDPA raises "No available kernel" instead of falling back. So `supports` asks torch the same
question before the case runs (torch.backends.cuda.can_use_*_attention on tensors of the case's
heads, head dims, dtype and masking, with the batch cut to 1 and the sequences to 128) and skips
with torch's own explanation.

An attention op registers the kernels it can use with `register`, giving the shapes of the
tensors to ask torch about and the call: attention_prefill (causal) and attention_decode all
four, mla_decode (whose values are narrower than its keys, 512 against 576) the efficient and
math kernels only.
"""

from __future__ import annotations

import functools
import os
import re
import sys
import tempfile
import warnings
from typing import Callable, Optional

from pytest_opperf.catalog.registry import register_backend

KERNELS = {  # backend -> (SDPBackend member, torch.backends.cuda check, what it is called)
    "sdpa_flash": ("FLASH_ATTENTION", "can_use_flash_attention", "flash"),
    "sdpa_efficient": ("EFFICIENT_ATTENTION", "can_use_efficient_attention", "memory-efficient"),
    "sdpa_cudnn": ("CUDNN_ATTENTION", "can_use_cudnn_attention", "cuDNN"),
    "sdpa_math": ("MATH", None, "math"),
}
PROBE_SEQ = 128  # the sequence lengths of the probe tensors (their limits do not depend on length past this)


def attention(backend: str, q, k, v, **kwargs):
    """scaled_dot_product_attention(q, k, v, **kwargs) through the one kernel of `backend`."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(getattr(SDPBackend, KERNELS[backend][0])):
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=q.shape[1] != k.shape[1], **kwargs)


@functools.lru_cache(maxsize=256)
def _cuda_refusal(backend: str, shapes: tuple, dtype_name: str) -> Optional[str]:
    """torch's reason why the kernel cannot take tensors of these shapes on this GPU, or None."""
    import torch

    check = getattr(torch.backends.cuda, KERNELS[backend][1], None)
    if check is None:
        return f"this torch ({torch.__version__}) cannot tell whether SDPA's {KERNELS[backend][2]} kernel runs"
    q_shape, k_shape, v_shape, causal = shapes
    dtype = getattr(torch, dtype_name)
    q, k, v = (torch.empty(s, device="cuda", dtype=dtype) for s in (q_shape, k_shape, v_shape))
    try:
        params = torch.backends.cuda.SDPAParams(q, k, v, None, 0.0, causal, q_shape[1] != k_shape[1])
    except TypeError:  # another signature: let the run tell
        return None
    ok, said = _with_torch_warnings(lambda: check(params, True))
    if ok:
        return None
    return f"SDPA's {KERNELS[backend][2]} kernel cannot run this case" + (f": {said}" if said else "")


def _with_torch_warnings(fn: Callable) -> tuple:
    """fn()'s result and the warnings torch gave while it ran, as one line.

    torch explains a refused SDPA kernel with TORCH_WARN. Some builds turn that into a Python
    warning; others (torch 2.11 on CUDA, say) print it from C++ to file descriptor 2, so both are
    read: Python's warnings, and what reached fd 2 meanwhile.
    """
    sys.stderr.flush()
    with tempfile.TemporaryFile() as printed, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        saved = os.dup(2)
        os.dup2(printed.fileno(), 2)
        try:
            result = fn()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        printed.seek(0)
        text = printed.read().decode(errors="replace")
    said = [str(w.message).strip() for w in caught]
    for line in text.splitlines():
        if "Warning:" not in line:
            continue
        # [W1123 11:54:37.390 sdp_utils.cpp:180] Warning: Flash attention requires ... (function check_...)
        message = line.split("Warning:", 1)[-1].strip()
        message = re.sub(r"\s*\(function \w+\)$", "", message)
        if message and message not in said:
            said.append(message)
    return result, "; ".join(said)


def _supports(backend: str, shapes_of: Callable) -> Callable:
    def supports(device_type, dt, capability, p):
        if dt.input != dt.output or not dt.input.is_float or dt.input.itemsize < 2:
            return f"SDPA computes in its input dtype (fp32, fp16, bf16), not {dt.label}"
        if backend == "sdpa_math":
            return None
        if device_type == "cpu" and backend == "sdpa_flash":
            return None
        if device_type != "cuda":
            return f"SDPA's {KERNELS[backend][2]} kernel runs on CUDA only, not on {device_type}"
        return _cuda_refusal(backend, shapes_of(p), dt.input.torch_name)

    return supports


def register(op: str, backend: str, probe_shapes: Callable[[dict], tuple], call: Callable) -> None:
    """Register backend `backend` (a key of KERNELS) of `op`: `call(backend, *inputs)` runs a case
    (through `attention`); `probe_shapes(params)` gives (q shape, k shape, v shape, causal) of
    tensors like the case's, its sequences cut to at most PROBE_SEQ, for asking torch whether the
    kernel takes the case."""
    def run(*args):
        return call(backend, *args)

    run.__name__ = run.__qualname__ = f"{op}_{backend}"
    run.__module__ = call.__module__  # the op's module, which `opperf catalog OP` names as its code
    register_backend(op, backend, supports=_supports(backend, probe_shapes))(run)
