"""The memory budget: a case whose estimated device footprint exceeds it is skipped at collection.

The estimate is the op's ``memory(params, dtypes)`` when it defines one, else its ``bytes()``
(every input read and output written once) plus the float64 copies the functional check's
reference makes of them (8 / itemsize times as many bytes), plus what cold timing adds
(inputs.cold_extra_bytes: the flush buffer, twice the last-level cache, at least 64 MiB). The budget is --opperf-max-mem-gb, or by default the free memory of the
device (torch.cuda.mem_get_info; on a CPU there is no default budget).
"""

from __future__ import annotations

from typing import Optional

GB = 1e9


def case_bytes(op, params: dict, dtypes) -> float:
    """Device bytes a case holds at its peak, without the timer's buffers."""
    if op.memory is not None:
        return float(op.memory(params, dtypes))
    itemsize = min(dtypes.input.itemsize, dtypes.output.itemsize) or 1
    return float(op.bytes(params, dtypes)) * (1 + 8 / itemsize)


def device_budget(settings, device) -> tuple[Optional[float], str]:
    """(budget in bytes or None, where it comes from)."""
    if settings.max_mem_gb is not None:
        return settings.max_mem_gb * GB, f"--opperf-max-mem-gb={settings.max_mem_gb:g}"
    if not settings.mem_auto or device.type == "cpu":
        return None, ""
    import torch

    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
    else:
        module = getattr(torch, device.type, None)
        if module is None or not hasattr(module, "mem_get_info"):
            return None, ""
        free, _ = module.mem_get_info(device)
    return float(free), f"free memory of {device}"


def over_budget(footprint: float, case_part: float, budget: Optional[float], source: str) -> Optional[str]:
    """The skip reason when the footprint does not fit, else None.

    >>> over_budget(3e9, 2.9e9, 2e9, "--opperf-max-mem-gb=2")
    'estimated device memory 3.00 GB (case 2.90 GB + timer buffers 0.10 GB) exceeds the budget of 2.00 GB (--opperf-max-mem-gb=2)'
    """
    if budget is None or footprint <= budget:
        return None
    return (f"estimated device memory {footprint / GB:.2f} GB (case {case_part / GB:.2f} GB + timer buffers "
            f"{(footprint - case_part) / GB:.2f} GB) exceeds the budget of {budget / GB:.2f} GB ({source})")
