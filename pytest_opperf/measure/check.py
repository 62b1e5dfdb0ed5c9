"""The functional check: a backend's output against the op's reference, before any timing.

The measure is the normwise relative error ||out - ref|| / ||ref|| (in float64), which
does not blow up on elements near zero the way an elementwise rtol does, plus exact
checks of shape, dtype and finiteness. An output whose reference is an integer tensor (token
or expert ids, offsets) is compared exactly and must have the reference's dtype: an op may
return such ids next to float outputs (MoE routing: weights and expert ids).
"""

from __future__ import annotations

from typing import Any, Optional


def compare(out: Any, ref: Any, dtype_out, max_rel_err: float) -> Optional[str]:
    """None if `out` matches `ref`, else a message saying how it does not."""
    import torch

    outs = out if isinstance(out, (tuple, list)) else (out,)
    refs = ref if isinstance(ref, (tuple, list)) else (ref,)
    if len(outs) != len(refs):
        return f"backend returned {len(outs)} outputs, the reference {len(refs)}"
    for i, (o, r) in enumerate(zip(outs, refs)):
        where = f"output {i}: " if len(outs) > 1 else ""
        if not isinstance(o, torch.Tensor):
            return f"{where}backend returned {type(o).__name__}, expected a tensor"
        if tuple(o.shape) != tuple(r.shape):
            return f"{where}shape {tuple(o.shape)}, expected {tuple(r.shape)}"
        if not (r.dtype.is_floating_point or r.dtype.is_complex):
            problem = _compare_exact(o, r)
            if problem:
                return where + problem
            continue
        if o.dtype != dtype_out.torch:
            return f"{where}dtype {o.dtype}, expected {dtype_out.torch} ({dtype_out.name})"
        o64, r64 = o.detach().double(), r.detach().double().to(o.device)
        bad = (~torch.isfinite(o64)).sum().item()
        if bad:
            return f"{where}{bad} of {o64.numel()} elements are NaN or infinite"
        diff = torch.linalg.vector_norm(o64 - r64).item()
        scale = torch.linalg.vector_norm(r64).item()
        err = diff / scale if scale > 0 else diff
        if not err <= max_rel_err:
            worst = (o64 - r64).abs().flatten().argmax().item()
            return (f"{where}normwise relative error {err:.3g} exceeds {max_rel_err:g} "
                    f"(largest difference at flat index {worst}: {o64.flatten()[worst].item():.6g} "
                    f"vs reference {r64.flatten()[worst].item():.6g})")
    return None


def _compare_exact(o, r) -> Optional[str]:
    if o.dtype != r.dtype:
        return f"dtype {o.dtype}, expected {r.dtype} (the reference's: ids are compared exactly)"
    differ = (o != r.to(o.device)).flatten()
    count = int(differ.sum().item())
    if not count:
        return None
    first = int(differ.nonzero()[0].item())
    return (f"{count} of {o.numel()} elements differ from the reference (first at flat index {first}: "
            f"{o.flatten()[first].item()} vs {r.flatten()[first].item()})")
